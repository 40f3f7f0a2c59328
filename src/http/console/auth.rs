//! Who may use the console, and what keeps its two actions from being forged.
//!
//! The console's token is `console.token`, else `metrics.token`; with neither the console is
//! open (admin_listen is an operator's address). A script sends the token as
//! `Authorization: Bearer`; a browser signs in once through a form that sets an HttpOnly,
//! SameSite=Strict cookie. The cookie does not hold the token: it holds a session value derived
//! from it and from a secret drawn when the server starts (so a restart signs everyone out),
//! and every comparison is in constant time.
//!
//! The POSTs (cancel, delete, sign out) carry a form token derived from the same secret and
//! the session, which a page of another origin cannot read, and a request whose `Origin` is not
//! this server's is refused as well; SameSite=Strict keeps the cookie off other sites' requests.

use super::super::auth::{authorization, bearer_matches, digest};
use super::{ConsoleError, PATH, see_other};
use crate::config::Config;
use actix_web::dev::Payload;
use actix_web::http::header;
use actix_web::{FromRequest, HttpRequest, HttpResponse, web};
use askama::Template;
use sha2::{Digest, Sha256};
use std::future::{Ready, ready};
use subtle::ConstantTimeEq;

/// The cookie a signed-in browser sends.
const COOKIE: &str = "colloquy_console";

/// What the console checks requests against; built once, when the admin server starts.
pub struct Console {
    /// The digest of the token the console requires, if any.
    token: Option<[u8; 32]>,
    /// The cookie value that stands for the token (hex).
    session: String,
    /// The form token of this session (hex).
    csrf: String,
}

impl Console {
    pub fn new(config: &Config) -> Console {
        let token = config
            .console
            .token
            .as_deref()
            .or(config.metrics.token.as_deref())
            .map(digest);
        let secret: [u8; 32] = rand::random();
        let session = derive(&secret, b"session", token.as_ref().map_or(&[][..], |t| t));
        let csrf = derive(&secret, b"csrf", session.as_bytes());
        Console {
            token,
            session,
            csrf,
        }
    }

    /// Whether the console asks for a token at all.
    pub fn requires_token(&self) -> bool {
        self.token.is_some()
    }

    fn admit(&self, req: &HttpRequest) -> Result<(), ConsoleError> {
        let Some(expected) = &self.token else {
            return if names_this_machine(req) {
                Ok(())
            } else {
                Err(ConsoleError::Forbidden(
                    "a console without a token answers requests addressed to an IP address or                      localhost only"
                        .into(),
                ))
            };
        };
        let bearer = authorization(req.headers()).is_ok_and(|a| bearer_matches(a, expected));
        let session = cookie(req)
            .is_some_and(|value| bool::from(value.as_bytes().ct_eq(self.session.as_bytes())));
        if bearer || session {
            Ok(())
        } else {
            Err(ConsoleError::Unauthorized)
        }
    }

    /// Refuses a POST that is not this session's own form: a foreign `Origin`, or a form token
    /// that is not this session's.
    pub fn check_form(&self, req: &HttpRequest, csrf: &str) -> Result<(), ConsoleError> {
        if !same_origin(req) {
            return Err(ConsoleError::Forbidden(
                "the request comes from another site".into(),
            ));
        }
        if !bool::from(csrf.as_bytes().ct_eq(self.csrf.as_bytes())) {
            return Err(ConsoleError::Forbidden(
                "the form is not this session's (reload the page and try again)".into(),
            ));
        }
        Ok(())
    }
}

/// `hex(SHA-256(secret, purpose, input))`, each length-prefixed.
fn derive(secret: &[u8; 32], purpose: &[u8], input: &[u8]) -> String {
    let mut hash = Sha256::new();
    for part in [&secret[..], purpose, input] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part);
    }
    hex::encode(hash.finalize())
}

fn cookie(req: &HttpRequest) -> Option<String> {
    req.headers()
        .get_all(header::COOKIE)
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_owned())
}

/// Whether the request's `Host` is an address or `localhost`, never a domain name: a console
/// without a token is open to whoever reaches it, and a page elsewhere whose domain name was
/// rebound to this address (DNS rebinding) must not be whoever.
fn names_this_machine(req: &HttpRequest) -> bool {
    let Some(host) = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
    else {
        return false;
    };
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    let name = name.trim_start_matches('[').trim_end_matches(']');
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok()
}

/// Whether `Origin`, when sent, names the host the request was sent to.
fn same_origin(req: &HttpRequest) -> bool {
    let Some(origin) = req.headers().get(header::ORIGIN) else {
        return true;
    };
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok());
    let origin_host = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .map(|(_, host)| host);
    matches!((origin_host, host), (Some(a), Some(b)) if a.eq_ignore_ascii_case(b))
}

/// A request the console admits, with the form token its pages put in their forms.
pub struct Operator {
    pub csrf: String,
    /// Whether a sign-out button makes sense (a token is required).
    pub signed_in: bool,
}

impl FromRequest for Operator {
    type Error = ConsoleError;
    type Future = Ready<Result<Operator, ConsoleError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let Some(console) = req.app_data::<web::Data<Console>>() else {
            return ready(Err(ConsoleError::Internal(
                "the console is not set up".into(),
            )));
        };
        ready(console.admit(req).map(|()| Operator {
            csrf: console.csrf.clone(),
            signed_in: console.requires_token(),
        }))
    }
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/login", web::get().to(login_form))
        .route("/login", web::post().to(login))
        .route("/logout", web::post().to(logout));
}

#[derive(Template)]
#[template(path = "console/login.html")]
struct LoginPage {
    failed: bool,
}

async fn login_form() -> HttpResponse {
    super::ok(&LoginPage { failed: false })
}

#[derive(serde::Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(
    req: HttpRequest,
    console: web::Data<Console>,
    form: web::Form<LoginForm>,
) -> Result<HttpResponse, ConsoleError> {
    if !same_origin(&req) {
        return Err(ConsoleError::Forbidden(
            "the request comes from another site".into(),
        ));
    }
    let Some(expected) = &console.token else {
        return Ok(see_other(PATH));
    };
    if !bool::from(digest(&form.token).ct_eq(expected)) {
        return Ok(super::page(
            actix_web::http::StatusCode::UNAUTHORIZED,
            &LoginPage { failed: true },
        ));
    }
    let mut response = see_other(&format!("{PATH}/conversations"));
    set_cookie(&mut response, &console.session, None);
    Ok(response)
}

#[derive(serde::Deserialize)]
struct LogoutForm {
    csrf: String,
}

async fn logout(
    req: HttpRequest,
    console: web::Data<Console>,
    _: Operator,
    form: web::Form<LogoutForm>,
) -> Result<HttpResponse, ConsoleError> {
    console.check_form(&req, &form.csrf)?;
    let mut response = see_other(&format!("{PATH}/login"));
    set_cookie(&mut response, "", Some(0));
    Ok(response)
}

/// The session cookie: sent only to the console's paths, never to script, never with a
/// request another site starts.
fn set_cookie(response: &mut HttpResponse, value: &str, max_age: Option<u32>) {
    let max_age = max_age.map_or(String::new(), |secs| format!("; Max-Age={secs}"));
    let cookie = format!("{COOKIE}={value}; Path={PATH}; HttpOnly; SameSite=Strict{max_age}");
    if let Ok(value) = header::HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
}
