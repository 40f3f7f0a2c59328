//! Requests that follow a task another node runs (`GetTask`, `CancelTask`), by either binding,
//! go to that node: its address is in the conversation's lease. The request
//! is passed on as it came (HTTP method, path, query, body and wire version) to the holder's
//! internal endpoints, [`PATH`] for JSON-RPC and the HTTP+JSON routes under [`REST_PREFIX`],
//! authenticated by the shared `cluster.secret` and carrying the caller's principal; the holder's
//! answer is passed back byte for byte. A holder that cannot be reached is answered from the
//! database here (its lease expires, then its task reads failed). Subscriptions stay with the
//! node they were made on, which takes each turn's events from the node that runs it
//! ([`NodeRelay`]) and so follows the task across nodes.

use super::state::AppState;
use crate::engine::hub::Forwarder;
use crate::engine::resume::Resumed;
use crate::engine::{EventId, Relay, Sequenced, Subscription};
use crate::error::chain;
use crate::protocol::{Method, WireVersion, codec};
use crate::store::SharedStore;
use crate::telemetry::{propagation, traces};
use actix_web::http::StatusCode;
use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse};
use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use std::time::Duration;
use subtle::ConstantTimeEq;
use tracing::Instrument;

/// The internal endpoint a node serves forwarded JSON-RPC requests on.
pub const PATH: &str = "/_colloquy/forward";
/// Where a node serves the HTTP+JSON routes again for forwarded requests (`/tasks/...` there
/// is `REST_PREFIX/tasks/...` here).
pub const REST_PREFIX: &str = "/_colloquy/forward/rest";
const SECRET_HEADER: &str = "X-Colloquy-Cluster-Secret";
/// The caller's principal, hex-encoded (any string fits a header that way).
const PRINCIPAL_HEADER: &str = "X-Colloquy-Principal";

/// Why a forwarded request was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum ForwardRefused {
    #[error("forwarding between nodes is off here (cluster.secret is not set)")]
    Off,
    #[error("the cluster secret is missing or wrong")]
    BadSecret,
    #[error("the forwarded principal is missing or malformed")]
    BadPrincipal,
}

fn header_text<'r>(req: &'r HttpRequest, name: &str) -> Option<&'r str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

/// The principal a forwarded request acts for, once the caller proved it is a node.
pub fn forwarded_principal(state: &AppState, req: &HttpRequest) -> Result<String, ForwardRefused> {
    let secret = state.config.cluster.secret().ok_or(ForwardRefused::Off)?;
    let given = header_text(req, SECRET_HEADER).unwrap_or_default();
    if !bool::from(given.as_bytes().ct_eq(secret.as_bytes())) {
        return Err(ForwardRefused::BadSecret);
    }
    let encoded = header_text(req, PRINCIPAL_HEADER).ok_or(ForwardRefused::BadPrincipal)?;
    hex::decode(encoded)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .ok_or(ForwardRefused::BadPrincipal)
}

thread_local! {
    /// One client per worker thread: its connections live on that thread's runtime.
    /// Never through an HTTP_PROXY the environment names: requests carry the cluster secret.
    static CLIENT: reqwest::Client = reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap_or_default();
}

/// The holder's answer to a JSON-RPC request, if it follows `task_id`, which another node runs,
/// and that node answered.
pub async fn rpc_to_holder(
    state: &AppState,
    req: &HttpRequest,
    principal: &str,
    method: Method,
    task_id: &str,
    body: &[u8],
) -> Option<HttpResponse> {
    to_holder(state, req, principal, method, task_id, PATH, || {
        body.to_vec()
    })
    .await
}

/// The holder's answer to an HTTP+JSON request, if it follows a task another node runs and that
/// node answered: the same route, under [`REST_PREFIX`] there. `body` makes the body to pass on,
/// only when it is passed on.
pub async fn rest_to_holder(
    state: &AppState,
    req: &HttpRequest,
    principal: &str,
    method: Method,
    task_id: &str,
    body: impl FnOnce() -> Vec<u8>,
) -> Option<HttpResponse> {
    let path = format!("{REST_PREFIX}{}", req.path());
    to_holder(state, req, principal, method, task_id, &path, body).await
}

async fn to_holder(
    state: &AppState,
    req: &HttpRequest,
    principal: &str,
    method: Method,
    task_id: &str,
    path: &str,
    body: impl FnOnce() -> Vec<u8>,
) -> Option<HttpResponse> {
    let http_method =
        reqwest::Method::from_bytes(req.method().as_str().as_bytes()).unwrap_or_default();
    let call = HolderCall {
        principal,
        method,
        task_id,
        http_method,
        path_and_query: match req.query_string() {
            "" => path.to_owned(),
            query => format!("{path}?{query}"),
        },
        version: header_text(req, super::rpc::VERSION_HEADER),
        last_event_id: None,
    };
    let answer = call.send(state, body).await?;
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut response = HttpResponse::build(status);
    for name in [header::CONTENT_TYPE, header::CACHE_CONTROL] {
        if let Some(value) = answer.headers().get(name.as_str()) {
            response.insert_header((name, value.as_bytes()));
        }
    }
    Some(
        response.streaming(
            answer
                .bytes_stream()
                .map(|chunk| chunk.map_err(std::io::Error::other)),
        ),
    )
}

/// The holder's answer to a JSON-RPC v1.0 request made here for another binding (gRPC), if
/// `params` name a task another node runs and that node answered: the JSON-RPC response, or
/// its SSE stream.
pub async fn v1_call_to_holder(
    state: &AppState,
    principal: &str,
    method: Method,
    params: &serde_json::Value,
) -> Option<reqwest::Response> {
    let task_id = params.get("id")?.as_str()?;
    let call = HolderCall {
        principal,
        method,
        task_id,
        http_method: reqwest::Method::POST,
        path_and_query: PATH.to_owned(),
        version: Some("1.0"),
        last_event_id: None,
    };
    let body = || {
        let request = serde_json::json!({
            "jsonrpc": "2.0",
            "id": 1,
            "method": method.label(),
            "params": params,
        });
        request.to_string().into_bytes()
    };
    call.send(state, body).await
}

/// A request passed on to the node that runs `task_id`.
struct HolderCall<'a> {
    principal: &'a str,
    method: Method,
    task_id: &'a str,
    http_method: reqwest::Method,
    path_and_query: String,
    version: Option<&'a str>,
    /// Where a resumed stream goes on from.
    last_event_id: Option<&'a str>,
}

impl HolderCall<'_> {
    /// The holder's answer; `None` when the call is not one that follows a task, the task runs
    /// here or nowhere, or its node does not answer (then the database answers here).
    /// Subscriptions are not passed on: the engine relays their turns (see [`NodeRelay`]).
    async fn send(
        self,
        state: &AppState,
        body: impl FnOnce() -> Vec<u8>,
    ) -> Option<reqwest::Response> {
        let secret = state.config.cluster.secret()?;
        if !matches!(self.method, Method::GetTask | Method::CancelTask) {
            return None;
        }
        if state.engine.runs_here(self.principal, self.task_id) {
            return None;
        }
        self.post(secret, state.engine.store(), body).await
    }

    /// Passes the call on to the node whose lease runs the task, if another one does.
    async fn post(
        self,
        secret: &str,
        store: &SharedStore,
        body: impl FnOnce() -> Vec<u8>,
    ) -> Option<reqwest::Response> {
        let task_id = self.task_id;
        let holder = match store.running_holder(self.principal, task_id).await {
            Ok(holder) => holder?,
            Err(e) => {
                tracing::warn!(error = %chain(&e), %task_id, "finding the node that runs a task");
                return None;
            }
        };
        let url = format!("{}{}", holder.trim_end_matches('/'), self.path_and_query);
        let span = tracing::debug_span!(
            "forward",
            otel.kind = "client",
            method = self.method.label(),
            node = %holder,
        );
        let forward = CLIENT
            .with(Clone::clone)
            .request(self.http_method, url)
            .header(header::CONTENT_TYPE.as_str(), "application/json")
            .header(SECRET_HEADER, secret)
            .header(PRINCIPAL_HEADER, hex::encode(self.principal))
            .body(body());
        let mut forward = span.in_scope(|| propagation::onto(forward));
        if let Some(version) = self.version {
            forward = forward.header(super::rpc::VERSION_HEADER, version);
        }
        if let Some(last_event_id) = self.last_event_id {
            forward = forward.header(super::sse::LAST_EVENT_ID, last_event_id);
        }
        match forward.send().instrument(span.clone()).await {
            Ok(answer) => {
                metrics::counter!("colloquy_forwarded_requests_total").increment(1);
                Some(answer)
            }
            Err(e) => {
                traces::fail(&span, e.to_string());
                tracing::warn!(error = %chain(&e), %holder, %task_id, "the node running a task did not answer; answering from the database");
                None
            }
        }
    }
}

/// Relays the events of a turn another node runs: a turn-only `SubscribeToTask` (JSON-RPC
/// v1.0) to that node's internal endpoint, its SSE events decoded back into stream items with
/// their ids. The subscribing node's engine follows the task from turn to turn.
pub struct NodeRelay {
    secret: String,
    store: SharedStore,
    buffer: usize,
}

impl NodeRelay {
    pub fn new(secret: String, store: SharedStore, buffer: usize) -> Self {
        NodeRelay {
            secret,
            store,
            buffer,
        }
    }
}

impl Relay for NodeRelay {
    fn subscribe(
        &self,
        principal: &str,
        task_id: &str,
        after: Option<EventId>,
    ) -> BoxFuture<'static, Option<Subscription>> {
        let (secret, store, buffer) = (self.secret.clone(), self.store.clone(), self.buffer);
        let (principal, task_id) = (principal.to_owned(), task_id.to_owned());
        Box::pin(async move {
            let after = after.map(|id| id.to_string());
            let call = HolderCall {
                principal: &principal,
                method: Method::SubscribeToTask,
                task_id: &task_id,
                http_method: reqwest::Method::POST,
                path_and_query: PATH.to_owned(),
                version: Some("1.0"),
                last_event_id: after.as_deref(),
            };
            let body = || {
                let params = serde_json::json!({"id": task_id, "turnOnly": true});
                let request = serde_json::json!({
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": Method::SubscribeToTask.label(),
                    "params": params,
                });
                request.to_string().into_bytes()
            };
            let answer = call.post(&secret, &store, body).await?;
            let is_stream = answer
                .headers()
                .get(header::CONTENT_TYPE.as_str())
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
            if !answer.status().is_success() || !is_stream {
                return None;
            }
            let resumed = answer
                .headers()
                .get(super::sse::RESUMED_HEADER)
                .and_then(|v| v.to_str().ok())
                .and_then(Resumed::from_label);
            let (forwarder, mut subscription) = Subscription::forwarding(buffer, resumed);
            subscription.relayed = true;
            tokio::spawn(relay_events(answer, forwarder, task_id));
            Some(subscription)
        })
    }
}

/// Passes the relayed stream's events on until it ends, breaks off, or says an error (each
/// ends the relayed subscription; the subscribing node's engine decides what follows).
async fn relay_events(answer: reqwest::Response, forwarder: Forwarder, task_id: String) {
    let mut events = answer.bytes_stream().eventsource();
    while let Some(Ok(event)) = events.next().await {
        if event.data.is_empty() {
            continue;
        }
        let value: serde_json::Value = match serde_json::from_str(&event.data) {
            Ok(value) => value,
            Err(e) => {
                tracing::warn!(error = %e, %task_id, "a relayed event is not JSON");
                return;
            }
        };
        let Some(result) = value.get("result") else {
            return;
        };
        let item = match codec::decode_stream_item(WireVersion::V1, result) {
            Ok(item) => item,
            Err(e) => {
                tracing::warn!(error = %e, %task_id, "a relayed event does not decode");
                return;
            }
        };
        let id = event.id.parse().ok();
        if forwarder.tx.send(Sequenced { id, item }).await.is_err() {
            return;
        }
    }
}
