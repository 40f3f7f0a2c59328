//! After a known workload, /metrics shows exactly those counts, and parses as Prometheus text.
//! (Its own test binary: the metrics recorder is process-wide.)

mod common;

use common::*;
use serde_json::json;
use std::collections::HashMap;

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

    let text = server
        .client
        .get(format!("{}metrics", server.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
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
    server.stop().await;
}
