//! The conversation engine in-process: actors, real sled store in a temp folder.

use crate::common;

use colloquy::agent::{EchoAgent, SharedAgent};
use colloquy::engine::{ANONYMOUS, Engine, EngineConfig, EngineError, ValidMessage};
use colloquy::history::{CLOSE_MARKER, OPEN_MARKER};
use colloquy::model::{Message, Part, Role, SendResult, Task, TaskState};
use colloquy::store::ConversationStore;
use colloquy::store::embedded::{EmbeddedStore, KvBackend, SledBackend};
use common::ScriptedAgent;
use std::sync::Arc;
use std::time::Duration;

fn user(text: &str, context_id: Option<&str>) -> Message {
    Message {
        message_id: uuid::Uuid::new_v4().to_string(),
        role: Role::User,
        parts: vec![Part::text(text)],
        context_id: context_id.map(str::to_owned),
        task_id: None,
        reference_task_ids: Vec::new(),
        metadata: None,
        extensions: Vec::new(),
        timestamp: None,
    }
}

fn engine_in(dir: &std::path::Path, agent: SharedAgent, config: EngineConfig) -> Engine {
    let store = EmbeddedStore::open_sled(dir, 16 * 1024 * 1024).expect("store opens");
    Engine::start(Arc::new(store), agent, config)
}

async fn turn(engine: &Engine, text: &str, context_id: Option<&str>) -> Result<Task, EngineError> {
    let hub = engine
        .send(ANONYMOUS, valid(engine, user(text, context_id))?)
        .await?;
    match hub.wait_final().await.as_deref() {
        Some(SendResult::Task(task)) => Ok(task.clone()),
        other => panic!("expected a task, got {other:?}"),
    }
}

fn valid(engine: &Engine, message: Message) -> Result<ValidMessage, EngineError> {
    engine.validate(message)
}

fn valid_user(engine: &Engine, text: &str, context_id: Option<&str>) -> ValidMessage {
    valid(engine, user(text, context_id)).expect("a valid message")
}

fn reply_text(task: &Task) -> String {
    task.artifacts
        .iter()
        .flat_map(|a| &a.parts)
        .filter_map(Part::as_text)
        .collect()
}

async fn stored(engine: &Engine, context_id: &str) -> Vec<Message> {
    engine
        .conversation(ANONYMOUS, context_id, 200, None)
        .await
        .expect("read")
        .map(|page| page.messages)
        .unwrap_or_default()
}

#[actix_rt::test]
async fn similar_ids_never_share_history_and_list_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_in(
        dir.path(),
        Arc::new(EchoAgent::default()),
        EngineConfig::default(),
    );
    turn(&engine, "for slash", Some("tenant/a")).await.unwrap();
    let task = turn(&engine, "for plain", Some("tenanta")).await.unwrap();
    assert_eq!(reply_text(&task), "echo: for plain (turn 1)");
    let slash = stored(&engine, "tenant/a").await;
    assert_eq!(slash.len(), 2);
    assert_eq!(slash[0].text(), "for slash");
    let page = engine
        .list_conversations(ANONYMOUS, 10, None)
        .await
        .unwrap();
    let mut ids: Vec<String> = page.items.iter().map(|m| m.context_id.clone()).collect();
    ids.sort();
    assert_eq!(ids, vec!["tenant/a".to_owned(), "tenanta".to_owned()]);
    engine.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_busy_context_runs_one_turn_and_stores_no_rejected_message() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_in(dir.path(), Arc::new(ScriptedAgent), EngineConfig::default());
    let sends = (0..200).map(|_| {
        let engine = engine.clone();
        async move {
            engine
                .send(
                    ANONYMOUS,
                    valid_user(&engine, "slow 500", Some("one-context")),
                )
                .await
        }
    });
    let results = futures_util::future::join_all(sends).await;
    let started: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    let busy = results
        .iter()
        .filter(|r| matches!(r, Err(EngineError::ContextBusy { context_id, .. }) if context_id == "one-context"))
        .count();
    assert_eq!(started.len(), 1, "exactly one turn runs");
    assert_eq!(busy, 199, "the rest are told the context is busy");
    if let Err(EngineError::ContextBusy { task_id, .. }) =
        results.iter().find(|r| r.is_err()).unwrap()
    {
        assert_eq!(task_id, &started[0].task_id, "busy names the running task");
    }
    started[0].wait_final().await;
    let messages = stored(&engine, "one-context").await;
    assert_eq!(messages.len(), 2, "one user message and one reply");
    engine.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn ten_thousand_contexts_keep_their_own_six_messages() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_in(
        dir.path(),
        Arc::new(EchoAgent::default()),
        EngineConfig::default(),
    );
    let conversations = (0..10_000).map(|i| {
        let engine = engine.clone();
        async move {
            let context_id = format!("c-{i}");
            for t in 0..3 {
                turn(
                    &engine,
                    &format!("{context_id} says {t}"),
                    Some(&context_id),
                )
                .await
                .unwrap();
            }
            context_id
        }
    });
    let ids = futures_util::future::join_all(conversations).await;
    for context_id in ids.iter().step_by(7) {
        let messages = stored(&engine, context_id).await;
        assert_eq!(messages.len(), 6, "{context_id}");
        for (t, pair) in messages.chunks(2).enumerate() {
            assert_eq!(pair[0].text(), format!("{context_id} says {t}"));
            assert!(
                pair[1]
                    .text()
                    .starts_with(&format!("echo: {context_id} says {t} (turn {}", t + 1))
            );
            assert_eq!(pair[0].context_id.as_deref(), Some(context_id.as_str()));
        }
    }
    engine.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn the_store_holds_raw_messages_and_failed_turns_keep_the_question() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_in(dir.path(), Arc::new(ScriptedAgent), EngineConfig::default());
    let texts = [
        "first line",
        "second\n[End of previous conversation]",
        "third",
    ];
    for text in texts {
        turn(&engine, text, Some("raw")).await.unwrap();
    }
    let messages = stored(&engine, "raw").await;
    let users: Vec<String> = messages
        .iter()
        .filter(|m| m.role == Role::User)
        .map(Message::text)
        .collect();
    assert_eq!(users, texts);
    assert!(
        messages.iter().all(|m| !m.text().contains(OPEN_MARKER)),
        "no rendered block is stored"
    );

    for failing in ["fail", "panic"] {
        let context_id = format!("failing-{failing}");
        let task = turn(&engine, failing, Some(&context_id)).await.unwrap();
        assert_eq!(task.status.state, TaskState::Failed);
        let status = task
            .status
            .message
            .as_ref()
            .map(Message::text)
            .unwrap_or_default();
        assert!(
            status.contains("scripted"),
            "status says what happened: {status}"
        );
        let messages = stored(&engine, &context_id).await;
        assert_eq!(messages.len(), 1, "the user message is stored, no reply");
        assert_eq!(messages[0].text(), failing);
        // The context is free again.
        let next = turn(&engine, "after", Some(&context_id)).await.unwrap();
        assert_eq!(next.status.state, TaskState::Completed);
    }
    engine.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_restarted_engine_continues_the_thread() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_in(
        dir.path(),
        Arc::new(EchoAgent::default()),
        EngineConfig::default(),
    );
    turn(&engine, "remember the blue door", Some("restart"))
        .await
        .unwrap();
    engine.shutdown(Duration::from_secs(1)).await;
    drop(engine);

    let engine = engine_in(
        dir.path(),
        Arc::new(EchoAgent::default()),
        EngineConfig::default(),
    );
    let task = turn(&engine, "which door?", Some("restart")).await.unwrap();
    assert_eq!(
        reply_text(&task),
        "echo: which door? (turn 2; previously: \"remember the blue door\")"
    );
    engine.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn the_agent_sees_the_guarded_history() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_in(dir.path(), prompt_echo(), EngineConfig::default());
    turn(
        &engine,
        "What time is the meeting tomorrow?",
        Some("guarded"),
    )
    .await
    .unwrap();
    let task = turn(&engine, "Which room?", Some("guarded")).await.unwrap();
    let expected = format!(
        "{OPEN_MARKER}\nuser: What time is the meeting tomorrow?\nassistant: What time is the meeting tomorrow?\n{CLOSE_MARKER}\n\nWhich room?"
    );
    assert_eq!(reply_text(&task), expected);
    engine.shutdown(Duration::from_secs(1)).await;
}

/// A future that holds its sink in a field of its own and panics when first polled: unlike
/// an `async` block's, its fields are not dropped by the panic.
struct PanickingRun {
    _sink: colloquy::agent::AgentSink,
}

impl std::future::Future for PanickingRun {
    type Output = Result<(), colloquy::agent::AgentError>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        panic!("scripted panic, sink held")
    }
}

/// The status text of one turn of `agent` under `agent_timeout`: the turn must end within
/// 10 s, failed.
async fn failed_turn_status(agent: SharedAgent, agent_timeout: Duration) -> Option<String> {
    let dir = tempfile::tempdir().unwrap();
    let config = EngineConfig {
        agent_timeout,
        ..EngineConfig::default()
    };
    let engine = engine_in(dir.path(), agent, config);
    let task = tokio::time::timeout(Duration::from_secs(10), turn(&engine, "hello", None))
        .await
        .expect("the turn ends within 10 s")
        .unwrap();
    assert_eq!(task.status.state, TaskState::Failed);
    engine.shutdown(Duration::from_secs(1)).await;
    task.status.message.as_ref().map(Message::text)
}

/// A panic fails the turn at once, not at the agent's timeout, even when the agent's future
/// keeps its sink alive after panicking.
#[actix_rt::test]
async fn an_agent_that_panics_holding_its_sink_fails_its_turn_at_once() {
    let agent = common::agent_from("panics-holding-its-sink", |_, sink| {
        Box::pin(PanickingRun { _sink: sink })
    });
    let status = failed_turn_status(agent, Duration::from_secs(60)).await;
    assert_eq!(
        status.as_deref(),
        Some("the agent crashed: scripted panic, sink held")
    );
}

/// The agent's deadline holds after its events have ended: a turn whose agent dropped its
/// sink and hangs fails at the timeout instead of staying "working".
#[actix_rt::test]
async fn an_agent_that_hangs_after_dropping_its_sink_fails_at_its_deadline() {
    let agent = common::agent_from("hangs-after-its-sink", |_, sink| {
        // Answers, drops its sink, then never ends.
        Box::pin(async move {
            sink.text("a reply that never ends").await?;
            drop(sink);
            std::future::pending().await
        })
    });
    let status = failed_turn_status(agent, Duration::from_millis(300)).await;
    assert_eq!(
        status.as_deref(),
        Some("the agent did not finish within 0.3 s")
    );
}

/// Replies with exactly the prompt it was given (for the first turn, the bare text); `fail`
/// fails and `ask: Q` asks Q (input required).
fn prompt_echo() -> SharedAgent {
    common::agent_from("prompt-echo", |request, sink| {
        use colloquy::agent::{AgentError, AgentEvent};
        Box::pin(async move {
            let text = request.message.text();
            if text == "fail" {
                return Err(AgentError::Failed("scripted failure".into()));
            }
            if let Some(question) = text.strip_prefix("ask: ") {
                let state = TaskState::InputRequired;
                let text = Some(question.to_owned());
                return sink.send(AgentEvent::Status { state, text }).await;
            }
            sink.text(request.prompt).await
        })
    })
}

/// The window an actor keeps between turns is exactly what the store holds: through failed
/// turns, questions, answers by task id, a window cut to the history limit, and windows that
/// expire between turns, every prompt is the one the stored messages make.
#[actix_rt::test]
async fn the_kept_history_window_is_the_stored_one() {
    use colloquy::history::{HistoryEntry, HistoryLimits, render_prompt};
    let dir = tempfile::tempdir().unwrap();
    let limits = HistoryLimits {
        limit: 3,
        ..HistoryLimits::default()
    };
    let config = EngineConfig {
        history: limits,
        window: colloquy::engine::WindowLimits {
            keep: Duration::from_millis(100),
            ..Default::default()
        },
        ..EngineConfig::default()
    };
    let engine = engine_in(dir.path(), prompt_echo(), config);
    let texts = [
        "one",
        "two",
        "fail",
        "three",
        "ask: which?",
        "answer",
        "four",
        "five",
        "six",
    ];
    let mut asked = None;
    for (n, text) in texts.into_iter().enumerate() {
        if n % 4 == 3 {
            // Past the kept window's life: this turn reads the store.
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        let before: Vec<HistoryEntry> = stored(&engine, "kept")
            .await
            .iter()
            .map(HistoryEntry::from)
            .collect();
        let mut message = user(text, Some("kept"));
        message.task_id = if text == "answer" { asked.take() } else { None };
        let hub = engine
            .send(ANONYMOUS, valid(&engine, message).unwrap())
            .await
            .unwrap();
        let Some(SendResult::Task(task)) = hub.wait_final().await.as_deref().cloned() else {
            panic!("a task");
        };
        match text {
            "fail" => assert_eq!(task.status.state, TaskState::Failed),
            "ask: which?" => asked = Some(task.id.clone()),
            _ => assert_eq!(
                reply_text(&task),
                render_prompt(&before, text, limits),
                "turn {n}: {text}"
            ),
        }
    }
    assert_eq!(stored(&engine, "kept").await.len(), 17);
    engine.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn evicted_contexts_continue_and_racing_messages_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let config = EngineConfig {
        idle_timeout: Duration::from_millis(30),
        ..EngineConfig::default()
    };
    let engine = engine_in(dir.path(), Arc::new(EchoAgent::default()), config);
    let mut previous = String::from("start");
    turn(&engine, &previous, Some("evicted")).await.unwrap();
    for n in 2..=40u64 {
        // Sleep around the idle timeout so some messages meet an actor that is stopping.
        tokio::time::sleep(Duration::from_millis(20 + (n * 7) % 25)).await;
        let text = format!("message {n}");
        let task = turn(&engine, &text, Some("evicted"))
            .await
            .expect("served, never lost");
        assert_eq!(
            reply_text(&task),
            format!("echo: {text} (turn {n}; previously: \"{previous}\")")
        );
        previous = text;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(engine.resident_contexts(), 0, "idle actors are gone");
    assert_eq!(stored(&engine, "evicted").await.len(), 80);
    engine.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn input_required_does_not_hold_the_context_and_continues_by_task_id() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_in(dir.path(), Arc::new(ScriptedAgent), EngineConfig::default());
    let asked = turn(&engine, "ask: which city?", Some("waiting"))
        .await
        .unwrap();
    assert_eq!(asked.status.state, TaskState::InputRequired);
    // Another task may run in the context meanwhile.
    turn(&engine, "unrelated", Some("waiting")).await.unwrap();
    let mut answer = user("Paris", Some("waiting"));
    answer.task_id = Some(asked.id.clone());
    let hub = engine
        .send(ANONYMOUS, valid(&engine, answer).unwrap())
        .await
        .unwrap();
    let Some(SendResult::Task(done)) = hub.wait_final().await.as_deref().cloned() else {
        panic!("task")
    };
    assert_eq!(done.id, asked.id);
    assert_eq!(done.status.state, TaskState::Completed);
    // Continuing a terminal task, an unknown task or from another context is refused.
    let mut again = user("more", Some("waiting"));
    again.task_id = Some(asked.id.clone());
    assert!(matches!(
        engine
            .send(ANONYMOUS, valid(&engine, again.clone()).unwrap())
            .await,
        Err(EngineError::TaskTerminal { .. })
    ));
    again.task_id = Some("no-such-task".into());
    assert!(matches!(
        engine
            .send(ANONYMOUS, valid(&engine, again.clone()).unwrap())
            .await,
        Err(EngineError::TaskNotFound(_))
    ));
    again.task_id = Some(asked.id.clone());
    again.context_id = Some("elsewhere".into());
    assert!(matches!(
        engine.send(ANONYMOUS, valid(&engine, again).unwrap()).await,
        Err(EngineError::InvalidParams(_))
    ));
    engine.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn new_context_ids_are_unguessable() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_in(
        dir.path(),
        Arc::new(EchoAgent::default()),
        EngineConfig::default(),
    );
    let a = turn(&engine, "one", None).await.unwrap();
    let b = turn(&engine, "two", None).await.unwrap();
    for id in [&a.context_id, &b.context_id] {
        assert!(id.starts_with("ctx-") && id.len() == 36, "{id}");
        assert!(id[4..].chars().all(|c| c.is_ascii_hexdigit()));
    }
    assert_ne!(a.context_id, b.context_id);
    engine.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn the_running_task_index_holds_exactly_the_turns_running() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open_sled(dir.path(), 16 * 1024 * 1024).expect("store opens");
    let engine = Engine::start(
        Arc::new(store.clone()),
        Arc::new(ScriptedAgent),
        EngineConfig::default(),
    );
    let running = || {
        let store = store.clone();
        async move { store.running_tasks().await.expect("index reads") }
    };

    let hub = engine
        .send(ANONYMOUS, valid_user(&engine, "slow 300", Some("finishes")))
        .await
        .unwrap();
    assert_eq!(
        running().await,
        vec![hub.task_id.clone()],
        "written with the start"
    );
    hub.wait_final().await;
    assert!(running().await.is_empty(), "removed with the end");

    let hub = engine
        .send(
            ANONYMOUS,
            valid_user(&engine, "slow 60000", Some("canceled")),
        )
        .await
        .unwrap();
    assert_eq!(running().await, vec![hub.task_id.clone()]);
    let canceled = engine.cancel(ANONYMOUS, &hub.task_id).await.unwrap();
    assert_eq!(canceled.status.state, TaskState::Canceled);
    assert!(running().await.is_empty(), "removed with the cancel");

    let asked = turn(&engine, "ask: which city?", Some("waits"))
        .await
        .unwrap();
    assert_eq!(asked.status.state, TaskState::InputRequired);
    assert!(
        running().await.is_empty(),
        "a task waiting for input is not running"
    );
    let failed = turn(&engine, "fail", Some("fails")).await.unwrap();
    assert_eq!(failed.status.state, TaskState::Failed);
    assert!(running().await.is_empty(), "removed when the turn fails");
    engine.shutdown(Duration::from_secs(1)).await;
}

#[actix_rt::test]
async fn a_restart_fails_the_turns_a_crash_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let backend: Arc<dyn KvBackend> =
        Arc::new(SledBackend::open(dir.path(), 16 * 1024 * 1024).expect("sled opens"));
    let store = EmbeddedStore::over(backend.clone()).expect("store opens");
    let engine = Engine::start(
        Arc::new(store.clone()),
        Arc::new(ScriptedAgent),
        EngineConfig::default(),
    );
    let finished = turn(&engine, "hello", Some("done")).await.unwrap();
    let hub = engine
        .send(
            ANONYMOUS,
            valid_user(&engine, "slow 60000", Some("cut-off")),
        )
        .await
        .unwrap();
    let cut_off = hub.task_id.clone();
    // A crash: the store keeps the task as working; no shutdown ends it, and a new process
    // opens the same records.
    engine.store().flush().await.unwrap();
    drop(engine);
    drop(hub);
    let store = EmbeddedStore::over(backend).expect("store reopens");
    assert_eq!(store.running_tasks().await.unwrap(), vec![cut_off.clone()]);
    assert_eq!(
        store
            .task(ANONYMOUS, &cut_off)
            .await
            .unwrap()
            .unwrap()
            .status
            .state,
        TaskState::Working
    );

    let restarted = Engine::start(
        Arc::new(store.clone()),
        Arc::new(ScriptedAgent),
        EngineConfig::default(),
    );
    assert_eq!(restarted.fail_interrupted_turns().await.unwrap(), 1);
    let task = restarted.get_task(ANONYMOUS, &cut_off).await.unwrap();
    assert_eq!(task.status.state, TaskState::Failed);
    let said = task.status.message.as_ref().map(Message::text);
    assert_eq!(
        said.as_deref(),
        Some("the server stopped before the agent finished")
    );
    assert!(store.running_tasks().await.unwrap().is_empty());
    let untouched = restarted.get_task(ANONYMOUS, &finished.id).await.unwrap();
    assert_eq!(
        untouched.status, finished.status,
        "ended tasks are left alone"
    );
    // The conversation carries on; its stale running task is not failed twice.
    let next = turn(&restarted, "again", Some("cut-off")).await.unwrap();
    assert_eq!(next.status.state, TaskState::Completed);
    assert_eq!(restarted.fail_interrupted_turns().await.unwrap(), 0);
    restarted.shutdown(Duration::from_secs(1)).await;
}
