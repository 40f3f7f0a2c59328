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
    let metadata: HashMap<String, String> = error
        .details()
        .into_iter()
        .map(|(key, value)| match value {
            serde_json::Value::String(text) => (key, text),
            other => (key, other.to_string()),
        })
        .collect();
    let details = ErrorDetails::with_error_info(spelling.reason, ERROR_DOMAIN, metadata);
    Status::with_error_details(code(spelling.status), error.to_string(), details)
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
