//! The conversation engine: a `Directory` of `ContextActor`s (one per live conversation), each
//! running its turns ([`turn`]) over the [`ConversationStore`](crate::store::ConversationStore).
//!
//! The engine knows nothing of HTTP or wire versions: [`Engine`] is the one door the front uses.
//! The path of one turn: `docs/architecture.md`.

mod arbiters;
mod context;
mod directory;
mod drive;
mod error;
mod follow;
pub mod hub;
mod readiness;
pub mod relay;
pub mod resume;
mod shared;
mod turn;
mod validate;
mod window;

pub use arbiters::Arbiters;
pub use drive::StopReason;
pub use error::{EngineError, EngineResult};
pub use hub::{StreamItem, Subscription, TaskHub};
pub use relay::Relay;
pub use resume::{EventId, ResumeLimits, Sequenced};
pub use shared::{DEFAULT_RESPONSE_BYTES, EngineConfig, Shared, TaskRegistry};
pub use validate::{MessageLimits, ValidMessage, check_context_id, check_sizes};
pub use window::WindowLimits;

use crate::agent::SharedAgent;
use crate::error::chain;
use crate::model::{SendResult, Task};
use crate::store::{
    ConversationKey, ConversationMeta, ConversationPage, MessagesFrom, Page, SharedStore, TaskQuery,
};
use context::{CancelOutcome, CancelTask, DeleteConversation, Shutdown, StartTurn, When};
use directory::Directory;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use turn::Answer;

pub use crate::model::ANONYMOUS;

/// A fresh, unguessable contextId: `ctx-` and 128 random bits in hex.
pub fn new_context_id() -> String {
    format!("ctx-{:032x}", rand::random::<u128>())
}

fn unknown_event(after: EventId) -> EngineError {
    EngineError::InvalidParams(format!(
        "lastEventId: {after} is not an event of this task (it has not reached it)"
    ))
}

/// How far a subscription follows its task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Through every turn, on whichever node runs it, until the task ends (a client's).
    Task,
    /// To the end of the current turn on this node (another node relaying it, see [`Relay`]).
    Turn,
}

/// The engine's front door. Cheap to clone; needs a running actix System to start.
#[derive(Clone)]
pub struct Engine {
    directory: Arc<Directory>,
}

impl Engine {
    /// Starts the engine on `config.arbiters` arbiter threads of its own.
    pub fn start(store: SharedStore, agent: SharedAgent, config: EngineConfig) -> Engine {
        let arbiters = Arbiters::start(config.arbiters);
        Engine::start_on(store, agent, config, arbiters)
    }

    /// Starts the engine on `arbiters`, started before the store (`app.rs`).
    pub fn start_on(
        store: SharedStore,
        agent: SharedAgent,
        config: EngineConfig,
        arbiters: Arbiters,
    ) -> Engine {
        let shared = Arc::new(Shared {
            store,
            agent,
            windows: window::WindowBudget::new(config.window.bytes),
            resume: Arc::new(resume::ResumeLogs::new(config.resume)),
            config,
            live: TaskRegistry::default(),
            running: AtomicUsize::new(0),
            shutting_down: AtomicBool::new(false),
            readiness: readiness::Readiness::default(),
            relay: std::sync::OnceLock::new(),
        });
        Engine {
            directory: Directory::start(shared, arbiters),
        }
    }

    fn shared(&self) -> &Shared {
        self.directory.shared()
    }

    /// Lets subscriptions take the events of turns other nodes run (several nodes on one
    /// database); set once, before serving.
    pub fn relay_through(&self, relay: Arc<dyn Relay>) {
        let _ = self.shared().relay.set(relay);
    }

    pub fn store(&self) -> &SharedStore {
        &self.shared().store
    }

    pub fn agent(&self) -> &SharedAgent {
        &self.shared().agent
    }

    pub fn config(&self) -> &EngineConfig {
        &self.shared().config
    }

    /// Whether the store takes a durable write: the readiness check, probed at most once a
    /// second however many ask.
    pub async fn probe_store(&self) -> EngineResult<()> {
        self.shared().readiness.check(self.store()).await
    }

    /// Fails the tasks whose turns were running when the process last stopped without ending
    /// them (a crash): call once at start, before serving. Returns how many were failed.
    pub async fn fail_interrupted_turns(&self) -> EngineResult<usize> {
        Ok(self.store().fail_interrupted_turns().await?)
    }

    pub fn resident_contexts(&self) -> usize {
        self.directory.resident_count()
    }

    pub fn running_turns(&self) -> usize {
        self.shared().running_turns()
    }

    /// Checks a caller's message: the one place messages are validated.
    pub fn validate(&self, message: crate::model::Message) -> EngineResult<ValidMessage> {
        ValidMessage::check(message, &self.config().message)
    }

    /// Starts a turn and returns once its start is stored; the hub follows it.
    pub async fn send(&self, principal: &str, message: ValidMessage) -> EngineResult<Arc<TaskHub>> {
        match self
            .start_turn(principal, message, When::Started { subscribe: false })
            .await?
        {
            Answer::Started { hub, .. } => Ok(hub),
            Answer::Finished(_) => Err(EngineError::Internal("the turn answered late".into())),
        }
    }

    /// Runs a turn and returns its outcome once stored.
    pub async fn send_blocking(
        &self,
        principal: &str,
        message: ValidMessage,
    ) -> EngineResult<Arc<SendResult>> {
        match self.start_turn(principal, message, When::Finished).await? {
            Answer::Finished(result) => Ok(result),
            Answer::Started { hub, .. } => hub
                .wait_final()
                .await
                .ok_or_else(|| EngineError::Internal("the turn ended without a result".into())),
        }
    }

    /// Starts a turn and follows it from its first event.
    pub async fn send_streaming(
        &self,
        principal: &str,
        message: ValidMessage,
    ) -> EngineResult<(Arc<TaskHub>, Subscription)> {
        match self
            .start_turn(principal, message, When::Started { subscribe: true })
            .await?
        {
            Answer::Started { hub, subscription } => {
                let subscription = subscription.unwrap_or_else(|| hub.subscribe());
                Ok((hub, subscription))
            }
            Answer::Finished(_) => Err(EngineError::Internal("the turn answered late".into())),
        }
    }

    async fn start_turn(
        &self,
        principal: &str,
        message: ValidMessage,
        when: When,
    ) -> EngineResult<Answer> {
        let (mut message, push_configs) = message.into_parts();
        let new_context = message.task_id.is_none() && message.context_id.is_none();
        let context_id = match message.task_id.clone() {
            Some(task_id) => {
                self.context_of_task(principal, &task_id, message.context_id.as_deref())
                    .await?
            }
            None => message.context_id.clone().unwrap_or_else(new_context_id),
        };
        message.context_id = Some(context_id.clone());
        let task_id = message.task_id.clone();
        let start = StartTurn {
            message,
            task_id,
            new_context,
            when,
            push_configs,
            trace: crate::telemetry::propagation::current(),
        };
        self.directory.call(principal, &context_id, start).await?
    }

    /// The conversation a continued task belongs to, checking the message may continue it.
    async fn context_of_task(
        &self,
        principal: &str,
        task_id: &str,
        context_id: Option<&str>,
    ) -> EngineResult<String> {
        let task = self.stored_task(principal, task_id).await?;
        if let Some(context_id) = context_id.filter(|c| *c != task.context_id) {
            return Err(EngineError::InvalidParams(format!(
                "contextId: {context_id:?} is not the context of task {task_id}"
            )));
        }
        let state = task.status.state;
        if state.is_terminal() {
            return Err(EngineError::TaskTerminal {
                task_id: task_id.to_owned(),
                state,
            });
        }
        Ok(task.context_id)
    }

    async fn stored_task(&self, principal: &str, task_id: &str) -> EngineResult<Task> {
        self.store()
            .task(principal, task_id)
            .await?
            .ok_or_else(|| EngineError::TaskNotFound(task_id.to_owned()))
    }

    /// Whether the principal's task runs on this node now.
    pub fn runs_here(&self, principal: &str, task_id: &str) -> bool {
        self.shared().live.get(principal, task_id).is_some()
    }

    /// The task as it is now: live for a running task, else as stored.
    pub async fn get_task(&self, principal: &str, task_id: &str) -> EngineResult<Task> {
        if let Some(hub) = self.shared().live.get(principal, task_id) {
            return Ok(hub.snapshot());
        }
        self.stored_task(principal, task_id).await
    }

    /// One page of the principal's tasks (or a conversation's), newest status first, within
    /// the response budget: a page stops early when the next task would exceed it.
    pub async fn list_tasks(
        &self,
        principal: &str,
        mut query: TaskQuery,
    ) -> EngineResult<Page<Task>> {
        query.max_bytes = self.config().response_bytes;
        Ok(self.store().list_tasks(principal, query).await?)
    }

    pub async fn cancel(&self, principal: &str, task_id: &str) -> EngineResult<Task> {
        let task = self.stored_task(principal, task_id).await?;
        let state = task.status.state;
        if state.is_terminal() {
            return Err(EngineError::TaskNotCancelable {
                task_id: task_id.to_owned(),
                state,
            });
        }
        let cancel = CancelTask {
            task_id: task_id.to_owned(),
        };
        let stopping = match self
            .directory
            .call(principal, &task.context_id, cancel)
            .await??
        {
            CancelOutcome::Done(task) => return Ok(*task),
            CancelOutcome::Stopping(stopping) => stopping,
        };
        let hub = turn::stopped_hub(stopping, task_id).await?;
        match hub.wait_final().await.as_deref() {
            Some(SendResult::Task(task)) => Ok(task.clone()),
            _ => self.get_task(principal, task_id).await,
        }
    }

    /// Follows a task: the task with everything so far (or, with `after`, the events right after
    /// that id), then every later event, through waits for input and the turns that answer
    /// them, until the task ends; with [`Scope::Turn`], only until its current turn ends.
    pub async fn subscribe(
        &self,
        principal: &str,
        task_id: &str,
        after: Option<EventId>,
        scope: Scope,
    ) -> EngineResult<Subscription> {
        let (first, waiting, relayed) = self
            .subscribe_turn(principal, task_id, after, scope)
            .await?;
        // A relayed resume is counted where its events come from.
        if let Some(resumed) = first.resumed
            && !relayed
        {
            resumed.count();
        }
        Ok(follow::follow(
            self.clone(),
            principal.to_owned(),
            task_id.to_owned(),
            first,
            waiting,
            scope,
        ))
    }

    fn is_shutting_down(&self) -> bool {
        self.shared().shutting_down.load(Ordering::Acquire)
    }

    /// The running turn's stream (here, or relayed from the node that runs it), or the waiting
    /// task alone (resumed: what the log holds); whether the task waits for input before
    /// anything of it is streamed, and whether the stream is relayed.
    async fn subscribe_turn(
        &self,
        principal: &str,
        task_id: &str,
        after: Option<EventId>,
        scope: Scope,
    ) -> EngineResult<(Subscription, bool, bool)> {
        // A turn registers its hub just after storing its start; give that moment a chance.
        let deadline = Instant::now() + Duration::from_secs(1);
        // A relayed subscription never relays again: nodes do not chain.
        let mut relay = self.relay(scope);
        loop {
            if let Some(hub) = self.shared().live.get(principal, task_id) {
                let subscription = match after {
                    None => hub.subscribe(),
                    Some(after) => hub.resume(after).map_err(|_| unknown_event(after))?,
                };
                return Ok((subscription, false, false));
            }
            let task = self.get_task(principal, task_id).await?;
            let state = task.status.state;
            if !state.is_terminal()
                && !state.is_interrupted()
                && let Some(relay) = relay.take()
                && let Some(remote) = relay.subscribe(principal, task_id, after).await
            {
                return Ok((remote, false, true));
            }
            if let Some(after) = after
                && (state.is_terminal() || state.is_interrupted() || Instant::now() >= deadline)
            {
                let waiting = state.is_interrupted();
                return Ok((
                    self.resume_without_turn(principal, task, after).await?,
                    waiting,
                    false,
                ));
            }
            if state.is_terminal() {
                return Err(EngineError::TaskTerminal {
                    task_id: task_id.to_owned(),
                    state,
                });
            }
            if state.is_interrupted() || Instant::now() >= deadline {
                return Ok((Subscription::single(StreamItem::Task(task)), false, false));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Where a subscription of `scope` takes the turns other nodes run from, if anywhere.
    fn relay(&self, scope: Scope) -> Option<Arc<dyn Relay>> {
        match scope {
            Scope::Task => self.shared().relay.get().cloned(),
            Scope::Turn => None,
        }
    }

    /// A resume with no turn of the task running here: the logged events after `after`, or
    /// those its last turn's stored outline rebuilds, or the task as stored when neither
    /// reaches back to it. A task that ended since the last logged event (a cancel while it
    /// waited) ends the replay with its stored state.
    async fn resume_without_turn(
        &self,
        principal: &str,
        task: Task,
        after: EventId,
    ) -> EngineResult<Subscription> {
        let log = self.shared().resume.get(principal, &task.id);
        let mut replay = match &log {
            Some(log) => log.replay_after(after, None),
            None => resume::Replay::TooOld,
        };
        let mut logged_end = log.is_some_and(|log| log.ended());
        if let resume::Replay::TooOld = replay
            && let Some(outline) = self.store().stream_outline(principal, &task.id).await?
        {
            replay = resume::replay_outline(&outline, &task, after);
            logged_end = true;
        }
        match replay {
            resume::Replay::After(mut items) => {
                if task.status.state.is_terminal() && !logged_end {
                    items.push(Sequenced {
                        id: None,
                        item: StreamItem::Task(task),
                    });
                }
                Ok(Subscription::fixed(items, Some(resume::Resumed::Replayed)))
            }
            resume::Replay::TooOld => Ok(Subscription::fixed(
                vec![Sequenced {
                    id: None,
                    item: StreamItem::Task(task),
                }],
                Some(resume::Resumed::Snapshot),
            )),
            resume::Replay::Unknown => Err(unknown_event(after)),
        }
    }

    pub async fn list_conversations(
        &self,
        principal: &str,
        page_size: usize,
        page_token: Option<String>,
    ) -> EngineResult<Page<ConversationMeta>> {
        Ok(self
            .store()
            .list_conversations(principal, page_size, page_token)
            .await?)
    }

    /// A conversation's metadata and one page of its messages, oldest first: from the
    /// `history_length`-th most recent one, or from where `page_token` says the last page
    /// stopped, to the newest, within the response budget.
    pub async fn conversation(
        &self,
        principal: &str,
        context_id: &str,
        history_length: usize,
        page_token: Option<String>,
    ) -> EngineResult<Option<ConversationPage>> {
        validate::check_context_id(context_id, &self.config().message)?;
        let key = ConversationKey::new(principal, context_id);
        let from = match page_token.filter(|t| !t.is_empty()) {
            Some(token) => MessagesFrom::PageToken(token),
            None => MessagesFrom::Latest(history_length),
        };
        Ok(self
            .store()
            .conversation_page(key, from, self.config().response_bytes)
            .await?)
    }

    /// Deletes a conversation; refused while a turn runs in it.
    pub async fn delete_conversation(
        &self,
        principal: &str,
        context_id: &str,
    ) -> EngineResult<bool> {
        validate::check_context_id(context_id, &self.config().message)?;
        self.directory
            .call(principal, context_id, DeleteConversation)
            .await?
    }

    /// Stops taking turns, lets running ones finish within `grace`, ends the rest as failed, and
    /// flushes the store.
    pub async fn shutdown(&self, grace: Duration) {
        let shared = self.shared();
        shared.shutting_down.store(true, Ordering::Release);
        let deadline = Instant::now() + grace;
        while shared.running_turns() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if shared.running_turns() > 0 {
            tracing::warn!(
                running = shared.running_turns(),
                "grace period over; failing the turns still running"
            );
            for addr in self.directory.all() {
                addr.do_send(Shutdown);
            }
            // Failing a turn is one store write: a second is plenty, and the process must exit
            // soon after the grace. A turn not recorded by then is marked failed when it is
            // next found running.
            let deadline = Instant::now() + Duration::from_secs(1);
            while shared.running_turns() > 0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        if let Err(e) = shared.store.flush().await {
            tracing::error!(error = %chain(&e), "final flush failed");
        }
        self.directory.stop_arbiters().await;
    }
}
