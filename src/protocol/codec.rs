//! The two wire versions as two mappings onto the one internal model.
//!
//! Differences handled here: role and state spellings, `kind` discriminators (v0.3), part shapes
//! (`raw`/`url`/`filename`/`mediaType` in v1.0, `file:{bytes|uri, name, mimeType}` in v0.3), and
//! wrappers (`{"task":..}` results and `{"statusUpdate":..}` events in v1.0, bare objects in v0.3).

use super::WireVersion;
use super::fields::{FieldResult, field_error};
pub use crate::model::TaskView;
use crate::model::{
    Artifact, Message, Part, PartContent, Role, SendResult, StreamItem, Task, TaskEvent, TaskState,
    TaskStatus, format_time,
};
use serde_json::{Map, Value, json};

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

fn insert_opt(map: &mut Map<String, Value>, key: &str, value: Option<Value>) {
    if let Some(value) = value {
        map.insert(key.to_owned(), value);
    }
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

// ---- encoding ----

pub fn encode_part(version: WireVersion, part: &Part) -> Value {
    if version == WireVersion::V1 {
        return super::v1::encode_part(part);
    }
    let mut map = Map::new();
    match version {
        WireVersion::V1 => {
            match &part.content {
                PartContent::Text { text } => map.insert("text".into(), json!(text)),
                PartContent::FileBytes { base64 } => map.insert("raw".into(), json!(base64)),
                PartContent::FileUrl { url } => map.insert("url".into(), json!(url)),
                PartContent::Data { data } => map.insert("data".into(), data.clone()),
            };
            insert_opt(&mut map, "filename", part.name.as_ref().map(|n| json!(n)));
            insert_opt(
                &mut map,
                "mediaType",
                part.media_type.as_ref().map(|m| json!(m)),
            );
        }
        WireVersion::V03 => match &part.content {
            PartContent::Text { text } => {
                map.insert("kind".into(), json!("text"));
                map.insert("text".into(), json!(text));
            }
            PartContent::Data { data } => {
                map.insert("kind".into(), json!("data"));
                // v0.3 data parts hold an object; other JSON values are wrapped.
                let data = match data {
                    Value::Object(_) => data.clone(),
                    other => json!({ "value": other }),
                };
                map.insert("data".into(), data);
            }
            PartContent::FileBytes { .. } | PartContent::FileUrl { .. } => {
                let mut file = Map::new();
                match &part.content {
                    PartContent::FileBytes { base64 } => file.insert("bytes".into(), json!(base64)),
                    PartContent::FileUrl { url } => file.insert("uri".into(), json!(url)),
                    _ => None,
                };
                insert_opt(&mut file, "name", part.name.as_ref().map(|n| json!(n)));
                insert_opt(
                    &mut file,
                    "mimeType",
                    part.media_type.as_ref().map(|m| json!(m)),
                );
                map.insert("kind".into(), json!("file"));
                map.insert("file".into(), Value::Object(file));
            }
        },
    }
    insert_opt(
        &mut map,
        "metadata",
        part.metadata.clone().map(Value::Object),
    );
    Value::Object(map)
}

fn encode_parts(version: WireVersion, parts: &[Part]) -> Value {
    Value::Array(parts.iter().map(|p| encode_part(version, p)).collect())
}

pub fn encode_message(version: WireVersion, message: &Message) -> Value {
    if version == WireVersion::V1 {
        return super::v1::encode_message(message);
    }
    let mut map = Map::new();
    if version == WireVersion::V03 {
        map.insert("kind".into(), json!("message"));
    }
    map.insert("messageId".into(), json!(message.message_id));
    map.insert("role".into(), json!(role_name(version, message.role)));
    map.insert("parts".into(), encode_parts(version, &message.parts));
    insert_opt(
        &mut map,
        "contextId",
        message.context_id.as_ref().map(|c| json!(c)),
    );
    insert_opt(
        &mut map,
        "taskId",
        message.task_id.as_ref().map(|t| json!(t)),
    );
    if !message.reference_task_ids.is_empty() {
        map.insert("referenceTaskIds".into(), json!(message.reference_task_ids));
    }
    if !message.extensions.is_empty() {
        map.insert("extensions".into(), json!(message.extensions));
    }
    insert_opt(
        &mut map,
        "metadata",
        message.metadata.clone().map(Value::Object),
    );
    Value::Object(map)
}

fn encode_status(version: WireVersion, status: &TaskStatus) -> Value {
    let mut map = Map::new();
    map.insert("state".into(), json!(state_name(version, status.state)));
    insert_opt(
        &mut map,
        "message",
        status.message.as_ref().map(|m| encode_message(version, m)),
    );
    map.insert("timestamp".into(), json!(format_time(&status.timestamp)));
    Value::Object(map)
}

pub fn encode_artifact(version: WireVersion, artifact: &Artifact) -> Value {
    if version == WireVersion::V1 {
        return super::v1::encode_artifact(artifact);
    }
    let mut map = Map::new();
    map.insert("artifactId".into(), json!(artifact.artifact_id));
    insert_opt(&mut map, "name", artifact.name.as_ref().map(|n| json!(n)));
    insert_opt(
        &mut map,
        "description",
        artifact.description.as_ref().map(|d| json!(d)),
    );
    map.insert("parts".into(), encode_parts(version, &artifact.parts));
    insert_opt(
        &mut map,
        "metadata",
        artifact.metadata.clone().map(Value::Object),
    );
    Value::Object(map)
}

pub fn encode_task(version: WireVersion, task: &Task, view: TaskView) -> Value {
    if version == WireVersion::V1 {
        return super::v1::encode_task(task, view);
    }
    let mut map = Map::new();
    if version == WireVersion::V03 {
        map.insert("kind".into(), json!("task"));
    }
    map.insert("id".into(), json!(task.id));
    map.insert("contextId".into(), json!(task.context_id));
    map.insert("status".into(), encode_status(version, &task.status));
    if view.artifacts && !task.artifacts.is_empty() {
        let artifacts = task
            .artifacts
            .iter()
            .map(|a| encode_artifact(version, a))
            .collect();
        map.insert("artifacts".into(), Value::Array(artifacts));
    }
    let skip = view
        .history_length
        .map_or(0, |n| task.history.len().saturating_sub(n));
    let history: Vec<Value> = task.history[skip..]
        .iter()
        .map(|m| encode_message(version, m))
        .collect();
    if !history.is_empty() {
        map.insert("history".into(), Value::Array(history));
    }
    insert_opt(
        &mut map,
        "metadata",
        task.metadata.clone().map(Value::Object),
    );
    Value::Object(map)
}

/// `{"task":..}` / `{"message":..}` in v1.0; the bare object in v0.3.
fn wrap(version: WireVersion, key: &str, value: Value) -> Value {
    match version {
        WireVersion::V1 => json!({ key: value }),
        WireVersion::V03 => value,
    }
}

pub fn encode_send_result(version: WireVersion, result: &SendResult, view: TaskView) -> Value {
    if version == WireVersion::V1 {
        return super::v1::encode_send_result(result, view);
    }
    match result {
        SendResult::Task(task) => wrap(version, "task", encode_task(version, task, view)),
        SendResult::Message(message) => wrap(version, "message", encode_message(version, message)),
    }
}

pub fn encode_event(version: WireVersion, event: &TaskEvent) -> Value {
    if version == WireVersion::V1 {
        return super::v1::encode_event(event);
    }
    match event {
        TaskEvent::Status {
            task_id,
            context_id,
            status,
            is_final,
        } => {
            let mut map = Map::new();
            if version == WireVersion::V03 {
                map.insert("kind".into(), json!("status-update"));
                map.insert("final".into(), json!(is_final));
            }
            map.insert("taskId".into(), json!(task_id));
            map.insert("contextId".into(), json!(context_id));
            map.insert("status".into(), encode_status(version, status));
            wrap(version, "statusUpdate", Value::Object(map))
        }
        TaskEvent::Artifact {
            task_id,
            context_id,
            artifact,
            append,
            last_chunk,
        } => {
            let mut map = Map::new();
            if version == WireVersion::V03 {
                map.insert("kind".into(), json!("artifact-update"));
            }
            map.insert("taskId".into(), json!(task_id));
            map.insert("contextId".into(), json!(context_id));
            map.insert("artifact".into(), encode_artifact(version, artifact));
            if *append {
                map.insert("append".into(), json!(true));
            }
            if *last_chunk {
                map.insert("lastChunk".into(), json!(true));
            }
            wrap(version, "artifactUpdate", Value::Object(map))
        }
    }
}

pub fn encode_stream_item(version: WireVersion, item: &StreamItem, view: TaskView) -> Value {
    if version == WireVersion::V1 {
        return super::v1::encode_stream_item(item, view);
    }
    match item {
        StreamItem::Task(task) => wrap(version, "task", encode_task(version, task, view)),
        StreamItem::Message(message) => wrap(version, "message", encode_message(version, message)),
        StreamItem::Event(event) => encode_event(version, event),
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
