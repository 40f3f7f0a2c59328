//! Static bearer tokens mapped to principals: `[auth.tokens]`, `auth.tokens_file` and
//! `COLLOQUY_TOKENS`. Kept only as SHA-256 digests and compared in constant time. The file is
//! read again on reload (SIGHUP, or a change seen by `reload_check_secs`); a reload that fails
//! keeps the set in use.

use super::digest;
use crate::config::AuthConfig;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::collections::hash_map::Entry as MapEntry;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;
use subtle::ConstantTimeEq;

/// Tokens that cannot be served. Messages name principals and where each came from, never a token
/// or its digest.
#[derive(Debug, thiserror::Error)]
pub enum TokenConfigError {
    #[error("{origin}: principal {principal:?} has an empty token")]
    EmptyToken { principal: String, origin: String },
    #[error("{origin}: a token is given to an empty principal name")]
    EmptyPrincipal { origin: String },
    #[error("{origin}: principal {principal:?} holds a control character")]
    ControlInPrincipal { principal: String, origin: String },
    #[error(
        "{origin}: principal {principal:?} has the form of a JWT caller's (ISSUER#CLAIM of \
         auth.jwt.issuer): give it another name"
    )]
    LikeJwtPrincipal { principal: String, origin: String },
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

/// Each principal with its token's digest.
type Digests = Vec<(String, [u8; 32])>;

/// The static tokens in use, swapped whole by a reload.
#[derive(Clone, Default)]
pub struct Tokens {
    current: Arc<RwLock<Digests>>,
    sources: Arc<Sources>,
}

/// Where the tokens come from: the fixed ones (config, environment) and the file.
#[derive(Default)]
struct Sources {
    fixed: Vec<Grant>,
    file: Option<PathBuf>,
    /// The issuer JWT principals are named after (`ISSUER#…`), which no static name may copy.
    jwt_issuer: Option<String>,
    /// The file's modification time as last read.
    read_at: parking_lot::Mutex<Option<SystemTime>>,
}

impl Tokens {
    /// From `[auth.tokens]`, the tokens file (`principal:sha256hex` lines) and `COLLOQUY_TOKENS`
    /// (`principal:token,principal:token`). Refuses empty tokens, empty principals and a token
    /// given to two principals (whichever came last would otherwise silently win).
    pub fn load(config: &AuthConfig, env_tokens: Option<&str>) -> Result<Tokens, TokenConfigError> {
        let mut fixed = Vec::new();
        for (principal, token) in &config.tokens {
            fixed.push(Grant::plain(principal, token, "[auth.tokens]")?);
        }
        fixed.extend(env_grants(env_tokens.unwrap_or_default())?);
        let sources = Sources {
            fixed,
            file: config.tokens_file.clone(),
            jwt_issuer: config
                .jwt
                .enabled()
                .then(|| config.jwt.issuer.trim().to_owned()),
            read_at: parking_lot::Mutex::new(None),
        };
        let grants = sources.read()?;
        Ok(Tokens {
            current: Arc::new(RwLock::new(grants)),
            sources: Arc::new(sources),
        })
    }

    pub fn any(&self) -> bool {
        !self.current.read().is_empty()
    }

    /// The principal whose token this is. Compared against every token, so timing does not tell
    /// which (or whether one) matched.
    pub fn principal(&self, token: &str) -> Option<String> {
        let presented = digest(token);
        let mut found: Option<&str> = None;
        let current = self.current.read();
        for (principal, expected) in current.iter() {
            if bool::from(presented.ct_eq(expected)) {
                found = Some(principal);
            }
        }
        found.map(str::to_owned)
    }

    /// Reads the tokens file again if `always` or if it changed since it was read; a set that
    /// fails to load is not taken (the error says why). True when a new set was taken.
    pub fn reload(&self, always: bool) -> Result<bool, TokenConfigError> {
        let Some(path) = &self.sources.file else {
            return Ok(false);
        };
        let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        if !always && modified.is_some() && modified == *self.sources.read_at.lock() {
            return Ok(false);
        }
        let grants = self.sources.read()?;
        *self.current.write() = grants;
        Ok(true)
    }
}

impl Sources {
    fn read(&self) -> Result<Digests, TokenConfigError> {
        let mut grants: Vec<Grant> = self.fixed.clone();
        if let Some(path) = &self.file {
            let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
            grants.extend(file_grants(path)?);
            *self.read_at.lock() = modified;
        }
        refuse_shared_tokens(&grants)?;
        if let Some(issuer) = &self.jwt_issuer {
            refuse_jwt_shaped(&grants, issuer)?;
        }
        Ok(grants
            .into_iter()
            .map(|g| (g.principal, g.digest))
            .collect())
    }
}

/// One configured token, with where it came from (for error messages).
#[derive(Clone)]
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
        // Control characters are reserved: a tenant is joined to its principal by one.
        if principal.chars().any(char::is_control) {
            return Err(TokenConfigError::ControlInPrincipal {
                principal: principal.escape_debug().to_string(),
                origin: origin.to_owned(),
            });
        }
        if digest == super::digest("") {
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

/// A static principal named like a JWT caller of the configured issuer would share its
/// conversations.
fn refuse_jwt_shaped(grants: &[Grant], issuer: &str) -> Result<(), TokenConfigError> {
    let prefix = format!("{issuer}#");
    match grants.iter().find(|g| g.principal.starts_with(&prefix)) {
        Some(grant) => Err(TokenConfigError::LikeJwtPrincipal {
            principal: grant.principal.clone(),
            origin: grant.origin.clone(),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_map_to_principals() {
        let mut config = AuthConfig::default();
        config.tokens.insert("alice".into(), "a-token".into());
        let tokens = Tokens::load(&config, Some("bob:b-token")).unwrap();
        assert_eq!(tokens.principal("a-token").as_deref(), Some("alice"));
        assert_eq!(tokens.principal("b-token").as_deref(), Some("bob"));
        assert_eq!(tokens.principal("nope"), None);
    }

    #[test]
    fn a_reload_that_fails_keeps_the_tokens_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        let line =
            |principal: &str, token: &str| format!("{principal}:{}\n", hex::encode(digest(token)));
        std::fs::write(&path, line("carol", "c-token")).unwrap();
        let config = AuthConfig {
            tokens_file: Some(path.clone()),
            ..AuthConfig::default()
        };
        let tokens = Tokens::load(&config, None).unwrap();
        assert_eq!(tokens.principal("c-token").as_deref(), Some("carol"));
        std::fs::write(&path, "carol has no hash\n").unwrap();
        assert!(tokens.reload(true).is_err());
        assert_eq!(tokens.principal("c-token").as_deref(), Some("carol"));
        std::fs::write(&path, line("dave", "d-token")).unwrap();
        assert!(tokens.reload(true).unwrap());
        assert_eq!(tokens.principal("c-token"), None);
        assert_eq!(tokens.principal("d-token").as_deref(), Some("dave"));
    }
}
