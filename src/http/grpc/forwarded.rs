//! The answer of the node that runs a task, to a call made through this node (see
//! `http::forward`): it answers one JSON-RPC v1.0 response, turned back into what this binding
//! sends (streams are relayed by the engine instead).

use super::status::from_rpc_error_json;
use serde_json::Value;
use tonic::Status;

/// One JSON-RPC response's result, or its error as a status.
fn result_of(response: Value) -> Result<Value, Status> {
    match response {
        Value::Object(mut response) => match response.remove("result") {
            Some(result) => Ok(result),
            None => Err(response.get("error").map_or_else(
                || Status::internal("the node running the task answered neither result nor error"),
                from_rpc_error_json,
            )),
        },
        _ => Err(Status::internal(
            "the node running the task did not answer a JSON-RPC response",
        )),
    }
}

fn unreadable(error: impl std::fmt::Display) -> Status {
    Status::unavailable(format!(
        "the node running the task answered unreadably: {error}"
    ))
}

/// A unary call's result.
pub async fn unary(answer: reqwest::Response) -> Result<Value, Status> {
    let response: Value = answer.json().await.map_err(unreadable)?;
    result_of(response)
}
