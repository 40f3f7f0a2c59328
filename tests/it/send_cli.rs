//! `colloquy send` end to end: the built binary as a subprocess against real servers on loopback.

use crate::common;

use colloquy::agent::EchoAgent;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// One user's CLI: its own COLLOQUY_HOME and config file.
struct Cli {
    home: tempfile::TempDir,
    config: PathBuf,
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// The contextId printed in the trailer `[context ctx-... · ...]`.
    fn context(&self) -> String {
        let at = self.stderr.find("[context ").expect("a context trailer") + "[context ".len();
        self.stderr[at..]
            .split_whitespace()
            .next()
            .expect("an id")
            .to_owned()
    }
}

impl Cli {
    fn new(peers: &[(&str, &str, Option<&str>)]) -> Cli {
        let home = tempfile::tempdir().expect("temp dir");
        let config = home.path().join("colloquy.toml");
        let mut toml = String::new();
        for (name, url, token_env) in peers {
            toml.push_str(&format!("[peers.{name}]\nurl = \"{url}\"\n"));
            if let Some(env) = token_env {
                toml.push_str(&format!("token_env = \"{env}\"\n"));
            }
        }
        std::fs::write(&config, toml).expect("config written");
        Cli { home, config }
    }

    async fn run(&self, args: &[&str]) -> Run {
        self.run_with(args, None, &[]).await
    }

    async fn run_with(&self, args: &[&str], stdin: Option<&str>, env: &[(&str, &str)]) -> Run {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_colloquy"));
        command
            .arg("send")
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .env("COLLOQUY_HOME", self.home.path())
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command.spawn().expect("colloquy runs");
        if let Some(text) = stdin {
            let mut input = child.stdin.take().expect("stdin");
            input
                .write_all(text.as_bytes())
                .await
                .expect("stdin written");
            drop(input);
        }
        let output = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
            .await
            .expect("colloquy send finishes within 30 s")
            .expect("output");
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    fn sessions(&self) -> Value {
        let bytes = std::fs::read(self.home.path().join("sessions.json")).expect("sessions file");
        serde_json::from_slice(&bytes).expect("sessions JSON")
    }
}

/// A TCP proxy that counts the connections it forwards.
struct CountingProxy {
    url: String,
    connections: Arc<AtomicUsize>,
}

async fn counting_proxy(upstream: &str) -> CountingProxy {
    let upstream_addr = upstream
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/", listener.local_addr().expect("addr"));
    let connections = Arc::new(AtomicUsize::new(0));
    let counter = connections.clone();
    actix_rt::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            let upstream_addr = upstream_addr.clone();
            actix_rt::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(&upstream_addr).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    CountingProxy { url, connections }
}

fn closed_port_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    format!("http://127.0.0.1:{port}/")
}

fn assert_ok(run: &Run) {
    assert_eq!(
        run.code, 0,
        "stdout: {}\nstderr: {}",
        run.stdout, run.stderr
    );
}

#[actix_rt::test]
async fn every_target_form_reaches_the_peer_and_sessions_continue() {
    let server = common::start_echo().await;
    let cli = Cli::new(&[("alpha", &server.url, None)]);

    let first = cli.run(&["--to", "alpha", "one"]).await;
    assert_ok(&first);
    assert_eq!(first.stdout.trim(), "echo: one (turn 1)");
    let ctx = first.context();
    assert!(ctx.starts_with("ctx-"), "{ctx}");

    // a2a:NAME continues the last conversation with that peer.
    let second = cli.run(&["--to", "a2a:alpha", "two"]).await;
    assert_ok(&second);
    assert_eq!(
        second.stdout.trim(),
        "echo: two (turn 2; previously: \"one\")"
    );
    assert_eq!(second.context(), ctx);

    // A ctx- session id, in a separate invocation, text from stdin.
    let third = cli.run_with(&["--to", &ctx, "-"], Some("three"), &[]).await;
    assert_ok(&third);
    assert_eq!(
        third.stdout.trim(),
        "echo: three (turn 3; previously: \"two\")"
    );

    // --new starts another conversation with the same peer; then the peer name continues it.
    let fresh = cli.run(&["--to", "alpha", "--new", "fresh"]).await;
    assert_ok(&fresh);
    assert_eq!(fresh.stdout.trim(), "echo: fresh (turn 1)");
    let fresh_ctx = fresh.context();
    assert_ne!(fresh_ctx, ctx);
    let again = cli.run(&["--to", "alpha", "again"]).await;
    assert_eq!(
        again.stdout.trim(),
        "echo: again (turn 2; previously: \"fresh\")"
    );

    // The first session is still reachable by its id, and by --context.
    let back = cli.run(&["--to", "alpha", "--context", &ctx, "four"]).await;
    assert_eq!(
        back.stdout.trim(),
        "echo: four (turn 4; previously: \"three\")"
    );

    // A URL target is its own peer key: a new conversation, then continued.
    let by_url = cli.run(&["--to", &server.url, "--json", "u1"]).await;
    assert_ok(&by_url);
    let summary: Value = serde_json::from_str(by_url.stdout.trim()).expect("JSON output");
    assert_eq!(summary["reply"], "echo: u1 (turn 1)");
    assert_eq!(summary["state"], "completed");
    assert_eq!(summary["protocolVersion"], "1.0");
    let url_ctx = summary["contextId"].as_str().expect("contextId").to_owned();
    let by_url2 = cli.run(&["--to", &server.url, "u2"]).await;
    assert_eq!(
        by_url2.stdout.trim(),
        "echo: u2 (turn 2; previously: \"u1\")"
    );
    assert_eq!(by_url2.context(), url_ctx);

    let sessions = cli.sessions();
    let list = sessions["sessions"].as_array().expect("sessions");
    assert_eq!(list.len(), 3, "{sessions}");
    let first_session = list
        .iter()
        .find(|s| s["contextId"] == ctx.as_str())
        .expect("first");
    assert_eq!(first_session["turns"], 4);
    assert_eq!(first_session["peer"], "alpha");
    server.stop().await;
}

#[actix_rt::test]
async fn streaming_prints_every_chunk_and_the_whole_reply() {
    let server = common::start_with(Arc::new(EchoAgent::new(3, Duration::ZERO)), |_| {}).await;
    let cli = Cli::new(&[("alpha", &server.url, None)]);
    let run = cli
        .run(&["--to", "alpha", "--stream", "stream me please"])
        .await;
    assert_ok(&run);
    assert_eq!(run.stdout, "echo: stream me please (turn 1)\n");
    let json = cli
        .run(&["--to", "alpha", "--stream", "--json", "more"])
        .await;
    assert_ok(&json);
    let lines: Vec<Value> = json
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    let chunks: String = lines.iter().filter_map(|l| l["chunk"].as_str()).collect();
    let last = lines.last().expect("a result line");
    assert!(lines.len() > 3, "several chunks: {}", json.stdout);
    assert_eq!(chunks, last["reply"].as_str().expect("reply"));
    assert_eq!(
        chunks,
        "echo: more (turn 2; previously: \"stream me please\")"
    );
    server.stop().await;
}

#[actix_rt::test]
async fn unknown_targets_exit_2_and_send_nothing() {
    let server = common::start_echo().await;
    let proxy = counting_proxy(&server.url).await;
    let cli = Cli::new(&[("alpha", &proxy.url, None)]);
    // One real session, so resolution has something it could wrongly fall back to.
    let known = cli.run(&["--to", "alpha", "hello"]).await;
    assert_ok(&known);
    let ctx = known.context();
    let before = proxy.connections.load(Ordering::SeqCst);
    assert!(before > 0, "the proxy counts connections");

    for target in [
        "nosuch",
        "a2a:nosuch",
        "a2a:",
        "ctx-00000000",
        "127.0.0.1:9",
        "ftp://127.0.0.1/",
        "http://",
    ] {
        let run = cli.run(&["--to", target, "hi"]).await;
        assert_eq!(
            run.code, 2,
            "{target}: stdout {} stderr {}",
            run.stdout, run.stderr
        );
        assert!(run.stdout.is_empty(), "{target}: {}", run.stdout);
        if target != "http://" && target != "ftp://127.0.0.1/" {
            assert!(
                run.stderr.contains("cannot resolve target"),
                "{target}: {}",
                run.stderr
            );
            assert!(run.stderr.contains("tried"), "{}", run.stderr);
            assert!(
                run.stderr.contains("alpha"),
                "names the known peers: {}",
                run.stderr
            );
            assert!(
                run.stderr.contains(&ctx),
                "names the known sessions: {}",
                run.stderr
            );
        }
    }
    // Usage errors are status 2 too, and send nothing.
    let contradiction = cli
        .run(&["--to", &ctx, "--context", "ctx-other", "hi"])
        .await;
    assert_eq!(contradiction.code, 2, "{}", contradiction.stderr);
    let empty = cli.run(&["--to", "alpha", "  "]).await;
    assert_eq!(empty.code, 2, "{}", empty.stderr);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        proxy.connections.load(Ordering::SeqCst),
        before,
        "nothing reached the server"
    );
    server.stop().await;
}

#[actix_rt::test]
async fn list_shows_reachable_and_unreachable_peers_and_sessions() {
    let server = common::start_echo().await;
    let down = closed_port_url();
    let cli = Cli::new(&[("up", &server.url, None), ("down", &down, None)]);
    assert_ok(&cli.run(&["--to", "up", "hi"]).await);
    let run = cli.run(&["--list"]).await;
    assert_ok(&run);
    let line = |name: &str| {
        run.stdout
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("a line for {name}: {}", run.stdout))
            .to_owned()
    };
    assert!(
        line("up").contains("card: colloquy (A2A 1.0)"),
        "{}",
        run.stdout
    );
    assert!(line("up").contains(&server.url));
    assert!(
        line("down").contains("unreachable: connection refused"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("sessions:"));
    let session = run
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("ctx-"))
        .expect("a session line");
    assert!(
        session.contains(" up ") && session.contains("1 turn"),
        "{session}"
    );

    let json = cli.run(&["--list", "--json"]).await;
    let value: Value = serde_json::from_str(json.stdout.trim()).expect("JSON");
    assert_eq!(value["peers"].as_array().map(Vec::len), Some(2));
    assert_eq!(value["sessions"].as_array().map(Vec::len), Some(1));
    server.stop().await;
}

#[actix_rt::test]
async fn errors_have_their_exit_codes() {
    // Connection refused: 3.
    let cli = Cli::new(&[("down", &closed_port_url(), None)]);
    let refused = cli.run(&["--to", "down", "hi"]).await;
    assert_eq!(refused.code, 3, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("connection refused"),
        "{}",
        refused.stderr
    );

    // HTTP 401 without the token: 4; with it: 0.
    let secured = common::start_with(Arc::new(EchoAgent::default()), |c| {
        c.auth.tokens.insert("me".into(), "s3cret-token".into());
    })
    .await;
    let cli = Cli::new(&[
        ("open", &secured.url, None),
        ("keyed", &secured.url, Some("SEND_TEST_TOKEN")),
    ]);
    let denied = cli.run(&["--to", "open", "hi"]).await;
    assert_eq!(denied.code, 4, "{}", denied.stderr);
    assert!(denied.stderr.contains("401"), "{}", denied.stderr);
    let missing = cli.run(&["--to", "keyed", "hi"]).await;
    assert_eq!(missing.code, 4, "{}", missing.stderr);
    assert!(
        missing.stderr.contains("SEND_TEST_TOKEN"),
        "{}",
        missing.stderr
    );
    let allowed = cli
        .run_with(
            &["--to", "keyed", "hi"],
            None,
            &[("SEND_TEST_TOKEN", "s3cret-token")],
        )
        .await;
    assert_ok(&allowed);
    secured.server.stop().await;

    // Busy: 5, with the message naming the running task.
    let slow = common::start_with(
        Arc::new(EchoAgent::new(0, Duration::from_millis(2500))),
        |_| {},
    )
    .await;
    let cli = Arc::new(Cli::new(&[("slow", &slow.url, None)]));
    let first = {
        let cli = cli.clone();
        actix_rt::spawn(async move {
            cli.run(&["--to", "slow", "--context", "ctx-busy-test", "first"])
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let busy = cli
        .run(&["--to", "slow", "--context", "ctx-busy-test", "second"])
        .await;
    assert_eq!(busy.code, 5, "{}", busy.stderr);
    assert!(
        busy.stderr.contains("the peer is still working on task")
            && busy.stderr.contains("retry later"),
        "{}",
        busy.stderr
    );
    let first = first.await.expect("first run");
    assert_ok(&first);
    slow.server.stop().await;

    // A failed task: 6, with the status message. (A delegating agent whose peer is down fails.)
    let failing = common::start_with(
        Arc::new(colloquy::agent::A2aAgent::new(closed_port_url(), None, 20)),
        |_| {},
    )
    .await;
    let cli = Cli::new(&[("failing", &failing.url, None)]);
    let failed = cli.run(&["--to", "failing", "hi"]).await;
    assert_eq!(failed.code, 6, "{}", failed.stderr);
    assert!(
        failed.stderr.contains(" failed: ") && failed.stderr.contains("connection refused"),
        "{}",
        failed.stderr
    );
    failing.server.stop().await;
}

// ---- the official Python SDK servers ----

struct SdkServer {
    child: tokio::process::Child,
    url: String,
}

/// Starts `script` from the interop kit with the venv's python (created on first use), with
/// `args` after its port.
async fn sdk_server_with(venv: &str, script: &str, args: &[&str]) -> Option<SdkServer> {
    let python = common::sdk_python(venv);
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/interop")
        .join(script);
    let child = tokio::process::Command::new(python)
        .arg(script)
        .arg("--port")
        .arg(port.to_string())
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("the SDK server starts");
    let url = format!("http://127.0.0.1:{port}/");
    let card = format!("{url}.well-known/agent-card.json");
    let client = reqwest::Client::new();
    for _ in 0..150 {
        if let Ok(r) = client.get(&card).send().await
            && r.status().is_success()
        {
            return Some(SdkServer { child, url });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the SDK server {venv} did not come up on {url}");
}

async fn sdk_conversation(venv: &str, script: &str, version: &str) {
    sdk_conversation_with(venv, script, &[], version).await;
}

async fn sdk_conversation_with(venv: &str, script: &str, args: &[&str], version: &str) {
    let Some(mut server) = sdk_server_with(venv, script, args).await else {
        return;
    };
    let cli = Cli::new(&[("sdk", &server.url, None)]);
    let one = cli.run(&["--to", "sdk", "--json", "alpha"]).await;
    assert_ok(&one);
    let one: Value = serde_json::from_str(one.stdout.trim()).expect("JSON");
    assert_eq!(one["reply"], "sdk-echo: alpha (turn 1)");
    assert_eq!(one["protocolVersion"], version);
    let ctx = one["contextId"].as_str().expect("contextId").to_owned();

    // Second turn through the ctx- session, streaming.
    let two = cli.run(&["--to", &ctx, "--stream", "beta"]).await;
    assert_ok(&two);
    assert_eq!(
        two.stdout,
        "sdk-echo: beta (turn 2; previously: \"alpha\")\n"
    );
    assert_eq!(two.context(), ctx);

    // And a streamed new conversation, chunk by chunk as JSON lines.
    let three = cli
        .run(&["--to", "sdk", "--new", "--stream", "--json", "gamma"])
        .await;
    assert_ok(&three);
    let lines: Vec<Value> = three
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    let chunks: Vec<&str> = lines.iter().filter_map(|l| l["chunk"].as_str()).collect();
    assert_eq!(
        chunks.len(),
        3,
        "the SDK server sends three chunks: {}",
        three.stdout
    );
    assert_eq!(chunks.concat(), "sdk-echo: gamma (turn 1)");
    assert_ne!(lines.last().expect("result")["contextId"], ctx.as_str());
    let _ = server.child.kill().await;
}

#[actix_rt::test]
async fn python_sdk_03_server_two_turns_and_streaming() {
    sdk_conversation("sdk03", "sdk_server03.py", "0.3").await;
}

#[actix_rt::test]
async fn python_sdk_1x_server_two_turns_and_streaming() {
    sdk_conversation("sdk1", "sdk_server1.py", "1.0").await;
}

/// A peer whose card offers only the HTTP+JSON binding: `send` speaks it.
#[actix_rt::test]
async fn python_sdk_1x_http_json_only_server_two_turns_and_streaming() {
    sdk_conversation_with("sdk1", "sdk_server1.py", &["--rest-only"], "1.0").await;
}

#[actix_rt::test]
async fn input_required_prints_the_question_and_how_to_answer() {
    let server = common::start_with(common::asker(), |_| {}).await;
    let cli = Cli::new(&[("booker", &server.url, None)]);
    let asked = cli.run(&["--to", "booker", "book a table"]).await;
    assert_ok(&asked);
    assert_eq!(asked.stdout.trim(), "which day?");
    let ctx = asked.context();
    let at = asked.stderr.find("--task ").expect("how to answer") + "--task ".len();
    let task_id = asked.stderr[at..]
        .split_whitespace()
        .next()
        .expect("task id")
        .to_owned();
    assert!(
        asked
            .stderr
            .contains(&format!("colloquy send --to {ctx} --task {task_id}")),
        "{}",
        asked.stderr
    );
    assert!(
        cli.run(&["--list"])
            .await
            .stdout
            .contains(&format!("waiting: task {task_id}"))
    );

    let answered = cli.run(&["--to", &ctx, "--task", &task_id, "friday"]).await;
    assert_ok(&answered);
    assert_eq!(answered.stdout.trim(), "booked for friday");
    server.stop().await;
}
