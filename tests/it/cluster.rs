//! Several nodes on one PostgreSQL database: leases judged by the database's clock, fencing by
//! token, abandoned turns failed, conversations continued across nodes, one running turn per
//! conversation across nodes, a node killed or paused mid-turn. Each test gets a fresh database
//! on the test process's throwaway PostgreSQL (`common::pg`); without PostgreSQL they skip.

use crate::common;
use crate::store_conformance::{begin_request, finish_request, recent_texts};

use colloquy::engine::Arbiters;
use colloquy::model::{TaskState, TaskStatus};
use colloquy::store::postgres::{ABANDONED_TASK_TEXT, PgOptions, PgStore};
use colloquy::store::{ConversationStore, StoreError};
use common::*;
use serde_json::{Value, json};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn options(url: &str, lease: Duration, holder: &str) -> PgOptions {
    PgOptions {
        url: url.to_owned(),
        pool_size: 4,
        lease,
        holder: holder.to_owned(),
        tls_ca_file: None,
        partitions: 0,
        group_steps: 64,
    }
}

/// A fresh database whose schema is hash-partitioned by conversation key (8 partitions: a
/// distributed PostgreSQL's shards, on one server), or None (said) where it cannot run.
async fn partitioned_database(test: &str) -> Option<String> {
    let url = pg::database(test)?;
    let options = PgOptions {
        partitions: 8,
        ..options(&url, Duration::from_secs(30), "schema")
    };
    PgStore::connect(&options)
        .await
        .expect("the partitioned schema is created");
    Some(url)
}

/// A store node on `url` whose leases last `lease`.
async fn store_node(url: &str, lease: Duration, holder: &str) -> PgStore {
    PgStore::connect(&options(url, lease, holder))
        .await
        .expect("the store opens")
}

fn status_text(task: &colloquy::model::Task) -> String {
    task.status
        .message
        .as_ref()
        .map(colloquy::model::Message::text)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_is_taken_over_and_the_old_holder_is_fenced() {
    if let Some(url) = pg::database("cluster::an_expired_lease_is_taken_over") {
        expired_lease_taken_over_and_old_holder_fenced(&url).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_is_taken_over_on_a_partitioned_schema() {
    if let Some(url) = partitioned_database("cluster::expired_lease_partitioned").await {
        expired_lease_taken_over_and_old_holder_fenced(&url).await;
    }
}

async fn expired_lease_taken_over_and_old_holder_fenced(url: &str) {
    let url = url.to_owned();
    let lease = Duration::from_secs(1);
    let a = store_node(&url, lease, "a").await;
    let b = store_node(&url, lease, "b").await;
    let first = a.begin_turn(begin_request("p", "c", "on a")).await.unwrap();
    // Renewed, the lease holds past its length.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        a.renew_lease(&first.lease)
            .await
            .expect("the holder renews");
        let refused = b
            .begin_turn(begin_request("p", "c", "on b"))
            .await
            .unwrap_err();
        assert_eq!(
            refused,
            StoreError::Busy {
                context_id: "c".into(),
                task_id: first.task.id.clone()
            }
        );
    }
    // Not renewed, it expires: the next turn takes the conversation and fails the old task.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let second = b
        .begin_turn(begin_request("p", "c", "on b"))
        .await
        .expect("an expired lease is taken over");
    assert_ne!(second.lease.token, first.lease.token);
    let old = b.task("p", &first.task.id).await.unwrap().unwrap();
    assert_eq!(old.status.state, TaskState::Failed);
    assert_eq!(status_text(&old), ABANDONED_TASK_TEXT);
    // Whatever the old holder writes now is refused.
    let late = a
        .finish_turn(finish_request(&first, Some("late"), TaskState::Completed))
        .await;
    assert!(
        matches!(late, Err(StoreError::StaleToken { .. })),
        "{late:?}"
    );
    assert!(matches!(
        a.renew_lease(&first.lease).await,
        Err(StoreError::StaleToken { .. })
    ));
    assert!(matches!(
        a.record_status(&first.lease, TaskStatus::new(TaskState::Working, None))
            .await,
        Err(StoreError::StaleToken { .. })
    ));
    b.finish_turn(finish_request(
        &second,
        Some("from b"),
        TaskState::Completed,
    ))
    .await
    .unwrap();
    let third = b
        .begin_turn(begin_request("p", "c", "third"))
        .await
        .unwrap();
    assert_eq!(
        recent_texts(&third),
        ["on a", "on b", "from b"],
        "no late reply from a"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_tasks_fail_on_the_sweep_or_the_next_read() {
    let Some(url) = pg::database("cluster::abandoned_tasks_fail") else {
        return;
    };
    let lease = Duration::from_secs(1);
    let dead = store_node(&url, lease, "dead").await;
    let alive = store_node(&url, lease, "alive").await;
    let swept = dead
        .begin_turn(begin_request("p", "swept", "x"))
        .await
        .unwrap();
    let read = dead
        .begin_turn(begin_request("p", "read", "y"))
        .await
        .unwrap();
    assert_eq!(
        alive.fail_interrupted_turns().await.unwrap(),
        0,
        "live leases stay"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // A read of an abandoned task finds it failed.
    let task = alive.task("p", &read.task.id).await.unwrap().unwrap();
    assert_eq!(task.status.state, TaskState::Failed);
    assert_eq!(status_text(&task), ABANDONED_TASK_TEXT);
    // The sweeper fails the other one and frees its conversation.
    assert_eq!(alive.fail_interrupted_turns().await.unwrap(), 1);
    let task = alive.task("p", &swept.task.id).await.unwrap().unwrap();
    assert_eq!(task.status.state, TaskState::Failed);
    let meta = alive.conversation(swept.lease.key).await.unwrap().unwrap();
    assert_eq!(meta.running_task, None);
    assert!(matches!(
        dead.finish_turn(finish_request(&swept, Some("late"), TaskState::Completed))
            .await,
        Err(StoreError::StaleToken { .. })
    ));
    assert!(
        alive.delete_conversation(read.lease.key).await.unwrap(),
        "an abandoned conversation can be deleted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_apply_once_and_a_newer_schema_is_refused() {
    let Some(url) = pg::database("cluster::migrations") else {
        return;
    };
    let options = options(&url, Duration::from_secs(30), "m");
    // Nodes starting at once on an empty database: each migration is applied once.
    let (first, second) = tokio::join!(PgStore::migrate(&options), PgStore::migrate(&options));
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_eq!(first.to, colloquy::store::postgres::SCHEMA_VERSION);
    assert_eq!(second.to, first.to);
    let again = PgStore::migrate(&options).await.unwrap();
    assert_eq!(again.from, again.to, "nothing left to apply");

    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .execute("INSERT INTO colloquy_schema (version) VALUES (999)", &[])
        .await
        .unwrap();
    let refused = PgStore::connect(&options).await.err().expect("refused");
    assert!(refused.to_string().contains("newer"), "{refused}");
}

/// An in-process node on the database `url`, running the scripted agent.
async fn node(url: &str, lease_secs: u64) -> TestServer {
    start_with(Arc::new(ScriptedAgent), |config| {
        config.store.url = url.to_owned();
        config.cluster.lease_secs = lease_secs;
    })
    .await
}

fn reply_of(response: &Value) -> String {
    artifact_text(task_of(response))
}

#[actix_rt::test]
async fn a_conversation_continues_across_nodes_with_its_whole_history() {
    if let Some(url) = pg::database("cluster::a_conversation_continues_across_nodes") {
        continues_across_nodes(&url).await;
    }
}

#[actix_rt::test]
async fn a_conversation_continues_across_nodes_on_a_partitioned_schema() {
    if let Some(url) = partitioned_database("cluster::continues_partitioned").await {
        continues_across_nodes(&url).await;
    }
}

async fn continues_across_nodes(url: &str) {
    let url = url.to_owned();
    let a = node(&url, 30).await;
    let b = node(&url, 30).await;
    let one = a.send_text(V1, "one", Some("shared"), None).await;
    assert_eq!(reply_of(&one), "echo: one (turn 1)", "{one}");
    let two = b.send_text(V1, "two", Some("shared"), None).await;
    assert_eq!(reply_of(&two), "echo: two (turn 2; previously: \"one\")");
    let three = a.send_text(V1, "three", Some("shared"), None).await;
    assert_eq!(
        reply_of(&three),
        "echo: three (turn 3; previously: \"two\")"
    );
    let on_a: Vec<String> = a
        .stored_messages(V1, "shared")
        .await
        .iter()
        .map(message_text)
        .collect();
    let on_b: Vec<String> = b
        .stored_messages(V1, "shared")
        .await
        .iter()
        .map(message_text)
        .collect();
    assert_eq!(on_a.len(), 6, "{on_a:?}");
    assert_eq!(on_a, on_b, "both nodes read one conversation");
    let (listed_a, listed_b) = (task_ids(&a, "shared").await, task_ids(&b, "shared").await);
    assert_eq!(listed_a.len(), 3);
    assert_eq!(listed_a, listed_b);
    a.stop().await;
    b.stop().await;
}

/// Node A keeps the history window of its turn; a conversation deleted and recreated through
/// node B, with as many turns, is still read from the database on A's next turn.
#[actix_rt::test]
async fn a_conversation_recreated_on_another_node_is_read_afresh() {
    let Some(url) = pg::database("cluster::recreated_on_another_node") else {
        return;
    };
    let a = node(&url, 30).await;
    let b = node(&url, 30).await;
    a.send_text(V1, "one", Some("again"), None).await;
    let deleted = b
        .rpc(
            V1,
            "colloquy/deleteConversation",
            json!({"contextId": "again"}),
        )
        .await;
    assert_eq!(deleted["result"]["deleted"], json!(true), "{deleted}");
    b.send_text(V1, "fresh", Some("again"), None).await;
    let after = a.send_text(V1, "after", Some("again"), None).await;
    assert_eq!(
        reply_of(&after),
        "echo: after (turn 2; previously: \"fresh\")"
    );
    a.stop().await;
    b.stop().await;
}

#[actix_rt::test]
async fn two_principals_with_one_context_id_stay_apart_across_nodes() {
    let Some(url) = pg::database("cluster::two_principals_with_one_context_id") else {
        return;
    };
    let with_tokens = |config: &mut colloquy::config::Config| {
        config.store.url = url.clone();
        config
            .auth
            .tokens
            .insert("alice".into(), "alice-token".into());
        config.auth.tokens.insert("bob".into(), "bob-token".into());
    };
    let a = start_with(Arc::new(ScriptedAgent), with_tokens).await;
    let b = start_with(Arc::new(ScriptedAgent), with_tokens).await;
    let send = |text: &str| json!({"message": user_message(V1, text, Some("same-id"), None)});
    rpc_as(&a, "alice-token", "SendMessage", send("alice on a")).await;
    rpc_as(&b, "bob-token", "SendMessage", send("bob on b")).await;
    let alice_on_b = rpc_as(&b, "alice-token", "SendMessage", send("alice on b")).await;
    assert_eq!(
        reply_of(&alice_on_b),
        "echo: alice on b (turn 2; previously: \"alice on a\")",
        "alice's own history only"
    );
    let bob_on_a = rpc_as(&a, "bob-token", "SendMessage", send("bob on a")).await;
    assert_eq!(
        reply_of(&bob_on_a),
        "echo: bob on a (turn 2; previously: \"bob on b\")"
    );
    for (server, token) in [(&a, "alice-token"), (&b, "bob-token")] {
        let listed = rpc_as(server, token, "colloquy/listConversations", json!({})).await;
        let listed = listed["result"]["conversations"].as_array().cloned();
        assert_eq!(listed.map(|c| c.len()), Some(1), "one conversation each");
    }
    let alice_task = task_of(&alice_on_b)["id"].as_str().unwrap().to_owned();
    let stolen = rpc_as(&a, "bob-token", "GetTask", json!({"id": alice_task})).await;
    assert_eq!(stolen["error"]["code"], json!(-32001), "{stolen}");
    a.stop().await;
    b.stop().await;
}

async fn task_ids(server: &TestServer, context_id: &str) -> Vec<String> {
    let listed = server
        .rpc(V1, "ListTasks", json!({"contextId": context_id}))
        .await;
    listed["result"]["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .map(|t| t["id"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[actix_rt::test]
async fn concurrent_sends_through_two_nodes_run_one_turn() {
    if let Some(url) = pg::database("cluster::concurrent_sends_through_two_nodes") {
        one_turn_of_concurrent_sends(&url).await;
    }
}

#[actix_rt::test]
async fn concurrent_sends_through_two_nodes_on_a_partitioned_schema() {
    if let Some(url) = partitioned_database("cluster::concurrent_sends_partitioned").await {
        one_turn_of_concurrent_sends(&url).await;
    }
}

async fn one_turn_of_concurrent_sends(url: &str) {
    let url = url.to_owned();
    let a = node(&url, 30).await;
    let b = node(&url, 30).await;
    for round in 0..50 {
        let context_id = format!("race-{round}");
        let (from_a, from_b) = tokio::join!(
            a.send_text(V1, "slow 100", Some(&context_id), None),
            b.send_text(V1, "slow 100", Some(&context_id), None),
        );
        let (won, lost) = match (from_a.get("result"), from_b.get("result")) {
            (Some(_), None) => (&from_a, &from_b),
            (None, Some(_)) => (&from_b, &from_a),
            _ => panic!("exactly one runs:\n{from_a}\n{from_b}"),
        };
        assert_eq!(lost["error"]["code"], json!(-32010), "{lost}");
        let winner = task_of(won)["id"].as_str().expect("the winner's task");
        let metadata = &lost["error"]["data"][0]["metadata"];
        assert_eq!(metadata["taskId"], json!(winner), "names the running task");
        let stored = a.stored_messages(V1, &context_id).await;
        assert_eq!(stored.len(), 2, "only the winner's message and reply");
    }
    a.stop().await;
    b.stop().await;
}

#[actix_rt::test]
async fn a_turn_longer_than_its_lease_keeps_it_by_renewing() {
    let Some(url) = pg::database("cluster::a_turn_longer_than_its_lease") else {
        return;
    };
    let a = node(&url, 1).await;
    let b = node(&url, 1).await;
    let long = user_message(V1, "slow 3500", Some("long"), None);
    let sent = a
        .rpc(
            V1,
            "SendMessage",
            json!({"message": long, "configuration": {"returnImmediately": true}}),
        )
        .await;
    let task_id = task_of(&sent)["id"].as_str().expect("a task").to_owned();
    // Three lease lengths in, the turn still holds its conversation.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let busy = b.send_text(V1, "too soon", Some("long"), None).await;
    assert_eq!(busy["error"]["code"], json!(-32010), "{busy}");
    assert_eq!(
        busy["error"]["data"][0]["metadata"]["taskId"],
        json!(task_id)
    );
    let accepted = send_until_accepted(&b, "after it", "long").await;
    assert!(accepted < Duration::from_secs(10));
    let done = a.rpc(V1, "GetTask", json!({"id": task_id})).await;
    assert_eq!(state_of(&done["result"]), "TASK_STATE_COMPLETED", "{done}");
    a.stop().await;
    b.stop().await;
}

/// `colloquy serve` on the database `url` with the echo agent answering after `delay_ms`.
pub(crate) struct ChildNode {
    pub(crate) child: Child,
    pub(crate) url: String,
}

impl ChildNode {
    pub(crate) async fn start(database: &str, lease_secs: u64, delay_ms: u64) -> ChildNode {
        ChildNode::start_with_env(database, lease_secs, delay_ms, &[]).await
    }

    /// [`ChildNode::start`] with more environment variables (settings) for the node.
    pub(crate) async fn start_with_env(
        database: &str,
        lease_secs: u64,
        delay_ms: u64,
        env: &[(&str, &str)],
    ) -> ChildNode {
        let port = free_port();
        let data = tempfile::tempdir().expect("temp dir");
        let mut child = Command::new(env!("CARGO_BIN_EXE_colloquy"))
            .args([
                "serve",
                "--grpc-listen",
                "127.0.0.1:0",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--data",
            ])
            .arg(data.path())
            .args(["--echo-delay-ms", &delay_ms.to_string()])
            .env("COLLOQUY_STORE__URL", database)
            .env("COLLOQUY_CLUSTER__LEASE_SECS", lease_secs.to_string())
            .envs(env.iter().copied())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("colloquy starts");
        let url = format!("http://127.0.0.1:{port}/");
        let client = reqwest::Client::new();
        for _ in 0..400 {
            if client.get(format!("{url}healthz")).send().await.is_ok() {
                return ChildNode { child, url };
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("colloquy did not come up");
    }

    pub(crate) fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
    }

    /// Starts a turn and returns its task id at once.
    pub(crate) async fn send_immediately(&self, text: &str, context_id: &str) -> String {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
            "message": user_message(V1, text, Some(context_id), None),
            "configuration": {"returnImmediately": true},
        }});
        let response = post_rpc(&reqwest::Client::new(), &self.url, V1, &body).await;
        task_of(&response)["id"]
            .as_str()
            .unwrap_or_else(|| panic!("a task: {response}"))
            .to_owned()
    }
}

impl Drop for ChildNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn state_of(task: &Value) -> String {
    task["status"]["state"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Sends `text` to `server` until it is no longer refused as busy; how long that took.
async fn send_until_accepted(server: &TestServer, text: &str, context_id: &str) -> Duration {
    let started = Instant::now();
    loop {
        let response = server.send_text(V1, text, Some(context_id), None).await;
        if response["error"]["code"] != json!(-32010) {
            assert_eq!(
                state_of(task_of(&response)),
                "TASK_STATE_COMPLETED",
                "{response}"
            );
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "still busy after a minute: {response}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The names of a process's threads.
fn thread_names(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("the process's threads")
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_owned())
        .collect()
}

/// On a node with one arbiter the store's work runs on it (no thread of the store's own, so a
/// turn's steps reach the database and come back without a thread crossing); with more, on a
/// runtime of its own. Either way the node serves a conversation's turns.
#[actix_rt::test]
async fn a_node_with_one_arbiter_runs_its_store_on_it() {
    let Some(url) = pg::database("cluster::store_on_the_arbiter") else {
        return;
    };
    let arbiters = |n: &'static str| [("COLLOQUY_CONTEXTS__ARBITERS", n)];
    let one = ChildNode::start_with_env(&url, 30, 0, &arbiters("1")).await;
    let two = ChildNode::start_with_env(&url, 30, 0, &arbiters("2")).await;
    let client = reqwest::Client::new();
    for (node, context_id) in [(&one, "on-one-arbiter"), (&two, "on-two-arbiters")] {
        for text in ["first", "second"] {
            let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
                "message": user_message(V1, text, Some(context_id), None),
            }});
            let response = post_rpc(&client, &node.url, V1, &body).await;
            let task = task_of(&response);
            assert_eq!(state_of(task), "TASK_STATE_COMPLETED", "{response}");
            assert_eq!(task["contextId"], json!(context_id), "{response}");
        }
    }
    let store_threads = |node: &ChildNode| {
        thread_names(node.child.id())
            .iter()
            .filter(|name| name.starts_with("colloquy-pg"))
            .count()
    };
    assert_eq!(store_threads(&one), 0, "{:?}", thread_names(one.child.id()));
    assert!(
        store_threads(&two) > 0,
        "{:?}",
        thread_names(two.child.id())
    );
}

/// A store running on an arbiter's runtime (as on a node with one arbiter) is closed once the
/// arbiter stops: its operations then fail as `StoreError::Closed`, which a stopping server
/// answers with -32013 and its background work passes over, not as a backend error.
#[actix_rt::test]
async fn a_store_on_a_stopped_arbiter_is_closed() {
    let Some(url) = pg::database("cluster::store_on_a_stopped_arbiter") else {
        return;
    };
    let arbiters = Arbiters::start(1);
    let runtime = arbiters
        .sole_runtime()
        .await
        .expect("the arbiter's runtime");
    let store = PgStore::connect_on(&options(&url, Duration::from_secs(30), "a"), runtime)
        .await
        .expect("the store opens on the arbiter");
    assert_eq!(store.fail_interrupted_turns().await.expect("it serves"), 0);
    arbiters.stop();
    let closed = store.fail_interrupted_turns().await;
    assert!(matches!(closed, Err(StoreError::Closed)), "{closed:?}");
}

#[actix_rt::test]
async fn a_node_killed_mid_turn_leaves_a_task_failed_once_its_lease_expires() {
    let Some(url) = pg::database("cluster::a_node_killed_mid_turn") else {
        return;
    };
    let mut doomed = ChildNode::start(&url, 3, 60_000).await;
    let survivor = node(&url, 3).await;
    let task_id = doomed.send_immediately("never answered", "killed").await;
    doomed.signal(libc::SIGKILL);
    let _ = doomed.child.wait();
    let busy = survivor
        .send_text(V1, "too soon", Some("killed"), None)
        .await;
    assert_eq!(busy["error"]["code"], json!(-32010), "{busy}");
    assert_eq!(
        busy["error"]["data"][0]["metadata"]["taskId"],
        json!(task_id)
    );
    let waited = send_until_accepted(&survivor, "after the lease", "killed").await;
    assert!(waited < Duration::from_secs(30), "{waited:?}");
    let old = survivor.rpc(V1, "GetTask", json!({"id": task_id})).await;
    assert_eq!(state_of(&old["result"]), "TASK_STATE_FAILED", "{old}");
    assert!(old.to_string().contains(ABANDONED_TASK_TEXT), "{old}");
    let texts: Vec<String> = survivor
        .stored_messages(V1, "killed")
        .await
        .iter()
        .map(message_text)
        .collect();
    assert_eq!(texts.len(), 3, "{texts:?}");
    assert_eq!(texts[0], "never answered");
    assert_eq!(texts[1], "after the lease");
    survivor.stop().await;
}

#[actix_rt::test]
async fn a_paused_node_writes_nothing_after_losing_its_lease() {
    let Some(url) = pg::database("cluster::a_paused_node_writes_nothing") else {
        return;
    };
    // Its echo answers 5 s after the message: paused past its 2 s lease in between.
    let paused = ChildNode::start(&url, 2, 5_000).await;
    let other = node(&url, 2).await;
    let task_id = paused
        .send_immediately("from the paused node", "fenced")
        .await;
    paused.signal(libc::SIGSTOP);
    send_until_accepted(&other, "taken over", "fenced").await;
    paused.signal(libc::SIGCONT);
    // The paused node's turn ends (its renewal or its end is refused) and it says so.
    let started = Instant::now();
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": task_id}});
    loop {
        let got = post_rpc(&reqwest::Client::new(), &paused.url, V1, &body).await;
        if state_of(&got["result"]) != "TASK_STATE_WORKING" {
            assert_eq!(state_of(&got["result"]), "TASK_STATE_FAILED", "{got}");
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{got}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Past the paused node's answer time: still nothing of it stored.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let texts: Vec<String> = other
        .stored_messages(V1, "fenced")
        .await
        .iter()
        .map(message_text)
        .collect();
    assert_eq!(texts.len(), 3, "{texts:?}");
    assert_eq!(texts[0], "from the paused node");
    assert_eq!(texts[1], "taken over");
    assert!(texts[2].starts_with("echo: taken over"), "{texts:?}");
    let stored = other.rpc(V1, "GetTask", json!({"id": task_id})).await;
    assert_eq!(state_of(&stored["result"]), "TASK_STATE_FAILED", "{stored}");
    other.stop().await;
}

/// Runs the colloquy binary with `args` on the database `url`; its stdout.
fn colloquy_on(url: &str, args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_colloquy"))
        .args(args)
        .env("COLLOQUY_STORE__URL", url)
        .output()
        .expect("colloquy runs");
    assert!(
        output.status.success(),
        "colloquy {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[actix_rt::test]
async fn migrate_and_the_store_commands_work_on_the_database() {
    let Some(url) = pg::database("cluster::migrate_and_the_store_commands") else {
        return;
    };
    let first = colloquy_on(&url, &["migrate"]);
    assert!(first.contains("from version 0 to"), "{first}");
    let again = colloquy_on(&url, &["migrate"]);
    assert!(again.contains("nothing to do"), "{again}");
    let server = node(&url, 30).await;
    server
        .send_text(V1, "kept in postgres", Some("cli"), None)
        .await;
    let listed = colloquy_on(&url, &["conversations"]);
    assert!(listed.contains("cli"), "{listed}");
    let history = colloquy_on(&url, &["history", "cli"]);
    assert!(history.contains("user: kept in postgres"), "{history}");
    assert!(
        history.contains("agent: echo: kept in postgres"),
        "{history}"
    );
    colloquy_on(&url, &["delete", "cli"]);
    assert!(server.stored_messages(V1, "cli").await.is_empty());
    server.stop().await;
}

/// An in-process node on `url` that forwards requests for other nodes' tasks.
async fn forwarding_node(url: &str) -> TestServer {
    start_with(Arc::new(ScriptedAgent), |config| {
        config.store.url = url.to_owned();
        config.cluster.secret = Some("shared between the nodes, 32 bytes or more".into());
    })
    .await
}

#[actix_rt::test]
async fn streams_live_reads_and_cancels_follow_the_task_to_its_node() {
    let Some(url) = pg::database("cluster::streams_live_reads_and_cancels_follow") else {
        return;
    };
    let a = forwarding_node(&url).await;
    let b = forwarding_node(&url).await;
    let text = "followed across the nodes, every character once: é€😀 and the end";
    let task_id = dripping_task(&a, "followed", text).await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    // A live read through B: the reply so far, from A.
    let live = b.rpc(V1, "GetTask", json!({"id": task_id})).await;
    assert_eq!(state_of(&live["result"]), "TASK_STATE_WORKING", "{live}");
    let so_far = artifact_text(&live["result"]);
    assert!(
        !so_far.is_empty() && text.starts_with(&so_far),
        "{so_far:?}"
    );
    // A stream through B: the task so far, then every chunk, to the end.
    let events = sse_events(
        b.stream(V1, "SubscribeToTask", json!({"id": task_id}))
            .await,
    )
    .await;
    let first = &events[0]["result"];
    let snapshot = first.get("task").unwrap_or(first);
    let streamed = format!("{}{}", artifact_text(snapshot), streamed_text(&events[1..]));
    assert_eq!(streamed, text, "snapshot + later chunks == the reply");
    let stored = a.rpc(V1, "GetTask", json!({"id": task_id})).await;
    assert_eq!(state_of(&stored["result"]), "TASK_STATE_COMPLETED");
    assert_eq!(artifact_text(&stored["result"]), text);

    // A cancel through B stops the turn A runs.
    let slow_id = started_task(&a, "canceled", "slow 30000").await;
    let started = Instant::now();
    let canceled = b.rpc(V1, "CancelTask", json!({"id": slow_id})).await;
    assert_eq!(
        state_of(&canceled["result"]),
        "TASK_STATE_CANCELED",
        "{canceled}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    let after = b.send_text(V1, "free again", Some("canceled"), None).await;
    assert_eq!(state_of(task_of(&after)), "TASK_STATE_COMPLETED", "{after}");
    a.stop().await;
    b.stop().await;
}

/// Starts a turn on `node` that answers `text` slowly; its task id.
async fn dripping_task(node: &TestServer, context_id: &str, text: &str) -> String {
    started_task(node, context_id, &format!("drip 40 3: {text}")).await
}

/// Starts a turn of the scripted agent on `node` without waiting for it; its task id.
async fn started_task(node: &TestServer, context_id: &str, script: &str) -> String {
    let message = user_message(V1, script, Some(context_id), None);
    let sent = node
        .rpc(
            V1,
            "SendMessage",
            json!({"message": message, "configuration": {"returnImmediately": true}}),
        )
        .await;
    task_of(&sent)["id"].as_str().expect("a task").to_owned()
}

#[actix_rt::test]
async fn the_http_json_binding_follows_the_task_to_its_node() {
    let Some(url) = pg::database("cluster::the_http_json_binding_follows") else {
        return;
    };
    let a = forwarding_node(&url).await;
    let b = forwarding_node(&url).await;
    let text = "followed over HTTP+JSON, every character once: é€😀 and the end";
    let on_b = |path: &str| format!("{}{}", b.url.trim_end_matches('/'), path);

    // A live read through B, in both versions of the binding: the reply so far, from A.
    let task_id = dripping_task(&a, "rest-followed", text).await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    let get = |path: String| {
        let request = b.client.get(on_b(&path));
        async move {
            let response = request.send().await.expect("sent");
            response.json::<Value>().await.expect("JSON")
        }
    };
    let live = get(format!("/tasks/{task_id}")).await;
    assert_eq!(state_of(&live), "TASK_STATE_WORKING", "{live}");
    let so_far = artifact_text(&live);
    assert!(
        !so_far.is_empty() && text.starts_with(&so_far),
        "{so_far:?}"
    );
    let live03 = get(format!("/v1/tasks/{task_id}")).await;
    // v0.3's ProtoJSON: message parts under `content`, and the reply so far.
    assert_eq!(state_of(&live03), "TASK_STATE_WORKING", "{live03}");
    assert!(live03["history"][0]["content"].is_array(), "{live03}");
    assert!(text.starts_with(&artifact_text(&live03)) && !artifact_text(&live03).is_empty());

    // A stream through B: the task so far, then every chunk, to the end.
    let subscribed = b
        .client
        .get(on_b(&format!("/tasks/{task_id}:subscribe")))
        .send()
        .await
        .expect("sent");
    assert_eq!(subscribed.status(), 200);
    let events: Vec<Value> = sse_events(subscribed)
        .await
        .into_iter()
        .map(|event| json!({ "result": event }))
        .collect();
    let first = &events[0]["result"];
    let snapshot = first.get("task").unwrap_or(first);
    let streamed = format!("{}{}", artifact_text(snapshot), streamed_text(&events[1..]));
    assert_eq!(streamed, text, "snapshot + later chunks == the reply");
    let last = &events[events.len() - 1]["result"];
    assert_eq!(
        last["statusUpdate"]["status"]["state"], "TASK_STATE_COMPLETED",
        "the stream ends with the final state: {last}"
    );

    // A cancel through B stops the turn A runs.
    let slow_id = started_task(&a, "rest-canceled", "slow 30000").await;
    let started = Instant::now();
    let canceled = b
        .client
        .post(on_b(&format!("/tasks/{slow_id}:cancel")))
        .json(&json!({}))
        .send()
        .await
        .expect("sent");
    assert_eq!(canceled.status(), 200);
    let canceled: Value = canceled.json().await.expect("JSON");
    assert_eq!(state_of(&canceled), "TASK_STATE_CANCELED", "{canceled}");
    assert!(started.elapsed() < Duration::from_secs(10));
    a.stop().await;
    b.stop().await;
}

#[actix_rt::test]
async fn the_grpc_binding_follows_the_task_to_its_node() {
    use crate::grpc::{chunk_text, client, drain, final_state, state, text_of};
    use a2a_pb::proto as pb;
    let Some(url) = pg::database("cluster::the_grpc_binding_follows") else {
        return;
    };
    let a = forwarding_node(&url).await;
    let b = forwarding_node(&url).await;
    let mut on_b = client(&b).await;
    let text = "followed over gRPC, every character once: é€😀 and the end";

    // A live read through B: the reply so far, from A.
    let task_id = dripping_task(&a, "grpc-followed", text).await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    let read = pb::GetTaskRequest {
        id: task_id.clone(),
        ..Default::default()
    };
    let live = on_b.get_task(read).await.expect("read").into_inner();
    assert_eq!(state(&live), pb::TaskState::Working, "{live:?}");
    let so_far = text_of(&live);
    assert!(
        !so_far.is_empty() && text.starts_with(&so_far),
        "{so_far:?}"
    );

    // A stream through B: the task so far, then every chunk, to the end.
    let subscribe = pb::SubscribeToTaskRequest {
        id: task_id.clone(),
        ..Default::default()
    };
    let stream = on_b.subscribe_to_task(subscribe).await.expect("a stream");
    let (events, error) = drain(stream.into_inner()).await;
    assert!(error.is_none(), "{error:?}");
    let Some(pb::stream_response::Payload::Task(snapshot)) = &events[0].payload else {
        panic!("the task first: {events:?}");
    };
    let later: String = events[1..].iter().filter_map(chunk_text).collect();
    assert_eq!(
        format!("{}{later}", text_of(snapshot)),
        text,
        "snapshot + later chunks == the reply"
    );
    assert_eq!(final_state(&events), Some(pb::TaskState::Completed));

    // A cancel through B stops the turn A runs.
    let slow_id = started_task(&a, "grpc-canceled", "slow 30000").await;
    let started = Instant::now();
    let cancel = pb::CancelTaskRequest {
        id: slow_id,
        ..Default::default()
    };
    let canceled = on_b
        .cancel_task(cancel)
        .await
        .expect("canceled")
        .into_inner();
    assert_eq!(state(&canceled), pb::TaskState::Canceled, "{canceled:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    a.stop().await;
    b.stop().await;
}

#[actix_rt::test]
async fn a_forwarded_request_needs_the_cluster_secret() {
    let Some(url) = pg::database("cluster::a_forwarded_request_needs_the_secret") else {
        return;
    };
    let a = forwarding_node(&url).await;
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {}});
    for secret in [None, Some("wrong")] {
        let mut request = reqwest::Client::new()
            .post(format!("{}_colloquy/forward", a.url))
            .header("A2A-Version", V1)
            .header("X-Colloquy-Principal", hex::encode("someone"))
            .json(&body);
        if let Some(secret) = secret {
            request = request.header("X-Colloquy-Cluster-Secret", secret);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 401, "secret {secret:?}");
    }
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_to_the_database_verifies_its_certificate() {
    let Some(url) = pg::database("cluster::tls_to_the_database") else {
        return;
    };
    let Some(certificate) = pg::certificate() else {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "CI's test PostgreSQL serves TLS (openssl comes with Debian's postgresql)"
        );
        eprintln!("skipping cluster::tls_to_the_database: no openssl to make a certificate");
        return;
    };
    let url = format!("{url}?sslmode=require");
    let mut trusted = options(&url, Duration::from_secs(30), "tls");
    trusted.tls_ca_file = Some(certificate);
    let store = PgStore::connect(&trusted).await.expect("TLS with the CA");
    store
        .begin_turn(begin_request("p", "tls", "over TLS"))
        .await
        .expect("a turn over TLS");
    // Only the public authorities: the self-signed certificate is refused.
    let untrusted = options(&url, Duration::from_secs(30), "tls");
    let refused = PgStore::connect(&untrusted).await.err().expect("refused");
    assert!(
        refused.to_string().to_lowercase().contains("certificate"),
        "{refused}"
    );
}

/// A partitioned schema splits each table keyed by conversation in as many partitions, and a
/// conversation's rows (its row, messages, tasks, push configs and notifications) sit in
/// partitions of one remainder: a turn touches one shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_schema_keeps_each_conversation_in_one_partition() {
    let Some(url) = partitioned_database("cluster::partition_layout").await else {
        return;
    };
    let store = store_node(&url, Duration::from_secs(30), "a").await;
    for context in ["one", "two", "three"] {
        let mut begin = begin_request("p", context, "hello");
        begin.push_configs = vec![crate::push_store::config("", "hook")];
        let begun = store.begin_turn(begin).await.expect("begins");
        store
            .finish_turn(finish_request(&begun, Some("hi"), TaskState::Completed))
            .await
            .expect("ends");
    }
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connects");
    tokio::spawn(connection);
    for table in [
        "colloquy_conversations",
        "colloquy_messages",
        "colloquy_tasks",
        "colloquy_push_configs",
        "colloquy_outbox",
    ] {
        let row = client
            .query_one(
                "SELECT count(*) FROM pg_inherits WHERE inhparent = $1::TEXT::regclass",
                &[&table],
            )
            .await
            .expect("counts");
        assert_eq!(row.get::<_, i64>(0), 8, "{table}");
    }
    let rows = client
        .query(
            "SELECT conv_key, string_agg(DISTINCT right(tableoid::regclass::TEXT, 3), ',') FROM ( \
                 SELECT conv_key, tableoid FROM colloquy_conversations \
                 UNION ALL SELECT conv_key, tableoid FROM colloquy_messages \
                 UNION ALL SELECT conv_key, tableoid FROM colloquy_tasks \
                 UNION ALL SELECT conv_key, tableoid FROM colloquy_push_configs \
                 UNION ALL SELECT conv_key, tableoid FROM colloquy_outbox) AS all_rows \
             GROUP BY conv_key",
            &[],
        )
        .await
        .expect("reads");
    assert_eq!(rows.len(), 3);
    for row in &rows {
        let suffixes: String = row.get(1);
        assert!(
            !suffixes.contains(','),
            "one remainder per conversation: {suffixes}"
        );
    }
    let notified = client
        .query_one("SELECT count(DISTINCT conv_key) FROM colloquy_outbox", &[])
        .await
        .expect("counts");
    assert_eq!(
        notified.get::<_, i64>(0),
        3,
        "each conversation's notifications"
    );
}

/// The next SSE event with data on `events`: its id and its JSON, under `result` (the REST
/// binding's bare `StreamResponse` wrapped as JSON-RPC's is).
async fn next_with_id<S>(events: &mut S) -> Option<(String, Value)>
where
    S: futures_util::Stream<
            Item = Result<
                eventsource_stream::Event,
                eventsource_stream::EventStreamError<reqwest::Error>,
            >,
        > + Unpin,
{
    while let Some(event) = futures_util::StreamExt::next(events).await {
        let event = event.expect("SSE");
        if event.data.is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(&event.data).expect("JSON");
        let value = if value.get("result").is_some() {
            value
        } else {
            json!({ "result": value })
        };
        return Some((event.id, value));
    }
    None
}

#[actix_rt::test]
async fn a_stream_resumed_through_another_node_goes_on_after_its_last_event() {
    use eventsource_stream::Eventsource;
    let Some(url) = pg::database("cluster::a_stream_resumed_through_another_node") else {
        return;
    };
    let a = forwarding_node(&url).await;
    let b = forwarding_node(&url).await;
    let text = "resumed through the other node, every character once: é€😀 and the end";
    let task_id = dripping_task(&a, "resumed-across", text).await;
    tokio::time::sleep(Duration::from_millis(150)).await;

    // Through B: the task so far and two more events, then the connection drops.
    let first = b
        .stream(V1, "SubscribeToTask", json!({"id": task_id}))
        .await;
    let mut events = Box::pin(first.bytes_stream().eventsource());
    let (mut last, snapshot) = next_with_id(&mut events).await.expect("the task");
    let mut streamed = artifact_text(&snapshot["result"]["task"]);
    for _ in 0..2 {
        let (id, event) = next_with_id(&mut events).await.expect("an event");
        streamed.push_str(&streamed_text(&[event]));
        last = id;
    }
    drop(events);

    // Resumed through B by header (JSON-RPC), cut again, resumed by query (HTTP+JSON).
    let resumed = resume_on(&b, &task_id, &last).await;
    let mut events = Box::pin(resumed.bytes_stream().eventsource());
    for _ in 0..2 {
        let (id, event) = next_with_id(&mut events).await.expect("an event");
        assert!(
            event["result"].get("task").is_none(),
            "no snapshot: {event}"
        );
        streamed.push_str(&streamed_text(&[event]));
        last = id;
    }
    drop(events);
    let path = format!("/tasks/{task_id}:subscribe?lastEventId={last}");
    let resumed = b
        .client
        .get(format!("{}{path}", b.url.trim_end_matches('/')))
        .send()
        .await
        .expect("resumed");
    let mut events = Box::pin(resumed.bytes_stream().eventsource());
    let mut final_state = Value::Null;
    while let Some((_, event)) = next_with_id(&mut events).await {
        assert!(
            event["result"].get("task").is_none(),
            "no snapshot: {event}"
        );
        streamed.push_str(&streamed_text(std::slice::from_ref(&event)));
        if let Some(update) = event["result"].get("statusUpdate") {
            final_state = update["status"]["state"].clone();
        }
    }
    assert_eq!(
        streamed, text,
        "the parts across three connections make the reply"
    );
    assert_eq!(final_state, "TASK_STATE_COMPLETED");
    a.stop().await;
    b.stop().await;
}

/// What a client assembles from a v1.0 stream: each artifact's text by id (a task replaces
/// them, an update appends to or replaces one) and the last state.
#[derive(Default, Debug)]
struct Assembled {
    artifacts: std::collections::BTreeMap<String, String>,
    state: String,
}

impl Assembled {
    fn of_task(task: &Value) -> Assembled {
        let mut assembled = Assembled::default();
        assembled.apply(&json!({ "task": task }));
        assembled
    }

    fn apply(&mut self, result: &Value) {
        let text = |artifact: &Value| artifact_text(&json!({ "artifacts": [artifact] }));
        if let Some(task) = result.get("task") {
            self.artifacts = task["artifacts"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|a| (a["artifactId"].as_str().unwrap_or("").to_owned(), text(a)))
                .collect();
            self.state = state_of(task);
        } else if let Some(update) = result.get("artifactUpdate") {
            let artifact = &update["artifact"];
            let id = artifact["artifactId"].as_str().unwrap_or("").to_owned();
            let so_far = self.artifacts.entry(id).or_default();
            if update["append"] != json!(true) {
                so_far.clear();
            }
            so_far.push_str(&text(artifact));
        } else if let Some(update) = result.get("statusUpdate") {
            self.state = update["status"]["state"].as_str().unwrap_or("").to_owned();
        }
    }
}

/// `SubscribeToTask` (JSON-RPC v1.0) on `node`, resuming after `last` by `Last-Event-ID`.
async fn resume_on(node: &TestServer, task_id: &str, last: &str) -> reqwest::Response {
    let body =
        json!({"jsonrpc": "2.0", "id": 1, "method": "SubscribeToTask", "params": {"id": task_id}});
    node.client
        .post(&node.url)
        .header("A2A-Version", V1)
        .header("Last-Event-ID", last)
        .json(&body)
        .send()
        .await
        .expect("resumed")
}

/// `<turn>.<n>` as numbers, to compare.
fn event_number(id: &str) -> (u64, u64) {
    let (turn, n) = id.split_once('.').expect("an event id");
    (turn.parse().expect("turn"), n.parse().expect("n"))
}

#[actix_rt::test]
async fn a_subscription_follows_its_task_through_turns_other_nodes_run() {
    use eventsource_stream::Eventsource;
    let Some(url) = pg::database("cluster::a_subscription_follows_its_task") else {
        return;
    };
    let a = forwarding_node(&url).await;
    let b = forwarding_node(&url).await;
    let c = forwarding_node(&url).await;
    let context_id = "followed-everywhere";
    let asked = "drip 60 4: the first turn, which A runs, ends with a question?";
    let task_id = started_task(&a, context_id, asked).await;
    tokio::time::sleep(Duration::from_millis(150)).await;

    // On B, while A runs the first turn: its events, relayed, up to the question.
    let subscribed = b
        .stream(V1, "SubscribeToTask", json!({"id": task_id}))
        .await;
    let mut events = Box::pin(subscribed.bytes_stream().eventsource());
    let mut seen = Assembled::default();
    let mut ids = Vec::new();
    while seen.state != "TASK_STATE_INPUT_REQUIRED" {
        let (id, event) = tokio::time::timeout(Duration::from_secs(10), next_with_id(&mut events))
            .await
            .expect("the first turn in time")
            .expect("an event of the first turn");
        ids.push(id);
        seen.apply(&event["result"]);
    }

    // C answers it: the same stream goes on with C's turn, to the task's end.
    let answer = user_message(
        V1,
        "drip 60 4: the second turn, which C runs to the end",
        Some(context_id),
        Some(&task_id),
    );
    let sent = c
        .rpc(
            V1,
            "SendMessage",
            json!({"message": answer, "configuration": {"returnImmediately": true}}),
        )
        .await;
    assert!(sent.get("error").is_none(), "{sent}");
    loop {
        let next = tokio::time::timeout(Duration::from_secs(20), next_with_id(&mut events))
            .await
            .expect("the stream goes on and ends in time");
        let Some((id, event)) = next else { break };
        ids.push(id);
        seen.apply(&event["result"]);
    }
    assert_eq!(seen.state, "TASK_STATE_COMPLETED");
    let stored = c.rpc(V1, "GetTask", json!({"id": task_id})).await;
    assert_eq!(
        seen.artifacts,
        Assembled::of_task(&stored["result"]).artifacts,
        "what the stream on B carried assembles to the stored task"
    );
    assert!(
        seen.artifacts.values().any(|t| t.contains("which C runs")),
        "{seen:?}"
    );
    let numbers: Vec<(u64, u64)> = ids
        .iter()
        .filter(|id| !id.is_empty())
        .map(|id| event_number(id))
        .collect();
    assert!(
        numbers.windows(2).all(|pair| pair[0] < pair[1]),
        "ids increase across the turns: {ids:?}"
    );
    let turns: std::collections::BTreeSet<u64> = numbers.iter().map(|(turn, _)| *turn).collect();
    assert!(turns.len() >= 2, "events of both turns: {ids:?}");
    a.stop().await;
    b.stop().await;
    c.stop().await;
}

#[actix_rt::test]
async fn a_stream_relayed_from_a_node_that_dies_ends_with_its_task_failed() {
    use eventsource_stream::Eventsource;
    let Some(url) = pg::database("cluster::a_stream_relayed_from_a_node_that_dies") else {
        return;
    };
    let secret = "shared between the nodes, 32 bytes or more";
    let mut doomed = ChildNode::start_with_env(
        &url,
        3,
        150,
        &[
            ("COLLOQUY_CLUSTER__SECRET", secret),
            ("COLLOQUY_AGENT__ECHO__CHUNK_CHARS", "4"),
        ],
    )
    .await;
    let b = forwarding_node(&url).await;
    let task_id = doomed
        .send_immediately("a reply its node never finishes", "doomed-stream")
        .await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let subscribed = b
        .stream(V1, "SubscribeToTask", json!({"id": task_id}))
        .await;
    let mut events = Box::pin(subscribed.bytes_stream().eventsource());
    let mut seen = Assembled::default();
    let mut last = String::new();
    for _ in 0..2 {
        let (id, event) = next_with_id(&mut events).await.expect("a relayed event");
        seen.apply(&event["result"]);
        last = id;
    }
    let partial: String = seen.artifacts.values().cloned().collect();
    assert!(
        "echo: a reply its node never finishes".starts_with(&partial),
        "a prefix of the reply so far: {partial:?}"
    );
    doomed.signal(libc::SIGKILL);
    let _ = doomed.child.wait();

    // The stream on B ends, not cut bare: with the task failed once the lease runs out.
    let rest = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some((id, event)) = next_with_id(&mut events).await {
            seen.apply(&event["result"]);
            if !id.is_empty() {
                last = id;
            }
        }
    })
    .await;
    assert!(rest.is_ok(), "the stream ended");
    assert_eq!(seen.state, "TASK_STATE_FAILED", "{seen:?}");
    let stored = b.rpc(V1, "GetTask", json!({"id": task_id})).await;
    assert_eq!(
        seen.artifacts,
        Assembled::of_task(&stored["result"]).artifacts
    );

    // A client resuming on B after the last id it saw gets the task as it stands.
    let resumed = resume_on(&b, &task_id, &last).await;
    let mut events = Box::pin(resumed.bytes_stream().eventsource());
    let (_, event) = next_with_id(&mut events).await.expect("the task");
    assert_eq!(
        state_of(&event["result"]["task"]),
        "TASK_STATE_FAILED",
        "{event}"
    );
    assert!(next_with_id(&mut events).await.is_none());
    b.stop().await;
}

#[actix_rt::test]
async fn a_finished_turn_resumes_on_another_node_from_the_database() {
    use eventsource_stream::Eventsource;
    let Some(url) = pg::database("cluster::a_finished_turn_resumes_on_another_node") else {
        return;
    };
    let a = forwarding_node(&url).await;
    let b = forwarding_node(&url).await;
    let text = "replayed by the other node from the database, every character once: é€😀";
    let message = user_message(V1, &format!("drip 5 3: {text}"), Some("outlined"), None);
    let streamed_on_a = a
        .stream(V1, "SendStreamingMessage", json!({"message": message}))
        .await;
    let mut events = Box::pin(streamed_on_a.bytes_stream().eventsource());
    let (mut last, first) = next_with_id(&mut events).await.expect("the task");
    let task = &first["result"]["task"];
    let task_id = task["id"].as_str().expect("a task").to_owned();
    let mut streamed = artifact_text(task);
    for _ in 0..3 {
        let (id, event) = next_with_id(&mut events).await.expect("an event");
        streamed.push_str(&streamed_text(&[event]));
        last = id;
    }
    drop(events);
    let mut stored = Value::Null;
    for _ in 0..200 {
        stored = b.rpc(V1, "GetTask", json!({"id": task_id})).await;
        if state_of(&stored["result"]) == "TASK_STATE_COMPLETED" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(state_of(&stored["result"]), "TASK_STATE_COMPLETED");

    // B never ran or watched the turn: it rebuilds the rest from the stored outline.
    let resumed = resume_on(&b, &task_id, &last).await;
    assert_eq!(resumed.headers()["x-colloquy-resumed"], "replayed");
    let mut events = Box::pin(resumed.bytes_stream().eventsource());
    let mut final_state = Value::Null;
    while let Some((id, event)) = next_with_id(&mut events).await {
        assert!(event_number(&id) > event_number(&last), "{id} after {last}");
        assert!(
            event["result"].get("task").is_none(),
            "no snapshot: {event}"
        );
        streamed.push_str(&streamed_text(std::slice::from_ref(&event)));
        if let Some(update) = event["result"].get("statusUpdate") {
            final_state = update["status"]["state"].clone();
        }
        last = id;
    }
    assert_eq!(final_state, "TASK_STATE_COMPLETED");
    assert_eq!(streamed, text);
    assert_eq!(artifact_text(&stored["result"]), text);
    a.stop().await;
    b.stop().await;
}

#[actix_rt::test]
async fn a_tenants_task_is_followed_to_its_node_under_its_tenant_only() {
    let Some(url) = pg::database("cluster::a_tenants_task_is_followed") else {
        return;
    };
    let node = || {
        start_with(Arc::new(ScriptedAgent), |config| {
            config.store.url = url.clone();
            config.cluster.secret = Some("shared between the nodes, 32 bytes or more".into());
            let tenants = vec!["red".to_owned()];
            config.auth.tenants.insert("anonymous".into(), tenants);
        })
    };
    let (a, b) = (node().await, node().await);
    let start_in_red = async |script: &str, context_id: &str| {
        let message = user_message(V1, script, Some(context_id), None);
        let params = json!({"message": message, "tenant": "red",
            "configuration": {"returnImmediately": true}});
        let sent = a.rpc(V1, "SendMessage", params).await;
        task_of(&sent)["id"]
            .as_str()
            .unwrap_or_else(|| panic!("{sent}"))
            .to_owned()
    };
    let text = "followed in its tenant";
    let task_id = start_in_red(&format!("drip 40 3: {text}"), "tenant-followed").await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    let on_b = |path: String| format!("{}{path}", b.url.trim_end_matches('/'));
    let live = b
        .client
        .get(on_b(format!("/red/tasks/{task_id}")))
        .send()
        .await;
    let live: Value = live.expect("sent").json().await.expect("JSON");
    assert_eq!(
        state_of(&live),
        "TASK_STATE_WORKING",
        "from A, through B: {live}"
    );
    let rpc_live = b
        .rpc(V1, "GetTask", json!({"id": task_id, "tenant": "red"}))
        .await;
    assert_eq!(
        state_of(&rpc_live["result"]),
        "TASK_STATE_WORKING",
        "{rpc_live}"
    );
    let outside = b.client.get(on_b(format!("/tasks/{task_id}"))).send().await;
    assert_eq!(
        outside.expect("sent").status(),
        404,
        "not in the default tenant"
    );

    let slow_id = start_in_red("slow 30000", "tenant-canceled").await;
    let cancel = b.client.post(on_b(format!("/red/tasks/{slow_id}:cancel")));
    let canceled = cancel.json(&json!({})).send().await.expect("sent");
    assert_eq!(canceled.status(), 200);
    let canceled: Value = canceled.json().await.expect("JSON");
    assert_eq!(state_of(&canceled), "TASK_STATE_CANCELED", "{canceled}");
    a.stop().await;
    b.stop().await;
}
