//! Writes not yet checkpointed into the inner store, readable in key order.
//!
//! A turn writes the conversation's record and its task twice and moves their index entries;
//! kept here until the next checkpoint, those collapse to their last values, so the inner store
//! (sled, whose every write rewrites tree pages) sees a fraction of the writes.
//!
//! Writers fill the active table; a checkpoint freezes it (a new one becomes active), writes the
//! frozen one into the inner store and then lets go of it. Readers hold the tables they started
//! with (`Arc`s), so a checkpoint never waits for a reader, and a reader never misses an entry:
//! the frozen table it holds outlives the checkpoint that moves it.

use crate::store::StoreResult;
use crate::store::embedded::kv::{KvOp, KvPair};
use parking_lot::RwLock;
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::iter::Peekable;
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// A key's latest write since the table was frozen: its value, or None for deleted.
type Slot = Option<Vec<u8>>;

/// A B-tree behind a reader-writer lock: one writer (the store thread) takes the write lock once
/// per batch; readers take the read lock per lookup or cursor step, never across a step. (A
/// lock-free skiplist was here before: its searches were a third of the store thread's time.)
#[derive(Default)]
pub(super) struct Memtable {
    map: RwLock<BTreeMap<Vec<u8>, Slot>>,
    /// Bytes written into the table (an upper bound on its size: a key written twice counts
    /// twice; a lookup per write to be exact would cost more than an early checkpoint).
    bytes: AtomicUsize,
}

impl Memtable {
    pub(super) fn insert(&self, ops: Vec<KvOp>) {
        let mut added = 0;
        let mut map = self.map.write();
        for op in ops {
            let (key, value) = match op {
                KvOp::Put(key, value) => (key, Some(value)),
                KvOp::Delete(key) => (key, None),
            };
            added += key.len() + value.as_ref().map_or(0, Vec::len) + 64;
            map.insert(key, value);
        }
        drop(map);
        self.bytes.fetch_add(added, Relaxed);
    }

    /// Some(value or None for deleted) when the table holds a write of the key.
    pub(super) fn get(&self, key: &[u8]) -> Option<Slot> {
        self.map.read().get(key).cloned()
    }

    pub(super) fn bytes(&self) -> usize {
        self.bytes.load(Relaxed)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.map.read().is_empty()
    }

    /// Every write, in key order, in chunks of at most `chunk`, to hand to the inner store.
    /// Each chunk takes the read lock once (a copy of one chunk at a time, not of the table).
    pub(super) fn writes(&self, chunk: usize) -> impl Iterator<Item = Vec<KvOp>> + '_ {
        let mut after: Option<Vec<u8>> = None;
        std::iter::from_fn(move || {
            let map = self.map.read();
            let from = after.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
            let ops: Vec<KvOp> = map
                .range::<[u8], _>((from, Bound::Unbounded))
                .take(chunk)
                .map(|(key, slot)| match slot {
                    Some(value) => KvOp::Put(key.clone(), value.clone()),
                    None => KvOp::Delete(key.clone()),
                })
                .collect();
            let last = ops.last().map(|op| match op {
                KvOp::Put(key, _) | KvOp::Delete(key) => key.clone(),
            })?;
            after = Some(last);
            Some(ops)
        })
    }
}

/// `table`'s entries in range merged over `under`; `table` wins on equal keys.
pub(super) fn merge<'a>(
    table: Arc<Memtable>,
    from: Bound<Vec<u8>>,
    to: Bound<Vec<u8>>,
    reverse: bool,
    under: Box<dyn Iterator<Item = StoreResult<KvPair>> + 'a>,
) -> Box<dyn Iterator<Item = StoreResult<KvPair>> + 'a> {
    let own = Cursor {
        table,
        from,
        to,
        reverse,
    };
    Box::new(Merge {
        own: own.peekable(),
        under: under.peekable(),
        reverse,
    })
}

/// Walks a table by key, one lookup per step: it owns its table rather than borrowing it.
struct Cursor {
    table: Arc<Memtable>,
    /// What is left to walk; the bound on the walking side moves past each entry returned.
    from: Bound<Vec<u8>>,
    to: Bound<Vec<u8>>,
    reverse: bool,
}

impl Iterator for Cursor {
    type Item = (Vec<u8>, Slot);

    fn next(&mut self) -> Option<Self::Item> {
        let (key, slot) = {
            let map = self.table.map.read();
            let bounds = (
                self.from.as_ref().map(Vec::as_slice),
                self.to.as_ref().map(Vec::as_slice),
            );
            let mut range = map.range::<[u8], _>(bounds);
            let (key, slot) = if self.reverse {
                range.next_back()
            } else {
                range.next()
            }?;
            (key.clone(), slot.clone())
        };
        let past = Bound::Excluded(key.clone());
        if self.reverse {
            self.to = past;
        } else {
            self.from = past;
        }
        Some((key, slot))
    }
}

struct Merge<'a> {
    own: Peekable<Cursor>,
    under: Peekable<Box<dyn Iterator<Item = StoreResult<KvPair>> + 'a>>,
    reverse: bool,
}

impl Iterator for Merge<'_> {
    type Item = StoreResult<KvPair>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let order = match (self.own.peek(), self.under.peek()) {
                (None, None) => return None,
                (_, Some(Err(_))) | (None, Some(_)) => Ordering::Greater,
                (Some(_), None) => Ordering::Less,
                (Some((own, _)), Some(Ok((key, _)))) => {
                    let order = own.cmp(key);
                    if self.reverse { order.reverse() } else { order }
                }
            };
            if order == Ordering::Greater {
                return self.under.next();
            }
            if order == Ordering::Equal {
                self.under.next();
            }
            let (key, slot) = self.own.next()?;
            if let Some(value) = slot {
                return Some(Ok((key, value)));
            }
            // Deleted since the table was started: hides the entry underneath, if any.
        }
    }
}
