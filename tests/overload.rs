//! Past `limits.running_turns`, sends get a quick overload error (-32011 with a retry hint)
//! instead of piling up, nothing of theirs is stored, and the server takes turns again once the
//! load drops.

mod common;

use colloquy::agent::EchoAgent;
use common::*;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

const LIMIT: usize = 4;
const SLOW: Duration = Duration::from_millis(2_000);
const SENDS: usize = 24;

fn retry_after_ms(version: &str, error: &Value) -> Option<u64> {
    if version == V1 {
        error["data"][0]["metadata"]["retryAfterMs"].as_u64()
    } else {
        error["data"]["retryAfterMs"].as_u64()
    }
}

async fn overload_round(server: &TestServer, version: &str, round: &str) {
    let started = Instant::now();
    let mut sends = Vec::new();
    for i in 0..SENDS {
        let client = server.client.clone();
        let url = server.url.clone();
        let context_id = format!("overload-{round}-{i}");
        let body = json!({"jsonrpc": "2.0", "id": i, "method": send_method(version),
            "params": {"message": user_message(version, &format!("slow turn {i}"), Some(&context_id), None)}});
        let version = version.to_owned();
        sends.push(tokio::spawn(async move {
            let sent = Instant::now();
            let response = post_rpc(&client, &url, &version, &body).await;
            (context_id, sent.elapsed(), response)
        }));
    }
    let mut completed = Vec::new();
    let mut overloaded = Vec::new();
    for send in sends {
        let (context_id, took, response) = send.await.expect("send task");
        if let Some(error) = response.get("error") {
            assert_eq!(error["code"], -32011, "unexpected error: {response}");
            let retry = retry_after_ms(version, error);
            assert!(retry.is_some_and(|ms| ms > 0), "no retry hint: {error}");
            overloaded.push((context_id, took));
        } else {
            let task = task_of(&response);
            let state = task["status"]["state"].as_str().unwrap_or("");
            assert!(
                state == "TASK_STATE_COMPLETED" || state == "completed",
                "{response}"
            );
            assert!(took >= SLOW, "a slow turn ended in {took:?}");
            completed.push(context_id);
        }
    }
    assert!(
        completed.len() <= LIMIT,
        "{} turns ran at once, the limit is {LIMIT}",
        completed.len()
    );
    assert!(!completed.is_empty(), "no turn was let in");
    assert_eq!(completed.len() + overloaded.len(), SENDS);
    for (context_id, took) in &overloaded {
        // Well before the slow turns end: the excess is not queued behind them.
        assert!(
            *took < SLOW / 2,
            "overload answer for {context_id} took {took:?}"
        );
        // A rejected message is not stored.
        let found = server
            .rpc(
                version,
                "colloquy/getConversation",
                json!({"contextId": context_id}),
            )
            .await;
        let stored = found["result"]["messages"]
            .as_array()
            .map_or(0, |m| m.len());
        assert_eq!(stored, 0, "rejected send was stored: {found}");
    }
    assert!(
        started.elapsed() < SLOW * 3,
        "round took {:?}",
        started.elapsed()
    );
}

async fn recovers(server: &TestServer, version: &str) {
    // Load has dropped: sends are taken again, up to the limit at once, and multi-turn works.
    for i in 0..LIMIT * 2 {
        let first = server
            .send_text(version, &format!("after {i}"), None, None)
            .await;
        let task = task_of(&first);
        let context_id = task["contextId"].as_str().expect("contextId").to_owned();
        let second = server
            .send_text(version, "again", Some(&context_id), None)
            .await;
        let text = artifact_text(task_of(&second));
        assert!(
            text.contains(&format!("previously: \"after {i}\"")),
            "{second}"
        );
    }
}

#[actix_rt::test]
async fn excess_sends_are_refused_quickly_and_the_server_recovers() {
    let server = start_with(Arc::new(EchoAgent::new(0, SLOW)), |config| {
        config.limits.running_turns = LIMIT;
        config.workers = 2;
    })
    .await;
    overload_round(&server, V1, "v1").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(server.server.engine.running_turns(), 0);
    overload_round(&server, V03, "v03").await;
    assert_eq!(server.server.engine.running_turns(), 0);
    recovers_fast(&server).await;
    server.stop().await;
}

/// The recovery check, on a fresh fast server would not prove anything: reuse the slow one,
/// sending one turn at a time (each takes `SLOW`), so only a few.
async fn recovers_fast(server: &TestServer) {
    let started = Instant::now();
    let mut turns = Vec::new();
    for i in 0..LIMIT {
        let client = server.client.clone();
        let url = server.url.clone();
        let body = json!({"jsonrpc": "2.0", "id": i, "method": "SendMessage",
            "params": {"message": user_message(V1, &format!("back {i}"), None, None)}});
        turns.push(tokio::spawn(async move {
            post_rpc(&client, &url, V1, &body).await
        }));
    }
    for turn in turns {
        let response = turn.await.expect("task");
        assert_eq!(
            task_of(&response)["status"]["state"],
            "TASK_STATE_COMPLETED",
            "{response}"
        );
    }
    // The limit's worth of turns ran side by side, not one after another.
    assert!(started.elapsed() < SLOW * 2, "{:?}", started.elapsed());
}

#[actix_rt::test]
async fn multi_turn_works_after_overload_on_a_fast_server() {
    let server = start_with(
        Arc::new(EchoAgent::new(0, Duration::from_millis(300))),
        |config| {
            config.limits.running_turns = 2;
        },
    )
    .await;
    // Overload it briefly.
    let mut sends = Vec::new();
    for i in 0..12 {
        let client = server.client.clone();
        let url = server.url.clone();
        let body = json!({"jsonrpc": "2.0", "id": i, "method": "SendMessage",
            "params": {"message": user_message(V1, "burst", None, None)}});
        sends.push(tokio::spawn(async move {
            post_rpc(&client, &url, V1, &body).await
        }));
    }
    let mut refused = 0;
    for send in sends {
        let response = send.await.expect("task");
        if response["error"]["code"] == -32011 {
            refused += 1;
        }
    }
    assert!(refused >= 12 - 2, "only {refused} refused");
    recovers(&server, V1).await;
    server.stop().await;
}
