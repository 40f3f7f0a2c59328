//! The HTTP front: JSON-RPC at `POST /`, the agent card, health and metrics.
//!
//! Handlers parse, authenticate and dispatch; every conversation rule lives in the engine.

mod auth;
mod card;
mod connections;
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

/// After the grace period, how long streams have to deliver the final state of the turns failed
/// at its end before their connections are dropped.
pub const CLOSE_MARGIN: Duration = Duration::from_secs(1);

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

    /// Graceful stop, over within the grace period and [`CLOSE_MARGIN`] whatever clients do.
    ///
    /// The listener closes at once, so newcomers are refused and load balancers fail over
    /// (a paused listener would leave them waiting in its queue). Open connections finish their
    /// current request and close; new turns get -32013; running turns have the grace period,
    /// then fail. Whatever connection is still open `grace + CLOSE_MARGIN` from now (a stream
    /// whose client stopped reading) is dropped by actix. The store is flushed.
    pub async fn stop(self) {
        let connections_closed = self.handle.stop(true);
        self.engine.shutdown(self.grace).await;
        connections_closed.await;
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
    let grace = Duration::from_secs(config.shutdown.grace_secs);
    let workers = match config.workers {
        0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
        n => n,
    };
    let open_files = connections::raise_open_files_limit();
    let connections_per_worker =
        connections::per_worker(config.limits.max_connections, workers, open_files);
    let listen = config.listen.clone();
    let state = web::Data::new(AppState {
        engine: engine.clone(),
        config: Arc::new(config),
        auth,
        metrics: metrics_endpoint::recorder(),
    });
    let server = HttpServer::new(move || App::new().app_data(state.clone()).configure(routes))
        .workers(workers)
        // Past every worker's share the listener stops accepting: new connections wait in the
        // kernel's listen queue instead of taking descriptors the process does not have.
        .max_connections(connections_per_worker)
        // SSE sends several small writes per turn: without TCP_NODELAY, Nagle holds each one
        // back until the client's delayed ACK (~40 ms on Linux loopback).
        .tcp_nodelay(true)
        .disable_signals()
        // Counted from `stop`; actix checks once a second and then drops what is still open.
        .shutdown_timeout((grace + CLOSE_MARGIN).as_secs())
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
