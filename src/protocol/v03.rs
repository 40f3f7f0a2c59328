//! A2A v0.3's wire types where they differ from v1.0's (see [`super::params`] for the rest).

use super::WireVersion;
use super::codec;
use super::fields::{FieldResult, PartError, field_error};
use super::out::{self, PartShape};
use super::params::{self, Base64, Params, SendRequest, decode_at};
use crate::model::{
    Artifact, Message, Metadata, Part, PartContent, Role, SendResult, StreamItem, Task, TaskEvent,
    TaskState, TaskStatus, TaskView,
};
use chrono::{DateTime, Utc};
use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `MessageSendParams`: the params of `message/send` and `message/stream`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageSendParams {
    message: WireMessage,
    configuration: Option<MessageSendConfiguration>,
}

/// `MessageSendConfiguration`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MessageSendConfiguration {
    #[serde(default, deserialize_with = "super::params::count")]
    history_length: Option<u64>,
    /// Wait for the turn to end (the default) or answer at once.
    blocking: Option<bool>,
    push_notification_config: Option<Value>,
    /// The v1.0 spelling, also refused rather than ignored.
    task_push_notification_config: Option<Value>,
}

impl MessageSendParams {
    pub fn read(params: &Params) -> FieldResult<SendRequest> {
        let request: MessageSendParams = params.decode()?;
        let configuration = request.configuration;
        Ok(SendRequest {
            message: request.message.into(),
            return_immediately: !configuration
                .as_ref()
                .and_then(|c| c.blocking)
                .unwrap_or(true),
            history_length: configuration.as_ref().and_then(|c| c.history_length),
            push_notification: configuration.is_some_and(|c| {
                c.push_notification_config.is_some() || c.task_push_notification_config.is_some()
            }),
        })
    }
}

/// A role as v0.3 spells it (`user`, `agent`).
#[derive(Debug)]
struct WireRole(Role);

impl<'de> Deserialize<'de> for WireRole {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        codec::parse_role(WireVersion::V03, &name)
            .map(WireRole)
            .ok_or_else(|| de::Error::custom(codec::unknown_role(WireVersion::V03, &name)))
    }
}

/// A `kind` discriminator that must say `"message"` when present.
#[derive(Debug)]
struct MessageKind;

impl<'de> Deserialize<'de> for MessageKind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let kind = String::deserialize(deserializer)?;
        if kind == "message" {
            Ok(MessageKind)
        } else {
            Err(de::Error::custom(format!(
                "expected \"message\", got {kind:?}"
            )))
        }
    }
}

/// `Message` (`kind: "message"`, optional on the way in).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", expecting = "a Message object")]
struct WireMessage {
    #[serde(rename = "kind")]
    _kind: Option<MessageKind>,
    message_id: String,
    role: WireRole,
    parts: Vec<WirePart>,
    context_id: Option<String>,
    task_id: Option<String>,
    reference_task_ids: Option<Vec<String>>,
    metadata: Option<Metadata>,
    extensions: Option<Vec<String>>,
}

/// `FilePart.file`: `FileWithBytes` or `FileWithUri`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", expecting = "a file object")]
struct WireFile {
    bytes: Option<Base64>,
    uri: Option<String>,
    mime_type: Option<String>,
    name: Option<String>,
}

/// `Part`: `TextPart`, `FilePart` or `DataPart`, told apart by `kind` (or, without one, by
/// which content field is there).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", expecting = "a Part object")]
struct RawPart {
    kind: Option<String>,
    text: Option<String>,
    file: Option<WireFile>,
    data: Option<Value>,
    metadata: Option<Metadata>,
}

#[derive(Debug, Deserialize)]
#[serde(try_from = "RawPart")]
struct WirePart(Part);

impl TryFrom<RawPart> for WirePart {
    type Error = PartError;

    fn try_from(raw: RawPart) -> Result<Self, PartError> {
        let kind = match raw.kind.as_deref() {
            Some(kind) => kind,
            None if raw.text.is_some() => "text",
            None if raw.file.is_some() => "file",
            None if raw.data.is_some() => "data",
            None => return Err("kind: is required (\"text\", \"file\" or \"data\")".into()),
        };
        let mut part = match kind {
            "text" => Part::text(raw.text.ok_or("text: is required")?),
            "data" => match raw.data {
                Some(Value::Object(data)) => Part {
                    content: PartContent::Data {
                        data: Value::Object(data),
                    },
                    media_type: None,
                    name: None,
                    metadata: None,
                },
                Some(_) => return Err("data: expected an object".into()),
                None => return Err("data: is required".into()),
            },
            "file" => {
                let file = raw.file.ok_or("file: is required")?;
                let content = match (file.bytes, file.uri) {
                    (Some(Base64(base64)), None) => PartContent::FileBytes { base64 },
                    (None, Some(url)) => PartContent::FileUrl { url },
                    _ => return Err("file: a file needs exactly one of bytes or uri".into()),
                };
                Part {
                    content,
                    media_type: file.mime_type,
                    name: file.name,
                    metadata: None,
                }
            }
            other => {
                return Err(format!(
                    "kind: unknown part kind {other:?} (expected \"text\", \"file\" or \"data\")"
                )
                .into());
            }
        };
        part.metadata = raw.metadata;
        Ok(WirePart(part))
    }
}

/// A v0.3 `Message` found at `at`.
pub fn decode_message(value: &Value, at: &str) -> FieldResult<Message> {
    decode_at::<WireMessage>(value, at).map(Message::from)
}

/// A v0.3 `Part` found at `at`.
pub fn decode_part(value: &Value, at: &str) -> FieldResult<Part> {
    decode_at::<WirePart>(value, at).map(|p| p.0)
}

// ---- results (what a v0.3 peer answers; the client side) ----

/// A `kind` discriminator that must name one object kind when present.
macro_rules! kind_tag {
    ($name:ident, $kind:literal) => {
        #[derive(Debug)]
        struct $name;

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let kind = String::deserialize(deserializer)?;
                if kind == $kind {
                    Ok($name)
                } else {
                    Err(de::Error::custom(format!(
                        "expected {:?}, got {kind:?}",
                        $kind
                    )))
                }
            }
        }
    };
}

kind_tag!(TaskKind, "task");
kind_tag!(StatusUpdateKind, "status-update");
kind_tag!(ArtifactUpdateKind, "artifact-update");

impl From<WireMessage> for Message {
    fn from(wire: WireMessage) -> Message {
        Message {
            message_id: wire.message_id,
            role: wire.role.0,
            parts: wire.parts.into_iter().map(|p| p.0).collect(),
            context_id: wire.context_id,
            task_id: wire.task_id,
            reference_task_ids: wire.reference_task_ids.unwrap_or_default(),
            metadata: wire.metadata,
            extensions: wire.extensions.unwrap_or_default(),
            timestamp: None,
        }
    }
}

fn state<'de, D: Deserializer<'de>>(deserializer: D) -> Result<TaskState, D::Error> {
    params::task_state(WireVersion::V03, deserializer)
}

/// `TaskStatus`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", expecting = "a TaskStatus object")]
struct WireStatus {
    #[serde(deserialize_with = "state")]
    state: TaskState,
    message: Option<WireMessage>,
    #[serde(default, deserialize_with = "params::wire_time")]
    timestamp: Option<DateTime<Utc>>,
}

impl From<WireStatus> for TaskStatus {
    fn from(wire: WireStatus) -> TaskStatus {
        TaskStatus {
            state: wire.state,
            message: wire.message.map(Message::from),
            // A first Task without a timestamp happened now, as far as we know.
            timestamp: wire.timestamp.unwrap_or_else(crate::model::now),
        }
    }
}

/// `Artifact`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", expecting = "an Artifact object")]
struct WireArtifact {
    artifact_id: String,
    name: Option<String>,
    description: Option<String>,
    parts: Vec<WirePart>,
    metadata: Option<Metadata>,
}

impl From<WireArtifact> for Artifact {
    fn from(wire: WireArtifact) -> Artifact {
        Artifact {
            artifact_id: wire.artifact_id,
            name: wire.name,
            description: wire.description,
            parts: wire.parts.into_iter().map(|p| p.0).collect(),
            metadata: wire.metadata,
        }
    }
}

/// `Task` (`kind: "task"`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", expecting = "a Task object")]
struct WireTask {
    #[serde(rename = "kind")]
    _kind: Option<TaskKind>,
    id: String,
    context_id: String,
    status: WireStatus,
    artifacts: Option<Vec<WireArtifact>>,
    history: Option<Vec<WireMessage>>,
    metadata: Option<Metadata>,
}

impl From<WireTask> for Task {
    fn from(wire: WireTask) -> Task {
        Task {
            id: wire.id,
            context_id: wire.context_id,
            status: wire.status.into(),
            artifacts: wire
                .artifacts
                .unwrap_or_default()
                .into_iter()
                .map(Artifact::from)
                .collect(),
            history: wire
                .history
                .unwrap_or_default()
                .into_iter()
                .map(Message::from)
                .collect(),
            metadata: wire.metadata,
        }
    }
}

/// `TaskStatusUpdateEvent` (`kind: "status-update"`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", expecting = "a TaskStatusUpdateEvent object")]
struct WireStatusUpdate {
    #[serde(rename = "kind")]
    _kind: Option<StatusUpdateKind>,
    task_id: String,
    context_id: String,
    status: WireStatus,
    #[serde(rename = "final")]
    is_final: Option<bool>,
}

/// `TaskArtifactUpdateEvent` (`kind: "artifact-update"`).
#[derive(Debug, Deserialize)]
#[serde(
    rename_all = "camelCase",
    expecting = "a TaskArtifactUpdateEvent object"
)]
struct WireArtifactUpdate {
    #[serde(rename = "kind")]
    _kind: Option<ArtifactUpdateKind>,
    task_id: String,
    context_id: String,
    artifact: WireArtifact,
    append: Option<bool>,
    last_chunk: Option<bool>,
}

/// A v0.3 `TaskStatus` found at `at`.
pub fn decode_status(value: &Value, at: &str) -> FieldResult<TaskStatus> {
    decode_at::<WireStatus>(value, at).map(TaskStatus::from)
}

/// A v0.3 `Task` found at `at`.
pub fn decode_task(value: &Value, at: &str) -> FieldResult<Task> {
    decode_at::<WireTask>(value, at).map(Task::from)
}

/// Which object a v0.3 result is: its `kind`, or without one, the fields only that kind has.
fn result_kind(value: &Value) -> FieldResult<&str> {
    let Value::Object(map) = value else {
        return Err(field_error("result", "expected an object"));
    };
    let has = |key: &str| map.get(key).is_some_and(|v| !v.is_null());
    match map.get("kind") {
        Some(Value::String(kind)) => Ok(kind),
        Some(other) if !other.is_null() => Err(field_error("result.kind", "expected a string")),
        _ if has("messageId") => Ok("message"),
        _ if has("artifact") => Ok("artifact-update"),
        _ if has("taskId") && has("status") => Ok("status-update"),
        _ if has("id") => Ok("task"),
        _ => Err(field_error("result.kind", "is required")),
    }
}

/// The `result` of a v0.3 stream event or send: a Task, Message, or update event.
pub fn decode_stream_item(value: &Value) -> FieldResult<StreamItem> {
    let at = "result";
    match result_kind(value)? {
        "task" => decode_task(value, at).map(StreamItem::Task),
        "message" => decode_message(value, at).map(StreamItem::Message),
        "status-update" => {
            let update: WireStatusUpdate = decode_at(value, at)?;
            let status = TaskStatus::from(update.status);
            Ok(StreamItem::Event(TaskEvent::Status {
                task_id: update.task_id,
                context_id: update.context_id,
                is_final: update.is_final.unwrap_or_else(|| status.state.ends_turn()),
                status,
            }))
        }
        "artifact-update" => {
            let update: WireArtifactUpdate = decode_at(value, at)?;
            Ok(StreamItem::Event(TaskEvent::Artifact {
                task_id: update.task_id,
                context_id: update.context_id,
                artifact: update.artifact.into(),
                append: update.append.unwrap_or(false),
                last_chunk: update.last_chunk.unwrap_or(false),
            }))
        }
        other => Err(field_error(
            "result.kind",
            format!("unknown result kind {other:?}"),
        )),
    }
}

// ---- encoding (what colloquy answers in v0.3) ----

/// `FilePart.file`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct FileOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    uri: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mime_type: Option<&'a str>,
}

/// A `DataPart`'s `data`: an object as it is; any other JSON value wrapped as `{"value": ..}`.
#[derive(Serialize)]
#[serde(untagged)]
enum DataOut<'a> {
    Object(&'a Value),
    Wrapped { value: &'a Value },
}

/// `TextPart`, `FilePart` or `DataPart`, by `kind`.
#[derive(Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum PartOut<'a> {
    Text {
        text: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        metadata: Option<&'a Metadata>,
    },
    File {
        file: FileOut<'a>,
        #[serde(skip_serializing_if = "Option::is_none")]
        metadata: Option<&'a Metadata>,
    },
    Data {
        data: DataOut<'a>,
        #[serde(skip_serializing_if = "Option::is_none")]
        metadata: Option<&'a Metadata>,
    },
}

impl<'a> From<&'a Part> for PartOut<'a> {
    fn from(part: &'a Part) -> Self {
        let metadata = part.metadata.as_ref();
        let file = |bytes, uri| PartOut::File {
            file: FileOut {
                bytes,
                uri,
                name: part.name.as_deref(),
                mime_type: part.media_type.as_deref(),
            },
            metadata,
        };
        match &part.content {
            PartContent::Text { text } => PartOut::Text { text, metadata },
            PartContent::Data { data } => PartOut::Data {
                data: if data.is_object() {
                    DataOut::Object(data)
                } else {
                    DataOut::Wrapped { value: data }
                },
                metadata,
            },
            PartContent::FileBytes { base64 } => file(Some(base64.as_str()), None),
            PartContent::FileUrl { url } => file(None, Some(url.as_str())),
        }
    }
}

impl<'a> PartShape<'a> for PartOut<'a> {
    const VERSION: WireVersion = WireVersion::V03;
}

type MessageOut<'a> = out::MessageOut<'a, PartOut<'a>>;
type StatusOut<'a> = out::StatusOut<'a, PartOut<'a>>;
type ArtifactOut<'a> = out::ArtifactOut<'a, PartOut<'a>>;
type TaskOut<'a> = out::TaskOut<'a, PartOut<'a>>;

/// `TaskStatusUpdateEvent` (`kind: "status-update"`) and `TaskArtifactUpdateEvent`
/// (`kind: "artifact-update"`).
#[derive(Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
enum EventOut<'a> {
    #[serde(rename_all = "camelCase")]
    StatusUpdate {
        task_id: &'a str,
        context_id: &'a str,
        status: StatusOut<'a>,
        #[serde(rename = "final")]
        is_final: bool,
    },
    #[serde(rename_all = "camelCase")]
    ArtifactUpdate {
        task_id: &'a str,
        context_id: &'a str,
        artifact: ArtifactOut<'a>,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        append: bool,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        last_chunk: bool,
    },
}

impl<'a> From<&'a TaskEvent> for EventOut<'a> {
    fn from(event: &'a TaskEvent) -> Self {
        match event {
            TaskEvent::Status {
                task_id,
                context_id,
                status,
                is_final,
            } => EventOut::StatusUpdate {
                task_id,
                context_id,
                status: StatusOut::from(status),
                is_final: *is_final,
            },
            TaskEvent::Artifact {
                task_id,
                context_id,
                artifact,
                append,
                last_chunk,
            } => EventOut::ArtifactUpdate {
                task_id,
                context_id,
                artifact: ArtifactOut::from(artifact),
                append: *append,
                last_chunk: *last_chunk,
            },
        }
    }
}

pub fn encode_part(part: &Part) -> Value {
    codec::to_json(PartOut::from(part))
}

pub fn encode_message(message: &Message) -> Value {
    codec::to_json(MessageOut::from(message))
}

pub fn encode_artifact(artifact: &Artifact) -> Value {
    codec::to_json(ArtifactOut::from(artifact))
}

pub fn encode_task(task: &Task, view: TaskView) -> Value {
    codec::to_json(TaskOut::new(task, view))
}

/// v0.3 results are the bare Task or Message (their `kind` tells).
pub fn encode_send_result(result: &SendResult, view: TaskView) -> codec::JsonText {
    match result {
        SendResult::Task(task) => codec::to_text(TaskOut::new(task, view)),
        SendResult::Message(message) => codec::to_text(MessageOut::from(message)),
    }
}

pub fn encode_event(event: &TaskEvent) -> Value {
    codec::to_json(EventOut::from(event))
}

pub fn encode_stream_item(item: &StreamItem, view: TaskView) -> Value {
    match item {
        StreamItem::Task(task) => encode_task(task, view),
        StreamItem::Message(message) => encode_message(message),
        StreamItem::Event(event) => encode_event(event),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn problem(message: Value) -> (String, String) {
        let e = decode_message(&message, "message").unwrap_err();
        (e.path, e.problem)
    }

    #[test]
    fn errors_name_the_field_with_the_hint() {
        let part = |p: Value| json!({"messageId": "m", "role": "user", "parts": [p]});
        let (path, why) =
            problem(json!({"kind": "task", "messageId": "m", "role": "user", "parts": []}));
        assert_eq!(path, "message.kind");
        assert!(why.contains("expected \"message\""), "{why}");
        let (path, why) = problem(part(json!({"kind": "video"})));
        assert_eq!(path, "message.parts[0]");
        assert!(why.contains("unknown part kind \"video\""), "{why}");
        let (_, why) = problem(part(json!({"kind": "file", "file": {}})));
        assert!(why.contains("exactly one of bytes or uri"), "{why}");
        let (path, _) = problem(part(json!({"kind": "file", "file": {"bytes": "***"}})));
        assert_eq!(path, "message.parts[0].file.bytes");
        let (path, why) = problem(json!({"messageId": "m", "role": "ROLE_USER", "parts": []}));
        assert_eq!(path, "message.role");
        assert!(why.contains("\"user\""), "{why}");
    }

    #[test]
    fn parts_without_kind_are_told_apart_by_their_content() {
        let message = json!({"messageId": "m", "role": "agent", "parts": [
            {"text": "t"}, {"file": {"uri": "http://x", "name": "n"}}, {"data": {"a": 1}}]});
        let decoded = decode_message(&message, "message").unwrap();
        assert_eq!(decoded.parts.len(), 3);
        assert!(matches!(
            decoded.parts[1].content,
            PartContent::FileUrl { .. }
        ));
        assert_eq!(decoded.parts[1].name.as_deref(), Some("n"));
    }

    #[test]
    fn results_are_told_apart_by_kind_or_fields() {
        let status = json!({"state": "completed", "timestamp": "2026-01-02T03:04:05.678Z"});
        let update = json!({"taskId": "t", "contextId": "c", "status": status});
        let item = decode_stream_item(&update).unwrap();
        assert!(matches!(
            item,
            StreamItem::Event(TaskEvent::Status { is_final: true, .. })
        ));
        let wrong = json!({"kind": "task", "taskId": "t", "contextId": "c", "status": status});
        assert_eq!(decode_stream_item(&wrong).unwrap_err().path, "result.id");
        let e = decode_task(&json!({"kind": "message", "id": "t"}), "result").unwrap_err();
        assert_eq!(e.path, "result.kind");
        let late = json!({"id": "t", "contextId": "c", "status": {"state": "completed", "timestamp": "10000-01-01T00:00:00Z"}});
        let e = decode_task(&late, "result").unwrap_err();
        assert_eq!(e.path, "result.status.timestamp");
    }
}
