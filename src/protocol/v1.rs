//! A2A v1.0's wire types where they differ from v0.3's (see [`super::params`] for the rest).
//! Names are the JSON names; proto names were rewritten to them on the way in
//! ([`super::protojson`]).

use super::WireVersion;
use super::codec;
use super::fields::{FieldResult, PartError};
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

/// `SendMessageRequest`: the params of `SendMessage` and `SendStreamingMessage`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendMessageRequest {
    message: WireMessage,
    configuration: Option<SendMessageConfiguration>,
}

/// `SendMessageConfiguration`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SendMessageConfiguration {
    #[serde(default, deserialize_with = "super::params::count")]
    history_length: Option<u64>,
    return_immediately: Option<bool>,
    task_push_notification_config: Option<Value>,
    /// The v0.3 spelling, also refused rather than ignored.
    push_notification_config: Option<Value>,
}

impl SendMessageRequest {
    pub fn read(params: &Params) -> FieldResult<SendRequest> {
        let request: SendMessageRequest = params.decode()?;
        let configuration = request.configuration;
        Ok(SendRequest {
            message: request.message.into(),
            return_immediately: configuration
                .as_ref()
                .and_then(|c| c.return_immediately)
                .unwrap_or(false),
            history_length: configuration.as_ref().and_then(|c| c.history_length),
            push_notification: configuration.is_some_and(|c| {
                c.task_push_notification_config.is_some() || c.push_notification_config.is_some()
            }),
        })
    }
}

/// A role as v1.0 spells it (`ROLE_USER`, `ROLE_AGENT`).
#[derive(Debug)]
struct WireRole(Role);

impl<'de> Deserialize<'de> for WireRole {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        codec::parse_role(WireVersion::V1, &name)
            .map(WireRole)
            .ok_or_else(|| de::Error::custom(codec::unknown_role(WireVersion::V1, &name)))
    }
}

/// `Message`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", expecting = "a Message object")]
struct WireMessage {
    message_id: String,
    role: WireRole,
    parts: Vec<WirePart>,
    context_id: Option<String>,
    task_id: Option<String>,
    reference_task_ids: Option<Vec<String>>,
    metadata: Option<Metadata>,
    extensions: Option<Vec<String>>,
}

/// `Part`: exactly one of `text`, `raw`, `url` or `data`, with optional `filename` and `mediaType`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", expecting = "a Part object")]
struct RawPart {
    text: Option<String>,
    raw: Option<Base64>,
    url: Option<String>,
    data: Option<Value>,
    media_type: Option<String>,
    filename: Option<String>,
    metadata: Option<Metadata>,
    /// Not a v1.0 field: only there to recognise a v0.3 part and say so.
    kind: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(try_from = "RawPart")]
struct WirePart(Part);

impl TryFrom<RawPart> for WirePart {
    type Error = PartError;

    fn try_from(raw: RawPart) -> Result<Self, PartError> {
        let RawPart {
            text,
            raw: bytes,
            url,
            data,
            media_type,
            filename,
            metadata,
            kind,
        } = raw;
        let present: Vec<&str> = [
            ("text", text.is_some()),
            ("raw", bytes.is_some()),
            ("url", url.is_some()),
            ("data", data.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, present)| present.then_some(name))
        .collect();
        let content = match (text, bytes, url, data) {
            (Some(text), None, None, None) => PartContent::Text { text },
            (None, Some(Base64(base64)), None, None) => PartContent::FileBytes { base64 },
            (None, None, Some(url), None) => PartContent::FileUrl { url },
            (None, None, None, Some(data)) => PartContent::Data { data },
            (None, None, None, None) if kind.is_some() => {
                return Err("looks like a v0.3 part (`kind`); A2A-Version 1.0 parts carry one of text, raw, url or data".into());
            }
            _ => {
                let found = if present.is_empty() {
                    "none".to_owned()
                } else {
                    present.join(", ")
                };
                return Err(format!(
                    "a part needs exactly one of text, raw, url or data (found {found})"
                )
                .into());
            }
        };
        // ProtoJSON: an empty string is the default, so absent.
        let non_empty = |s: Option<String>| s.filter(|s| !s.is_empty());
        Ok(WirePart(Part {
            content,
            media_type: non_empty(media_type),
            name: non_empty(filename),
            metadata,
        }))
    }
}

/// A v1.0 `Message` found at `at`.
pub fn decode_message(value: &Value, at: &str) -> FieldResult<Message> {
    decode_at::<WireMessage>(value, at).map(Message::from)
}

/// A v1.0 `Part` found at `at`.
pub fn decode_part(value: &Value, at: &str) -> FieldResult<Part> {
    decode_at::<WirePart>(value, at).map(|p| p.0)
}

// ---- results (what a v1.0 peer answers; the client side) ----

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
    params::task_state(WireVersion::V1, deserializer)
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
            // The first Task of an SDK stream has no timestamp: it happened now, as far as we know.
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

/// `Task`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", expecting = "a Task object")]
struct WireTask {
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

/// `TaskStatusUpdateEvent`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", expecting = "a TaskStatusUpdateEvent object")]
struct WireStatusUpdate {
    task_id: String,
    context_id: String,
    status: WireStatus,
    /// Not in v1.0; taken if a peer sends it, else the state says.
    #[serde(rename = "final")]
    is_final: Option<bool>,
}

/// `TaskArtifactUpdateEvent`.
#[derive(Debug, Deserialize)]
#[serde(
    rename_all = "camelCase",
    expecting = "a TaskArtifactUpdateEvent object"
)]
struct WireArtifactUpdate {
    task_id: String,
    context_id: String,
    artifact: WireArtifact,
    append: Option<bool>,
    last_chunk: Option<bool>,
}

/// `StreamResponse` (also `SendMessageResponse`, which holds only the first two).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", expecting = "a StreamResponse object")]
struct RawStreamResponse {
    task: Option<WireTask>,
    message: Option<WireMessage>,
    status_update: Option<WireStatusUpdate>,
    artifact_update: Option<WireArtifactUpdate>,
}

#[derive(Debug, Deserialize)]
#[serde(try_from = "RawStreamResponse")]
struct WireStreamResponse(StreamItem);

impl TryFrom<RawStreamResponse> for WireStreamResponse {
    type Error = &'static str;

    fn try_from(raw: RawStreamResponse) -> Result<Self, Self::Error> {
        let item = match (
            raw.task,
            raw.message,
            raw.status_update,
            raw.artifact_update,
        ) {
            (Some(task), None, None, None) => StreamItem::Task(task.into()),
            (None, Some(message), None, None) => StreamItem::Message(message.into()),
            (None, None, Some(update), None) => {
                let status = TaskStatus::from(update.status);
                StreamItem::Event(TaskEvent::Status {
                    task_id: update.task_id,
                    context_id: update.context_id,
                    is_final: update.is_final.unwrap_or_else(|| status.state.ends_turn()),
                    status,
                })
            }
            (None, None, None, Some(update)) => StreamItem::Event(TaskEvent::Artifact {
                task_id: update.task_id,
                context_id: update.context_id,
                artifact: update.artifact.into(),
                append: update.append.unwrap_or(false),
                last_chunk: update.last_chunk.unwrap_or(false),
            }),
            _ => {
                return Err(
                    "expected exactly one of task, message, statusUpdate or artifactUpdate",
                );
            }
        };
        Ok(WireStreamResponse(item))
    }
}

/// A v1.0 `TaskStatus` found at `at`.
pub fn decode_status(value: &Value, at: &str) -> FieldResult<TaskStatus> {
    decode_at::<WireStatus>(value, at).map(TaskStatus::from)
}

/// A v1.0 `Task` found at `at`.
pub fn decode_task(value: &Value, at: &str) -> FieldResult<Task> {
    decode_at::<WireTask>(value, at).map(Task::from)
}

/// A v1.0 `StreamResponse` (or `SendMessageResponse`): the `result` of a stream event or a send.
pub fn decode_stream_item(value: &Value) -> FieldResult<StreamItem> {
    decode_at::<WireStreamResponse>(value, "result").map(|r| r.0)
}

// ---- encoding (what colloquy answers in v1.0) ----

/// `Part`: one content field, then `filename` / `mediaType` when set.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PartOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    raw: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    filename: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    media_type: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<&'a Metadata>,
}

impl<'a> From<&'a Part> for PartOut<'a> {
    fn from(part: &'a Part) -> Self {
        let mut out = PartOut {
            text: None,
            raw: None,
            url: None,
            data: None,
            filename: part.name.as_deref(),
            media_type: part.media_type.as_deref(),
            metadata: part.metadata.as_ref(),
        };
        match &part.content {
            PartContent::Text { text } => out.text = Some(text),
            PartContent::FileBytes { base64 } => out.raw = Some(base64),
            PartContent::FileUrl { url } => out.url = Some(url),
            PartContent::Data { data } => out.data = Some(data),
        }
        out
    }
}

impl<'a> PartShape<'a> for PartOut<'a> {
    const VERSION: WireVersion = WireVersion::V1;
}

type MessageOut<'a> = out::MessageOut<'a, PartOut<'a>>;
type StatusOut<'a> = out::StatusOut<'a, PartOut<'a>>;
type ArtifactOut<'a> = out::ArtifactOut<'a, PartOut<'a>>;
type TaskOut<'a> = out::TaskOut<'a, PartOut<'a>>;

/// `TaskStatusUpdateEvent` (v1.0 has no `final`: the state says).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusUpdateOut<'a> {
    task_id: &'a str,
    context_id: &'a str,
    status: StatusOut<'a>,
}

/// `TaskArtifactUpdateEvent`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ArtifactUpdateOut<'a> {
    task_id: &'a str,
    context_id: &'a str,
    artifact: ArtifactOut<'a>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    append: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    last_chunk: bool,
}

/// `StreamResponse` / `SendMessageResponse`: exactly one member.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
enum StreamResponseOut<'a> {
    Task(TaskOut<'a>),
    Message(MessageOut<'a>),
    StatusUpdate(StatusUpdateOut<'a>),
    ArtifactUpdate(ArtifactUpdateOut<'a>),
}

impl<'a> StreamResponseOut<'a> {
    fn event(event: &'a TaskEvent) -> Self {
        match event {
            TaskEvent::Status {
                task_id,
                context_id,
                status,
                ..
            } => StreamResponseOut::StatusUpdate(StatusUpdateOut {
                task_id,
                context_id,
                status: StatusOut::from(status),
            }),
            TaskEvent::Artifact {
                task_id,
                context_id,
                artifact,
                append,
                last_chunk,
            } => StreamResponseOut::ArtifactUpdate(ArtifactUpdateOut {
                task_id,
                context_id,
                artifact: ArtifactOut::from(artifact),
                append: *append,
                last_chunk: *last_chunk,
            }),
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

pub fn encode_send_result(result: &SendResult, view: TaskView) -> codec::JsonText {
    codec::to_text(match result {
        SendResult::Task(task) => StreamResponseOut::Task(TaskOut::new(task, view)),
        SendResult::Message(message) => StreamResponseOut::Message(MessageOut::from(message)),
    })
}

pub fn encode_event(event: &TaskEvent) -> Value {
    codec::to_json(StreamResponseOut::event(event))
}

pub fn encode_stream_item(item: &StreamItem, view: TaskView) -> Value {
    codec::to_json(match item {
        StreamItem::Task(task) => StreamResponseOut::Task(TaskOut::new(task, view)),
        StreamItem::Message(message) => StreamResponseOut::Message(MessageOut::from(message)),
        StreamItem::Event(event) => StreamResponseOut::event(event),
    })
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
        let part = |p: Value| json!({"messageId": "m", "role": "ROLE_USER", "parts": [p]});
        let (path, _) = problem(part(json!({"text": 5})));
        assert_eq!(path, "message.parts[0].text");
        let (path, why) = problem(part(json!({"text": "a", "url": "u"})));
        assert_eq!(path, "message.parts[0]");
        assert!(
            why.contains("exactly one of text, raw, url or data (found text, url)"),
            "{why}"
        );
        let (path, why) = problem(part(json!({"raw": "***"})));
        assert_eq!(path, "message.parts[0].raw");
        assert!(why.contains("base64"), "{why}");
        let (_, why) = problem(part(json!({"kind": "text"})));
        assert!(why.contains("looks like a v0.3 part"), "{why}");
        let (path, why) = problem(json!({"messageId": "m", "role": "user", "parts": []}));
        assert_eq!(path, "message.role");
        assert!(why.contains("\"ROLE_USER\""), "{why}");
        let (path, why) = problem(json!({"role": "ROLE_USER", "parts": []}));
        assert_eq!(
            (path.as_str(), why.as_str()),
            ("message.messageId", "is required")
        );
    }

    #[test]
    fn a_stream_response_holds_exactly_one_kind() {
        let task = json!({"id": "t", "contextId": "c", "status": {"state": "TASK_STATE_WORKING"}});
        let both = decode_stream_item(&json!({"task": task, "message": {"messageId": "m", "role": "ROLE_AGENT", "parts": []}}))
            .unwrap_err();
        assert_eq!(both.path, "result");
        let item = decode_stream_item(&json!({"task": task})).unwrap();
        assert!(matches!(item, StreamItem::Task(t) if t.id == "t"));
        let bad = json!({"statusUpdate": {"taskId": "t", "contextId": "c", "status": {"state": "working"}}});
        let e = decode_stream_item(&bad).unwrap_err();
        assert_eq!(e.path, "result.statusUpdate.status.state");
        assert!(
            e.problem
                .contains("unknown task state \"working\" for A2A 1.0"),
            "{e}"
        );
    }
}
