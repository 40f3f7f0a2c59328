//! Streaming without truncation: every stream, late or early, reconstructs the exact reply;
//! slow subscribers are cut off loudly; the task outlives its streams.

use crate::common;

use common::*;
use serde_json::{Value, json};
use std::time::Duration;

fn stream_method(version: &str) -> &'static str {
    if version == V1 {
        "SendStreamingMessage"
    } else {
        "message/stream"
    }
}

fn subscribe_method(version: &str) -> &'static str {
    if version == V1 {
        "SubscribeToTask"
    } else {
        "tasks/resubscribe"
    }
}

fn get_method(version: &str) -> &'static str {
    if version == V1 {
        "GetTask"
    } else {
        "tasks/get"
    }
}

/// The first event's task (v1.0 `{"task":..}`, v0.3 bare with kind "task").
fn first_task(events: &[Value]) -> &Value {
    let first = &events[0]["result"];
    first.get("task").unwrap_or(first)
}

fn final_state(events: &[Value]) -> String {
    let last = &events.last().expect("events")["result"];
    let update = last.get("statusUpdate").unwrap_or(last);
    update["status"]["state"].as_str().unwrap_or("").to_owned()
}

/// A reply text with multi-byte characters, so random byte cuts fall inside them.
fn sample_text(seed: usize) -> String {
    let pieces = [
        "é",
        "€",
        "😀",
        "中文",
        "ascii ",
        "ğ",
        "\u{1F469}\u{200D}\u{1F52C}",
        " ñ",
        "x",
    ];
    (0..(20 + seed % 40))
        .map(|i| pieces[(i * 7 + seed) % pieces.len()])
        .collect()
}

async fn stream_and_check(server: &TestServer, version: &str, seed: usize) {
    let text = sample_text(seed);
    let cuts = 1 + seed % 12;
    let message = user_message(version, &format!("chunks {cuts}: {text}"), None, None);
    let response = server
        .stream(version, stream_method(version), json!({"message": message}))
        .await;
    assert_eq!(
        response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("text/event-stream")
    );
    let events = sse_events(response).await;
    if version == V03 {
        for event in &events {
            assert_v03_valid("SendStreamingMessageResponse", event);
        }
        assert_eq!(events.last().unwrap()["result"]["final"], json!(true));
    }
    let streamed = streamed_text(&events);
    assert_eq!(streamed, text, "concatenated chunks (seed {seed})");
    assert!(
        final_state(&events).ends_with("ompleted") || final_state(&events).ends_with("COMPLETED")
    );
    let task = first_task(&events);
    let task_id = task["id"].as_str().unwrap();
    let context_id = task["contextId"].as_str().unwrap();
    let got = server
        .rpc(version, get_method(version), json!({"id": task_id}))
        .await;
    assert_eq!(
        artifact_text(&got["result"]),
        text,
        "final artifact (seed {seed})"
    );
    let stored = server.stored_messages(version, context_id).await;
    assert_eq!(
        message_text(stored.last().unwrap()),
        text,
        "stored reply (seed {seed})"
    );
}

#[actix_rt::test]
async fn five_hundred_streams_reconstruct_the_exact_reply() {
    let server = start_scripted(|_| {}).await;
    for batch in 0..25 {
        let runs = (0..20).map(|i| {
            let seed = batch * 20 + i;
            let version = if seed % 2 == 0 { V1 } else { V03 };
            stream_and_check(&server, version, seed)
        });
        futures_util::future::join_all(runs).await;
    }
    server.stop().await;
}

#[actix_rt::test]
async fn late_subscribers_get_everything_exactly_once() {
    let server = start_scripted(|_| {}).await;
    let text: String = "Late joiners must see every character: é€😀 exactly once. ".repeat(3);
    for version in [V1, V03] {
        let configuration = if version == V1 {
            json!({"returnImmediately": true})
        } else {
            json!({"blocking": false})
        };
        let message = user_message(version, &format!("drip 5 3: {text}"), None, None);
        let sent = server
            .rpc(
                version,
                send_method(version),
                json!({"message": message, "configuration": configuration}),
            )
            .await;
        let task_id = task_of(&sent)["id"].as_str().unwrap().to_owned();
        let subscribers = (0..8u64).map(|i| {
            let server = &server;
            let task_id = task_id.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(i * 37 % 250)).await;
                let response = server
                    .stream(version, subscribe_method(version), json!({"id": task_id}))
                    .await;
                sse_events(response).await
            }
        });
        for events in futures_util::future::join_all(subscribers).await {
            let prefix = artifact_text(first_task(&events));
            let rest = streamed_text(&events[1..]);
            assert_eq!(
                format!("{prefix}{rest}"),
                text,
                "snapshot + later chunks == reply"
            );
        }
    }
    server.stop().await;
}

#[actix_rt::test]
async fn concurrent_subscribers_see_identical_sequences() {
    let server = start_scripted(|_| {}).await;
    let message = user_message(
        V1,
        "drip 120 4: two streams, one sequence of events",
        None,
        None,
    );
    let response = server
        .stream(V1, "SendStreamingMessage", json!({"message": message}))
        .await;
    let mut origin = LiveStream::new(response);
    let first = origin.next_event().await.unwrap();
    let task_id = streamed_task_id(&first);
    // Joins before the first chunk (the agent waits 120 ms): same snapshot, same events.
    let joined = server
        .stream(V1, "SubscribeToTask", json!({"id": task_id}))
        .await;
    let joined = tokio::spawn(sse_events(joined));
    let mut origin_events = vec![first];
    origin_events.extend(origin.rest().await);
    let joined_events = joined.await.unwrap();
    let results = |events: &[Value]| {
        events
            .iter()
            .map(|e| e["result"].clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(results(&joined_events), results(&origin_events));
    assert!(origin_events.len() > 5);
    server.stop().await;
}

#[actix_rt::test]
async fn a_disconnected_client_does_not_cancel_the_task() {
    let server = start_scripted(|_| {}).await;
    let text = "the reply goes on without its listener";
    let message = user_message(V1, &format!("drip 20 2: {text}"), Some("gone"), None);
    let response = server
        .stream(V1, "SendStreamingMessage", json!({"message": message}))
        .await;
    let mut events = LiveStream::new(response);
    let task_id = streamed_task_id(&events.next_event().await.unwrap());
    events.next_event().await;
    drop(events);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let task = server.rpc(V1, "GetTask", json!({"id": task_id})).await;
    assert_eq!(task["result"]["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(artifact_text(&task["result"]), text);
    let stored = server.stored_messages(V1, "gone").await;
    assert_eq!(message_text(&stored[1]), text);
    server.stop().await;
}

#[actix_rt::test]
async fn a_slow_subscriber_is_closed_with_an_error_while_a_fast_one_gets_everything() {
    let server = start_scripted(|c| c.streaming.subscriber_buffer = 16).await;
    let (count, size) = (1500, 16 * 1024);
    let message = user_message(V1, &format!("flood {count} {size}"), None, None);
    let response = server
        .stream(V1, "SendStreamingMessage", json!({"message": message}))
        .await;
    let mut fast = LiveStream::new(response);
    let task_id = streamed_task_id(&fast.next_event().await.unwrap());
    let slow = server
        .stream(V1, "SubscribeToTask", json!({"id": task_id}))
        .await;
    let fast_events = tokio::spawn(fast.rest());
    // The slow subscriber reads nothing until the agent is done.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let slow_events = sse_events(slow).await;
    let fast_events = fast_events.await.unwrap();

    let fast_text = streamed_text(&fast_events);
    assert_eq!(
        fast_text.len(),
        count * size,
        "the fast subscriber got every chunk"
    );
    assert_eq!(final_state(&fast_events), "TASK_STATE_COMPLETED");
    let last = slow_events.last().unwrap();
    assert_eq!(
        last["error"]["code"],
        json!(-32012),
        "closed with a clear error"
    );
    let slow_text = format!(
        "{}{}",
        artifact_text(first_task(&slow_events)),
        streamed_text(&slow_events[1..])
    );
    assert!(slow_text.len() < count * size);
    assert!(
        fast_text.starts_with(&slow_text),
        "what the slow one got is a prefix, nothing skipped"
    );
    server.stop().await;
}

#[actix_rt::test]
async fn cancel_ends_every_stream_and_terminal_tasks_refuse_subscribers() {
    let server = start_scripted(|_| {}).await;
    for version in [V1, V03] {
        let message = user_message(
            version,
            "drip 50 1: a long reply that will be canceled",
            None,
            None,
        );
        let origin = server
            .stream(version, stream_method(version), json!({"message": message}))
            .await;
        let mut origin = LiveStream::new(origin);
        let first = origin.next_event().await.unwrap();
        let task_id = streamed_task_id(&first);
        let other = server
            .stream(version, subscribe_method(version), json!({"id": task_id}))
            .await;
        let other = tokio::spawn(sse_events(other));
        tokio::time::sleep(Duration::from_millis(150)).await;
        let cancel = if version == V1 {
            "CancelTask"
        } else {
            "tasks/cancel"
        };
        server.rpc(version, cancel, json!({"id": task_id})).await;
        let mut origin_events = vec![first];
        origin_events.extend(origin.rest().await);
        let canceled = if version == V1 {
            "TASK_STATE_CANCELED"
        } else {
            "canceled"
        };
        assert_eq!(final_state(&origin_events), canceled);
        assert_eq!(final_state(&other.await.unwrap()), canceled);

        let refused = subscribe_refused(&server, version, &task_id).await;
        assert_eq!(
            refused["error"]["code"],
            json!(if version == V1 { -32004 } else { -32602 })
        );
        let unknown = subscribe_refused(&server, version, "nope").await;
        assert_eq!(unknown["error"]["code"], json!(-32001));
    }
    server.stop().await;
}

#[actix_rt::test]
async fn an_input_required_stream_ends_with_a_final_waiting_event() {
    let server = start_scripted(|_| {}).await;
    let message = user_message(V03, "ask: your name?", None, None);
    let events = sse_events(
        server
            .stream(V03, "message/stream", json!({"message": message}))
            .await,
    )
    .await;
    let last = &events.last().unwrap()["result"];
    assert_eq!(last["status"]["state"], "input-required");
    assert_eq!(last["final"], json!(true));
    for event in &events {
        assert_v03_valid("SendStreamingMessageResponse", event);
    }
    server.stop().await;
}

fn state_name(version: &str, v1: &'static str, v03: &'static str) -> &'static str {
    if version == V1 { v1 } else { v03 }
}

/// A task waiting for input: its id and contextId.
async fn waiting_task(server: &TestServer, version: &str) -> (String, String) {
    let asked = server
        .send_text(version, "ask: your name?", None, None)
        .await;
    let task = task_of(&asked);
    let waiting = state_name(version, "TASK_STATE_INPUT_REQUIRED", "input-required");
    assert_eq!(task["status"]["state"], waiting, "{asked}");
    let id = task["id"].as_str().expect("task id").to_owned();
    let context = task["contextId"].as_str().expect("contextId").to_owned();
    (id, context)
}

/// A subscription follows the task, not the turn: opened on a task waiting for input, it
/// stays open through the wait and the answer's turn, and closes when the task completes.
#[actix_rt::test]
async fn a_subscription_stays_open_through_a_wait_for_input_until_the_task_ends() {
    let server = start_scripted(|_| {}).await;
    for version in [V1, V03] {
        let (task_id, context_id) = waiting_task(&server, version).await;
        let subscribed = server
            .stream(version, subscribe_method(version), json!({"id": task_id}))
            .await;
        let mut subscriber = LiveStream::new(subscribed);
        let first = subscriber.next_event().await.expect("the task first");
        assert_eq!(streamed_task_id(&first), task_id);
        // The wait is not the end: the stream is still open well after the snapshot.
        let open = tokio::time::timeout(Duration::from_millis(300), subscriber.next_event()).await;
        assert!(
            open.is_err(),
            "the stream ended or moved while waiting: {open:?}"
        );

        let answer = server
            .send_text(version, "Ada", Some(&context_id), Some(&task_id))
            .await;
        let completed = state_name(version, "TASK_STATE_COMPLETED", "completed");
        assert_eq!(task_of(&answer)["status"]["state"], completed, "{answer}");
        let rest = tokio::time::timeout(Duration::from_secs(20), subscriber.rest())
            .await
            .expect("the stream closes once the task completed");
        let mut events = vec![first];
        events.extend(rest);
        assert_eq!(final_state(&events), completed, "{events:?}");
        let finals = events
            .iter()
            .filter(|e| e["result"]["final"] == json!(true))
            .count();
        if version == V03 {
            assert_eq!(finals, 1, "only the completion is final: {events:?}");
            for event in &events {
                assert_v03_valid("SendStreamingMessageResponse", event);
            }
        }
    }
    server.stop().await;
}

/// A task canceled while it waits ends its subscribers' streams with the canceled state.
#[actix_rt::test]
async fn a_cancel_while_waiting_ends_the_subscription_canceled() {
    let server = start_scripted(|_| {}).await;
    for version in [V1, V03] {
        let (task_id, _) = waiting_task(&server, version).await;
        let subscribed = server
            .stream(version, subscribe_method(version), json!({"id": task_id}))
            .await;
        let mut subscriber = LiveStream::new(subscribed);
        let first = subscriber.next_event().await.expect("the task first");
        let cancel = state_name(version, "CancelTask", "tasks/cancel");
        let canceled = server.rpc(version, cancel, json!({"id": task_id})).await;
        assert!(canceled.get("error").is_none(), "{canceled}");
        let rest = tokio::time::timeout(Duration::from_secs(20), subscriber.rest())
            .await
            .expect("the stream closes once the task is canceled");
        let mut events = vec![first];
        events.extend(rest);
        let state = state_name(version, "TASK_STATE_CANCELED", "canceled");
        assert_eq!(final_state(&events), state, "{events:?}");
    }
    server.stop().await;
}

/// A refused subscription's error: a JSON-RPC error response on v1.0; on v0.3 an event stream
/// holding one error event (as the reference server answers `tasks/resubscribe`).
async fn subscribe_refused(server: &TestServer, version: &str, task_id: &str) -> Value {
    if version == V1 {
        return server
            .rpc(version, subscribe_method(version), json!({"id": task_id}))
            .await;
    }
    let response = server
        .stream(version, subscribe_method(version), json!({"id": task_id}))
        .await;
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    let events = sse_events(response).await;
    assert_eq!(events.len(), 1, "one error event: {events:?}");
    assert!(events[0].get("result").is_none(), "{events:?}");
    events[0].clone()
}
