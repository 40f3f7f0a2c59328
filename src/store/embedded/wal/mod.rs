//! A write-ahead log and memtables in front of a backend whose own writes and flushes are
//! expensive.
//!
//! sled makes a flush durable by handing it to its I/O thread pool and waiting, and every write
//! rewrites tree pages (about 30 KiB written to disk per turn); under many small acknowledged
//! writes that, not the disk, was most of colloquy's CPU. Here:
//! - [`KvBackend::apply`] gives the batch the next sequence number, appends it to the log buffer
//!   and puts its writes in the active memtable, which reads consult before the inner backend;
//! - [`KvBackend::flush`] writes the buffer and `fdatasync`s it on the calling (store) thread;
//! - a checkpoint thread, about once a second once the memtable holds enough to be worth moving
//!   (at the latest a minute after the last checkpoint), freezes the active memtable (a new one
//!   takes its place), writes the frozen one into the inner backend (a key written many times
//!   since is written once), flushes it durably (for sled, `fsync` of its files and folders:
//!   see `docs/durability.md`), drops the frozen memtable (readers that still hold it keep it)
//!   and deletes the log segments it now covers, then syncs the log folder.
//!
//! Once a checkpoint's writes are durable in the inner backend, it stores the sequence number
//! of the last batch they cover under [`APPLIED_KEY`]. Opening replays, in order, the logged
//! batches after that number: every key they write ends as the log says, whatever part of an
//! interrupted checkpoint reached the inner backend. So every acknowledged (logged and synced)
//! batch is there after a crash, in order.

mod log;
mod memtable;

use super::kv::{KvBackend, KvOp, KvPair};
use crate::error::chain;
use crate::store::{StoreError, StoreResult};
use crate::telemetry::kept;
use log::SegmentFiles;
use memtable::Memtable;
use parking_lot::{Condvar, Mutex, RwLock};
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Where the inner backend keeps the sequence number of the last batch applied to it.
pub const APPLIED_KEY: &[u8] = b"zwal-applied";

/// How often the memtable moves into the inner backend once it holds
/// [`DEFAULT_CHECKPOINT_MIN_BYTES`], unless configured. Under load, bounds both the memtable and
/// the log replayed at start-up after a crash to about this much writing.
pub const DEFAULT_CHECKPOINT_EVERY: Duration = Duration::from_secs(1);
/// A memtable smaller than this waits for more writes before a timed checkpoint moves it,
/// unless configured. A checkpoint rewrites each sled page its writes touch and syncs sled twice,
/// whatever it moves: under light load, a checkpoint a second was most of what a turn wrote to
/// the device (docs/performance.md).
pub const DEFAULT_CHECKPOINT_MIN_BYTES: usize = 8 << 20;
/// The longest a memtable holding anything waits for its checkpoint, unless configured: bounds
/// the log replayed after a crash under light load.
pub const DEFAULT_CHECKPOINT_MAX_WAIT: Duration = Duration::from_secs(60);
/// The memtable size that makes writers wait for a checkpoint, unless configured.
pub const DEFAULT_MEMTABLE_BYTES: usize = 256 << 20;
/// Writes handed to the inner backend at a time when checkpointing. sled tells the parents of
/// the leaves a slice splits once per 64 splits and at the slice's end (vendor/sled/COLLOQUY.md,
/// change 17), and rewrites each parent whole, so slices of 128 writes rewrote most parents once
/// a slice; at 4,096 the checkpoint counted 42k instructions a turn against 50k
/// (docs/performance.md).
const INNER_BATCH_OPS: usize = 4096;
/// A slice also ends once it holds this much ([`Memtable::bytes`]' measure), so that its copy
/// (and sled's of it) stays a few MB however large the records: at full speed a checkpoint's
/// 8 MiB held about 50,000 writes, so 4,096 are some 0.7 MB, where 4,096 messages of 1 MiB
/// would be 4 GiB.
const INNER_BATCH_BYTES: usize = 4 << 20;
/// A memtable past this share of [`WalLimits::memtable_bytes`] starts a checkpoint early.
const EARLY_CHECKPOINT_DIVISOR: usize = 4;

/// How much the log holds in memory, and for how long.
#[derive(Clone, Copy, Debug)]
pub struct WalLimits {
    /// How often the memtable moves into the inner backend (once it holds `checkpoint_min_bytes`).
    pub checkpoint_every: Duration,
    /// A smaller memtable waits for more writes, up to `checkpoint_max_wait` after the last
    /// checkpoint (0: a checkpoint every `checkpoint_every`, whatever the table holds).
    pub checkpoint_min_bytes: usize,
    /// The longest a memtable holding anything waits for its checkpoint.
    pub checkpoint_max_wait: Duration,
    /// A memtable this large makes writers wait for a checkpoint (the inner backend is not
    /// keeping up); a quarter of it starts one early. With the frozen table being moved, the
    /// log holds at most about twice this in memory.
    pub memtable_bytes: usize,
}

impl Default for WalLimits {
    fn default() -> Self {
        WalLimits {
            checkpoint_every: DEFAULT_CHECKPOINT_EVERY,
            checkpoint_min_bytes: DEFAULT_CHECKPOINT_MIN_BYTES,
            checkpoint_max_wait: DEFAULT_CHECKPOINT_MAX_WAIT,
            memtable_bytes: DEFAULT_MEMTABLE_BYTES,
        }
    }
}

impl WalLimits {
    fn early_checkpoint_bytes(&self) -> usize {
        self.memtable_bytes / EARLY_CHECKPOINT_DIVISOR
    }
}

pub struct WalBackend<B: KvBackend> {
    shared: Arc<Shared<B>>,
    checkpointer: Option<JoinHandle<()>>,
}

struct Shared<B> {
    inner: B,
    tables: RwLock<Tables>,
    /// Logged but not yet written. Held while applying, so log order is apply order.
    pending: Mutex<Pending>,
    /// Held while writing and syncing, so a flush that starts later finds earlier ones done.
    segments: Mutex<SegmentFiles>,
    /// Set when a log write or sync failed: nothing more is acknowledged or checkpointed.
    log_failed: AtomicBool,
    checkpoints: Mutex<Checkpoints>,
    limits: WalLimits,
    checkpoint_wake: Condvar,
    checkpoint_done: Condvar,
}

/// Writers fill `active`; a checkpoint moves `frozen` (the batches up to its sequence number,
/// all logged) into the inner backend, then drops it. Readers take both for their whole read.
#[derive(Default)]
struct Tables {
    active: Arc<Memtable>,
    frozen: Option<(Arc<Memtable>, u64)>,
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
}

impl<B: KvBackend> WalBackend<B> {
    /// Opens the log in `dir` over `inner`. What the inner backend missed is read back into
    /// memory as a frozen memtable, which the first checkpoint moves in: reads find it at once,
    /// and the server is ready without waiting for the inner backend's slow writes.
    pub fn open(inner: B, dir: &Path, limits: WalLimits) -> StoreResult<Self> {
        log::create_dir(dir)?;
        let (last_seq, replayed) = recover(&inner, dir, limits.memtable_bytes)?;
        // The old segments stay until the replayed batches are durable in the inner backend.
        let mut segments = SegmentFiles::create(dir, last_seq)?;
        let frozen = if replayed.is_empty() {
            segments.remove_covered(last_seq);
            None
        } else {
            Some((Arc::new(replayed), last_seq))
        };
        let shared = Arc::new(Shared {
            inner,
            tables: RwLock::new(Tables {
                active: Arc::default(),
                frozen,
            }),
            pending: Mutex::new(Pending {
                buffer: Vec::new(),
                spare: Vec::new(),
                last_seq,
            }),
            segments: Mutex::new(segments),
            log_failed: AtomicBool::new(false),
            checkpoints: Mutex::new(Checkpoints::default()),
            limits,
            checkpoint_wake: Condvar::new(),
            checkpoint_done: Condvar::new(),
        });
        let checkpointer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("colloquy-checkpoint".into())
                .spawn(move || shared.run_checkpoints())
                .map_err(|e| StoreError::backend("cannot start the checkpoint thread", e))?
        };
        Ok(WalBackend {
            shared,
            checkpointer: Some(checkpointer),
        })
    }
}

impl<B: KvBackend> Shared<B> {
    /// The tables to read, newest first.
    fn snapshot(&self) -> (Arc<Memtable>, Option<Arc<Memtable>>) {
        let tables = self.tables.read();
        (
            tables.active.clone(),
            tables.frozen.as_ref().map(|(table, _)| table.clone()),
        )
    }

    fn ensure_log_ok(&self) -> StoreResult<()> {
        if self.log_failed.load(Ordering::Acquire) {
            return Err(StoreError::backend_msg(
                "the write-ahead log failed earlier; writes are refused until a restart",
            ));
        }
        Ok(())
    }

    fn apply(&self, mut ops: Vec<KvOp>) -> StoreResult<()> {
        self.ensure_log_ok()?;
        log::ensure_loggable(&ops)?;
        if self.tables.read().active.bytes() > self.limits.early_checkpoint_bytes() {
            self.wait_for_room();
        }
        let mut pending = self.pending.lock();
        let seq = pending.last_seq + 1;
        // Replay sets the inner backend's position with the batch; the memtable needs no copy.
        ops.push(applied(seq));
        log::encode_record(&mut pending.buffer, seq, &ops);
        ops.pop();
        // Under `pending`, as freezing is: the batch lands in the table its cut says.
        self.tables.read().active.insert(ops);
        pending.last_seq = seq;
        kept!(counter, "colloquy_store_writes_total").increment(1);
        Ok(())
    }

    /// Asks for an early checkpoint; waits for one when the memtable is past its hard limit.
    fn wait_for_room(&self) {
        let mut checkpoints = self.checkpoints.lock();
        checkpoints.requested = true;
        self.checkpoint_wake.notify_one();
        while self.tables.read().active.bytes() > self.limits.memtable_bytes && !checkpoints.stop {
            let seen = checkpoints.completed;
            while checkpoints.completed == seen && !checkpoints.stop {
                self.checkpoint_done.wait(&mut checkpoints);
            }
        }
    }

    fn flush(&self) -> StoreResult<()> {
        let mut segments = self.segments.lock();
        // Even with nothing new to write: an earlier batch may have been in a failed write.
        self.ensure_log_ok()?;
        let (mut records, last_seq) = {
            let mut pending = self.pending.lock();
            let spare = std::mem::take(&mut pending.spare);
            (
                std::mem::replace(&mut pending.buffer, spare),
                pending.last_seq,
            )
        };
        let written = self.append(&mut segments, &mut records, last_seq);
        records.clear();
        self.pending.lock().spare = records;
        written
    }

    fn append(
        &self,
        segments: &mut SegmentFiles,
        records: &mut [u8],
        last_seq: u64,
    ) -> StoreResult<()> {
        if records.is_empty() {
            return Ok(());
        }
        let written = segments.append(records, last_seq);
        if written.is_err() {
            self.log_failed.store(true, Ordering::Release);
        }
        written
    }

    /// Moves every logged batch into the inner backend and deletes the log segments that then
    /// hold nothing it lacks.
    fn checkpoint(&self) -> StoreResult<()> {
        // A cut that may not be wholly logged must never reach the inner backend.
        self.ensure_log_ok()?;
        // A table still frozen (replayed at open, or left by a failed checkpoint) goes first.
        self.drain_frozen()?;
        self.freeze()?;
        self.drain_frozen()
    }

    /// Freezes the active memtable at a consistent cut of batches, and logs the whole cut.
    fn freeze(&self) -> StoreResult<()> {
        let mut segments = self.segments.lock();
        let (mut records, covered) = {
            let mut pending = self.pending.lock();
            let mut tables = self.tables.write();
            let frozen = std::mem::take(&mut tables.active);
            tables.frozen = Some((frozen, pending.last_seq));
            (std::mem::take(&mut pending.buffer), pending.last_seq)
        };
        self.append(&mut segments, &mut records, covered)?;
        // Without a new segment the log just goes on in this one (deleted a checkpoint later).
        if let Err(e) = segments.rotate() {
            tracing::warn!(error = %chain(&e), "could not start a new log segment");
        }
        Ok(())
    }

    fn drain_frozen(&self) -> StoreResult<()> {
        let Some((frozen, covered)) = self.tables.read().frozen.clone() else {
            return Ok(());
        };
        if !frozen.is_empty() {
            let started = Instant::now();
            let moved = move_into(&self.inner, &frozen, covered)?;
            metrics::histogram!("colloquy_store_checkpoint_seconds").record(started.elapsed());
            metrics::counter!("colloquy_store_checkpoint_writes_total").increment(moved as u64);
            if let Err(e) = self.inner.checkpointed() {
                tracing::warn!(error = %chain(&e), "the store's backend could not shorten its recovery");
            }
        }
        // Readers still holding the table keep it; new ones find its writes in the inner backend.
        self.tables.write().frozen = None;
        self.segments.lock().remove_covered(covered);
        Ok(())
    }

    /// Whether a timed checkpoint may wait: nothing replayed is waiting to move, and the
    /// memtable is empty, or small with the last checkpoint recent.
    fn may_wait(&self, last: Instant) -> bool {
        let tables = self.tables.read();
        let held = tables.active.bytes();
        tables.frozen.is_none()
            && (held == 0
                || held < self.limits.checkpoint_min_bytes
                    && last.elapsed() < self.limits.checkpoint_max_wait)
    }

    fn run_checkpoints(&self) {
        let mut last = Instant::now();
        loop {
            let stopping = {
                let mut checkpoints = self.checkpoints.lock();
                if !checkpoints.requested && !checkpoints.stop {
                    self.checkpoint_wake
                        .wait_for(&mut checkpoints, self.limits.checkpoint_every);
                }
                if !checkpoints.requested && !checkpoints.stop && self.may_wait(last) {
                    continue;
                }
                checkpoints.requested = false;
                checkpoints.stop
            };
            last = Instant::now();
            match self.checkpoint() {
                Err(e) => {
                    tracing::error!(error = %chain(&e), "store checkpoint failed; the log keeps everything since the last one");
                }
                Ok(()) if stopping => {
                    if let Err(e) = self.inner.closing() {
                        tracing::warn!(error = %chain(&e), "the store's backend could not shorten its next open");
                    }
                }
                Ok(()) => {}
            }
            let mut checkpoints = self.checkpoints.lock();
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
            tracing::error!(error = %chain(&e), "final write-ahead log flush failed");
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
        let (active, frozen) = self.shared.snapshot();
        for table in std::iter::once(active).chain(frozen) {
            if let Some(value) = table.get(key) {
                return Ok(value);
            }
        }
        self.shared.inner.get(key)
    }

    fn apply(&self, ops: Vec<KvOp>) -> StoreResult<()> {
        self.shared.apply(ops)
    }

    fn scan<'a>(
        &'a self,
        from: Bound<Vec<u8>>,
        to: Bound<Vec<u8>>,
        reverse: bool,
    ) -> Box<dyn Iterator<Item = StoreResult<KvPair>> + 'a> {
        // Tables first: what leaves the frozen one is already in the inner backend.
        let (active, frozen) = self.shared.snapshot();
        let mut merged = self.shared.inner.scan(from.clone(), to.clone(), reverse);
        if let Some(frozen) = frozen {
            merged = memtable::merge(frozen, from.clone(), to.clone(), reverse, merged);
        }
        memtable::merge(active, from, to, reverse, merged)
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

/// Writes a table of the batches up to `covered` into the inner backend durably, then its
/// position. Returns the writes moved.
fn move_into<B: KvBackend>(inner: &B, table: &Memtable, covered: u64) -> StoreResult<usize> {
    let mut moved = 0;
    let mut last: Option<Vec<u8>> = None;
    // One write at a time: sled's atomic batches lock its readers out. A crash part way
    // leaves the old position, and recovery replays every batch of the cut from the log.
    loop {
        let slice = table.writes_after(last.as_deref(), INNER_BATCH_OPS, INNER_BATCH_BYTES);
        let Some(op) = slice.last() else {
            break;
        };
        last = Some(op.key().to_vec());
        moved += slice.len();
        inner.apply_each(slice)?;
    }
    inner.flush()?;
    // Only once the cut is durable in the inner backend may its position say so.
    inner.apply(vec![applied(covered)])?;
    inner.flush()?;
    Ok(moved)
}

/// Reads back the logged batches newer than the inner backend's position into a memtable,
/// moving them in whenever the table passes `table_bytes` (a running server's memtable limit).
/// Returns the last logged sequence number and the table.
fn recover<B: KvBackend>(
    inner: &B,
    dir: &Path,
    table_bytes: usize,
) -> StoreResult<(u64, Memtable)> {
    let applied = match inner.get(APPLIED_KEY)? {
        Some(bytes) => u64::from_le_bytes(
            bytes
                .as_slice()
                .try_into()
                .map_err(|_| StoreError::corrupt_msg("write-ahead log position"))?,
        ),
        None => 0,
    };
    let started = Instant::now();
    let mut last_seq = applied;
    let mut replayed = 0u64;
    // Collected as a checkpoint would, so a key written by many batches is written once.
    let mut table = Memtable::default();
    log::read_all(dir, applied, |seq, mut ops| {
        // The position is written last, once the writes are durable.
        ops.retain(|op| !matches!(op, KvOp::Put(key, _) if key == APPLIED_KEY));
        table.insert(ops);
        last_seq = seq;
        replayed += 1;
        if table.bytes() > table_bytes {
            move_into(inner, &std::mem::take(&mut table), last_seq)?;
        }
        Ok(())
    })?;
    if replayed > 0 {
        tracing::info!(
            batches = replayed,
            elapsed = ?started.elapsed(),
            "replayed the write-ahead log into memory; the first checkpoint moves it into the store"
        );
    }
    Ok((last_seq, table))
}

#[cfg(test)]
mod tests;
