//! What every handler shares: built by the composition root (`crate::app`), served by `http`.

use super::auth::Auth;
use crate::config::Config;
use crate::engine::Engine;
use std::sync::Arc;

pub struct AppState {
    pub engine: Engine,
    pub config: Arc<Config>,
    pub auth: Auth,
    pub metrics: metrics_exporter_prometheus::PrometheusHandle,
    /// Digest of the bearer token `/metrics` requires (`metrics.token`), if any.
    pub metrics_token: Option<[u8; 32]>,
    /// Push-notification configs (`http::push`); None where the store keeps none: push methods
    /// then answer -32003 and the card says so.
    pub push: Option<crate::push::PushConfigs>,
    /// The keys push notifications and the card are signed with; their public parts are
    /// served at `/.well-known/jwks.json`.
    pub keys: Arc<super::credentials::SigningKeys>,
    /// The peers whose `Forwarded` / `X-Forwarded-*` headers are believed (`trusted_proxies`).
    pub proxies: super::origin::TrustedProxies,
    /// Where the gRPC binding listens, once bound (`grpc_listen`); the card lists it.
    pub grpc_addr: Option<std::net::SocketAddr>,
}
