//! The gRPC binding of A2A v1.0: `lf.a2a.v1.A2AService` (the specification's `a2a.proto`, as the
//! official generated types in `a2a-pb` carry it), served with tonic on `grpc_listen`.
//!
//! It runs on a tokio runtime of its own (as many threads as the HTTP workers): tonic serves on
//! tokio, the engine's actors answer messages from any thread, and each call goes through the
//! same dispatch as JSON-RPC (`service.rs`), so auth, limits, metrics and errors are the same.

mod deadline;
mod forwarded;
mod limit;
mod oversize;
mod service;
mod status;

use super::ServeError;
use super::state::AppState;
use a2a_pb::proto::a2a_service_server::A2aServiceServer;
use actix_web::web;
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;
use tokio::sync::oneshot;

/// Why the gRPC server stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum GrpcServeError {
    #[error("taking over the gRPC listener: {0}")]
    Listener(#[source] std::io::Error),
    #[error("serving gRPC: {0}")]
    Transport(#[source] tonic::transport::Error),
}

/// Pings an idle connection this often, and drops it when a ping goes unanswered this long:
/// a peer that vanished without closing does not keep its connection.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Calls one connection may have open at once (HTTP/2 streams).
const STREAMS_PER_CONNECTION: u32 = 256;
/// A connection this old is asked to go away (clients reconnect, to any node behind a load
/// balancer), and its calls then have the grace to end: no connection is held forever.
const CONNECTION_AGE: Duration = Duration::from_secs(300);
const CONNECTION_AGE_GRACE: Duration = Duration::from_secs(1800);

/// Binds `listen` now, so a taken address fails the start and the card knows the port.
pub fn bind(listen: &str) -> Result<(TcpListener, SocketAddr), ServeError> {
    let bind_error = |error| ServeError::Bind {
        addr: listen.to_owned(),
        error,
    };
    let listener = TcpListener::bind(listen).map_err(bind_error)?;
    listener.set_nonblocking(true).map_err(bind_error)?;
    let addr = listener.local_addr().map_err(bind_error)?;
    Ok((listener, addr))
}

/// The running gRPC server.
pub struct GrpcServer {
    pub addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), GrpcServeError>>,
    /// Taken when the server is dropped: a runtime cannot be dropped (blocking) on another's.
    runtime: Option<tokio::runtime::Runtime>,
}

/// Serves the binding on `listener` with `threads` threads, at most `max_connections` open at
/// once. `base_url` is the HTTP bindings' (the extended card names it).
pub fn serve(
    listener: TcpListener,
    state: web::Data<AppState>,
    base_url: String,
    threads: usize,
    max_connections: usize,
) -> Result<GrpcServer, ServeError> {
    let addr = listener.local_addr().map_err(|error| ServeError::Bind {
        addr: "grpc_listen".into(),
        error,
    })?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .thread_name("colloquy-grpc")
        .enable_all()
        .build()
        .map_err(|error| ServeError::Bind {
            addr: addr.to_string(),
            error,
        })?;
    let limits = &state.config.limits;
    let request_deadline = deadline::RequestDeadline(Duration::from_millis(limits.body_timeout_ms));
    let service = A2aServiceServer::new(service::A2aGrpc {
        state: state.clone(),
        base_url,
    })
    .max_decoding_message_size(limits.body_bytes)
    .max_encoding_message_size(limits.response_bytes);
    let (shutdown, stopped) = oneshot::channel::<()>();
    let task = runtime.spawn(async move {
        let listener =
            tokio::net::TcpListener::from_std(listener).map_err(GrpcServeError::Listener)?;
        tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
            .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
            .max_concurrent_streams(Some(STREAMS_PER_CONNECTION))
            .max_connection_age(CONNECTION_AGE)
            .max_connection_age_grace(CONNECTION_AGE_GRACE)
            .layer(request_deadline)
            .layer(oversize::OversizeExhausts)
            .add_service(service)
            .serve_with_incoming_shutdown(limit::accept(listener, max_connections), async {
                let _ = stopped.await;
            })
            .await
            .map_err(GrpcServeError::Transport)
    });
    tracing::info!(%addr, "the gRPC binding is listening");
    Ok(GrpcServer {
        addr,
        shutdown: Some(shutdown),
        task,
        runtime: Some(runtime),
    })
}

impl GrpcServer {
    /// Stops accepting (new calls are refused, clients told to go away); the calls under way
    /// have until [`GrpcServer::finish`].
    pub fn close(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }

    /// Waits up to `margin` for the open calls to end, then drops what is left.
    pub async fn finish(mut self, margin: Duration) {
        self.close();
        match tokio::time::timeout(margin, &mut self.task).await {
            Ok(Ok(Err(error))) => tracing::warn!(%error, "the gRPC server stopped with an error"),
            Ok(_) => {}
            Err(_) => tracing::info!("gRPC calls still open after the grace period are dropped"),
        }
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
