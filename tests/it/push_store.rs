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
    let url = crate::common::pg::database("push_store::postgres")?;
    let store = Arc::new(pg_store(&url, "push-a"));
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
    let options = PgOptions {
        url: url.to_owned(),
        pool_size: 4,
        lease: Duration::from_secs(30),
        holder: holder.into(),
        tls_ca_file: None,
        partitions: 0,
        group_steps,
    };
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(PgStore::connect(&options))
    })
    .join()
    .expect("connecting does not panic")
    .expect("the store opens")
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

fn config(task_id: &str, id: &str) -> PushConfig {
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
    push.notification_delivered(pending[0].seq).await.unwrap();
    push.give_up_notification(pending[1].seq).await.unwrap();
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
    push.notification_delivered(pending[4].seq).await.unwrap();
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
    push.give_up_notification(first.seq).await.unwrap();
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
    push.notification_delivered(first.seq).await.unwrap();
    assert_eq!(push.pending_of("alice", 100).await.unwrap(), 2);
}

macro_rules! push_store_cases {
    ($module:ident, $make:expr, $($case:ident),+ $(,)?) => {
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
    embedded_store,
    embedded(),
    status_changes_fill_the_outbox_in_order,
    configs_belong_to_their_tasks_principal,
    deleting_a_conversation_removes_its_configs,
    the_due_read_returns_only_what_is_due_in_due_order,
    a_lane_waits_behind_its_first_notification,
    pending_notifications_are_counted_per_principal,
);

push_store_cases!(
    postgres_store,
    postgres(),
    status_changes_fill_the_outbox_in_order,
    configs_belong_to_their_tasks_principal,
    deleting_a_conversation_removes_its_configs,
    the_due_read_returns_only_what_is_due_in_due_order,
    a_lane_waits_behind_its_first_notification,
    pending_notifications_are_counted_per_principal,
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
    b.notification_delivered(stored.seq).await.unwrap();
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
    let database = url.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let (client, connection) = tokio_postgres::connect(&database, tokio_postgres::NoTls)
                .await
                .expect("connects");
            tokio::spawn(connection);
            client.batch_execute(&sql).await.expect("rows changed");
        });
    })
    .join()
    .expect("no panic");
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
