//! The scheme and host clients reach this server by, for URLs the server hands out (the agent
//! card's interfaces, the push keys' address) when `public_url` is not set.
//!
//! `Forwarded` and `X-Forwarded-*` are believed only from a peer listed in `trusted_proxies`:
//! from anyone else they would let a stranger rewrite the card others fetch (a shared cache keeps
//! it). Only the last value counts, the one the nearest proxy added, and `X-Forwarded-*` before
//! `Forwarded`. What it says is checked too: a scheme other than `http`/`https`, or a host that
//! is not a plain authority, is ignored.

use super::state::AppState;
use actix_web::HttpRequest;
use actix_web::http::header;
use actix_web::http::uri::Authority;
use ipnet::IpNet;

/// The peers whose forwarding headers are believed.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    pub fn new(ranges: Vec<IpNet>) -> Self {
        TrustedProxies(ranges)
    }

    fn trusts(&self, req: &HttpRequest) -> bool {
        req.peer_addr()
            .is_some_and(|peer| self.0.iter().any(|range| range.contains(&peer.ip())))
    }
}

/// What `method`'s answer needs of [`base_url`]: only the extended card names this server's
/// URLs, and working the URL out (checking the `Host` header) costs a turn about 1% of its
/// instructions.
pub fn base_url_for(
    state: &AppState,
    req: &HttpRequest,
    method: crate::protocol::Method,
) -> Option<String> {
    (method == crate::protocol::Method::GetExtendedAgentCard).then(|| base_url(state, req))
}

/// `scheme://host/` as the client sees this server.
pub fn base_url(state: &AppState, req: &HttpRequest) -> String {
    if let Some(url) = &state.config.public_url {
        return url.clone();
    }
    let (scheme, host) = if state.proxies.trusts(req) {
        let scheme = forwarded(req, "X-Forwarded-Proto", "proto")
            .filter(|s| matches!(s.as_str(), "http" | "https"));
        let host = forwarded(req, "X-Forwarded-Host", "host").filter(|h| is_authority(h));
        (
            scheme.unwrap_or_else(|| "http".to_owned()),
            host.unwrap_or_else(|| direct_host(req)),
        )
    } else {
        ("http".to_owned(), direct_host(req))
    };
    format!("{scheme}://{host}/")
}

/// What the nearest proxy says of `X-Forwarded-*` header `legacy`, else of `Forwarded`'s
/// `parameter`: the last value, the one the trusted proxy added (a client can put its own
/// before it).
fn forwarded(req: &HttpRequest, legacy: &str, parameter: &str) -> Option<String> {
    let last_element = |name: &str| {
        let value = req.headers().get_all(name).last()?.to_str().ok()?;
        value.rsplit(',').next().map(str::trim)
    };
    if let Some(value) = last_element(legacy) {
        return Some(value.to_owned());
    }
    last_element(header::FORWARDED.as_str())?
        .split(';')
        .filter_map(|pair| pair.split_once('='))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case(parameter))
        .map(|(_, value)| value.trim().trim_matches('"').to_owned())
}

/// The request's own `Host`, if it is a plain authority, else the address the server answers on.
fn direct_host(req: &HttpRequest) -> String {
    req.headers()
        .get(header::HOST)
        .and_then(|value| value.to_str().ok())
        .filter(|host| is_authority(host))
        .map_or_else(|| req.app_config().local_addr().to_string(), str::to_owned)
}

/// A host and optional port: no user info, path, scheme or stray characters.
fn is_authority(host: &str) -> bool {
    !host.is_empty()
        && !host.contains('@')
        && host.parse::<Authority>().is_ok_and(|a| a.as_str() == host)
}

#[cfg(test)]
mod tests {
    use super::is_authority;

    #[test]
    fn only_plain_authorities_pass() {
        for good in [
            "example.com",
            "example.com:8443",
            "127.0.0.1:8080",
            "[::1]:80",
        ] {
            assert!(is_authority(good), "{good}");
        }
        for bad in [
            "",
            "evil@example.com",
            "example.com/path",
            "a b",
            "x\"y",
            "example.com?q",
        ] {
            assert!(!is_authority(bad), "{bad}");
        }
    }
}
