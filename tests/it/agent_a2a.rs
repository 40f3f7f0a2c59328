//! The `a2a` backend: colloquy A delegating to colloquy B (echo), both real servers on loopback.

use crate::common;

use colloquy::agent::{A2aAgent, EchoAgent};
use common::{V1, V03, artifact_text, conversations, task_of};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

fn delegating(peer_url: &str, max_turns: u64) -> Arc<A2aAgent> {
    Arc::new(A2aAgent::new(peer_url, None, max_turns))
}

fn state(task: &Value) -> &str {
    task["status"]["state"].as_str().unwrap_or("")
}

#[actix_rt::test]
async fn three_turns_through_a_keep_one_upstream_context_across_a_restart() {
    let b = common::start_echo().await;
    let a = common::start_with(delegating(&b.url, 20), |_| {}).await;
    let ctx = "conversation-at-a";

    let one = a.send_text(V1, "one", Some(ctx), None).await;
    let task = task_of(&one);
    assert_eq!(state(task), "TASK_STATE_COMPLETED", "{one}");
    assert_eq!(artifact_text(task), "echo: one (turn 1)");

    // v0.3 callers are delegated the same way.
    let two = a.send_text(V03, "two", Some(ctx), None).await;
    assert_eq!(
        artifact_text(task_of(&two)),
        "echo: two (turn 2; previously: \"one\")",
        "{two}"
    );

    // Restart A on the same data folder: the mapping to B's context holds.
    let dir = a.stop().await;
    let a = common::start_in(dir, delegating(&b.url, 20), |_| {}).await;
    let three = a.send_text(V1, "three", Some(ctx), None).await;
    assert_eq!(
        artifact_text(task_of(&three)),
        "echo: three (turn 3; previously: \"two\")",
        "B saw the whole thread: {three}"
    );

    // B holds exactly one conversation, under its own contextId, with all three turns.
    let at_b = conversations(&b).await;
    assert_eq!(at_b.len(), 1, "{at_b:?}");
    assert_ne!(at_b[0]["contextId"], ctx);
    assert_eq!(at_b[0]["turns"], 3);

    // Another conversation at A gets another upstream context at B.
    let other = a.send_text(V1, "solo", Some("another-at-a"), None).await;
    assert_eq!(artifact_text(task_of(&other)), "echo: solo (turn 1)");
    assert_eq!(conversations(&b).await.len(), 2);
    a.stop().await;
    b.stop().await;
}

#[actix_rt::test]
async fn the_peer_stream_is_relayed_chunk_by_chunk() {
    let b = common::start_with(
        Arc::new(EchoAgent::new(4, Duration::from_millis(5))),
        |_| {},
    )
    .await;
    let a = common::start_with(delegating(&b.url, 20), |_| {}).await;
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage",
        "params": {"message": common::user_message(V1, "relay this reply", Some("streamed"), None)}});
    let text = a
        .client
        .post(&a.url)
        .header("A2A-Version", V1)
        .header("Accept", "text/event-stream")
        .json(&body)
        .send()
        .await
        .expect("sent")
        .text()
        .await
        .expect("stream body");
    let events: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| serde_json::from_str(d.trim()).expect("event JSON"))
        .collect();
    let chunks: Vec<String> = events
        .iter()
        .filter_map(|e| e["result"]["artifactUpdate"]["artifact"]["parts"][0]["text"].as_str())
        .map(str::to_owned)
        .collect();
    assert!(chunks.len() > 3, "relayed in several chunks: {text}");
    assert_eq!(chunks.concat(), "echo: relay this reply (turn 1)");
    let last = events.last().expect("events");
    assert_eq!(
        last["result"]["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
    a.stop().await;
    b.stop().await;
}

#[actix_rt::test]
async fn the_anti_loop_limit_rejects() {
    let b = common::start_echo().await;
    let a = common::start_with(delegating(&b.url, 2), |_| {}).await;
    for text in ["one", "two"] {
        let r = a.send_text(V1, text, Some("loop"), None).await;
        assert_eq!(state(task_of(&r)), "TASK_STATE_COMPLETED", "{r}");
    }
    let third = a.send_text(V1, "three", Some("loop"), None).await;
    let task = task_of(&third);
    assert_eq!(state(task), "TASK_STATE_REJECTED", "{third}");
    let why = task["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap_or("");
    assert!(
        why.contains("limit") && why.contains("max_turns_per_context = 2"),
        "{why}"
    );
    // B never saw the third turn.
    assert_eq!(conversations(&b).await[0]["turns"], 2);
    a.stop().await;
    b.stop().await;
}

#[actix_rt::test]
async fn peer_errors_fail_the_task_with_the_peers_message() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        format!("http://{}/", l.local_addr().expect("addr"))
    };
    let a = common::start_with(delegating(&closed, 20), |_| {}).await;
    let r = a.send_text(V1, "hello?", Some("nobody-home"), None).await;
    let task = task_of(&r);
    assert_eq!(state(task), "TASK_STATE_FAILED", "{r}");
    let why = task["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap_or("");
    assert!(why.contains("connection refused"), "{why}");

    // A JSON-RPC error from the peer: B requires a token A does not have.
    let b = common::start_with(Arc::new(EchoAgent::default()), |c| {
        c.auth.tokens.insert("x".into(), "tok".into());
    })
    .await;
    let a2 = common::start_with(delegating(&b.url, 20), |_| {}).await;
    let r = a2.send_text(V1, "hi", Some("denied"), None).await;
    let task = task_of(&r);
    assert_eq!(state(task), "TASK_STATE_FAILED", "{r}");
    let why = task["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap_or("");
    assert!(why.contains("401"), "{why}");
    a.stop().await;
    a2.stop().await;
    b.stop().await;
}

#[actix_rt::test]
async fn input_required_is_passed_through_and_answered_upstream() {
    let b = common::start_with(common::asker(), |_| {}).await;
    let a = common::start_with(delegating(&b.url, 20), |_| {}).await;
    let asked = a.send_text(V1, "book a table", Some("booking"), None).await;
    let task = task_of(&asked);
    assert_eq!(state(task), "TASK_STATE_INPUT_REQUIRED", "{asked}");
    assert_eq!(task["status"]["message"]["parts"][0]["text"], "which day?");
    let task_id = task["id"].as_str().expect("task id").to_owned();

    let answered = a
        .send_text(V1, "friday", Some("booking"), Some(&task_id))
        .await;
    let task = task_of(&answered);
    assert_eq!(state(task), "TASK_STATE_COMPLETED", "{answered}");
    assert_eq!(artifact_text(task), "booked for friday");
    // B continued its own waiting task rather than starting another.
    let tasks = b.rpc(V1, "ListTasks", json!({})).await;
    assert_eq!(tasks["result"]["totalSize"], 1, "{tasks}");
    a.stop().await;
    b.stop().await;
}
