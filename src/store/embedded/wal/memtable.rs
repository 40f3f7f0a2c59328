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
use crossbeam_skiplist::SkipMap;
use std::cmp::Ordering;
use std::iter::Peekable;
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// A key's latest write since the table was frozen: its value, or None for deleted.
type Slot = Option<Vec<u8>>;

/// A lock-free skiplist. (A B-tree behind a reader-writer lock was tried on 2026-11-30: 5% fewer
/// instructions per turn, but sled then failed to reopen in about one power-cut test run in
/// five. That failure was later traced to sled itself (its log buffers were not durably synced
/// before reuse; fixed in the vendored sled, vendor/sled/COLLOQUY.md), so the B-tree is worth
/// measuring again: the skiplist's searches are about 38k instructions of a turn now,
/// docs/architecture.md.)
#[derive(Default)]
pub(super) struct Memtable {
    map: SkipMap<Vec<u8>, Slot>,
    /// Bytes written into the table (an upper bound on its size: a key written twice counts
    /// twice; a lookup per write to be exact would cost more than an early checkpoint).
    bytes: AtomicUsize,
}

impl Memtable {
    pub(super) fn insert(&self, ops: Vec<KvOp>) {
        for op in ops {
            let (key, value) = split(op);
            self.bytes.fetch_add(entry_bytes(&key, &value), Relaxed);
            self.map.insert(key, value);
        }
    }

    /// Some(value or None for deleted) when the table holds a write of the key.
    pub(super) fn get(&self, key: &[u8]) -> Option<Slot> {
        self.map.get(key).map(|entry| entry.value().clone())
    }

    pub(super) fn bytes(&self) -> usize {
        self.bytes.load(Relaxed)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Every write, in key order, to hand to the inner store.
    pub(super) fn writes(&self) -> impl Iterator<Item = KvOp> + '_ {
        self.map.iter().map(|entry| match entry.value() {
            Some(value) => KvOp::Put(entry.key().clone(), value.clone()),
            None => KvOp::Delete(entry.key().clone()),
        })
    }
}

/// Writes gathered by one thread (replaying the log) into a memtable built in key order at
/// the end: a skiplist filled in key order finds each place in cache, several times faster
/// than filling it in log order.
#[derive(Default)]
pub(super) struct Collecting {
    map: std::collections::BTreeMap<Vec<u8>, Slot>,
    bytes: usize,
}

impl Collecting {
    pub(super) fn insert(&mut self, ops: Vec<KvOp>) {
        for op in ops {
            let (key, value) = split(op);
            self.bytes += entry_bytes(&key, &value);
            self.map.insert(key, value);
        }
    }

    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    pub(super) fn into_memtable(self) -> Memtable {
        let table = Memtable {
            map: SkipMap::new(),
            bytes: AtomicUsize::new(self.bytes),
        };
        for (key, value) in self.map {
            table.map.insert(key, value);
        }
        table
    }
}

fn split(op: KvOp) -> (Vec<u8>, Slot) {
    match op {
        KvOp::Put(key, value) => (key, Some(value)),
        KvOp::Delete(key) => (key, None),
    }
}

/// What [`Memtable::bytes`] counts for a write.
fn entry_bytes(key: &[u8], value: &Slot) -> usize {
    key.len() + value.as_ref().map_or(0, Vec::len) + 64
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
        let mut range = self.table.map.range((self.from.clone(), self.to.clone()));
        let entry = if self.reverse {
            range.next_back()
        } else {
            range.next()
        }?;
        let key = entry.key().clone();
        let past = Bound::Excluded(key.clone());
        if self.reverse {
            self.to = past;
        } else {
            self.from = past;
        }
        Some((key, entry.value().clone()))
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
