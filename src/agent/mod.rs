//! Agent backends: what does the thinking behind a conversation.
//!
//! A backend receives an [`AgentRequest`] (the current message, the structured history and the
//! guarded prompt) and emits [`AgentEvent`]s in order: text chunks, whole artifacts, and at most one
//! final status. The engine catches a call's panic where it polls it and ends a hang at the
//! turn's timeout, so a panic or a hang in a backend ends only that turn's task.

mod a2a;
mod echo;
mod exec;
mod openai;

pub use a2a::{A2aAgent, DelegationState};
pub use echo::EchoAgent;
pub use exec::ExecAgent;
pub use openai::{HISTORY_NOTE as OPENAI_HISTORY_NOTE, OpenAiAgent};

use crate::error::BoxError;
use crate::history::HistoryEntry;
use crate::model::{Artifact, Message, TaskState};
use futures_util::future::BoxFuture;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Everything a backend gets for one task.
#[derive(Debug, Clone)]
pub struct AgentRequest {
    pub context_id: String,
    pub task_id: String,
    pub message: Message,
    /// Earlier messages of this conversation, oldest first, within the history limit.
    pub history: Arc<Vec<HistoryEntry>>,
    /// The guarded history block followed by the current text.
    pub prompt: String,
    /// This message's turn number in the conversation (1 for the first).
    pub turn: u64,
    /// What the backend asked to keep for this conversation last time ([`AgentEvent::State`]).
    pub state: Option<serde_json::Value>,
}

/// What a backend emits while it works.
#[derive(Debug, Clone)]
pub enum AgentEvent {
    /// A chunk of the reply text.
    Text(String),
    /// Raw reply bytes; the engine reassembles UTF-8 characters split across chunks.
    Bytes(Vec<u8>),
    /// A whole artifact besides the reply.
    Artifact(Artifact),
    /// The final state, with an optional status message text.
    Status {
        state: TaskState,
        text: Option<String>,
    },
    /// Answer with a plain message instead of a task (only as the sole output).
    Message(Message),
    /// Per-conversation state to keep for the next call (an upstream contextId, say).
    State(serde_json::Value),
}

/// Why a backend's run failed. Its message becomes the task's status message.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// A failure the backend states in words (the peer's task failed, say).
    #[error("{0}")]
    Failed(String),
    /// The backend's own error, with its causes.
    #[error(transparent)]
    Backend(BoxError),
    /// The task was canceled or timed out: the sink takes no more events.
    #[error("the task is no longer running")]
    Stopped,
}

/// A backend's configuration does not allow it to start.
#[derive(Debug, thiserror::Error)]
pub enum AgentBuildError {
    #[error("{field} is required: {why}")]
    Missing {
        field: &'static str,
        why: &'static str,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("{field} {value:?} is not a URL: {source}")]
    BadUrl {
        field: &'static str,
        value: String,
        source: crate::client::UrlError,
    },
    #[error("HTTP client: {0}")]
    Client(#[source] reqwest::Error),
}

/// Where a backend writes its events. Sending fails once the task was canceled or timed out.
#[derive(Clone)]
pub struct AgentSink(mpsc::Sender<AgentEvent>);

impl AgentSink {
    pub fn channel(buffer: usize) -> (AgentSink, mpsc::Receiver<AgentEvent>) {
        let (tx, rx) = mpsc::channel(buffer);
        (AgentSink(tx), rx)
    }

    pub async fn send(&self, event: AgentEvent) -> Result<(), AgentError> {
        self.0.send(event).await.map_err(|_| AgentError::Stopped)
    }

    pub async fn text(&self, text: impl Into<String>) -> Result<(), AgentError> {
        self.send(AgentEvent::Text(text.into())).await
    }
}

pub trait Agent: Send + Sync + 'static {
    /// The backend's name, as in `agent.kind` and metric labels.
    fn kind(&self) -> &'static str;

    /// Whether this backend may answer with a plain message; streams then wait for its first event.
    fn may_answer_with_message(&self) -> bool {
        false
    }

    /// A one-line description for the agent card, unless configured.
    fn description(&self) -> String;

    fn run(
        &self,
        request: AgentRequest,
        sink: AgentSink,
    ) -> BoxFuture<'static, Result<(), AgentError>>;
}

pub type SharedAgent = Arc<dyn Agent>;
