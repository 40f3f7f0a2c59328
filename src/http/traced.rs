//! Each A2A request's span, the root of colloquy's part of a trace: it continues the caller's
//! trace (`traceparent`), and the call records its method, version and outcome on it
//! (`rpc::call`, `rpc::record`). Health checks and metrics are not traced. With traces off
//! the span is debug-level, as it always was: off at the default `info`, for free.

use super::forward;
use crate::telemetry::{propagation, traces};
use actix_web::Error;
use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use tracing::Instrument;

/// Middleware: runs the request inside its span.
pub async fn request_span(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, Error> {
    let path = req.path();
    let binding = match path {
        "/healthz" | "/readyz" | "/metrics" => return next.call(req).await,
        "/" | forward::PATH => "jsonrpc",
        _ => "http+json",
    };
    let span = request(binding);
    propagation::continue_from(&span, &propagation::HttpHeaders(req.headers()));
    next.call(req).instrument(span).await
}

/// A request's span, for `binding` (`jsonrpc`, `http+json`, `grpc`); its fields are recorded
/// as the request goes. Its name stays `request`: the method is known only once the body is
/// read, after the span started, and a started span keeps its name.
pub fn request(binding: &'static str) -> tracing::Span {
    tracing::debug_span!(
        "request",
        otel.kind = "server",
        binding,
        method = tracing::field::Empty,
        version = tracing::field::Empty,
        task_id = tracing::field::Empty,
        outcome = tracing::field::Empty,
        trace_id = tracing::field::Empty,
        span_id = tracing::field::Empty,
    )
}

/// Records the method called on the current request's span.
pub fn name_request(method: &'static str, version: &'static str) {
    let span = tracing::Span::current();
    if span.is_disabled() {
        return;
    }
    span.record("method", method);
    span.record("version", version);
}

/// Records the call's outcome (`ok` or the JSON-RPC error code, written only for a span that
/// records) on the request's span; an error marks it failed.
pub fn record_outcome(outcome: impl FnOnce() -> String, failed: bool) {
    let span = tracing::Span::current();
    if span.is_disabled() {
        return;
    }
    let outcome = outcome();
    span.record("outcome", outcome.as_str());
    if failed {
        traces::fail(&span, format!("JSON-RPC error {outcome}"));
    }
}
