//! After a known workload, /metrics shows exactly those counts, and parses as Prometheus text;
//! before any, every documented series is there at zero.
//! The metrics recorder is process-wide and every in-process server of this test binary counts
//! into it: the tests that count exactly (the workload, a backend's counter at zero) run alone in
//! a child process of the binary (`common::rerun_alone`); the others either spawn `colloquy
//! serve` or make no JSON-RPC calls.

use crate::common;

use common::*;
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;

fn value_of(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum()
}

#[actix_rt::test]
async fn metrics_count_exactly_the_workload() {
    if rerun_alone("metrics::metrics_count_exactly_the_workload") {
        return;
    }
    let server = start_scripted(|_| {}).await;
    // 1 slow turn, 3 busy rejections meanwhile, 4 more completed turns, 1 failed turn.
    let slow = server
        .rpc(V1, "SendMessage", json!({"message": user_message(V1, "slow 800", Some("m"), None), "configuration": {"returnImmediately": true}}))
        .await;
    let slow_id = task_of(&slow)["id"].as_str().unwrap().to_owned();
    for _ in 0..3 {
        let busy = server.send_text(V1, "nope", Some("m"), None).await;
        assert_eq!(busy["error"]["code"], json!(-32010));
    }
    for i in 0..4 {
        server
            .send_text(V1, &format!("quick {i}"), Some(&format!("q{i}")), None)
            .await;
    }
    server.send_text(V1, "fail", Some("f"), None).await;
    loop {
        let task = server.rpc(V1, "GetTask", json!({"id": slow_id})).await;
        if task["result"]["status"]["state"] == "TASK_STATE_COMPLETED" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    let text = server.metrics_text().await;
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
        .expect("Prometheus text");
    assert_eq!(
        value_of(&scrape, "colloquy_tasks_total", &[("state", "completed")]),
        5.0
    );
    assert_eq!(
        value_of(&scrape, "colloquy_tasks_total", &[("state", "failed")]),
        1.0
    );
    assert_eq!(
        value_of(&scrape, "colloquy_busy_rejections_total", &[]),
        3.0
    );
    assert_eq!(
        value_of(
            &scrape,
            "colloquy_rpc_requests_total",
            &[("method", "SendMessage"), ("outcome", "-32010")]
        ),
        3.0
    );
    assert_eq!(
        value_of(
            &scrape,
            "colloquy_rpc_requests_total",
            &[("method", "SendMessage"), ("outcome", "ok")]
        ),
        6.0
    );
    assert_eq!(
        value_of(
            &scrape,
            "colloquy_agent_errors_total",
            &[("backend", "scripted")]
        ),
        1.0
    );
    assert_eq!(
        value_of(&scrape, "colloquy_context_starts_total", &[]),
        6.0,
        "m, q0..q3, f"
    );
    assert_eq!(value_of(&scrape, "colloquy_contexts_resident", &[]), 6.0);
    assert_eq!(value_of(&scrape, "colloquy_contexts_busy", &[]), 0.0);
    let flushes = value_of(&scrape, "colloquy_store_flushes_total", &[]);
    let waits = value_of(&scrape, "colloquy_store_flush_waiters_total", &[]);
    assert!(
        flushes >= 1.0 && flushes <= waits,
        "flushes {flushes} vs durable waits {waits}"
    );
    assert!(value_of(&scrape, "colloquy_store_size_bytes", &[]) > 0.0);
    assert!(value_of(&scrape, "process_resident_memory_bytes", &[]) > 1e6);
    assert!(value_of(&scrape, "process_open_fds", &[]) > 3.0);
    assert!(value_of(&scrape, "colloquy_history_messages_rendered_total", &[]) >= 0.0);

    // Conventions: counters end in _total; no label carries a contextId.
    let mut types: HashMap<&str, &prometheus_parse::Value> = HashMap::new();
    for sample in &scrape.samples {
        types.insert(sample.metric.as_str(), &sample.value);
        for (_, label) in sample.labels.iter() {
            assert!(
                !["m", "f", "q0"].contains(&label.as_str()),
                "a contextId leaked into a label"
            );
        }
    }
    for (name, value) in types {
        if matches!(value, prometheus_parse::Value::Counter(_)) {
            assert!(name.ends_with("_total"), "{name}");
        }
    }
    let windows = |scrape: &prometheus_parse::Scrape, source: &str| {
        value_of(
            scrape,
            "colloquy_history_windows_total",
            &[("source", source)],
        )
    };
    assert_eq!(windows(&scrape, "store"), 6.0, "every first turn reads");
    assert_eq!(windows(&scrape, "memory"), 0.0);
    let kept = value_of(&scrape, "colloquy_history_cache_bytes", &[]);
    assert!(kept > 0.0, "the windows of six conversations: {kept}");
    server.send_text(V1, "again", Some("q0"), None).await;
    let scrape = scrape_metrics(&server).await;
    assert_eq!(
        windows(&scrape, "memory"),
        1.0,
        "the window q0's actor kept"
    );
    assert_eq!(windows(&scrape, "store"), 6.0);
    server.stop().await;
}

async fn scrape_metrics(server: &TestServer) -> prometheus_parse::Scrape {
    scrape(&server.client, &format!("{}metrics", server.url)).await
}

/// Prometheus text from `url`.
async fn scrape(client: &reqwest::Client, url: &str) -> prometheus_parse::Scrape {
    let response = client.get(url).send().await.expect("scraped");
    assert_eq!(response.status(), 200, "{url}");
    let text = response.text().await.unwrap();
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
        .expect("Prometheus text")
}

/// The series docs/operations.md documents under `GET /metrics`.
fn documented_series() -> Vec<String> {
    let doc = include_str!("../../docs/operations.md");
    let bullet: String = doc
        .lines()
        .skip_while(|l| !l.starts_with("- `GET /metrics`"))
        .enumerate()
        .take_while(|(i, l)| *i == 0 || !l.starts_with("- "))
        .map(|(_, l)| format!("{l}\n"))
        .collect();
    let names: Vec<String> = bullet
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|quoted| quoted.split('{').next().unwrap_or_default().to_owned())
        .filter(|name| name.starts_with("colloquy_") || name.starts_with("process_"))
        .collect();
    assert!(
        names.len() > 20,
        "docs/operations.md's metrics list: {names:?}"
    );
    names
}

/// A `colloquy serve` child process (killed on drop) and its base URL, once `/healthz` answers.
struct Child {
    _process: tokio::process::Child,
    _dir: tempfile::TempDir,
    url: String,
}

async fn spawn_serve(env: &[(&str, &str)]) -> Child {
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let process = tokio::process::Command::new(env!("CARGO_BIN_EXE_colloquy"))
        .args([
            "serve",
            "--grpc-listen",
            "127.0.0.1:0",
            "--listen",
            &listen,
            "--data",
        ])
        .arg(dir.path())
        .env_remove("COLLOQUY_TOKENS")
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied())
        .kill_on_drop(true)
        .spawn()
        .expect("colloquy starts");
    let url = format!("http://{listen}/");
    let client = reqwest::Client::new();
    for _ in 0..400 {
        if client.get(format!("{url}healthz")).send().await.is_ok() {
            return Child {
                _process: process,
                _dir: dir,
                url,
            };
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("colloquy did not come up");
}

#[actix_rt::test]
async fn a_fresh_server_shows_every_documented_series_at_zero() {
    // A child process: this binary's other tests count into the same process-wide recorder.
    let child = spawn_serve(&[]).await;
    let client = reqwest::Client::new();
    let scrape = scrape(&client, &format!("{}metrics", child.url)).await;

    for name in documented_series() {
        assert!(
            scrape.samples.iter().any(|s| s.metric == name),
            "{name} is documented but missing before its first event"
        );
    }
    for sample in &scrape.samples {
        let name = &sample.metric;
        match &sample.value {
            prometheus_parse::Value::Counter(v) => assert_eq!(*v, 0.0, "{name}"),
            prometheus_parse::Value::Histogram(buckets) => {
                assert!(buckets.iter().all(|b| b.count == 0.0), "{name}")
            }
            prometheus_parse::Value::Untyped(v) if name.ends_with("_count") => {
                assert_eq!(*v, 0.0, "{name}")
            }
            _ => {}
        }
    }
    for gauge in [
        "colloquy_contexts_resident",
        "colloquy_contexts_busy",
        "colloquy_sse_streams",
    ] {
        assert_eq!(value_of(&scrape, gauge, &[]), 0.0, "{gauge}");
    }
    // Label values known at start are there too.
    let has = |name: &str, labels: &[(&str, &str)]| {
        scrape
            .samples
            .iter()
            .any(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
    };
    for state in [
        "completed",
        "failed",
        "canceled",
        "rejected",
        "input-required",
        "auth-required",
    ] {
        assert!(has("colloquy_tasks_total", &[("state", state)]), "{state}");
    }
    for method in ["SendMessage", "ListTasks", "colloquy/getConversation"] {
        let ok = [("method", method), ("outcome", "ok")];
        assert!(has("colloquy_rpc_requests_total", &ok), "{method}");
        assert!(has("colloquy_rpc_request_seconds", &ok[..1]), "{method}");
    }
    assert!(has("colloquy_agent_errors_total", &[("backend", "echo")]));
    assert!(has("colloquy_agent_seconds", &[("backend", "echo")]));
}

#[actix_rt::test]
async fn each_server_in_a_process_registers_its_own_backend() {
    // Alone: other suites' echo servers may fail turns (a shutdown mid-turn) in this process.
    if rerun_alone("metrics::each_server_in_a_process_registers_its_own_backend") {
        return;
    }
    // Another backend's server starts first in the process; the echo one still registers its own.
    let first = start_scripted(|_| {}).await;
    let server = start_echo().await;
    let scrape = scrape(&server.client, &format!("{}metrics", server.url)).await;
    let echo_errors = scrape.samples.iter().find(|s| {
        s.metric == "colloquy_agent_errors_total" && s.labels.get("backend") == Some("echo")
    });
    let echo_errors = echo_errors.expect("the echo backend's error counter, before any error");
    assert!(matches!(echo_errors.value, prometheus_parse::Value::Counter(v) if v == 0.0));
    server.stop().await;
    first.stop().await;
}

async fn status_of(client: &reqwest::Client, url: &str, token: Option<&str>) -> u16 {
    let mut request = client.get(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await.expect("answered").status().as_u16()
}

#[actix_rt::test]
async fn admin_listen_serves_the_operator_endpoints_apart_from_the_public_port() {
    let server = start_with(Arc::new(colloquy::agent::EchoAgent::default()), |c| {
        c.admin_listen = Some("127.0.0.1:0".into())
    })
    .await;
    let admin = format!(
        "http://{}/",
        server.server.admin_addr.expect("the admin address")
    );
    assert_ne!(admin, server.url);
    let client = &server.client;
    let scraped = scrape(client, &format!("{admin}metrics")).await;
    assert!(
        scraped
            .samples
            .iter()
            .any(|s| s.metric == "colloquy_tasks_total")
    );
    assert_eq!(
        status_of(client, &format!("{}metrics", server.url), None).await,
        404
    );
    for base in [&admin, &server.url] {
        for path in ["healthz", "readyz"] {
            assert_eq!(
                status_of(client, &format!("{base}{path}"), None).await,
                200,
                "{base}{path}"
            );
        }
    }
    // The admin address serves nothing else; the public one still serves the card.
    let card = format!("{admin}.well-known/agent-card.json");
    assert_eq!(status_of(client, &card, None).await, 404);
    assert_eq!(server.card(&[]).await["name"], "colloquy");

    // Stopping the server stops both.
    let admin_health = format!("{admin}healthz");
    server.stop().await;
    let after = reqwest::Client::new().get(&admin_health).send().await;
    assert!(after.is_err(), "the admin server still answers: {after:?}");
}

#[actix_rt::test]
async fn metrics_token_is_required_for_metrics_only() {
    let server = start_with(Arc::new(colloquy::agent::EchoAgent::default()), |c| {
        c.metrics.token = Some("scrape-secret".into())
    })
    .await;
    let metrics = format!("{}metrics", server.url);
    let client = &server.client;
    assert_eq!(status_of(client, &metrics, None).await, 401);
    assert_eq!(status_of(client, &metrics, Some("wrong")).await, 401);
    assert_eq!(
        status_of(client, &metrics, Some("scrape-secret")).await,
        200
    );
    let refused = client.get(&metrics).send().await.unwrap();
    assert_eq!(refused.headers()["www-authenticate"], "Bearer");
    // Health and the agent card are not behind it.
    assert_eq!(
        status_of(client, &format!("{}healthz", server.url), None).await,
        200
    );
    assert_eq!(server.card(&[]).await["name"], "colloquy");
    server.stop().await;
}

#[actix_rt::test]
async fn admin_listen_and_metrics_token_come_from_the_environment() {
    let admin = format!("127.0.0.1:{}", free_port());
    let child = spawn_serve(&[
        ("COLLOQUY_ADMIN_LISTEN", &admin),
        ("COLLOQUY_METRICS__TOKEN", "env-scrape-secret"),
    ])
    .await;
    let client = reqwest::Client::new();
    let metrics = format!("http://{admin}/metrics");
    assert_eq!(status_of(&client, &metrics, None).await, 401);
    assert_eq!(
        status_of(&client, &metrics, Some("env-scrape-secret")).await,
        200
    );
    let public = format!("{}metrics", child.url);
    assert_eq!(
        status_of(&client, &public, Some("env-scrape-secret")).await,
        404
    );
}

#[actix_rt::test]
async fn an_empty_metrics_token_or_admin_listen_equal_to_listen_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    for (key, value, expected) in [
        ("COLLOQUY_METRICS__TOKEN", " ", "metrics.token is empty"),
        (
            "COLLOQUY_ADMIN_LISTEN",
            listen.as_str(),
            "the same as listen",
        ),
    ] {
        let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_colloquy"))
            .args([
                "serve",
                "--grpc-listen",
                "127.0.0.1:0",
                "--listen",
                &listen,
                "--data",
            ])
            .arg(dir.path())
            .env(key, value)
            .kill_on_drop(true)
            .output();
        let output = tokio::time::timeout(std::time::Duration::from_secs(60), output)
            .await
            .expect("a refused start exits at once")
            .unwrap();
        assert!(!output.status.success(), "{key} {value:?}: it started");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{key}: {stderr}");
    }
}

#[actix_rt::test]
async fn readiness_checks_share_one_store_probe_a_second() {
    if rerun_alone("metrics::readiness_checks_share_one_store_probe_a_second") {
        return;
    }
    let server = common::start_echo().await;
    let writes =
        |scrape: &prometheus_parse::Scrape| value_of(scrape, "colloquy_store_writes_total", &[]);
    let before = writes(&scrape(&server.client, &format!("{}metrics", server.url)).await);
    let started = std::time::Instant::now();
    let checks: Vec<_> = (0..200)
        .map(|_| {
            let client = server.client.clone();
            let url = format!("{}readyz", server.url);
            tokio::spawn(async move { client.get(url).send().await.map(|r| r.status().as_u16()) })
        })
        .collect();
    for check in checks {
        assert_eq!(check.await.expect("task").expect("answered"), 200);
    }
    let seconds = started.elapsed().as_secs_f64();
    let after = writes(&scrape(&server.client, &format!("{}metrics", server.url)).await);
    // One probe per started second at most, and at least one (readiness was checked).
    let allowed = seconds.ceil() + 1.0;
    assert!(
        (1.0..=allowed).contains(&(after - before)),
        "{} store writes for 200 readiness checks in {seconds:.2} s",
        after - before
    );
    server.stop().await;
}
