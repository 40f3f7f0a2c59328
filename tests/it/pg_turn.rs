//! A PostgreSQL turn's start and end each read from one snapshot, taken before they wait for a
//! row lock: what another transaction committed meanwhile still counts; and the steps that wait
//! together commit together, each with its own outcome. Each test holds a lock from a
//! connection of its own, lets the store's statement wait on it, then commits.

use crate::push_store::{pg_store, pg_store_grouping};
use crate::store_conformance::{begin_request, finish_request, recent_texts, store_turn};
use colloquy::model::{Message, PushConfig, TaskState};
use colloquy::store::{ConversationKey, ConversationStore, PushStore};
use std::time::Duration;

/// A connection of the test's own.
async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connects");
    tokio::spawn(connection);
    client
}

/// A connection of the test's own, in a transaction.
async fn blocker(url: &str) -> tokio_postgres::Client {
    let client = connect(url).await;
    client.batch_execute("BEGIN").await.expect("begins");
    client
}

/// A first turn of `context` ("first", no reply), ended.
async fn first_turn(store: &colloquy::store::postgres::PgStore, context: &str) {
    store_turn(store, "alice", context, "first", None).await;
}

/// Long enough for the store's statement to be waiting on the blocker's lock.
const WAIT: Duration = Duration::from_millis(400);

/// Conversations whose starts the blocker holds: more than the store runs groups at once, so
/// that the starts made next wait, together, for a group of their own.
const HELD: usize = 4;

/// A start running on its own.
type Start = tokio::task::JoinHandle<colloquy::store::StoreResult<colloquy::store::TurnBegun>>;

/// Takes every group slot of `store`'s starts: a first turn in each of [`HELD`]
/// conversations, then their rows locked by the returned connection and a second start of
/// each waiting on it. [`release`] lets them go.
async fn hold_the_starts(
    store: &colloquy::store::postgres::PgStore,
    url: &str,
) -> (tokio_postgres::Client, Vec<Start>) {
    let mut keys = Vec::new();
    for n in 0..HELD {
        let context = format!("held-{n}");
        first_turn(store, &context).await;
        keys.push(ConversationKey::new("alice", &context).as_bytes().to_vec());
    }
    let other = blocker(url).await;
    other
        .execute(
            "SELECT 1 FROM colloquy_conversations WHERE conv_key = ANY($1) FOR UPDATE",
            &[&keys],
        )
        .await
        .expect("locks the conversations");
    let mut held = Vec::new();
    for n in 0..HELD {
        held.push(tokio::spawn(store.begin_turn(begin_request(
            "alice",
            &format!("held-{n}"),
            "second",
        ))));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(WAIT).await;
    (other, held)
}

/// A start in each of `contexts`, all at once.
fn start_each(store: &colloquy::store::postgres::PgStore, contexts: &[String]) -> Vec<Start> {
    contexts
        .iter()
        .map(|context| tokio::spawn(store.begin_turn(begin_request("alice", context, "hi"))))
        .collect()
}

/// Lets the held starts go once the `waiting` ones queued behind them; each of both begins.
async fn release(other: tokio_postgres::Client, held: Vec<Start>, waiting: Vec<Start>) {
    tokio::time::sleep(WAIT).await;
    other.batch_execute("COMMIT").await.expect("commits");
    for start in held.into_iter().chain(waiting) {
        start.await.expect("no panic").expect("begins");
    }
}

/// The transactions that wrote the caller's messages of these conversations.
async fn writers(url: &str, contexts: &[String]) -> usize {
    let keys: Vec<Vec<u8>> = contexts
        .iter()
        .map(|context| ConversationKey::new("alice", context).as_bytes().to_vec())
        .collect();
    let row = connect(url)
        .await
        .query_one(
            "SELECT count(DISTINCT xmin::TEXT) FROM colloquy_messages WHERE conv_key = ANY($1)",
            &[&keys],
        )
        .await
        .expect("reads");
    row.get::<_, i64>(0) as usize
}

#[actix_rt::test]
async fn starts_that_wait_together_commit_in_one_transaction() {
    let Some(url) = crate::common::pg::database("pg_turn::starts_wait_together") else {
        return;
    };
    assert_eq!(starts_waiting_together(&url, 64).await, 1);
}

#[actix_rt::test]
async fn with_groups_of_one_each_start_commits_alone() {
    let Some(url) = crate::common::pg::database("pg_turn::groups_of_one") else {
        return;
    };
    assert_eq!(starts_waiting_together(&url, 1).await, 8);
}

/// Eight starts made while the store's groups are held: the transactions that stored them.
async fn starts_waiting_together(url: &str, group_steps: usize) -> usize {
    let store = pg_store_grouping(url, "a", group_steps);
    let (other, held) = hold_the_starts(&store, url).await;
    let contexts: Vec<String> = (0..8).map(|n| format!("together-{n}")).collect();
    let waiting = start_each(&store, &contexts);
    release(other, held, waiting).await;
    writers(url, &contexts).await
}

/// A node's starts and ends that wait together are one transaction: the end's reply and the
/// starts' messages are written by the same one.
#[actix_rt::test]
async fn an_end_and_starts_that_wait_together_commit_in_one_transaction() {
    let Some(url) = crate::common::pg::database("pg_turn::end_and_starts_together") else {
        return;
    };
    let contexts: Vec<String> = (0..4).map(|n| format!("starting-{n}")).collect();
    // The ending conversation's first message was written by its own start, before.
    assert_eq!(an_end_beside_starts(&url, 64, &contexts).await, 2);
    assert_eq!(writers(&url, &contexts).await, 1);
}

/// With groups of one, an end and a start that wait together still commit apart: each
/// statement holds one conversation's rows (one shard's, on a sharded database).
#[actix_rt::test]
async fn with_groups_of_one_an_end_and_a_start_commit_apart() {
    let Some(url) = crate::common::pg::database("pg_turn::groups_of_one_end_and_start") else {
        return;
    };
    // The ending conversation's start, its end, and the other start: three transactions.
    assert_eq!(
        an_end_beside_starts(&url, 1, &["starting".to_owned()]).await,
        3
    );
}

/// A turn of "ending" begun, then its end and a start in each of `contexts` made while the
/// store's groups are held: the transactions that wrote the messages of all of them.
async fn an_end_beside_starts(url: &str, group_steps: usize, contexts: &[String]) -> usize {
    let store = pg_store_grouping(url, "a", group_steps);
    let begun = store
        .begin_turn(begin_request("alice", "ending", "question"))
        .await
        .expect("begins");
    let (other, held) = hold_the_starts(&store, url).await;
    let waiting = start_each(&store, contexts);
    let end = store.finish_turn(finish_request(&begun, Some("answer"), TaskState::Completed));
    let end = tokio::spawn(end);
    release(other, held, waiting).await;
    end.await.expect("no panic").expect("ends");
    let all: Vec<String> = contexts.iter().cloned().chain(["ending".into()]).collect();
    writers(url, &all).await
}

/// A conversation's end and its next start that wait together: one statement writes a row
/// once, so the start goes in the next one, and finds the conversation released, with the
/// reply in its window.
#[actix_rt::test]
async fn a_start_waiting_beside_its_conversations_end_follows_it() {
    let Some(url) = crate::common::pg::database("pg_turn::start_beside_its_end") else {
        return;
    };
    let store = pg_store_grouping(&url, "a", 64);
    let begun = store
        .begin_turn(begin_request("alice", "c", "question"))
        .await
        .expect("begins");
    let (other, held) = hold_the_starts(&store, &url).await;
    let end = tokio::spawn(store.finish_turn(finish_request(
        &begun,
        Some("answer"),
        TaskState::Completed,
    )));
    let next = start_each(&store, &["c".to_owned()]);
    tokio::time::sleep(WAIT).await;
    other.batch_execute("COMMIT").await.expect("commits");
    for start in held {
        start.await.expect("no panic").expect("begins");
    }
    end.await.expect("no panic").expect("ends");
    let mut next = next;
    let next = next
        .pop()
        .expect("one start")
        .await
        .expect("no panic")
        .expect("begins after the end, not busy");
    assert_eq!(recent_texts(&next), ["question", "answer"]);
}

#[actix_rt::test]
async fn a_group_with_a_refused_step_commits_the_others() {
    let Some(url) = crate::common::pg::database("pg_turn::a_refused_step") else {
        return;
    };
    let store = pg_store(&url, "a");
    first_turn(&store, "broken").await;
    // A message already where the next caller's message goes: that start's insert fails.
    let key = ConversationKey::new("alice", "broken");
    connect(&url)
        .await
        .execute(
            "INSERT INTO colloquy_messages (conv_key, seq, body) \
             SELECT conv_key, next_seq, '{}' FROM colloquy_conversations WHERE conv_key = $1",
            &[&key.as_bytes().as_slice()],
        )
        .await
        .expect("inserts");
    let (other, held) = hold_the_starts(&store, &url).await;
    let contexts: Vec<String> = (0..4).map(|n| format!("fine-{n}")).collect();
    let broken = tokio::spawn(store.begin_turn(begin_request("alice", "broken", "second")));
    let fine = start_each(&store, &contexts);
    release(other, held, fine).await;
    let refused = broken.await.expect("no panic");
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(writers(&url, &contexts).await, contexts.len());
}

#[actix_rt::test]
async fn a_start_sees_the_reply_committed_while_it_waited() {
    let Some(url) = crate::common::pg::database("pg_turn::start_sees_the_reply") else {
        return;
    };
    let store = pg_store(&url, "a");
    first_turn(&store, "c").await;
    // What another node's turn end writes: a message at the next place, committed only after
    // the next start took its snapshot.
    let late = Message::agent_text("committed late", "c", None);
    let key = ConversationKey::new("alice", "c");
    let other = blocker(&url).await;
    other
        .execute(
            "INSERT INTO colloquy_messages (conv_key, seq, body) \
             SELECT conv_key, next_seq, $2 FROM colloquy_conversations WHERE conv_key = $1",
            &[
                &key.as_bytes().as_slice(),
                &serde_json::to_string(&late).expect("json"),
            ],
        )
        .await
        .expect("inserts");
    other
        .execute(
            "UPDATE colloquy_conversations SET next_seq = next_seq + 1 WHERE conv_key = $1",
            &[&key.as_bytes().as_slice()],
        )
        .await
        .expect("locks the conversation");
    let second = store.begin_turn(begin_request("alice", "c", "second"));
    let second = tokio::spawn(second);
    tokio::time::sleep(WAIT).await;
    other.batch_execute("COMMIT").await.expect("commits");
    let second = second.await.expect("no panic").expect("begins");
    assert_eq!(recent_texts(&second), ["first", "committed late"]);
}

#[actix_rt::test]
async fn an_end_notifies_a_config_committed_while_it_waited() {
    let Some(url) = crate::common::pg::database("pg_turn::end_notifies_a_late_config") else {
        return;
    };
    let store = pg_store(&url, "a");
    let begun = store
        .begin_turn(begin_request("alice", "c", "hello"))
        .await
        .expect("begins");
    // What another node's config write does: marks the task, then stores the config.
    let config = PushConfig {
        id: "hook".into(),
        task_id: begun.task.id.clone(),
        url: "https://hooks.example/a2a".into(),
        token: None,
        authentication: None,
        wire_version: "1.0".into(),
    };
    let other = blocker(&url).await;
    other
        .execute(
            "UPDATE colloquy_tasks SET has_push = TRUE WHERE task_id = $1",
            &[&begun.task.id.as_bytes()],
        )
        .await
        .expect("locks the task");
    other
        .execute(
            "INSERT INTO colloquy_push_configs (conv_key, task_id, config_id, principal, config) \
             SELECT conv_key, task_id, 'hook', 'alice', $2 FROM colloquy_tasks \
             WHERE task_id = $1",
            &[
                &begun.task.id.as_bytes(),
                &serde_json::to_string(&config).expect("json"),
            ],
        )
        .await
        .expect("stores the config");
    let end = store.finish_turn(finish_request(&begun, Some("hi"), TaskState::Completed));
    let end = tokio::spawn(end);
    tokio::time::sleep(WAIT).await;
    other.batch_execute("COMMIT").await.expect("commits");
    end.await.expect("no panic").expect("ends");
    let pending = store.pending_notifications(10).await.expect("reads");
    let states: Vec<TaskState> = pending.iter().map(|n| n.task.status.state).collect();
    assert_eq!(states, [TaskState::Completed]);
}
