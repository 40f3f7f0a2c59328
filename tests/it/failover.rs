//! Acknowledged means committed, across a failover: a PostgreSQL primary with a synchronous
//! standby, two colloquy nodes naming both hosts (`target_session_attrs=read-write`) under a
//! load of multi-turn conversations, the primary SIGKILLed and the standby promoted. Every turn
//! a client was answered completed is stored afterwards with its exact history, and what clients
//! got meanwhile were only errors that say retry.

use crate::cluster::ChildNode;
use crate::common::*;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Conversations driven at once (half start on each node; turns alternate between nodes).
const CONVERSATIONS: usize = 6;

/// Turns acknowledged so far, in all conversations.
static ACKNOWLEDGED: AtomicUsize = AtomicUsize::new(0);

/// A turn a client was answered completed.
#[derive(Debug, Clone)]
struct Acknowledged {
    task_id: String,
    text: String,
    reply: String,
    /// When its request was sent, and answered.
    sent: Instant,
    at: Instant,
}

/// What one conversation's client saw.
#[derive(Default)]
struct Seen {
    acknowledged: Vec<Acknowledged>,
    retried: usize,
    /// Answers that are neither a completed turn nor a retryable error.
    wrong: Vec<Value>,
}

/// Sends turns to alternating nodes until `stop`, each turn again until it is acknowledged
/// while the answer says retry.
async fn converse(nodes: Arc<Vec<String>>, conversation: usize, stop: Arc<AtomicBool>) -> Seen {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("a client");
    let context_id = format!("failover-{conversation}");
    let mut seen = Seen::default();
    let mut turn = 0;
    while !stop.load(Ordering::Relaxed) {
        let text = format!("c{conversation} t{turn}");
        let node = &nodes[(conversation + turn) % nodes.len()];
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
            "message": user_message(V1, &text, Some(&context_id), None),
        }});
        let sent = Instant::now();
        let answer = post_rpc(&client, node, V1, &body).await;
        let code = answer["error"]["code"].as_i64();
        if matches!(code, Some(-32016 | -32010)) {
            // -32016: the database is unreachable; -32010: an unanswered start not yet taken back.
            seen.retried += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let task = task_of(&answer);
        if task["status"]["state"] != json!("TASK_STATE_COMPLETED") {
            seen.wrong.push(answer.clone());
            break;
        }
        ACKNOWLEDGED.fetch_add(1, Ordering::Relaxed);
        seen.acknowledged.push(Acknowledged {
            task_id: task["id"].as_str().unwrap_or_default().to_owned(),
            text,
            reply: artifact_text(task),
            sent,
            at: Instant::now(),
        });
        turn += 1;
    }
    seen
}

/// The conversation's stored messages as texts, read through `node`.
async fn stored_texts(client: &reqwest::Client, node: &str, context_id: &str) -> Vec<String> {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "colloquy/getConversation",
        "params": {"contextId": context_id, "historyLength": 1000}});
    let answer = post_rpc(client, node, V1, &body).await;
    answer["result"]["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .map(message_text)
        .collect()
}

/// The value of an unlabelled series in Prometheus text.
fn sample(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let (series, value) = line.split_once(' ')?;
        (series == name).then(|| value.trim().parse().ok())?
    })
}

async fn until(what: &str, within: Duration, mut check: impl AsyncFnMut() -> bool) {
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[actix_rt::test]
async fn acknowledged_turns_survive_the_primary_failing_over_to_a_synchronous_standby() {
    let Some(pair) = pg::replicated("failover::acknowledged_turns_survive") else {
        return;
    };
    until(
        "the standby is synchronous",
        Duration::from_secs(30),
        async || pair.standby_is_synchronous().await,
    )
    .await;
    let (a, b) = (
        ChildNode::start(&pair.url(), 5, 20).await,
        ChildNode::start(&pair.url(), 5, 20).await,
    );
    let nodes = Arc::new(vec![a.url.clone(), b.url.clone()]);
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..CONVERSATIONS)
        .map(|c| tokio::spawn(converse(nodes.clone(), c, stop.clone())))
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let killed = Instant::now();
    pair.kill_primary();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    pair.promote_standby();
    let promoted = Instant::now();
    // Load on until every conversation could have gone on twice on the promoted standby.
    let at_promotion = ACKNOWLEDGED.load(Ordering::Relaxed);
    until(
        "turns acknowledged after the promotion",
        Duration::from_secs(45),
        async || ACKNOWLEDGED.load(Ordering::Relaxed) >= at_promotion + 2 * CONVERSATIONS,
    )
    .await;
    stop.store(true, Ordering::Relaxed);

    let mut seen = Vec::new();
    for client in clients {
        seen.push(client.await.expect("the client ran"));
    }
    let wrong: Vec<&Value> = seen.iter().flat_map(|s| &s.wrong).collect();
    assert!(
        wrong.is_empty(),
        "answers that were neither completed nor retry: {wrong:#?}"
    );
    let retried: usize = seen.iter().map(|s| s.retried).sum();
    // Requests in flight at the kill were either told to retry or carried over to the promoted
    // standby.
    let carried_over = seen
        .iter()
        .flat_map(|s| &s.acknowledged)
        .filter(|turn| turn.sent < killed && turn.at > promoted)
        .count();
    assert!(
        retried + carried_over > 0,
        "the load met the outage: {retried} retried, {carried_over} carried over"
    );
    let acknowledged_after = seen
        .iter()
        .flat_map(|s| &s.acknowledged)
        .filter(|turn| turn.at > promoted)
        .count();
    assert!(
        acknowledged_after > 0,
        "the nodes reconnected to the promoted standby"
    );

    let client = reqwest::Client::new();
    for (conversation, seen) in seen.iter().enumerate() {
        assert!(
            !seen.acknowledged.is_empty(),
            "conversation {conversation} made progress"
        );
        let expected: Vec<String> = seen
            .acknowledged
            .iter()
            .flat_map(|turn| [turn.text.clone(), turn.reply.clone()])
            .collect();
        let context_id = format!("failover-{conversation}");
        // Unanswered starts are taken back by their node once the database is back.
        let mut stored = Vec::new();
        let settled = Instant::now();
        for node in nodes.iter().cycle() {
            stored = stored_texts(&client, node, &context_id).await;
            if stored == expected || settled.elapsed() > Duration::from_secs(15) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(
            stored, expected,
            "conversation {conversation}: exactly its acknowledged turns"
        );
        for turn in &seen.acknowledged {
            let body = json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask",
                "params": {"id": turn.task_id}});
            let task = post_rpc(&client, &nodes[0], V1, &body).await;
            assert_eq!(
                task["result"]["status"]["state"],
                json!("TASK_STATE_COMPLETED"),
                "{task}"
            );
            assert_eq!(artifact_text(&task["result"]), turn.reply);
        }
    }
    // Both nodes answer from the promoted standby, and count their own leases and pool.
    for node in nodes.iter() {
        let ready = client
            .get(format!("{node}readyz"))
            .send()
            .await
            .expect("readyz");
        assert!(
            ready.status().is_success(),
            "{node} is ready after the failover"
        );
        let metrics = client
            .get(format!("{node}metrics"))
            .send()
            .await
            .expect("metrics");
        let metrics = metrics.text().await.expect("metrics text");
        let taken = sample(&metrics, "colloquy_leases_taken_total");
        assert!(
            taken.is_some_and(|n| n >= 1.0),
            "{node}: leases taken {taken:?}"
        );
        assert!(
            sample(&metrics, "colloquy_store_pool_in_use").is_some(),
            "{metrics}"
        );
    }
    drop((a, b));
}

async fn ready(server: &TestServer) -> bool {
    let response = server
        .client
        .get(format!("{}readyz", server.url))
        .send()
        .await;
    response.is_ok_and(|r| r.status().is_success())
}

#[actix_rt::test]
async fn while_the_database_is_down_readyz_fails_and_requests_say_retry() {
    let Some(database) = pg::standalone("failover::while_the_database_is_down") else {
        return;
    };
    // Named in libpq's key-value form, which store.url takes too.
    let node = start_with(Arc::new(ScriptedAgent), |config| {
        config.store.url = database.key_value();
    })
    .await;
    let first = node.send_text(V1, "before", Some("outage"), None).await;
    let first_task = task_of(&first)["id"].as_str().expect("a task").to_owned();
    assert!(ready(&node).await);

    database.stop();
    until("readyz fails", Duration::from_secs(30), async || {
        !ready(&node).await
    })
    .await;
    let refused = node.send_text(V1, "during", Some("outage"), None).await;
    assert_eq!(refused["error"]["code"], json!(-32016), "{refused}");
    let info = &refused["error"]["data"][0];
    assert_eq!(info["reason"], json!("STORE_UNAVAILABLE"));
    assert_eq!(info["metadata"]["retryAfterMs"], json!(1000));
    let read = node.rpc(V1, "GetTask", json!({"id": first_task})).await;
    assert_eq!(read["error"]["code"], json!(-32016), "{read}");

    database.start();
    until("readyz recovers", Duration::from_secs(30), async || {
        ready(&node).await
    })
    .await;
    let after = node.send_text(V1, "after", Some("outage"), None).await;
    assert_eq!(
        artifact_text(task_of(&after)),
        "echo: after (turn 2; previously: \"before\")",
        "the refused request left nothing behind: {after}"
    );
    let texts: Vec<String> = node
        .stored_messages(V1, "outage")
        .await
        .iter()
        .map(message_text)
        .collect();
    assert_eq!(texts.len(), 4, "{texts:?}");
    node.stop().await;
}

#[actix_rt::test]
async fn a_start_whose_commit_went_unanswered_is_taken_back() {
    let Some(database) = pg::standalone("failover::a_start_whose_commit_went_unanswered") else {
        return;
    };
    let node = start_with(Arc::new(ScriptedAgent), |config| {
        config.store.url = database.key_value();
    })
    .await;
    // A synchronous standby that never comes: commits are written, then wait for it.
    database.stop();
    database.start_with("-c synchronous_standby_names=ghost");
    let (monitor, connection) =
        tokio_postgres::connect(&database.key_value(), tokio_postgres::NoTls)
            .await
            .expect("a monitoring connection");
    actix_rt::spawn(connection);
    let (client, url) = (node.client.clone(), node.url.clone());
    let sent = actix_rt::spawn(async move {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
            "message": user_message(V1, "lost in the commit", Some("unanswered"), None)}});
        post_rpc(&client, &url, V1, &body).await
    });
    until(
        "the start waits for the standby",
        Duration::from_secs(30),
        async || {
            let waiting = monitor
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'",
                    &[],
                )
                .await
                .expect("pg_stat_activity");
            waiting.get::<_, i64>(0) > 0
        },
    )
    .await;
    // The primary goes with the commit written and unanswered; it comes back with it.
    database.stop();
    let answer = sent.await.expect("the request ends");
    assert_eq!(answer["error"]["code"], json!(-32016), "{answer}");
    database.start();
    until(
        "the start is taken back",
        Duration::from_secs(30),
        async || node.stored_messages(V1, "unanswered").await.is_empty(),
    )
    .await;
    let again = node
        .send_text(V1, "lost in the commit", Some("unanswered"), None)
        .await;
    assert_eq!(
        artifact_text(task_of(&again)),
        "echo: lost in the commit (turn 1)",
        "the retry is the conversation's first turn: {again}"
    );
    let texts: Vec<String> = node
        .stored_messages(V1, "unanswered")
        .await
        .iter()
        .map(message_text)
        .collect();
    assert_eq!(texts.len(), 2, "{texts:?}");
    node.stop().await;
}

#[actix_rt::test]
async fn a_running_turn_stores_its_end_once_the_database_is_back() {
    let Some(database) = pg::standalone("failover::a_running_turn_stores_its_end") else {
        return;
    };
    let node = start_with(Arc::new(ScriptedAgent), |config| {
        config.store.url = database.key_value();
    })
    .await;
    let (client, url) = (node.client.clone(), node.url.clone());
    let sent = actix_rt::spawn(async move {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
            "message": user_message(V1, "slow 3000", Some("outlasted"), None)}});
        post_rpc(&client, &url, V1, &body).await
    });
    // The turn has started; the database goes while its agent works and is still away when
    // the agent ends.
    tokio::time::sleep(Duration::from_millis(500)).await;
    database.stop();
    tokio::time::sleep(Duration::from_millis(4000)).await;
    database.start();
    let answer = sent.await.expect("the request ends");
    let task = task_of(&answer);
    assert_eq!(
        task["status"]["state"],
        json!("TASK_STATE_COMPLETED"),
        "{answer}"
    );
    let texts: Vec<String> = node
        .stored_messages(V1, "outlasted")
        .await
        .iter()
        .map(message_text)
        .collect();
    assert_eq!(texts, ["slow 3000".to_owned(), artifact_text(task)]);
    node.stop().await;
}
