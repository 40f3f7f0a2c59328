//! The operator console: server-rendered pages at `/console` on `admin_listen` (docs/console.md).
//!
//! Read-only views of the store (conversations, one conversation with the prompt each turn's
//! agent was shown, a task with a live view of its stream, the push outbox, the held leases),
//! and two actions, each behind a confirmation page: cancel a running task, delete a
//! conversation. Pages are askama templates (`templates/console/`), which escape every value;
//! the only script is the live view's `EventSource` (`live.js`). Each module is one page or
//! idea; [`ConsoleError`] maps every failure to its HTTP answer in one place.

mod auth;
mod conversations;
mod error;
mod leases;
mod live;
mod outbox;
mod task;

pub use auth::Console;
pub use error::ConsoleError;

use actix_web::http::header;
use actix_web::{HttpResponse, web};
use askama::Template;

/// Where the console is served.
pub const PATH: &str = "/console";

/// Longest principal, tenant or contextId prefix a URL may carry (a contextId itself is
/// checked against `limits.context_id_bytes`, as the engine does).
const MAX_NAME_BYTES: usize = 1024;

/// Longest task id a URL may carry (ids colloquy mints are 36 bytes; a caller's own may be
/// longer, up to the same bound as a contextId's default).
const MAX_TASK_ID_BYTES: usize = 1024;

/// The console's routes (under [`PATH`]), sharing `console`.
pub fn routes(cfg: &mut web::ServiceConfig, console: web::Data<Console>) {
    cfg.service(
        web::scope(PATH)
            .app_data(console)
            // A query or form that does not parse gets the console's own 400 page.
            .app_data(
                web::QueryConfig::default()
                    .error_handler(|error, _| ConsoleError::BadRequest(error.to_string()).into()),
            )
            .app_data(
                web::FormConfig::default()
                    .error_handler(|error, _| ConsoleError::BadRequest(error.to_string()).into()),
            )
            .route("", web::get().to(home))
            .route("/", web::get().to(home))
            .route("/style.css", web::get().to(style))
            .route("/live.js", web::get().to(script))
            .configure(auth::routes)
            .configure(conversations::routes)
            .configure(task::routes)
            .route("/outbox", web::get().to(outbox::page))
            .route("/leases", web::get().to(leases::page))
            .default_service(web::to(not_found)),
    );
}

async fn home(_: auth::Operator) -> HttpResponse {
    see_other(&format!("{PATH}/conversations"))
}

async fn not_found() -> Result<HttpResponse, ConsoleError> {
    Err(ConsoleError::NotFound("no such console page".into()))
}

/// The stylesheet: high-contrast colours (every pair at least 4.5:1), a visible focus ring,
/// and tables that scroll sideways rather than widen a phone's page.
async fn style() -> HttpResponse {
    static_file("text/css; charset=utf-8", include_str!("style.css"))
}

/// The live view's few lines of script (a file, not inline, so the pages' Content-Security-
/// Policy can refuse every inline script).
async fn script() -> HttpResponse {
    static_file("text/javascript; charset=utf-8", include_str!("live.js"))
}

fn static_file(content_type: &'static str, body: &'static str) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(content_type)
        .insert_header((header::CACHE_CONTROL, "max-age=300"))
        .body(body)
}

/// What every page sends: no inline script or style may run, nothing is framed, forms post
/// only here; pages are not cached (they show live state and carry the CSRF token).
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'self'; script-src 'self'; \
     connect-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// A rendered page, with `status`.
fn page(status: actix_web::http::StatusCode, template: &impl Template) -> HttpResponse {
    match template.render() {
        Ok(body) => HttpResponse::build(status)
            .content_type("text/html; charset=utf-8")
            .insert_header((header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY))
            .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
            .insert_header((header::REFERRER_POLICY, "same-origin"))
            .insert_header((header::CACHE_CONTROL, "no-store"))
            .body(body),
        Err(e) => ConsoleError::Render(e.to_string()).response(),
    }
}

fn ok(template: &impl Template) -> HttpResponse {
    page(actix_web::http::StatusCode::OK, template)
}

/// After a form's POST: the browser goes on with a GET of `location`.
fn see_other(location: &str) -> HttpResponse {
    HttpResponse::SeeOther()
        .insert_header((header::LOCATION, location))
        .finish()
}

/// A name from the URL (principal, tenant, prefix): empty means not given; too long is refused.
fn optional_name(field: &str, value: &Option<String>) -> Result<Option<String>, ConsoleError> {
    match value.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(v) if v.len() > MAX_NAME_BYTES => Err(ConsoleError::BadRequest(format!(
            "{field} is longer than {MAX_NAME_BYTES} bytes"
        ))),
        Some(v) => Ok(Some(v.to_owned())),
    }
}

/// A task id from the URL: 1 to [`MAX_TASK_ID_BYTES`] bytes.
fn task_id(value: &str) -> Result<&str, ConsoleError> {
    if value.is_empty() || value.len() > MAX_TASK_ID_BYTES {
        return Err(ConsoleError::BadRequest(format!(
            "a task id is 1 to {MAX_TASK_ID_BYTES} bytes"
        )));
    }
    Ok(value)
}

/// A principal as an operator reads it: its name, and its tenant after a slash (the store
/// joins them with a control character, shown as nothing at all in a browser).
fn role_label(role: crate::model::Role) -> &'static str {
    match role {
        crate::model::Role::User => "user",
        crate::model::Role::Agent => "agent",
    }
}

fn principal_label(principal: &str) -> String {
    match crate::model::tenant_of(principal) {
        Some(tenant) => {
            let name = &principal[..principal.len() - tenant.len()];
            let name = name.char_indices().last().map_or(name, |(i, _)| &name[..i]);
            format!("{name} (tenant {tenant})")
        }
        None => principal.to_owned(),
    }
}

/// A time as the pages show it: UTC, to the second.
fn time(t: &chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// `?name=value&…` with each value percent-encoded (for links the templates hold whole).
fn query(pairs: &[(&str, &str)]) -> String {
    let encoded: Vec<String> = pairs
        .iter()
        .filter(|(_, value)| !value.is_empty())
        .map(|(name, value)| format!("{name}={}", percent_encode(value)))
        .collect();
    if encoded.is_empty() {
        String::new()
    } else {
        format!("?{}", encoded.join("&"))
    }
}

fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_query_encodes_every_reserved_byte_and_drops_empty_values() {
        assert_eq!(
            super::query(&[("context", "a/b c&d"), ("principal", "")]),
            "?context=a%2Fb%20c%26d"
        );
        assert_eq!(super::query(&[("x", "")]), "");
    }

    #[test]
    fn a_principal_in_a_tenant_reads_as_its_name_and_tenant() {
        let joined = crate::model::principal_in_tenant("alice", Some("red"));
        assert_eq!(super::principal_label(&joined), "alice (tenant red)");
        assert_eq!(super::principal_label("bob"), "bob");
    }
}
