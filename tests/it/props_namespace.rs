//! Property tests for the versioned SHA-256 conversation namespace.
//!
//! - Distinct (principal, contextId) pairs never share a key, whatever the ids hold: any unicode,
//!   `/`, `..`, NUL, spaces, 4 KiB ids, and ids that differ only in what a file-name sanitiser
//!   would drop or fold (`a/b` vs `ab` vs `a_b`, case).
//! - Ids round-trip through a real sled store: after writing a conversation for each id,
//!   `list_conversations` returns exactly the original ids, and each key loads its own id.

use crate::store_conformance::store_turn;
use colloquy::store::embedded::EmbeddedStore;
use colloquy::store::{ConversationKey, ConversationMeta, ConversationStore};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// Fragments that path handling and sanitisers treat specially.
const TRICKY: &[&str] = &[
    "/", "\\", "..", ".", "\0", " ", "\t", "\n", "_", "-", ":", "%2F", "%00", "a", "A", "b", "B",
    "tenant", "TENANT", "é", "e\u{301}", "ß", "SS", "İ", "\u{200B}", "\u{FEFF}", "\u{202E}", "🦀",
    "\u{FFFD}", "ǅ", "con", "NUL", "~",
];

fn tricky_id() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(TRICKY), 0..12).prop_map(|parts| parts.concat())
}

fn any_unicode_id() -> impl Strategy<Value = String> {
    prop::collection::vec(any::<char>(), 0..40).prop_map(String::from_iter)
}

/// Ids of about 4 KiB (some just under, at, and over 4096 bytes).
fn huge_id() -> impl Strategy<Value = String> {
    (tricky_id(), 4090usize..4100, any::<char>()).prop_map(|(head, len, fill)| {
        let mut id = head;
        while id.len() < len {
            id.push(fill);
        }
        id
    })
}

fn any_id() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => tricky_id(),
        4 => any_unicode_id(),
        1 => huge_id(),
    ]
}

/// What common file-name sanitisers make of an id: each is a different id, so a different key.
fn sanitiser_variants(id: &str) -> Vec<String> {
    let unsafe_char = |c: char| matches!(c, '/' | '\\' | '\0' | ':' | '.' | ' ' | '\n' | '\t');
    vec![
        id.replace(unsafe_char, ""),
        id.replace(unsafe_char, "_"),
        id.replace(unsafe_char, "-"),
        id.replace("..", ""),
        id.to_lowercase(),
        id.to_uppercase(),
        id.chars().filter(char::is_ascii).collect(),
        id.chars().filter(|c| c.is_alphanumeric()).collect(),
        id.trim().to_owned(),
        format!("{id}/"),
        format!("/{id}"),
    ]
}

fn store() -> &'static EmbeddedStore {
    static STORE: OnceLock<(tempfile::TempDir, EmbeddedStore)> = OnceLock::new();
    &STORE
        .get_or_init(|| {
            let dir = tempfile::tempdir().expect("temp dir");
            let store = EmbeddedStore::open_sled(dir.path(), 16 << 20).expect("store opens");
            (dir, store)
        })
        .1
}

/// Runs a store future to its end (the properties are synchronous).
fn wait<T>(work: impl std::future::Future<Output = T>) -> T {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime")
        })
        .block_on(work)
}

fn conversation(store: &EmbeddedStore, principal: &str, id: &str) -> Option<ConversationMeta> {
    wait(store.conversation(ConversationKey::new(principal, id))).expect("read")
}

/// A principal no other case uses, so each case lists only its own conversations.
fn fresh_principal(base: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{base}#{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// One turn in each conversation, all at once (each id once).
fn write_conversations(store: &EmbeddedStore, principal: &str, ids: &[String]) {
    let turns = ids
        .iter()
        .map(|id| store_turn(store, principal, id, "x", None));
    wait(futures_util::future::join_all(turns));
}

fn listed_ids(store: &EmbeddedStore, principal: &str) -> Vec<String> {
    let page = wait(store.list_conversations(principal, 100_000, None)).expect("listing");
    assert!(page.next_page_token.is_empty(), "one page holds them all");
    assert_eq!(page.total_size, page.items.len());
    page.items.into_iter().map(|m| m.context_id).collect()
}

fn sorted(mut ids: Vec<String>) -> Vec<String> {
    ids.sort();
    ids
}

proptest! {
    #![proptest_config(proptest::test_runner::Config::with_cases(cases(512)))]

    /// Keys are equal exactly when (principal, contextId) pairs are.
    #[test]
    fn distinct_pairs_never_collide(
        pairs in prop::collection::vec((prop_oneof![Just(String::new()), tricky_id()], any_id()), 1..24)
    ) {
        let mut seen: HashMap<ConversationKey, (String, String)> = HashMap::new();
        for (principal, id) in pairs {
            let key = ConversationKey::new(&principal, &id);
            prop_assert_eq!(key, ConversationKey::new(&principal, &id), "keys are deterministic");
            if let Some(earlier) = seen.insert(key, (principal.clone(), id.clone())) {
                prop_assert_eq!(earlier, (principal, id), "two different pairs share a key");
            }
        }
    }

    /// An id and everything a sanitiser would turn it into are all different conversations,
    /// also when the principal absorbs the difference (`ab`+`c` vs `a`+`bc`).
    #[test]
    fn sanitiser_variants_and_field_shifts_are_apart(principal in tricky_id(), id in any_id()) {
        let key = ConversationKey::new(&principal, &id);
        for variant in sanitiser_variants(&id) {
            if variant != id {
                prop_assert_ne!(key, ConversationKey::new(&principal, &variant), "{:?} vs {:?}", id, variant);
            }
        }
        for cut in (0..=id.len()).filter(|at| id.is_char_boundary(*at)) {
            let (head, tail) = id.split_at(cut);
            let shifted = (format!("{principal}{head}"), tail.to_owned());
            if shifted != (principal.clone(), id.clone()) {
                prop_assert_ne!(key, ConversationKey::new(&shifted.0, &shifted.1));
            }
        }
    }
}

proptest! {
    #![proptest_config(proptest::test_runner::Config::with_cases(cases(96)))]

    /// Every id comes back from a real store exactly as written, under its own key only.
    #[test]
    fn ids_round_trip_through_the_store(
        ids in prop::collection::hash_set(any_id(), 1..16),
        base in tricky_id(),
    ) {
        let store = store();
        let ids: Vec<String> = ids.into_iter().collect();
        let mut all = ids.clone();
        for id in &ids {
            all.extend(sanitiser_variants(id));
        }
        let all: Vec<String> = all.into_iter().collect::<HashSet<_>>().into_iter().collect();
        let principal = fresh_principal(&base);
        write_conversations(store, &principal, &all);
        prop_assert_eq!(sorted(listed_ids(store, &principal)), sorted(all.clone()));
        for id in &all {
            let meta = conversation(store, &principal, id);
            prop_assert_eq!(meta.map(|m| m.context_id), Some(id.clone()));
        }
        // Another principal using the same ids sees none of them until it writes its own.
        let other = fresh_principal(&base);
        prop_assert!(listed_ids(store, &other).is_empty());
        for id in &all {
            prop_assert!(conversation(store, &other, id).is_none());
        }
    }
}

/// The ids the issue names, spelled out, plus a reopen: they survive a restart exactly.
#[test]
fn named_ids_and_generated_ids_survive_a_reopen() {
    let mut ids: Vec<String> = [
        "tenant/a", "tenanta", "tenant_a", "tenant-a", "Tenant/A", "TENANTA", "a/b", "ab", "a_b",
        "A/B", "a\\b", "a b", "a\0b", "a..b", "../ab", "./ab", "ab/", "/ab", "", " ", "\0", "..",
        "é", "e\u{301}",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut runner = TestRunner::deterministic();
    let strategy = any_id();
    for _ in 0..300 {
        ids.push(strategy.new_tree(&mut runner).expect("tree").current());
    }
    let ids: Vec<String> = ids
        .into_iter()
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let keys: BTreeMap<ConversationKey, &String> = ids
        .iter()
        .map(|id| (ConversationKey::new("p", id), id))
        .collect();
    assert_eq!(keys.len(), ids.len(), "no two ids share a key");

    let dir = tempfile::tempdir().expect("temp dir");
    {
        let store = EmbeddedStore::open_sled(dir.path(), 16 << 20).expect("store opens");
        write_conversations(&store, "p", &ids);
        wait(store.flush()).expect("flush");
    }
    let store = EmbeddedStore::open_sled(dir.path(), 16 << 20).expect("store reopens");
    assert_eq!(sorted(listed_ids(&store, "p")), sorted(ids.clone()));
    assert!(listed_ids(&store, "q").is_empty());
}

/// The case count: `PROPTEST_CASES` when set (for a long soak), else the suite's default.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}
