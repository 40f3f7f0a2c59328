//! A2A v0.3's wire types where they differ from v1.0's (see [`super::params`] for the rest).

use super::WireVersion;
use super::codec;
use super::fields::FieldResult;
use super::params::{Base64, SendRequest, decode, decode_at};
use crate::model::{Message, Metadata, Part, PartContent, Role};
use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny};
use serde_json::Value;

/// `MessageSendParams`: the params of `message/send` and `message/stream`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageSendParams {
    /// Required here; read by the codec, which names the fields inside it.
    #[serde(rename = "message")]
    _message: IgnoredAny,
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
    pub fn read(params: &Value) -> FieldResult<SendRequest> {
        let request: MessageSendParams = decode(params)?;
        let message = decode_message(&params["message"], "message")?;
        let configuration = request.configuration;
        Ok(SendRequest {
            message,
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
    type Error = String;

    fn try_from(raw: RawPart) -> Result<Self, String> {
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
                ));
            }
        };
        part.metadata = raw.metadata;
        Ok(WirePart(part))
    }
}

/// A v0.3 `Message` found at `at`.
pub fn decode_message(value: &Value, at: &str) -> FieldResult<Message> {
    let wire: WireMessage = decode_at(value, at)?;
    Ok(Message {
        message_id: wire.message_id,
        role: wire.role.0,
        parts: wire.parts.into_iter().map(|p| p.0).collect(),
        context_id: wire.context_id,
        task_id: wire.task_id,
        reference_task_ids: wire.reference_task_ids.unwrap_or_default(),
        metadata: wire.metadata,
        extensions: wire.extensions.unwrap_or_default(),
        timestamp: None,
    })
}

/// A v0.3 `Part` found at `at`.
pub fn decode_part(value: &Value, at: &str) -> FieldResult<Part> {
    decode_at::<WirePart>(value, at).map(|p| p.0)
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
}
