//! The HTTP+JSON binding of A2A v1.0: resource URLs onto the same method handlers as JSON-RPC.
//!
//! A route only gathers the method's params (the path's task id, the query of a GET, the JSON
//! body of a POST) and hands them to [`methods::dispatch`] through [`rpc::call`]; results are
//! the JSON-RPC results without the envelope, streams carry bare `StreamResponse` events, and an
//! error is a `google.rpc.Status` body with the HTTP status the specification pairs with it.
//! Paths are the ones the released v1.0 SDKs use (`/message:send`, no `/v1` prefix).

use super::methods::Reply;
use super::rpc::{self, BodyError};
use super::sse;
use super::state::AppState;
use crate::protocol::params::Params;
use crate::protocol::{Method, RpcError, WireVersion, protojson, rest03};
use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::{Map, Value};
use std::time::Instant;

pub fn routes(cfg: &mut web::ServiceConfig) {
    v1_routes(cfg);
    cfg.service(
        web::scope(V03_PREFIX)
            .app_data(Dialect::V03)
            .configure(shared_routes)
            .route("/card", web::get().to(extended_card)),
    );
}

/// v1.0's routes under a tenant (`/{tenant}/message:send`, ...): registered after every other
/// route of the server, so that a path another route serves never reaches them.
pub fn tenant_routes(cfg: &mut web::ServiceConfig) {
    cfg.service(web::scope("/{tenant}").configure(v1_routes));
}

fn v1_routes(cfg: &mut web::ServiceConfig) {
    shared_routes(cfg);
    cfg.route("/tasks", web::get().to(list_tasks))
        .route("/extendedAgentCard", web::get().to(extended_card));
}

/// The routes both versions serve at the same paths (v0.3's under [`V03_PREFIX`]).
fn shared_routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/message:send", web::post().to(send_message))
        .route("/message:stream", web::post().to(send_streaming_message))
        .route("/tasks/{task}", web::get().to(task_get))
        .route("/tasks/{task}", web::post().to(task_post))
        .route(
            "/tasks/{task}/pushNotificationConfigs",
            web::route().to(push_configs),
        )
        .route(
            "/tasks/{task}/pushNotificationConfigs/{config}",
            web::route().to(push_configs),
        );
}

/// Where v0.3's HTTP+JSON routes sit (its SDKs put `/v1` before every path).
pub const V03_PREFIX: &str = "/v1";

/// Which version's HTTP+JSON a route speaks: v1.0's, or v0.3's (under [`V03_PREFIX`],
/// translated at the edge by [`rest03`]; the handlers see v1.0 params either way).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dialect {
    V1,
    V03,
}

impl Dialect {
    fn of(req: &HttpRequest) -> Dialect {
        req.app_data::<Dialect>().copied().unwrap_or(Dialect::V1)
    }
}

/// What a route takes from the request body.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Body {
    /// The body is the method's params (a JSON object; may be empty for an action).
    Params,
    /// No body expected; none is read.
    Unread,
}

/// `/tasks/{id}` and its custom methods `/tasks/{id}:cancel`, `/tasks/{id}:subscribe`.
fn task_target(segment: &str) -> (&str, Option<&str>) {
    match segment.rsplit_once(':') {
        Some((id, action @ ("cancel" | "subscribe"))) if !id.is_empty() => (id, Some(action)),
        _ => (segment, None),
    }
}

async fn send_message(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> HttpResponse {
    serve(
        &req,
        payload,
        &state,
        Method::SendMessage,
        Map::new(),
        Body::Params,
    )
    .await
}

async fn send_streaming_message(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> HttpResponse {
    let method = Method::SendStreamingMessage;
    serve(&req, payload, &state, method, Map::new(), Body::Params).await
}

async fn list_tasks(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> HttpResponse {
    match query_params(&req) {
        Ok(params) => {
            serve(
                &req,
                payload,
                &state,
                Method::ListTasks,
                params,
                Body::Unread,
            )
            .await
        }
        Err(error) => error_response(&error, None),
    }
}

/// `GET /tasks/{id}` (GetTask) and `GET /tasks/{id}:subscribe` (SubscribeToTask).
async fn task_get(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> HttpResponse {
    // By name: under `/{tenant}/` the path has two segments to match.
    let (id, action) = task_target(req.match_info().get("task").unwrap_or_default());
    let method = match action {
        None => Method::GetTask,
        Some("subscribe") => Method::SubscribeToTask,
        Some(_) => return not_found(&req),
    };
    let mut params = match query_params(&req) {
        Ok(params) => params,
        Err(error) => return error_response(&error, None),
    };
    params.insert("id".into(), Value::String(id.to_owned()));
    if method == Method::SubscribeToTask {
        sse::resume_point(&req, &mut params);
    }
    serve(&req, payload, &state, method, params, Body::Unread).await
}

/// `POST /tasks/{id}:cancel` (CancelTask) and `POST /tasks/{id}:subscribe` (SubscribeToTask).
async fn task_post(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> HttpResponse {
    // By name: under `/{tenant}/` the path has two segments to match.
    let (id, action) = task_target(req.match_info().get("task").unwrap_or_default());
    let method = match action {
        Some("cancel") => Method::CancelTask,
        Some("subscribe") => Method::SubscribeToTask,
        _ => return not_found(&req),
    };
    let mut params = Map::from_iter([("id".to_owned(), Value::String(id.to_owned()))]);
    if method == Method::SubscribeToTask {
        sse::resume_point(&req, &mut params);
    }
    serve(&req, payload, &state, method, params, Body::Params).await
}

/// `/tasks/{task}/pushNotificationConfigs[/{config}]`: create (POST), list or get (GET), delete.
async fn push_configs(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> HttpResponse {
    let task = req.match_info().get("task").unwrap_or_default().to_owned();
    let config = req.match_info().get("config").map(str::to_owned);
    let method = match (req.method().as_str(), &config) {
        ("POST", None) => Method::CreatePushConfig,
        ("GET", None) => Method::ListPushConfigs,
        ("GET", Some(_)) => Method::GetPushConfig,
        ("DELETE", Some(_)) => Method::DeletePushConfig,
        _ => return not_found(&req),
    };
    let mut params = Map::from_iter([("taskId".to_owned(), Value::String(task))]);
    if let Some(config) = config {
        params.insert("id".to_owned(), Value::String(config));
    }
    let body = match method {
        Method::CreatePushConfig => Body::Params,
        _ => Body::Unread,
    };
    serve(&req, payload, &state, method, params, body).await
}

async fn extended_card(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> HttpResponse {
    let method = Method::GetExtendedAgentCard;
    serve(&req, payload, &state, method, Map::new(), Body::Unread).await
}

fn not_found(req: &HttpRequest) -> HttpResponse {
    let error = RpcError::MethodNotFound(format!(
        "no HTTP+JSON method at {} {}",
        req.method(),
        req.path()
    ));
    error_response(&error, None)
}

/// Query parameters as params: strings, except the one boolean field, so the handlers' checks
/// (numbers may come as decimal strings, as ProtoJSON allows) apply as they do to JSON bodies.
fn query_params(req: &HttpRequest) -> Result<Map<String, Value>, RpcError> {
    let pairs = web::Query::<Vec<(String, String)>>::from_query(req.query_string())
        .map_err(|e| RpcError::InvalidRequest(format!("the query string: {e}")))?
        .into_inner();
    let mut params = Map::new();
    for (name, text) in pairs {
        if name.eq_ignore_ascii_case(rpc::VERSION_HEADER) {
            continue;
        }
        let value = match (protojson::json_name(&name).as_str(), text.as_str()) {
            ("includeArtifacts", "true") => Value::Bool(true),
            ("includeArtifacts", "false") => Value::Bool(false),
            _ => Value::String(text),
        };
        params.insert(name, value);
    }
    Ok(params)
}

/// The HTTP+JSON binding here is v1.0; no `A2A-Version` means that too.
fn check_version(req: &HttpRequest, dialect: Dialect) -> Result<(), RpcError> {
    let requested = rpc::requested_version(req);
    match (WireVersion::parse(requested.as_deref())?, dialect) {
        (WireVersion::V1, Dialect::V1) | (WireVersion::V03, Dialect::V03) => Ok(()),
        (WireVersion::V03, Dialect::V1) if requested.is_none() => Ok(()),
        _ => Err(RpcError::VersionNotSupported(requested.unwrap_or_default())),
    }
}

fn has_body(req: &HttpRequest) -> bool {
    let headers = req.headers();
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() != "0")
}

async fn serve(
    req: &HttpRequest,
    payload: web::Payload,
    state: &AppState,
    method: Method,
    path_params: Map<String, Value>,
    body: Body,
) -> HttpResponse {
    let started = Instant::now();
    let dialect = Dialect::of(req);
    if let Err(error) = check_version(req, dialect) {
        rpc::record("invalid", error.code(), started);
        return error_response(&error, None);
    }
    if body == Body::Params && has_body(req) && !super::media_type::is_json(req) {
        let error = super::media_type::not_json();
        return error_response(&error, None);
    }
    let caller = req
        .app_data::<rpc::Caller>()
        .copied()
        .unwrap_or(rpc::Caller::Client);
    let identity = match rpc::identity_of(req, state, caller).await {
        Ok(identity) => identity,
        Err(error) => return error_response(&error, None),
    };
    let mut params = match body {
        Body::Unread => path_params,
        Body::Params => match read_params(req, payload, state, path_params).await {
            Ok(params) => params,
            Err((status, error)) => {
                rpc::record("invalid", error.code(), started);
                return error_response(&error, status);
            }
        },
    };
    // v0.3's bodies are ProtoJSON too: proto field names (`config_id`,
    // `push_notification_config`) are read as their JSON names before v0.3's shapes are
    // translated (v1.0's are renamed at dispatch).
    if dialect == Dialect::V03
        && let Err(error) = protojson::object_to_json_names(&mut params)
    {
        let error = RpcError::from(error);
        rpc::record("invalid", error.code(), started);
        return error_response(&error, None);
    }
    let principal = match tenant_from_path(req, &mut params)
        .and_then(|()| rpc::principal_in_tenant(state, caller, identity, params.get("tenant")))
    {
        Ok(principal) => principal,
        Err(error) => {
            rpc::record(method.label(), error.code(), started);
            return error_response(&error, None);
        }
    };
    // A task another node runs is served by that node (its lease names it).
    if caller == rpc::Caller::Client
        && let Some(response) = to_holder(req, state, &principal, method, &params, body).await
    {
        rpc::record(method.label(), 0, started);
        return response;
    }
    // v0.3's push configs go to the v0.3 handlers, so the config remembers to notify in v0.3.
    let version = match dialect {
        Dialect::V03 if method.is_push_config() => {
            rest03::push_params_to_v03(method, &mut params);
            WireVersion::V03
        }
        Dialect::V03 => {
            rest03::params_to_v1(&mut params);
            WireVersion::V1
        }
        Dialect::V1 => WireVersion::V1,
    };
    let params = Params::Tree(Value::Object(params));
    match rpc::call_over_http(req, state, version, method, &principal, params, started).await {
        Ok(Reply::Json(result)) if dialect == Dialect::V1 => super::json_ok(&result),
        Ok(Reply::Text(result)) if dialect == Dialect::V1 => super::json_body(result.into_bytes()),
        Ok(Reply::Stream(stream)) => {
            let framing = match dialect {
                Dialect::V1 => sse::Framing::Rest,
                Dialect::V03 => sse::Framing::Rest03,
            };
            sse::respond(stream, framing)
        }
        Ok(reply) => match reply.into_json() {
            Ok(mut result) => {
                if method == Method::GetExtendedAgentCard {
                    rest03::card_to_v03(&mut result);
                } else if method.is_push_config() {
                    rest03::push_result_to_v03(&mut result);
                } else {
                    rest03::result_to_v03(&mut result);
                }
                super::json_ok(&result)
            }
            Err(error) => error_response(&error, None),
        },
        Err(error) => error_response(&error, None),
    }
}

/// The holder's answer, when `params` name a task another node runs (see `forward.rs`).
async fn to_holder(
    req: &HttpRequest,
    state: &AppState,
    principal: &str,
    method: Method,
    params: &Map<String, Value>,
    body: Body,
) -> Option<HttpResponse> {
    let task_id = params.get("id")?.as_str()?;
    let forwarded_body = || match body {
        // A map of JSON values always serializes.
        Body::Params => serde_json::to_vec(params).unwrap_or_default(),
        Body::Unread => Vec::new(),
    };
    super::forward::rest_to_holder(state, req, principal, method, task_id, forwarded_body).await
}

/// The `/{tenant}/…` path's tenant, as the params' `tenant` (a body naming another is refused).
fn tenant_from_path(req: &HttpRequest, params: &mut Map<String, Value>) -> Result<(), RpcError> {
    let Some(tenant) = req.match_info().get("tenant") else {
        return Ok(());
    };
    match params.get("tenant") {
        Some(Value::String(given)) if given != tenant => Err(RpcError::InvalidParams(format!(
            "the body's tenant {given:?} is not the path's {tenant:?}"
        ))),
        _ => {
            params.insert("tenant".into(), Value::from(tenant));
            Ok(())
        }
    }
}

/// The body's JSON object, with the path's params laid over it (the path names the resource).
async fn read_params(
    req: &HttpRequest,
    payload: web::Payload,
    state: &AppState,
    path_params: Map<String, Value>,
) -> Result<Map<String, Value>, (Option<StatusCode>, RpcError)> {
    let body = rpc::read_limited_body(req, payload, state)
        .await
        .map_err(|e: BodyError| (Some(e.status()), RpcError::InvalidRequest(e.to_string())))?;
    let mut params = if body.iter().all(u8::is_ascii_whitespace) {
        Map::new()
    } else {
        match serde_json::from_slice::<Value>(&body) {
            Ok(Value::Object(map)) => map,
            Ok(_) => {
                let error = RpcError::InvalidRequest("the body must be a JSON object".into());
                return Err((None, error));
            }
            Err(e) => {
                let error = RpcError::Parse(format!("the body is not valid JSON: {e}"));
                return Err((None, error));
            }
        }
    };
    params.extend(path_params);
    Ok(params)
}

/// The binding's error: `{"error": {code, status, message, details: [ErrorInfo]}}` with the
/// HTTP status of the error's spelling (or `status`, for body limits).
pub fn error_response(error: &RpcError, status: Option<StatusCode>) -> HttpResponse {
    let status = status.unwrap_or_else(|| {
        StatusCode::from_u16(error.spelling().http_status)
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    });
    let mut body = error.to_rest_json();
    body["error"]["code"] = Value::from(status.as_u16());
    let mut response = HttpResponse::build(status).json(body);
    let headers = response.headers_mut();
    if let Some(challenge) = error.www_authenticate() {
        headers.insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(challenge),
        );
    }
    match error {
        RpcError::Overloaded { retry_after_ms }
        | RpcError::StoreUnavailable { retry_after_ms, .. } => {
            headers.insert(
                header::RETRY_AFTER,
                HeaderValue::from(retry_after_ms.div_ceil(1000).max(1)),
            );
        }
        _ => {}
    }
    response
}

#[cfg(test)]
mod tests {
    use super::task_target;

    #[test]
    fn task_paths_split_into_id_and_custom_method() {
        assert_eq!(task_target("abc"), ("abc", None));
        assert_eq!(task_target("abc:cancel"), ("abc", Some("cancel")));
        assert_eq!(task_target("abc:subscribe"), ("abc", Some("subscribe")));
        assert_eq!(task_target("a:b"), ("a:b", None));
        assert_eq!(task_target(":cancel"), (":cancel", None));
    }
}
