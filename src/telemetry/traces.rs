//! Logs, and traces over OTLP. Traces are off unless a collector is named
//! (`telemetry.otlp_endpoint`, or the standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` /
//! `OTEL_EXPORTER_OTLP_ENDPOINT`); then colloquy's spans (a request, its turn, the store's
//! durable writes, the agent's run, each push delivery, each forwarded call) go through
//! tracing-opentelemetry to the SDK's batch processor, which exports them from a thread of its
//! own: a turn never waits on the collector. A collector that is away costs the spans of the
//! batches it did not take (counted, `colloquy_trace_spans_total{outcome="dropped"}`), or of
//! those the full queue turned away (the SDK logs how many at exit), never a turn.
//!
//! The SDK reads the standard variables itself: `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_TRACES_SAMPLER(_ARG)`, `OTEL_BSP_*`, `OTEL_EXPORTER_OTLP_(TRACES_)HEADERS` and
//! `_TIMEOUT`; `OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL` picks HTTP/protobuf (the default) or gRPC.

use crate::config::TelemetryConfig;
use opentelemetry::trace::{Status, TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use std::sync::atomic::{AtomicBool, Ordering};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{FilterExt, filter_fn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Whether spans go to a collector (set once, when the subscriber is installed).
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether colloquy exports traces: the cheap check before any work for them.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

#[derive(Debug, thiserror::Error)]
pub enum TracesError {
    #[error(
        "{variable}={protocol:?} names no protocol colloquy exports traces in (grpc, http/protobuf)"
    )]
    Protocol {
        variable: &'static str,
        protocol: String,
    },
    #[error("cannot set up the OTLP exporter for {endpoint}")]
    Exporter {
        endpoint: String,
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
    #[error("cannot start the OTLP exporter's runtime")]
    Runtime(#[source] std::io::Error),
}

/// The installed exporter, flushed by [`Traces::shutdown`] at exit.
#[must_use = "dropping it keeps spans from being flushed at exit"]
pub struct Traces {
    provider: Option<SdkTracerProvider>,
    /// gRPC's channel lives on a runtime of its own (the batch thread is not one).
    _runtime: Option<tokio::runtime::Runtime>,
}

impl Traces {
    fn off() -> Traces {
        Traces {
            provider: None,
            _runtime: None,
        }
    }

    /// Exports what is still queued (bounded by the exporter's timeout). May be called from
    /// async code (`colloquy send` does): the gRPC exporter's runtime is let go, not waited for.
    pub fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(error) = provider.shutdown()
        {
            tracing::warn!(%error, "the last spans could not be exported");
        }
        if let Some(runtime) = self._runtime {
            runtime.shutdown_background();
        }
    }
}

/// Installs the server's subscriber: logs on stderr (`log_format` `pretty` or `json`, levels
/// from `RUST_LOG`, `info` by default), and colloquy's spans to the collector, if one is named.
pub fn install(config: &TelemetryConfig, log_format: &str) -> Result<Traces, TracesError> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    match endpoint(config) {
        Some(endpoint) => install_with_traces(config, &endpoint, filter, log_format),
        None => {
            install_logs_only(filter, log_format);
            Ok(Traces::off())
        }
    }
}

/// A command's subscriber (`colloquy send`): nothing unless a collector is named, then its
/// spans, with warnings and errors on stderr.
pub fn install_for_command(config: &TelemetryConfig) -> Result<Traces, TracesError> {
    let Some(endpoint) = endpoint(config) else {
        return Ok(Traces::off());
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    install_with_traces(config, &endpoint, filter, "pretty")
}

fn install_with_traces(
    config: &TelemetryConfig,
    endpoint: &str,
    filter: EnvFilter,
    log_format: &str,
) -> Result<Traces, TracesError> {
    let (exporter, runtime) = exporter(config, endpoint)?;
    let provider = SdkTracerProvider::builder()
        .with_resource(resource())
        .with_batch_exporter(Counted(exporter))
        .build();
    let tracer = provider.tracer("colloquy");
    let spans = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(filter_fn(|meta| {
            // colloquy's own spans and its log lines (as span events); never a dependency's
            // (the exporter's own HTTP client among them).
            is_our_span(meta)
                || (meta.target().starts_with("colloquy") && *meta.level() <= tracing::Level::INFO)
        }));
    // The log lines keep to RUST_LOG; colloquy's spans are in them whatever its level, so that
    // a line names its request and turn, with their trace and span ids.
    let logs = logs_layer(log_format).with_filter(filter.or(filter_fn(is_our_span)));
    let installed = tracing_subscriber::registry()
        .with(logs)
        .with(spans)
        .try_init();
    if installed.is_ok() {
        ENABLED.store(true, Ordering::Relaxed);
        tracing::info!(%endpoint, "exporting traces over OTLP");
    }
    Ok(Traces {
        provider: Some(provider),
        _runtime: runtime,
    })
}

fn is_our_span(meta: &tracing::Metadata<'_>) -> bool {
    meta.is_span() && meta.target().starts_with("colloquy")
}

/// As before traces existed: the cheapest subscriber, for the usual case.
fn install_logs_only(filter: EnvFilter, log_format: &str) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // Fails only where a subscriber is already set (tests, an embedding host): keep theirs.
    let _ = if log_format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

fn logs_layer<S>(log_format: &str) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    if log_format == "json" {
        layer.json().boxed()
    } else {
        layer.boxed()
    }
}

/// The collector to export to, if any: the configuration's, else the standard variables'.
fn endpoint(config: &TelemetryConfig) -> Option<String> {
    let disabled = |variable: &str, value: &str| {
        std::env::var(variable).is_ok_and(|set| set.trim().eq_ignore_ascii_case(value))
    };
    if disabled("OTEL_SDK_DISABLED", "true") || disabled("OTEL_TRACES_EXPORTER", "none") {
        return None;
    }
    let configured = config.otlp_endpoint.as_deref().map(str::trim);
    configured
        .filter(|endpoint| !endpoint.is_empty())
        .map(str::to_owned)
        .or_else(|| std::env::var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").ok())
        .or_else(|| std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok())
        .filter(|endpoint| !endpoint.trim().is_empty())
}

enum Protocol {
    HttpProtobuf,
    Grpc,
}

fn protocol() -> Result<Protocol, TracesError> {
    for variable in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Ok(protocol) = std::env::var(variable) {
            return match protocol.trim() {
                "http/protobuf" => Ok(Protocol::HttpProtobuf),
                "grpc" => Ok(Protocol::Grpc),
                _ => Err(TracesError::Protocol { variable, protocol }),
            };
        }
    }
    Ok(Protocol::HttpProtobuf)
}

type Built = (
    opentelemetry_otlp::SpanExporter,
    Option<tokio::runtime::Runtime>,
);

/// The exporter. `telemetry.otlp_endpoint` is a base URL, as `OTEL_EXPORTER_OTLP_ENDPOINT` is
/// (HTTP gets `/v1/traces` after it); without it the exporter reads the variables itself.
fn exporter(config: &TelemetryConfig, endpoint: &str) -> Result<Built, TracesError> {
    let configured = config
        .otlp_endpoint
        .as_deref()
        .map(str::trim)
        .filter(|e| !e.is_empty());
    let failed = |source| TracesError::Exporter {
        endpoint: endpoint.to_owned(),
        source,
    };
    match protocol()? {
        Protocol::HttpProtobuf => {
            let mut builder = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary);
            if let Some(base) = configured {
                builder = builder.with_endpoint(traces_url(base));
            }
            builder.build().map(|e| (e, None)).map_err(failed)
        }
        Protocol::Grpc => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("colloquy-otlp")
                .enable_all()
                .build()
                .map_err(TracesError::Runtime)?;
            let _entered = runtime.enter();
            let mut builder = opentelemetry_otlp::SpanExporter::builder().with_tonic();
            if let Some(base) = configured {
                builder = builder.with_endpoint(base);
            }
            let exporter = builder.build().map_err(failed)?;
            drop(_entered);
            Ok((exporter, Some(runtime)))
        }
    }
}

/// The HTTP traces URL under a base URL.
fn traces_url(base: &str) -> String {
    if base.ends_with("/v1/traces") {
        base.to_owned()
    } else {
        format!("{}/v1/traces", base.trim_end_matches('/'))
    }
}

/// The SDK's resource (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`), named `colloquy`
/// unless those name the service.
fn resource() -> Resource {
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|name| !name.trim().is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES")
            .is_ok_and(|attributes| attributes.contains("service.name="));
    let builder = Resource::builder();
    if named {
        builder.build()
    } else {
        builder.with_service_name("colloquy").build()
    }
}

/// Counts each batch's spans by whether the collector took them.
#[derive(Debug)]
struct Counted<E>(E);

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len() as u64;
        let exported = self.0.export(batch).await;
        let outcome = if exported.is_ok() {
            "exported"
        } else {
            "dropped"
        };
        metrics::counter!("colloquy_trace_spans_total", "outcome" => outcome).increment(spans);
        exported
    }

    fn shutdown_with_timeout(&self, timeout: std::time::Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.0.set_resource(resource);
    }
}

/// Records the trace and span ids on `span` (its `trace_id` and `span_id` fields), so that log
/// lines inside it carry them (JSON logs: under `span` and `spans`).
pub fn tag(span: &tracing::Span) {
    if !enabled() || span.is_disabled() {
        return;
    }
    let context = span.context();
    let ids = context.span().span_context().clone();
    if ids.is_valid() {
        span.record("trace_id", tracing::field::display(ids.trace_id()));
        span.record("span_id", tracing::field::display(ids.span_id()));
    }
}

/// Runs `work` in `span`, marking the span failed when it fails (a store's durable write).
pub async fn within<T, E: std::fmt::Display>(
    span: tracing::Span,
    work: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, E> {
    use tracing::Instrument;
    let result = work.instrument(span.clone()).await;
    if let Err(error) = &result {
        fail(&span, error.to_string());
    }
    result
}

/// Marks `span` failed, with the error's description.
pub fn fail(span: &tracing::Span, description: impl Into<std::borrow::Cow<'static, str>>) {
    if enabled() && !span.is_disabled() {
        span.set_status(Status::error(description));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_url_gets_the_traces_path_once() {
        assert_eq!(
            traces_url("http://collector:4318"),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://collector:4318/"),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://collector:4318/v1/traces"),
            "http://collector:4318/v1/traces"
        );
    }
}
