//! Bearer tokens mapped to principals. Tokens are kept only as SHA-256 digests and compared in
//! constant time; with none configured every request is the anonymous principal.

use crate::config::AuthConfig;
use crate::model::ANONYMOUS;
use actix_web::http::header::{self, HeaderMap};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::collections::hash_map::Entry as MapEntry;
use subtle::ConstantTimeEq;

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("missing Authorization: Bearer header")]
    Missing,
    #[error("the bearer token is not valid")]
    Invalid,
    /// Proxies and servers disagree on which of several headers counts: refused, not guessed.
    #[error("the request has {0} Authorization headers; send one")]
    Repeated(usize),
}

/// The request's `Authorization` header, if it has one; several are refused.
pub fn authorization(headers: &HeaderMap) -> Result<Option<&str>, AuthError> {
    let mut values = headers.get_all(header::AUTHORIZATION);
    let first = values.next();
    let more = values.count();
    if more > 0 {
        return Err(AuthError::Repeated(more + 1));
    }
    Ok(first.and_then(|value| value.to_str().ok()))
}

/// Tokens that cannot be served. Messages name principals and where each came from, never a token
/// or its digest.
#[derive(Debug, thiserror::Error)]
pub enum TokenConfigError {
    #[error("{origin}: principal {principal:?} has an empty token")]
    EmptyToken { principal: String, origin: String },
    #[error("{origin}: a token is given to an empty principal name")]
    EmptyPrincipal { origin: String },
    #[error(
        "the same token is given to principal {first:?} ({first_origin}) and to principal \
         {second:?} ({second_origin}); one would lock the other out: give each principal its own token"
    )]
    Shared {
        first: String,
        first_origin: String,
        second: String,
        second_origin: String,
    },
    #[error("auth.tokens_file {path}: {error}")]
    File {
        path: String,
        #[source]
        error: std::io::Error,
    },
    #[error("{origin}: expected principal:sha256-hex-of-token")]
    FileLine { origin: String },
    #[error("COLLOQUY_TOKENS entry {position}: expected principal:token")]
    EnvEntry { position: usize },
}

#[derive(Clone, Default)]
pub struct Auth {
    tokens: Vec<(String, [u8; 32])>,
}

pub fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// One configured token, with where it came from (for error messages).
struct Grant {
    principal: String,
    digest: [u8; 32],
    origin: String,
}

impl Grant {
    /// A plain token. Trimmed: presented tokens are, so surrounding blanks could never match.
    fn plain(principal: &str, token: &str, origin: &str) -> Result<Grant, TokenConfigError> {
        Grant::hashed(principal, digest(token.trim()), origin)
    }

    fn hashed(principal: &str, digest: [u8; 32], origin: &str) -> Result<Grant, TokenConfigError> {
        let principal = principal.trim();
        if principal.is_empty() {
            return Err(TokenConfigError::EmptyPrincipal {
                origin: origin.to_owned(),
            });
        }
        if digest == self::digest("") {
            return Err(TokenConfigError::EmptyToken {
                principal: principal.to_owned(),
                origin: origin.to_owned(),
            });
        }
        Ok(Grant {
            principal: principal.to_owned(),
            digest,
            origin: origin.to_owned(),
        })
    }
}

impl Auth {
    /// From `[auth.tokens]`, the tokens file (`principal:sha256hex` lines) and `COLLOQUY_TOKENS`
    /// (`principal:token,principal:token`). Refuses empty tokens, empty principals and a token
    /// given to two principals (whichever came last would otherwise silently win).
    pub fn load(config: &AuthConfig, env_tokens: Option<&str>) -> Result<Auth, TokenConfigError> {
        let mut grants = Vec::new();
        for (principal, token) in &config.tokens {
            grants.push(Grant::plain(principal, token, "[auth.tokens]")?);
        }
        if let Some(path) = &config.tokens_file {
            grants.extend(file_grants(path)?);
        }
        grants.extend(env_grants(env_tokens.unwrap_or_default())?);
        refuse_shared_tokens(&grants)?;
        Ok(Auth {
            tokens: grants
                .into_iter()
                .map(|g| (g.principal, g.digest))
                .collect(),
        })
    }

    pub fn enabled(&self) -> bool {
        !self.tokens.is_empty()
    }

    /// The principal a request acts as, from its `Authorization` header.
    pub fn principal(&self, authorization: Option<&str>) -> Result<String, AuthError> {
        if !self.enabled() {
            return Ok(ANONYMOUS.to_owned());
        }
        let token = bearer(authorization).ok_or(AuthError::Missing)?;
        let presented = digest(token);
        // Compare against every token, so timing does not tell which (or whether one) matched.
        let mut found: Option<&str> = None;
        for (principal, expected) in &self.tokens {
            if bool::from(presented.ct_eq(expected)) {
                found = Some(principal);
            }
        }
        found.map(str::to_owned).ok_or(AuthError::Invalid)
    }
}

/// The token of an `Authorization: Bearer <token>` header.
fn bearer(authorization: Option<&str>) -> Option<&str> {
    let (scheme, token) = authorization?.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Whether the header carries the one token whose digest is `expected` (compared in constant time).
pub fn bearer_matches(authorization: Option<&str>, expected: &[u8; 32]) -> bool {
    bearer(authorization).is_some_and(|token| bool::from(digest(token).ct_eq(expected)))
}

/// `principal:sha256-hex-of-token` lines; blank lines and `#` comments skipped.
fn file_grants(path: &std::path::Path) -> Result<Vec<Grant>, TokenConfigError> {
    let text = std::fs::read_to_string(path).map_err(|error| TokenConfigError::File {
        path: path.display().to_string(),
        error,
    })?;
    let mut grants = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let origin = format!("auth.tokens_file {} line {}", path.display(), n + 1);
        let (principal, hash) = line
            .split_once(':')
            .ok_or_else(|| TokenConfigError::FileLine {
                origin: origin.clone(),
            })?;
        let digest: [u8; 32] = hex::decode(hash.trim())
            .ok()
            .and_then(|bytes| bytes.try_into().ok())
            .ok_or_else(|| TokenConfigError::FileLine {
                origin: origin.clone(),
            })?;
        grants.push(Grant::hashed(principal, digest, &origin)?);
    }
    Ok(grants)
}

/// `principal:token,principal:token`; empty entries (a trailing comma) skipped.
fn env_grants(pairs: &str) -> Result<Vec<Grant>, TokenConfigError> {
    let mut grants = Vec::new();
    for (n, pair) in pairs.split(',').map(str::trim).enumerate() {
        if pair.is_empty() {
            continue;
        }
        let (principal, token) = pair
            .split_once(':')
            .ok_or(TokenConfigError::EnvEntry { position: n + 1 })?;
        grants.push(Grant::plain(principal, token, "COLLOQUY_TOKENS")?);
    }
    Ok(grants)
}

/// The same token for two principals: authentication would pick one, locking the other out.
/// (The same principal listed twice with one token is harmless.)
fn refuse_shared_tokens(grants: &[Grant]) -> Result<(), TokenConfigError> {
    let mut owners: HashMap<[u8; 32], &Grant> = HashMap::new();
    for grant in grants {
        match owners.entry(grant.digest) {
            MapEntry::Vacant(slot) => {
                slot.insert(grant);
            }
            MapEntry::Occupied(owner) if owner.get().principal != grant.principal => {
                return Err(TokenConfigError::Shared {
                    first: owner.get().principal.clone(),
                    first_origin: owner.get().origin.clone(),
                    second: grant.principal.clone(),
                    second_origin: grant.origin.clone(),
                });
            }
            MapEntry::Occupied(_) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_map_to_principals() {
        let mut config = AuthConfig::default();
        config.tokens.insert("alice".into(), "a-token".into());
        let auth = Auth::load(&config, Some("bob:b-token")).unwrap();
        assert_eq!(auth.principal(Some("Bearer a-token")).unwrap(), "alice");
        assert_eq!(auth.principal(Some("bearer b-token")).unwrap(), "bob");
        assert!(matches!(
            auth.principal(Some("Bearer nope")),
            Err(AuthError::Invalid)
        ));
        assert!(matches!(auth.principal(None), Err(AuthError::Missing)));
    }
}
