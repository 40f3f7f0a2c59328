//! Writes not yet checkpointed into the inner store, readable in key order.
//!
//! A turn writes the conversation's record and its task twice and moves their index entries;
//! kept here until the next checkpoint, those collapse to their last values, so the inner store
//! (sled, whose every write rewrites tree pages) sees a fraction of the writes.
//!
//! There are two tables: writers fill the active one while a checkpoint drains the frozen one
//! into the inner store; a checkpoint starts by swapping them, so it never holds up writers
//! for longer than the swap.

use crate::store::{KvOp, KvPair, StoreResult};
use crossbeam_skiplist::SkipMap;
use crossbeam_skiplist::map::Entry;
use std::cmp::Ordering;
use std::iter::Peekable;
use std::ops::Bound;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// A key and its latest write: its value, or None for deleted.
pub(super) type Pending<'a> = Entry<'a, Vec<u8>, Option<Vec<u8>>>;

#[derive(Default)]
pub(super) struct Memtable {
    map: SkipMap<Vec<u8>, Option<Vec<u8>>>,
    /// Bytes written since the table was last emptied (an upper bound on its size).
    bytes: AtomicUsize,
}

impl Memtable {
    pub(super) fn insert(&self, ops: Vec<KvOp>) {
        for op in ops {
            let (key, value) = match op {
                KvOp::Put(key, value) => (key, Some(value)),
                KvOp::Delete(key) => (key, None),
            };
            // Counts a key written twice twice: a lookup per write to be exact cost more than
            // the early checkpoint that overcounting may start.
            self.bytes.fetch_add(entry_bytes(&key, &value), Relaxed);
            self.map.insert(key, value);
        }
    }

    /// Some(value or None for deleted) when the key was written since the last checkpoint.
    pub(super) fn get(&self, key: &[u8]) -> Option<Option<Vec<u8>>> {
        self.map.get(key).map(|entry| entry.value().clone())
    }

    pub(super) fn bytes(&self) -> usize {
        self.bytes.load(Relaxed)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Every entry, to hand to the inner store.
    pub(super) fn entries(&self) -> impl Iterator<Item = Pending<'_>> {
        self.map.iter()
    }

    /// Removes up to `count` entries; false once the table is empty.
    pub(super) fn remove_some(&self, count: usize) -> bool {
        for _ in 0..count {
            if self.map.pop_front().is_none() {
                self.bytes.store(0, Relaxed);
                return false;
            }
        }
        true
    }

    /// This table's entries in range merged over `inner`'s; this table wins on equal keys.
    pub(super) fn merge<'a>(
        &'a self,
        from: Bound<Vec<u8>>,
        to: Bound<Vec<u8>>,
        reverse: bool,
        inner: Box<dyn Iterator<Item = StoreResult<KvPair>> + 'a>,
    ) -> Box<dyn Iterator<Item = StoreResult<KvPair>> + 'a> {
        let range = self.map.range((from, to));
        let own: Box<dyn Iterator<Item = Pending<'a>> + 'a> = if reverse {
            Box::new(range.rev())
        } else {
            Box::new(range)
        };
        Box::new(Merge {
            own: own.peekable(),
            inner: inner.peekable(),
            reverse,
        })
    }
}

fn entry_bytes(key: &[u8], value: &Option<Vec<u8>>) -> usize {
    key.len() + value.as_ref().map_or(0, Vec::len) + 64
}

struct Merge<'a> {
    own: Peekable<Box<dyn Iterator<Item = Pending<'a>> + 'a>>,
    inner: Peekable<Box<dyn Iterator<Item = StoreResult<KvPair>> + 'a>>,
    reverse: bool,
}

impl Iterator for Merge<'_> {
    type Item = StoreResult<KvPair>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let order = match (self.own.peek(), self.inner.peek()) {
                (None, None) => return None,
                (_, Some(Err(_))) | (None, Some(_)) => Ordering::Greater,
                (Some(_), None) => Ordering::Less,
                (Some(own), Some(Ok((key, _)))) => {
                    let order = own.key().as_slice().cmp(key.as_slice());
                    if self.reverse { order.reverse() } else { order }
                }
            };
            if order == Ordering::Greater {
                return self.inner.next();
            }
            if order == Ordering::Equal {
                self.inner.next();
            }
            let entry = self.own.next()?;
            if let Some(value) = entry.value() {
                return Some(Ok((entry.key().clone(), value.clone())));
            }
            // Deleted since the last checkpoint: hides the inner store's entry, if any.
        }
    }
}
