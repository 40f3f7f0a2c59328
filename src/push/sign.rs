//! Signed notifications: a compact JWS (a JWT, ES256) in [`SIGNATURE_HEADER`] whose claims name
//! the notification (`jti`), its time (`iat`) and the SHA-256 of the exact body bytes
//! (`request_body_sha256`, hex). The key is an ECDSA P-256 key kept in the data folder
//! (generated on first start) or configured; its public part is served as a JWKS at
//! [`JWKS_PATH`], which the agent card names. How a receiver verifies: `docs/push.md`.

use super::deliver::SignBody;
use crate::error::chain;
use crate::store::Notification;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::path::Path;

/// The header carrying the JWT.
pub const SIGNATURE_HEADER: &str = "X-Colloquy-Signature";
/// Where the public keys are served.
pub const JWKS_PATH: &str = "/.well-known/jwks.json";
/// The key file's name in the data folder, when none is configured.
pub const DEFAULT_KEY_FILE: &str = "push-signing-key.p8";

#[derive(Debug, thiserror::Error)]
pub enum SignError {
    #[error("reading the push signing key {path}: {error}")]
    Read {
        path: String,
        #[source]
        error: std::io::Error,
    },
    #[error("writing the push signing key {path}: {error}")]
    Write {
        path: String,
        #[source]
        error: std::io::Error,
    },
    /// ring's reason is not a `std::error::Error`, so it cannot be kept as a source.
    #[error("the push signing key {path} is not a PKCS#8 ECDSA P-256 key: {reason}")]
    Invalid {
        path: String,
        reason: ring::error::KeyRejected,
    },
    #[error("generating the push signing key failed")]
    Generate,
}

pub struct Signer {
    key: EcdsaKeyPair,
    kid: String,
    jwk: Value,
    rng: SystemRandom,
}

impl Signer {
    /// The key in `path` (PKCS#8 DER), generated there first if the file does not exist.
    /// Blocking (file I/O): call it off async threads.
    pub fn load_or_generate(path: &Path) -> Result<Signer, SignError> {
        let rng = SystemRandom::new();
        let shown = path.display().to_string();
        let pkcs8 = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let generated =
                    EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
                        .map_err(|_| SignError::Generate)?;
                crate::durable::write_atomic(path, generated.as_ref()).map_err(|error| {
                    SignError::Write {
                        path: shown.clone(),
                        error,
                    }
                })?;
                restrict_to_owner(path);
                tracing::info!(path = %shown, "generated the push notification signing key");
                generated.as_ref().to_vec()
            }
            Err(error) => return Err(SignError::Read { path: shown, error }),
        };
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &pkcs8, &rng)
            .map_err(|reason| SignError::Invalid {
                path: shown,
                reason,
            })?;
        let (jwk, kid) = crate::protocol::signing::ec_p256_jwk(key.public_key().as_ref());
        Ok(Signer { key, kid, jwk, rng })
    }

    /// The public key set receivers verify with.
    pub fn jwks(&self) -> Value {
        json!({ "keys": [self.jwk] })
    }

    /// The public key, for the key set colloquy serves.
    pub fn jwk(&self) -> &Value {
        &self.jwk
    }

    /// The JWT for `body`, naming the notification `id`, at `issued_at` (Unix seconds).
    pub fn sign(&self, id: &str, issued_at: i64, body: &[u8]) -> String {
        let header = json!({"alg": "ES256", "typ": "JWT", "kid": self.kid});
        let claims = json!({
            "iss": "colloquy",
            "jti": id,
            "iat": issued_at,
            "request_body_sha256": hex::encode(Sha256::digest(body)),
        });
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        // Signing with a valid key only fails if the system's randomness does.
        let signature = self
            .key
            .sign(&self.rng, signing_input.as_bytes())
            .map(|s| URL_SAFE_NO_PAD.encode(s.as_ref()))
            .unwrap_or_default();
        format!("{signing_input}.{signature}")
    }
}

impl SignBody for Signer {
    fn headers(&self, notification: &Notification, body: &[u8]) -> Vec<(&'static str, String)> {
        let now = crate::model::now().timestamp();
        vec![(SIGNATURE_HEADER, self.sign(&notification.id, now, body))]
    }
}

#[cfg(unix)]
fn restrict_to_owner(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)) {
        tracing::warn!(error = %chain(&e), "could not make the push signing key readable by its owner only");
    }
}

#[cfg(not(unix))]
fn restrict_to_owner(_: &Path) {}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::{ECDSA_P256_SHA256_FIXED, UnparsedPublicKey};

    #[test]
    fn a_key_is_generated_once_and_its_signatures_verify_with_the_jwk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(DEFAULT_KEY_FILE);
        let signer = Signer::load_or_generate(&path).unwrap();
        let again = Signer::load_or_generate(&path).unwrap();
        assert_eq!(signer.jwks(), again.jwks(), "the same key after a restart");

        let jwt = signer.sign("n-1", 1_700_000_000, b"{\"task\":{}}");
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        let jwk = &signer.jwks()["keys"][0];
        let mut point = vec![4u8];
        point.extend(URL_SAFE_NO_PAD.decode(jwk["x"].as_str().unwrap()).unwrap());
        point.extend(URL_SAFE_NO_PAD.decode(jwk["y"].as_str().unwrap()).unwrap());
        let signature = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
        let signed = format!("{}.{}", parts[0], parts[1]);
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, &point)
            .verify(signed.as_bytes(), &signature)
            .expect("the signature verifies");
        let claims: Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
        assert_eq!(claims["jti"], "n-1");
        assert_eq!(
            claims["request_body_sha256"],
            hex::encode(Sha256::digest(b"{\"task\":{}}"))
        );
    }
}
