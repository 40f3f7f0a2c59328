//! The JSON-RPC 2.0 envelope and the one place error values become codes, messages and data.
//!
//! A pure wire module: which engine failure becomes which [`RpcError`] is the HTTP edge's
//! business (`http::errors`).

use super::WireVersion;
use super::fields::FieldError;
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
    #[error("A2A version {0:?} is not supported (use 1.0, or 0.3 / no header)")]
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
    #[error("conversation not found: {0}")]
    ConversationNotFound(String),
}

impl RpcError {
    pub fn code(&self) -> i64 {
        match self {
            RpcError::Parse(_) => -32700,
            RpcError::InvalidRequest(_) => -32600,
            RpcError::MethodNotFound(_) => -32601,
            RpcError::InvalidParams(_) => -32602,
            RpcError::Internal(_) => -32603,
            RpcError::TaskNotFound(_) => -32001,
            RpcError::TaskNotCancelable(_) => -32002,
            RpcError::PushNotSupported => -32003,
            RpcError::Unsupported(_) => -32004,
            RpcError::ContentTypeNotSupported(_) => -32005,
            RpcError::VersionNotSupported(_) => -32009,
            RpcError::ExtendedCardNotConfigured => -32007,
            RpcError::ContextBusy { .. } => -32010,
            RpcError::Overloaded { .. } => -32011,
            RpcError::SubscriberTooSlow(_) => -32012,
            RpcError::ShuttingDown => -32013,
            RpcError::Unauthenticated(_) => -32014,
            RpcError::ConversationNotFound(_) => -32015,
        }
    }

    fn reason(&self) -> &'static str {
        match self {
            RpcError::Parse(_) => "PARSE_ERROR",
            RpcError::InvalidRequest(_) => "INVALID_REQUEST",
            RpcError::MethodNotFound(_) => "METHOD_NOT_FOUND",
            RpcError::InvalidParams(_) => "INVALID_PARAMS",
            RpcError::Internal(_) => "INTERNAL_ERROR",
            RpcError::TaskNotFound(_) => "TASK_NOT_FOUND",
            RpcError::TaskNotCancelable(_) => "TASK_NOT_CANCELABLE",
            RpcError::PushNotSupported => "PUSH_NOTIFICATION_NOT_SUPPORTED",
            RpcError::Unsupported(_) => "UNSUPPORTED_OPERATION",
            RpcError::ContentTypeNotSupported(_) => "CONTENT_TYPE_NOT_SUPPORTED",
            RpcError::VersionNotSupported(_) => "VERSION_NOT_SUPPORTED",
            RpcError::ExtendedCardNotConfigured => "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
            RpcError::ContextBusy { .. } => "CONTEXT_BUSY",
            RpcError::Overloaded { .. } => "OVERLOADED",
            RpcError::SubscriberTooSlow(_) => "SUBSCRIBER_TOO_SLOW",
            RpcError::ShuttingDown => "SHUTTING_DOWN",
            RpcError::Unauthenticated(_) => "UNAUTHENTICATED",
            RpcError::ConversationNotFound(_) => "CONVERSATION_NOT_FOUND",
        }
    }

    fn details(&self) -> Map<String, Value> {
        let mut details = Map::new();
        match self {
            RpcError::ContextBusy {
                context_id,
                task_id,
            } => {
                details.insert("contextId".into(), json!(context_id));
                details.insert("taskId".into(), json!(task_id));
            }
            RpcError::Overloaded { retry_after_ms } => {
                details.insert("retryAfterMs".into(), json!(retry_after_ms));
            }
            _ => {}
        }
        details
    }

    /// v1.0: an array of `google.rpc.ErrorInfo`-shaped objects; v0.3: a plain object, when there is something to say.
    fn data(&self, version: WireVersion) -> Option<Value> {
        let details = self.details();
        match version {
            WireVersion::V1 => Some(json!([{
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": self.reason(),
                "domain": "colloquy",
                "metadata": details,
            }])),
            WireVersion::V03 if details.is_empty() => None,
            WireVersion::V03 => Some(Value::Object(details)),
        }
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

#[derive(Debug, Clone)]
pub struct RpcRequest {
    pub id: RequestId,
    pub method: String,
    pub params: Value,
}

impl RpcRequest {
    /// Checks the envelope. On error, returns the id to answer with (null when unknown).
    pub fn parse(body: &[u8]) -> Result<RpcRequest, (RequestId, RpcError)> {
        let value: Value = serde_json::from_slice(body).map_err(|e| {
            (
                Value::Null,
                RpcError::Parse(format!("the body is not valid JSON: {e}")),
            )
        })?;
        let object = match value {
            Value::Object(object) => object,
            Value::Array(_) => {
                return Err((
                    Value::Null,
                    RpcError::InvalidRequest(
                        "batch requests are not supported; send one request per call".into(),
                    ),
                ));
            }
            _ => {
                return Err((
                    Value::Null,
                    RpcError::InvalidRequest("the request must be a JSON object".into()),
                ));
            }
        };
        let id = match object.get("id") {
            None => Value::Null,
            Some(id @ (Value::String(_) | Value::Number(_) | Value::Null)) => id.clone(),
            Some(_) => {
                return Err((
                    Value::Null,
                    RpcError::InvalidRequest("id must be a string, a number or null".into()),
                ));
            }
        };
        let fail = |e: RpcError| Err((id.clone(), e));
        match object.get("jsonrpc") {
            Some(Value::String(v)) if v == "2.0" => {}
            Some(_) => return fail(RpcError::InvalidRequest("jsonrpc must be \"2.0\"".into())),
            None => {
                return fail(RpcError::InvalidRequest(
                    "jsonrpc is required (\"2.0\")".into(),
                ));
            }
        }
        let method = match object.get("method") {
            Some(Value::String(m)) => m.clone(),
            Some(_) => return fail(RpcError::InvalidRequest("method must be a string".into())),
            None => return fail(RpcError::InvalidRequest("method is required".into())),
        };
        let params = match object.get("params") {
            None | Some(Value::Null) => Value::Object(Map::new()),
            Some(params @ Value::Object(_)) => params.clone(),
            Some(_) => return fail(RpcError::InvalidParams("params must be an object".into())),
        };
        Ok(RpcRequest { id, method, params })
    }
}

pub fn success(id: &RequestId, result: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "result": result })
}

pub fn failure(id: &RequestId, error: &RpcError, version: WireVersion) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": error.to_json(version) })
}
