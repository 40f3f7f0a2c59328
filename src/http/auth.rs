//! Bearer tokens mapped to principals. Tokens are kept only as SHA-256 digests and compared in
//! constant time; with none configured every request is the anonymous principal.

use crate::config::AuthConfig;
use crate::engine::ANONYMOUS;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("missing Authorization: Bearer header")]
    Missing,
    #[error("the bearer token is not valid")]
    Invalid,
}

#[derive(Clone, Default)]
pub struct Auth {
    tokens: Vec<(String, [u8; 32])>,
}

pub fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Auth {
    /// From `[auth.tokens]`, the tokens file (`principal:sha256hex` lines) and `COLLOQUY_TOKENS`
    /// (`principal:token,principal:token`).
    pub fn load(config: &AuthConfig, env_tokens: Option<&str>) -> Result<Auth, String> {
        let mut tokens: Vec<(String, [u8; 32])> = config
            .tokens
            .iter()
            .map(|(principal, token)| (principal.clone(), digest(token)))
            .collect();
        if let Some(path) = &config.tokens_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("auth.tokens_file {}: {e}", path.display()))?;
            for (n, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let parsed = line.split_once(':').and_then(|(principal, hash)| {
                    let bytes: [u8; 32] = hex::decode(hash.trim()).ok()?.try_into().ok()?;
                    Some((principal.trim().to_owned(), bytes))
                });
                let entry = parsed.ok_or_else(|| {
                    format!(
                        "auth.tokens_file {} line {}: expected principal:sha256-hex-of-token",
                        path.display(),
                        n + 1
                    )
                })?;
                tokens.push(entry);
            }
        }
        for pair in env_tokens.unwrap_or_default().split(',').map(str::trim) {
            if pair.is_empty() {
                continue;
            }
            let (principal, token) = pair
                .split_once(':')
                .filter(|(p, t)| !p.is_empty() && !t.is_empty())
                .ok_or("COLLOQUY_TOKENS: expected comma-separated principal:token pairs")?;
            tokens.push((principal.to_owned(), digest(token)));
        }
        Ok(Auth { tokens })
    }

    pub fn enabled(&self) -> bool {
        !self.tokens.is_empty()
    }

    /// The principal a request acts as, from its `Authorization` header.
    pub fn principal(&self, authorization: Option<&str>) -> Result<String, AuthError> {
        if !self.enabled() {
            return Ok(ANONYMOUS.to_owned());
        }
        let token = authorization
            .and_then(|h| {
                let (scheme, token) = h.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .ok_or(AuthError::Missing)?;
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
