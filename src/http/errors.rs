//! The one place engine failures become JSON-RPC errors (and so their code, message and data).
//!
//! Protocol knows JSON-RPC error values; the engine knows why it refused. Only the edge that
//! speaks both maps one onto the other. An internal error is logged here, with its causes,
//! while the client gets its message alone.

use crate::engine::EngineError;
use crate::error::chain;
use crate::protocol::{RpcError, WireVersion};

/// How long a client is asked to wait before retrying a request the database could not take
/// (a failover takes seconds).
const STORE_RETRY_AFTER_MS: u64 = 1000;

/// The JSON-RPC error a client of `version` gets for `error`.
pub fn rpc_error(error: EngineError, version: WireVersion) -> RpcError {
    match error {
        EngineError::InvalidParams(m) => RpcError::InvalidParams(m),
        EngineError::TaskNotFound(id) => RpcError::TaskNotFound(id),
        e @ EngineError::TaskNotCancelable { .. } => RpcError::TaskNotCancelable(e.to_string()),
        // v1.0 has an error for it; v0.3 only calls it bad params.
        e @ EngineError::TaskTerminal { .. } => match version {
            WireVersion::V1 => RpcError::Unsupported(e.to_string()),
            WireVersion::V03 => RpcError::InvalidParams(e.to_string()),
        },
        EngineError::ContextBusy {
            context_id,
            task_id,
        } => RpcError::ContextBusy {
            context_id,
            task_id,
        },
        EngineError::Overloaded { retry_after_ms, .. } => RpcError::Overloaded { retry_after_ms },
        EngineError::ShuttingDown => RpcError::ShuttingDown,
        EngineError::StoreUnavailable(e) => RpcError::StoreUnavailable {
            why: e.to_string(),
            retry_after_ms: STORE_RETRY_AFTER_MS,
        },
        e @ (EngineError::Store(_) | EngineError::Internal(_)) => internal(&e),
    }
}

fn internal(error: &(dyn std::error::Error + 'static)) -> RpcError {
    tracing::error!(error = %chain(error), "request failed");
    RpcError::Internal(error.to_string())
}

/// The JSON-RPC error for a refused push-notification config request.
pub fn push_error(error: crate::push::ConfigError) -> RpcError {
    use crate::push::ConfigError;
    use crate::store::PushError;
    match error {
        ConfigError::Store(PushError::TaskNotFound(id)) => RpcError::TaskNotFound(id),
        e @ ConfigError::Store(
            PushError::ConfigNotFound { .. } | PushError::TooManyConfigs { .. },
        ) => RpcError::InvalidParams(e.to_string()),
        ConfigError::Store(PushError::Store(e @ crate::store::StoreError::Unavailable { .. })) => {
            RpcError::StoreUnavailable {
                why: e.to_string(),
                retry_after_ms: STORE_RETRY_AFTER_MS,
            }
        }
        ConfigError::Store(PushError::Store(e)) => internal(&e),
        e @ (ConfigError::Target(_) | ConfigError::PendingLimit { .. }) => {
            RpcError::InvalidParams(e.to_string())
        }
    }
}
