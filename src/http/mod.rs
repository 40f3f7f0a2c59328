//! The HTTP front: JSON-RPC at `POST /`, the agent card, health and metrics.
//!
//! Handlers parse, authenticate and dispatch; every conversation rule lives in the engine.

mod auth;
mod card;
mod methods;
mod metrics_endpoint;
pub mod rpc;
mod sse;

pub use auth::{Auth, digest as token_digest};

use crate::agent::SharedAgent;
use crate::config::Config;
use crate::engine::Engine;
use crate::store::Store;
use actix_web::dev::ServerHandle;
use actix_web::{App, HttpResponse, HttpServer, web};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{0}")]
    Config(String),
    #[error("opening the store at {path}: {error}")]
    Store { path: String, error: String },
    #[error("listening on {addr}: {error}")]
    Bind { addr: String, error: std::io::Error },
}

pub struct AppState {
    pub engine: Engine,
    pub config: Arc<Config>,
    pub auth: Auth,
    pub metrics: metrics_exporter_prometheus::PrometheusHandle,
}

/// A running server: its address, and the handles to stop it.
pub struct RunningServer {
    pub addr: SocketAddr,
    pub engine: Engine,
    handle: ServerHandle,
    task: actix_rt::task::JoinHandle<std::io::Result<()>>,
    grace: Duration,
}

impl RunningServer {
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// Graceful stop: refuse new turns, let running ones finish (within the grace period), fail
    /// the rest, flush the store, then close the listener and connections.
    pub async fn stop(self) {
        self.handle.pause().await;
        self.engine.shutdown(self.grace).await;
        self.handle.stop(true).await;
        let _ = self.task.await;
    }

    /// Runs until the server stops (after [`RunningServer::stop`] or a signal handled elsewhere).
    pub async fn wait(self) -> std::io::Result<()> {
        self.task
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))?
    }
}

fn is_loopback(listen: &str) -> bool {
    use std::net::ToSocketAddrs;
    listen
        .to_socket_addrs()
        .map(|mut addrs| addrs.all(|a| a.ip().is_loopback()))
        .unwrap_or(false)
}

/// Opens the store, starts the engine and serves. Needs a running actix System.
pub async fn start(config: Config, agent: SharedAgent) -> Result<RunningServer, ServeError> {
    let auth = Auth::load(
        &config.auth,
        std::env::var("COLLOQUY_TOKENS").ok().as_deref(),
    )
    .map_err(ServeError::Config)?;
    if !auth.enabled() && !config.allow_unauthenticated && !is_loopback(&config.listen) {
        return Err(ServeError::Config(format!(
            "refusing to listen on {} without authentication: configure tokens ([auth.tokens], \
             auth.tokens_file or COLLOQUY_TOKENS) or pass --allow-unauthenticated",
            config.listen
        )));
    }
    let path = config.data.clone();
    let options = config.store.sled_options();
    let store = actix_rt::task::spawn_blocking(move || Store::open_sled_with(&path, &options))
        .await
        .map_err(|e| ServeError::Store {
            path: config.data.display().to_string(),
            error: e.to_string(),
        })?
        .map_err(|e| ServeError::Store {
            path: config.data.display().to_string(),
            error: e.to_string(),
        })?;
    let engine = Engine::start(store, agent, config.engine());
    let interrupted = engine
        .fail_interrupted_turns()
        .await
        .map_err(|e| ServeError::Store {
            path: config.data.display().to_string(),
            error: format!("failing the turns a crash cut off: {e}"),
        })?;
    if interrupted > 0 {
        tracing::warn!(
            tasks = interrupted,
            "marked failed the tasks that were running when the server last stopped"
        );
    }
    let grace = Duration::from_secs(config.shutdown.grace_secs);
    let workers = match config.workers {
        0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
        n => n,
    };
    let listen = config.listen.clone();
    let state = web::Data::new(AppState {
        engine: engine.clone(),
        config: Arc::new(config),
        auth,
        metrics: metrics_endpoint::recorder(),
    });
    let server = HttpServer::new(move || App::new().app_data(state.clone()).configure(routes))
        .workers(workers)
        // SSE sends several small writes per turn: without TCP_NODELAY, Nagle holds each one
        // back until the client's delayed ACK (~40 ms on Linux loopback).
        .tcp_nodelay(true)
        .disable_signals()
        .shutdown_timeout(grace.as_secs() + 5)
        .bind(&listen)
        .map_err(|error| ServeError::Bind {
            addr: listen.clone(),
            error,
        })?;
    let addr = server
        .addrs()
        .first()
        .copied()
        .ok_or_else(|| ServeError::Config(format!("{listen} resolved to no address")))?;
    let server = server.run();
    let handle = server.handle();
    let task = actix_rt::spawn(server);
    tracing::info!(%addr, "colloquy is listening");
    Ok(RunningServer {
        addr,
        engine,
        handle,
        task,
        grace,
    })
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/")
            .route(web::post().to(rpc::handle))
            .default_service(web::to(method_not_allowed)),
    )
    .route(
        "/.well-known/agent-card.json",
        web::get().to(card::agent_card),
    )
    .route("/.well-known/agent.json", web::get().to(card::agent_card))
    .route("/healthz", web::get().to(healthz))
    .route("/readyz", web::get().to(readyz))
    .route("/metrics", web::get().to(metrics_endpoint::metrics));
}

async fn method_not_allowed() -> HttpResponse {
    HttpResponse::MethodNotAllowed()
        .insert_header(("Allow", "POST"))
        .json(serde_json::json!({
            "error": "the JSON-RPC endpoint takes POST with a JSON body; the agent card is at /.well-known/agent-card.json"
        }))
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({ "status": "ok" }))
}

/// Ready when the store takes a durable write.
async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    match state.engine.probe_store().await {
        Ok(()) => HttpResponse::Ok().json(serde_json::json!({ "status": "ready" })),
        Err(e) => HttpResponse::ServiceUnavailable()
            .json(serde_json::json!({ "status": "unavailable", "error": e.to_string() })),
    }
}
