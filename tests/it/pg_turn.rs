//! A PostgreSQL turn's start and end each read from one snapshot, taken before they wait for a
//! row lock: what another transaction committed meanwhile still counts. Each test holds a lock
//! from a connection of its own, lets the store's statement wait on it, then commits.

use crate::push_store::pg_store;
use crate::store_conformance::{begin_request, finish_request};
use colloquy::model::{Message, PushConfig, TaskState};
use colloquy::store::{ConversationKey, ConversationStore, PushStore};
use std::time::Duration;

/// A connection of the test's own, in a transaction.
async fn blocker(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connects");
    tokio::spawn(connection);
    client.batch_execute("BEGIN").await.expect("begins");
    client
}

/// Long enough for the store's statement to be waiting on the blocker's lock.
const WAIT: Duration = Duration::from_millis(400);

#[actix_rt::test]
async fn a_start_sees_the_reply_committed_while_it_waited() {
    let Some(url) = crate::common::pg::database("pg_turn::start_sees_the_reply") else {
        return;
    };
    let store = pg_store(&url, "a");
    let first = store
        .begin_turn(begin_request("alice", "c", "first"))
        .await
        .expect("begins");
    store
        .finish_turn(finish_request(&first, None, TaskState::Completed))
        .await
        .expect("ends");
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
    let recent: Vec<String> = second.recent.iter().map(Message::text).collect();
    assert_eq!(recent, ["first", "committed late"]);
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
            "INSERT INTO colloquy_push_configs (task_id, config_id, principal, config) \
             VALUES ($1, 'hook', 'alice', $2)",
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
