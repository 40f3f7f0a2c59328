//! The store on its own: namespace versions, ordering, pagination, durability.

use colloquy::model::{Message, Part, Role};
use colloquy::store::{
    ConversationKey, ConversationMeta, KvBackend, KvOp, NAMESPACE_VERSION, SledBackend, Store,
    WriteBatch,
};
use std::sync::Arc;

fn message(text: &str) -> Message {
    Message {
        message_id: text.to_owned(),
        role: Role::User,
        parts: vec![Part::text(text)],
        context_id: None,
        task_id: None,
        reference_task_ids: Vec::new(),
        metadata: None,
        extensions: Vec::new(),
        timestamp: None,
    }
}

#[tokio::test]
async fn keys_of_another_namespace_version_are_never_loaded_or_listed() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Arc::new(SledBackend::open(dir.path(), 1 << 20).unwrap());
    let store = Store::new(backend.clone()).unwrap();
    let meta = ConversationMeta::new("p", "current");
    let mut batch = WriteBatch::new();
    batch.put_conversation(&meta, None);
    batch.append_message(&meta.key(), 0, &message("hello"));
    store.apply(batch).unwrap();
    store.durable().await.unwrap();

    // Copy every record of that conversation under a key of another namespace version.
    let current = *meta.key().as_bytes();
    let mut forged = current;
    forged[0] = NAMESPACE_VERSION + 1;
    let mut copies = Vec::new();
    for entry in backend.scan(
        std::ops::Bound::Unbounded,
        std::ops::Bound::Unbounded,
        false,
    ) {
        let (key, value) = entry.unwrap();
        if let Some(at) = key.windows(current.len()).position(|w| w == current) {
            let mut other = key.clone();
            other[at..at + current.len()].copy_from_slice(&forged);
            copies.push(KvOp::Put(other, value));
        }
    }
    assert!(
        copies.len() >= 3,
        "meta, message and listing entry were copied"
    );
    backend.apply(copies).unwrap();

    assert!(
        ConversationKey::from_bytes(&forged).is_none(),
        "not a key of this version"
    );
    let listed = store.list_conversations("p", 10, None).unwrap();
    assert_eq!(
        listed.items.len(),
        1,
        "only the current version's conversation is listed"
    );
    assert_eq!(listed.total_size, 1);
    assert_eq!(store.recent_messages(&meta.key(), 1, 10).unwrap().len(), 1);
}

#[tokio::test]
async fn recent_messages_are_the_last_n_in_order_and_pages_cover_everything_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_sled(dir.path(), 1 << 20).unwrap();
    let meta = ConversationMeta::new("p", "long");
    let mut batch = WriteBatch::new();
    for seq in 0..1000u64 {
        batch.append_message(&meta.key(), seq, &message(&format!("m{seq}")));
    }
    store.apply(batch).unwrap();
    let last: Vec<String> = store
        .recent_messages(&meta.key(), 1000, 3)
        .unwrap()
        .into_iter()
        .map(|(_, m)| m.text())
        .collect();
    assert_eq!(last, ["m997", "m998", "m999"]);

    for i in 0..25 {
        let mut meta = ConversationMeta::new("pager", &format!("c{i:02}"));
        meta.updated_at =
            chrono::DateTime::from_timestamp_millis(1_700_000_000_000 + i * 1000).unwrap();
        let mut batch = WriteBatch::new();
        batch.put_conversation(&meta, None);
        store.apply(batch).unwrap();
    }
    let mut token: Option<String> = None;
    let mut seen = Vec::new();
    loop {
        let page = store
            .list_conversations("pager", 10, token.as_deref())
            .unwrap();
        assert_eq!(page.total_size, 25);
        seen.extend(page.items.into_iter().map(|m| m.context_id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = Some(page.next_page_token);
    }
    let expected: Vec<String> = (0..25).rev().map(|i| format!("c{i:02}")).collect();
    assert_eq!(seen, expected, "newest first, each once");
    assert!(
        store
            .list_conversations("pager", 10, Some("not-hex"))
            .is_err()
    );
}

#[tokio::test]
async fn acknowledged_writes_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open_sled(dir.path(), 1 << 20).unwrap();
        let writers = (0..64).map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let meta = ConversationMeta::new("p", &format!("w{i}"));
                let mut batch = WriteBatch::new();
                batch.put_conversation(&meta, None);
                batch.append_message(&meta.key(), 0, &message(&format!("from {i}")));
                store.apply(batch).unwrap();
                store.durable().await.unwrap();
            })
        });
        for writer in futures_util::future::join_all(writers).await {
            writer.unwrap();
        }
    }
    let store = Store::open_sled(dir.path(), 1 << 20).unwrap();
    for i in 0..64 {
        let key = ConversationKey::new("p", &format!("w{i}"));
        let messages = store.recent_messages(&key, 1, 5).unwrap();
        assert_eq!(messages.len(), 1);
        assert_eq!(messages[0].1.text(), format!("from {i}"));
    }
}
