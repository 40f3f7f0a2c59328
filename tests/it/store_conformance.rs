//! The store conformance suite: what every implementation of `ConversationStore` must do,
//! written once against the trait. Each implementation runs every case through `conformance!`
//! with a constructor of a fresh, empty store; the next backend adds one invocation.

use colloquy::model::{Message, Part, Role, TaskState, TaskStatus};
use colloquy::store::embedded::EmbeddedStore;
use colloquy::store::postgres::{PgOptions, PgStore};
use colloquy::store::{
    BeginTurn, ConversationKey, ConversationMark, ConversationRecords, ConversationStore,
    FinishTurn, MessagesFrom, SharedStore, StoreError, TaskQuery, TurnBegun,
};
use std::sync::Arc;

/// A fresh store and what keeps it alive (its temp folder, say).
pub struct Fixture {
    pub store: SharedStore,
    _keep: Box<dyn std::any::Any + Send>,
}

pub fn embedded() -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = EmbeddedStore::open_sled(dir.path(), 4 << 20).expect("store opens");
    Fixture {
        store: Arc::new(store),
        _keep: Box::new(dir),
    }
}

/// A fresh database on the test PostgreSQL, or None (said) where it cannot run.
pub fn postgres() -> Option<Fixture> {
    postgres_with_partitions(0)
}

/// [`postgres`] with its conversation-keyed tables hash-partitioned: a distributed
/// PostgreSQL's shards, on one server.
pub fn postgres_partitioned() -> Option<Fixture> {
    postgres_with_partitions(8)
}

fn postgres_with_partitions(partitions: u32) -> Option<Fixture> {
    let url = crate::common::pg::database("store_conformance::postgres")?;
    let options = PgOptions {
        url,
        pool_size: 8,
        lease: std::time::Duration::from_secs(30),
        holder: "conformance".into(),
        tls_ca_file: None,
        partitions,
        group_steps: 64,
    };
    // The fixture is built inside the test's runtime: connect on a thread of its own.
    let store = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(PgStore::connect(&options))
    })
    .join()
    .expect("connecting does not panic")
    .expect("the store opens on a fresh database");
    Some(Fixture {
        store: Arc::new(store),
        _keep: Box::new(()),
    })
}

/// What a fixture constructor may return: a fixture, or None where the backend cannot run here.
pub trait MaybeFixture {
    fn fixture(self) -> Option<Fixture>;
}

impl MaybeFixture for Fixture {
    fn fixture(self) -> Option<Fixture> {
        Some(self)
    }
}

impl MaybeFixture for Option<Fixture> {
    fn fixture(self) -> Option<Fixture> {
        self
    }
}

pub fn user(text: &str, context_id: &str) -> Message {
    Message {
        message_id: uuid::Uuid::new_v4().to_string(),
        role: Role::User,
        parts: vec![Part::text(text)],
        context_id: Some(context_id.to_owned()),
        task_id: None,
        reference_task_ids: Vec::new(),
        metadata: None,
        extensions: Vec::new(),
        timestamp: Some(colloquy::model::now()),
    }
}

pub fn begin_request(principal: &str, context_id: &str, text: &str) -> BeginTurn {
    let task_id = uuid::Uuid::new_v4().to_string();
    let mut message = user(text, context_id);
    message.task_id = Some(task_id.clone());
    BeginTurn {
        principal: principal.to_owned(),
        context_id: context_id.to_owned(),
        key: ConversationKey::new(principal, context_id),
        principal_key: colloquy::store::PrincipalKey::new(principal),
        message,
        task_id,
        continuing: false,
        new_context: false,
        history_limit: 200,
        known: None,
        push_configs: Vec::new(),
        trace: None,
    }
}

/// The texts of the history window a start read (it must have read one).
pub fn recent_texts(begun: &TurnBegun) -> Vec<String> {
    let recent = begun.recent.as_ref().expect("the window was read");
    recent.iter().map(Message::text).collect()
}

pub fn finish_request(begun: &TurnBegun, reply: Option<&str>, state: TaskState) -> FinishTurn {
    FinishTurn {
        lease: begun.lease.clone(),
        reply: reply
            .map(|text| Message::agent_text(text, &begun.task.context_id, Some(&begun.task.id))),
        status: TaskStatus::new(state, None),
        artifacts: Vec::new(),
        agent_state: None,
        stream: None,
    }
}

/// One whole turn: the user's `text`, answered with `reply` (if any), completed.
pub async fn store_turn(
    store: &dyn ConversationStore,
    principal: &str,
    context_id: &str,
    text: &str,
    reply: Option<&str>,
) -> TurnBegun {
    store_turn_ending(
        store,
        principal,
        context_id,
        text,
        reply,
        TaskState::Completed,
    )
    .await
}

/// One whole turn, its task left in `state` (`InputRequired`: a task waiting for the caller).
pub async fn store_turn_ending(
    store: &dyn ConversationStore,
    principal: &str,
    context_id: &str,
    text: &str,
    reply: Option<&str>,
    state: TaskState,
) -> TurnBegun {
    let begun = store
        .begin_turn(begin_request(principal, context_id, text))
        .await
        .expect("turn begins");
    store
        .finish_turn(finish_request(&begun, reply, state))
        .await
        .expect("turn finishes");
    begun
}

async fn texts(store: &SharedStore, principal: &str, context_id: &str) -> Vec<String> {
    let key = ConversationKey::new(principal, context_id);
    store
        .conversation_page(key, MessagesFrom::Latest(usize::MAX), usize::MAX)
        .await
        .expect("page reads")
        .map(|page| page.messages.iter().map(Message::text).collect())
        .unwrap_or_default()
}

pub async fn begin_and_finish_store_exactly_their_records(f: Fixture) {
    let store = &f.store;
    let begun = store
        .begin_turn(begin_request("p", "c", "hello"))
        .await
        .unwrap();
    assert_eq!(begun.turn, 1);
    assert!(
        recent_texts(&begun).is_empty(),
        "a new conversation has no history"
    );
    assert_eq!(begun.task.status.state, TaskState::Working);
    let stored = store.task("p", &begun.task.id).await.unwrap().unwrap();
    assert_eq!(stored.status.state, TaskState::Working);
    assert_eq!(stored.history.len(), 1);
    assert_eq!(stored.history[0], begun.task.history[0], "stored as given");
    let meta = store.conversation(begun.lease.key).await.unwrap().unwrap();
    assert_eq!(meta.running_task.as_deref(), Some(begun.task.id.as_str()));

    store
        .finish_turn(finish_request(&begun, Some("hi"), TaskState::Completed))
        .await
        .unwrap();
    let done = store.task("p", &begun.task.id).await.unwrap().unwrap();
    assert_eq!(done.status.state, TaskState::Completed);
    let history: Vec<String> = done.history.iter().map(Message::text).collect();
    assert_eq!(history, ["hello", "hi"]);
    assert_eq!(texts(store, "p", "c").await, ["hello", "hi"]);
    let meta = store.conversation(begun.lease.key).await.unwrap().unwrap();
    assert_eq!((meta.turns, meta.running_task), (1, None));

    let second = store
        .begin_turn(begin_request("p", "c", "again"))
        .await
        .unwrap();
    assert_eq!(second.turn, 2);
    assert_eq!(
        recent_texts(&second),
        ["hello", "hi"],
        "the history before this message"
    );
    assert_ne!(
        second.lease.token, begun.lease.token,
        "each take draws a new token"
    );
}

/// A turn's end stores its stream's outline with the task, for its principal only; the next
/// turn's end replaces it (with none, when that turn was not streamed).
pub async fn a_turn_end_keeps_its_stream_outline(f: Fixture) {
    use colloquy::store::{OutlinedEvent, StreamOutline};
    let store = &f.store;
    let begun = store
        .begin_turn(begin_request("p", "outlined", "ask: more?"))
        .await
        .unwrap();
    let task_id = begun.task.id.clone();
    let outline = StreamOutline {
        turn: begun.turn,
        reply: Some(0),
        events: vec![
            OutlinedEvent::Opened,
            OutlinedEvent::Chunk(5),
            OutlinedEvent::Status(Box::new(TaskStatus::new(TaskState::Working, None))),
            OutlinedEvent::Artifact(1),
            OutlinedEvent::Closed,
            OutlinedEvent::Final,
        ],
    };
    store
        .finish_turn(FinishTurn {
            stream: Some(outline.clone()),
            ..finish_request(&begun, Some("more?"), TaskState::InputRequired)
        })
        .await
        .unwrap();
    assert_eq!(
        store.stream_outline("p", &task_id).await.unwrap(),
        Some(outline)
    );
    assert_eq!(store.stream_outline("q", &task_id).await.unwrap(), None);
    assert_eq!(
        store.stream_outline("p", "no such task").await.unwrap(),
        None
    );

    let mut again = begin_request("p", "outlined", "yes");
    again.task_id = task_id.clone();
    again.message.task_id = Some(task_id.clone());
    again.continuing = true;
    let second = store.begin_turn(again).await.unwrap();
    store
        .finish_turn(finish_request(&second, Some("done"), TaskState::Completed))
        .await
        .unwrap();
    assert_eq!(store.stream_outline("p", &task_id).await.unwrap(), None);
}

pub async fn a_held_conversation_refuses_a_second_turn_and_stores_nothing(f: Fixture) {
    let store = &f.store;
    let first = store
        .begin_turn(begin_request("p", "busy", "one"))
        .await
        .unwrap();
    let refused = store
        .begin_turn(begin_request("p", "busy", "two"))
        .await
        .unwrap_err();
    assert_eq!(
        refused,
        StoreError::Busy {
            context_id: "busy".into(),
            task_id: first.task.id.clone(),
        }
    );
    assert_eq!(
        texts(store, "p", "busy").await,
        ["one"],
        "the refused message is not stored"
    );
    let delete = store
        .delete_conversation(first.lease.key)
        .await
        .unwrap_err();
    assert!(matches!(delete, StoreError::Busy { .. }), "{delete:?}");
    store
        .finish_turn(finish_request(&first, None, TaskState::Completed))
        .await
        .unwrap();
    store
        .begin_turn(begin_request("p", "busy", "three"))
        .await
        .expect("free again once finished");
}

pub async fn a_stale_token_is_refused(f: Fixture) {
    let store = &f.store;
    let first = store
        .begin_turn(begin_request("p", "fenced", "one"))
        .await
        .unwrap();
    let mut forged = first.lease.clone();
    forged.token += 1;
    let forged_finish = FinishTurn {
        lease: forged,
        ..finish_request(&first, Some("forged"), TaskState::Completed)
    };
    assert!(matches!(
        store.finish_turn(forged_finish).await,
        Err(StoreError::StaleToken { .. })
    ));
    store
        .finish_turn(finish_request(&first, None, TaskState::Completed))
        .await
        .unwrap();
    let second = store
        .begin_turn(begin_request("p", "fenced", "two"))
        .await
        .unwrap();
    // The first turn's lease is spent: none of its writes land any more.
    let late = store
        .finish_turn(finish_request(&first, Some("late"), TaskState::Failed))
        .await;
    assert!(
        matches!(late, Err(StoreError::StaleToken { .. })),
        "{late:?}"
    );
    let late_status = store
        .record_status(&first.lease, TaskStatus::new(TaskState::Working, None))
        .await;
    assert!(matches!(late_status, Err(StoreError::StaleToken { .. })));
    store
        .record_status(&second.lease, TaskStatus::new(TaskState::Working, None))
        .await
        .expect("the holder records");
    assert_eq!(texts(store, "p", "fenced").await, ["one", "two"]);
    let first_task = store.task("p", &first.task.id).await.unwrap().unwrap();
    assert_eq!(first_task.status.state, TaskState::Completed, "untouched");
}

/// A start that knows where the conversation stood reads no window while it still stands
/// there; any other writer since (a turn without the mark, a delete and a new conversation
/// with as many turns) makes it read.
pub async fn a_known_mark_spares_the_window_until_someone_else_writes(f: Fixture) {
    let store = &f.store;
    let first = store_turn(&**store, "p", "kept", "one", Some("reply one")).await;
    let left_at = ConversationMark {
        next_seq: first.mark.next_seq + 1,
        ..first.mark
    };
    assert_eq!(left_at.token, first.lease.token);
    let mut knowing = begin_request("p", "kept", "two");
    knowing.known = Some(left_at);
    let second = store.begin_turn(knowing).await.unwrap();
    assert!(second.recent.is_none(), "nothing read at the known mark");
    assert_eq!(second.mark.next_seq, left_at.next_seq + 1);
    assert_eq!(second.mark.token, second.lease.token);
    store
        .finish_turn(finish_request(
            &second,
            Some("reply two"),
            TaskState::Completed,
        ))
        .await
        .unwrap();

    let mut behind = begin_request("p", "kept", "three");
    behind.known = Some(left_at);
    let third = store.begin_turn(behind).await.unwrap();
    assert_eq!(
        recent_texts(&third),
        ["one", "reply one", "two", "reply two"],
        "another turn wrote since the mark"
    );
    store
        .finish_turn(finish_request(&third, None, TaskState::Completed))
        .await
        .unwrap();

    let key = ConversationKey::new("p", "kept");
    assert!(store.delete_conversation(key).await.unwrap());
    let again = store_turn(&**store, "p", "kept", "new one", Some("new reply")).await;
    let mut recreated = begin_request("p", "kept", "after");
    recreated.known = Some(ConversationMark {
        next_seq: again.mark.next_seq + 1,
        ..first.mark
    });
    let after = store.begin_turn(recreated).await.unwrap();
    assert_eq!(
        recent_texts(&after),
        ["new one", "new reply"],
        "a recreated conversation never reaches its predecessor's mark"
    );
    store
        .finish_turn(finish_request(
            &after,
            Some("after reply"),
            TaskState::Completed,
        ))
        .await
        .unwrap();

    // Taken back to an earlier state of its own (deleted, then an export imported), the
    // conversation goes on under another take: a mark left before does not come back.
    let exported = store.export_conversations(None, None, 10).await.unwrap();
    let remembered = store_turn(&**store, "p", "kept", "lost", Some("lost reply")).await;
    let remembered = ConversationMark {
        next_seq: remembered.mark.next_seq + 1,
        ..remembered.mark
    };
    assert!(store.delete_conversation(key).await.unwrap());
    store.import_conversations(exported).await.unwrap();
    store_turn(&**store, "p", "kept", "instead", Some("instead reply")).await;
    let mut restored = begin_request("p", "kept", "last");
    restored.known = Some(remembered);
    let last = store.begin_turn(restored).await.unwrap();
    assert_eq!(
        recent_texts(&last),
        [
            "new one",
            "new reply",
            "after",
            "after reply",
            "instead",
            "instead reply"
        ],
        "the turn after the restore is read, not the remembered one"
    );
}

pub async fn history_windows_and_message_pages(f: Fixture) {
    let store = &f.store;
    for i in 0..10 {
        let (text, reply) = (format!("m{}", 2 * i), format!("m{}", 2 * i + 1));
        store_turn(&**store, "p", "long", &text, Some(&reply)).await;
    }
    let mut request = begin_request("p", "long", "m20");
    request.history_limit = 3;
    let begun = store.begin_turn(request).await.unwrap();
    assert_eq!(
        recent_texts(&begun),
        ["m17", "m18", "m19"],
        "the last n, oldest first"
    );
    store
        .finish_turn(finish_request(&begun, None, TaskState::Completed))
        .await
        .unwrap();

    let key = ConversationKey::new("p", "long");
    let latest = store
        .conversation_page(key, MessagesFrom::Latest(2), usize::MAX)
        .await
        .unwrap()
        .unwrap();
    let latest: Vec<String> = latest.messages.iter().map(Message::text).collect();
    assert_eq!(latest, ["m19", "m20"]);
    // Tiny pages: every message once, in order.
    let mut seen = Vec::new();
    let mut from = MessagesFrom::Latest(usize::MAX);
    loop {
        let page = store
            .conversation_page(key, from, 1)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(page.messages.len(), 1, "one message per tiny page");
        seen.extend(page.messages.iter().map(Message::text));
        if page.next_page_token.is_empty() {
            break;
        }
        from = MessagesFrom::PageToken(page.next_page_token);
    }
    let expected: Vec<String> = (0..21).map(|i| format!("m{i}")).collect();
    assert_eq!(seen, expected);
    let bad = store
        .conversation_page(key, MessagesFrom::PageToken("zz".into()), 1)
        .await;
    assert!(matches!(bad, Err(StoreError::BadPageToken)));
}

pub async fn listings_page_newest_first_each_once(f: Fixture) {
    let store = &f.store;
    let mut task_ids = Vec::new();
    for i in 0..7 {
        let begun = store_turn(&**store, "lister", &format!("c{i}"), "x", None).await;
        task_ids.push(begun.task.id);
        crate::common::next_millisecond().await;
    }
    let mut seen = Vec::new();
    let mut token = None;
    loop {
        let page = store.list_conversations("lister", 3, token).await.unwrap();
        assert_eq!(page.total_size, 7);
        seen.extend(page.items.into_iter().map(|m| m.context_id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = Some(page.next_page_token);
    }
    let expected: Vec<String> = (0..7).rev().map(|i| format!("c{i}")).collect();
    assert_eq!(seen, expected, "conversations newest first, each once");

    let two_a_page = TaskQuery {
        page_size: 2,
        ..TaskQuery::default()
    };
    task_ids.reverse();
    assert_eq!(
        listed_ids(store, "lister", two_a_page).await,
        (task_ids, 7),
        "tasks newest first, each once"
    );
    let one = TaskQuery {
        context_id: Some("c3".into()),
        ..TaskQuery::default()
    };
    let page = store.list_tasks("lister", one).await.unwrap();
    assert_eq!(page.items.len(), 1);
    assert_eq!(page.items[0].context_id, "c3");
    let bad = store
        .list_conversations("lister", 3, Some("not-hex".into()))
        .await;
    assert!(matches!(bad, Err(StoreError::BadPageToken)));
}

/// The ids of a principal's tasks as listed, page after page (`page_size` a page), and the
/// total the pages reported (every page the same).
async fn listed_ids(store: &SharedStore, principal: &str, base: TaskQuery) -> (Vec<String>, usize) {
    let (mut ids, mut token, mut first_total) = (Vec::new(), None, None);
    loop {
        let query = TaskQuery {
            page_token: token,
            ..base.clone()
        };
        let page = store.list_tasks(principal, query).await.unwrap();
        let total = *first_total.get_or_insert(page.total_size);
        assert_eq!(page.total_size, total, "every page reports the same total");
        ids.extend(page.items.into_iter().map(|t| t.id));
        if page.next_page_token.is_empty() {
            return (ids, page.total_size);
        }
        token = Some(page.next_page_token);
    }
}

/// A running task is listed with the settled ones (newest status first, once, in every
/// scope and filter), exported with its conversation, and listed once more when it ends.
pub async fn running_tasks_are_listed_and_exported_with_the_rest(f: Fixture) {
    let store = &f.store;
    let pause = crate::common::next_millisecond;
    let done = store_turn(&**store, "runner", "done", "finished", Some("ok")).await;
    pause().await;
    let (question, state) = (Some("which?"), TaskState::InputRequired);
    let waiting = store_turn_ending(&**store, "runner", "waits", "ask me", question, state).await;
    pause().await;
    let running = store
        .begin_turn(begin_request("runner", "runs", "still going"))
        .await
        .unwrap();
    let newest_first = vec![
        running.task.id.clone(),
        waiting.task.id.clone(),
        done.task.id.clone(),
    ];
    let all = TaskQuery::default();
    assert_eq!(
        listed_ids(store, "runner", all.clone()).await,
        (newest_first.clone(), 3)
    );
    let one_a_page = TaskQuery {
        page_size: 1,
        ..TaskQuery::default()
    };
    assert_eq!(
        listed_ids(store, "runner", one_a_page).await,
        (newest_first.clone(), 3),
        "pages run across running and settled tasks"
    );
    let page = store.list_tasks("runner", all.clone()).await.unwrap();
    assert_eq!(page.items[0].status.state, TaskState::Working);
    let working = TaskQuery {
        state: Some(TaskState::Working),
        ..TaskQuery::default()
    };
    assert_eq!(
        listed_ids(store, "runner", working).await,
        (vec![running.task.id.clone()], 1)
    );
    for (context_id, task_id) in [("runs", &running.task.id), ("done", &done.task.id)] {
        let one = TaskQuery {
            context_id: Some(context_id.into()),
            ..TaskQuery::default()
        };
        assert_eq!(
            listed_ids(store, "runner", one).await,
            (vec![task_id.clone()], 1)
        );
    }
    assert_eq!(
        listed_ids(store, "someone else", all.clone()).await,
        (Vec::new(), 0)
    );
    let exported = export_all(store, Some("runner")).await;
    let runs = exported
        .iter()
        .find(|c| c.meta.context_id == "runs")
        .expect("the running conversation is exported");
    let tasks: Vec<&str> = runs.tasks.iter().map(|t| t.task.id.as_str()).collect();
    assert_eq!(tasks, [running.task.id.as_str()]);

    pause().await;
    let end = finish_request(&running, Some("done now"), TaskState::Completed);
    store.finish_turn(end).await.unwrap();
    assert_eq!(
        listed_ids(store, "runner", all).await,
        (newest_first, 3),
        "once, settled"
    );
}

pub async fn principals_and_look_alike_ids_stay_apart(f: Fixture) {
    let store = &f.store;
    let ids = ["a", "A", "a ", "a/", "tenant/a", "tenanta", "a\u{0}"];
    for principal in ["p", "q"] {
        for id in ids {
            store_turn(
                &**store,
                principal,
                id,
                &format!("{principal}:{id:?}"),
                None,
            )
            .await;
        }
    }
    for principal in ["p", "q"] {
        for id in ids {
            assert_eq!(
                texts(store, principal, id).await,
                [format!("{principal}:{id:?}")],
                "only its own message"
            );
        }
        let page = store
            .list_conversations(principal, 100, None)
            .await
            .unwrap();
        assert_eq!(page.total_size, ids.len());
    }
    let p_task = store_turn(&**store, "p", "mine", "secret", None).await;
    assert_eq!(store.task("q", &p_task.task.id).await.unwrap(), None);
    assert!(matches!(
        store.cancel_waiting("q", &p_task.task.id).await,
        Err(StoreError::TaskNotFound(_))
    ));
    let q_tasks = store.list_tasks("q", TaskQuery::default()).await.unwrap();
    assert!(q_tasks.items.iter().all(|t| t.id != p_task.task.id));
}

pub async fn waiting_tasks_continue_and_cancel(f: Fixture) {
    let store = &f.store;
    let (question, state) = (Some("which city?"), TaskState::InputRequired);
    let asked = store_turn_ending(&**store, "p", "waits", "book a table", question, state).await;
    let mut answer = begin_request("p", "waits", "Paris");
    answer.task_id = asked.task.id.clone();
    answer.message.task_id = Some(asked.task.id.clone());
    answer.continuing = true;
    let continued = store.begin_turn(answer.clone()).await.unwrap();
    let history: Vec<String> = continued.task.history.iter().map(Message::text).collect();
    assert_eq!(history, ["book a table", "which city?", "Paris"]);
    let running = store.cancel_waiting("p", &asked.task.id).await.unwrap_err();
    assert!(matches!(running, StoreError::Busy { .. }), "{running:?}");
    store
        .finish_turn(finish_request(
            &continued,
            Some("again?"),
            TaskState::InputRequired,
        ))
        .await
        .unwrap();
    let canceled = store.cancel_waiting("p", &asked.task.id).await.unwrap();
    assert_eq!(canceled.status.state, TaskState::Canceled);
    assert!(matches!(
        store.cancel_waiting("p", &asked.task.id).await,
        Err(StoreError::TaskNotCancelable { .. })
    ));
    assert!(matches!(
        store.begin_turn(answer.clone()).await,
        Err(StoreError::TaskTerminal { .. })
    ));
    answer.context_id = "elsewhere".into();
    answer.key = ConversationKey::new("p", "elsewhere");
    assert!(matches!(
        store.begin_turn(answer).await,
        Err(StoreError::TaskNotFound(_))
    ));
}

pub async fn delete_removes_everything_of_one_conversation(f: Fixture) {
    let store = &f.store;
    let gone = store_turn(&**store, "p", "gone", "bye", Some("ok")).await;
    let kept = store_turn(&**store, "p", "kept", "stay", None).await;
    assert!(store.delete_conversation(gone.lease.key).await.unwrap());
    assert!(
        !store.delete_conversation(gone.lease.key).await.unwrap(),
        "already gone"
    );
    assert_eq!(store.conversation(gone.lease.key).await.unwrap(), None);
    assert_eq!(store.task("p", &gone.task.id).await.unwrap(), None);
    assert!(texts(store, "p", "gone").await.is_empty());
    let listed = store.list_conversations("p", 10, None).await.unwrap();
    let ids: Vec<String> = listed.items.into_iter().map(|m| m.context_id).collect();
    assert_eq!(ids, ["kept"]);
    let tasks = store.list_tasks("p", TaskQuery::default()).await.unwrap();
    let ids: Vec<String> = tasks.items.into_iter().map(|t| t.id).collect();
    assert_eq!(ids, [kept.task.id]);
    // The id can be used afresh.
    let again = store_turn(&**store, "p", "gone", "hello again", None).await;
    assert_eq!(again.turn, 1);
}

pub async fn concurrent_turns_of_many_conversations_all_land(f: Fixture) {
    let store = &f.store;
    let turns = (0..64).map(|i| {
        let store = store.clone();
        async move { store_turn(&*store, "p", &format!("w{i}"), &format!("from {i}"), None).await }
    });
    futures_util::future::join_all(turns).await;
    for i in 0..64 {
        assert_eq!(
            texts(store, "p", &format!("w{i}")).await,
            [format!("from {i}")]
        );
    }
}

/// Every conversation of the store, exported page by page.
async fn export_all(store: &SharedStore, principal: Option<&str>) -> Vec<ConversationRecords> {
    let mut all = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .export_conversations(principal.map(str::to_owned), after, 2)
            .await
            .expect("export reads");
        let Some(last) = page.last() else { break };
        after = Some(last.meta.key());
        all.extend(page);
    }
    all
}

pub async fn export_and_import_keep_records_and_refuse_clashes(f: Fixture) {
    let store = &f.store;
    for context_id in ["a", "b", "c"] {
        store_turn(&**store, "p", context_id, "one", Some("re one")).await;
        store_turn(&**store, "p", context_id, "two", Some("re two")).await;
    }
    let (question, state) = (Some("which?"), TaskState::InputRequired);
    let waiting = store_turn_ending(&**store, "q", "a", "ask me", question, state).await;
    let before = export_all(store, None).await;
    assert_eq!(before.len(), 4);
    let keys: Vec<_> = before.iter().map(|c| c.meta.key()).collect();
    let mut sorted = keys.clone();
    sorted.sort_by_key(|k| k.as_bytes().to_vec());
    assert_eq!(keys, sorted, "key order");
    let of_q = export_all(store, Some("q")).await;
    assert_eq!(of_q.len(), 1);
    assert_eq!(of_q[0].messages.len(), 2);
    assert_eq!(of_q[0].tasks[0].task.status.state, TaskState::InputRequired);

    // Everything stored is skipped: an import can run again.
    let again = store.import_conversations(before.clone()).await.unwrap();
    assert_eq!((again.conversations, again.skipped), (0, 4));
    // Deleted and imported back: the same records, readable as before.
    for key in &keys[..2] {
        assert!(store.delete_conversation(*key).await.unwrap());
    }
    let back = store.import_conversations(before.clone()).await.unwrap();
    assert_eq!((back.conversations, back.skipped), (2, 2));
    assert_eq!(export_all(store, None).await, before);
    assert_eq!(texts(store, "q", "a").await, ["ask me", "which?"]);
    let task = store.task("q", &waiting.task.id).await.unwrap().unwrap();
    assert_eq!(task.history.len(), 2);
    assert_eq!(store.task("p", &waiting.task.id).await.unwrap(), None);
    let listed = store.list_tasks("p", TaskQuery::default()).await.unwrap();
    assert_eq!(listed.items.len(), 6);
    // The imported conversation goes on where it stopped.
    let mut answer = begin_request("q", "a", "that one");
    answer.task_id = waiting.task.id.clone();
    answer.continuing = true;
    let continued = store.begin_turn(answer).await.unwrap();
    assert_eq!(continued.turn, 2);
    assert_eq!(continued.task.history.len(), 3);

    // A task id another conversation holds refuses the whole write.
    let mut clash = before[1].clone();
    clash.meta.context_id = "new".into();
    for record in &mut clash.tasks {
        record.task.context_id = "new".into();
    }
    let mut fresh = before[0].clone();
    fresh.meta.context_id = "fresh".into();
    fresh.tasks.clear();
    let refused = store.import_conversations(vec![fresh, clash]).await;
    assert!(
        matches!(refused, Err(StoreError::ImportRefused(_))),
        "{refused:?}"
    );
    let of_p = store.list_conversations("p", 10, None).await.unwrap();
    assert_eq!(of_p.items.len(), 3, "nothing of the refused write stored");
    // Messages past next_seq would break sequence numbers: refused.
    let mut past = before[0].clone();
    past.meta.context_id = "past".into();
    past.tasks.clear();
    past.meta.next_seq = 1;
    assert!(matches!(
        store.import_conversations(vec![past]).await,
        Err(StoreError::ImportRefused(_))
    ));
}

/// Runs every case against one implementation: `$make` builds a fresh [`Fixture`].
macro_rules! conformance {
    ($module:ident, $make:expr) => {
        mod $module {
            use super::*;

            conformance!(@cases $make;
                begin_and_finish_store_exactly_their_records,
                a_turn_end_keeps_its_stream_outline,
                a_held_conversation_refuses_a_second_turn_and_stores_nothing,
                a_stale_token_is_refused,
                history_windows_and_message_pages,
                a_known_mark_spares_the_window_until_someone_else_writes,
                listings_page_newest_first_each_once,
                running_tasks_are_listed_and_exported_with_the_rest,
                principals_and_look_alike_ids_stay_apart,
                waiting_tasks_continue_and_cancel,
                delete_removes_everything_of_one_conversation,
                concurrent_turns_of_many_conversations_all_land,
                export_and_import_keep_records_and_refuse_clashes,
            );
        }
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let Some(fixture) = MaybeFixture::fixture($make) else { return };
                super::$case(fixture).await;
            }
        )*
    };
}

conformance!(embedded_store, embedded());
conformance!(postgres_store, postgres());
conformance!(postgres_partitioned_store, postgres_partitioned());
