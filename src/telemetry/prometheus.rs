//! The process-wide metrics recorder and the series colloquy documents: installed by the
//! composition root (`crate::app`) before the store and engine start, rendered by `GET /metrics`.

use crate::error::chain;
use crate::model::TaskState;
use crate::protocol::Method;
use metrics::{KeyName, SharedString, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;
use std::time::Duration;

const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// How often histogram samples are folded into their buckets.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// The process-wide recorder (installed once; later servers in the same process share it).
pub fn recorder() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets(LATENCY_BUCKETS)
                .unwrap_or_else(|_| PrometheusBuilder::new());
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            // Fails only if another recorder is installed (a host embedding us); keep our handle anyway.
            let _ = metrics::set_global_recorder(recorder);
            super::handles::recorder_installed();
            describe();
            start_upkeep(handle.clone());
            handle
        })
        .clone()
}

/// The recorder keeps every histogram sample until something folds them into buckets, which
/// only a scrape did: a server nobody scraped grew by about 50 bytes a turn (8 million turns,
/// 400 MB). A thread of its own, since the recorder outlives any runtime.
fn start_upkeep(handle: PrometheusHandle) {
    let started = std::thread::Builder::new()
        .name("colloquy-metrics-upkeep".into())
        .spawn(move || {
            loop {
                std::thread::sleep(UPKEEP_EVERY);
                handle.run_upkeep();
            }
        });
    if let Err(e) = started {
        tracing::warn!(error = %chain(&e), "cannot start the metrics upkeep thread; histograms are folded at each scrape only");
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One documented series (docs/operations.md lists the same, checked by a test).
struct Series {
    name: &'static str,
    kind: Kind,
    unit: Option<Unit>,
    help: &'static str,
}

const fn series(name: &'static str, kind: Kind, unit: Option<Unit>, help: &'static str) -> Series {
    Series {
        name,
        kind,
        unit,
        help,
    }
}

const RPC_REQUESTS: &str = "colloquy_rpc_requests_total";
const RPC_SECONDS: &str = "colloquy_rpc_request_seconds";
const TASKS: &str = "colloquy_tasks_total";
const AGENT_SECONDS: &str = "colloquy_agent_seconds";
const AGENT_ERRORS: &str = "colloquy_agent_errors_total";
const PUSH_REFUSED: &str = "colloquy_push_refused_total";
const HISTORY_WINDOWS: &str = "colloquy_history_windows_total";
const STREAM_RESUMES: &str = "colloquy_stream_resumes_total";

/// Series with labels; [`register_series`] registers their label values known at start.
const LABELLED: &[&str] = &[
    RPC_REQUESTS,
    RPC_SECONDS,
    TASKS,
    AGENT_SECONDS,
    AGENT_ERRORS,
    PUSH_REFUSED,
    HISTORY_WINDOWS,
    STREAM_RESUMES,
];

const SECONDS: Option<Unit> = Some(Unit::Seconds);
const BYTES: Option<Unit> = Some(Unit::Bytes);

#[rustfmt::skip]
const SERIES: &[Series] = &[
    series(RPC_REQUESTS, Kind::Counter, None, "JSON-RPC requests by method and outcome (ok or the error code)"),
    series(RPC_SECONDS, Kind::Histogram, SECONDS, "JSON-RPC request latency by method (until the response or stream starts)"),
    series("colloquy_contexts_resident", Kind::Gauge, None, "conversation actors alive"),
    series("colloquy_contexts_busy", Kind::Gauge, None, "turns running now"),
    series("colloquy_context_starts_total", Kind::Counter, None, "conversation actors started"),
    series("colloquy_context_evictions_total", Kind::Counter, None, "conversation actors stopped after idling"),
    series("colloquy_busy_rejections_total", Kind::Counter, None, "messages refused because their context was busy"),
    series("colloquy_overload_rejections_total", Kind::Counter, None, "messages refused because too many turns were running"),
    series(TASKS, Kind::Counter, None, "turns ended, by final state"),
    series(AGENT_SECONDS, Kind::Histogram, SECONDS, "agent run time by backend"),
    series(AGENT_ERRORS, Kind::Counter, None, "agent runs that failed, by backend"),
    series("colloquy_store_writes_total", Kind::Counter, None, "atomic write batches applied"),
    series("colloquy_store_flushes_total", Kind::Counter, None, "store flushes (one covers many writes)"),
    series("colloquy_store_flush_waiters_total", Kind::Counter, None, "durability waits answered by flushes"),
    series("colloquy_store_flush_seconds", Kind::Histogram, SECONDS, "store flush latency (write-ahead log write + fdatasync)"),
    series("colloquy_store_checkpoint_seconds", Kind::Histogram, SECONDS, "time to move a memtable into sled and flush it"),
    series("colloquy_store_snapshot_seconds", Kind::Histogram, SECONDS, "time to write one of sled's recovery snapshots while running"),
    series("colloquy_store_checkpoint_writes_total", Kind::Counter, None, "key writes moved from the memtables into sled"),
    series("colloquy_store_size_bytes", Kind::Gauge, BYTES, "store size on disk"),
    series("colloquy_store_pool_in_use", Kind::Gauge, None, "PostgreSQL connections in use"),
    series("colloquy_store_pool_waiting", Kind::Gauge, None, "requests waiting for a PostgreSQL connection"),
    series("colloquy_leases_taken_total", Kind::Counter, None, "conversation leases this node took in a shared database (turns started)"),
    series("colloquy_store_general_turn_steps_total", Kind::Counter, None, "turn starts and ends a shared database took several round trips for (a continued task, push configs, an expired lease)"),
    series("colloquy_store_groups_total", Kind::Counter, None, "group statements a shared database ran, by step (start, end): each holds the steps of that kind that waited together, and a group's transaction holds its starts' and its ends'"),
    series("colloquy_store_grouped_steps_total", Kind::Counter, None, "turn starts or ends committed in groups, by step; divided by colloquy_store_groups_total, the mean group"),
    series("colloquy_leases_expired_total", Kind::Counter, None, "expired leases of stopped nodes whose tasks this node failed"),
    series("colloquy_forwarded_requests_total", Kind::Counter, None, "requests passed on to the node that runs their task"),
    series("colloquy_leases_lost_total", Kind::Counter, None, "turns stopped because their lease could not be renewed"),
    series("colloquy_history_render_seconds", Kind::Histogram, SECONDS, "history load and render latency"),
    series("colloquy_history_messages_rendered_total", Kind::Counter, None, "earlier messages rendered into prompts"),
    series(HISTORY_WINDOWS, Kind::Counter, None, "turns by where their history window came from: memory (the window the conversation's actor kept) or store"),
    series("colloquy_history_cache_bytes", Kind::Gauge, BYTES, "history windows kept by conversation actors between turns (estimated)"),
    series("colloquy_trace_spans_total", Kind::Counter, None, "spans sent to the OTLP collector, by outcome: exported or dropped (the collector did not take their batch)"),
    series("colloquy_sse_streams", Kind::Gauge, None, "live SSE streams"),
    series(STREAM_RESUMES, Kind::Counter, None, "streams resumed with Last-Event-ID, by outcome: replayed (the events after it) or snapshot (it was older than the events kept)"),
    series("colloquy_stream_logs", Kind::Gauge, None, "tasks whose recent stream events are kept for resumes"),
    series("colloquy_stream_log_bytes", Kind::Gauge, BYTES, "what the kept stream events hold (estimated)"),
    series("colloquy_grpc_streams", Kind::Gauge, None, "live gRPC streams (SendStreamingMessage, SubscribeToTask)"),
    series("colloquy_auth_failures_total", Kind::Counter, None, "requests refused for a missing or wrong token"),
    series("colloquy_push_sent_total", Kind::Counter, None, "push notifications delivered (a 2xx from the webhook)"),
    series("colloquy_push_failed_total", Kind::Counter, None, "push notification attempts that failed"),
    series("colloquy_push_retried_total", Kind::Counter, None, "push notifications scheduled for another attempt"),
    series("colloquy_push_given_up_total", Kind::Counter, None, "push notifications given up (refused, or not delivered within push.give_up_after_secs)"),
    series("colloquy_push_pending", Kind::Gauge, None, "push notifications in the outbox (counted every 15 s while the worker runs)"),
    series("colloquy_push_scanned_total", Kind::Counter, None, "outbox records the delivery worker read (only due ones)"),
    series(PUSH_REFUSED, Kind::Counter, None, "push notification configs refused, by reason (pending_limit: push.max_pending_per_principal)"),
    series("colloquy_push_delivery_seconds", Kind::Histogram, SECONDS, "time from a task's change to its notification's delivery"),
    series("process_resident_memory_bytes", Kind::Gauge, BYTES, "resident memory"),
    series("process_cpu_seconds_total", Kind::Gauge, SECONDS, "CPU time used (user + system)"),
    series("process_open_fds", Kind::Gauge, None, "open file descriptors"),
];

fn describe() {
    metrics::with_recorder(|recorder| {
        for s in SERIES {
            let (name, help) = (
                KeyName::from_const_str(s.name),
                SharedString::const_str(s.help),
            );
            match s.kind {
                Kind::Counter => recorder.describe_counter(name, s.unit, help),
                Kind::Gauge => recorder.describe_gauge(name, s.unit, help),
                Kind::Histogram => recorder.describe_histogram(name, s.unit, help),
            }
        }
    });
}

/// Registers every documented series, so dashboards and alerts see zeros rather than "no data"
/// before the first event. Called by each server start: the recorder is process-wide, so this
/// only adds zero and never resets what an earlier server in the process counted.
///
/// Label values known at start are registered: each method with outcome `ok`, each state that
/// ends a turn, the configured backend. Error outcomes (JSON-RPC codes) and the `invalid` /
/// `unknown` method labels of malformed requests appear at their first occurrence.
pub fn register_series(backend: &'static str) {
    for s in SERIES.iter().filter(|s| !LABELLED.contains(&s.name)) {
        match s.kind {
            Kind::Counter => metrics::counter!(s.name).increment(0),
            Kind::Gauge => metrics::gauge!(s.name).increment(0.0),
            Kind::Histogram => drop(metrics::histogram!(s.name)),
        }
    }
    for method in Method::labels() {
        metrics::counter!(RPC_REQUESTS, "method" => method, "outcome" => "ok").increment(0);
        drop(metrics::histogram!(RPC_SECONDS, "method" => method));
    }
    for state in TaskState::ALL.into_iter().filter(|s| s.ends_turn()) {
        metrics::counter!(TASKS, "state" => state.as_str()).increment(0);
    }
    metrics::counter!(AGENT_ERRORS, "backend" => backend).increment(0);
    metrics::counter!(PUSH_REFUSED, "reason" => "pending_limit").increment(0);
    for source in ["memory", "store"] {
        metrics::counter!(HISTORY_WINDOWS, "source" => source).increment(0);
    }
    for outcome in ["replayed", "snapshot"] {
        metrics::counter!(STREAM_RESUMES, "outcome" => outcome).increment(0);
    }
    drop(metrics::histogram!(AGENT_SECONDS, "backend" => backend));
}
