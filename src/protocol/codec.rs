//! The two wire versions as two mappings onto the one internal model: the entry points, each
//! picking the version's own typed mapping ([`super::v1`], [`super::v03`]) once, and the role and
//! state spellings both share.
//!
//! The versions differ in role and state spellings, `kind` discriminators (v0.3), part shapes
//! (`raw`/`url`/`filename`/`mediaType` in v1.0, `file:{bytes|uri, name, mimeType}` in v0.3), and
//! wrappers (`{"task":..}` results and `{"statusUpdate":..}` events in v1.0, bare objects in v0.3).

use super::WireVersion;
use super::fields::{FieldResult, field_error};
pub use crate::model::TaskView;
use crate::model::{
    Artifact, Message, Part, Role, SendResult, StreamItem, Task, TaskEvent, TaskState, TaskStatus,
};
use serde_json::Value;

pub fn role_name(version: WireVersion, role: Role) -> &'static str {
    match (version, role) {
        (WireVersion::V1, Role::User) => "ROLE_USER",
        (WireVersion::V1, Role::Agent) => "ROLE_AGENT",
        (WireVersion::V03, Role::User) => "user",
        (WireVersion::V03, Role::Agent) => "agent",
    }
}

/// The problem with a role name `version` does not know, naming the ones it does.
pub fn unknown_role(version: WireVersion, name: &str) -> String {
    format!(
        "unknown role {name:?} (A2A {} spells it {:?} or {:?})",
        version.label(),
        role_name(version, Role::User),
        role_name(version, Role::Agent)
    )
}

pub fn parse_role(version: WireVersion, name: &str) -> Option<Role> {
    [Role::User, Role::Agent]
        .into_iter()
        .find(|r| role_name(version, *r) == name)
}

pub fn state_name(version: WireVersion, state: TaskState) -> &'static str {
    match version {
        WireVersion::V03 => state.as_str(),
        WireVersion::V1 => match state {
            TaskState::Submitted => "TASK_STATE_SUBMITTED",
            TaskState::Working => "TASK_STATE_WORKING",
            TaskState::InputRequired => "TASK_STATE_INPUT_REQUIRED",
            TaskState::AuthRequired => "TASK_STATE_AUTH_REQUIRED",
            TaskState::Completed => "TASK_STATE_COMPLETED",
            TaskState::Failed => "TASK_STATE_FAILED",
            TaskState::Canceled => "TASK_STATE_CANCELED",
            TaskState::Rejected => "TASK_STATE_REJECTED",
        },
    }
}

pub fn parse_state(version: WireVersion, name: &str) -> Option<TaskState> {
    TaskState::ALL
        .into_iter()
        .find(|s| state_name(version, *s) == name)
}

/// The messages of `task`'s history that `view` shows: the most recent `history_length`.
pub fn history_view(task: &Task, view: TaskView) -> &[Message] {
    let skip = view
        .history_length
        .map_or(0, |n| task.history.len().saturating_sub(n));
    &task.history[skip..]
}

/// A wire type as JSON. Our wire types have string keys and no fallible serializers, so this
/// cannot fail; `null` stands in if it ever did.
pub(super) fn to_json(value: impl serde::Serialize) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// A result written as JSON text at once (so valid JSON). A sent message's answer, the hottest
/// of all, skips the `Value` tree: building, serializing and dropping it cost more than writing
/// the text ([`crate::json`]).
#[derive(Debug, Clone)]
pub struct JsonText(Vec<u8>);

impl JsonText {
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

/// A wire type as JSON text.
pub(super) fn to_text(value: impl serde::Serialize) -> JsonText {
    // Sized for a usual task, so that it is written without growing the buffer again and again.
    JsonText(crate::json::to_vec(&value, 4096))
}

// ---- decoding ----

/// A Message, each version by its own typed mapping ([`super::v1`], [`super::v03`]).
pub fn decode_message(version: WireVersion, value: &Value, path: &str) -> FieldResult<Message> {
    match version {
        WireVersion::V1 => super::v1::decode_message(value, path),
        WireVersion::V03 => super::v03::decode_message(value, path),
    }
}

pub fn decode_part(version: WireVersion, value: &Value, path: &str) -> FieldResult<Part> {
    match version {
        WireVersion::V1 => super::v1::decode_part(value, path),
        WireVersion::V03 => super::v03::decode_part(value, path),
    }
}

// ---- encoding: each version by its own typed mapping ([`super::v1`], [`super::v03`]) ----

pub fn encode_part(version: WireVersion, part: &Part) -> Value {
    match version {
        WireVersion::V1 => super::v1::encode_part(part),
        WireVersion::V03 => super::v03::encode_part(part),
    }
}

pub fn encode_message(version: WireVersion, message: &Message) -> Value {
    match version {
        WireVersion::V1 => super::v1::encode_message(message),
        WireVersion::V03 => super::v03::encode_message(message),
    }
}

pub fn encode_artifact(version: WireVersion, artifact: &Artifact) -> Value {
    match version {
        WireVersion::V1 => super::v1::encode_artifact(artifact),
        WireVersion::V03 => super::v03::encode_artifact(artifact),
    }
}

pub fn encode_task(version: WireVersion, task: &Task, view: TaskView) -> Value {
    match version {
        WireVersion::V1 => super::v1::encode_task(task, view),
        WireVersion::V03 => super::v03::encode_task(task, view),
    }
}

/// `{"task":..}` / `{"message":..}` in v1.0; the bare object in v0.3.
pub fn encode_send_result(version: WireVersion, result: &SendResult, view: TaskView) -> JsonText {
    match version {
        WireVersion::V1 => super::v1::encode_send_result(result, view),
        WireVersion::V03 => super::v03::encode_send_result(result, view),
    }
}

pub fn encode_event(version: WireVersion, event: &TaskEvent) -> Value {
    match version {
        WireVersion::V1 => super::v1::encode_event(event),
        WireVersion::V03 => super::v03::encode_event(event),
    }
}

pub fn encode_stream_item(version: WireVersion, item: &StreamItem, view: TaskView) -> Value {
    match version {
        WireVersion::V1 => super::v1::encode_stream_item(item, view),
        WireVersion::V03 => super::v03::encode_stream_item(item, view),
    }
}

// ---- decoding results (the client side: what a peer answers) ----

pub fn decode_status(version: WireVersion, value: &Value, path: &str) -> FieldResult<TaskStatus> {
    match version {
        WireVersion::V1 => super::v1::decode_status(value, path),
        WireVersion::V03 => super::v03::decode_status(value, path),
    }
}

pub fn decode_task(version: WireVersion, value: &Value, path: &str) -> FieldResult<Task> {
    match version {
        WireVersion::V1 => super::v1::decode_task(value, path),
        WireVersion::V03 => super::v03::decode_task(value, path),
    }
}

/// A `SendMessage` / `message/send` result, or one stream event's `result`.
pub fn decode_stream_item(version: WireVersion, value: &Value) -> FieldResult<StreamItem> {
    match version {
        WireVersion::V1 => super::v1::decode_stream_item(value),
        WireVersion::V03 => super::v03::decode_stream_item(value),
    }
}

/// A send result: a Task or a Message.
pub fn decode_send_result(version: WireVersion, value: &Value) -> FieldResult<SendResult> {
    match decode_stream_item(version, value)? {
        StreamItem::Task(task) => Ok(SendResult::Task(task)),
        StreamItem::Message(message) => Ok(SendResult::Message(message)),
        StreamItem::Event(_) => Err(field_error(
            "result",
            "expected a Task or a Message, got a stream event",
        )),
    }
}
