//! The versioned SHA-256 key namespace.
//!
//! A conversation's key is `[version] ++ SHA-256(domain tag, len ++ principal, len ++ contextId)`.
//! Length prefixes make the encoding injective, so ids that differ in any byte (`tenant/a` and
//! `tenanta`, ids with NUL or `..`) never share a key, and no id ever reaches a file name.

use sha2::{Digest, Sha256};
use std::fmt;

/// The namespace version written into every key. Keys of another version are never loaded or
/// listed: their owner cannot be proven under this version's hashing.
pub const NAMESPACE_VERSION: u8 = 1;

const CONVERSATION_TAG: &[u8] = b"colloquy/conversation/v1";
const PRINCIPAL_TAG: &[u8] = b"colloquy/principal/v1";

pub const KEY_LEN: usize = 33;

fn namespaced_hash(tag: &[u8], fields: &[&[u8]]) -> [u8; KEY_LEN] {
    let mut hasher = Sha256::new();
    hasher.update((tag.len() as u64).to_be_bytes());
    hasher.update(tag);
    for field in fields {
        hasher.update((field.len() as u64).to_be_bytes());
        hasher.update(field);
    }
    let mut key = [0u8; KEY_LEN];
    key[0] = NAMESPACE_VERSION;
    key[1..].copy_from_slice(&hasher.finalize());
    key
}

/// Identifies one conversation: a principal's contextId.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConversationKey([u8; KEY_LEN]);

impl ConversationKey {
    pub fn new(principal: &str, context_id: &str) -> Self {
        ConversationKey(namespaced_hash(
            CONVERSATION_TAG,
            &[principal.as_bytes(), context_id.as_bytes()],
        ))
    }

    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let key: [u8; KEY_LEN] = bytes.try_into().ok()?;
        (key[0] == NAMESPACE_VERSION).then_some(ConversationKey(key))
    }

    pub fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }
}

/// The key in hex: how traces and the operator console name a conversation without its
/// contextId or principal.
impl fmt::Display for ConversationKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for ConversationKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConversationKey({})", hex::encode(&self.0[..9]))
    }
}

/// Scopes listings to one principal without storing the principal in the key.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PrincipalKey([u8; KEY_LEN]);

impl PrincipalKey {
    pub fn new(principal: &str) -> Self {
        PrincipalKey(namespaced_hash(PRINCIPAL_TAG, &[principal.as_bytes()]))
    }

    pub fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }
}

impl fmt::Debug for PrincipalKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PrincipalKey({})", hex::encode(&self.0[..9]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_prefixes_keep_fields_apart() {
        assert_ne!(
            ConversationKey::new("ab", "c"),
            ConversationKey::new("a", "bc")
        );
        assert_ne!(
            ConversationKey::new("", "tenant/a"),
            ConversationKey::new("", "tenanta")
        );
        assert_eq!(
            ConversationKey::new("p", "x"),
            ConversationKey::new("p", "x")
        );
    }

    #[test]
    fn other_versions_are_not_keys() {
        let mut bytes = *ConversationKey::new("p", "x").as_bytes();
        assert!(ConversationKey::from_bytes(&bytes).is_some());
        bytes[0] = NAMESPACE_VERSION + 1;
        assert!(ConversationKey::from_bytes(&bytes).is_none());
    }
}
