//! The W3C trace context (`traceparent`, `tracestate`) and `baggage`: read from every call
//! that comes in (HTTP headers, gRPC metadata, the `TRACEPARENT` environment variable of a
//! process colloquy's `exec` backend started) and written on every call colloquy makes. With
//! traces off (`super::traces`) nothing is read or written: colloquy is then not part of the
//! trace, and a span of its own is what would link the two sides.

use opentelemetry::propagation::{Extractor, TextMapCompositePropagator, TextMapPropagator};
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};
use std::collections::HashMap;
use std::sync::OnceLock;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The environment variables a child process gets, by the convention of OpenTelemetry's
/// environment carriers (the upper-cased header names).
pub const ENVIRONMENT: [(&str, &str); 3] = [
    ("traceparent", "TRACEPARENT"),
    ("tracestate", "TRACESTATE"),
    ("baggage", "BAGGAGE"),
];

fn propagator() -> &'static TextMapCompositePropagator {
    static PROPAGATOR: OnceLock<TextMapCompositePropagator> = OnceLock::new();
    PROPAGATOR.get_or_init(|| {
        TextMapCompositePropagator::new(vec![
            Box::new(TraceContextPropagator::new()),
            Box::new(BaggagePropagator::new()),
        ])
    })
}

/// Makes the caller's context (if it sent one) the parent of `span`, which starts a request.
pub fn continue_from(span: &tracing::Span, carrier: &dyn Extractor) {
    if super::traces::enabled() {
        continue_in(span, propagator().extract(carrier));
    }
}

/// The context a command was started in ([`continue_from_environment`]) when it exports no
/// traces itself: passed on unchanged, so the trace goes on past it.
static INHERITED: OnceLock<HashMap<String, String>> = OnceLock::new();

/// The headers that carry the current span's context to what colloquy calls next. With traces
/// off: the context a command inherited, if any, else nothing.
pub fn outgoing() -> HashMap<String, String> {
    let mut headers = HashMap::new();
    if super::traces::enabled() {
        let context = tracing::Span::current().context();
        propagator().inject_context(&context, &mut headers);
    } else if let Some(inherited) = INHERITED.get() {
        headers.clone_from(inherited);
    }
    headers
}

/// The current span's context, to be the parent of a span started elsewhere (across the
/// conversation actor's mailbox); None with traces off.
pub fn current() -> Option<opentelemetry::Context> {
    super::traces::enabled().then(|| tracing::Span::current().context())
}

/// Makes `parent` (from [`current`]) the parent of `span`, which has not started yet.
pub fn continue_in(span: &tracing::Span, parent: opentelemetry::Context) {
    if span.is_disabled() {
        return;
    }
    // Fails only for a span already started, which the spans given here never are.
    let _ = span.set_parent(parent);
    super::traces::tag(span);
}

/// The current span's `traceparent`, to be kept with what outlives it (a push notification).
pub fn traceparent() -> Option<String> {
    outgoing().remove("traceparent")
}

/// The context in a kept `traceparent` ([`traceparent`]), as a span's parent.
pub fn continue_from_traceparent(span: &tracing::Span, traceparent: &str) {
    let carrier = HashMap::from([("traceparent".to_owned(), traceparent.to_owned())]);
    continue_from(span, &carrier);
}

/// `request` with the current span's context in its headers.
pub fn onto(request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    outgoing()
        .into_iter()
        .fold(request, |request, (name, value)| {
            request.header(name, value)
        })
}

/// The current span's context as a child process's environment ([`ENVIRONMENT`]).
pub fn environment() -> Vec<(&'static str, String)> {
    let mut headers = outgoing();
    ENVIRONMENT
        .iter()
        .filter_map(|(header, variable)| Some((*variable, headers.remove(*header)?)))
        .collect()
}

/// Makes the context this process was started in (its environment, [`ENVIRONMENT`]) the
/// parent of `span`: a `colloquy send` that an agent ran continues the agent's turn. With
/// traces off the command passes that context on as it found it (the `exec` backend clears a
/// child's environment, so a `colloquy send` it runs has no collector named, only the context).
pub fn continue_from_environment(span: &tracing::Span) {
    let carrier: HashMap<String, String> = ENVIRONMENT
        .iter()
        .filter_map(|(header, variable)| Some((header.to_string(), std::env::var(variable).ok()?)))
        .collect();
    if super::traces::enabled() {
        continue_from(span, &carrier);
    } else if !carrier.is_empty() {
        let _ = INHERITED.set(carrier);
    }
}

/// An actix-web request's headers, as a carrier to read from.
pub struct HttpHeaders<'a>(pub &'a actix_web::http::header::HeaderMap);

impl Extractor for HttpHeaders<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|name| name.as_str()).collect()
    }
}

/// A gRPC call's metadata, as a carrier to read from.
pub struct GrpcMetadata<'a>(pub &'a tonic::metadata::MetadataMap);

impl Extractor for GrpcMetadata<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|key| match key {
                tonic::metadata::KeyRef::Ascii(key) => Some(key.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}
