//! `GET /metrics`: Prometheus text exposition of the `metrics` facade, plus process figures;
//! behind a bearer token when `metrics.token` is set.

use super::auth::{authorization, bearer_matches};
use super::state::AppState;
use crate::error::chain;
use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};

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

pub async fn metrics(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    if let Some(expected) = &state.metrics_token {
        let authorization = match authorization(req.headers()) {
            Ok(authorization) => authorization,
            Err(e) => {
                return HttpResponse::BadRequest()
                    .json(serde_json::json!({"error": e.to_string()}));
            }
        };
        if !bearer_matches(authorization, expected) {
            return HttpResponse::Unauthorized()
                .insert_header((header::WWW_AUTHENTICATE, "Bearer"))
                .json(serde_json::json!({
                    "error": "/metrics needs Authorization: Bearer with the metrics.token"
                }));
        }
    }
    if let Err(e) = actix_rt::task::spawn_blocking(record_process).await {
        tracing::warn!(error = %chain(&e), "gathering process metrics failed");
    }
    if let Ok(size) = state.engine.store().size_on_disk().await {
        metrics::gauge!("colloquy_store_size_bytes").set(size as f64);
    }
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(state.metrics.render())
}
