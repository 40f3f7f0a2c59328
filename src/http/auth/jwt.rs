//! JWT bearer tokens from an OpenID Connect / OAuth2 issuer (`[auth.jwt]`).
//!
//! A token is accepted when it is signed with RS256, PS256, ES256 or EdDSA by a key of the
//! issuer's key set (never `none`, never an HMAC: a public key set holds no secret), carries the
//! configured `iss` and one of the `aud`s, is within `exp`/`nbf` give or take the leeway, and
//! holds the required scopes. The key set is fetched from `jwks_url` and cached; a token naming
//! a key the set lacks fetches it again, at most once per `jwks_refresh_secs`, and a fetch that
//! fails keeps the keys already held. The caller's principal is `ISS#CLAIM`, so two issuers
//! never share a principal.

use crate::config::JwtConfig;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use parking_lot::RwLock;
use serde_json::{Map, Value};
use std::str::FromStr;
use std::time::{Duration, Instant};

/// The only algorithms a token may be signed with.
const ACCEPTED: [Algorithm; 4] = [
    Algorithm::RS256,
    Algorithm::PS256,
    Algorithm::ES256,
    Algorithm::EdDSA,
];

use crate::client::MAX_KEY_SET_BYTES as MAX_JWKS_BYTES;

/// Why a key set was not taken. Messages name where it came from, never key material.
#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    #[error("fetching {url}: {error}")]
    Fetch {
        url: String,
        #[source]
        error: reqwest::Error,
    },
    #[error("fetching {url}: HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("reading {url}: {detail}")]
    Read { url: String, detail: String },
    #[error("reading {path}: {error}")]
    File {
        path: String,
        #[source]
        error: std::io::Error,
    },
    #[error("{origin} is not a JSON Web Key Set: {error}")]
    NotJson {
        origin: String,
        #[source]
        error: serde_json::Error,
    },
    #[error("{origin} is larger than {MAX_JWKS_BYTES} bytes")]
    TooLarge { origin: String },
}

/// A token refused; the reason goes in the response body, so it names no key material.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Refused(String);

fn refused(reason: impl Into<String>) -> Refused {
    Refused(reason.into())
}

/// What an accepted token says of its caller.
#[derive(Debug, Clone, PartialEq)]
pub struct Caller {
    pub principal: String,
    /// The tenants its `tenants_claim` lists.
    pub tenants: Vec<String>,
}

struct Key {
    kid: Option<String>,
    /// The `alg` the key set pins the key to, if it does.
    alg: Option<Algorithm>,
    key: DecodingKey,
}

pub struct JwtVerifier {
    config: JwtConfig,
    keys: RwLock<Vec<Key>>,
    /// When the key set was last fetched (or its fetch tried); held across a fetch, so that
    /// one fetch runs at a time.
    fetched: tokio::sync::Mutex<Option<Instant>>,
    client: reqwest::Client,
}

impl JwtVerifier {
    /// The verifier, with the key file read if one is configured (a URL is fetched on first
    /// use, or by [`JwtVerifier::refresh`]).
    pub fn new(config: &JwtConfig) -> Result<JwtVerifier, JwksError> {
        let verifier = JwtVerifier {
            config: config.clone(),
            keys: RwLock::new(Vec::new()),
            fetched: tokio::sync::Mutex::new(None),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap_or_default(),
        };
        verifier.reload_file()?;
        Ok(verifier)
    }

    pub fn issuer(&self) -> &str {
        self.config.issuer.trim()
    }

    /// The issuer's discovery document, for the agent card.
    pub fn discovery_url(&self) -> String {
        self.config.discovery_url.clone().unwrap_or_else(|| {
            format!(
                "{}/.well-known/openid-configuration",
                self.issuer().trim_end_matches('/')
            )
        })
    }

    /// How often the fetched key set is replaced by a fresh fetch, if it is fetched: a key the
    /// issuer withdrew stops verifying within this.
    pub fn max_age(&self) -> Option<Duration> {
        self.config.jwks_url.as_ref()?;
        Some(Duration::from_secs(self.config.jwks_max_age_secs.max(1)))
    }

    pub fn required_scopes(&self) -> &[String] {
        &self.config.required_scopes
    }

    /// Reads `jwks_file` again, if there is one; a file that fails keeps the keys held.
    pub fn reload_file(&self) -> Result<(), JwksError> {
        let Some(path) = &self.config.jwks_file else {
            return Ok(());
        };
        let origin = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|error| JwksError::File {
            path: origin.clone(),
            error,
        })?;
        *self.keys.write() = parse_key_set(&bytes, &origin)?;
        Ok(())
    }

    /// Fetches `jwks_url` now (at start, so the first caller does not wait for it).
    pub async fn refresh(&self) -> Result<(), JwksError> {
        let mut fetched = self.fetched.lock().await;
        self.fetch(&mut fetched).await
    }

    async fn fetch(&self, fetched: &mut Option<Instant>) -> Result<(), JwksError> {
        let Some(url) = &self.config.jwks_url else {
            return Ok(());
        };
        *fetched = Some(Instant::now());
        let response = self
            .client
            .get(url)
            .send()
            .await
            .map_err(|error| JwksError::Fetch {
                url: url.clone(),
                error,
            })?;
        if !response.status().is_success() {
            return Err(JwksError::Status {
                url: url.clone(),
                status: response.status().as_u16(),
            });
        }
        let bytes = crate::client::read_limited(response, MAX_JWKS_BYTES)
            .await
            .map_err(|detail| JwksError::Read {
                url: url.clone(),
                detail,
            })?;
        let keys = parse_key_set(&bytes, url)?;
        tracing::info!(url = %url, keys = keys.len(), "fetched the JWT issuer's key set");
        *self.keys.write() = keys;
        Ok(())
    }

    /// The caller a token names, or why it is refused.
    pub async fn verify(&self, token: &str) -> Result<Caller, Refused> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| refused(format!("the token's header is not valid: {}", reason(&e))))?;
        if !ACCEPTED.contains(&header.alg) {
            return Err(refused(format!(
                "tokens signed with {:?} are not accepted (RS256, PS256, ES256, EdDSA are)",
                header.alg
            )));
        }
        let key = self.key_for(header.kid.as_deref(), header.alg).await?;
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[self.issuer()]);
        validation.set_audience(&self.config.audience);
        validation.leeway = self.config.leeway_secs;
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        let claims = jsonwebtoken::decode::<Map<String, Value>>(token, &key, &validation)
            .map_err(|e| refused(reason(&e)))?
            .claims;
        self.caller(&claims)
    }

    fn caller(&self, claims: &Map<String, Value>) -> Result<Caller, Refused> {
        let claim = &self.config.principal_claim;
        let name = match claims.get(claim) {
            Some(Value::String(name)) => name.clone(),
            Some(Value::Number(number)) => number.to_string(),
            _ => return Err(refused(format!("the token has no {claim} claim"))),
        };
        if name.is_empty() || name.chars().any(char::is_control) {
            return Err(refused(format!(
                "the token's {claim} claim is empty or holds a control character"
            )));
        }
        let scopes = words(claims.get("scope").or_else(|| claims.get("scp")));
        if let Some(missing) = self
            .config
            .required_scopes
            .iter()
            .find(|scope| !scopes.contains(scope))
        {
            return Err(refused(format!("the token lacks the scope {missing:?}")));
        }
        let tenants = match &self.config.tenants_claim {
            Some(claim) => words(claims.get(claim)),
            None => Vec::new(),
        };
        Ok(Caller {
            principal: format!("{}#{name}", self.issuer()),
            tenants,
        })
    }

    /// The key a token's header names: from the set held, else from a fetch when the last was
    /// long enough ago.
    async fn key_for(&self, kid: Option<&str>, alg: Algorithm) -> Result<DecodingKey, Refused> {
        if let Some(key) = self.find(kid, alg)? {
            return Ok(key);
        }
        let refresh_every = Duration::from_secs(self.config.jwks_refresh_secs);
        let mut fetched = self.fetched.lock().await;
        // Another request may have fetched it meanwhile.
        if let Some(key) = self.find(kid, alg)? {
            return Ok(key);
        }
        if fetched.is_none_or(|at| at.elapsed() >= refresh_every) {
            if let Err(error) = self.fetch(&mut fetched).await {
                tracing::warn!(error = %crate::error::chain(&error), "the JWT key set was not refreshed; keeping the keys held");
            }
            if let Some(key) = self.find(kid, alg)? {
                return Ok(key);
            }
        }
        Err(refused(match kid {
            Some(kid) => format!("the token's key id {kid:?} is not in the issuer's key set"),
            None => "the token names no key id (kid)".to_owned(),
        }))
    }

    fn find(&self, kid: Option<&str>, alg: Algorithm) -> Result<Option<DecodingKey>, Refused> {
        let keys = self.keys.read();
        let found = match kid {
            Some(kid) => keys.iter().find(|key| key.kid.as_deref() == Some(kid)),
            // No kid: only a set of one key says which.
            None if keys.len() == 1 => keys.first(),
            None => None,
        };
        match found {
            Some(key) if key.alg.is_some_and(|pinned| pinned != alg) => Err(refused(format!(
                "the token's algorithm {alg:?} is not its key's"
            ))),
            Some(key) => Ok(Some(key.key.clone())),
            None => Ok(None),
        }
    }
}

/// The verifying keys of a JSON Web Key Set. Symmetric (`oct`) keys and encryption keys are
/// left out, as are keys this library cannot read (logged), so one odd key spoils no others.
fn parse_key_set(bytes: &[u8], origin: &str) -> Result<Vec<Key>, JwksError> {
    if bytes.len() > MAX_JWKS_BYTES {
        return Err(JwksError::TooLarge {
            origin: origin.to_owned(),
        });
    }
    #[derive(serde::Deserialize)]
    struct KeySet {
        keys: Vec<Value>,
    }
    let set: KeySet = serde_json::from_slice(bytes).map_err(|error| JwksError::NotJson {
        origin: origin.to_owned(),
        error,
    })?;
    let mut keys = Vec::new();
    for raw in set.keys {
        let text = |field: &str| raw.get(field).and_then(Value::as_str).map(str::to_owned);
        if text("kty").as_deref() == Some("oct") || text("use").is_some_and(|u| u != "sig") {
            continue;
        }
        let kid = text("kid");
        let alg = match text("alg") {
            Some(alg) => match Algorithm::from_str(&alg) {
                Ok(alg) if ACCEPTED.contains(&alg) => Some(alg),
                _ => continue,
            },
            None => None,
        };
        let key = serde_json::from_value::<Jwk>(raw)
            .ok()
            .and_then(|jwk| DecodingKey::from_jwk(&jwk).ok());
        match key {
            Some(key) => keys.push(Key { kid, alg, key }),
            None => {
                tracing::warn!(origin, kid = ?kid, "a key of the JWT key set cannot be read; skipped")
            }
        }
    }
    Ok(keys)
}

/// Words of a claim: a list of strings, or one space-separated string.
fn words(claim: Option<&Value>) -> Vec<String> {
    match claim {
        Some(Value::String(text)) => text.split_whitespace().map(str::to_owned).collect(),
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    }
}

/// Why a token failed, in words that name no key material.
fn reason(error: &jsonwebtoken::errors::Error) -> String {
    match error.kind() {
        ErrorKind::ExpiredSignature => "the token has expired".into(),
        ErrorKind::ImmatureSignature => "the token is not valid yet (nbf)".into(),
        ErrorKind::InvalidAudience => "the token is for another audience".into(),
        ErrorKind::InvalidIssuer => "the token is from another issuer".into(),
        ErrorKind::InvalidSignature => "the token's signature does not verify".into(),
        ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => {
            "the token's algorithm is not accepted".into()
        }
        ErrorKind::MissingRequiredClaim(claim) => format!("the token has no {claim} claim"),
        ErrorKind::InvalidToken
        | ErrorKind::Base64(_)
        | ErrorKind::Json(_)
        | ErrorKind::Utf8(_) => "the token is not a well-formed JWT".into(),
        _ => "the token is not valid".into(),
    }
}
