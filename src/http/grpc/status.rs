//! Errors on the gRPC binding: the gRPC status the specification pairs with each error (the
//! `google.rpc.Code` the HTTP+JSON binding names too, from the one table in
//! [`RpcError::spelling`]), carrying the same `google.rpc.ErrorInfo` as the other bindings.

use crate::protocol::RpcError;
use crate::protocol::jsonrpc::ERROR_DOMAIN;
use std::collections::HashMap;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// `error` as a gRPC status with its `ErrorInfo` detail.
pub fn to_status(error: &RpcError) -> Status {
    let spelling = error.spelling();
    let metadata = as_metadata(error.details());
    let details = ErrorDetails::with_error_info(spelling.reason, ERROR_DOMAIN, metadata);
    Status::with_error_details(code(spelling.status), error.to_string(), details)
}

/// `ErrorInfo.metadata` is text to text: other JSON values go as their JSON.
fn as_metadata(details: serde_json::Map<String, serde_json::Value>) -> HashMap<String, String> {
    details
        .into_iter()
        .map(|(key, value)| match value {
            serde_json::Value::String(text) => (key, text),
            other => (key, other.to_string()),
        })
        .collect()
}

/// A JSON-RPC v1.0 error object another node answered, as the same status `to_status` would
/// have made of it there: its `ErrorInfo` (in `data`) names the error.
pub fn from_rpc_error_json(error: &serde_json::Value) -> Status {
    let message = error["message"].as_str().unwrap_or("an error").to_owned();
    let info = &error["data"][0];
    let reason = info["reason"].as_str().unwrap_or("INTERNAL_ERROR");
    let status = RpcError::spelling_of_reason(reason).map_or("INTERNAL", |s| s.status);
    let metadata = as_metadata(info["metadata"].as_object().cloned().unwrap_or_default());
    let details = ErrorDetails::with_error_info(reason, ERROR_DOMAIN, metadata);
    Status::with_error_details(code(status), message, details)
}

/// The `google.rpc.Code` named `name`.
fn code(name: &str) -> Code {
    match name {
        "INVALID_ARGUMENT" => Code::InvalidArgument,
        "NOT_FOUND" => Code::NotFound,
        "FAILED_PRECONDITION" => Code::FailedPrecondition,
        "UNIMPLEMENTED" => Code::Unimplemented,
        "ABORTED" => Code::Aborted,
        "UNAVAILABLE" => Code::Unavailable,
        "RESOURCE_EXHAUSTED" => Code::ResourceExhausted,
        "UNAUTHENTICATED" => Code::Unauthenticated,
        "PERMISSION_DENIED" => Code::PermissionDenied,
        "DEADLINE_EXCEEDED" => Code::DeadlineExceeded,
        "ALREADY_EXISTS" => Code::AlreadyExists,
        "CANCELLED" => Code::Cancelled,
        _ => Code::Internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelled_status_has_its_grpc_code() {
        let errors = [
            RpcError::InvalidParams("x".into()),
            RpcError::TaskNotFound("t".into()),
            RpcError::TaskNotCancelable("t".into()),
            RpcError::PushNotSupported,
            RpcError::ContextBusy {
                context_id: "c".into(),
                task_id: "t".into(),
            },
            RpcError::Overloaded { retry_after_ms: 5 },
            RpcError::SubscriberTooSlow(8),
            RpcError::Unauthenticated("no".into()),
        ];
        for error in &errors {
            let name = error.spelling().status;
            let status = to_status(error);
            assert_eq!(status.code().description(), code(name).description());
            assert_ne!(
                status.code(),
                Code::Internal,
                "{name} maps to a code of its own"
            );
        }
    }

    #[test]
    fn an_error_another_node_answered_becomes_the_same_status() {
        let error = RpcError::ContextBusy {
            context_id: "c".into(),
            task_id: "t".into(),
        };
        let wire = crate::protocol::jsonrpc::failure(
            &serde_json::json!(1),
            &error,
            crate::protocol::WireVersion::V1,
        );
        let here = to_status(&error);
        let there = from_rpc_error_json(&wire["error"]);
        assert_eq!(there.code(), here.code());
        assert_eq!(there.message(), here.message());
        let (there, here) = (there.get_error_details(), here.get_error_details());
        let (there, here) = (there.error_info(), here.error_info());
        let (there, here) = (there.expect("ErrorInfo"), here.expect("ErrorInfo"));
        assert_eq!(
            (&there.reason, &there.domain, &there.metadata),
            (&here.reason, &here.domain, &here.metadata)
        );
    }

    #[test]
    fn the_status_carries_the_error_info() {
        let error = RpcError::ContextBusy {
            context_id: "conversation-1".into(),
            task_id: "task-1".into(),
        };
        let status = to_status(&error);
        assert_eq!(status.code(), Code::Aborted);
        let details = status.get_error_details();
        let info = details.error_info().expect("an ErrorInfo");
        assert_eq!(info.reason, "CONTEXT_BUSY");
        assert_eq!(info.domain, "a2a-protocol.org");
        assert_eq!(info.metadata["contextId"], "conversation-1");
        assert_eq!(info.metadata["taskId"], "task-1");
    }
}
