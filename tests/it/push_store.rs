//! What every `PushStore` must do, written against the trait (with `ConversationStore` for the
//! task changes that fill the outbox). A new backend adds one `push_store_cases!` line.

use crate::store_conformance::{begin_request, finish_request};
use colloquy::model::{PushConfig, TaskState};
use colloquy::store::embedded::EmbeddedStore;
use colloquy::store::postgres::{PgOptions, PgStore};
use colloquy::store::{ConversationKey, ConversationStore, PushError, PushStore};
use std::sync::Arc;
use std::time::Duration;

/// A fresh store under both interfaces, and what keeps it alive.
pub struct PushFixture {
    pub store: Arc<dyn ConversationStore>,
    pub push: Arc<dyn PushStore>,
    _keep: Box<dyn std::any::Any + Send>,
}

pub fn embedded() -> PushFixture {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Arc::new(EmbeddedStore::open_sled(dir.path(), 4 << 20).expect("store opens"));
    PushFixture {
        store: store.clone(),
        push: store,
        _keep: Box::new(dir),
    }
}

/// A fresh database on the test PostgreSQL, or None (said) where it cannot run.
pub fn postgres() -> Option<PushFixture> {
    postgres_with_partitions(0)
}

/// [`postgres`] with its tables keyed by conversation hash-partitioned: a distributed
/// PostgreSQL's shards, on one server.
pub fn postgres_partitioned() -> Option<PushFixture> {
    postgres_with_partitions(8)
}

fn postgres_with_partitions(partitions: u32) -> Option<PushFixture> {
    let url = crate::common::pg::database("push_store::postgres")?;
    let store = Arc::new(connect(PgOptions {
        partitions,
        ..pg_options(&url, "push-a", 64)
    }));
    Some(PushFixture {
        store: store.clone(),
        push: store,
        _keep: Box::new(()),
    })
}

/// A node's store on the database `url`, connected on a thread of its own (the caller may be
/// inside a runtime).
pub(crate) fn pg_store(url: &str, holder: &str) -> PgStore {
    pg_store_grouping(url, holder, 64)
}

/// [`pg_store`] committing at most `group_steps` turn starts (or ends) together.
pub(crate) fn pg_store_grouping(url: &str, holder: &str, group_steps: usize) -> PgStore {
    connect(pg_options(url, holder, group_steps))
}

fn connect(options: PgOptions) -> PgStore {
    on_own_thread(async move { PgStore::connect(&options).await }).expect("the store opens")
}

fn pg_options(url: &str, holder: &str, group_steps: usize) -> PgOptions {
    PgOptions {
        url: url.to_owned(),
        pool_size: 4,
        lease: Duration::from_secs(30),
        holder: holder.into(),
        tls_ca_file: None,
        partitions: 0,
        group_steps,
    }
}

/// Runs `work` to its end on a runtime of its own thread (the caller may be inside a runtime).
fn on_own_thread<T: Send + 'static>(work: impl Future<Output = T> + Send + 'static) -> T {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(work)
    })
    .join()
    .expect("no panic")
}

/// What a fixture constructor may return: a fixture, or None where the backend cannot run.
pub trait MaybePushFixture {
    fn fixture(self) -> Option<PushFixture>;
}

impl MaybePushFixture for PushFixture {
    fn fixture(self) -> Option<PushFixture> {
        Some(self)
    }
}

impl MaybePushFixture for Option<PushFixture> {
    fn fixture(self) -> Option<PushFixture> {
        self
    }
}

pub(crate) fn config(task_id: &str, id: &str) -> PushConfig {
    PushConfig {
        id: id.to_owned(),
        task_id: task_id.to_owned(),
        url: format!("https://hooks.example/{id}"),
        token: Some("t".into()),
        authentication: None,
        wire_version: "1.0".into(),
    }
}

pub async fn status_changes_fill_the_outbox_in_order(fixture: PushFixture) {
    let (store, push) = (&fixture.store, &fixture.push);
    let mut begin = begin_request("alice", "ctx", "hello");
    let task_id = begin.task_id.clone();
    begin.push_configs = vec![config("", "with-the-send")];
    let begun = store.begin_turn(begin).await.unwrap();
    push.put_push_config("alice", config(&task_id, "later"), 10)
        .await
        .unwrap();
    store
        .finish_turn(finish_request(&begun, Some("hi"), TaskState::Completed))
        .await
        .unwrap();
    let pending = push.pending_notifications(100).await.unwrap();
    let seen: Vec<(String, TaskState)> = pending
        .iter()
        .map(|n| (n.config.id.clone(), n.task.status.state))
        .collect();
    assert_eq!(
        seen,
        [
            ("with-the-send".to_owned(), TaskState::Working),
            ("later".to_owned(), TaskState::Completed),
            ("with-the-send".to_owned(), TaskState::Completed),
        ]
    );
    assert!(pending.windows(2).all(|w| w[0].seq < w[1].seq));
    assert_eq!(
        pending[0].config.task_id, task_id,
        "the send's config gets the task's id"
    );
    assert_eq!(push.pending_count().await.unwrap(), 3);

    let mut later = pending[0].clone();
    later.attempts = 1;
    push.reschedule_notification(later.clone()).await.unwrap();
    assert_eq!(push.pending_notifications(1).await.unwrap(), vec![later]);
    push.notification_delivered(&pending[0]).await.unwrap();
    push.give_up_notification(&pending[1]).await.unwrap();
    let left = push.pending_notifications(100).await.unwrap();
    assert_eq!(left, vec![pending[2].clone()]);
}

pub async fn configs_belong_to_their_tasks_principal(fixture: PushFixture) {
    let (store, push) = (&fixture.store, &fixture.push);
    let begin = begin_request("alice", "ctx", "hello");
    let task_id = begin.task_id.clone();
    store.begin_turn(begin).await.unwrap();
    push.put_push_config("alice", config(&task_id, "a"), 2)
        .await
        .unwrap();
    push.put_push_config("alice", config(&task_id, "a"), 2)
        .await
        .unwrap(); // replaces
    push.put_push_config("alice", config(&task_id, "b"), 2)
        .await
        .unwrap();
    assert!(matches!(
        push.put_push_config("alice", config(&task_id, "c"), 2)
            .await,
        Err(PushError::TooManyConfigs { limit: 2, .. })
    ));
    assert!(matches!(
        push.put_push_config("bob", config(&task_id, "x"), 2).await,
        Err(PushError::TaskNotFound(_))
    ));
    assert!(matches!(
        push.push_configs("bob", &task_id).await,
        Err(PushError::TaskNotFound(_))
    ));
    assert!(matches!(
        push.delete_push_config("bob", &task_id, "a").await,
        Err(PushError::TaskNotFound(_))
    ));
    let ids: Vec<String> = push
        .push_configs("alice", &task_id)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(ids, ["a", "b"]);
    push.delete_push_config("alice", &task_id, "a")
        .await
        .unwrap();
    assert!(matches!(
        push.push_config("alice", &task_id, "a").await,
        Err(PushError::ConfigNotFound { .. })
    ));
    assert_eq!(
        push.push_config("alice", &task_id, "b").await.unwrap().id,
        "b"
    );
}

pub async fn deleting_a_conversation_removes_its_configs(fixture: PushFixture) {
    let (store, push) = (&fixture.store, &fixture.push);
    let begin = begin_request("alice", "ctx", "hello");
    let task_id = begin.task_id.clone();
    let begun = store.begin_turn(begin).await.unwrap();
    push.put_push_config("alice", config(&task_id, "a"), 10)
        .await
        .unwrap();
    store
        .finish_turn(finish_request(&begun, None, TaskState::Completed))
        .await
        .unwrap();
    assert!(
        store
            .delete_conversation(ConversationKey::new("alice", "ctx"))
            .await
            .unwrap()
    );
    // The same task id again (a store never reuses one; this shows the configs went).
    let mut again = begin_request("alice", "ctx", "hello again");
    again.task_id = task_id.clone();
    again.message.task_id = Some(task_id.clone());
    store.begin_turn(again).await.unwrap();
    assert_eq!(push.push_configs("alice", &task_id).await.unwrap(), vec![]);
}

/// With N pending, of which only k are due, the due read returns exactly those k, in
/// due order (not outbox order), and when the next one falls due; a limit cuts them short.
pub async fn the_due_read_returns_only_what_is_due_in_due_order(fixture: PushFixture) {
    let (store, push) = (&fixture.store, &fixture.push);
    let tasks = 6;
    for n in 0..tasks {
        let mut begin = begin_request("alice", &format!("ctx-{n}"), "hello");
        begin.push_configs = vec![config("", "hook")];
        store.begin_turn(begin).await.unwrap();
    }
    let pending = push.pending_notifications(100).await.unwrap();
    assert_eq!(pending.len(), tasks);
    let now = colloquy::model::now();
    // Outbox order 0..6; due: #4 an hour ago, #1 a minute ago, #3 a second ago; the others
    // in a minute, an hour and a day.
    let at = [
        now - chrono::Duration::minutes(1),
        now + chrono::Duration::hours(1),
        now + chrono::Duration::minutes(1),
        now - chrono::Duration::seconds(1),
        now - chrono::Duration::hours(1),
        now + chrono::Duration::days(1),
    ];
    for (notification, not_before) in pending.iter().zip(at) {
        let mut later = notification.clone();
        later.attempts = 1;
        later.not_before = not_before;
        push.reschedule_notification(later).await.unwrap();
    }
    let found = push.due_notifications(100).await.unwrap();
    let seqs: Vec<u64> = found.due.iter().map(|n| n.seq).collect();
    assert_eq!(seqs, [pending[4].seq, pending[0].seq, pending[3].seq]);
    let next = found.next_due.expect("the next one's time");
    assert!(
        (next - at[2]).num_milliseconds().abs() < 1,
        "{next} vs {}",
        at[2]
    );
    let first = push.due_notifications(1).await.unwrap();
    assert_eq!(first.due.len(), 1);
    assert_eq!(first.due[0].seq, pending[4].seq);
    assert!(first.next_due.expect("more are due") <= colloquy::model::now());
    // Delivered ones leave the index.
    push.notification_delivered(&pending[4]).await.unwrap();
    let left = push.due_notifications(100).await.unwrap();
    assert_eq!(left.due.len(), 2);
}

/// A task's notifications to one URL go one at a time: a later one's claim sets it aside
/// while an earlier one is pending, and removing the earlier one makes it due.
pub async fn a_lane_waits_behind_its_first_notification(fixture: PushFixture) {
    let (store, push) = (&fixture.store, &fixture.push);
    let mut begin = begin_request("alice", "ctx", "hello");
    begin.push_configs = vec![config("", "hook")];
    let begun = store.begin_turn(begin).await.unwrap();
    store
        .finish_turn(finish_request(&begun, Some("hi"), TaskState::Completed))
        .await
        .unwrap();
    let due = push.due_notifications(10).await.unwrap().due;
    assert_eq!(due.len(), 2);
    let (first, second) = (due[0].clone(), due[1].clone());
    assert_eq!(first.task.status.state, TaskState::Working);
    let hold = Duration::from_secs(30);
    assert_eq!(
        push.claim_notification(second.clone(), hold).await.unwrap(),
        None,
        "waits behind the first"
    );
    let claimed = push
        .claim_notification(first.clone(), hold)
        .await
        .unwrap()
        .expect("the first of its lane");
    let mut later = claimed.clone();
    later.attempts = 1;
    later.not_before = colloquy::model::now() + chrono::Duration::minutes(5);
    push.reschedule_notification(later).await.unwrap();
    let found = push.due_notifications(10).await.unwrap();
    assert_eq!(found.due, vec![], "neither is due");
    assert!(found.next_due.is_some());
    assert_eq!(push.pending_count().await.unwrap(), 2);
    push.give_up_notification(&first).await.unwrap();
    let found = push.due_notifications(10).await.unwrap();
    let seqs: Vec<u64> = found.due.iter().map(|n| n.seq).collect();
    assert_eq!(seqs, [second.seq], "the next of the lane is due");
    assert!(
        push.claim_notification(second.clone(), hold)
            .await
            .unwrap()
            .is_some()
    );
}

/// The pending count per principal, bounded by its limit.
pub async fn pending_notifications_are_counted_per_principal(fixture: PushFixture) {
    let (store, push) = (&fixture.store, &fixture.push);
    for n in 0..3 {
        let mut begin = begin_request("alice", &format!("ctx-{n}"), "hello");
        begin.push_configs = vec![config("", "hook")];
        store.begin_turn(begin).await.unwrap();
    }
    let mut begin = begin_request("bob", "ctx", "hello");
    begin.push_configs = vec![config("", "hook")];
    store.begin_turn(begin).await.unwrap();
    assert_eq!(push.pending_of("alice", 100).await.unwrap(), 3);
    assert_eq!(push.pending_of("alice", 2).await.unwrap(), 2);
    assert_eq!(push.pending_of("bob", 100).await.unwrap(), 1);
    assert_eq!(push.pending_of("carol", 100).await.unwrap(), 0);
    let alices = push.pending_notifications(100).await.unwrap();
    let first = alices.iter().find(|n| n.principal == "alice").unwrap();
    push.notification_delivered(first).await.unwrap();
    assert_eq!(push.pending_of("alice", 100).await.unwrap(), 2);
}

/// Runs every case against every backend: a module per backend, a test per case.
macro_rules! push_store_cases {
    ($cases:tt for $($module:ident => $make:expr),+ $(,)?) => {
        $(push_store_cases!(@backend $module, $make, $cases);)+
    };
    (@backend $module:ident, $make:expr, [$($case:ident),+ $(,)?]) => {
        mod $module {
            use super::*;
            $(
                #[actix_rt::test]
                async fn $case() {
                    let Some(fixture) = MaybePushFixture::fixture($make) else { return };
                    super::$case(fixture).await;
                }
            )+
        }
    };
}

push_store_cases!(
    [
        status_changes_fill_the_outbox_in_order,
        configs_belong_to_their_tasks_principal,
        deleting_a_conversation_removes_its_configs,
        the_due_read_returns_only_what_is_due_in_due_order,
        a_lane_waits_behind_its_first_notification,
        pending_notifications_are_counted_per_principal,
    ] for
    embedded_store => embedded(),
    postgres_store => postgres(),
    postgres_partitioned_store => postgres_partitioned(),
);

/// Two nodes sharing one outbox: a notification one node claimed is neither claimable nor due
/// on the other until the claim expires, and a write under a lost claim changes nothing.
#[actix_rt::test]
async fn a_claimed_notification_is_held_from_other_nodes_until_its_claim_expires() {
    let Some(url) = crate::common::pg::database("push_store::claims") else {
        return;
    };
    let (a, b) = (pg_store(&url, "a"), pg_store(&url, "b"));
    let mut begin = begin_request("alice", "ctx", "hello");
    begin.push_configs = vec![config("", "hook")];
    a.begin_turn(begin).await.unwrap();
    let pending = b.pending_notifications(10).await.unwrap();
    assert_eq!(pending.len(), 1);
    let hold = Duration::from_secs(2);
    let on_a = a
        .claim_notification(pending[0].clone(), hold)
        .await
        .unwrap()
        .expect("the first claim wins");
    assert!(on_a.claim.is_some());
    assert_eq!(
        b.claim_notification(pending[0].clone(), hold)
            .await
            .unwrap(),
        None,
        "held by a"
    );
    let seen_by_b = b.pending_notifications(10).await.unwrap();
    assert!(
        seen_by_b[0].not_before > colloquy::model::now(),
        "not due on b while a holds it"
    );
    // a stops (say, paused) past its hold: b takes it over; a's late reschedule is ignored.
    tokio::time::sleep(hold + Duration::from_millis(200)).await;
    let on_b = b
        .claim_notification(pending[0].clone(), hold)
        .await
        .unwrap()
        .expect("claimable once the hold expired");
    let mut late = on_a.clone();
    late.attempts = 7;
    a.reschedule_notification(late).await.unwrap();
    assert_eq!(b.pending_notifications(10).await.unwrap()[0].attempts, 0);
    let mut again = on_b.clone();
    again.attempts = 1;
    b.reschedule_notification(again).await.unwrap();
    let stored = &b.pending_notifications(10).await.unwrap()[0];
    assert_eq!((stored.attempts, stored.claim.clone()), (1, None));
    b.notification_delivered(stored).await.unwrap();
    assert_eq!(a.pending_count().await.unwrap(), 0);
}

/// During a rolling upgrade, nodes of a build before the outbox's due index keep writing rows
/// without a due time, lane or principal, and delete a lane's first row without waking the next.
/// A node's start (and its sweep, every 30 s) repairs both, so neither is left undelivered.
#[actix_rt::test]
async fn outbox_rows_an_older_node_left_become_due_at_the_next_start() {
    let Some(url) = crate::common::pg::database("push_store::older_node_rows") else {
        return;
    };
    let a = pg_store(&url, "a");
    for context in ["old-row", "orphan"] {
        let mut begin = begin_request("alice", context, "hello");
        begin.push_configs = vec![config("", "hook")];
        a.begin_turn(begin).await.unwrap();
    }
    let pending = a.pending_notifications(10).await.unwrap();
    assert_eq!(pending.len(), 2);
    let (old_row, orphan) = (pending[0].seq as i64, pending[1].seq as i64);
    // What an older node leaves: a row it wrote, and a lane's row set aside whose earlier row it
    // deleted.
    let sql = format!(
        "UPDATE colloquy_outbox SET due = NULL, lane = NULL, principal_key = NULL \
         WHERE seq = {old_row}; UPDATE colloquy_outbox SET due = NULL WHERE seq = {orphan};"
    );
    execute_sql(&url, sql);
    assert!(
        a.due_notifications(10).await.unwrap().due.is_empty(),
        "neither is due now"
    );

    let b = pg_store(&url, "b");
    let due: Vec<i64> = b
        .due_notifications(10)
        .await
        .unwrap()
        .due
        .iter()
        .map(|n| n.seq as i64)
        .collect();
    assert_eq!(due, [old_row, orphan], "both due again after b's start");
}

/// Runs `work` with a connection of its own to the database `url`, on a thread of its own (the
/// caller may be inside a runtime): what another process does to the rows.
fn on_database<T, F>(
    url: &str,
    work: impl FnOnce(tokio_postgres::Client) -> F + Send + 'static,
) -> T
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let database = url.to_owned();
    on_own_thread(async move {
        let (client, connection) = tokio_postgres::connect(&database, tokio_postgres::NoTls)
            .await
            .expect("connects");
        tokio::spawn(connection);
        work(client).await
    })
}

fn execute_sql(url: &str, sql: String) {
    on_database(url, |client| async move {
        client.batch_execute(&sql).await.expect("the SQL runs")
    })
}

/// The one number `sql` answers.
fn count(url: &str, sql: String) -> i64 {
    on_database(url, |client| async move {
        client.query_one(&sql, &[]).await.expect("answers").get(0)
    })
}

/// Migration 6 makes the push configs and the outbox anew, keyed by conversation first. What a
/// database at version 5 holds is all there after it, each row under its conversation's key:
/// a task's config, its notification, and the notification of a conversation deleted since
/// (its task is gone, so its key comes from its record). Each notification is then claimed and
/// delivered by that key. On a plain schema and on a partitioned one, which the new tables follow
/// whatever the upgrading node's `store.partitions`.
#[actix_rt::test]
async fn push_rows_written_before_migration_6_keep_their_conversation() {
    push_rows_survive_migration_6(0).await;
}

#[actix_rt::test]
async fn push_rows_written_before_migration_6_keep_their_conversation_partitioned() {
    push_rows_survive_migration_6(8).await;
}

async fn push_rows_survive_migration_6(partitions: u32) {
    let Some(url) = crate::common::pg::database("push_store::migration_6") else {
        return;
    };
    let options = PgOptions {
        partitions,
        ..pg_options(&url, "m", 1)
    };
    let migrated =
        on_own_thread(async move { PgStore::migrate_to(&options, 5).await }).expect("migrates");
    assert_eq!(migrated.to, 5);

    // As a build at version 5 wrote them: a task with a config and a notification, and the
    // notification of another task whose conversation has been deleted (no task row).
    let kept = ConversationKey::new("alice", "kept");
    let bytes = |key: &ConversationKey| format!("'\\x{}'", hex::encode(key.as_bytes()));
    let notification = |context: &str, task: &str, seq: u64| {
        let task_record = colloquy::model::Task {
            id: task.into(),
            context_id: context.into(),
            status: colloquy::model::TaskStatus::new(TaskState::Working, None),
            artifacts: Vec::new(),
            history: Vec::new(),
            metadata: None,
        };
        colloquy::store::Notification {
            id: format!("n-{seq}"),
            seq,
            principal: "alice".into(),
            config: config(task, "hook"),
            task: task_record,
            created_at: chrono::Utc::now(),
            attempts: 0,
            not_before: chrono::Utc::now(),
            claim: None,
            trace: None,
            last_error: None,
        }
    };
    let (first, second) = (
        notification("kept", "task-kept", 100),
        notification("gone", "task-gone", 200),
    );
    let sql = format!(
        "INSERT INTO colloquy_tasks (conv_key, task_id, principal_key, principal, state, \
             status_ms, record, has_push) \
         VALUES ({kept}, 'task-kept', '\\x00', 'alice', 1, 0, '{{}}', TRUE); \
         INSERT INTO colloquy_push_configs (task_id, config_id, principal, config) \
         VALUES ('task-kept', 'hook', 'alice', {config}); \
         INSERT INTO colloquy_outbox (seq, task_id, not_before, record) \
         VALUES (100, 'task-kept', now(), {first}), (200, 'task-gone', now(), {second});",
        kept = bytes(&kept),
        config = literal(&config("task-kept", "hook")),
        first = literal(&first),
        second = literal(&second),
    );
    execute_sql(&url, sql);

    // A newer node, at the default `store.partitions` (0): a partitioned schema stays so.
    let store = connect(pg_options(&url, "a", 1));
    for table in ["colloquy_outbox", "colloquy_push_configs"] {
        let sql = format!("SELECT count(*) FROM pg_inherits WHERE inhparent = '{table}'::regclass");
        assert_eq!(count(&url, sql), i64::from(partitions), "{table}");
    }
    assert_eq!(
        store.push_configs("alice", "task-kept").await.unwrap(),
        [config("task-kept", "hook")]
    );
    let pending = store.pending_notifications(10).await.unwrap();
    assert_eq!(pending, [first.clone(), second.clone()]);
    for notification in pending {
        let claimed = store
            .claim_notification(notification, Duration::from_secs(30))
            .await
            .unwrap()
            .expect("claimed under its conversation's key");
        store.notification_delivered(&claimed).await.unwrap();
    }
    assert_eq!(store.pending_count().await.unwrap(), 0, "both removed");
}

/// `value` as a SQL string literal of its JSON.
fn literal(value: &impl serde::Serialize) -> String {
    let json = serde_json::to_string(value).expect("json");
    format!("'{}'", json.replace('\'', "''"))
}
