//! Every method's params as a typed struct, read by serde. A field that does not fit is named by
//! its path as the deserializer found it (`configuration.blocking`), with the problem.
//!
//! Params the two versions spell alike live here; `SendMessage`'s, which differ, live in
//! [`super::v1`] and [`super::v03`], and [`send_request`] is the one place that picks between them.

use super::WireVersion;
use super::fields::{FieldError, FieldResult, field_error};
use super::{v1, v03};
use crate::model::Message;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer, Visitor};
use serde_json::Value;

/// Reads `value` as `T`; errors name the field's path.
pub fn decode<T: DeserializeOwned>(value: &Value) -> FieldResult<T> {
    decode_at(value, "")
}

/// Reads `value`, found at `at` in the request (`message`, `result.history[2]`), as `T`.
pub fn decode_at<T: DeserializeOwned>(value: &Value, at: &str) -> FieldResult<T> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = join(at, &e.path().to_string());
        located(path, e.into_inner().to_string())
    })
}

/// The path of `relative` (a field, `[i]`, or `.` for itself) inside the value at `at`.
pub(super) fn join(at: &str, relative: &str) -> String {
    match relative {
        "." => at.to_owned(),
        _ if at.is_empty() => relative.to_owned(),
        _ if relative.starts_with('[') => format!("{at}{relative}"),
        _ => format!("{at}.{relative}"),
    }
}

/// Base64 text (kept as text: the model carries it so), checked on the way in.
#[derive(Debug)]
pub struct Base64(pub String);

impl<'de> Deserialize<'de> for Base64 {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use base64::Engine as _;
        let text = String::deserialize(deserializer)?;
        base64::engine::general_purpose::STANDARD
            .decode(&text)
            .map_err(|e| de::Error::custom(format!("not valid base64: {e}")))?;
        Ok(Base64(text))
    }
}

fn located(path: String, problem: String) -> FieldError {
    // serde reports a missing field at its parent: name the field itself, as the codec does.
    if let Some(name) = problem
        .strip_prefix("missing field `")
        .and_then(|rest| rest.strip_suffix('`'))
    {
        let field = if path.is_empty() {
            name.to_owned()
        } else {
            format!("{path}.{name}")
        };
        return field_error(field, "is required");
    }
    field_error(if path.is_empty() { "params" } else { &path }, problem)
}

/// A non-negative integer, as a JSON number or (as ProtoJSON allows for 64-bit fields) a decimal
/// string; `null` or absent is `None`.
pub(super) fn count<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    struct Count;
    const PROBLEM: &str = "must be a non-negative integer";
    impl<'de> Visitor<'de> for Count {
        type Value = Option<u64>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a non-negative integer")
        }
        fn visit_u64<E: de::Error>(self, n: u64) -> Result<Self::Value, E> {
            Ok(Some(n))
        }
        fn visit_i64<E: de::Error>(self, n: i64) -> Result<Self::Value, E> {
            u64::try_from(n).map(Some).map_err(|_| E::custom(PROBLEM))
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Err(E::custom(PROBLEM))
        }
        fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
            text.parse().map(Some).map_err(|_| E::custom(PROBLEM))
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    deserializer.deserialize_any(Count)
}

/// An ISO 8601 / RFC 3339 timestamp string.
fn timestamp<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<DateTime<Utc>>, D::Error> {
    let Some(text) = Option::<String>::deserialize(deserializer)? else {
        return Ok(None);
    };
    DateTime::parse_from_rfc3339(&text)
        .map(|t| Some(t.with_timezone(&Utc)))
        .map_err(|e| de::Error::custom(format!("not an ISO 8601 timestamp: {e}")))
}

/// A status time as both versions carry it: RFC 3339, kept to milliseconds in the years 0000 to
/// 9999 UTC, so a decoded time re-encodes (and decodes again) to itself. Absent is `None`.
pub(super) fn wire_time<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<DateTime<Utc>>, D::Error> {
    let Some(text) = Option::<String>::deserialize(deserializer)? else {
        return Ok(None);
    };
    let time = DateTime::parse_from_rfc3339(&text)
        .map_err(|e| de::Error::custom(format!("not an RFC 3339 time: {e}")))?;
    DateTime::from_timestamp_millis(time.timestamp_millis())
        .filter(|t| (0..=9999).contains(&chrono::Datelike::year(t)))
        .map(Some)
        .ok_or_else(|| de::Error::custom("must lie between the years 0000 and 9999 in UTC"))
}

/// A task state as `version` spells it.
pub(super) fn task_state<'de, D: Deserializer<'de>>(
    version: WireVersion,
    deserializer: D,
) -> Result<crate::model::TaskState, D::Error> {
    let name = String::deserialize(deserializer)?;
    super::codec::parse_state(version, &name).ok_or_else(|| {
        de::Error::custom(format!(
            "unknown task state {name:?} for A2A {}",
            version.label()
        ))
    })
}

/// `GetTask` / `tasks/get`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GetTaskParams {
    pub id: String,
    #[serde(default, deserialize_with = "count")]
    pub history_length: Option<u64>,
}

/// `CancelTask` / `tasks/cancel`.
#[derive(Debug, Deserialize)]
pub struct TaskIdParams {
    pub id: String,
}

/// `SubscribeToTask` / `tasks/resubscribe`; `lastEventId` is colloquy's: where a stream that
/// resumes goes on from (the HTTP bindings also take it from `Last-Event-ID`). `turnOnly` is
/// colloquy's too, sent between nodes: a stream relayed to another node ends with its turn.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubscribeParams {
    pub id: String,
    #[serde(default)]
    pub last_event_id: Option<String>,
    #[serde(default)]
    pub turn_only: bool,
}

/// `ListTasks` / `tasks/list`. `status` is spelled per version; [`ListTasksParams::state`] reads it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListTasksParams {
    pub context_id: Option<String>,
    pub status: Option<String>,
    #[serde(default, deserialize_with = "count")]
    pub page_size: Option<u64>,
    pub page_token: Option<String>,
    #[serde(default, deserialize_with = "count")]
    pub history_length: Option<u64>,
    #[serde(default, deserialize_with = "timestamp")]
    pub status_timestamp_after: Option<DateTime<Utc>>,
    #[serde(default)]
    pub include_artifacts: Option<bool>,
}

impl ListTasksParams {
    pub fn state(&self, version: WireVersion) -> FieldResult<Option<crate::model::TaskState>> {
        let Some(name) = &self.status else {
            return Ok(None);
        };
        super::codec::parse_state(version, name)
            .map(Some)
            .ok_or_else(|| {
                field_error(
                    "status",
                    format!("unknown task state {name:?} for A2A {}", version.label()),
                )
            })
    }
}

/// `colloquy/listConversations`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListConversationsParams {
    #[serde(default, deserialize_with = "count")]
    pub page_size: Option<u64>,
    pub page_token: Option<String>,
}

/// `colloquy/getConversation`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GetConversationParams {
    pub context_id: String,
    #[serde(default, deserialize_with = "count")]
    pub history_length: Option<u64>,
    pub page_token: Option<String>,
}

/// `colloquy/deleteConversation`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContextParams {
    pub context_id: String,
}

/// A send, whichever version spelled it.
#[derive(Debug)]
pub struct SendRequest {
    pub message: Message,
    /// Answer with the task as soon as it is stored instead of when the turn ends.
    pub return_immediately: bool,
    pub history_length: Option<u64>,
    /// The request asked for push notifications (a config in `configuration`).
    pub push_notification: bool,
}

/// `SendMessage` / `SendStreamingMessage` params in v1.0, `message/send` / `message/stream` in v0.3.
pub fn send_request(version: WireVersion, params: &Value) -> FieldResult<SendRequest> {
    match version {
        WireVersion::V1 => v1::SendMessageRequest::read(params),
        WireVersion::V03 => v03::MessageSendParams::read(params),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn errors_name_the_field_and_the_problem() {
        let missing = decode::<GetTaskParams>(&json!({})).unwrap_err();
        assert_eq!(missing.to_string(), "id: is required");
        let negative =
            decode::<GetTaskParams>(&json!({"id": "t", "historyLength": -1})).unwrap_err();
        assert_eq!(
            negative.to_string(),
            "historyLength: must be a non-negative integer"
        );
        let wrong = decode::<ListTasksParams>(&json!({"includeArtifacts": "yes"})).unwrap_err();
        assert_eq!(wrong.path, "includeArtifacts");
        let time = decode::<ListTasksParams>(&json!({"statusTimestampAfter": "x"})).unwrap_err();
        assert!(
            time.to_string()
                .starts_with("statusTimestampAfter: not an ISO 8601"),
            "{time}"
        );
    }

    #[test]
    fn counts_come_as_numbers_or_decimal_strings_and_null_is_absent() {
        let p: GetTaskParams = decode(&json!({"id": "t", "historyLength": "3"})).unwrap();
        assert_eq!(p.history_length, Some(3));
        let p: GetTaskParams = decode(&json!({"id": "t", "historyLength": null})).unwrap();
        assert_eq!(p.history_length, None);
    }

    #[test]
    fn send_configuration_per_version() {
        let message = json!({"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "x"}]});
        let v1 = send_request(
            WireVersion::V1,
            &json!({"message": message, "configuration": {"returnImmediately": true, "historyLength": 2}}),
        )
        .unwrap();
        assert!(v1.return_immediately);
        assert_eq!(v1.history_length, Some(2));
        let message = json!({"kind": "message", "messageId": "m", "role": "user", "parts": [{"kind": "text", "text": "x"}]});
        let v03 = send_request(
            WireVersion::V03,
            &json!({"message": message, "configuration": {"blocking": false, "pushNotificationConfig": {"url": "u"}}}),
        )
        .unwrap();
        assert!(v03.return_immediately);
        assert!(v03.push_notification);
        let bad = send_request(
            WireVersion::V03,
            &json!({"message": message, "configuration": {"blocking": "yes"}}),
        )
        .unwrap_err();
        assert_eq!(bad.path, "configuration.blocking");
        let none = send_request(WireVersion::V1, &json!({})).unwrap_err();
        assert_eq!(none.to_string(), "message: is required");
    }
}
