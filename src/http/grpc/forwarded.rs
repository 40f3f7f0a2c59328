//! The answer of the node that runs a task, to a call made through this node (see
//! `http::forward`): it answers in JSON-RPC v1.0, one response or an SSE stream of them, and
//! each is turned back into what this binding sends.

use super::service::EventStreamResponse;
use super::status::from_rpc_error_json;
use eventsource_stream::Eventsource;
use futures_util::StreamExt;
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

/// A streaming call's events; an error answered before the stream is the call's status.
pub async fn stream(
    answer: reqwest::Response,
    decode: fn(Value) -> Result<a2a_pb::proto::StreamResponse, Status>,
) -> Result<EventStreamResponse, Status> {
    let is_stream = answer
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !is_stream {
        return Err(unary(answer).await.err().unwrap_or_else(|| {
            Status::internal("the node running the task answered one result to a stream")
        }));
    }
    let events = answer.bytes_stream().eventsource().map(move |event| {
        let event = event.map_err(unreadable)?;
        let response: Value = serde_json::from_str(&event.data).map_err(unreadable)?;
        decode(result_of(response)?)
    });
    Ok(Box::pin(events))
}
