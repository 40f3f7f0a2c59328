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
use serde_json::value::RawValue;

/// Reads `value` as `T`; errors name the field's path.
pub fn decode<T: DeserializeOwned>(value: &Value) -> FieldResult<T> {
    decode_at(value, "")
}

/// A request's params as a binding hands them over: the JSON-RPC body's text, read straight into
/// the method's typed params (no `Value` tree built, walked and dropped on the way), or a tree
/// the HTTP+JSON and gRPC bindings built from paths, queries and protobuf messages.
#[derive(Debug)]
pub enum Params {
    Text(Box<RawValue>),
    Tree(Value),
}

/// What the HTTP edge reads from the params before dispatch: the tenant the request acts in,
/// and the task it names (which another node may run).
#[derive(Debug, Default, Deserialize)]
pub struct Routing {
    pub tenant: Option<Value>,
    pub id: Option<Value>,
}

impl Params {
    /// Reads the params as `T`; errors name the field's path, whichever form they came in.
    pub fn decode<T: DeserializeOwned>(&self) -> FieldResult<T> {
        match self {
            Params::Tree(value) => decode(value),
            Params::Text(text) => serde_json::from_str(text.get()).map_err(|_| {
                failure::<T, _>(&mut serde_json::Deserializer::from_str(text.get()), "")
            }),
        }
    }

    pub fn routing(&self) -> FieldResult<Routing> {
        match self {
            Params::Tree(value) => Ok(Routing {
                tenant: value.get("tenant").cloned(),
                id: value.get("id").cloned(),
            }),
            // Most params name neither, and then need no reading here: the names appear as
            // they are, or written with a `\u` escape.
            Params::Text(text) => {
                let json = text.get().as_bytes();
                let named = [&b"\"tenant\""[..], b"\"id\"", b"\\u"]
                    .iter()
                    .any(|needle| memchr::memmem::find(json, needle).is_some());
                if named {
                    self.decode()
                } else {
                    Ok(Routing::default())
                }
            }
        }
    }

    /// The params as a tree, parsed if they came as text.
    pub fn tree(&self) -> FieldResult<std::borrow::Cow<'_, Value>> {
        match self {
            Params::Tree(value) => Ok(std::borrow::Cow::Borrowed(value)),
            Params::Text(_) => self.decode().map(std::borrow::Cow::Owned),
        }
    }

    /// The params as a tree to change, parsed first if they came as text.
    pub fn tree_mut(&mut self) -> FieldResult<&mut Value> {
        if let Params::Text(_) = self {
            *self = Params::Tree(self.decode()?);
        }
        match self {
            Params::Tree(value) => Ok(value),
            Params::Text(_) => Err(field_error("params", "could not be read")),
        }
    }

    /// v1.0 input with every field under its JSON name ([`super::protojson`]). Text in which
    /// no member's name has an underscore names no field by its proto name (they all have one)
    /// and stays text.
    pub fn with_json_names(mut self) -> FieldResult<Params> {
        if let Params::Text(text) = &self
            && !may_name_a_member_with_underscore(text.get())
        {
            return Ok(self);
        }
        super::protojson::to_json_names(self.tree_mut()?, "")?;
        Ok(self)
    }
}

/// Whether an underscore in `json` may be in a member's name: the next quote after it is
/// followed by a colon. Underscores in values (`ROLE_USER`) are not, unless a quote in the text
/// is followed by one, which makes this say yes (the caller then takes the slower, exact way).
/// One pass: the underscores before a quote share its answer.
fn may_name_a_member_with_underscore(json: &str) -> bool {
    let bytes = json.as_bytes();
    let mut from = 0;
    while let Some(underscore) = memchr::memchr(b'_', &bytes[from..]) {
        let after = from + underscore;
        let Some(quote) = memchr::memchr(b'"', &bytes[after..]) else {
            return false;
        };
        let quote = after + quote;
        let next = bytes[quote + 1..].iter().find(|b| !b.is_ascii_whitespace());
        if next == Some(&b':') {
            return true;
        }
        from = quote + 1;
    }
    false
}

/// serde_json's message without the " at line L column C" it adds when reading text (a
/// tree's errors have none): the field's path says where.
fn without_position(error: serde_json::Error) -> String {
    let message = error.to_string();
    let position = format!(" at line {} column {}", error.line(), error.column());
    match message.strip_suffix(&position) {
        Some(bare) => bare.to_owned(),
        None => message,
    }
}

/// Reads `value`, found at `at` in the request (`message`, `result.history[2]`), as `T`.
pub fn decode_at<T: DeserializeOwned>(value: &Value, at: &str) -> FieldResult<T> {
    T::deserialize(value).map_err(|_| failure::<T, _>(value, at))
}

/// Where and why `T` could not be read from `input`, found at `at`: read again with the path
/// tracked. The first read tracks nothing, as tracking keeps every member's name.
fn failure<'de, T, D>(input: D, at: &str) -> FieldError
where
    T: Deserialize<'de>,
    D: Deserializer<'de, Error = serde_json::Error>,
{
    match serde_path_to_error::deserialize::<D, T>(input) {
        Err(e) => located(
            join(at, &e.path().to_string()),
            without_position(e.into_inner()),
        ),
        Ok(_) => located(at.to_owned(), "could not be read".to_owned()),
    }
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
pub fn send_request(version: WireVersion, params: &Params) -> FieldResult<SendRequest> {
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

    /// The params as JSON-RPC hands them over (text) and as the other bindings do (a tree).
    fn both_forms(value: Value) -> [Params; 2] {
        let text = RawValue::from_string(value.to_string()).unwrap();
        [Params::Text(text), Params::Tree(value)]
    }

    #[test]
    fn text_and_tree_read_alike_and_fail_alike() {
        for params in both_forms(json!({"id": "t", "historyLength": "3", "other": [1]})) {
            let p: GetTaskParams = params.decode().unwrap();
            assert_eq!((p.id.as_str(), p.history_length), ("t", Some(3)));
        }
        for params in both_forms(json!({"historyLength": 1})) {
            let e = params.decode::<GetTaskParams>().unwrap_err();
            assert_eq!(e.to_string(), "id: is required");
        }
        for params in both_forms(json!({"id": 5})) {
            let e = params.decode::<GetTaskParams>().unwrap_err();
            assert_eq!(
                e.to_string(),
                "id: invalid type: integer `5`, expected a string"
            );
        }
        let message =
            json!({"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "x", "raw": "eA=="}]});
        let [text, tree] = both_forms(json!({"message": message}));
        let (text, tree) = (
            send_request(WireVersion::V1, &text).unwrap_err(),
            send_request(WireVersion::V1, &tree).unwrap_err(),
        );
        assert_eq!(text.to_string(), tree.to_string());
        assert!(text.path.starts_with("message.parts[0]"), "{text}");
    }

    #[test]
    fn routing_reads_the_tenant_and_task_however_they_are_written() {
        let routing = |json: &str| {
            let text = Params::Text(RawValue::from_string(json.to_owned()).unwrap());
            let Routing { tenant, id } = text.routing().unwrap();
            (tenant, id)
        };
        assert_eq!(routing(r#"{"message": {"messageId": "id"}}"#), (None, None));
        assert_eq!(
            routing(r#"{"tenant": "a", "id": "t"}"#),
            (Some(json!("a")), Some(json!("t")))
        );
        assert_eq!(routing(r#"{"\u0074enant": "a"}"#), (Some(json!("a")), None));
        let [text, tree] = both_forms(json!({"tenant": 5, "id": "t"}));
        assert_eq!(
            text.routing().unwrap().tenant,
            tree.routing().unwrap().tenant
        );
    }

    #[test]
    fn proto_names_make_text_a_tree_with_json_names() {
        let [text, _] = both_forms(json!({"id": "t", "history_length": 2}));
        let renamed = text.with_json_names().unwrap();
        assert!(matches!(renamed, Params::Tree(_)));
        let p: GetTaskParams = renamed.decode().unwrap();
        assert_eq!(p.history_length, Some(2));
        let [plain, _] = both_forms(json!({"id": "t", "historyLength": 2, "role": "ROLE_USER"}));
        assert!(matches!(plain.with_json_names().unwrap(), Params::Text(_)));
        for (json, member) in [
            (r#"{"a": "ROLE_USER", "b": 1}"#, false),
            (r#"{"a": "x_y", "b_c" : 1}"#, true),
            (r#"{"a": {"task_id":"t"}}"#, true),
            (r#"{"text": "a_b\": c"}"#, true),
            (r#"{"a": "_", "b": "_"}"#, false),
        ] {
            assert_eq!(may_name_a_member_with_underscore(json), member, "{json}");
        }
    }

    #[test]
    fn send_configuration_per_version() {
        let tree = |value: Value| Params::Tree(value);
        let message = json!({"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "x"}]});
        let v1 = send_request(
            WireVersion::V1,
            &tree(json!({"message": message, "configuration": {"returnImmediately": true, "historyLength": 2}})),
        )
        .unwrap();
        assert!(v1.return_immediately);
        assert_eq!(v1.history_length, Some(2));
        let message = json!({"kind": "message", "messageId": "m", "role": "user", "parts": [{"kind": "text", "text": "x"}]});
        let v03 = send_request(
            WireVersion::V03,
            &tree(json!({"message": message, "configuration": {"blocking": false, "pushNotificationConfig": {"url": "u"}}})),
        )
        .unwrap();
        assert!(v03.return_immediately);
        assert!(v03.push_notification);
        let bad = send_request(
            WireVersion::V03,
            &tree(json!({"message": message, "configuration": {"blocking": "yes"}})),
        )
        .unwrap_err();
        assert_eq!(bad.path, "configuration.blocking");
        let none = send_request(WireVersion::V1, &tree(json!({}))).unwrap_err();
        assert_eq!(none.to_string(), "message: is required");
    }
}
