//! Configuration from the environment, through a `colloquy serve` child process: what a
//! Kubernetes Service named `colloquy` injects is ignored with one warning, values are read by the
//! type of the key they set, and unknown keys in a file stay an error.

use crate::common::*;
use serde_json::json;
use std::process::Stdio;
use std::time::Duration;

/// What Kubernetes puts into every pod of a namespace with a Service `colloquy` on port 8080.
const KUBERNETES_SERVICE: [(&str, &str); 7] = [
    ("COLLOQUY_PORT", "tcp://10.0.0.1:8080"),
    ("COLLOQUY_SERVICE_HOST", "10.0.0.1"),
    ("COLLOQUY_SERVICE_PORT", "8080"),
    ("COLLOQUY_PORT_8080_TCP", "tcp://10.0.0.1:8080"),
    ("COLLOQUY_PORT_8080_TCP_ADDR", "10.0.0.1"),
    ("COLLOQUY_PORT_8080_TCP_PORT", "8080"),
    ("COLLOQUY_PORT_8080_TCP_PROTO", "tcp"),
];

fn serve_command(listen: &str, dir: &std::path::Path) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_colloquy"));
    command
        .args([
            "serve",
            "--grpc-listen",
            "127.0.0.1:0",
            "--listen",
            listen,
            "--data",
        ])
        .arg(dir)
        .env_remove("COLLOQUY_TOKENS")
        .env("RUST_LOG", "warn")
        .kill_on_drop(true);
    command
}

/// Waits for `/healthz` on `url`; false if the process exited first or it never answered.
async fn came_up(process: &mut tokio::process::Child, url: &str) -> bool {
    let client = reqwest::Client::new();
    for _ in 0..2400 {
        if client.get(format!("{url}healthz")).send().await.is_ok() {
            return true;
        }
        if process.try_wait().ok().flatten().is_some() {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    false
}

/// The process's stderr once it is stopped.
async fn stop_and_read_stderr(mut process: tokio::process::Child) -> String {
    let _ = process.start_kill();
    let output = tokio::time::timeout(Duration::from_secs(60), process.wait_with_output())
        .await
        .expect("a killed server exits")
        .unwrap();
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Runs a start that must be refused; its stderr.
async fn refused_start(command: &mut tokio::process::Command) -> String {
    let output = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("a refused start exits at once")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "it started: {stderr}");
    stderr
}

#[actix_rt::test]
async fn kubernetes_service_variables_are_ignored_with_one_warning_and_values_keep_their_key_type()
{
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let url = format!("http://{listen}/");
    let mut process = serve_command(&listen, dir.path())
        .envs(KUBERNETES_SERVICE)
        // A text key given what looks like a number, and a token that looks like one.
        .env("COLLOQUY_CARD__VERSIONS", "1.0")
        .env("COLLOQUY_AUTH__TOKENS__ALICE", "12345")
        .stderr(Stdio::piped())
        .spawn()
        .expect("colloquy starts");
    if !came_up(&mut process, &url).await {
        panic!(
            "colloquy did not start: {}",
            stop_and_read_stderr(process).await
        );
    }
    let client = reqwest::Client::new();
    let card: serde_json::Value = client
        .get(format!("{url}.well-known/agent-card.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(card["supportedInterfaces"].is_array(), "{card}");
    assert!(
        card.get("protocolVersion").is_none(),
        "card.versions is \"1.0\": no v0.3 fields: {card}"
    );
    let get_task =
        json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "none"}});
    let status = |token: Option<&'static str>| {
        let mut request = client
            .post(&url)
            .header("A2A-Version", "1.0")
            .json(&get_task);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        async move { request.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(status(None).await, 401);
    assert_eq!(status(Some("12345")).await, 200);

    let stderr = stop_and_read_stderr(process).await;
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("name no configuration key"))
        .collect();
    assert_eq!(warnings.len(), 1, "one warning: {stderr}");
    for (name, _) in KUBERNETES_SERVICE {
        assert!(warnings[0].contains(name), "{name} not named: {stderr}");
    }
    for known in ["COLLOQUY_CARD__VERSIONS", "COLLOQUY_AUTH__TOKENS__ALICE"] {
        assert!(!warnings[0].contains(known), "{known} is a key: {stderr}");
    }
}

#[actix_rt::test]
async fn an_unknown_key_in_a_file_or_a_bad_value_in_the_environment_still_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let file = dir.path().join("colloquy.toml");
    std::fs::write(&file, "port = 8080\n").unwrap();
    let stderr = refused_start(
        serve_command(&listen, dir.path())
            .arg("--config")
            .arg(&file),
    )
    .await;
    assert!(stderr.contains("port"), "{stderr}");

    let stderr =
        refused_start(serve_command(&listen, dir.path()).env("COLLOQUY_HISTORY__LIMIT", "many"))
            .await;
    assert!(stderr.contains("COLLOQUY_HISTORY__LIMIT"), "{stderr}");

    // A value of the right type outside its range names the key and the range.
    let stderr =
        refused_start(serve_command(&listen, dir.path()).env("COLLOQUY_STORE__LEAF_FANOUT", "4"))
            .await;
    assert!(stderr.contains("store.leaf_fanout is 4"), "{stderr}");
    let stderr = refused_start(
        serve_command(&listen, dir.path()).env("COLLOQUY_STORE__SEGMENT_CLEANUP_PERCENT", "95"),
    )
    .await;
    assert!(
        stderr.contains("store.segment_cleanup_percent is 95; use 10 to 90"),
        "{stderr}"
    );

    let stderr = refused_start(serve_command(&listen, dir.path()).arg("--no-such-flag")).await;
    assert!(stderr.contains("no-such-flag"), "{stderr}");
}
