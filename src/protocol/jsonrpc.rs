//! The JSON-RPC 2.0 envelope and the one place error values become codes, messages and data.
//!
//! A pure wire module: which engine failure becomes which [`RpcError`] is the HTTP edge's
//! business (`http::errors`).

use super::WireVersion;
use super::codec::JsonText;
use super::fields::FieldError;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

/// Every JSON-RPC error colloquy answers with. [`RpcError::code`] is the one mapping to codes.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RpcError {
    #[error("parse error: {0}")]
    Parse(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("{0}")]
    MethodNotFound(String),
    #[error("invalid params: {0}")]
    InvalidParams(String),
    #[error("internal error: {0}")]
    Internal(String),
    #[error("task not found: {0}")]
    TaskNotFound(String),
    #[error("task not cancelable: {0}")]
    TaskNotCancelable(String),
    #[error("push notifications are not supported")]
    PushNotSupported,
    #[error("unsupported operation: {0}")]
    Unsupported(String),
    #[error("content type not supported: {0}")]
    ContentTypeNotSupported(String),
    #[error(
        "A2A version {0:?} is not supported (JSON-RPC at POST / speaks 1.0, and 0.3 with no header; the HTTP+JSON routes speak 1.0)"
    )]
    VersionNotSupported(String),
    #[error("no extended agent card is configured")]
    ExtendedCardNotConfigured,
    #[error(
        "context busy: task {task_id} is still running in context {context_id}; retry when it has finished"
    )]
    ContextBusy { context_id: String, task_id: String },
    #[error("server overloaded: too many turns running; retry in {retry_after_ms} ms")]
    Overloaded { retry_after_ms: u64 },
    #[error(
        "stream closed: this subscriber fell more than {0} events behind; resubscribe to continue from the task's current state"
    )]
    SubscriberTooSlow(usize),
    #[error("the server is shutting down; retry on another instance or later")]
    ShuttingDown,
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// A bearer token was presented and refused (RFC 6750's `invalid_token`).
    #[error("unauthenticated: {0}")]
    InvalidToken(String),
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    #[error("conversation not found: {0}")]
    ConversationNotFound(String),
    /// Nothing of the request was stored; the same request may be sent again.
    #[error("{why}; nothing was stored, retry in {retry_after_ms} ms")]
    StoreUnavailable { why: String, retry_after_ms: u64 },
}

/// How one error is spelled on each binding: the one table, so the bindings cannot disagree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorSpelling {
    /// The JSON-RPC `error.code`.
    pub code: i64,
    /// The `google.rpc.ErrorInfo` reason: the spec's for A2A errors, ours for our own codes.
    pub reason: &'static str,
    /// The HTTP status on the HTTP+JSON binding.
    pub http_status: u16,
    /// The `google.rpc.Code` name on the HTTP+JSON binding (`error.status`).
    pub status: &'static str,
}

const fn spelling(
    code: i64,
    reason: &'static str,
    http_status: u16,
    status: &'static str,
) -> ErrorSpelling {
    ErrorSpelling {
        code,
        reason,
        http_status,
        status,
    }
}

/// The `ErrorInfo` domain the v1.0 specification requires.
pub const ERROR_DOMAIN: &str = "a2a-protocol.org";
pub const ERROR_INFO_TYPE: &str = "type.googleapis.com/google.rpc.ErrorInfo";

impl RpcError {
    /// Codes and HTTP statuses as the specification's error mapping table pairs them.
    pub fn spelling(&self) -> ErrorSpelling {
        match self {
            RpcError::Parse(_) => spelling(-32700, "PARSE_ERROR", 400, "INVALID_ARGUMENT"),
            RpcError::InvalidRequest(_) => {
                spelling(-32600, "INVALID_REQUEST", 400, "INVALID_ARGUMENT")
            }
            RpcError::MethodNotFound(_) => spelling(-32601, "METHOD_NOT_FOUND", 404, "NOT_FOUND"),
            RpcError::InvalidParams(_) => {
                spelling(-32602, "INVALID_PARAMS", 400, "INVALID_ARGUMENT")
            }
            RpcError::Internal(_) => spelling(-32603, "INTERNAL_ERROR", 500, "INTERNAL"),
            RpcError::TaskNotFound(_) => spelling(-32001, "TASK_NOT_FOUND", 404, "NOT_FOUND"),
            RpcError::TaskNotCancelable(_) => {
                spelling(-32002, "TASK_NOT_CANCELABLE", 409, "FAILED_PRECONDITION")
            }
            RpcError::PushNotSupported => spelling(
                -32003,
                "PUSH_NOTIFICATION_NOT_SUPPORTED",
                400,
                "UNIMPLEMENTED",
            ),
            RpcError::Unsupported(_) => {
                spelling(-32004, "UNSUPPORTED_OPERATION", 400, "UNIMPLEMENTED")
            }
            RpcError::ContentTypeNotSupported(_) => spelling(
                -32005,
                "CONTENT_TYPE_NOT_SUPPORTED",
                415,
                "INVALID_ARGUMENT",
            ),
            RpcError::ExtendedCardNotConfigured => spelling(
                -32007,
                "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
                400,
                "FAILED_PRECONDITION",
            ),
            RpcError::VersionNotSupported(_) => {
                spelling(-32009, "VERSION_NOT_SUPPORTED", 400, "UNIMPLEMENTED")
            }
            RpcError::ContextBusy { .. } => spelling(-32010, "CONTEXT_BUSY", 409, "ABORTED"),
            RpcError::Overloaded { .. } => spelling(-32011, "OVERLOADED", 503, "UNAVAILABLE"),
            RpcError::SubscriberTooSlow(_) => {
                spelling(-32012, "SUBSCRIBER_TOO_SLOW", 429, "RESOURCE_EXHAUSTED")
            }
            RpcError::ShuttingDown => spelling(-32013, "SHUTTING_DOWN", 503, "UNAVAILABLE"),
            RpcError::Unauthenticated(_) | RpcError::InvalidToken(_) => {
                spelling(-32014, "UNAUTHENTICATED", 401, "UNAUTHENTICATED")
            }
            RpcError::PermissionDenied(_) => {
                spelling(-32017, "PERMISSION_DENIED", 403, "PERMISSION_DENIED")
            }
            RpcError::ConversationNotFound(_) => {
                spelling(-32015, "CONVERSATION_NOT_FOUND", 404, "NOT_FOUND")
            }
            RpcError::StoreUnavailable { .. } => {
                spelling(-32016, "STORE_UNAVAILABLE", 503, "UNAVAILABLE")
            }
        }
    }

    /// The `WWW-Authenticate` challenge an HTTP answer with this error carries (RFC 6750).
    pub fn www_authenticate(&self) -> Option<&'static str> {
        match self {
            RpcError::Unauthenticated(_) => Some("Bearer"),
            RpcError::InvalidToken(_) => Some("Bearer error=\"invalid_token\""),
            _ => None,
        }
    }

    pub fn code(&self) -> i64 {
        self.spelling().code
    }

    /// The JSON-RPC code of an `ErrorInfo` reason (for a client reading HTTP+JSON errors).
    pub fn code_for_reason(reason: &str) -> Option<i64> {
        Self::spelling_of_reason(reason).map(|s| s.code)
    }

    /// How the error with `ErrorInfo` reason `reason` is spelled on every binding.
    pub fn spelling_of_reason(reason: &str) -> Option<ErrorSpelling> {
        let none = String::new;
        [
            RpcError::Parse(none()),
            RpcError::InvalidRequest(none()),
            RpcError::MethodNotFound(none()),
            RpcError::InvalidParams(none()),
            RpcError::Internal(none()),
            RpcError::TaskNotFound(none()),
            RpcError::TaskNotCancelable(none()),
            RpcError::PushNotSupported,
            RpcError::Unsupported(none()),
            RpcError::ContentTypeNotSupported(none()),
            RpcError::VersionNotSupported(none()),
            RpcError::ExtendedCardNotConfigured,
            RpcError::ContextBusy {
                context_id: none(),
                task_id: none(),
            },
            RpcError::Overloaded { retry_after_ms: 0 },
            RpcError::SubscriberTooSlow(0),
            RpcError::ShuttingDown,
            RpcError::Unauthenticated(none()),
            RpcError::PermissionDenied(none()),
            RpcError::ConversationNotFound(none()),
            RpcError::StoreUnavailable {
                why: none(),
                retry_after_ms: 0,
            },
        ]
        .iter()
        .map(RpcError::spelling)
        .find(|s| s.reason == reason)
    }

    /// What a client needs to act on the error, beyond its code: `ErrorInfo.metadata` in v1.0.
    pub fn details(&self) -> Map<String, Value> {
        let mut details = Map::new();
        match self {
            RpcError::ContextBusy {
                context_id,
                task_id,
            } => {
                details.insert("contextId".into(), json!(context_id));
                details.insert("taskId".into(), json!(task_id));
            }
            RpcError::Overloaded { retry_after_ms }
            | RpcError::StoreUnavailable { retry_after_ms, .. } => {
                details.insert("retryAfterMs".into(), json!(retry_after_ms));
            }
            _ => {}
        }
        details
    }

    /// The `google.rpc.ErrorInfo` every v1.0 error carries (JSON-RPC `data`, HTTP+JSON `details`).
    pub fn error_info(&self) -> Value {
        json!({
            "@type": ERROR_INFO_TYPE,
            "reason": self.spelling().reason,
            "domain": ERROR_DOMAIN,
            "metadata": self.details(),
        })
    }

    /// v1.0: an array holding the `ErrorInfo`; v0.3: a plain object, when there is something to say.
    fn data(&self, version: WireVersion) -> Option<Value> {
        match version {
            WireVersion::V1 => Some(json!([self.error_info()])),
            WireVersion::V03 => {
                let details = self.details();
                (!details.is_empty()).then_some(Value::Object(details))
            }
        }
    }

    /// The HTTP+JSON binding's error body: a `google.rpc.Status` in JSON, under `error`.
    pub fn to_rest_json(&self) -> Value {
        let spelling = self.spelling();
        json!({
            "error": {
                "code": spelling.http_status,
                "status": spelling.status,
                "message": self.to_string(),
                "details": [self.error_info()],
            }
        })
    }

    pub fn to_json(&self, version: WireVersion) -> Value {
        let mut error = Map::new();
        error.insert("code".into(), json!(self.code()));
        error.insert("message".into(), json!(self.to_string()));
        if let Some(data) = self.data(version) {
            error.insert("data".into(), data);
        }
        Value::Object(error)
    }
}

impl From<FieldError> for RpcError {
    fn from(e: FieldError) -> Self {
        RpcError::InvalidParams(e.to_string())
    }
}

/// A request id: a string, a number or null (JSON-RPC forbids objects and arrays).
pub type RequestId = Value;

#[derive(Debug)]
pub struct RpcRequest {
    pub id: RequestId,
    pub method: String,
    /// The params object's text (`{}` when absent or null), read by the method into its own
    /// typed params.
    pub params: Box<RawValue>,
}

/// The envelope's members as the body spells them (`null` included), each checked apart, so
/// each gets its own error. Other members are ignored.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default, deserialize_with = "given")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "given")]
    jsonrpc: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "given")]
    method: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "given")]
    params: Option<&'a RawValue>,
}

/// A member that is there, even as `null` (an `Option` alone would read `null` as absent).
fn given<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

impl RpcRequest {
    /// Checks the envelope. On error, returns the id to answer with (null when unknown).
    pub fn parse(body: &[u8]) -> Result<RpcRequest, (RequestId, RpcError)> {
        let not_json =
            |e: serde_json::Error| RpcError::Parse(format!("the body is not valid JSON: {e}"));
        let opens_object = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
        if !opens_object {
            // Not an object: say what it is, or why it is no JSON at all.
            let value: Value =
                serde_json::from_slice(body).map_err(|e| (Value::Null, not_json(e)))?;
            let problem = match value {
                Value::Array(_) => "batch requests are not supported; send one request per call",
                _ => "the request must be a JSON object",
            };
            return Err((Value::Null, RpcError::InvalidRequest(problem.into())));
        }
        let envelope: Envelope = serde_json::from_slice(body).map_err(|e| {
            let error = match e.classify() {
                // A member given twice.
                serde_json::error::Category::Data => {
                    RpcError::InvalidRequest(format!("the request is not a JSON-RPC envelope: {e}"))
                }
                _ => not_json(e),
            };
            (Value::Null, error)
        })?;
        let id = match envelope.id.map(scalar) {
            None => Value::Null,
            Some(Some(id @ (Value::String(_) | Value::Number(_) | Value::Null))) => id,
            Some(_) => {
                return Err((
                    Value::Null,
                    RpcError::InvalidRequest("id must be a string, a number or null".into()),
                ));
            }
        };
        let fail = |e: RpcError| Err((id.clone(), e));
        match envelope.jsonrpc.map(scalar) {
            Some(Some(Value::String(v))) if v == "2.0" => {}
            None => {
                return fail(RpcError::InvalidRequest(
                    "jsonrpc is required (\"2.0\")".into(),
                ));
            }
            Some(_) => return fail(RpcError::InvalidRequest("jsonrpc must be \"2.0\"".into())),
        }
        let method = match envelope.method.map(scalar) {
            Some(Some(Value::String(m))) => m,
            None => return fail(RpcError::InvalidRequest("method is required".into())),
            Some(_) => return fail(RpcError::InvalidRequest("method must be a string".into())),
        };
        let params = match envelope.params.filter(|raw| raw.get() != "null") {
            None => empty_params().map_err(|e| (id.clone(), e))?,
            Some(raw) if raw.get().starts_with('{') => raw.to_owned(),
            Some(_) => return fail(RpcError::InvalidParams("params must be an object".into())),
        };
        Ok(RpcRequest { id, method, params })
    }
}

/// A member's value if it is a string, number, boolean or null, all an envelope's members but
/// params may be; `None` for an array or an object, however deep (read as JSON already, a
/// scalar parses).
fn scalar(raw: &RawValue) -> Option<Value> {
    match raw.get().as_bytes().first() {
        Some(b'[' | b'{') => None,
        _ => serde_json::from_str(raw.get()).ok(),
    }
}

/// `{}`, the params of a request that gives none. (Checked as JSON by serde_json, so a
/// `Result`; it never fails.)
fn empty_params() -> Result<Box<RawValue>, RpcError> {
    RawValue::from_string("{}".to_owned())
        .map_err(|e| RpcError::Internal(format!("empty params: {e}")))
}

/// A JSON-RPC success, borrowing its id and result: serialized straight into the response
/// body, so the result (a `Value` or text already written) is never copied into a new tree.
#[derive(serde::Serialize)]
pub struct Success<'a, R: ?Sized + serde::Serialize> {
    jsonrpc: &'static str,
    id: &'a RequestId,
    result: &'a R,
}

pub fn success<'a, R: ?Sized + serde::Serialize>(
    id: &'a RequestId,
    result: &'a R,
) -> Success<'a, R> {
    Success {
        jsonrpc: "2.0",
        id,
        result,
    }
}

/// A success around a result already written as JSON text: the envelope is written around
/// the text, which is copied once.
pub fn success_text(id: &RequestId, result: &JsonText) -> Vec<u8> {
    let mut body = Vec::with_capacity(result.as_bytes().len() + 64);
    body.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    if serde_json::to_writer(&mut body, id).is_err() {
        // An id is a string, a number or null (`RpcRequest::parse`): it always serializes.
        body.extend_from_slice(b"null");
    }
    body.extend_from_slice(br#","result":"#);
    body.extend_from_slice(result.as_bytes());
    body.push(b'}');
    body
}

pub fn failure(id: &RequestId, error: &RpcError, version: WireVersion) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": error.to_json(version) })
}

#[cfg(test)]
mod tests {
    use super::RpcError;

    #[test]
    fn reasons_map_back_to_their_codes() {
        assert_eq!(RpcError::code_for_reason("TASK_NOT_FOUND"), Some(-32001));
        assert_eq!(
            RpcError::code_for_reason("CONTENT_TYPE_NOT_SUPPORTED"),
            Some(-32005)
        );
        assert_eq!(RpcError::code_for_reason("CONTEXT_BUSY"), Some(-32010));
        assert_eq!(
            RpcError::code_for_reason("CONVERSATION_NOT_FOUND"),
            Some(-32015)
        );
        assert_eq!(RpcError::code_for_reason("NOT_A_REASON"), None);
    }
}
