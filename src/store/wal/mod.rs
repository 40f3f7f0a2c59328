//! A write-ahead log and memtables in front of a backend whose own writes and flushes are
//! expensive.
//!
//! sled makes a flush durable by handing it to its I/O thread pool and waiting, and every write
//! rewrites tree pages (about 30 KiB written to disk per turn); under many small acknowledged
//! writes that, not the disk, was most of colloquy's CPU. Here:
//! - [`KvBackend::apply`] gives the batch the next sequence number, appends it to the log buffer
//!   and puts its writes in the active memtable, which reads consult before the inner backend;
//! - [`KvBackend::flush`] writes the buffer and `fdatasync`s it on the calling (store) thread;
//! - a checkpoint thread, about once a second, swaps the memtables and writes the frozen one
//!   into the inner backend (a key written many times in that second is written once), flushes
//!   it, empties the frozen memtable and deletes the log segments it now covers.
//!
//! Once a checkpoint's writes are durable in the inner backend, it stores the sequence number
//! of the last batch they cover under [`APPLIED_KEY`]. Opening replays, in order, the logged
//! batches after that number: every key they write ends as the log says, whatever part of an
//! interrupted checkpoint reached the inner backend. So every acknowledged (logged and synced)
//! batch is there after a crash, in order.

mod log;
mod memtable;

use super::{KvBackend, KvOp, KvPair, StoreError, StoreResult};
use log::SegmentFiles;
use memtable::Memtable;
use parking_lot::{Condvar, Mutex, RwLock};
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Where the inner backend keeps the sequence number of the last batch applied to it.
pub const APPLIED_KEY: &[u8] = b"zwal-applied";

/// How often the memtable moves into the inner backend. Bounds both the memtable and the log
/// replayed at start-up after a crash to about this much writing.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);
/// Writes handed to the inner backend at a time when checkpointing.
const INNER_BATCH_OPS: usize = 128;
/// A memtable this large starts a checkpoint early...
const MEMTABLE_SOFT_LIMIT: usize = 64 << 20;
/// ...and one this large makes writers wait for it (the inner backend is not keeping up).
const MEMTABLE_HARD_LIMIT: usize = 256 << 20;

pub struct WalBackend<B: KvBackend> {
    shared: Arc<Shared<B>>,
    checkpointer: Option<JoinHandle<()>>,
}

struct Shared<B> {
    inner: B,
    /// The active memtable (writers fill it) and the frozen one (a checkpoint drains it);
    /// `active` picks which is which and changes only under the `pending` lock.
    tables: [Memtable; 2],
    active: AtomicUsize,
    /// Logged but not yet written. Held while applying, so log order is apply order.
    pending: Mutex<Pending>,
    /// Held while writing and syncing, so a flush that starts later finds earlier ones done.
    segments: Mutex<SegmentFiles>,
    /// Reads hold it shared; a checkpoint takes it to empty the frozen memtable, so a read
    /// never misses an entry moving from a memtable into the inner backend.
    moving: RwLock<()>,
    checkpoints: Mutex<Checkpoints>,
    checkpoint_wake: Condvar,
    checkpoint_done: Condvar,
}

struct Pending {
    buffer: Vec<u8>,
    spare: Vec<u8>,
    /// Sequence number of the last batch applied.
    last_seq: u64,
}

#[derive(Default)]
struct Checkpoints {
    completed: u64,
    requested: bool,
    stop: bool,
    /// A frozen memtable a failed checkpoint left, with the last batch it holds: drained again
    /// before anything else is frozen.
    unfinished: Option<u64>,
}

impl<B: KvBackend> WalBackend<B> {
    /// Opens the log in `dir` over `inner`, replaying what the inner backend missed.
    pub fn open(inner: B, dir: &Path) -> StoreResult<Self> {
        std::fs::create_dir_all(dir).map_err(|e| log::io_error("creating", dir, e))?;
        let last_seq = recover(&inner, dir)?;
        let segments = SegmentFiles::create(dir, last_seq)?;
        // The replayed segments are in the inner backend once it is flushed.
        inner.flush()?;
        segments.remove_older()?;
        let shared = Arc::new(Shared {
            inner,
            tables: Default::default(),
            active: AtomicUsize::new(0),
            pending: Mutex::new(Pending {
                buffer: Vec::new(),
                spare: Vec::new(),
                last_seq,
            }),
            segments: Mutex::new(segments),
            moving: RwLock::new(()),
            checkpoints: Mutex::new(Checkpoints::default()),
            checkpoint_wake: Condvar::new(),
            checkpoint_done: Condvar::new(),
        });
        let checkpointer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("colloquy-checkpoint".into())
                .spawn(move || shared.run_checkpoints())
                .map_err(|e| {
                    StoreError::Backend(format!("cannot start the checkpoint thread: {e}"))
                })?
        };
        Ok(WalBackend {
            shared,
            checkpointer: Some(checkpointer),
        })
    }
}

impl<B: KvBackend> Shared<B> {
    /// The tables newest first: the active one, then the frozen one.
    fn tables(&self) -> [&Memtable; 2] {
        let active = self.active.load(Ordering::Acquire);
        [&self.tables[active], &self.tables[1 - active]]
    }

    fn apply(&self, mut ops: Vec<KvOp>) {
        if self.tables()[0].bytes() > MEMTABLE_SOFT_LIMIT {
            self.wait_for_room();
        }
        let mut pending = self.pending.lock();
        let seq = pending.last_seq + 1;
        // Replay sets the inner backend's position with the batch; the memtable needs no copy.
        ops.push(applied(seq));
        log::encode_record(&mut pending.buffer, seq, &ops);
        ops.pop();
        self.tables()[0].insert(ops);
        pending.last_seq = seq;
        metrics::counter!("colloquy_store_writes_total").increment(1);
    }

    /// Asks for an early checkpoint; waits for one when the memtable is past its hard limit.
    fn wait_for_room(&self) {
        let mut checkpoints = self.checkpoints.lock();
        checkpoints.requested = true;
        self.checkpoint_wake.notify_one();
        while self.tables()[0].bytes() > MEMTABLE_HARD_LIMIT && !checkpoints.stop {
            let seen = checkpoints.completed;
            while checkpoints.completed == seen && !checkpoints.stop {
                self.checkpoint_done.wait(&mut checkpoints);
            }
        }
    }

    fn flush(&self) -> StoreResult<()> {
        let mut segments = self.segments.lock();
        let (records, last_seq) = {
            let mut pending = self.pending.lock();
            let spare = std::mem::take(&mut pending.spare);
            (
                std::mem::replace(&mut pending.buffer, spare),
                pending.last_seq,
            )
        };
        let written = if records.is_empty() {
            Ok(())
        } else {
            segments.append(&records, last_seq)
        };
        let mut records = records;
        records.clear();
        self.pending.lock().spare = records;
        written
    }

    /// Moves a memtable into the inner backend and deletes the log segments it then covers.
    fn checkpoint(&self, unfinished: Option<u64>) -> Result<(), (u64, StoreError)> {
        let covered = match unfinished {
            Some(covered) => covered,
            None => self.freeze()?,
        };
        self.drain_frozen(covered).map_err(|e| (covered, e))?;
        self.segments.lock().remove_covered(covered);
        Ok(())
    }

    /// Swaps the memtables at a consistent cut of batches and returns the cut's last. Once
    /// swapped, the frozen table must be drained even if logging fails here: the error
    /// carries the cut.
    fn freeze(&self) -> Result<u64, (u64, StoreError)> {
        let mut segments = self.segments.lock();
        let (records, covered) = {
            let mut pending = self.pending.lock();
            // The frozen table is empty (the last checkpoint drained it): it becomes active.
            self.active.fetch_xor(1, Ordering::AcqRel);
            (std::mem::take(&mut pending.buffer), pending.last_seq)
        };
        // Every batch of the cut is logged before any of it reaches the inner backend.
        if !records.is_empty() {
            segments
                .append(&records, covered)
                .map_err(|e| (covered, e))?;
        }
        segments.rotate().map_err(|e| (covered, e))?;
        Ok(covered)
    }

    fn drain_frozen(&self, covered: u64) -> StoreResult<()> {
        let frozen = self.tables()[1];
        if frozen.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        let mut moved = 0;
        let mut slice = Vec::with_capacity(INNER_BATCH_OPS);
        // One write at a time: sled's atomic batches lock its readers out. A crash part way
        // leaves the old position, and recovery replays every batch of the cut from the log.
        for entry in frozen.entries() {
            slice.push(match entry.value() {
                Some(value) => KvOp::Put(entry.key().clone(), value.clone()),
                None => KvOp::Delete(entry.key().clone()),
            });
            if slice.len() == INNER_BATCH_OPS {
                moved += slice.len();
                self.inner.apply_each(std::mem::take(&mut slice))?;
            }
        }
        moved += slice.len();
        self.inner.apply_each(slice)?;
        self.inner.flush()?;
        // Only once the cut is durable in the inner backend may its position say so.
        self.inner.apply(vec![applied(covered)])?;
        self.inner.flush()?;
        loop {
            let _no_reads = self.moving.write();
            if !frozen.remove_some(INNER_BATCH_OPS) {
                break;
            }
        }
        metrics::histogram!("colloquy_store_checkpoint_seconds").record(started.elapsed());
        metrics::counter!("colloquy_store_checkpoint_writes_total").increment(moved as u64);
        Ok(())
    }

    fn run_checkpoints(&self) {
        loop {
            let stopping = {
                let mut checkpoints = self.checkpoints.lock();
                if !checkpoints.requested && !checkpoints.stop {
                    self.checkpoint_wake
                        .wait_for(&mut checkpoints, CHECKPOINT_EVERY);
                }
                checkpoints.requested = false;
                checkpoints.stop
            };
            let unfinished = self.checkpoints.lock().unfinished.take();
            let failed = self.checkpoint(unfinished).err().map(|(covered, e)| {
                tracing::error!(error = %e, "store checkpoint failed; the log keeps everything since the last one");
                covered
            });
            let mut checkpoints = self.checkpoints.lock();
            checkpoints.unfinished = failed;
            checkpoints.completed += 1;
            self.checkpoint_done.notify_all();
            if stopping {
                return;
            }
        }
    }
}

impl<B: KvBackend> Drop for WalBackend<B> {
    fn drop(&mut self) {
        // A last flush and checkpoint: a clean stop leaves no log to replay.
        if let Err(e) = self.shared.flush() {
            tracing::error!(error = %e, "final write-ahead log flush failed");
        }
        self.shared.checkpoints.lock().stop = true;
        self.shared.checkpoint_wake.notify_all();
        if let Some(checkpointer) = self.checkpointer.take() {
            let _ = checkpointer.join();
        }
    }
}

impl<B: KvBackend> KvBackend for WalBackend<B> {
    fn get(&self, key: &[u8]) -> StoreResult<Option<Vec<u8>>> {
        // An entry leaves the memtables only after the inner backend has it.
        let _guard = self.shared.moving.read_recursive();
        for table in self.shared.tables() {
            if let Some(value) = table.get(key) {
                return Ok(value);
            }
        }
        self.shared.inner.get(key)
    }

    fn apply(&self, ops: Vec<KvOp>) -> StoreResult<()> {
        self.shared.apply(ops);
        Ok(())
    }

    fn scan<'a>(
        &'a self,
        from: Bound<Vec<u8>>,
        to: Bound<Vec<u8>>,
        reverse: bool,
    ) -> Box<dyn Iterator<Item = StoreResult<KvPair>> + 'a> {
        let guard = self.shared.moving.read_recursive();
        let inner = self.shared.inner.scan(from.clone(), to.clone(), reverse);
        let [active, frozen] = self.shared.tables();
        let merged = frozen.merge(from.clone(), to.clone(), reverse, inner);
        let merged = active.merge(from, to, reverse, merged);
        Box::new(Guarded {
            _guard: guard,
            items: merged,
        })
    }

    fn flush(&self) -> StoreResult<()> {
        self.shared.flush()
    }

    fn size_on_disk(&self) -> StoreResult<u64> {
        let log = self.shared.segments.lock().size_on_disk()?;
        Ok(self.shared.inner.size_on_disk()? + log)
    }
}

fn applied(seq: u64) -> KvOp {
    KvOp::Put(APPLIED_KEY.to_vec(), seq.to_le_bytes().to_vec())
}

/// A scan holding off the moves of memtable entries until it is dropped.
struct Guarded<'a, I> {
    _guard: parking_lot::RwLockReadGuard<'a, ()>,
    items: I,
}

impl<I: Iterator> Iterator for Guarded<'_, I> {
    type Item = I::Item;

    fn next(&mut self) -> Option<I::Item> {
        self.items.next()
    }
}

/// Replays logged batches newer than the inner backend's; returns the last sequence number.
fn recover<B: KvBackend>(inner: &B, dir: &Path) -> StoreResult<u64> {
    let applied = match inner.get(APPLIED_KEY)? {
        Some(bytes) => u64::from_le_bytes(
            bytes
                .as_slice()
                .try_into()
                .map_err(|_| StoreError::Corrupt("write-ahead log position".into()))?,
        ),
        None => 0,
    };
    let mut last_seq = applied;
    let mut replayed = 0u64;
    log::read_all(dir, |seq, ops| {
        if seq > last_seq {
            inner.apply(ops)?;
            last_seq = seq;
            replayed += 1;
        }
        Ok(())
    })?;
    if replayed > 0 {
        tracing::info!(
            batches = replayed,
            "replayed the write-ahead log into the store"
        );
    }
    Ok(last_seq)
}

#[cfg(test)]
mod tests;
