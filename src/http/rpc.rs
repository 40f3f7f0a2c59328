//! `POST /`: read and check the envelope, authenticate, pick the wire version, dispatch.

use super::auth::{AuthError, Identity};
use super::forward;
use super::methods::{self, Reply};
use super::sse;
use super::state::AppState;
use crate::protocol::jsonrpc::{RequestId, failure, success, success_text};
use crate::protocol::params::Params;
use crate::protocol::{Method, RpcError, RpcRequest, WireVersion};
use crate::telemetry::Handles;
use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpRequest, HttpResponse, web};
use bytes::BytesMut;
use futures_util::StreamExt;
use metrics::{Counter, Histogram};
use std::time::{Duration, Instant};

pub const VERSION_HEADER: &str = "A2A-Version";
/// [`VERSION_HEADER`] as a header name: looking a header up by text parses the name each time.
const VERSION_HEADER_NAME: header::HeaderName = header::HeaderName::from_static("a2a-version");

pub(super) fn requested_version(req: &HttpRequest) -> Option<String> {
    if let Some(value) = req.headers().get(VERSION_HEADER_NAME) {
        return Some(value.to_str().unwrap_or("(not text)").to_owned());
    }
    web::Query::<std::collections::HashMap<String, String>>::from_query(req.query_string())
        .ok()
        .and_then(|q| q.get(VERSION_HEADER).cloned())
}

pub fn error_response(
    status: StatusCode,
    id: &RequestId,
    error: &RpcError,
    version: WireVersion,
) -> HttpResponse {
    let mut response = HttpResponse::build(status).json(failure(id, error, version));
    if let Some(challenge) = error.www_authenticate() {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(challenge),
        );
    }
    response
}

/// Why a request body was not taken.
#[derive(Debug, thiserror::Error)]
pub(super) enum BodyError {
    #[error("the request body ({size}) exceeds the limit of {limit} bytes")]
    TooLarge { size: String, limit: usize },
    #[error("the request body was not received within {0} ms")]
    TooSlow(u128),
    #[error("reading the body: {0}")]
    Unreadable(#[source] actix_web::error::PayloadError),
}

impl BodyError {
    pub(super) fn status(&self) -> StatusCode {
        match self {
            BodyError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            BodyError::Unreadable(_) => StatusCode::BAD_REQUEST,
            BodyError::TooSlow(_) => StatusCode::REQUEST_TIMEOUT,
        }
    }
}

/// Reads the whole body within `deadline`: a client that declares a large body and drips it
/// would otherwise hold its connection (and a file descriptor) for as long as it likes.
pub(super) async fn read_body(
    req: &HttpRequest,
    payload: web::Payload,
    limit: usize,
    deadline: Duration,
) -> Result<BytesMut, BodyError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if let Some(length) = declared.filter(|l| *l > limit) {
        return Err(BodyError::TooLarge {
            size: format!("{length} bytes"),
            limit,
        });
    }
    let capacity = declared.unwrap_or(1024).min(limit);
    tokio::time::timeout(deadline, collect_body(payload, limit, capacity))
        .await
        .map_err(|_| BodyError::TooSlow(deadline.as_millis()))?
}

async fn collect_body(
    mut payload: web::Payload,
    limit: usize,
    capacity: usize,
) -> Result<BytesMut, BodyError> {
    let mut body = BytesMut::with_capacity(capacity);
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(BodyError::Unreadable)?;
        if body.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge {
                size: "more than that".into(),
                limit,
            });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Who sent a request: a client (authenticated by its bearer token), or another node passing
/// on a client's request for a task this node runs (authenticated by the cluster secret; the
/// HTTP+JSON routes under `forward::REST_PREFIX` carry `Node` as app data).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Caller {
    Client,
    Node,
}

pub async fn handle(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> HttpResponse {
    respond(req, payload, state, Caller::Client).await
}

/// `POST /_colloquy/forward`: a request another node forwarded here (see `forward.rs`).
pub async fn handle_forwarded(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> HttpResponse {
    respond(req, payload, state, Caller::Node).await
}

/// Who a request acts as: the client its bearer token names, or the principal another node
/// passed on with it (already in its tenant).
pub(super) async fn identity_of(
    req: &HttpRequest,
    state: &AppState,
    caller: Caller,
) -> Result<Identity, RpcError> {
    match caller {
        Caller::Client => authenticate(req.headers(), state).await,
        Caller::Node => forward::forwarded_principal(state, req)
            .map(Identity::of)
            .map_err(|e| {
                metrics::counter!("colloquy_auth_failures_total").increment(1);
                RpcError::Unauthenticated(e.to_string())
            }),
    }
}

/// The principal a request acts as in the tenant its params name (v1.0's `tenant`). A node
/// passes on a principal already in its tenant.
pub(super) fn principal_in_tenant(
    state: &AppState,
    caller: Caller,
    identity: Identity,
    tenant: Option<&serde_json::Value>,
) -> Result<String, RpcError> {
    if caller == Caller::Node {
        return Ok(identity.principal);
    }
    let tenant = match tenant {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(tenant)) => Some(tenant.as_str()),
        Some(_) => return Err(RpcError::InvalidParams("tenant must be a string".into())),
    };
    state.auth.scoped(identity, tenant).map_err(refusal)
}

async fn respond(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
    caller: Caller,
) -> HttpResponse {
    let started = Instant::now();
    let version_requested = requested_version(&req);
    let version_or_error = WireVersion::parse(version_requested.as_deref());
    let version = version_or_error.clone().unwrap_or(WireVersion::V03);
    if !super::media_type::is_json(&req) {
        let error = super::media_type::not_json();
        return error_response(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            &RequestId::Null,
            &error,
            version,
        );
    }
    let identity = match identity_of(&req, &state, caller).await {
        Ok(identity) => identity,
        Err(error) => {
            let status = StatusCode::from_u16(error.spelling().http_status)
                .unwrap_or(StatusCode::BAD_REQUEST);
            return error_response(status, &RequestId::Null, &error, version);
        }
    };
    let body = match read_limited_body(&req, payload, &state).await {
        Ok(body) => body,
        Err(error) => {
            let status = error.status();
            let error = RpcError::InvalidRequest(error.to_string());
            return error_response(status, &RequestId::Null, &error, version);
        }
    };
    let request = match RpcRequest::parse(&body) {
        Ok(request) => request,
        Err((id, error)) => {
            record("invalid", error.code(), started);
            return error_response(StatusCode::OK, &id, &error, version);
        }
    };
    let version = match version_or_error {
        Ok(version) => version,
        Err(error) => {
            record("invalid", error.code(), started);
            return error_response(StatusCode::OK, &request.id, &error, WireVersion::V03);
        }
    };
    let method = match Method::resolve(version, &request.method) {
        Ok(method) => method,
        Err(error) => {
            record("unknown", error.code(), started);
            return error_response(StatusCode::OK, &request.id, &error, version);
        }
    };
    let mut params = Params::Text(request.params);
    let routing = match params.routing() {
        Ok(routing) => routing,
        Err(error) => {
            let error = RpcError::from(error);
            record(method.label(), error.code(), started);
            return error_response(StatusCode::OK, &request.id, &error, version);
        }
    };
    let principal = match principal_in_tenant(&state, caller, identity, routing.tenant.as_ref()) {
        Ok(principal) => principal,
        Err(error) => {
            record(method.label(), error.code(), started);
            return error_response(StatusCode::OK, &request.id, &error, version);
        }
    };
    // A task another node runs is served by that node (its lease names it).
    let task_id = routing.id.as_ref().and_then(serde_json::Value::as_str);
    if caller == Caller::Client
        && let Some(task_id) = task_id
        && let Some(response) =
            forward::rpc_to_holder(&state, &req, &principal, method, task_id, &body).await
    {
        record(method.label(), 0, started);
        return response;
    }
    let id = request.id;
    if method == Method::SubscribeToTask
        && let Ok(serde_json::Value::Object(params)) = params.tree_mut()
    {
        sse::resume_point(&req, params);
    }
    match call_over_http(&req, &state, version, method, &principal, params, started).await {
        Ok(Reply::Json(result)) => super::json_ok(&success(&id, &result)),
        Ok(Reply::Text(result)) => super::json_body(success_text(&id, &result)),
        Ok(Reply::Stream(stream)) => sse::respond(stream, sse::Framing::JsonRpc { id, version }),
        Err(error) if version == WireVersion::V03 && method == Method::SubscribeToTask => {
            sse::respond_error(&error, sse::Framing::JsonRpc { id, version })
        }
        Err(error) => error_response(StatusCode::OK, &id, &error, version),
    }
}

/// The caller a request's headers name, or why none (counted for the metrics), whichever
/// binding carried them. Several `Authorization` headers are an invalid request (HTTP 400), not
/// a wrong token.
pub(super) async fn authenticate(
    headers: &actix_web::http::header::HeaderMap,
    state: &AppState,
) -> Result<Identity, RpcError> {
    identify(state, super::auth::authorization(headers)).await
}

/// The caller an `Authorization` value names (or why none does), whichever binding carried
/// it; a refusal is counted for the metrics.
pub(super) async fn identify(
    state: &AppState,
    authorization: Result<Option<&str>, AuthError>,
) -> Result<Identity, RpcError> {
    let identity = match authorization {
        Ok(authorization) => state.auth.identify(authorization).await,
        Err(error) => Err(error),
    };
    identity.map_err(|error| {
        metrics::counter!("colloquy_auth_failures_total").increment(1);
        refusal(error)
    })
}

/// The wire error for an authentication or tenant refusal.
pub(super) fn refusal(error: AuthError) -> RpcError {
    let message = error.to_string();
    match error {
        AuthError::Missing => RpcError::Unauthenticated(message),
        AuthError::Invalid | AuthError::Refused(_) => RpcError::InvalidToken(message),
        AuthError::Repeated(_) => RpcError::InvalidRequest(message),
        AuthError::BadTenant(_) => RpcError::InvalidParams(message),
        AuthError::TenantNotAllowed(_) => RpcError::PermissionDenied(message),
    }
}

/// The body within the configured size and time limits.
pub(super) async fn read_limited_body(
    req: &HttpRequest,
    payload: web::Payload,
    state: &AppState,
) -> Result<BytesMut, BodyError> {
    let limits = &state.config.limits;
    let deadline = Duration::from_millis(limits.body_timeout_ms);
    read_body(req, payload, limits.body_bytes, deadline).await
}

/// [`call`] for a request of an HTTP binding (JSON-RPC, HTTP+JSON): the base URL is the one
/// its client reached this server by (`origin.rs`).
pub(super) async fn call_over_http(
    req: &HttpRequest,
    state: &AppState,
    version: WireVersion,
    method: Method,
    principal: &str,
    params: Params,
    started: Instant,
) -> Result<Reply, RpcError> {
    let base_url = super::origin::base_url_for(state, req, method);
    call(
        state,
        version,
        method,
        principal,
        base_url.as_deref(),
        params,
        started,
    )
    .await
}

/// One method call, whichever binding it came by: traced, dispatched, counted.
pub(super) async fn call(
    state: &AppState,
    version: WireVersion,
    method: Method,
    principal: &str,
    base_url: Option<&str>,
    params: Params,
    started: Instant,
) -> Result<Reply, RpcError> {
    super::traced::name_request(method.label(), version.label());
    let reply = methods::dispatch(state, version, method, principal, base_url, params).await;
    match &reply {
        Ok(_) => record(method.label(), 0, started),
        // An internal error was logged with its causes where it became an RpcError.
        Err(error) => record(method.label(), error.code(), started),
    }
    reply
}

pub(super) fn record(method: &'static str, code: i64, started: Instant) {
    static REQUESTS: Handles<(&str, i64), Counter> = Handles::new();
    static SECONDS: Handles<&str, Histogram> = Handles::new();
    let outcome = || {
        if code == 0 {
            "ok".to_owned()
        } else {
            code.to_string()
        }
    };
    super::traced::record_outcome(outcome, code != 0);
    REQUESTS
        .get((method, code), || {
            metrics::counter!("colloquy_rpc_requests_total", "method" => method, "outcome" => outcome())
        })
        .increment(1);
    SECONDS
        .get(
            method,
            || metrics::histogram!("colloquy_rpc_request_seconds", "method" => method),
        )
        .record(started.elapsed());
}
