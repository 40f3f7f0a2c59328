//! Signed agent cards, as the specification's `AgentCardSignature`: a JWS (RFC 7515) whose
//! payload, detached, is the card's RFC 8785 (JCS) canonical form without its `signatures`.
//! colloquy signs its card with an EC P-256 (ES256) or Ed25519 (EdDSA) key; a client verifies a
//! peer's card against a key set it was told to trust, never one the card points to.
//! Also the public JWKs of such keys, named by their RFC 7638 thumbprints.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, DecodingKey};
use parking_lot::Mutex;
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, Ed25519KeyPair, KeyPair};
use rustls_pki_types::PrivatePkcs8KeyDer;
use rustls_pki_types::pem::PemObject;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::str::FromStr;

/// Signatures kept for cards already signed: an ECDSA signature differs at each signing, and a
/// card that changed no byte should keep its ETag.
const KEPT_SIGNATURES: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum CardKeyError {
    #[error("reading the card signing key {path}: {error}")]
    Read {
        path: String,
        #[source]
        error: std::io::Error,
    },
    #[error("the card signing key {path} is not a PKCS#8 EC P-256 or Ed25519 key (PEM or DER)")]
    Invalid { path: String },
}

/// Why a peer's card was not taken as signed by a trusted key.
#[derive(Debug, thiserror::Error)]
pub enum CardSignatureError {
    #[error("the card is not signed")]
    Unsigned,
    #[error("the card's RFC 8785 form cannot be made: {0}")]
    Canonical(String),
    #[error("no signature of the card verifies with a trusted key ({0})")]
    NotVerified(String),
}

enum KeyPairKind {
    Es256(EcdsaKeyPair),
    EdDsa(Ed25519KeyPair),
}

/// The key the card is signed with.
pub struct CardSigner {
    key: KeyPairKind,
    kid: String,
    jwk: Value,
    rng: SystemRandom,
    signed: Mutex<Vec<([u8; 32], Value)>>,
}

impl CardSigner {
    /// The key in `path`: PKCS#8, PEM or DER, EC P-256 or Ed25519. Blocking (file I/O).
    pub fn load(path: &Path) -> Result<CardSigner, CardKeyError> {
        let shown = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|error| CardKeyError::Read {
            path: shown.clone(),
            error,
        })?;
        let der = PrivatePkcs8KeyDer::from_pem_slice(&bytes)
            .map(|der| der.secret_pkcs8_der().to_vec())
            .unwrap_or(bytes);
        let rng = SystemRandom::new();
        let (key, (jwk, kid)) = if let Ok(pair) =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &der, &rng)
        {
            let jwk = ec_p256_jwk(pair.public_key().as_ref());
            (KeyPairKind::Es256(pair), jwk)
        } else if let Ok(pair) = Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der) {
            let jwk = ed25519_jwk(pair.public_key().as_ref());
            (KeyPairKind::EdDsa(pair), jwk)
        } else {
            return Err(CardKeyError::Invalid { path: shown });
        };
        Ok(CardSigner {
            key,
            kid,
            jwk,
            rng,
            signed: Mutex::new(Vec::new()),
        })
    }

    /// The public key, for the JWKS colloquy serves.
    pub fn jwk(&self) -> &Value {
        &self.jwk
    }

    fn alg(&self) -> &'static str {
        match self.key {
            KeyPairKind::Es256(_) => "ES256",
            KeyPairKind::EdDsa(_) => "EdDSA",
        }
    }

    /// `card` with its `signatures`: one, by this key, whose header names the key set at `jku`.
    pub fn sign(&self, card: &mut Map<String, Value>, jku: &str) -> Result<(), CardSignatureError> {
        card.remove("signatures");
        let canonical = canonical(card)?;
        let digest: [u8; 32] = Sha256::digest(format!("{jku}\n{canonical}")).into();
        if let Some((_, kept)) = self.signed.lock().iter().find(|(d, _)| *d == digest) {
            card.insert("signatures".into(), kept.clone());
            return Ok(());
        }
        let header = json!({"alg": self.alg(), "typ": "JOSE", "kid": self.kid, "jku": jku});
        let protected = URL_SAFE_NO_PAD.encode(header.to_string());
        let input = format!("{protected}.{}", URL_SAFE_NO_PAD.encode(&canonical));
        let signature = match &self.key {
            KeyPairKind::Es256(pair) => pair
                .sign(&self.rng, input.as_bytes())
                .map(|s| s.as_ref().to_vec())
                .map_err(|_| {
                    CardSignatureError::Canonical("the system's randomness failed".into())
                })?,
            KeyPairKind::EdDsa(pair) => pair.sign(input.as_bytes()).as_ref().to_vec(),
        };
        let signatures = json!([{
            "protected": protected,
            "signature": URL_SAFE_NO_PAD.encode(signature),
        }]);
        let mut kept = self.signed.lock();
        if kept.len() >= KEPT_SIGNATURES {
            kept.remove(0);
        }
        kept.push((digest, signatures.clone()));
        card.insert("signatures".into(), signatures);
        Ok(())
    }
}

/// The card's RFC 8785 form, without `signatures`.
fn canonical(card: &Map<String, Value>) -> Result<String, CardSignatureError> {
    let mut unsigned = card.clone();
    unsigned.remove("signatures");
    serde_json_canonicalizer::to_string(&Value::Object(unsigned))
        .map_err(|e| CardSignatureError::Canonical(e.to_string()))
}

/// The `kid` of the trusted key that signed `card`, if one did. `jwks` is a JSON Web Key Set;
/// signatures by keys it lacks, or with algorithms other than ES256, EdDSA, RS256 and PS256,
/// count as not verified.
pub fn verify_card(card: &Value, jwks: &Value) -> Result<String, CardSignatureError> {
    let Some(card) = card.as_object() else {
        return Err(CardSignatureError::Unsigned);
    };
    let signatures = match card.get("signatures").and_then(Value::as_array) {
        Some(signatures) if !signatures.is_empty() => signatures,
        _ => return Err(CardSignatureError::Unsigned),
    };
    let payload = URL_SAFE_NO_PAD.encode(canonical(card)?);
    let keys = jwks.get("keys").and_then(Value::as_array);
    let mut why = Vec::new();
    for signature in signatures {
        match verify_one(signature, &payload, keys.map_or(&[][..], Vec::as_slice)) {
            Ok(kid) => return Ok(kid),
            Err(reason) => why.push(reason),
        }
    }
    Err(CardSignatureError::NotVerified(why.join("; ")))
}

fn verify_one(signature: &Value, payload: &str, keys: &[Value]) -> Result<String, String> {
    let text = |field: &str| signature.get(field).and_then(Value::as_str);
    let protected = text("protected").ok_or("a signature without a protected header")?;
    let header: Value = URL_SAFE_NO_PAD
        .decode(protected)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .ok_or("a protected header that is not base64url JSON")?;
    let alg = header.get("alg").and_then(Value::as_str).unwrap_or("");
    let algorithm = match Algorithm::from_str(alg) {
        Ok(a @ (Algorithm::ES256 | Algorithm::EdDSA | Algorithm::RS256 | Algorithm::PS256)) => a,
        _ => return Err(format!("algorithm {alg:?} is not accepted")),
    };
    let kid = header.get("kid").and_then(Value::as_str).unwrap_or("");
    let jwk = keys
        .iter()
        .find(|key| key.get("kid").and_then(Value::as_str) == Some(kid))
        .ok_or_else(|| format!("key {kid:?} is not trusted"))?;
    // The header chooses the algorithm: the key must be of its kind (and pinned to it, if
    // pinned), or a key of another kind would be used with it.
    if !fits(jwk, algorithm) {
        return Err(format!("key {kid:?} is not a key for {alg}"));
    }
    let key = serde_json::from_value(jwk.clone())
        .ok()
        .and_then(|jwk| DecodingKey::from_jwk(&jwk).ok())
        .ok_or_else(|| format!("key {kid:?} cannot be read"))?;
    let input = format!("{protected}.{payload}");
    let signed = text("signature").unwrap_or("");
    match jsonwebtoken::crypto::verify(signed, input.as_bytes(), &key, algorithm) {
        Ok(true) => Ok(kid.to_owned()),
        _ => Err(format!("the signature by {kid:?} does not verify")),
    }
}

/// Whether `jwk` is a key `algorithm` verifies with: its type and curve, and its `alg` if set.
fn fits(jwk: &Value, algorithm: Algorithm) -> bool {
    let text = |field: &str| jwk.get(field).and_then(Value::as_str);
    let kind = match algorithm {
        Algorithm::ES256 => text("kty") == Some("EC") && text("crv") == Some("P-256"),
        Algorithm::EdDSA => text("kty") == Some("OKP") && text("crv") == Some("Ed25519"),
        Algorithm::RS256 | Algorithm::PS256 => text("kty") == Some("RSA"),
        _ => false,
    };
    let pinned = text("alg").is_none_or(|alg| Algorithm::from_str(alg).ok() == Some(algorithm));
    kind && pinned
}

/// The JWK of an uncompressed P-256 point (65 bytes, as ring gives a key pair's), and its
/// RFC 7638 thumbprint (the `kid`).
pub fn ec_p256_jwk(point: &[u8]) -> (Value, String) {
    let (x, y) = point[1..].split_at(32);
    let (x, y) = (URL_SAFE_NO_PAD.encode(x), URL_SAFE_NO_PAD.encode(y));
    // RFC 7638: the required members, in lexicographic order, no whitespace.
    let kid = thumbprint(&format!(
        r#"{{"crv":"P-256","kty":"EC","x":"{x}","y":"{y}"}}"#
    ));
    let jwk = json!({
        "kty": "EC", "crv": "P-256", "x": x, "y": y,
        "use": "sig", "alg": "ES256", "kid": kid,
    });
    (jwk, kid)
}

/// The JWK of an Ed25519 public key, and its RFC 7638 thumbprint (the `kid`).
pub fn ed25519_jwk(public: &[u8]) -> (Value, String) {
    let x = URL_SAFE_NO_PAD.encode(public);
    let kid = thumbprint(&format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{x}"}}"#));
    let jwk = json!({
        "kty": "OKP", "crv": "Ed25519", "x": x,
        "use": "sig", "alg": "EdDSA", "kid": kid,
    });
    (jwk, kid)
}

fn thumbprint(canonical_members: &str) -> String {
    URL_SAFE_NO_PAD.encode(Sha256::digest(canonical_members.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, Ed25519KeyPair};

    fn signer_with(pkcs8: &[u8], pem: bool) -> CardSigner {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("card-key");
        let bytes = match pem {
            true => {
                let body = base64::engine::general_purpose::STANDARD.encode(pkcs8);
                format!("-----BEGIN PRIVATE KEY-----\n{body}\n-----END PRIVATE KEY-----\n")
                    .into_bytes()
            }
            false => pkcs8.to_vec(),
        };
        std::fs::write(&path, bytes).unwrap();
        CardSigner::load(&path).unwrap()
    }

    #[test]
    fn a_signed_card_verifies_and_a_changed_one_does_not() {
        let rng = SystemRandom::new();
        let ec = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let ed = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        for (signer, alg) in [
            (signer_with(ec.as_ref(), true), "ES256"),
            (signer_with(ed.as_ref(), false), "EdDSA"),
        ] {
            let mut card = json!({"name": "c", "skills": [], "version": "1"})
                .as_object()
                .cloned()
                .unwrap();
            signer
                .sign(&mut card, "http://h/.well-known/jwks.json")
                .unwrap();
            let jwks = json!({"keys": [signer.jwk()]});
            let card = Value::Object(card);
            assert_eq!(verify_card(&card, &jwks).unwrap(), signer.kid, "{alg}");
            let mut changed = card.clone();
            changed["name"] = json!("d");
            assert!(matches!(
                verify_card(&changed, &jwks),
                Err(CardSignatureError::NotVerified(_))
            ));
            assert!(matches!(
                verify_card(&card, &json!({"keys": []})),
                Err(CardSignatureError::NotVerified(_))
            ));
            // The same kid on a key of another kind is never used with the header's algorithm.
            let mut other_kind = signer.jwk().clone();
            other_kind["kty"] = json!("RSA");
            assert!(matches!(
                verify_card(&card, &json!({"keys": [other_kind]})),
                Err(CardSignatureError::NotVerified(_))
            ));
        }
    }
}
