//! The HTTP front: JSON-RPC at `POST /`, the agent card, health and metrics (the operator
//! endpoints, optionally on their own address).
//!
//! Handlers parse, authenticate and dispatch; every conversation rule lives in the engine.
//! This module only routes and serves: the engine, auth and metrics it serves are built by the
//! composition root, [`crate::app`].

mod auth;
mod card;
mod connections;
mod console;
mod credentials;
mod errors;
mod forward;
mod grpc;
mod media_type;
mod methods;
mod metrics_endpoint;
mod origin;
mod push;
mod rest;
pub mod rpc;
mod sse;
mod state;
mod traced;
mod unread_body;

pub use auth::{Auth, AuthConfigError, digest as token_digest};
pub use credentials::{SigningKeys, watch as watch_credentials};
pub use forward::NodeRelay;
pub use origin::TrustedProxies;
pub use state::AppState;

use crate::engine::Engine;
use crate::store::ConversationStore;
use actix_web::dev::ServerHandle;
use actix_web::middleware::{NormalizePath, TrailingSlash, from_fn};
use actix_web::{App, HttpResponse, HttpServer, web};
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{0}")]
    Config(String),
    #[error("listening on {addr}: {error}")]
    Bind {
        addr: String,
        #[source]
        error: std::io::Error,
    },
}

/// After the grace period, how long streams have to deliver the final state of the turns failed
/// at its end before their connections are dropped.
pub const CLOSE_MARGIN: Duration = Duration::from_secs(1);

/// A running server: its address, and the handles to stop it.
pub struct RunningServer {
    pub addr: SocketAddr,
    /// Where `/metrics`, `/healthz` and `/readyz` are served apart (`admin_listen`), if set.
    pub admin_addr: Option<SocketAddr>,
    /// Where the gRPC binding is served (`grpc_listen`), if it is.
    pub grpc_addr: Option<SocketAddr>,
    pub engine: Engine,
    handle: ServerHandle,
    task: actix_rt::task::JoinHandle<std::io::Result<()>>,
    admin: Option<AdminServer>,
    grpc: Option<grpc::GrpcServer>,
    grace: Duration,
}

/// The operator endpoints' own server (`admin_listen`).
struct AdminServer {
    handle: ServerHandle,
    task: actix_rt::task::JoinHandle<std::io::Result<()>>,
}

impl AdminServer {
    async fn stop(self) {
        self.handle.stop(true).await;
        let _ = self.task.await;
    }
}

/// A client has this long to send its request's headers (its body has `limits.body_timeout_ms`).
pub const HEADERS_TIMEOUT: Duration = Duration::from_secs(5);

/// After a response that ends its connection, how long the server waits for the client to close
/// first before dropping it: closing at once, with request bytes still unread, could reset the
/// connection before the client has read the response. Short, because until then the connection
/// still counts against `limits.max_connections` (a client that never closes keeps it that long).
pub const CLOSE_LINGER: Duration = Duration::from_millis(500);

/// How long [`RunningServer::stop`] waits for the conversations' actors and tasks, stopping on
/// their arbiters, to drop their handles on the store.
pub const STORE_RELEASE_WAIT: Duration = Duration::from_secs(10);

/// Waits until nothing holds `store`: the last holder closes it (sled's lock goes with it).
async fn store_released(store: Weak<dyn ConversationStore>) {
    let deadline = Instant::now() + STORE_RELEASE_WAIT;
    while store.strong_count() > 0 {
        if Instant::now() > deadline {
            tracing::warn!(
                holders = store.strong_count(),
                "the store is still held after the stop; it closes when they let go"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
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
    ///
    /// When it returns, nothing in this process holds the store any more (within
    /// [`STORE_RELEASE_WAIT`]), so the data folder is free for a new server or `colloquy export`.
    pub async fn stop(mut self) {
        let connections_closed = self.handle.stop(true);
        if let Some(grpc) = &mut self.grpc {
            grpc.close();
        }
        self.engine.shutdown(self.grace).await;
        if let Some(grpc) = self.grpc {
            grpc.finish(CLOSE_MARGIN).await;
        }
        connections_closed.await;
        let _ = self.task.await;
        if let Some(admin) = self.admin {
            admin.stop().await;
        }
        let store = Arc::downgrade(self.engine.store());
        drop(self.engine);
        store_released(store).await;
    }

    /// Runs until the server stops (after [`RunningServer::stop`] or a signal handled elsewhere).
    pub async fn wait(self) -> std::io::Result<()> {
        let result = self.task.await;
        if let Some(grpc) = self.grpc {
            grpc.finish(CLOSE_MARGIN).await;
        }
        if let Some(admin) = self.admin {
            admin.stop().await;
        }
        result.map_err(|e| std::io::Error::other(e.to_string()))?
    }
}

/// Serves `state` on its configured address (and the operator endpoints on `admin_listen`, if
/// set). Needs a running actix System.
pub fn serve(mut state: AppState) -> Result<RunningServer, ServeError> {
    let config = state.config.clone();
    let engine = state.engine.clone();
    let grace = Duration::from_secs(config.shutdown.grace_secs);
    let workers = match config.workers {
        0 => crate::config::default_threads(),
        n => n,
    };
    let open_files = connections::raise_open_files_limit();
    let connections_per_worker =
        connections::per_worker(config.limits.max_connections, workers, open_files);
    let listen = config.listen.clone();
    let admin_listen = config.admin_listen().map(str::to_owned);
    let grpc_listener = config.grpc_listen().map(grpc::bind).transpose()?;
    state.grpc_addr = grpc_listener.as_ref().map(|(_, addr)| *addr);
    let state = web::Data::new(state);
    let grpc_state = state.clone();
    let admin_state = state.clone();
    // `/metrics` moves to the admin address when there is one.
    let public_metrics = admin_listen.is_none();
    let public = move |cfg: &mut web::ServiceConfig| {
        routes(cfg);
        if public_metrics {
            metrics_route(cfg);
        }
        rest::tenant_routes(cfg);
    };
    let server = HttpServer::new(move || {
        App::new()
            // A client that appends a route to a base URL ending in `/` asks for
            // `//message:send`: repeated slashes are merged before routing. A trailing slash is
            // kept (JSON-RPC is served at `/`).
            .wrap(NormalizePath::new(TrailingSlash::MergeOnly))
            .wrap(from_fn(unread_body::close_if_unread))
            .wrap(from_fn(media_type::answer_in_kind))
            .wrap(from_fn(traced::request_span))
            .app_data(state.clone())
            .configure(public)
    })
    .workers(workers)
    // Past every worker's share the listener stops accepting: new connections wait in the
    // kernel's listen queue instead of taking descriptors the process does not have.
    .max_connections(connections_per_worker)
    // SSE sends several small writes per turn: without TCP_NODELAY, Nagle holds each one
    // back until the client's delayed ACK (~40 ms on Linux loopback).
    .tcp_nodelay(true)
    .client_request_timeout(HEADERS_TIMEOUT)
    .client_disconnect_timeout(CLOSE_LINGER)
    .disable_signals()
    // Counted from `stop`; actix checks once a second and then drops what is still open.
    .shutdown_timeout((grace + CLOSE_MARGIN).as_secs())
    .bind(&listen)
    .map_err(|error| ServeError::Bind {
        addr: listen.clone(),
        error,
    })?;
    let addr = bound_addr(&server.addrs(), &listen)?;
    let (admin_addr, admin) = match &admin_listen {
        Some(admin_listen) => {
            let (addr, admin) = start_admin(admin_listen, admin_state)?;
            (Some(addr), Some(admin))
        }
        None => (None, None),
    };
    let grpc = match grpc_listener {
        Some((listener, _)) => {
            let base_url = config
                .public_url
                .clone()
                .unwrap_or_else(|| format!("http://{addr}/"));
            // The HTTP port's total, in descriptors the process may open: the same on this port.
            let max_connections = connections_per_worker.saturating_mul(workers);
            Some(grpc::serve(
                listener,
                grpc_state,
                base_url,
                workers,
                max_connections,
            )?)
        }
        None => None,
    };
    let server = server.run();
    let handle = server.handle();
    let task = actix_rt::spawn(server);
    tracing::info!(%addr, "colloquy is listening");
    Ok(RunningServer {
        addr,
        admin_addr,
        grpc_addr: grpc.as_ref().map(|grpc| grpc.addr),
        grpc,
        engine,
        handle,
        task,
        admin,
        grace,
    })
}

fn bound_addr(addrs: &[SocketAddr], listen: &str) -> Result<SocketAddr, ServeError> {
    addrs
        .first()
        .copied()
        .ok_or_else(|| ServeError::Config(format!("{listen} resolved to no address")))
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listen`, sharing the public server's state,
/// and the operator console at `/console` unless `console.enabled` is false.
fn start_admin(
    listen: &str,
    state: web::Data<AppState>,
) -> Result<(SocketAddr, AdminServer), ServeError> {
    let console = state
        .config
        .console
        .enabled
        .then(|| web::Data::new(console::Console::new(&state.config)));
    let with_console = console.clone();
    let server = HttpServer::new(move || {
        let console = with_console.clone();
        App::new()
            .wrap(from_fn(unread_body::close_if_unread))
            .app_data(state.clone())
            .configure(health_routes)
            .configure(metrics_route)
            .configure(move |cfg| {
                if let Some(console) = console {
                    console::routes(cfg, console);
                }
            })
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(2)
    .bind(listen)
    .map_err(|error| ServeError::Bind {
        addr: listen.to_owned(),
        error,
    })?;
    let addr = bound_addr(&server.addrs(), listen)?;
    let server = server.run();
    let handle = server.handle();
    let task = actix_rt::spawn(server);
    match &console {
        Some(console) if !console.requires_token() => tracing::warn!(
            %addr,
            "operator endpoints (/metrics, /healthz, /readyz, /console) are listening; the console has no token (console.token, metrics.token): anyone who reaches this address may use it"
        ),
        Some(_) => tracing::info!(
            %addr,
            "operator endpoints (/metrics, /healthz, /readyz, /console) are listening"
        ),
        None => tracing::info!(
            %addr,
            "operator endpoints (/metrics, /healthz, /readyz) are listening"
        ),
    }
    Ok((addr, AdminServer { handle, task }))
}

/// The A2A endpoint, the agent card and health (the container's healthcheck uses this port);
/// `/metrics` is added here only without `admin_listen`.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/")
            .route(web::post().to(rpc::handle))
            .default_service(web::to(method_not_allowed)),
    )
    .route(forward::PATH, web::post().to(rpc::handle_forwarded))
    .service(
        web::scope(forward::REST_PREFIX)
            .app_data(rpc::Caller::Node)
            .configure(rest::routes)
            .configure(rest::tenant_routes),
    )
    .route(
        "/.well-known/agent-card.json",
        web::get().to(card::agent_card),
    )
    .route("/.well-known/agent.json", web::get().to(card::agent_card))
    .route(crate::push::sign::JWKS_PATH, web::get().to(push::jwks))
    .configure(rest::routes)
    .configure(health_routes);
}

fn health_routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/healthz", web::get().to(healthz))
        .route("/readyz", web::get().to(readyz));
}

fn metrics_route(cfg: &mut web::ServiceConfig) {
    cfg.route("/metrics", web::get().to(metrics_endpoint::metrics));
}

async fn method_not_allowed() -> HttpResponse {
    HttpResponse::MethodNotAllowed()
        .insert_header(("Allow", "POST"))
        .json(serde_json::json!({
            "error": "the JSON-RPC endpoint takes POST with a JSON body; the agent card is at /.well-known/agent-card.json"
        }))
}

/// A 200 whose body is `value` as JSON, written into one buffer sized for a usual reply
/// (actix's `json` starts at 128 bytes and grows the buffer four or five times for a task).
pub(crate) fn json_ok(value: &(impl serde::Serialize + ?Sized)) -> HttpResponse {
    let mut body = Vec::with_capacity(4096);
    match serde_json::to_writer(&mut body, value) {
        Ok(()) => json_body(body),
        // Our answers always serialize (string keys, no fallible serializers); kept an error
        // response rather than a panic regardless.
        Err(e) => HttpResponse::InternalServerError().body(e.to_string()),
    }
}

/// A 200 whose body is JSON already written.
pub(crate) fn json_body(body: Vec<u8>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(actix_web::http::header::ContentType::json())
        .body(body)
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
