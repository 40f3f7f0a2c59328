//! `colloquy export` / `colloquy import`: a store filled through the real server moves to
//! another store (sled to PostgreSQL, sled to sled) unchanged, and serves on from there.

use crate::common;

use common::*;
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

/// Runs the colloquy binary on the store `url` (None: the sled folder its args name), with
/// `stdin` as its input; asserts it succeeded and returns its stdout, and stderr.
fn colloquy(args: &[&str], url: Option<&str>, stdin: &[u8]) -> (Vec<u8>, String) {
    let output = run_colloquy(args, url, stdin);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "colloquy {args:?}: {stderr}");
    (output.stdout, stderr)
}

/// Runs the colloquy binary as [`colloquy`] does, whatever its exit.
fn run_colloquy(args: &[&str], url: Option<&str>, stdin: &[u8]) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_colloquy"));
    command
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match url {
        Some(url) => command.env("COLLOQUY_STORE__URL", url),
        None => command.env_remove("COLLOQUY_STORE__URL"),
    };
    let mut child = command.spawn().expect("colloquy runs");
    let mut input = child.stdin.take().expect("stdin");
    std::io::Write::write_all(&mut input, stdin).expect("stdin written");
    drop(input);
    child.wait_with_output().expect("colloquy ends")
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

const PRINCIPALS: [(&str, &str); 2] = [("alice", "alice-token"), ("bob", "bob-token")];

/// A server of the scripted agent knowing both principals' tokens, on the database `url` or
/// the sled folder `data` (default: a fresh one).
async fn server_on(url: Option<&str>, data: Option<&Path>) -> TestServer {
    start_with(Arc::new(ScriptedAgent), |config| {
        if let Some(url) = url {
            config.store.url = url.to_owned();
        }
        if let Some(data) = data {
            config.data = data.to_owned();
        }
        for (principal, token) in PRINCIPALS {
            config.auth.tokens.insert(principal.into(), token.into());
        }
    })
    .await
}

async fn send_as(server: &TestServer, token: &str, text: &str, context_id: &str) -> Value {
    let params = json!({"message": user_message(V1, text, Some(context_id), None)});
    rpc_as(server, token, "SendMessage", params).await
}

fn id_of(response: &Value) -> String {
    task_of(response)["id"]
        .as_str()
        .expect("a task id")
        .to_owned()
}

/// Multi-turn conversations of two principals (one contextId used by both), and tasks
/// completed, canceled, failed, rejected and left waiting for input. Returns the waiting task.
async fn fill(server: &TestServer) -> String {
    let (alice, bob) = (PRINCIPALS[0].1, PRINCIPALS[1].1);
    for text in ["one", "two", "three"] {
        send_as(server, alice, text, "shared").await;
    }
    send_as(server, bob, "bob one", "shared").await;
    let asked = send_as(server, bob, "ask: which colour?", "asks").await;
    let canceled = rpc_as(server, bob, "CancelTask", json!({"id": id_of(&asked)})).await;
    assert_eq!(canceled["result"]["status"]["state"], "TASK_STATE_CANCELED");
    let asked = send_as(server, alice, "ask: your name?", "asks").await;
    let mut answer = user_message(V1, "Ada", Some("asks"), Some(&id_of(&asked)));
    answer["taskId"] = json!(id_of(&asked));
    rpc_as(server, alice, "SendMessage", json!({"message": answer})).await;
    let waiting = send_as(server, alice, "ask: still there?", "waiting").await;
    send_as(server, alice, "fail", "broken").await;
    send_as(server, bob, "reject", "rejected").await;
    id_of(&waiting)
}

/// What each principal sees of its tasks and conversations.
async fn observed(server: &TestServer) -> Vec<Value> {
    let mut seen = Vec::new();
    for (_, token) in PRINCIPALS {
        let tasks = rpc_as(server, token, "ListTasks", json!({"pageSize": 100})).await;
        let listed = rpc_as(server, token, "colloquy/listConversations", json!({})).await;
        seen.push(tasks["result"].clone());
        seen.push(listed["result"].clone());
    }
    seen
}

fn states(seen: &[Value]) -> Vec<String> {
    let mut states: Vec<String> = seen
        .iter()
        .filter_map(|result| result["tasks"].as_array())
        .flatten()
        .map(|task| task["status"]["state"].as_str().unwrap_or_default().into())
        .collect();
    states.sort();
    states.dedup();
    states
}

/// The moved store serves on: the conversations continue with their imported history.
async fn continue_on(server: &TestServer, waiting: &str) {
    let (alice, bob) = (PRINCIPALS[0].1, PRINCIPALS[1].1);
    let four = send_as(server, alice, "four", "shared").await;
    assert_eq!(
        artifact_text(task_of(&four)),
        "echo: four (turn 4; previously: \"three\")",
        "{four}"
    );
    let bobs = send_as(server, bob, "bob two", "shared").await;
    assert_eq!(
        artifact_text(task_of(&bobs)),
        "echo: bob two (turn 2; previously: \"bob one\")",
        "bob's own history only: {bobs}"
    );
    let mut answer = user_message(V1, "yes", Some("waiting"), Some(waiting));
    answer["taskId"] = json!(waiting);
    let answered = rpc_as(server, alice, "SendMessage", json!({"message": answer})).await;
    assert_eq!(
        task_of(&answered)["status"]["state"],
        "TASK_STATE_COMPLETED",
        "{answered}"
    );
    let task = rpc_as(server, alice, "GetTask", json!({"id": waiting})).await;
    let history = task["result"]["history"].as_array().expect("history");
    assert_eq!(history.len(), 4, "the imported turn and this one: {task}");
    let stolen = rpc_as(server, bob, "GetTask", json!({"id": waiting})).await;
    assert_eq!(stolen["error"]["code"], json!(-32001), "{stolen}");
}

#[actix_rt::test]
async fn a_sled_store_moves_to_postgres_unchanged_and_serves_on() {
    let Some(url) = pg::database("transfer::a_sled_store_moves_to_postgres") else {
        return;
    };
    let sled = server_on(None, None).await;
    let waiting = fill(&sled).await;
    let seen = observed(&sled).await;
    assert_eq!(
        states(&seen),
        [
            "TASK_STATE_CANCELED",
            "TASK_STATE_COMPLETED",
            "TASK_STATE_FAILED",
            "TASK_STATE_INPUT_REQUIRED",
            "TASK_STATE_REJECTED"
        ]
    );
    let data = sled.stop().await;
    let files = tempfile::tempdir().expect("temp dir");
    let (first, second) = (files.path().join("a.jsonl"), files.path().join("b.jsonl"));
    let sled_args = ["--data", path(data.path())];
    let (_, said) = colloquy(
        &[&["export", "--output", path(&first)], &sled_args[..]].concat(),
        None,
        b"",
    );
    assert!(said.contains("exported 7 conversations"), "{said}");

    let (_, said) = colloquy(&["import", "--input", path(&first)], Some(&url), b"");
    assert!(
        said.contains("imported 7 conversations (0 already"),
        "{said}"
    );
    let (_, said) = colloquy(&["import", "--input", path(&first)], Some(&url), b"");
    assert!(
        said.contains("imported 0 conversations (7 already"),
        "a second run changes nothing: {said}"
    );
    colloquy(&["export", "--output", path(&second)], Some(&url), b"");
    let (a, b) = (
        std::fs::read(&first).unwrap(),
        std::fs::read(&second).unwrap(),
    );
    assert_eq!(
        String::from_utf8_lossy(&a),
        String::from_utf8_lossy(&b),
        "PostgreSQL exports what sled exported, byte for byte"
    );
    let (only_bob, _) = colloquy(&["export", "--principal", "bob"], Some(&url), b"");
    let only_bob = String::from_utf8_lossy(&only_bob);
    assert_eq!(only_bob.matches(r#""kind":"conversation""#).count(), 3);
    assert!(!only_bob.contains(r#""principal":"alice""#));

    let served = server_on(Some(&url), None).await;
    assert_eq!(
        observed(&served).await,
        seen,
        "listings as they were on sled"
    );
    continue_on(&served, &waiting).await;
    served.stop().await;
}

#[actix_rt::test]
async fn a_sled_store_moves_to_another_sled_folder_through_a_pipe() {
    let sled = server_on(None, None).await;
    let waiting = fill(&sled).await;
    let seen = observed(&sled).await;
    let data = sled.stop().await;
    let target = tempfile::tempdir().expect("temp dir");
    let folder = target.path().join("new-folder");
    let (exported, _) = colloquy(&["export", "--data", path(data.path())], None, b"");
    assert!(exported.starts_with(br#"{"kind":"header","format":"colloquy-export","version":1}"#));
    let (_, said) = colloquy(&["import", "--data", path(&folder)], None, &exported);
    assert!(said.contains("imported 7 conversations"), "{said}");
    let (again, _) = colloquy(&["export", "--data", path(&folder)], None, b"");
    assert_eq!(
        String::from_utf8_lossy(&exported),
        String::from_utf8_lossy(&again)
    );

    let served = server_on(None, Some(&folder)).await;
    assert_eq!(observed(&served).await, seen);
    continue_on(&served, &waiting).await;
    served.stop().await;
}

/// `colloquy import` into the sled folder `folder`, `input` on its stdin.
fn import_lines(folder: &std::path::Path, input: &str) -> std::process::Output {
    run_colloquy(&["import", "--data", path(folder)], None, input.as_bytes())
}

#[test]
fn an_export_of_a_newer_format_or_out_of_order_records_is_refused() {
    let target = tempfile::tempdir().expect("temp dir");
    let run = |input: &str| import_lines(target.path(), input);
    let newer = run("{\"kind\":\"header\",\"format\":\"colloquy-export\",\"version\":2}\n");
    assert!(!newer.status.success());
    assert!(String::from_utf8_lossy(&newer.stderr).contains("newer than this colloquy"));
    let orphan = run(concat!(
        "{\"kind\":\"header\",\"format\":\"colloquy-export\",\"version\":1}\n",
        "{\"kind\":\"message\",\"principal\":\"p\",\"contextId\":\"c\",\"seq\":0,",
        "\"message\":{\"message_id\":\"m\",\"role\":\"user\",\"parts\":[]}}\n",
    ));
    let said = String::from_utf8_lossy(&orphan.stderr);
    assert!(
        !orphan.status.success() && said.contains("line 2"),
        "{said}"
    );
}

#[test]
fn an_import_keeps_the_limits_a_request_would_meet() {
    let target = tempfile::tempdir().expect("temp dir");
    let header = r#"{"kind":"header","format":"colloquy-export","version":1}"#;
    let conversation = |context_id: &str| {
        json!({"kind": "conversation", "principal": "p", "contextId": context_id,
            "createdAt": "2026-01-01T00:00:00Z", "updatedAt": "2026-01-01T00:00:00Z",
            "turns": 1, "nextSeq": 1, "token": 1})
        .to_string()
    };
    let message = |context_id: &str, text: &str| {
        json!({"kind": "message", "principal": "p", "contextId": context_id, "seq": 0,
            "message": {"message_id": "m", "role": "user", "context_id": context_id,
                "parts": [{"content": {"type": "text", "text": text}}]}})
        .to_string()
    };
    let fits = [
        header.to_owned(),
        conversation("fits"),
        message("fits", "hello"),
    ]
    .join("\n");
    let stored = import_lines(target.path(), &fits);
    assert!(
        stored.status.success(),
        "{}",
        String::from_utf8_lossy(&stored.stderr)
    );
    let long_text = "x".repeat(256 * 1024 + 1);
    let long_id = "c".repeat(257);
    for (lines, record, why) in [
        (
            [
                header.to_owned(),
                conversation("big"),
                message("big", &long_text),
            ],
            "line 3",
            "bytes of text, more than the limit of 262144",
        ),
        (
            [
                header.to_owned(),
                conversation(&long_id),
                message(&long_id, "hi"),
            ],
            "line 2",
            "contextId: 257 bytes, more than the limit of 256",
        ),
    ] {
        let refused = import_lines(target.path(), &lines.join("\n"));
        let said = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success(), "{said}");
        assert!(said.contains(record) && said.contains(why), "{said}");
    }
    let (exported, _) = colloquy(&["export", "--data", path(target.path())], None, b"");
    let exported = String::from_utf8_lossy(&exported);
    assert_eq!(
        exported.matches(r#""kind":"conversation""#).count(),
        1,
        "only the record within the limits is stored: {exported}"
    );
}
