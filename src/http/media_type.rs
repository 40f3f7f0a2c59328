//! The media types of the JSON bindings. A2A v1.0.1 prefers `application/a2a+json`: it is taken
//! wherever `application/json` is (as is any `application/…+json`), and a request that used it,
//! as its Content-Type or named in its Accept, is answered in kind. Clients that speak only
//! `application/json` keep getting it.

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, HeaderValue};
use actix_web::middleware::Next;
use actix_web::{Error, HttpRequest};

use crate::protocol::RpcError;

/// A2A's own media type (v1.0.1).
pub const A2A_JSON: &str = "application/a2a+json";

/// Whether the request's body is JSON: `application/json` or any `application/…+json`.
pub(super) fn is_json(req: &HttpRequest) -> bool {
    content_type(req).is_some_and(|mime| {
        mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))
    })
}

/// What a request whose body is not JSON is told (415).
pub(super) fn not_json() -> RpcError {
    RpcError::ContentTypeNotSupported(format!(
        "the request's Content-Type must be application/json or {A2A_JSON}"
    ))
}

/// The request's Content-Type without its parameters, lowercased.
fn content_type(req: &HttpRequest) -> Option<String> {
    let value = req.headers().get(header::CONTENT_TYPE)?.to_str().ok()?;
    Some(value.split(';').next()?.trim().to_ascii_lowercase())
}

/// Whether the request used `application/a2a+json`: as its Content-Type, or named in its Accept.
fn wants_a2a_json(req: &HttpRequest) -> bool {
    content_type(req).as_deref() == Some(A2A_JSON)
        || req
            .headers()
            .get_all(header::ACCEPT)
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .any(|range| {
                range
                    .split(';')
                    .next()
                    .is_some_and(|mime| mime.trim() == A2A_JSON)
            })
}

/// Middleware: a JSON response to a request that used `application/a2a+json` says so.
pub async fn answer_in_kind(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, Error> {
    let in_kind = wants_a2a_json(req.request());
    let mut response = next.call(req).await?;
    let json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.split(';').next() == Some("application/json"));
    if in_kind && json {
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(A2A_JSON));
    }
    Ok(response)
}
