//! Writes not yet checkpointed into the inner store, readable in key order.
//!
//! A turn writes the conversation's record and its task twice and moves their index entries;
//! kept here until the next checkpoint, those collapse to their last values, so the inner store
//! (sled, whose every write rewrites tree pages) sees a fraction of the writes. The index
//! entries a turn's start creates for a new task and its end deletes leave nothing at all
//! ([`KvOp::Create`]): 234.3k / 234.5k instructions a turn against 237.1k / 237.7k, the run's
//! first checkpoint included (`CHECKPOINT_MS=1000 TOTAL=1024 benches/callgrind_turns.sh`,
//! 2026-12-06, when the count stopped with the load); nor does
//! the conversation's index entry that a start moves and its end moves again: 230.2k / 228.4k
//! against 233.3k / 233.2k (the same command, the same day).
//!
//! Writers fill the active table; a checkpoint freezes it (a new one becomes active), writes the
//! frozen one into the inner store and then lets go of it. Readers hold the tables they started
//! with (`Arc`s), so a checkpoint never waits for a reader, and a reader never misses an entry:
//! the frozen table it holds outlives the checkpoint that moves it.

use crate::store::StoreResult;
use crate::store::embedded::kv::{KvOp, KvPair};
use parking_lot::RwLock;
use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::{BTreeMap, btree_map};
use std::iter::Peekable;
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// A key's latest write since the table was frozen: its value, or None for deleted.
type Slot = Option<Vec<u8>>;

/// A key with its first 16 bytes kept beside it as a number, in the same order as the bytes:
/// a step down the tree compares two numbers and reads the key's bytes only where those are
/// equal (keys of one principal's indexes), where comparing the bytes called `memcmp` at every
/// step, about 18 a write.
#[derive(Clone, PartialEq, Eq)]
struct TableKey {
    head: u128,
    bytes: Vec<u8>,
}

impl TableKey {
    fn new(bytes: Vec<u8>) -> Self {
        let mut head = [0u8; 16];
        let len = bytes.len().min(head.len());
        head[..len].copy_from_slice(&bytes[..len]);
        TableKey {
            head: u128::from_be_bytes(head),
            bytes,
        }
    }
}

/// The bytes' order: heads padded with zeros order as the bytes do (a key that ends within
/// its head pads with zeros, below any byte a longer key has there), and equal heads fall
/// back to the bytes. So lookups by `&[u8]` (`Borrow`) find the same entries.
impl Ord for TableKey {
    fn cmp(&self, other: &Self) -> Ordering {
        self.head
            .cmp(&other.head)
            .then_with(|| self.bytes.cmp(&other.bytes))
    }
}

impl PartialOrd for TableKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Borrow<[u8]> for TableKey {
    fn borrow(&self) -> &[u8] {
        &self.bytes
    }
}

/// What the table holds of a key.
struct Entry {
    slot: Slot,
    /// First written here by a [`KvOp::Create`]: no older table nor the inner store holds the
    /// key, so a delete removes the entry rather than writing one through.
    created: bool,
}

/// A B-tree behind a reader-writer lock: one write lock a batch (the store thread is the only
/// writer), a read lock a lookup or a cursor step. (A lock-free skiplist came first; its
/// searches cost about 38k instructions a turn, a `memcmp` call a step down its levels. The
/// B-tree was tried on 2026-11-30 and set aside when sled then failed to reopen in about one
/// power-cut test run in five; that failure was later traced to sled itself, its log buffers
/// not durably synced before reuse, fixed in the vendored sled: vendor/sled/COLLOQUY.md.)
#[derive(Default)]
pub(super) struct Memtable {
    map: RwLock<BTreeMap<TableKey, Entry>>,
    /// Bytes written into the table (an upper bound on its size: a key written twice counts
    /// twice; a lookup per write to be exact would cost more than an early checkpoint).
    bytes: AtomicUsize,
}

impl Memtable {
    pub(super) fn insert(&self, ops: Vec<KvOp>) {
        let mut bytes = 0;
        let mut map = self.map.write();
        for op in ops {
            let created = matches!(op, KvOp::Create(..));
            let (key, slot) = op.into_parts();
            bytes += entry_bytes(&key, &slot);
            match map.entry(TableKey::new(key)) {
                btree_map::Entry::Occupied(mut entry) => {
                    if slot.is_none() && entry.get().created {
                        entry.remove();
                    } else {
                        entry.get_mut().slot = slot;
                    }
                }
                btree_map::Entry::Vacant(entry) => {
                    entry.insert(Entry { slot, created });
                }
            }
        }
        drop(map);
        self.bytes.fetch_add(bytes, Relaxed);
    }

    /// Some(value or None for deleted) when the table holds a write of the key.
    pub(super) fn get(&self, key: &[u8]) -> Option<Slot> {
        self.map.read().get(key).map(|entry| entry.slot.clone())
    }

    pub(super) fn bytes(&self) -> usize {
        self.bytes.load(Relaxed)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.map.read().is_empty()
    }

    /// The next writes in key order after the key `after` (from the first when None), at most
    /// `count` of them and no more once they hold `bytes` (as [`Memtable::bytes`] counts them;
    /// at least one write), to hand to the inner store a slice at a time: the read lock is
    /// held for one slice, and only one slice is copied out at once.
    pub(super) fn writes_after(
        &self,
        after: Option<&[u8]>,
        count: usize,
        bytes: usize,
    ) -> Vec<KvOp> {
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        let map = self.map.read();
        let mut held = 0;
        map.range::<[u8], _>((from, Bound::Unbounded))
            .take(count)
            .take_while(|(key, entry)| {
                let more = held < bytes;
                held += entry_bytes(&key.bytes, &entry.slot);
                more
            })
            .map(|(key, entry)| match &entry.slot {
                Some(value) => KvOp::Put(key.bytes.clone(), value.clone()),
                None => KvOp::Delete(key.bytes.clone()),
            })
            .collect()
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
        if holds_nothing(&self.from, &self.to) {
            // `BTreeMap::range` panics on such bounds (a cursor's moved past its end, or a
            // caller's empty range): there is nothing to find.
            return None;
        }
        let (key, slot) = {
            let map = self.table.map.read();
            let bounds = (
                self.from.as_ref().map(Vec::as_slice),
                self.to.as_ref().map(Vec::as_slice),
            );
            let mut range = map.range::<[u8], _>(bounds);
            let (key, entry) = if self.reverse {
                range.next_back()
            } else {
                range.next()
            }?;
            (key.bytes.clone(), entry.slot.clone())
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

/// Whether no key lies between the bounds: the start past the end, or both at one key with
/// either side excluded.
fn holds_nothing(from: &Bound<Vec<u8>>, to: &Bound<Vec<u8>>) -> bool {
    use Bound::{Excluded, Included};
    match (from, to) {
        (Included(start) | Excluded(start), Included(end) | Excluded(end)) => {
            start > end || (start == end && !matches!((from, to), (Included(_), Included(_))))
        }
        _ => false,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn table(keys: &[&[u8]]) -> Arc<Memtable> {
        let table = Memtable::default();
        table.insert(
            keys.iter()
                .map(|key| KvOp::Put(key.to_vec(), b"v".to_vec()))
                .collect(),
        );
        Arc::new(table)
    }

    fn walk(
        table: &Arc<Memtable>,
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        reverse: bool,
    ) -> Vec<Vec<u8>> {
        let cursor = Cursor {
            table: table.clone(),
            from: from.map(<[u8]>::to_vec),
            to: to.map(<[u8]>::to_vec),
            reverse,
        };
        cursor.map(|(key, _)| key).collect()
    }

    #[test]
    fn keys_order_as_their_bytes_do() {
        let keys: Vec<&[u8]> = vec![
            b"",
            b"\0",
            b"a",
            b"a\0",
            b"a\0\0",
            b"ab",
            b"abcdefghijklmnop",
            b"abcdefghijklmnop\0",
            b"abcdefghijklmnopq",
            b"abcdefghijklmnoq",
            b"b",
            b"\xff\xff",
        ];
        for a in &keys {
            for b in &keys {
                let (ka, kb) = (TableKey::new(a.to_vec()), TableKey::new(b.to_vec()));
                assert_eq!(ka.cmp(&kb), a.cmp(b), "{a:?} against {b:?}");
            }
        }
    }

    #[test]
    fn a_cursor_walks_its_range_either_way() {
        let t = table(&[b"a", b"b", b"c", b"d"]);
        let keys = |list: &[&[u8]]| list.iter().map(|k| k.to_vec()).collect::<Vec<_>>();
        use Bound::{Excluded, Included, Unbounded};
        assert_eq!(
            walk(&t, Included(b"b"), Excluded(b"d"), false),
            keys(&[b"b", b"c"])
        );
        assert_eq!(
            walk(&t, Included(b"b"), Excluded(b"d"), true),
            keys(&[b"c", b"b"])
        );
        assert_eq!(
            walk(&t, Unbounded, Unbounded, true),
            keys(&[b"d", b"c", b"b", b"a"])
        );
        assert_eq!(
            walk(&t, Included(b"c"), Included(b"c"), false),
            keys(&[b"c"])
        );
    }

    #[test]
    fn writes_come_out_in_slices_in_key_order_deletes_included() {
        let t = table(&[b"c", b"a", b"d", b"b", b"e"]);
        t.insert(vec![KvOp::Delete(b"b".to_vec())]);
        let mut seen = Vec::new();
        let mut last: Option<Vec<u8>> = None;
        loop {
            let slice = t.writes_after(last.as_deref(), 2, usize::MAX);
            let Some(op) = slice.last() else {
                break;
            };
            assert!(slice.len() <= 2);
            last = Some(op.key().to_vec());
            seen.extend(slice);
        }
        let seen: Vec<(Vec<u8>, Slot)> = seen.into_iter().map(KvOp::into_parts).collect();
        let put = |k: &[u8]| (k.to_vec(), Some(b"v".to_vec()));
        let expected = vec![
            put(b"a"),
            (b"b".to_vec(), None),
            put(b"c"),
            put(b"d"),
            put(b"e"),
        ];
        assert_eq!(seen, expected);
    }

    #[test]
    fn a_slice_stops_once_it_holds_its_bytes() {
        let t = Memtable::default();
        t.insert(
            [b"a", b"b", b"c"]
                .iter()
                .map(|k| KvOp::Put(k.to_vec(), vec![0; 1000]))
                .collect(),
        );
        let keys = |slice: Vec<KvOp>| slice.iter().map(|op| op.key().to_vec()).collect::<Vec<_>>();
        let one = entry_bytes(b"a", &Some(vec![0; 1000]));
        assert_eq!(
            keys(t.writes_after(None, 10, one + 1)),
            [b"a".to_vec(), b"b".to_vec()]
        );
        assert_eq!(keys(t.writes_after(None, 10, one)), [b"a".to_vec()]);
        assert_eq!(
            keys(t.writes_after(None, 10, 1)),
            [b"a".to_vec()],
            "at least one"
        );
        assert_eq!(
            keys(t.writes_after(Some(b"a"), 1, usize::MAX)),
            [b"b".to_vec()]
        );
    }

    #[test]
    fn a_created_key_deleted_leaves_nothing_to_write_through() {
        let t = Memtable::default();
        t.insert(vec![
            KvOp::Create(b"new".to_vec(), b"1".to_vec()),
            KvOp::Put(b"old".to_vec(), b"1".to_vec()),
        ]);
        t.insert(vec![KvOp::Put(b"new".to_vec(), b"2".to_vec())]);
        assert_eq!(t.get(b"new"), Some(Some(b"2".to_vec())), "still a value");
        t.insert(vec![
            KvOp::Delete(b"new".to_vec()),
            KvOp::Delete(b"old".to_vec()),
        ]);
        assert_eq!(t.get(b"new"), None, "no write of it at all");
        assert_eq!(
            t.get(b"old"),
            Some(None),
            "deleted: the store below may hold it"
        );
        let writes: Vec<(Vec<u8>, Slot)> = t
            .writes_after(None, 10, usize::MAX)
            .into_iter()
            .map(KvOp::into_parts)
            .collect();
        assert_eq!(writes, vec![(b"old".to_vec(), None)]);
        // A creation over a key the table already wrote is a put: the key may be below.
        t.insert(vec![KvOp::Create(b"old".to_vec(), b"3".to_vec())]);
        t.insert(vec![KvOp::Delete(b"old".to_vec())]);
        assert_eq!(t.get(b"old"), Some(None));
    }

    #[test]
    fn bounds_that_hold_nothing_walk_nothing_rather_than_panic() {
        let t = table(&[b"a", b"b", b"c"]);
        use Bound::{Excluded, Included};
        for reverse in [false, true] {
            assert!(walk(&t, Included(b"c"), Included(b"a"), reverse).is_empty());
            assert!(walk(&t, Excluded(b"b"), Excluded(b"b"), reverse).is_empty());
            assert!(walk(&t, Included(b"b"), Excluded(b"b"), reverse).is_empty());
            assert!(walk(&t, Excluded(b"b"), Included(b"b"), reverse).is_empty());
        }
    }
}
