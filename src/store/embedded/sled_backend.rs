//! The embedded backend: one sled tree with atomic batches. Durability comes from the store
//! thread's group commit calling [`KvBackend::flush`].
//!
//! sled 0.34's own flush is not enough for a power cut: it waits on `sync_file_range` for its
//! `db` file, which persists neither the file's size nor the device's write cache, and it never
//! syncs the folder entries of its `conf`, snapshots and blobs. So [`KvBackend::flush`] here
//! follows sled's flush with an `fsync` of every file in the folder and of the folders.

use super::SledOptions;
use super::kv::{KvBackend, KvOp, KvPair};
use crate::durable;
use crate::store::{StoreError, StoreResult};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

impl From<sled::Error> for StoreError {
    fn from(e: sled::Error) -> Self {
        StoreError::Backend {
            message: e.to_string(),
            source: Some(crate::error::Cause::new(e)),
        }
    }
}

pub struct SledBackend {
    db: sled::Db,
    dir: PathBuf,
    snapshots: SnapshotPolicy,
}

/// When sled writes a recovery snapshot. sled 0.34 writes one only when it opens a folder, so
/// an open replays every byte of log written since the previous open (23 s after a 5-million-turn
/// run); colloquy's patched sled can write one while open (`vendor/sled/COLLOQUY.md`).
struct SnapshotPolicy {
    /// Log written since the last snapshot that makes the next checkpoint write one, unless
    /// that is less than [`SNAPSHOT_SIZE_FACTOR`] times the last snapshot's size.
    after_log_bytes: u64,
    /// sled's stable log position when the last snapshot was written, and that snapshot's size.
    last: parking_lot::Mutex<(i64, u64)>,
}

/// Log written between snapshots, by default: an open replays at most about this much.
pub const DEFAULT_SNAPSHOT_LOG_BYTES: u64 = 512 << 20;
/// A snapshot holds every page's place: waiting for this many times its size in log keeps the
/// writing snapshots add to a fraction of the log's.
const SNAPSHOT_SIZE_FACTOR: u64 = 8;

/// Entries of sled's folder that are not sled's (the write-ahead log syncs its own).
const NOT_SLEDS: &[&str] = &["wal"];

/// How long opening waits for the folder's lock: a previous owner in this process lets go of it
/// only when sled's background threads have finished with it, shortly after it is dropped.
const LOCK_WAIT: Duration = Duration::from_secs(5);

/// `store.leaf_fanout` by default. sled's own 16 makes a page per few turns, and sled keeps
/// every page's place in memory and reads all of them when it opens: 64 took the RSS after an
/// open to about a third and halved the open, with the same turns/s (docs/performance.md).
pub const DEFAULT_LEAF_FANOUT: usize = 64;
/// Below this a split leaf would be small enough to merge back (sled merges below 4).
pub const MIN_LEAF_FANOUT: usize = 8;
/// A bound against a mistyped value: sled rewrites a whole page every ten changes to it, and
/// nothing above 128 was measured.
pub const MAX_LEAF_FANOUT: usize = 1024;

/// `store.segment_cleanup_percent` by default. sled rewrites the live pages of a segment that
/// has fallen to this share of live bytes, so its space can be reused; sled's own 50 kept the
/// checkpoint thread relocating pages a fifth of its time. 25 cost more disk (still a third of
/// the 1,500 bytes a turn allowed) for more turns/s that fell less as the folder grew
/// (docs/performance.md, "Design decisions": 2b68e12, 2026-12-01).
pub const DEFAULT_SEGMENT_CLEANUP_PERCENT: usize = 25;
/// Bounds against a mistyped value: the folder can grow to about 100 / percent times its live
/// data, and near 100 every segment is rewritten as soon as anything in it changes.
pub const SEGMENT_CLEANUP_PERCENTS: std::ops::RangeInclusive<usize> = 10..=90;

/// `store.compression_level` by default, and the zstd level of writes to a folder created
/// compressed when none is configured. Level 1 (zstd's fast strategy) stores what 3 does a
/// turn, for less CPU (docs/performance.md, "Design decisions": 2026-12-05).
pub const DEFAULT_COMPRESSION_LEVEL: u8 = 1;
/// sled counts a cached page at its compressed size, so a compressed folder's cache holds
/// several times its budget in memory: it gets this fraction of it.
const COMPRESSED_CACHE_DIVISOR: u64 = 4;

impl SledBackend {
    /// Opens (or creates, uncompressed) sled's folder at `path`, compressed if it was created so.
    pub fn open(path: &Path, cache_bytes: u64) -> StoreResult<Self> {
        Self::open_with(path, &SledOptions::with_cache(cache_bytes))
    }

    /// As [`SledBackend::open`], tuned by `options`. A folder created now is compressed with
    /// zstd at `options.zstd_level` if given; sled refuses to open a folder with that setting
    /// changed, so an existing folder keeps the one it was created with.
    pub fn open_with(path: &Path, options: &SledOptions) -> StoreResult<Self> {
        let (cache_bytes, zstd_level) = (options.cache_bytes, options.zstd_level);
        let level = match created_compressed(path)? {
            Some(true) => Some(zstd_level.unwrap_or(i32::from(DEFAULT_COMPRESSION_LEVEL))),
            Some(false) => {
                if zstd_level.is_some() {
                    // Folders from before compression was the default: not a mistake to warn of.
                    tracing::info!(
                        folder = %path.display(),
                        "store.compression_level applies to new data folders; this one was \
                         created uncompressed and stays so"
                    );
                }
                None
            }
            None => zstd_level,
        };
        // sled creates the folder without syncing its entry in the parent.
        durable::create_dir_all(path)
            .map_err(|e| StoreError::backend(format_args!("creating {}", path.display()), e))?;
        // No periodic flush of its own: durability comes from our flushes (the log's checkpoints).
        let mut config = sled::Config::new()
            .path(path)
            .cache_capacity(cache_bytes)
            .leaf_fanout(options.leaf_fanout)
            .segment_cleanup_threshold(options.segment_cleanup_percent)
            .flush_every_ms(None);
        if let Some(level) = level {
            config = config
                .use_compression(true)
                .compression_factor(level)
                .cache_capacity(cache_bytes / COMPRESSED_CACHE_DIVISOR);
        }
        let deadline = Instant::now() + LOCK_WAIT;
        loop {
            match config.open() {
                Ok(db) => {
                    let backend = SledBackend {
                        snapshots: SnapshotPolicy {
                            after_log_bytes: options.snapshot_log_bytes,
                            // Opening wrote one at the tip.
                            last: parking_lot::Mutex::new((db.stable_log_position(), 0)),
                        },
                        db,
                        dir: path.to_owned(),
                    };
                    // A first start wrote `conf`: make it and the new folders durable now.
                    backend.flush()?;
                    return Ok(backend);
                }
                // sled reports a held lock only in the message of an `Other` I/O error.
                Err(sled::Error::Io(e))
                    if e.to_string().starts_with("could not acquire lock")
                        && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Writes a recovery snapshot if the policy says it is time. Called after a durable flush,
    /// by the only thread that writes; sled locks its other operations out while it reads its
    /// page table.
    fn snapshot_if_due(&self) -> StoreResult<()> {
        let (position, size) = *self.snapshots.last.lock();
        let logged = u64::try_from(self.db.stable_log_position() - position).unwrap_or(0);
        let due = self
            .snapshots
            .after_log_bytes
            .max(size.saturating_mul(SNAPSHOT_SIZE_FACTOR));
        if logged < due {
            return Ok(());
        }
        self.snapshot()
    }

    /// Writes a recovery snapshot at the log's tip, unless nothing was logged since the last.
    fn snapshot(&self) -> StoreResult<()> {
        let mut last = self.snapshots.last.lock();
        if self.db.stable_log_position() == last.0 {
            return Ok(());
        }
        let started = Instant::now();
        let Some(bytes) = self.db.write_snapshot()? else {
            return Ok(());
        };
        *last = (self.db.stable_log_position(), bytes);
        metrics::histogram!("colloquy_store_snapshot_seconds").record(started.elapsed());
        tracing::debug!(bytes, elapsed = ?started.elapsed(), "sled snapshot written");
        Ok(())
    }
}

/// Whether sled's folder at `path` was created compressed (its `conf` says), or None before
/// it exists.
fn created_compressed(path: &Path) -> StoreResult<Option<bool>> {
    let conf = path.join("conf");
    // Text lines, then a checksum.
    match std::fs::read(&conf) {
        Ok(bytes) => Ok(Some(
            String::from_utf8_lossy(&bytes)
                .lines()
                .any(|line| line.trim() == "use_compression: true"),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StoreError::backend(
            format_args!("reading {}", conf.display()),
            e,
        )),
    }
}

impl Drop for SledBackend {
    fn drop(&mut self) {
        // Best effort: everything acknowledged was flushed already. (No snapshot here: the
        // integration tests, dozens of sled folders in one process sharing sled's global lock,
        // hung once with a stop's flush waiting here; the stop's snapshot is written by the
        // last checkpoint, on the checkpoint thread, as the others are: `closing`.)
        let _ = self.flush();
    }
}

impl KvBackend for SledBackend {
    fn get(&self, key: &[u8]) -> StoreResult<Option<Vec<u8>>> {
        Ok(self.db.get(key)?.map(|v| v.to_vec()))
    }

    fn apply(&self, ops: Vec<KvOp>) -> StoreResult<()> {
        let mut batch = sled::Batch::default();
        for op in ops {
            match op {
                KvOp::Put(k, v) | KvOp::Create(k, v) => batch.insert(k, v),
                KvOp::Delete(k) => batch.remove(k),
            }
        }
        self.db.apply_batch(batch)?;
        Ok(())
    }

    fn apply_each(&self, ops: Vec<KvOp>) -> StoreResult<()> {
        // Sorted, each key once: sled writes a run of them to one leaf as the leaf's new
        // page (vendor/sled/COLLOQUY.md, change 13).
        self.db.apply_sorted(ops.into_iter().map(|op| {
            let (key, value) = op.into_parts();
            (key.into(), value.map(Into::into))
        }))?;
        Ok(())
    }

    fn scan<'a>(
        &'a self,
        from: Bound<Vec<u8>>,
        to: Bound<Vec<u8>>,
        reverse: bool,
    ) -> Box<dyn Iterator<Item = StoreResult<KvPair>> + 'a> {
        let range = self.db.range::<Vec<u8>, _>((from, to));
        let convert = |entry: sled::Result<(sled::IVec, sled::IVec)>| {
            entry
                .map(|(k, v)| (k.to_vec(), v.to_vec()))
                .map_err(StoreError::from)
        };
        if reverse {
            Box::new(range.rev().map(convert))
        } else {
            Box::new(range.map(convert))
        }
    }

    fn flush(&self) -> StoreResult<()> {
        self.db.flush()?;
        durable::sync_tree(&self.dir, NOT_SLEDS).map_err(|e| {
            StoreError::backend(
                format_args!("syncing the store in {}", self.dir.display()),
                e,
            )
        })?;
        Ok(())
    }

    fn checkpointed(&self) -> StoreResult<()> {
        self.snapshot_if_due()
    }

    /// A clean stop leaves nothing of sled's log to replay: the next open reads the snapshot
    /// only (at 5 million turns the replay of up to `snapshot_log_bytes` was most of an open).
    fn closing(&self) -> StoreResult<()> {
        self.snapshot()
    }

    fn size_on_disk(&self) -> StoreResult<u64> {
        Ok(self.db.size_on_disk()?)
    }
}
