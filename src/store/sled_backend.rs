//! The embedded backend: one sled tree with atomic batches. Durability comes from the store
//! thread's group commit calling [`KvBackend::flush`].

use super::{KvBackend, KvOp, KvPair, StoreError, StoreResult};
use std::ops::Bound;
use std::path::Path;
use std::time::{Duration, Instant};

impl From<sled::Error> for StoreError {
    fn from(e: sled::Error) -> Self {
        StoreError::Backend(e.to_string())
    }
}

pub struct SledBackend {
    db: sled::Db,
}

/// How long opening waits for the folder's lock: a previous owner in this process lets go of it
/// only when sled's background threads have finished with it, shortly after it is dropped.
const LOCK_WAIT: Duration = Duration::from_secs(5);

impl SledBackend {
    pub fn open(path: &Path, cache_bytes: u64) -> StoreResult<Self> {
        // No periodic flush of its own: durability comes from our flushes (the log's checkpoints).
        let config = sled::Config::new()
            .path(path)
            .cache_capacity(cache_bytes)
            .flush_every_ms(None);
        let deadline = Instant::now() + LOCK_WAIT;
        loop {
            match config.open() {
                Ok(db) => return Ok(SledBackend { db }),
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
        let _ = self.db.flush();
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
        Ok(())
    }

    fn size_on_disk(&self) -> StoreResult<u64> {
        Ok(self.db.size_on_disk()?)
    }
}
