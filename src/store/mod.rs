//! Persistence: the record-level interface the engine talks to, and its implementations.
//!
//! [`ConversationStore`] names what a conversation engine needs (begin a turn, record a status,
//! finish a turn, cancel a waiting task, read, list, delete), never raw keys. Every condition a
//! write depends on (a busy conversation, a terminal task, a stale ownership token) is checked by
//! the store operation itself, atomically with the write, so the contract holds when several
//! processes share one database. Every write resolves only once it is durable.
//!
//! Implementations: [`embedded::EmbeddedStore`] (sled behind colloquy's write-ahead log, the
//! default) and [`postgres::PgStore`] (one PostgreSQL database shared by several nodes). The
//! conformance suite in `tests/it/store_conformance.rs` runs against each.

pub mod embedded;
mod key;
pub(crate) mod page_token;
pub mod postgres;

pub use key::{ConversationKey, KEY_LEN, NAMESPACE_VERSION, PrincipalKey};

use crate::error::{BoxError, Cause};
use crate::model::{Artifact, Message, Task, TaskState, TaskStatus, TaskView};
use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Why a store operation failed. `Backend`, `Unavailable` and `Corrupt` carry the message a
/// client is shown and, where there is one, the error that caused it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StoreError {
    #[error("storage backend: {message}")]
    Backend {
        message: String,
        #[source]
        source: Option<Cause>,
    },
    /// The database cannot be reached or its connection broke (a failover, say): nothing of
    /// the operation is stored, and the same request may be retried.
    #[error("the database is unavailable: {message}")]
    Unavailable {
        message: String,
        #[source]
        source: Option<Cause>,
    },
    #[error("stored record is unreadable: {message}")]
    Corrupt {
        message: String,
        #[source]
        source: Option<Cause>,
    },
    #[error("invalid page token")]
    BadPageToken,
    /// A turn is running in the conversation (its lease is held).
    #[error("task {task_id} is still running in context {context_id}")]
    Busy { context_id: String, task_id: String },
    /// The write's ownership token is not the conversation's current one: another turn (or
    /// another node) took the conversation since this turn began.
    #[error("the turn of task {task_id} no longer owns its conversation")]
    StaleToken { task_id: String },
    #[error("task not found: {0}")]
    TaskNotFound(String),
    #[error("task {task_id} is {} and accepts no more messages", state.as_str())]
    TaskTerminal { task_id: String, state: TaskState },
    #[error("task {task_id} is {} and cannot be canceled", state.as_str())]
    TaskNotCancelable { task_id: String, state: TaskState },
    /// Imported records that would break the store's invariants (nothing was stored).
    #[error("import refused: {0}")]
    ImportRefused(String),
    /// The store has stopped (the server is stopping): what was asked did not run, or was cut
    /// off with it.
    #[error("the store is closed")]
    Closed,
}

impl StoreError {
    /// A backend failure caused by `source`: the message is `context: source` (the source's
    /// own causes are left to [`crate::error::chain`], for logs).
    pub fn backend(context: impl std::fmt::Display, source: impl Into<BoxError>) -> Self {
        let source = Cause::new(source);
        StoreError::Backend {
            message: format!("{context}: {source}"),
            source: Some(source),
        }
    }

    /// A backend failure with no underlying error.
    pub fn backend_msg(message: impl Into<String>) -> Self {
        StoreError::Backend {
            message: message.into(),
            source: None,
        }
    }

    /// An unreadable record; `source` is the decoding error.
    pub fn corrupt(source: impl Into<BoxError>) -> Self {
        let source = Cause::new(source);
        StoreError::Corrupt {
            message: source.to_string(),
            source: Some(source),
        }
    }

    /// An unreadable record found by colloquy's own checks.
    pub fn corrupt_msg(message: impl Into<String>) -> Self {
        StoreError::Corrupt {
            message: message.into(),
            source: None,
        }
    }

    /// The database is unreachable; the message is `context: source`.
    pub fn unavailable(context: impl std::fmt::Display, source: impl Into<BoxError>) -> Self {
        let source = Cause::new(source);
        StoreError::Unavailable {
            message: format!("{context}: {source}"),
            source: Some(source),
        }
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// A shared handle to whichever store the configuration chose.
pub type SharedStore = Arc<dyn ConversationStore>;

/// The record-level store interface. Futures are `'static` so callers can spawn them.
pub trait ConversationStore: Send + Sync + 'static {
    /// Takes the conversation (refused with [`StoreError::Busy`] while another turn holds it),
    /// stores the caller's message and the task as working, atomically and durably, and returns
    /// what the turn needs, with the ownership token its later writes carry.
    fn begin_turn(&self, turn: BeginTurn) -> BoxFuture<'static, StoreResult<TurnBegun>>;

    /// Records a status the task passes through while its turn runs.
    fn record_status(
        &self,
        lease: &Lease,
        status: TaskStatus,
    ) -> BoxFuture<'static, StoreResult<()>>;

    /// Extends the turn's hold on its conversation (a shared database's lease expires unless its
    /// holder renews it). Refused with [`StoreError::StaleToken`] once the token moved on.
    fn renew_lease(&self, lease: &Lease) -> BoxFuture<'static, StoreResult<()>>;

    /// Stores the turn's reply and final state and releases the conversation.
    fn finish_turn(&self, end: FinishTurn) -> BoxFuture<'static, StoreResult<()>>;

    /// Cancels a task that waits for input (not running): it becomes canceled. Returns it.
    fn cancel_waiting(
        &self,
        principal: &str,
        task_id: &str,
    ) -> BoxFuture<'static, StoreResult<Task>>;

    /// Fails every task whose turn was running when its owner stopped without ending it (a
    /// crash). Returns how many. On an embedded store call once at start, before serving.
    fn fail_interrupted_turns(&self) -> BoxFuture<'static, StoreResult<usize>>;

    fn conversation(
        &self,
        key: ConversationKey,
    ) -> BoxFuture<'static, StoreResult<Option<ConversationMeta>>>;

    /// One page of a conversation's messages, oldest first, within `max_bytes`.
    fn conversation_page(
        &self,
        key: ConversationKey,
        from: MessagesFrom,
        max_bytes: usize,
    ) -> BoxFuture<'static, StoreResult<Option<ConversationPage>>>;

    /// The principal's task with its whole history; another principal's task is not found.
    fn task(&self, principal: &str, task_id: &str)
    -> BoxFuture<'static, StoreResult<Option<Task>>>;

    /// The outline of the task's latest streamed turn, if its end stored one.
    fn stream_outline(
        &self,
        principal: &str,
        task_id: &str,
    ) -> BoxFuture<'static, StoreResult<Option<StreamOutline>>>;

    /// The principal's tasks (or one conversation's), newest status first, within the query's
    /// byte budget.
    fn list_tasks(
        &self,
        principal: &str,
        query: TaskQuery,
    ) -> BoxFuture<'static, StoreResult<Page<Task>>>;

    /// The principal's conversations, most recently updated first.
    fn list_conversations(
        &self,
        principal: &str,
        page_size: usize,
        page_token: Option<String>,
    ) -> BoxFuture<'static, StoreResult<Page<ConversationMeta>>>;

    /// Removes a conversation with its messages and tasks; refused with [`StoreError::Busy`]
    /// while a turn runs in it. False if there was none.
    fn delete_conversation(&self, key: ConversationKey) -> BoxFuture<'static, StoreResult<bool>>;

    /// A durable write of a probe record: shows the store takes writes (readiness).
    fn probe(&self) -> BoxFuture<'static, StoreResult<()>>;

    /// The address of another node whose live lease runs `task_id` (the principal's), where
    /// requests that follow the task are forwarded. None on a store one process owns.
    fn running_holder(
        &self,
        _principal: &str,
        _task_id: &str,
    ) -> BoxFuture<'static, StoreResult<Option<String>>> {
        Box::pin(async { Ok(None) })
    }

    /// Up to `limit` conversations whole, in conversation-key order, after the key `after` (the
    /// last one of the previous page); only `principal`'s if given (`colloquy export`).
    fn export_conversations(
        &self,
        principal: Option<String>,
        after: Option<ConversationKey>,
        limit: usize,
    ) -> BoxFuture<'static, StoreResult<Vec<ConversationRecords>>>;

    /// Stores exported conversations as they are (sequence numbers, ids, timestamps), in one
    /// atomic write. A conversation already stored is left alone and counted as skipped, so an
    /// import can be run again; a task id another conversation holds refuses the whole write
    /// ([`StoreError::ImportRefused`]). Never while a server runs turns in them.
    fn import_conversations(
        &self,
        items: Vec<ConversationRecords>,
    ) -> BoxFuture<'static, StoreResult<Imported>>;

    /// The operator console's listing: conversations of every principal (or of the filter's
    /// one), most recently updated first, matching the filter, one page at a time. Each page
    /// reads a bounded number of entries, so a page may hold fewer than asked and still have a
    /// `next_page_token`; `total_size` is not counted (0).
    fn console_conversations(
        &self,
        filter: ConversationFilter,
    ) -> BoxFuture<'static, StoreResult<Page<ConversationMeta>>>;

    /// Up to `limit` held leases: the conversations whose turn is running, with the node that
    /// holds each (the operator console's leases page).
    fn held_leases(&self, limit: usize) -> BoxFuture<'static, StoreResult<Vec<HeldLease>>>;

    /// Resolves once everything written before the call is durable (shutdown).
    fn flush(&self) -> BoxFuture<'static, StoreResult<()>>;

    /// Bytes the store occupies, if it can tell (the metrics endpoint).
    fn size_on_disk(&self) -> BoxFuture<'static, StoreResult<u64>>;
}

/// What the operator console's conversation listing keeps ([`ConversationStore::console_conversations`]).
#[derive(Debug, Clone, Default)]
pub struct ConversationFilter {
    /// Only this principal's conversations (as the store sees it: joined to its tenant).
    pub principal: Option<String>,
    /// Only conversations of principals in this tenant.
    pub tenant: Option<String>,
    /// Only contextIds starting with this.
    pub context_prefix: Option<String>,
    pub page_size: usize,
    pub page_token: Option<String>,
}

impl ConversationFilter {
    /// Whether `meta` passes the filter (the principal too, for a store that reads every
    /// principal's conversations).
    pub fn matches(&self, meta: &ConversationMeta) -> bool {
        let principal_ok = self.principal.as_ref().is_none_or(|p| *p == meta.principal);
        let tenant_ok = self
            .tenant
            .as_deref()
            .is_none_or(|tenant| crate::model::tenant_of(&meta.principal) == Some(tenant));
        let prefix_ok = self
            .context_prefix
            .as_deref()
            .is_none_or(|prefix| meta.context_id.starts_with(prefix));
        principal_ok && tenant_ok && prefix_ok
    }
}

/// A conversation held by a running turn ([`ConversationStore::held_leases`]).
#[derive(Debug, Clone, PartialEq)]
pub struct HeldLease {
    pub principal: String,
    pub context_id: String,
    pub task_id: String,
    /// The node that holds it, as it names itself (`cluster.advertise`); None on a store one
    /// process owns (this node).
    pub holder: Option<String>,
    /// Seconds until the lease expires unless renewed (negative: expired, not yet swept); None
    /// where leases do not expire (one process).
    pub expires_in_secs: Option<f64>,
}

/// A turn's hold on its conversation: every write of the turn carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub key: ConversationKey,
    pub task_id: String,
    /// The conversation's generation when the turn took it; incremented at every take.
    pub token: u64,
    /// The turn's W3C `traceparent` (traces on), given to the push notifications its writes
    /// queue, so that their delivery joins the turn's trace. Never stored with the conversation.
    pub trace: Option<String>,
}

/// What starting a turn stores.
#[derive(Debug, Clone)]
pub struct BeginTurn {
    pub principal: String,
    pub context_id: String,
    /// `ConversationKey::new(principal, context_id)` and `PrincipalKey::new(principal)`: the
    /// conversation's actor has them (hashing them again was a tenth of a start's work).
    pub key: ConversationKey,
    pub principal_key: PrincipalKey,
    /// The caller's message, validated, with its contextId set.
    pub message: Message,
    pub task_id: String,
    /// `task_id` names a stored task waiting for input, which this message answers.
    pub continuing: bool,
    /// The server minted `context_id` for this message (the caller sent none): no stored
    /// conversation can have it, and the store need not look.
    pub new_context: bool,
    /// How many of the conversation's latest messages to return for the agent's history.
    pub history_limit: usize,
    /// Where the conversation stood when the caller last saw it, if the caller kept the
    /// history window of then: a conversation still there is read no further (see
    /// [`TurnBegun::recent`]).
    pub known: Option<ConversationMark>,
    /// Push-notification configs of the task, stored with the start (their task id is set
    /// here). A send registers one at most.
    pub push_configs: Vec<crate::model::PushConfig>,
    /// The turn's `traceparent`, for its lease ([`Lease::trace`]).
    pub trace: Option<String>,
}

impl BeginTurn {
    /// In debug builds (the tests), that the keys are the ids' own.
    pub(crate) fn debug_check_keys(&self) {
        debug_assert_eq!(
            self.key,
            ConversationKey::new(&self.principal, &self.context_id)
        );
        debug_assert!(self.principal_key == PrincipalKey::new(&self.principal));
    }

    /// The task a turn starts when it continues none: submitted, with nothing in it yet.
    pub(crate) fn new_task(&self) -> Task {
        Task {
            id: self.task_id.clone(),
            context_id: self.context_id.clone(),
            status: TaskStatus::new(TaskState::Submitted, None),
            artifacts: Vec::new(),
            history: Vec::new(),
            metadata: None,
        }
    }
}

/// What a started turn knows.
#[derive(Debug, Clone)]
pub struct TurnBegun {
    pub lease: Lease,
    /// The task as stored, working, with its history (the caller's message last).
    pub task: Task,
    /// The conversation's latest messages before this one, oldest first; None when the
    /// conversation stood at [`BeginTurn::known`] before this take (no one wrote to it since
    /// the caller saw it, so the caller's window is the stored one) and nothing was read.
    pub recent: Option<Vec<Message>>,
    /// Where the conversation stands once the caller's message is stored.
    pub mark: ConversationMark,
    /// This message's turn number in the conversation (1 for the first).
    pub turn: u64,
    pub agent_state: Option<serde_json::Value>,
}

/// Where a conversation stands: the token of its latest take and its next sequence number.
/// Every write to a conversation's messages moves one of them (a take draws a new token, the
/// holder's own writes move `next_seq`), and tokens are drawn at random ([`new_token`]), so no
/// other take, a recreated conversation's or one after a database was restored to an earlier
/// state, reaches a mark an earlier take left: a turn that finds its conversation at the mark
/// its caller remembers knows no other writer came between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConversationMark {
    pub token: u64,
    pub next_seq: u64,
}

/// What ending a turn stores.
#[derive(Debug, Clone)]
pub struct FinishTurn {
    pub lease: Lease,
    /// The agent's reply, appended to the conversation and the task's history.
    pub reply: Option<Message>,
    pub status: TaskStatus,
    pub artifacts: Vec<Artifact>,
    /// Replaces the conversation's agent state when set.
    pub agent_state: Option<serde_json::Value>,
    /// The turn's stream, for resumes served from the store (None: none is kept).
    pub stream: Option<StreamOutline>,
}

/// What is kept about a conversation besides its messages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConversationMeta {
    /// The id exactly as the caller used it.
    pub context_id: String,
    pub principal: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Messages the caller sent into this conversation.
    pub turns: u64,
    pub next_seq: u64,
    /// The task whose turn holds the conversation, if any.
    #[serde(default)]
    pub running_task: Option<String>,
    /// The ownership token of the latest turn (see [`Lease`]).
    #[serde(default)]
    pub token: u64,
    /// Opaque per-conversation state an agent backend keeps (an upstream contextId, say).
    #[serde(default)]
    pub agent_state: Option<serde_json::Value>,
}

impl ConversationMeta {
    pub fn new(principal: &str, context_id: &str) -> Self {
        let now = crate::model::now();
        ConversationMeta {
            context_id: context_id.to_owned(),
            principal: principal.to_owned(),
            created_at: now,
            updated_at: now,
            turns: 0,
            next_seq: 0,
            running_task: None,
            token: 0,
            agent_state: None,
        }
    }

    pub fn key(&self) -> ConversationKey {
        ConversationKey::new(&self.principal, &self.context_id)
    }

    pub fn mark(&self) -> ConversationMark {
        ConversationMark {
            token: self.token,
            next_seq: self.next_seq,
        }
    }
}

/// A take's token: random, nonzero, below 2^52 (far from overflow when a fencing step adds one,
/// in a signed 64-bit column), for [`ConversationMark`]. Fencing compares tokens for equality
/// only.
pub fn new_token() -> u64 {
    (rand::random::<u64>() >> 12).max(1)
}

/// Everything stored about one conversation, to move it between stores.
#[derive(Debug, Clone, PartialEq)]
pub struct ConversationRecords {
    pub meta: ConversationMeta,
    /// The sequence number of `messages[0]` (a conversation's messages have no gaps).
    pub first_seq: u64,
    pub messages: Vec<Message>,
    /// Its tasks in task-id order (byte order).
    pub tasks: Vec<TaskRecords>,
}

/// A task as stored: without history, which is the conversation's messages at `history_seqs`.
/// The PostgreSQL store keeps it as it is (JSON), the embedded one with more beside it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecords {
    pub task: Task,
    /// Its latest turn's stream, when one was outlined (never exported).
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "stream")]
    pub stream: Option<StreamOutline>,
    /// Last: the PostgreSQL store writes the record around it (`postgres::turn`).
    pub history_seqs: Vec<u64>,
}

/// What each event of a task's latest streamed turn was, by number: with the task as stored
/// at the turn's end, any node rebuilds the events after an id exactly as they were streamed
/// (`engine::resume`). Kept with the task and replaced each turn, a few bytes per event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamOutline {
    /// The conversation's number of the turn (the first half of its events' ids).
    #[serde(rename = "t")]
    pub turn: u64,
    /// Where the turn's streamed reply is among the task's artifacts, if it streamed one.
    /// (Never left out when absent: the embedded store's records are positional.)
    #[serde(rename = "r", default)]
    pub reply: Option<u32>,
    /// Event `n` is `events[n - 1]`.
    #[serde(rename = "e")]
    pub events: Vec<OutlinedEvent>,
}

/// A value kept as its JSON text.
mod json_text {
    use serde::{Deserialize, Deserializer, Serialize, Serializer, de::DeserializeOwned};

    pub fn serialize<T: Serialize, S: Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
        let text = serde_json::to_string(value).map_err(serde::ser::Error::custom)?;
        s.serialize_str(&text)
    }

    pub fn deserialize<'de, T: DeserializeOwned, D: Deserializer<'de>>(
        d: D,
    ) -> Result<T, D::Error> {
        let text = String::deserialize(d)?;
        serde_json::from_str(&text).map_err(serde::de::Error::custom)
    }
}

/// One streamed event, by what it carried.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum OutlinedEvent {
    /// The task as it stood when the turn opened to streams (always event 1).
    #[serde(rename = "o")]
    Opened,
    /// A chunk of the reply: its text ends at this byte of the reply artifact's text.
    #[serde(rename = "c")]
    Chunk(u32),
    /// A whole artifact besides the reply, at this index.
    #[serde(rename = "a")]
    Artifact(u32),
    /// A status the task passed through (as JSON text: the embedded store's compact records
    /// are positional, and a status leaves out its absent fields).
    #[serde(rename = "s", with = "json_text")]
    Status(Box<TaskStatus>),
    /// The reply's closing chunk (empty, the last).
    #[serde(rename = "z")]
    Closed,
    /// The final status: the stored task's.
    #[serde(rename = "f")]
    Final,
}

/// What an import stored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Imported {
    pub conversations: usize,
    /// Conversations left alone: already stored, or twice in the input.
    pub skipped: usize,
}

impl ConversationRecords {
    /// Refuses records that would break the store's invariants: messages past `next_seq`,
    /// history naming messages that are not there, a task of another conversation.
    pub fn check(&self) -> StoreResult<()> {
        let refuse = |why: String| {
            Err(StoreError::ImportRefused(format!(
                "conversation {:?} of {:?}: {why}",
                self.meta.context_id, self.meta.principal
            )))
        };
        let end = self.first_seq + self.messages.len() as u64;
        if end > self.meta.next_seq {
            return refuse(format!(
                "messages up to sequence number {end} but next_seq {}",
                self.meta.next_seq
            ));
        }
        for record in &self.tasks {
            if record.task.context_id != self.meta.context_id {
                return refuse(format!("task {} is of another context", record.task.id));
            }
            if let Some(seq) = record
                .history_seqs
                .iter()
                .find(|seq| **seq < self.first_seq || **seq >= end)
            {
                return refuse(format!(
                    "task {} names message {seq}, which is not exported",
                    record.task.id
                ));
            }
        }
        Ok(())
    }
}

/// Where a conversation page starts.
#[derive(Debug, Clone)]
pub enum MessagesFrom {
    /// At the `n`-th most recent message.
    Latest(usize),
    /// Where a previous page's `next_page_token` says it stopped.
    PageToken(String),
}

/// One page of a conversation: its metadata and messages, oldest first.
#[derive(Debug, Clone)]
pub struct ConversationPage {
    pub meta: ConversationMeta,
    pub messages: Vec<Message>,
    /// Resumes after the last message; empty when the page reached the newest one.
    pub next_page_token: String,
}

/// Filters, paging and view for [`ConversationStore::list_tasks`].
#[derive(Debug, Clone)]
pub struct TaskQuery {
    pub context_id: Option<String>,
    pub state: Option<TaskState>,
    pub status_after: Option<DateTime<Utc>>,
    pub page_size: usize,
    pub page_token: Option<String>,
    pub view: TaskView,
    /// What the page may hold, in bytes (estimated from stored sizes): it stops early once
    /// reached, though a single larger task is still returned alone.
    pub max_bytes: usize,
}

impl Default for TaskQuery {
    fn default() -> Self {
        TaskQuery {
            context_id: None,
            state: None,
            status_after: None,
            page_size: 50,
            page_token: None,
            view: TaskView::FULL,
            max_bytes: usize::MAX,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// Empty on the last page.
    pub next_page_token: String,
    pub total_size: usize,
}

/// What is left of one response's byte budget. The first item always fits, however large, so
/// a record larger than the budget still comes back (alone).
pub(crate) struct ResponseBudget {
    left: usize,
    taken: usize,
}

impl ResponseBudget {
    pub(crate) fn new(bytes: usize) -> Self {
        ResponseBudget {
            left: bytes,
            taken: 0,
        }
    }

    /// Takes an item of `bytes` if it fits.
    pub(crate) fn take(&mut self, bytes: usize) -> bool {
        if self.taken > 0 && bytes > self.left {
            return false;
        }
        self.left = self.left.saturating_sub(bytes);
        self.taken += 1;
        true
    }
}

/// The sequence numbers of the history messages a listing shows of a task: the latest ones, as
/// many as the view asks for.
pub(crate) fn shown_history<'a>(view: &TaskView, seqs: &'a [u64]) -> &'a [u64] {
    let shown = view
        .history_length
        .map_or(seqs.len(), |n| n.min(seqs.len()));
    &seqs[seqs.len() - shown..]
}

/// A listed task as the view shows it, with `history`, and its estimated size: `bytes` (its
/// stored record and the messages shown) less its artifacts' text when they are not shown.
pub(crate) fn as_listed(
    view: &TaskView,
    mut task: Task,
    history: Vec<Message>,
    bytes: usize,
) -> (Task, usize) {
    task.history = history;
    if view.artifacts {
        return (task, bytes);
    }
    let left_out: usize = task
        .artifacts
        .iter()
        .flat_map(|a| &a.parts)
        .filter_map(|p| p.as_text())
        .map(str::len)
        .sum();
    task.artifacts.clear();
    (task, bytes.saturating_sub(left_out))
}

/// A listing's page filled within a byte budget, whichever store reads it: items are offered in
/// order, each with the token that resumes the listing after it. Once one does not fit, the page
/// ends before it and resumes where the last one taken (or passed over) left off.
pub(crate) struct BudgetedPage<T> {
    budget: ResponseBudget,
    items: Vec<T>,
    resume_after: String,
    next_page_token: String,
}

impl<T> BudgetedPage<T> {
    /// `next_page_token` resumes after the listing's page, if every item fits.
    pub(crate) fn new(max_bytes: usize, next_page_token: String) -> Self {
        BudgetedPage {
            budget: ResponseBudget::new(max_bytes),
            items: Vec::new(),
            resume_after: String::new(),
            next_page_token,
        }
    }

    /// Takes `item` of `bytes` if it fits; false (take no more) once one does not.
    pub(crate) fn offer(&mut self, item: T, bytes: usize, resume: &str) -> bool {
        if !self.budget.take(bytes) {
            self.next_page_token = std::mem::take(&mut self.resume_after);
            return false;
        }
        self.items.push(item);
        self.pass(resume);
        true
    }

    /// Passes over an item that is gone since it was listed.
    pub(crate) fn pass(&mut self, resume: &str) {
        resume.clone_into(&mut self.resume_after);
    }

    pub(crate) fn finish(self, total_size: usize) -> Page<T> {
        Page {
            items: self.items,
            next_page_token: self.next_page_token,
            total_size,
        }
    }
}

/// Why a push-notification config operation was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PushError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// No such task for this principal (another principal's task is not found either).
    #[error("task not found: {0}")]
    TaskNotFound(String),
    #[error("push notification config {config_id} not found for task {task_id}")]
    ConfigNotFound { task_id: String, config_id: String },
    #[error("task {task_id} already has {limit} push notification configs, the limit")]
    TooManyConfigs { task_id: String, limit: usize },
}

/// What [`PushStore::due_notifications`] found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DueNotifications {
    /// Notifications whose time has come, earliest due first.
    pub due: Vec<Notification>,
    /// When the earliest notification left out falls due (now or earlier when the limit cut
    /// the due ones short); None when no other is waiting for a time.
    pub next_due: Option<DateTime<Utc>>,
}

/// A notification's lane: the notifications of one task to one URL, delivered one at a time in
/// outbox order. Both stores key their lane index by it.
pub(crate) fn lane_key(task_id: &str, url: &str) -> [u8; 16] {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    for field in [task_id, url] {
        hash.update((field.len() as u64).to_be_bytes());
        hash.update(field.as_bytes());
    }
    let mut lane = [0u8; 16];
    lane.copy_from_slice(&hash.finalize()[..16]);
    lane
}

impl Notification {
    pub(crate) fn lane(&self) -> [u8; 16] {
        lane_key(&self.config.task_id, &self.config.url)
    }

    /// The key of the conversation whose task it reports.
    pub(crate) fn conversation(&self) -> ConversationKey {
        ConversationKey::new(&self.principal, &self.task.context_id)
    }
}

/// A shared handle to the store's push-notification side.
pub type SharedPushStore = Arc<dyn PushStore>;

/// A notification waiting in the outbox: written in the same batch as the status change it
/// reports, removed once delivered or given up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Notification {
    /// Stable across retries and restarts: receivers drop duplicates by it.
    pub id: String,
    /// Outbox order (the order of the status changes).
    pub seq: u64,
    pub principal: String,
    /// The config as it was when the change happened.
    pub config: crate::model::PushConfig,
    /// The task's state as of the change (without history).
    pub task: Task,
    pub created_at: DateTime<Utc>,
    /// Attempts made so far.
    #[serde(default)]
    pub attempts: u32,
    /// Not to be tried before.
    pub not_before: DateTime<Utc>,
    /// The token of this process's hold on it, once claimed from a shared outbox
    /// ([`PushStore::claim_notification`]); its later writes are conditional on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    /// The W3C `traceparent` of the turn that queued it: its delivery joins that trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
    /// Why the last attempt failed, once one has (kept with the next attempt's time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// The next outbox position: the clock in nanoseconds, above `floor` and never below the last
/// one this process took, so entries keep the order of the changes (also across a restart,
/// unless the clock went back).
pub(crate) fn outbox_seq(floor: u64) -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = crate::model::now()
        .timestamp_nanos_opt()
        .unwrap_or(0)
        .max(0) as u64;
    let mut last = LAST.load(Ordering::Relaxed);
    loop {
        let seq = now.max(last + 1).max(floor + 1);
        match LAST.compare_exchange_weak(last, seq, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return seq,
            Err(actual) => last = actual,
        }
    }
}

/// The push-notification side of a store: configs kept with their task, and the outbox the
/// task-changing operations fill (in their own batches) and a delivery worker drains.
pub trait PushStore: Send + Sync + 'static {
    /// Stores (or replaces, same id) a config of the principal's task, refusing past
    /// `max_per_task` configs.
    fn put_push_config(
        &self,
        principal: &str,
        config: crate::model::PushConfig,
        max_per_task: usize,
    ) -> BoxFuture<'static, Result<crate::model::PushConfig, PushError>>;

    fn push_config(
        &self,
        principal: &str,
        task_id: &str,
        config_id: &str,
    ) -> BoxFuture<'static, Result<crate::model::PushConfig, PushError>>;

    /// The task's configs, oldest id order.
    fn push_configs(
        &self,
        principal: &str,
        task_id: &str,
    ) -> BoxFuture<'static, Result<Vec<crate::model::PushConfig>, PushError>>;

    fn delete_push_config(
        &self,
        principal: &str,
        task_id: &str,
        config_id: &str,
    ) -> BoxFuture<'static, Result<(), PushError>>;

    /// The first `limit` notifications of the outbox, in order (due or not).
    fn pending_notifications(
        &self,
        limit: usize,
    ) -> BoxFuture<'static, StoreResult<Vec<Notification>>>;

    /// Up to `limit` notifications whose time has come, earliest due first, read from an index
    /// by due time (the rest of the outbox is not read), with the time the next one falls
    /// due. A notification with an earlier one of its lane pending may be among them until a
    /// claim sets it aside ([`PushStore::claim_notification`]). Answers only with what is
    /// durable.
    fn due_notifications(&self, limit: usize) -> BoxFuture<'static, StoreResult<DueNotifications>>;

    /// How many notifications the outbox holds.
    fn pending_count(&self) -> BoxFuture<'static, StoreResult<usize>>;

    /// How many notifications of `principal` the outbox holds, counting no further than
    /// `limit`.
    fn pending_of(&self, principal: &str, limit: usize) -> BoxFuture<'static, StoreResult<usize>>;

    /// Takes the notification for delivery by this process for `hold`, unless another process
    /// holds it or it is not due (a shared database's outbox, judged by the database's clock),
    /// or an earlier notification of its lane is pending: then it is set aside, out of the due
    /// order, until that one is delivered or given up (its removal makes the next one of the
    /// lane due). Returns it as stored, with the claim (on a store one process owns, with
    /// nobody to share with, as it is); None if it may not go now or is gone.
    fn claim_notification(
        &self,
        notification: Notification,
        hold: std::time::Duration,
    ) -> BoxFuture<'static, StoreResult<Option<Notification>>>;

    /// Removes a delivered notification; the next of its lane is due.
    fn notification_delivered(
        &self,
        notification: &Notification,
    ) -> BoxFuture<'static, StoreResult<()>>;

    /// Stores the notification's new attempt count and next time (and releases its claim);
    /// nothing if it is gone or another process claimed it since.
    fn reschedule_notification(
        &self,
        notification: Notification,
    ) -> BoxFuture<'static, StoreResult<()>>;

    /// Removes a notification that will not be delivered; the next of its lane is due.
    fn give_up_notification(
        &self,
        notification: &Notification,
    ) -> BoxFuture<'static, StoreResult<()>>;

    /// Notified once a write that may have added notifications is durable, so a worker need not
    /// poll for them.
    fn outbox_waker(&self) -> Arc<tokio::sync::Notify>;
}
