//! `GET /metrics`: Prometheus text exposition of the `metrics` facade, plus process figures.

use super::AppState;
use actix_web::{HttpResponse, web};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;

const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

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
            describe();
            handle
        })
        .clone()
}

fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "colloquy_rpc_requests_total",
        "JSON-RPC requests by method and outcome (ok or the error code)"
    );
    describe_histogram!(
        "colloquy_rpc_request_seconds",
        Unit::Seconds,
        "JSON-RPC request latency by method (until the response or stream starts)"
    );
    describe_gauge!("colloquy_contexts_resident", "conversation actors alive");
    describe_gauge!("colloquy_contexts_busy", "turns running now");
    describe_counter!(
        "colloquy_context_starts_total",
        "conversation actors started"
    );
    describe_counter!(
        "colloquy_context_evictions_total",
        "conversation actors stopped after idling"
    );
    describe_counter!(
        "colloquy_busy_rejections_total",
        "messages refused because their context was busy"
    );
    describe_counter!(
        "colloquy_overload_rejections_total",
        "messages refused because too many turns were running"
    );
    describe_counter!("colloquy_tasks_total", "turns ended, by final state");
    describe_histogram!(
        "colloquy_agent_seconds",
        Unit::Seconds,
        "agent run time by backend"
    );
    describe_counter!(
        "colloquy_agent_errors_total",
        "agent runs that failed, by backend"
    );
    describe_counter!(
        "colloquy_store_writes_total",
        "atomic write batches applied"
    );
    describe_counter!(
        "colloquy_store_flushes_total",
        "store flushes (one covers many writes)"
    );
    describe_counter!(
        "colloquy_store_flush_waiters_total",
        "durability waits answered by flushes"
    );
    describe_histogram!(
        "colloquy_store_flush_seconds",
        Unit::Seconds,
        "store flush latency (write-ahead log write + fdatasync)"
    );
    describe_histogram!(
        "colloquy_store_checkpoint_seconds",
        Unit::Seconds,
        "time to move a memtable into sled and flush it"
    );
    describe_counter!(
        "colloquy_store_checkpoint_writes_total",
        "key writes moved from the memtables into sled"
    );
    describe_gauge!(
        "colloquy_store_size_bytes",
        Unit::Bytes,
        "store size on disk"
    );
    describe_histogram!(
        "colloquy_history_render_seconds",
        Unit::Seconds,
        "history load and render latency"
    );
    describe_counter!(
        "colloquy_history_messages_rendered_total",
        "earlier messages rendered into prompts"
    );
    describe_gauge!("colloquy_sse_streams", "live SSE streams");
    describe_counter!(
        "colloquy_auth_failures_total",
        "requests refused for a missing or wrong token"
    );
    describe_gauge!(
        "process_resident_memory_bytes",
        Unit::Bytes,
        "resident memory"
    );
    describe_gauge!(
        "process_cpu_seconds_total",
        Unit::Seconds,
        "CPU time used (user + system)"
    );
    describe_gauge!("process_open_fds", "open file descriptors");
}

/// Resident memory, CPU seconds and open descriptors, from /proc (Linux).
fn record_process() {
    if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
        // Fields after the parenthesised command name; utime and stime are the 14th and 15th.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        let ticks = sysconf_or(libc::_SC_CLK_TCK, 100.0);
        let cpu = |i: usize| {
            fields
                .get(i)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        metrics::gauge!("process_cpu_seconds_total").set((cpu(11) + cpu(12)) / ticks);
        let pages = fields
            .get(21)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        metrics::gauge!("process_resident_memory_bytes")
            .set(pages * sysconf_or(libc::_SC_PAGESIZE, 4096.0));
    }
    if let Ok(entries) = std::fs::read_dir("/proc/self/fd") {
        metrics::gauge!("process_open_fds").set(entries.count() as f64);
    }
}

fn sysconf_or(name: libc::c_int, fallback: f64) -> f64 {
    // SAFETY: sysconf has no preconditions; it only reads a system constant.
    let value = unsafe { libc::sysconf(name) };
    if value > 0 { value as f64 } else { fallback }
}

pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    let store = state.engine.store().clone();
    let gathered = actix_rt::task::spawn_blocking(move || {
        record_process();
        if let Ok(size) = store.size_on_disk() {
            metrics::gauge!("colloquy_store_size_bytes").set(size as f64);
        }
    })
    .await;
    if let Err(e) = gathered {
        tracing::warn!(error = %e, "gathering process metrics failed");
    }
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(state.metrics.render())
}
