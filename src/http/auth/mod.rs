//! Who a request acts as, and in which tenant. A caller is named by a static bearer token
//! (`tokens.rs`) or by a JWT its identity provider issued (`jwt.rs`); with neither configured
//! every request is the anonymous principal. A v1.0 request may name a `tenant`: the
//! conversations, tasks and push configs it reaches are those of its principal in that tenant,
//! and a principal may use only the tenants it is allowed (`auth.tenants`, or the JWT claim
//! `auth.jwt.tenants_claim`).

mod jwt;
mod tokens;

pub use jwt::{JwksError, JwtVerifier};
pub use tokens::TokenConfigError;
use tokens::Tokens;

use crate::config::AuthConfig;
use crate::model::ANONYMOUS;
use actix_web::http::header::{self, HeaderMap};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::Arc;
use subtle::ConstantTimeEq;

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("missing Authorization: Bearer header")]
    Missing,
    #[error("the bearer token is not valid")]
    Invalid,
    /// A JWT refused, and why (the reason names no key material).
    #[error("the bearer token is not valid: {0}")]
    Refused(String),
    /// Proxies and servers disagree on which of several headers counts: refused, not guessed.
    #[error("the request has {0} Authorization headers; send one")]
    Repeated(usize),
    #[error("tenant {0:?} is not a tenant name ({rule})", rule = crate::model::TENANT_NAME_RULE)]
    BadTenant(String),
    #[error("tenant {0:?} is not one this caller may use")]
    TenantNotAllowed(String),
}

/// Why authentication cannot start.
#[derive(Debug, thiserror::Error)]
pub enum AuthConfigError {
    #[error(transparent)]
    Tokens(#[from] TokenConfigError),
    #[error("auth.jwt: {0}")]
    Jwks(#[from] JwksError),
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

pub fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// An authenticated caller, before a tenant is chosen.
#[derive(Debug, Clone, PartialEq)]
pub struct Identity {
    pub principal: String,
    /// Tenants its token allows besides those `auth.tenants` gives it.
    tenants: Vec<String>,
}

impl Identity {
    /// A caller whose principal was established elsewhere (another node, or no auth at all).
    pub fn of(principal: String) -> Identity {
        Identity {
            principal,
            tenants: Vec::new(),
        }
    }
}

#[derive(Clone, Default)]
pub struct Auth {
    /// Fixed at start: a tokens file emptied by a reload refuses every token, it never lets
    /// callers in unauthenticated.
    required: bool,
    tokens: Tokens,
    jwt: Option<Arc<JwtVerifier>>,
    tenants: Arc<BTreeMap<String, Vec<String>>>,
}

impl Auth {
    /// From `[auth]` and `COLLOQUY_TOKENS` (`principal:token,principal:token`).
    pub fn load(config: &AuthConfig, env_tokens: Option<&str>) -> Result<Auth, AuthConfigError> {
        let jwt = match config.jwt.enabled() {
            true => Some(Arc::new(JwtVerifier::new(&config.jwt)?)),
            false => None,
        };
        let tokens = Tokens::load(config, env_tokens)?;
        Ok(Auth {
            required: jwt.is_some() || tokens.any() || config.tokens_file.is_some(),
            tokens,
            jwt,
            tenants: Arc::new(config.tenants.clone()),
        })
    }

    /// Whether callers must authenticate: with any credentials configured at start.
    pub fn enabled(&self) -> bool {
        self.required
    }

    pub fn jwt(&self) -> Option<&Arc<JwtVerifier>> {
        self.jwt.as_ref()
    }

    /// Whether static tokens are configured (the card names the plain bearer scheme).
    pub fn has_static_tokens(&self) -> bool {
        self.tokens.any()
    }

    /// The caller a request's `Authorization` header names. A token that looks like a JWT is
    /// checked as one when JWTs are configured; any other goes to the static tokens.
    pub async fn identify(&self, authorization: Option<&str>) -> Result<Identity, AuthError> {
        if !self.enabled() {
            return Ok(Identity::of(ANONYMOUS.to_owned()));
        }
        let token = bearer(authorization).ok_or(AuthError::Missing)?;
        if let Some(principal) = self.tokens.principal(token) {
            return Ok(Identity::of(principal));
        }
        match &self.jwt {
            Some(jwt) if token.split('.').count() == 3 => {
                let caller = jwt
                    .verify(token)
                    .await
                    .map_err(|refused| AuthError::Refused(refused.to_string()))?;
                Ok(Identity {
                    principal: caller.principal,
                    tenants: caller.tenants,
                })
            }
            _ => Err(AuthError::Invalid),
        }
    }

    /// The principal the engine and store see for `identity` in `tenant` (none: the default
    /// tenant, the principal itself).
    pub fn scoped(&self, identity: Identity, tenant: Option<&str>) -> Result<String, AuthError> {
        let Some(tenant) = tenant.filter(|tenant| !tenant.is_empty()) else {
            return Ok(identity.principal);
        };
        if !crate::model::is_tenant_name(tenant) {
            return Err(AuthError::BadTenant(tenant.chars().take(80).collect()));
        }
        let configured = self.tenants.get(&identity.principal);
        let allowed = configured.is_some_and(|list| list.iter().any(|t| t == tenant))
            || identity.tenants.iter().any(|t| t == tenant);
        if !allowed {
            return Err(AuthError::TenantNotAllowed(tenant.to_owned()));
        }
        Ok(crate::model::principal_in_tenant(
            &identity.principal,
            Some(tenant),
        ))
    }

    /// Reads the tokens file and the JWT key set file again (if `always`, or if the tokens
    /// file changed); what fails to load is not taken, and is logged.
    pub fn reload(&self, always: bool) {
        match self.tokens.reload(always) {
            Ok(true) => tracing::info!("reloaded auth.tokens_file"),
            Ok(false) => {}
            Err(error) => {
                tracing::error!(error = %crate::error::chain(&error), "auth.tokens_file not reloaded; the tokens in use stay")
            }
        }
        if always
            && let Some(jwt) = &self.jwt
            && let Err(error) = jwt.reload_file()
        {
            tracing::error!(error = %crate::error::chain(&error), "auth.jwt.jwks_file not reloaded; the keys in use stay");
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_tokens_file_emptied_by_a_reload_refuses_everyone_and_lets_no_one_in() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, format!("carol:{}\n", hex::encode(digest("c-token")))).unwrap();
        let config = AuthConfig {
            tokens_file: Some(path.clone()),
            ..AuthConfig::default()
        };
        let auth = Auth::load(&config, None).unwrap();
        let carol = auth.identify(Some("Bearer c-token")).await.unwrap();
        assert_eq!(carol.principal, "carol");
        std::fs::write(&path, "").unwrap();
        auth.reload(true);
        assert!(auth.enabled());
        assert!(matches!(auth.identify(None).await, Err(AuthError::Missing)));
        assert!(matches!(
            auth.identify(Some("Bearer c-token")).await,
            Err(AuthError::Invalid)
        ));
    }

    #[test]
    fn a_tenant_makes_another_principal_only_where_allowed() {
        let mut config = AuthConfig::default();
        config.tokens.insert("alice".into(), "a-token".into());
        config.tenants.insert("alice".into(), vec!["red".into()]);
        let auth = Auth::load(&config, None).unwrap();
        let alice = Identity::of("alice".into());
        assert_eq!(auth.scoped(alice.clone(), None).unwrap(), "alice");
        assert_eq!(auth.scoped(alice.clone(), Some("")).unwrap(), "alice");
        assert_eq!(
            auth.scoped(alice.clone(), Some("red")).unwrap(),
            "alice\u{1f}red"
        );
        assert!(matches!(
            auth.scoped(alice.clone(), Some("blue")),
            Err(AuthError::TenantNotAllowed(_))
        ));
        assert!(matches!(
            auth.scoped(alice.clone(), Some("tasks")),
            Err(AuthError::BadTenant(_))
        ));
        assert!(matches!(
            auth.scoped(alice.clone(), Some("a/b")),
            Err(AuthError::BadTenant(_))
        ));
    }
}
