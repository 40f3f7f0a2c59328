//! The internal model: messages, tasks and the events a task emits.
//!
//! Independent of wire versions: `protocol::v1` and `protocol::v03` map onto these types.
//! Stores persist them with serde (PostgreSQL as JSON; the embedded store's push records,
//! and the records of its earlier versions it still reads), so field renames here are storage
//! format changes. The embedded store's messages, tasks and conversations have stored forms of
//! their own (`store/embedded/compact.rs`).

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub type Metadata = Map<String, Value>;

/// The principal of requests when no authentication is configured.
pub const ANONYMOUS: &str = "anonymous";

/// Milliseconds-precision UTC "now", the precision every timestamp on the wire carries.
pub fn now() -> DateTime<Utc> {
    let now = Utc::now();
    DateTime::from_timestamp_millis(now.timestamp_millis()).unwrap_or(now)
}

/// ISO 8601 UTC with milliseconds and a `Z`, as A2A wants.
pub fn format_time(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    User,
    Agent,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum PartContent {
    Text {
        text: String,
    },
    /// File content carried inline, kept as the base64 text it arrived in.
    FileBytes {
        base64: String,
    },
    FileUrl {
        url: String,
    },
    Data {
        data: Value,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Part {
    pub content: PartContent,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
}

impl Part {
    pub fn text(text: impl Into<String>) -> Self {
        Part {
            content: PartContent::Text { text: text.into() },
            media_type: None,
            name: None,
            metadata: None,
        }
    }

    pub fn as_text(&self) -> Option<&str> {
        match &self.content {
            PartContent::Text { text } => Some(text),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub message_id: String,
    pub role: Role,
    pub parts: Vec<Part>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reference_task_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<String>,
    /// When the server received (user) or produced (agent) the message. Not on the wire.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<DateTime<Utc>>,
}

impl Message {
    pub fn agent_text(text: impl Into<String>, context_id: &str, task_id: Option<&str>) -> Self {
        Message {
            message_id: uuid::Uuid::new_v4().to_string(),
            role: Role::Agent,
            parts: vec![Part::text(text)],
            context_id: Some(context_id.to_owned()),
            task_id: task_id.map(str::to_owned),
            reference_task_ids: Vec::new(),
            metadata: None,
            extensions: Vec::new(),
            timestamp: Some(now()),
        }
    }

    /// The text parts joined by newlines: what history rendering and agents read.
    pub fn text(&self) -> String {
        let texts: Vec<&str> = self.parts.iter().filter_map(Part::as_text).collect();
        texts.join("\n")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TaskState {
    Submitted,
    Working,
    InputRequired,
    AuthRequired,
    Completed,
    Failed,
    Canceled,
    Rejected,
}

impl TaskState {
    /// In the order of their codes ([`TaskState::code`]), which stored records and indexes hold:
    /// append new states, never reorder.
    pub const ALL: [TaskState; 8] = [
        TaskState::Submitted,
        TaskState::Working,
        TaskState::InputRequired,
        TaskState::AuthRequired,
        TaskState::Completed,
        TaskState::Failed,
        TaskState::Canceled,
        TaskState::Rejected,
    ];

    /// No more messages are accepted and nothing will change.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Completed | TaskState::Failed | TaskState::Canceled | TaskState::Rejected
        )
    }

    /// Waiting for the client: the context is not busy and the task continues by its id.
    pub fn is_interrupted(self) -> bool {
        matches!(self, TaskState::InputRequired | TaskState::AuthRequired)
    }

    /// A blocking send returns, and a stream closes, in these states.
    pub fn ends_turn(self) -> bool {
        self.is_terminal() || self.is_interrupted()
    }

    /// The v0.3 spelling, also used in logs, metrics labels and the exec protocol.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Submitted => "submitted",
            TaskState::Working => "working",
            TaskState::InputRequired => "input-required",
            TaskState::AuthRequired => "auth-required",
            TaskState::Completed => "completed",
            TaskState::Failed => "failed",
            TaskState::Canceled => "canceled",
            TaskState::Rejected => "rejected",
        }
    }

    pub fn code(self) -> u8 {
        TaskState::ALL.iter().position(|s| *s == self).unwrap_or(0) as u8
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskStatus {
    pub state: TaskState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<Message>,
    pub timestamp: DateTime<Utc>,
}

impl TaskStatus {
    pub fn new(state: TaskState, message: Option<Message>) -> Self {
        TaskStatus {
            state,
            message,
            timestamp: now(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Artifact {
    pub artifact_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub parts: Vec<Part>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    pub id: String,
    pub context_id: String,
    pub status: TaskStatus,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<Artifact>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<Message>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
}

impl Task {
    /// Keeps only the `limit` most recent history messages (`None` keeps all).
    pub fn trim_history(&mut self, limit: Option<usize>) {
        if let Some(limit) = limit {
            let drop = self.history.len().saturating_sub(limit);
            self.history.drain(..drop);
        }
    }
}

/// What a running task emits, in order, to every stream following it.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskEvent {
    Status {
        task_id: String,
        context_id: String,
        status: TaskStatus,
        /// The last event of the stream (terminal or interrupted).
        is_final: bool,
    },
    Artifact {
        task_id: String,
        context_id: String,
        artifact: Artifact,
        append: bool,
        last_chunk: bool,
    },
}

/// What a stream writes, in order: the task (or a plain message), then its events.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamItem {
    Task(Task),
    Message(Message),
    Event(TaskEvent),
}

/// The result of a send: a task, or (for agents that answer without one) a plain message.
#[derive(Debug, Clone, PartialEq)]
pub enum SendResult {
    Task(Task),
    Message(Message),
}

/// How much of a task to show: `history_length` most recent messages (None = all), artifacts or
/// not. The engine loads no more than this; the codec encodes no more than this.
#[derive(Debug, Clone, Copy)]
pub struct TaskView {
    pub history_length: Option<usize>,
    pub artifacts: bool,
}

impl TaskView {
    pub const FULL: TaskView = TaskView {
        history_length: None,
        artifacts: true,
    };
}

/// A webhook registered for a task's push notifications (either wire version's config).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushConfig {
    pub id: String,
    pub task_id: String,
    pub url: String,
    /// Sent back in `X-A2A-Notification-Token`.
    #[serde(default)]
    pub token: Option<String>,
    #[serde(default)]
    pub authentication: Option<PushAuth>,
    /// The wire version the config was registered with ("1.0" or "0.3"): notifications carry
    /// the task as that version spells it.
    pub wire_version: String,
}

/// How colloquy authenticates to a webhook: `Authorization: <scheme> <credentials>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushAuth {
    pub schemes: Vec<String>,
    #[serde(default)]
    pub credentials: Option<String>,
}
