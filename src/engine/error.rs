use crate::model::TaskState;
use crate::store::StoreError;

/// Why the engine refused or failed a request. The HTTP edge maps each to a JSON-RPC code.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    #[error("invalid params: {0}")]
    InvalidParams(String),
    #[error("task not found: {0}")]
    TaskNotFound(String),
    #[error("task {task_id} is {} and cannot be canceled", state.as_str())]
    TaskNotCancelable { task_id: String, state: TaskState },
    #[error("task {task_id} is {} and accepts no more messages", state.as_str())]
    TaskTerminal { task_id: String, state: TaskState },
    #[error("context busy: task {task_id} is still running in context {context_id}")]
    ContextBusy { context_id: String, task_id: String },
    #[error("server overloaded: {running} turns are running; retry in {retry_after_ms} ms")]
    Overloaded { running: usize, retry_after_ms: u64 },
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error("storage error: {0}")]
    Store(#[source] StoreError),
    /// The database is unreachable for now (a failover): the caller may retry.
    #[error("{0}")]
    StoreUnavailable(#[source] StoreError),
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<StoreError> for EngineError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::BadPageToken => {
                EngineError::InvalidParams("pageToken: not a token this server issued".into())
            }
            StoreError::Busy {
                context_id,
                task_id,
            } => EngineError::ContextBusy {
                context_id,
                task_id,
            },
            StoreError::TaskNotFound(task_id) => EngineError::TaskNotFound(task_id),
            StoreError::TaskTerminal { task_id, state } => {
                EngineError::TaskTerminal { task_id, state }
            }
            StoreError::TaskNotCancelable { task_id, state } => {
                EngineError::TaskNotCancelable { task_id, state }
            }
            e @ StoreError::Unavailable { .. } => EngineError::StoreUnavailable(e),
            StoreError::Closed => EngineError::ShuttingDown,
            other @ (StoreError::Backend { .. }
            | StoreError::Corrupt { .. }
            | StoreError::ImportRefused(_)
            | StoreError::StaleToken { .. }) => EngineError::Store(other),
        }
    }
}

pub type EngineResult<T> = Result<T, EngineError>;
