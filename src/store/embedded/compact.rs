//! Record version 2: the stored forms of messages, tasks and conversation metadata, so that the
//! model's wire-oriented serde attributes do not decide how records are stored.
//!
//! Each stored form is a MessagePack array, its fields by position, none left out (an absent
//! value is nil, one byte). Ids are the 16 bytes of a UUID when they are one in its canonical
//! spelling (lowercase, hyphenated), else the string; timestamps are milliseconds since the epoch
//! when that is exact, else RFC 3339 with every digit; a task state is its code; a message's
//! contextId is "the conversation's own" (one byte) when it is, the reader being given that id.
//! Whatever is stored comes back exactly; arbitrary JSON (data parts, metadata, an agent's state)
//! is MessagePack of the JSON value, which keeps integers and floats apart.
//!
//! Fields are found by position and none has a default, so a field added to a stored form is a
//! new record version (3), with version 2 still read as it is.

use super::records::{ReplyRef, TaskRecord};
use crate::model::{
    Artifact, Message, Metadata, Part, PartContent, Role, Task, TaskState, TaskStatus,
};
use crate::store::{ConversationMeta, StreamOutline};
use chrono::{DateTime, Utc};
use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use std::borrow::Cow;
use std::fmt;
use uuid::Uuid;

pub(super) type ReadError = rmp_serde::decode::Error;

/// Appends the message's stored form; `own_context` is the contextId of its conversation.
pub(super) fn write_message(out: &mut Vec<u8>, message: &Message, own_context: &str) {
    write(out, &StoredMessage::new(message, own_context));
}

pub(super) fn read_message(body: &[u8], own_context: &str) -> Result<Message, ReadError> {
    Ok(rmp_serde::from_slice::<StoredMessage>(body)?.into_message(own_context))
}

pub(super) fn write_task(out: &mut Vec<u8>, record: &TaskRecord) {
    write(out, &StoredTask::new(record));
}

pub(super) fn read_task(body: &[u8]) -> Result<TaskRecord, ReadError> {
    Ok(rmp_serde::from_slice::<StoredTask>(body)?.into_record())
}

/// The metadata and the conversation's number (None for one stored before numbers).
pub(super) fn write_conversation(out: &mut Vec<u8>, meta: &ConversationMeta, number: Option<u64>) {
    write(out, &StoredConversation::new(meta, number));
}

pub(super) fn read_conversation(body: &[u8]) -> Result<(ConversationMeta, Option<u64>), ReadError> {
    Ok(rmp_serde::from_slice::<StoredConversation>(body)?.into_meta())
}

fn write(out: &mut Vec<u8>, value: &impl Serialize) {
    // Serializing these forms into a Vec cannot fail: no serializer of theirs refuses a value
    // and JSON maps have string keys.
    let _ = rmp_serde::encode::write(out, value);
}

/// An id: a UUID's 16 bytes when the id spells it canonically (so it formats back to the same
/// string; an uppercase one stays text), else the id as it is.
#[derive(Debug, Clone, PartialEq)]
enum StoredId<'a> {
    Uuid(Uuid),
    Text(Cow<'a, str>),
}

impl<'a> StoredId<'a> {
    fn new(id: &'a str) -> Self {
        match Uuid::try_parse(id) {
            Ok(uuid) if uuid.hyphenated().encode_lower(&mut Uuid::encode_buffer()) == id => {
                StoredId::Uuid(uuid)
            }
            _ => StoredId::Text(Cow::Borrowed(id)),
        }
    }

    fn into_string(self) -> String {
        match self {
            StoredId::Uuid(uuid) => uuid.hyphenated().to_string(),
            StoredId::Text(text) => text.into_owned(),
        }
    }

    fn of<E: de::Error>(raw: Raw) -> Result<Self, E> {
        match raw {
            Raw::Uuid(uuid) => Ok(StoredId::Uuid(uuid)),
            Raw::Text(text) => Ok(StoredId::Text(Cow::Owned(text))),
            other => Err(E::custom(format_args!("an id, not {other:?}"))),
        }
    }
}

impl Serialize for StoredId<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            StoredId::Uuid(uuid) => serializer.serialize_bytes(uuid.as_bytes()),
            StoredId::Text(text) => serializer.serialize_str(text),
        }
    }
}

impl<'de> Deserialize<'de> for StoredId<'_> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        StoredId::of(Raw::read(deserializer)?)
    }
}

/// A message's contextId: none, its conversation's own, or another.
#[derive(Debug, Clone, PartialEq)]
enum StoredContext<'a> {
    Absent,
    Own,
    Other(StoredId<'a>),
}

impl<'a> StoredContext<'a> {
    fn new(context_id: Option<&'a str>, own_context: &str) -> Self {
        match context_id {
            None => StoredContext::Absent,
            Some(id) if id == own_context => StoredContext::Own,
            Some(id) => StoredContext::Other(StoredId::new(id)),
        }
    }

    fn into_context(self, own_context: &str) -> Option<String> {
        match self {
            StoredContext::Absent => None,
            StoredContext::Own => Some(own_context.to_owned()),
            StoredContext::Other(id) => Some(id.into_string()),
        }
    }
}

impl Serialize for StoredContext<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            StoredContext::Absent => serializer.serialize_none(),
            StoredContext::Own => serializer.serialize_bool(true),
            StoredContext::Other(id) => id.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for StoredContext<'_> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Raw::read(deserializer)? {
            Raw::Nil => Ok(StoredContext::Absent),
            Raw::Bool(true) => Ok(StoredContext::Own),
            raw => StoredId::of(raw).map(StoredContext::Other),
        }
    }
}

/// A timestamp: milliseconds since the epoch when that is exact (every timestamp colloquy makes,
/// `model::now`), else RFC 3339 with all its digits.
#[derive(Debug, Clone, Copy, PartialEq)]
struct StoredTime(DateTime<Utc>);

impl Serialize for StoredTime {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let millis = self.0.timestamp_millis();
        if DateTime::from_timestamp_millis(millis) == Some(self.0) {
            serializer.serialize_i64(millis)
        } else {
            self.0.serialize(serializer)
        }
    }
}

impl<'de> Deserialize<'de> for StoredTime {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let time = match Raw::read(deserializer)? {
            Raw::Int(millis) => DateTime::from_timestamp_millis(millis),
            Raw::Text(text) => text.parse().ok(),
            _ => None,
        };
        time.map(StoredTime)
            .ok_or_else(|| de::Error::custom("not a timestamp"))
    }
}

/// A task state as its code ([`TaskState::code`]).
#[derive(Debug, Clone, Copy, PartialEq)]
struct StoredState(TaskState);

impl Serialize for StoredState {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u8(self.0.code())
    }
}

impl<'de> Deserialize<'de> for StoredState {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let code = u8::deserialize(deserializer)?;
        TaskState::ALL
            .get(usize::from(code))
            .map(|state| StoredState(*state))
            .ok_or_else(|| de::Error::custom(format!("unknown task state {code}")))
    }
}

/// The MessagePack values the scalar forms above are made of, as read.
#[derive(Debug)]
enum Raw {
    Nil,
    Bool(bool),
    Int(i64),
    /// Bytes, which only a UUID is stored as.
    Uuid(Uuid),
    Text(String),
}

impl Raw {
    fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Raw, D::Error> {
        deserializer.deserialize_any(RawVisitor)
    }
}

struct RawVisitor;

impl Visitor<'_> for RawVisitor {
    type Value = Raw;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("nil, a boolean, an integer, a UUID's 16 bytes or a string")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Raw, E> {
        Ok(Raw::Nil)
    }

    fn visit_none<E: de::Error>(self) -> Result<Raw, E> {
        Ok(Raw::Nil)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Raw, E> {
        Ok(Raw::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Raw, E> {
        Ok(Raw::Int(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Raw, E> {
        i64::try_from(v)
            .map(Raw::Int)
            .map_err(|_| E::custom("integer out of range"))
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Raw, E> {
        Uuid::from_slice(v).map(Raw::Uuid).map_err(E::custom)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Raw, E> {
        Ok(Raw::Text(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Raw, E> {
        Ok(Raw::Text(v))
    }
}

#[derive(Debug, Serialize, Deserialize)]
enum StoredContent<'a> {
    #[serde(rename = "t")]
    Text(Cow<'a, str>),
    #[serde(rename = "b")]
    FileBytes(Cow<'a, str>),
    #[serde(rename = "u")]
    FileUrl(Cow<'a, str>),
    #[serde(rename = "d")]
    Data(Cow<'a, Value>),
}

#[derive(Debug, Serialize, Deserialize)]
struct StoredPart<'a> {
    content: StoredContent<'a>,
    media_type: Option<Cow<'a, str>>,
    name: Option<Cow<'a, str>>,
    metadata: Option<Cow<'a, Metadata>>,
}

impl<'a> StoredPart<'a> {
    fn new(part: &'a Part) -> Self {
        let content = match &part.content {
            PartContent::Text { text } => StoredContent::Text(Cow::Borrowed(text)),
            PartContent::FileBytes { base64 } => StoredContent::FileBytes(Cow::Borrowed(base64)),
            PartContent::FileUrl { url } => StoredContent::FileUrl(Cow::Borrowed(url)),
            PartContent::Data { data } => StoredContent::Data(Cow::Borrowed(data)),
        };
        StoredPart {
            content,
            media_type: part.media_type.as_deref().map(Cow::Borrowed),
            name: part.name.as_deref().map(Cow::Borrowed),
            metadata: part.metadata.as_ref().map(Cow::Borrowed),
        }
    }

    fn into_part(self) -> Part {
        let content = match self.content {
            StoredContent::Text(text) => PartContent::Text {
                text: text.into_owned(),
            },
            StoredContent::FileBytes(base64) => PartContent::FileBytes {
                base64: base64.into_owned(),
            },
            StoredContent::FileUrl(url) => PartContent::FileUrl {
                url: url.into_owned(),
            },
            StoredContent::Data(data) => PartContent::Data {
                data: data.into_owned(),
            },
        };
        Part {
            content,
            media_type: self.media_type.map(Cow::into_owned),
            name: self.name.map(Cow::into_owned),
            metadata: self.metadata.map(Cow::into_owned),
        }
    }
}

fn stored_parts(parts: &[Part]) -> Vec<StoredPart<'_>> {
    parts.iter().map(StoredPart::new).collect()
}

fn model_parts(parts: Vec<StoredPart>) -> Vec<Part> {
    parts.into_iter().map(StoredPart::into_part).collect()
}

#[derive(Debug, Serialize, Deserialize)]
struct StoredMessage<'a> {
    message_id: StoredId<'a>,
    from_agent: bool,
    parts: Vec<StoredPart<'a>>,
    context_id: StoredContext<'a>,
    task_id: Option<StoredId<'a>>,
    reference_task_ids: Vec<StoredId<'a>>,
    metadata: Option<Cow<'a, Metadata>>,
    extensions: Vec<Cow<'a, str>>,
    timestamp: Option<StoredTime>,
}

impl<'a> StoredMessage<'a> {
    fn new(message: &'a Message, own_context: &str) -> Self {
        StoredMessage {
            message_id: StoredId::new(&message.message_id),
            from_agent: message.role == Role::Agent,
            parts: stored_parts(&message.parts),
            context_id: StoredContext::new(message.context_id.as_deref(), own_context),
            task_id: message.task_id.as_deref().map(StoredId::new),
            reference_task_ids: message
                .reference_task_ids
                .iter()
                .map(|id| StoredId::new(id))
                .collect(),
            metadata: message.metadata.as_ref().map(Cow::Borrowed),
            extensions: message
                .extensions
                .iter()
                .map(|e| Cow::Borrowed(&**e))
                .collect(),
            timestamp: message.timestamp.map(StoredTime),
        }
    }

    fn into_message(self, own_context: &str) -> Message {
        Message {
            message_id: self.message_id.into_string(),
            role: if self.from_agent {
                Role::Agent
            } else {
                Role::User
            },
            parts: model_parts(self.parts),
            context_id: self.context_id.into_context(own_context),
            task_id: self.task_id.map(StoredId::into_string),
            reference_task_ids: self
                .reference_task_ids
                .into_iter()
                .map(StoredId::into_string)
                .collect(),
            metadata: self.metadata.map(Cow::into_owned),
            extensions: self.extensions.into_iter().map(Cow::into_owned).collect(),
            timestamp: self.timestamp.map(|t| t.0),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct StoredArtifact<'a> {
    artifact_id: StoredId<'a>,
    name: Option<Cow<'a, str>>,
    description: Option<Cow<'a, str>>,
    parts: Vec<StoredPart<'a>>,
    metadata: Option<Cow<'a, Metadata>>,
}

impl<'a> StoredArtifact<'a> {
    fn new(artifact: &'a Artifact) -> Self {
        StoredArtifact {
            artifact_id: StoredId::new(&artifact.artifact_id),
            name: artifact.name.as_deref().map(Cow::Borrowed),
            description: artifact.description.as_deref().map(Cow::Borrowed),
            parts: stored_parts(&artifact.parts),
            metadata: artifact.metadata.as_ref().map(Cow::Borrowed),
        }
    }

    fn into_artifact(self) -> Artifact {
        Artifact {
            artifact_id: self.artifact_id.into_string(),
            name: self.name.map(Cow::into_owned),
            description: self.description.map(Cow::into_owned),
            parts: model_parts(self.parts),
            metadata: self.metadata.map(Cow::into_owned),
        }
    }
}

/// A task record, its messages' contextIds relative to the task's.
#[derive(Debug, Serialize, Deserialize)]
struct StoredTask<'a> {
    id: StoredId<'a>,
    context_id: StoredId<'a>,
    state: StoredState,
    status_message: Option<StoredMessage<'a>>,
    status_timestamp: StoredTime,
    artifacts: Vec<StoredArtifact<'a>>,
    history: Vec<StoredMessage<'a>>,
    metadata: Option<Cow<'a, Metadata>>,
    principal: Cow<'a, str>,
    history_seqs: Cow<'a, [u64]>,
    /// [`ReplyRef`]: the artifact's index and the reply's sequence number.
    reply_in: Option<(usize, u64)>,
    /// Added after the first records of version 2: those end before it.
    #[serde(default)]
    conversation_number: Option<u64>,
    /// Added later still: records before it end without it, as do those without an outline
    /// (left out when absent: it is the last field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    stream: Option<Cow<'a, StreamOutline>>,
}

impl<'a> StoredTask<'a> {
    fn new(record: &'a TaskRecord) -> Self {
        let task = &record.task;
        let own_context = task.context_id.as_str();
        let message = |m: &'a Message| StoredMessage::new(m, own_context);
        StoredTask {
            id: StoredId::new(&task.id),
            context_id: StoredId::new(own_context),
            state: StoredState(task.status.state),
            status_message: task.status.message.as_ref().map(message),
            status_timestamp: StoredTime(task.status.timestamp),
            artifacts: task.artifacts.iter().map(StoredArtifact::new).collect(),
            history: task.history.iter().map(message).collect(),
            metadata: task.metadata.as_ref().map(Cow::Borrowed),
            principal: Cow::Borrowed(&record.principal),
            history_seqs: Cow::Borrowed(&record.history_seqs),
            reply_in: record.reply_in.map(|r| (r.artifact, r.seq)),
            conversation_number: record.conversation_number,
            stream: record.stream.as_ref().map(Cow::Borrowed),
        }
    }

    fn into_record(self) -> TaskRecord {
        let context_id = self.context_id.into_string();
        let message = |m: StoredMessage| m.into_message(&context_id);
        let task = Task {
            id: self.id.into_string(),
            status: TaskStatus {
                state: self.state.0,
                message: self.status_message.map(message),
                timestamp: self.status_timestamp.0,
            },
            artifacts: self
                .artifacts
                .into_iter()
                .map(StoredArtifact::into_artifact)
                .collect(),
            history: self.history.into_iter().map(message).collect(),
            metadata: self.metadata.map(Cow::into_owned),
            context_id,
        };
        TaskRecord {
            task,
            principal: self.principal.into_owned(),
            history_seqs: self.history_seqs.into_owned(),
            reply_in: self
                .reply_in
                .map(|(artifact, seq)| ReplyRef { artifact, seq }),
            conversation_number: self.conversation_number,
            stream: self.stream.map(Cow::into_owned),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct StoredConversation<'a> {
    context_id: StoredId<'a>,
    principal: Cow<'a, str>,
    created_at: StoredTime,
    updated_at: StoredTime,
    turns: u64,
    next_seq: u64,
    running_task: Option<StoredId<'a>>,
    token: u64,
    agent_state: Option<Cow<'a, Value>>,
    /// Added after the first records of version 2: those end before it.
    #[serde(default)]
    number: Option<u64>,
}

impl<'a> StoredConversation<'a> {
    fn new(meta: &'a ConversationMeta, number: Option<u64>) -> Self {
        StoredConversation {
            context_id: StoredId::new(&meta.context_id),
            principal: Cow::Borrowed(&meta.principal),
            created_at: StoredTime(meta.created_at),
            updated_at: StoredTime(meta.updated_at),
            turns: meta.turns,
            next_seq: meta.next_seq,
            running_task: meta.running_task.as_deref().map(StoredId::new),
            token: meta.token,
            agent_state: meta.agent_state.as_ref().map(Cow::Borrowed),
            number,
        }
    }

    fn into_meta(self) -> (ConversationMeta, Option<u64>) {
        let meta = ConversationMeta {
            context_id: self.context_id.into_string(),
            principal: self.principal.into_owned(),
            created_at: self.created_at.0,
            updated_at: self.updated_at.0,
            turns: self.turns,
            next_seq: self.next_seq,
            running_task: self.running_task.map(StoredId::into_string),
            token: self.token,
            agent_state: self.agent_state.map(Cow::into_owned),
        };
        (meta, self.number)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::OutlinedEvent;
    use serde_json::json;

    const CONTEXT: &str = "5f0c6f4e-3b1a-4c55-9d7e-2a8b1c0d9e7f";
    const UUID: &str = "0b7e2c1a-9f3d-4e8b-a6c5-1d2e3f4a5b6c";

    /// `value` written with `write` and read back with `read`.
    fn round_trip<T>(
        value: &T,
        write: impl FnOnce(&mut Vec<u8>, &T),
        read: impl FnOnce(&[u8]) -> Result<T, ReadError>,
    ) -> T {
        let mut bytes = Vec::new();
        write(&mut bytes, value);
        read(&bytes).unwrap()
    }

    fn message_round_trip(message: &Message, own_context: &str) -> Message {
        round_trip(
            message,
            |out, m| write_message(out, m, own_context),
            |body| read_message(body, own_context),
        )
    }

    fn sub_millisecond() -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000, 123_456_789).unwrap()
    }

    fn data_part(data: Value) -> Part {
        Part {
            content: PartContent::Data { data },
            media_type: Some("application/json".into()),
            name: Some("numbers".into()),
            metadata: json!({"nested": {"n": [1, 1.0, -1]}}).as_object().cloned(),
        }
    }

    /// Every field set, ids of each kind, numbers that JSON keeps apart.
    fn full_message() -> Message {
        let numbers = json!({
            "one": 1, "one_float": 1.0, "minus_one": -1, "max": u64::MAX, "min": i64::MIN,
            "huge": 1e300, "tiny": -2.5e-300, "zero_float": 0.0,
            "nested": {"list": [null, true, false, "s", {"deep": [1, [2, [3.5]]]}]},
            "empty": {}, "none": null,
        });
        Message {
            message_id: UUID.into(),
            role: Role::User,
            parts: vec![
                Part::text("héllo \"world\"\n"),
                data_part(numbers),
                data_part(json!(1.0)),
                data_part(Value::Null),
                Part {
                    content: PartContent::FileBytes {
                        base64: "aGVsbG8=".into(),
                    },
                    media_type: Some("text/plain".into()),
                    name: Some("hello.txt".into()),
                    metadata: None,
                },
                Part {
                    content: PartContent::FileUrl {
                        url: "https://example.com/a.png".into(),
                    },
                    media_type: None,
                    name: None,
                    metadata: Some(Metadata::new()),
                },
            ],
            context_id: Some(CONTEXT.into()),
            task_id: Some("task-1".into()),
            reference_task_ids: vec![UUID.into(), "not a uuid".into(), UUID.to_uppercase()],
            metadata: json!({"k": "v", "n": 18446744073709551615u64})
                .as_object()
                .cloned(),
            extensions: vec!["https://example.com/ext/v1".into()],
            timestamp: Some(sub_millisecond()),
        }
    }

    #[test]
    fn messages_round_trip_exactly() {
        // The JSON values compare their numbers' kinds: 1.0 coming back as 1 would fail.
        assert_ne!(json!(1.0), json!(1));
        assert_ne!(json!(-1), json!(-1.0));
        let message = full_message();
        assert_eq!(message_round_trip(&message, CONTEXT), message);
        let plain = Message::agent_text("a reply", CONTEXT, Some(UUID));
        assert_eq!(message_round_trip(&plain, CONTEXT), plain);
    }

    #[test]
    fn a_message_context_id_may_be_absent_its_conversations_or_another() {
        for context_id in [None, Some(CONTEXT), Some(UUID), Some("other"), Some("")] {
            let mut message = full_message();
            message.context_id = context_id.map(str::to_owned);
            assert_eq!(message_round_trip(&message, CONTEXT), message);
        }
        // Not a UUID, and the conversation's own: one byte either way.
        let mut message = full_message();
        message.context_id = Some("ctx".into());
        assert_eq!(message_round_trip(&message, "ctx"), message);
    }

    #[test]
    fn ids_are_bytes_only_when_they_format_back_the_same() {
        assert_eq!(StoredId::new(UUID), StoredId::Uuid(UUID.parse().unwrap()));
        // MessagePack bin 8: 16 bytes are a UUID, other lengths are no id.
        let bin = |len: u8| [&[0xC4, len][..], &vec![7; usize::from(len)]].concat();
        assert!(rmp_serde::from_slice::<StoredId>(&bin(16)).is_ok());
        assert!(rmp_serde::from_slice::<StoredId>(&bin(15)).is_err());
        let spellings = [
            UUID.to_uppercase(),
            UUID.replace('-', ""),
            format!("{{{UUID}}}"),
            format!("urn:uuid:{UUID}"),
            "task-1".into(),
            String::new(),
        ];
        for id in spellings {
            assert!(matches!(StoredId::new(&id), StoredId::Text(_)), "{id}");
            let mut message = full_message();
            message.message_id = id.clone();
            message.task_id = Some(id.clone());
            assert_eq!(message_round_trip(&message, CONTEXT).message_id, id);
            assert_eq!(message_round_trip(&message, CONTEXT), message);
        }
    }

    #[test]
    fn timestamps_keep_every_digit() {
        let times = [
            crate::model::now(),
            sub_millisecond(),
            DateTime::from_timestamp(1_700_000_000, 1).unwrap(),
            DateTime::from_timestamp(-1, 999_000_000).unwrap(),
            DateTime::<Utc>::MIN_UTC,
            DateTime::<Utc>::MAX_UTC,
            leap_second(),
        ];
        for time in times {
            let bytes = rmp_serde::to_vec(&StoredTime(time)).unwrap();
            let read: StoredTime = rmp_serde::from_slice(&bytes).unwrap();
            assert_eq!(read.0, time);
        }
        let millis = rmp_serde::to_vec(&StoredTime(crate::model::now())).unwrap();
        assert_eq!(millis.len(), 9, "milliseconds: one marker and 8 bytes");
    }

    /// 2016-12-31T23:59:60.000Z: whole milliseconds, yet no number of them since the epoch.
    fn leap_second() -> DateTime<Utc> {
        let day = chrono::NaiveDate::from_ymd_opt(2016, 12, 31).unwrap();
        day.and_hms_milli_opt(23, 59, 59, 1_000).unwrap().and_utc()
    }

    fn full_task() -> TaskRecord {
        let mut status_message = Message::agent_text("canceled by the client", CONTEXT, None);
        status_message.timestamp = Some(sub_millisecond());
        let mut foreign = full_message();
        foreign.context_id = Some("elsewhere".into());
        TaskRecord {
            task: Task {
                id: UUID.into(),
                context_id: CONTEXT.into(),
                status: TaskStatus {
                    state: TaskState::InputRequired,
                    message: Some(status_message),
                    timestamp: sub_millisecond(),
                },
                artifacts: vec![
                    Artifact {
                        artifact_id: UUID.into(),
                        name: Some("reply".into()),
                        description: Some("the agent's answer".into()),
                        parts: vec![Part::text(""), data_part(json!([1, 1.0, -1]))],
                        metadata: json!({"m": 1}).as_object().cloned(),
                    },
                    Artifact {
                        artifact_id: "Artifact-2".into(),
                        name: None,
                        description: None,
                        parts: Vec::new(),
                        metadata: None,
                    },
                ],
                history: vec![full_message(), foreign],
                metadata: json!({"task": {"x": 1e300}}).as_object().cloned(),
            },
            principal: "alice@example.com".into(),
            history_seqs: vec![0, 1, 300, u64::MAX],
            reply_in: Some(ReplyRef {
                artifact: 0,
                seq: 300,
            }),
            conversation_number: Some(u64::MAX),
            stream: Some(StreamOutline {
                turn: 7,
                reply: Some(0),
                events: vec![
                    OutlinedEvent::Opened,
                    OutlinedEvent::Status(Box::new(TaskStatus::new(TaskState::Working, None))),
                    OutlinedEvent::Chunk(3),
                    OutlinedEvent::Chunk(u32::MAX),
                    OutlinedEvent::Artifact(1),
                    OutlinedEvent::Closed,
                    OutlinedEvent::Final,
                ],
            }),
        }
    }

    fn task_round_trip(record: &TaskRecord) -> TaskRecord {
        round_trip(record, write_task, read_task)
    }

    #[test]
    fn task_records_round_trip_exactly() {
        let record = full_task();
        assert_eq!(task_round_trip(&record), record);
        for state in TaskState::ALL {
            let mut record = full_task();
            record.task.status.state = state;
            record.task.status.message = None;
            record.task.context_id = "a context that is not a uuid".into();
            record.reply_in = None;
            record.conversation_number = None;
            assert_eq!(task_round_trip(&record), record);
            if let Some(outline) = &mut record.stream {
                outline.reply = None;
            }
            assert_eq!(task_round_trip(&record), record);
        }
    }

    #[test]
    fn conversation_metadata_round_trips_exactly() {
        let mut meta = ConversationMeta::new("anonymous", CONTEXT);
        assert_eq!(read_back_conversation(&meta), meta);
        meta.context_id = "My-Context".into();
        meta.created_at = sub_millisecond();
        meta.turns = 7;
        meta.next_seq = 14;
        meta.running_task = Some(UUID.into());
        meta.token = u64::MAX;
        meta.agent_state = Some(json!({"upstream": UUID, "n": [1, 1.0, -1, u64::MAX]}));
        assert_eq!(read_back_conversation(&meta), meta);
        meta.running_task = Some(UUID.to_uppercase());
        meta.agent_state = Some(json!("just a string"));
        assert_eq!(read_back_conversation(&meta), meta);
    }

    fn read_back_conversation(meta: &ConversationMeta) -> ConversationMeta {
        for number in [None, Some(0), Some(u64::MAX)] {
            let mut bytes = Vec::new();
            write_conversation(&mut bytes, meta, number);
            assert_eq!(read_conversation(&bytes).unwrap().1, number);
        }
        let mut bytes = Vec::new();
        write_conversation(&mut bytes, meta, Some(7));
        read_conversation(&bytes).unwrap().0
    }

    /// The first records of version 2 were written before conversations had numbers: their
    /// arrays end one field earlier, and read as conversations (and tasks) without one.
    #[test]
    fn version_2_records_from_before_numbers_read_without_one() {
        let meta = ConversationMeta::new("anonymous", CONTEXT);
        let mut bytes = Vec::new();
        write_conversation(&mut bytes, &meta, Some(3));
        // A fixarray header (0x9N) followed by the fields; the number (3) is the last byte.
        assert_eq!((bytes[0], bytes.last()), (0x9A, Some(&3)));
        bytes[0] = 0x99;
        bytes.pop();
        assert_eq!(read_conversation(&bytes).unwrap(), (meta, None));

        let mut record = full_task();
        record.conversation_number = Some(5);
        record.stream = None;
        let mut bytes = Vec::new();
        write_task(&mut bytes, &record);
        assert_eq!((bytes[0], bytes.last()), (0x9C, Some(&5)));
        bytes[0] = 0x9B;
        bytes.pop();
        record.conversation_number = None;
        assert_eq!(read_task(&bytes).unwrap(), record);
    }

    #[test]
    fn a_state_code_no_version_knows_is_an_error() {
        let code = |c: u8| rmp_serde::from_slice::<StoredState>(&rmp_serde::to_vec(&c).unwrap());
        assert_eq!(code(7).unwrap(), StoredState(TaskState::Rejected));
        assert!(code(8).is_err());
        assert!(code(255).is_err());
    }
}
