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

/// Joins a principal to a tenant in the principal the engine and store see. No principal holds
/// a control character (both kinds of credentials refuse them) and no tenant name does, so the
/// joined name is that pair's alone: the same contextId in two tenants is two conversations.
const TENANT_SEPARATOR: char = '\u{1f}';

/// Words a tenant may not be: the first segments of the routes `/{tenant}/…` sits beside.
const ROUTE_WORDS: [&str; 6] = [
    "tasks",
    "v1",
    "message:send",
    "message:stream",
    "extendedAgentCard",
    "_colloquy",
];

/// What [`is_tenant_name`] asks, in words for error messages.
pub const TENANT_NAME_RULE: &str = "1 to 64 of A-Z, a-z, 0-9, '.', '_', '-', not starting with '.', not a route word such as \"tasks\"";

/// A tenant name: short, URL-safe, and not a word the routes beside `/{tenant}/…` start with.
pub fn is_tenant_name(tenant: &str) -> bool {
    (1..=64).contains(&tenant.len())
        && tenant
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && !ROUTE_WORDS.contains(&tenant)
        && !tenant.starts_with('.')
}

/// The principal the engine and store see for `principal` in `tenant` (none or empty: the
/// default tenant, the principal itself).
pub fn principal_in_tenant(principal: &str, tenant: Option<&str>) -> String {
    match tenant.filter(|tenant| !tenant.is_empty()) {
        Some(tenant) => format!("{principal}{TENANT_SEPARATOR}{tenant}"),
        None => principal.to_owned(),
    }
}

/// The tenant a stored principal is in ([`principal_in_tenant`]), if any.
pub fn tenant_of(principal: &str) -> Option<&str> {
    principal
        .split_once(TENANT_SEPARATOR)
        .map(|(_, tenant)| tenant)
}

/// Milliseconds-precision UTC "now", the precision every timestamp on the wire carries.
pub fn now() -> DateTime<Utc> {
    let now = Utc::now();
    DateTime::from_timestamp_millis(now.timestamp_millis()).unwrap_or(now)
}

/// ISO 8601 UTC with milliseconds and a `Z`, as A2A wants.
pub fn format_time(t: &DateTime<Utc>) -> String {
    match rfc3339(t, SecondsFormat::Millis) {
        Some((bytes, len)) => String::from_utf8_lossy(&bytes[..len]).into_owned(),
        None => t.to_rfc3339_opts(SecondsFormat::Millis, true),
    }
}

/// Serializes a timestamp as chrono does (RFC 3339, `Z`, as many fraction digits as it needs:
/// none, 3, 6 or 9), without chrono's formatting machinery, which wrote each character through
/// the JSON escaper (a few thousand instructions a timestamp, several timestamps a turn).
fn serialize_time<S: serde::Serializer>(
    t: &DateTime<Utc>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match rfc3339(t, SecondsFormat::AutoSi) {
        Some((bytes, len)) => {
            serializer.serialize_str(std::str::from_utf8(&bytes[..len]).unwrap_or_default())
        }
        None => t.serialize(serializer),
    }
}

fn serialize_optional_time<S: serde::Serializer>(
    t: &Option<DateTime<Utc>>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => serialize_time(t, serializer),
        None => serializer.serialize_none(),
    }
}

/// `t` as `to_rfc3339_opts(format, true)` writes it, for years 0 to 9999 outside leap seconds
/// (None otherwise: the caller asks chrono). `format` is `Millis` or `AutoSi`.
fn rfc3339(t: &DateTime<Utc>, format: SecondsFormat) -> Option<([u8; 32], usize)> {
    use chrono::{Datelike, Timelike};
    let (date, time) = (t.date_naive(), t.time());
    let year = u32::try_from(date.year())
        .ok()
        .filter(|year| *year <= 9999)?;
    let nanos = time.nanosecond();
    if nanos >= 1_000_000_000 {
        return None;
    }
    let mut out = *b"0000-00-00T00:00:00.000000000Z\0\0";
    put_digits(&mut out[0..4], year);
    put_digits(&mut out[5..7], date.month());
    put_digits(&mut out[8..10], date.day());
    put_digits(&mut out[11..13], time.hour());
    put_digits(&mut out[14..16], time.minute());
    put_digits(&mut out[17..19], time.second());
    let fraction = match format {
        SecondsFormat::Millis => 3,
        _ if nanos == 0 => 0,
        _ if nanos.is_multiple_of(1_000_000) => 3,
        _ if nanos.is_multiple_of(1_000) => 6,
        _ => 9,
    };
    let mut end = 19;
    if fraction > 0 {
        put_digits(&mut out[20..29], nanos);
        end = 20 + fraction;
    }
    out[end] = b'Z';
    Some((out, end + 1))
}

/// Writes the last `out.len()` decimal digits of `value` into `out`.
fn put_digits(out: &mut [u8], mut value: u32) {
    for digit in out.iter_mut().rev() {
        *digit = b'0' + (value % 10) as u8;
        value /= 10;
    }
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
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "serialize_optional_time"
    )]
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
    #[serde(serialize_with = "serialize_time")]
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

impl Artifact {
    /// Its text parts, concatenated (a streamed reply's chunks are its parts).
    pub fn text(&self) -> String {
        self.parts.iter().filter_map(Part::as_text).collect()
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    /// The hand-written format is chrono's, byte for byte, in every fraction class and at the
    /// edges of the years it covers; outside them chrono writes it.
    #[test]
    fn timestamps_are_written_as_chrono_writes_them() {
        let mut instants = vec![
            Utc.with_ymd_and_hms(0, 1, 1, 0, 0, 0).unwrap(),
            Utc.with_ymd_and_hms(9999, 12, 31, 23, 59, 59).unwrap(),
            Utc.with_ymd_and_hms(10000, 1, 1, 0, 0, 0).unwrap(),
            Utc.with_ymd_and_hms(-1, 6, 1, 12, 0, 0).unwrap(),
            now(),
        ];
        for i in 0..4000u32 {
            let secs = rand::random::<i64>().rem_euclid(253_402_300_800);
            let nanos = match i % 4 {
                0 => 0,
                1 => rand::random::<u32>() % 1000 * 1_000_000,
                2 => rand::random::<u32>() % 1_000_000 * 1_000,
                _ => rand::random::<u32>() % 1_000_000_000,
            };
            instants.extend(DateTime::from_timestamp(secs, nanos));
        }
        for t in instants {
            assert_eq!(
                format_time(&t),
                t.to_rfc3339_opts(SecondsFormat::Millis, true)
            );
            let status = TaskStatus {
                state: TaskState::Working,
                message: None,
                timestamp: t,
            };
            let ours = serde_json::to_value(&status).unwrap();
            assert_eq!(ours["timestamp"], serde_json::to_value(t).unwrap(), "{t:?}");
            let back: TaskStatus = serde_json::from_value(ours).unwrap();
            assert_eq!(back.timestamp, t);
        }
    }
}
