//! The conversation engine: a `Directory` of `ContextActor`s (one per live conversation), each
//! running its turns through the `AgentActor` of its arbiter, over the [`Store`].
//!
//! The engine knows nothing of HTTP or wire versions: [`Engine`] is the one door the front uses.

mod agent_actor;
mod context;
mod directory;
mod error;
pub mod hub;
mod turn;

pub use agent_actor::StopReason;
pub use error::{EngineError, EngineResult};
pub use hub::{StreamItem, Subscription, TaskHub};

use crate::agent::SharedAgent;
use crate::history::HistoryLimits;
use crate::model::{Message, Role, Task, TaskView};
use crate::store::{ConversationKey, ConversationMeta, Page, Store, TaskQuery};
use context::{CancelOutcome, CancelTask, DeleteConversation, Shutdown, StartTurn, TurnStarted};
use directory::Directory;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use crate::model::ANONYMOUS;

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub history: HistoryLimits,
    /// A conversation's actor stops after this long without a message (its state is on disk).
    pub idle_timeout: Duration,
    /// A turn whose agent has not finished by then fails.
    pub agent_timeout: Duration,
    /// Events a stream may fall behind before it is closed with an error.
    pub subscriber_buffer: usize,
    /// Arbiter threads that host the conversation actors.
    pub arbiters: usize,
    /// Turns running at once across all conversations; beyond, sends are refused as overloaded.
    pub max_running_turns: usize,
    pub max_context_id_bytes: usize,
    /// Live conversation actors; past it idle ones are stopped first, and past 110% new
    /// conversations are refused as overloaded.
    pub max_resident: usize,
    /// What one listing page may hold, in bytes (estimated from stored sizes): a page stops
    /// early once it is reached, though a single larger record is still returned alone.
    pub response_bytes: usize,
}

/// The default of [`EngineConfig::response_bytes`].
pub const DEFAULT_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            history: HistoryLimits::default(),
            idle_timeout: Duration::from_secs(300),
            agent_timeout: Duration::from_secs(600),
            subscriber_buffer: 1024,
            arbiters: std::thread::available_parallelism().map_or(2, |n| n.get()),
            max_running_turns: 10_000,
            max_context_id_bytes: 256,
            max_resident: 1_000_000,
            response_bytes: DEFAULT_RESPONSE_BYTES,
        }
    }
}

/// The hubs of running turns, by task id.
#[derive(Default)]
pub struct TaskRegistry {
    shards: [Mutex<HashMap<String, Arc<TaskHub>>>; 16],
}

impl TaskRegistry {
    fn shard(&self, task_id: &str) -> std::sync::MutexGuard<'_, HashMap<String, Arc<TaskHub>>> {
        let index = task_id
            .bytes()
            .fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(b as usize));
        self.shards[index % self.shards.len()]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn insert(&self, hub: Arc<TaskHub>) {
        self.shard(&hub.task_id).insert(hub.task_id.clone(), hub);
    }

    fn remove(&self, hub: &TaskHub) {
        self.shard(&hub.task_id).remove(&hub.task_id);
    }

    /// The hub of a running task, if it belongs to `principal`.
    fn get(&self, principal: &str, task_id: &str) -> Option<Arc<TaskHub>> {
        self.shard(task_id)
            .get(task_id)
            .filter(|hub| hub.principal == principal)
            .cloned()
    }
}

/// What every actor shares.
pub struct Shared {
    pub store: Store,
    pub agent: SharedAgent,
    pub config: EngineConfig,
    pub live: TaskRegistry,
    running: AtomicUsize,
    shutting_down: AtomicBool,
}

impl Shared {
    /// Counts a turn in, unless the server is full or shutting down.
    fn turn_started(&self) -> EngineResult<()> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(EngineError::ShuttingDown);
        }
        let running = self.running.fetch_add(1, Ordering::AcqRel) + 1;
        if running > self.config.max_running_turns {
            self.running.fetch_sub(1, Ordering::AcqRel);
            metrics::counter!("colloquy_overload_rejections_total").increment(1);
            return Err(EngineError::Overloaded {
                running: running - 1,
                retry_after_ms: 100,
            });
        }
        metrics::gauge!("colloquy_contexts_busy").set(running as f64);
        Ok(())
    }

    fn turn_ended(&self) {
        let running = self
            .running
            .fetch_sub(1, Ordering::AcqRel)
            .saturating_sub(1);
        metrics::gauge!("colloquy_contexts_busy").set(running as f64);
    }

    pub fn running_turns(&self) -> usize {
        self.running.load(Ordering::Acquire)
    }
}

/// One page of a conversation: its metadata and messages, oldest first.
#[derive(Debug, Clone)]
pub struct ConversationPage {
    pub meta: ConversationMeta,
    pub messages: Vec<Message>,
    /// Resumes after the last message; empty when the page reached the newest one.
    pub next_page_token: String,
}

/// What is left of one response's byte budget. The first item always fits, however large, so
/// a record larger than the budget still comes back (alone).
struct ResponseBudget {
    left: usize,
    taken: usize,
}

impl ResponseBudget {
    fn new(bytes: usize) -> Self {
        ResponseBudget {
            left: bytes,
            taken: 0,
        }
    }

    /// Takes an item of `bytes` if it fits.
    fn take(&mut self, bytes: usize) -> bool {
        if self.taken > 0 && bytes > self.left {
            return false;
        }
        self.left = self.left.saturating_sub(bytes);
        self.taken += 1;
        true
    }
}

/// A fresh, unguessable contextId: `ctx-` and 128 random bits in hex.
pub fn new_context_id() -> String {
    format!("ctx-{:032x}", rand::random::<u128>())
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> EngineResult<T> + Send + 'static,
) -> EngineResult<T> {
    actix_rt::task::spawn_blocking(work)
        .await
        .map_err(|e| EngineError::Internal(format!("store task: {e}")))?
}

/// A listed task as the view shows it, and its estimated size: the stored sizes of its record
/// (less its artifacts' text when they are not shown) and of the messages shown. None if it is
/// gone.
fn load_listed_task(
    store: &Store,
    task_id: &str,
    view: TaskView,
) -> EngineResult<Option<(Task, usize)>> {
    let Some((record, record_bytes)) = store.task_sized(task_id)? else {
        return Ok(None);
    };
    let seqs = &record.history_seqs;
    let shown = view
        .history_length
        .map_or(seqs.len(), |n| n.min(seqs.len()));
    let (history, history_bytes) =
        store.messages_sized(&record.conversation(), &seqs[seqs.len() - shown..])?;
    let mut task = record.task;
    task.history = history;
    let mut bytes = record_bytes + history_bytes;
    if !view.artifacts {
        let left_out: usize = task
            .artifacts
            .iter()
            .flat_map(|a| &a.parts)
            .filter_map(|p| p.as_text())
            .map(str::len)
            .sum();
        bytes = bytes.saturating_sub(left_out);
        task.artifacts.clear();
    }
    Ok(Some((task, bytes)))
}

/// The engine's front door. Cheap to clone; needs a running actix System to start.
#[derive(Clone)]
pub struct Engine {
    directory: Arc<Directory>,
}

impl Engine {
    pub fn start(store: Store, agent: SharedAgent, config: EngineConfig) -> Engine {
        let arbiters = config.arbiters;
        let shared = Arc::new(Shared {
            store,
            agent,
            config,
            live: TaskRegistry::default(),
            running: AtomicUsize::new(0),
            shutting_down: AtomicBool::new(false),
        });
        Engine {
            directory: Directory::start(shared, arbiters),
        }
    }

    fn shared(&self) -> &Shared {
        self.directory.shared()
    }

    pub fn store(&self) -> &Store {
        &self.shared().store
    }

    pub fn agent(&self) -> &SharedAgent {
        &self.shared().agent
    }

    pub fn config(&self) -> &EngineConfig {
        &self.shared().config
    }

    /// A durable write to the store: the readiness check.
    pub async fn probe_store(&self) -> EngineResult<()> {
        Ok(self.store().write(|store| store.probe()).await?)
    }

    /// Fails the tasks whose turns were running when the process last stopped without ending
    /// them (a crash): call once at start, before serving. Returns how many were failed.
    pub async fn fail_interrupted_turns(&self) -> EngineResult<usize> {
        // A clean stop leaves the index empty: then start-up writes (and flushes) nothing.
        let store = self.store().clone();
        if blocking(move || Ok(store.running_tasks()?))
            .await?
            .is_empty()
        {
            return Ok(0);
        }
        self.store().write(turn::fail_interrupted_tasks).await
    }

    pub fn resident_contexts(&self) -> usize {
        self.directory.resident_count()
    }

    pub fn running_turns(&self) -> usize {
        self.shared().running_turns()
    }

    fn check_context_id(&self, context_id: &str) -> EngineResult<()> {
        let max = self.config().max_context_id_bytes;
        if context_id.is_empty() {
            return Err(EngineError::InvalidParams(
                "contextId: must not be empty".into(),
            ));
        }
        if context_id.len() > max {
            return Err(EngineError::InvalidParams(format!(
                "contextId: {} bytes, more than the limit of {max}",
                context_id.len()
            )));
        }
        Ok(())
    }

    /// Starts a turn. The hub follows it: wait on it (blocking send) or snapshot it.
    pub async fn send(&self, principal: &str, message: Message) -> EngineResult<Arc<TaskHub>> {
        Ok(self.start_turn(principal, message, false).await?.hub)
    }

    /// Starts a turn and follows it from its first event.
    pub async fn send_streaming(
        &self,
        principal: &str,
        message: Message,
    ) -> EngineResult<(Arc<TaskHub>, Subscription)> {
        let started = self.start_turn(principal, message, true).await?;
        let subscription = started
            .subscription
            .unwrap_or_else(|| started.hub.subscribe());
        Ok((started.hub, subscription))
    }

    async fn start_turn(
        &self,
        principal: &str,
        mut message: Message,
        stream: bool,
    ) -> EngineResult<TurnStarted> {
        if message.role != Role::User {
            return Err(EngineError::InvalidParams(
                "message.role: a message sent to the agent must have the user role".into(),
            ));
        }
        if message.parts.is_empty() {
            return Err(EngineError::InvalidParams(
                "message.parts: must not be empty".into(),
            ));
        }
        if let Some(context_id) = &message.context_id {
            self.check_context_id(context_id)?;
        }
        let context_id = match message.task_id.clone() {
            Some(task_id) => {
                self.context_of_task(principal, &task_id, message.context_id.as_deref())
                    .await?
            }
            None => message.context_id.clone().unwrap_or_else(new_context_id),
        };
        message.context_id = Some(context_id.clone());
        let key = ConversationKey::new(principal, &context_id);
        let task_id = message.task_id.clone();
        self.directory
            .call(
                &key,
                principal,
                &context_id,
                StartTurn {
                    message,
                    task_id,
                    stream,
                },
            )
            .await?
    }

    /// The conversation a continued task belongs to, checking the message may continue it.
    async fn context_of_task(
        &self,
        principal: &str,
        task_id: &str,
        context_id: Option<&str>,
    ) -> EngineResult<String> {
        let record = self.owned_task(principal, task_id).await?;
        if let Some(context_id) = context_id.filter(|c| *c != record.task.context_id) {
            return Err(EngineError::InvalidParams(format!(
                "contextId: {context_id:?} is not the context of task {task_id}"
            )));
        }
        turn::ensure_open(&record)?;
        Ok(record.task.context_id)
    }

    async fn owned_task(
        &self,
        principal: &str,
        task_id: &str,
    ) -> EngineResult<crate::store::TaskRecord> {
        let store = self.store().clone();
        let (principal, task_id) = (principal.to_owned(), task_id.to_owned());
        blocking(move || turn::owned_task(&store, &principal, &task_id)).await
    }

    /// The task as it is now: live for a running task, else as stored.
    pub async fn get_task(&self, principal: &str, task_id: &str) -> EngineResult<Task> {
        if let Some(hub) = self.shared().live.get(principal, task_id) {
            return Ok(hub.snapshot());
        }
        let store = self.store().clone();
        let (principal, task_id) = (principal.to_owned(), task_id.to_owned());
        blocking(move || turn::load_task(&store, &principal, &task_id).map(|(_, task)| task)).await
    }

    /// One page of the principal's tasks (or a conversation's), newest status first, within
    /// the response budget: a page stops early when the next task would exceed it.
    pub async fn list_tasks(
        &self,
        principal: &str,
        context_id: Option<&str>,
        mut query: TaskQuery,
        view: TaskView,
    ) -> EngineResult<Page<Task>> {
        query.conversation = context_id.map(|c| ConversationKey::new(principal, c));
        let store = self.store().clone();
        let principal_owned = principal.to_owned();
        let mut budget = ResponseBudget::new(self.config().response_bytes);
        blocking(move || {
            let listed = store.list_tasks(&principal_owned, &query)?;
            let mut tasks = Vec::with_capacity(listed.items.len());
            let mut next_page_token = listed.next_page_token;
            let mut resume_after: Option<&str> = None;
            for entry in &listed.items {
                if let Some((task, bytes)) = load_listed_task(&store, &entry.task_id, view)? {
                    if !budget.take(bytes) {
                        next_page_token = resume_after.unwrap_or_default().to_owned();
                        break;
                    }
                    tasks.push(task);
                }
                resume_after = Some(&entry.resume_token);
            }
            Ok(Page {
                items: tasks,
                next_page_token,
                total_size: listed.total_size,
            })
        })
        .await
    }

    pub async fn cancel(&self, principal: &str, task_id: &str) -> EngineResult<Task> {
        let record = self.owned_task(principal, task_id).await?;
        turn::ensure_cancelable(&record)?;
        let context_id = record.task.context_id.clone();
        let key = record.conversation();
        let cancel = CancelTask {
            task_id: task_id.to_owned(),
        };
        let hub = match self
            .directory
            .call(&key, principal, &context_id, cancel)
            .await??
        {
            CancelOutcome::Done(task) => return Ok(*task),
            CancelOutcome::Running(hub) => hub,
            CancelOutcome::Starting(hub) => hub
                .await
                .map_err(|_| EngineError::TaskNotFound(task_id.to_owned()))?,
        };
        match hub.wait_final().await {
            Some(crate::model::SendResult::Task(task)) => Ok(task),
            _ => self.get_task(principal, task_id).await,
        }
    }

    /// Follows a task: the task with everything so far, then every later event.
    pub async fn subscribe(&self, principal: &str, task_id: &str) -> EngineResult<Subscription> {
        // A turn registers its hub just after storing its start; give that moment a chance.
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            if let Some(hub) = self.shared().live.get(principal, task_id) {
                return Ok(hub.subscribe());
            }
            let task = self.get_task(principal, task_id).await?;
            let state = task.status.state;
            if state.is_terminal() {
                return Err(EngineError::TaskTerminal {
                    task_id: task_id.to_owned(),
                    state,
                });
            }
            if state.is_interrupted() || Instant::now() >= deadline {
                return Ok(Subscription::single(StreamItem::Task(task)));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn list_conversations(
        &self,
        principal: &str,
        page_size: usize,
        page_token: Option<String>,
    ) -> EngineResult<Page<ConversationMeta>> {
        let store = self.store().clone();
        let principal = principal.to_owned();
        blocking(move || {
            Ok(store.list_conversations(&principal, page_size, page_token.as_deref())?)
        })
        .await
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
        self.check_context_id(context_id)?;
        let store = self.store().clone();
        let key = ConversationKey::new(principal, context_id);
        let mut budget = ResponseBudget::new(self.config().response_bytes);
        blocking(move || {
            let Some(meta) = store.conversation(&key)? else {
                return Ok(None);
            };
            let first = meta.next_seq.saturating_sub(history_length as u64);
            let mut messages = Vec::new();
            let mut next_page_token = String::new();
            for entry in store.messages_from(&key, first, page_token.as_deref())? {
                let (seq, message, bytes) = entry?;
                if !budget.take(bytes) {
                    next_page_token = crate::store::message_page_token(seq);
                    break;
                }
                messages.push(message);
            }
            Ok(Some(ConversationPage {
                meta,
                messages,
                next_page_token,
            }))
        })
        .await
    }

    /// Deletes a conversation; refused while a turn runs in it.
    pub async fn delete_conversation(
        &self,
        principal: &str,
        context_id: &str,
    ) -> EngineResult<bool> {
        self.check_context_id(context_id)?;
        let key = ConversationKey::new(principal, context_id);
        self.directory
            .call(&key, principal, context_id, DeleteConversation)
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
        if let Err(e) = shared.store.durable().await {
            tracing::error!(error = %e, "final flush failed");
        }
        self.directory.stop_arbiters().await;
    }
}
