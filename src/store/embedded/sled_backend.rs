//! The embedded backend: one sled tree with atomic batches. Durability comes from the store
//! thread's group commit calling [`KvBackend::flush`].
//!
//! sled 0.34's own flush is not enough for a power cut: it waits on `sync_file_range` for its
//! `db` file, which persists neither the file's size nor the device's write cache, and it never
//! syncs the folder entries of its `conf`, snapshots and blobs. So [`KvBackend::flush`] here
//! follows sled's flush with an `fsync` of every file in the folder and of the folders.

use super::kv::{KvBackend, KvOp, KvPair};
use crate::durable;
use crate::store::{StoreError, StoreResult};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

impl From<sled::Error> for StoreError {
    fn from(e: sled::Error) -> Self {
        StoreError::Backend(e.to_string())
    }
}

pub struct SledBackend {
    db: sled::Db,
    dir: PathBuf,
}

/// Entries of sled's folder that are not sled's (the write-ahead log syncs its own).
const NOT_SLEDS: &[&str] = &["wal"];

/// How long opening waits for the folder's lock: a previous owner in this process lets go of it
/// only when sled's background threads have finished with it, shortly after it is dropped.
const LOCK_WAIT: Duration = Duration::from_secs(5);

impl SledBackend {
    pub fn open(path: &Path, cache_bytes: u64) -> StoreResult<Self> {
        // sled creates the folder without syncing its entry in the parent.
        durable::create_dir_all(path)
            .map_err(|e| StoreError::Backend(format!("creating {}: {e}", path.display())))?;
        // No periodic flush of its own: durability comes from our flushes (the log's checkpoints).
        let config = sled::Config::new()
            .path(path)
            .cache_capacity(cache_bytes)
            .flush_every_ms(None);
        let deadline = Instant::now() + LOCK_WAIT;
        loop {
            match config.open() {
                Ok(db) => {
                    let backend = SledBackend {
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
}

impl Drop for SledBackend {
    fn drop(&mut self) {
        // Best effort: everything acknowledged was flushed already.
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
                KvOp::Put(k, v) => batch.insert(k, v),
                KvOp::Delete(k) => batch.remove(k),
            }
        }
        self.db.apply_batch(batch)?;
        Ok(())
    }

    fn apply_each(&self, ops: Vec<KvOp>) -> StoreResult<()> {
        for op in ops {
            match op {
                KvOp::Put(k, v) => self.db.insert(k, v)?,
                KvOp::Delete(k) => self.db.remove(k)?,
            };
        }
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
            StoreError::Backend(format!("syncing the store in {}: {e}", self.dir.display()))
        })?;
        Ok(())
    }

    fn size_on_disk(&self) -> StoreResult<u64> {
        Ok(self.db.size_on_disk()?)
    }
}
