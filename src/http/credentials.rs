//! Credentials kept current while serving: the keys colloquy signs with (push notifications,
//! the agent card) and the key set that publishes them (`/.well-known/jwks.json`), and the
//! callers' tokens ([`Auth`]).
//!
//! On SIGHUP each signing key is read again from its file (the push key is generated anew if
//! its file was removed). A key that changed signs from then on, and the key it replaced stays
//! in the key set for `auth.retired_key_secs`, so that a receiver holding a cached key set, or a
//! notification signed just before, still verifies. The tokens file and the JWT key set file
//! are read again on SIGHUP too, and the tokens file whenever it changes.

use super::auth::Auth;
use crate::error::chain;
use crate::protocol::signing::CardSigner;
use crate::push::deliver::SignBody;
use crate::push::sign::Signer;
use crate::store::Notification;
use parking_lot::{Mutex, RwLock};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A key in use, and the file it is read from.
struct Slot<K> {
    path: PathBuf,
    current: RwLock<Arc<K>>,
}

impl<K> Slot<K> {
    fn new(path: PathBuf, key: K) -> Slot<K> {
        Slot {
            path,
            current: RwLock::new(Arc::new(key)),
        }
    }

    fn get(&self) -> Arc<K> {
        self.current.read().clone()
    }
}

pub struct SigningKeys {
    push: Option<Slot<Signer>>,
    card: Option<Slot<CardSigner>>,
    /// Keys replaced, each published until its instant.
    retired: Mutex<Vec<(Value, Instant)>>,
    keep_retired: Duration,
}

impl SigningKeys {
    pub fn new(
        push: Option<(PathBuf, Signer)>,
        card: Option<(PathBuf, CardSigner)>,
        keep_retired: Duration,
    ) -> SigningKeys {
        SigningKeys {
            push: push.map(|(path, key)| Slot::new(path, key)),
            card: card.map(|(path, key)| Slot::new(path, key)),
            retired: Mutex::new(Vec::new()),
            keep_retired,
        }
    }

    /// The keys a verifier may meet: those in use, and those replaced within `keep_retired`.
    pub fn jwks(&self) -> Value {
        let mut keys = Vec::new();
        if let Some(push) = &self.push {
            keys.push(push.get().jwk().clone());
        }
        if let Some(card) = &self.card {
            keys.push(card.get().jwk().clone());
        }
        let now = Instant::now();
        let mut retired = self.retired.lock();
        retired.retain(|(_, until)| *until > now);
        keys.extend(retired.iter().map(|(jwk, _)| jwk.clone()));
        json!({ "keys": keys })
    }

    /// The key the card is signed with now, if it is signed.
    pub fn card(&self) -> Option<Arc<CardSigner>> {
        self.card.as_ref().map(Slot::get)
    }

    /// Reads every key file again; what fails to load leaves the key in use, and is logged.
    /// Blocking (file I/O).
    pub fn reload(&self) {
        if let Some(push) = &self.push {
            match Signer::load_or_generate(&push.path) {
                Ok(key) => self.replace(push, key, Signer::jwk, "push"),
                Err(error) => {
                    tracing::error!(error = %chain(&error), "the push signing key was not reloaded; the key in use stays")
                }
            }
        }
        if let Some(card) = &self.card {
            match CardSigner::load(&card.path) {
                Ok(key) => self.replace(card, key, CardSigner::jwk, "card"),
                Err(error) => {
                    tracing::error!(error = %chain(&error), "the card signing key was not reloaded; the key in use stays")
                }
            }
        }
    }

    fn replace<K>(&self, slot: &Slot<K>, key: K, jwk: fn(&K) -> &Value, which: &str) {
        let mut current = slot.current.write();
        let before = jwk(&current).clone();
        if before == *jwk(&key) {
            return;
        }
        tracing::info!(key = which, kid = ?jwk(&key).get("kid"), "signing key rotated; the one before stays in the key set for auth.retired_key_secs");
        *current = Arc::new(key);
        self.retired
            .lock()
            .push((before, Instant::now() + self.keep_retired));
    }
}

/// Push notifications are signed with the key in use at each delivery.
impl SignBody for SigningKeys {
    fn headers(&self, notification: &Notification, body: &[u8]) -> Vec<(&'static str, String)> {
        match &self.push {
            Some(push) => push.get().headers(notification, body),
            None => Vec::new(),
        }
    }
}

/// Keeps the credentials current: the JWT key set fetched at start; every file read again on
/// SIGHUP, and the tokens file whenever it changes (looked at every `check_every`; zero: on
/// SIGHUP only). A reload that fails keeps what is in use and logs why.
pub async fn watch(auth: Auth, keys: Arc<SigningKeys>, check_every: Duration) {
    use tokio::signal::unix::{SignalKind, signal};
    if let Some(jwt) = auth.jwt()
        && let Err(error) = jwt.refresh().await
    {
        tracing::warn!(error = %chain(&error), "the JWT key set could not be fetched; it is fetched again when a token needs it");
    }
    if let Some((jwt, every)) = auth
        .jwt()
        .and_then(|jwt| Some((jwt.clone(), jwt.max_age()?)))
    {
        actix_rt::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Err(error) = jwt.refresh().await {
                    tracing::warn!(error = %chain(&error), "the JWT key set was not refreshed; keeping the keys held");
                }
            }
        });
    }
    let mut hangup = match signal(SignalKind::hangup()) {
        Ok(hangup) => Some(hangup),
        Err(error) => {
            tracing::warn!(%error, "SIGHUP cannot be watched; credentials reload only when their files change");
            None
        }
    };
    let mut ticks = (!check_every.is_zero()).then(|| tokio::time::interval(check_every));
    if hangup.is_none() && ticks.is_none() {
        return;
    }
    loop {
        let always = tokio::select! {
            Some(()) = async { hangup.as_mut()?.recv().await } => true,
            _ = async { ticks.as_mut()?.tick().await; Some(()) }, if ticks.is_some() => false,
        };
        auth.reload(always);
        if always {
            let keys = keys.clone();
            // Key files are small; read off the serving threads all the same.
            let _ = actix_rt::task::spawn_blocking(move || keys.reload()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::rand::SystemRandom;
    use ring::signature::Ed25519KeyPair;

    fn write_card_key(path: &std::path::Path) {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
        std::fs::write(path, pkcs8.as_ref()).unwrap();
    }

    fn kids(keys: &SigningKeys) -> Vec<String> {
        keys.jwks()["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|key| key["kid"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn a_rotated_key_signs_at_once_and_the_one_before_stays_published_for_a_while() {
        let dir = tempfile::tempdir().unwrap();
        let (push_path, card_path) = (dir.path().join("push.p8"), dir.path().join("card.der"));
        write_card_key(&card_path);
        for keep in [Duration::from_secs(600), Duration::ZERO] {
            let keys = SigningKeys::new(
                Some((
                    push_path.clone(),
                    Signer::load_or_generate(&push_path).unwrap(),
                )),
                Some((card_path.clone(), CardSigner::load(&card_path).unwrap())),
                keep,
            );
            let before = kids(&keys);
            keys.reload();
            assert_eq!(kids(&keys), before, "an unchanged file rotates nothing");
            write_card_key(&card_path);
            std::fs::remove_file(&push_path).unwrap();
            keys.reload();
            let after = kids(&keys);
            let new_card = keys.card().unwrap().jwk()["kid"].clone();
            assert!(!before.contains(&new_card.as_str().unwrap().to_owned()));
            assert_eq!(after.len(), if keep.is_zero() { 2 } else { 4 }, "{after:?}");
            assert_eq!(
                before.iter().all(|kid| after.contains(kid)),
                !keep.is_zero()
            );
        }
    }
}
