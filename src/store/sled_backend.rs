//! The embedded backend: one sled tree, atomic batches, and a group-commit flusher thread.

use super::{KvBackend, KvOp, KvPair, StoreError, StoreResult};
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use std::ops::Bound;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;
use tokio::sync::oneshot;

type FlushWaiter = oneshot::Sender<Result<(), String>>;

impl From<sled::Error> for StoreError {
    fn from(e: sled::Error) -> Self {
        StoreError::Backend(e.to_string())
    }
}

pub struct SledBackend {
    db: sled::Db,
    commits: Arc<GroupCommit>,
    flusher: Option<std::thread::JoinHandle<()>>,
}

impl SledBackend {
    pub fn open(path: &Path, cache_bytes: u64) -> StoreResult<Self> {
        let db = sled::Config::new()
            .path(path)
            .cache_capacity(cache_bytes)
            .open()?;
        let commits = Arc::new(GroupCommit::default());
        let flusher_db = db.clone();
        let flusher_commits = commits.clone();
        let flusher = std::thread::Builder::new()
            .name("colloquy-flusher".into())
            .spawn(move || flusher_commits.run(&flusher_db))
            .map_err(|e| StoreError::Backend(format!("cannot start the flusher thread: {e}")))?;
        Ok(SledBackend {
            db,
            commits,
            flusher: Some(flusher),
        })
    }
}

impl Drop for SledBackend {
    fn drop(&mut self) {
        self.commits.shut_down();
        // The flusher holds a handle on the database: wait for it, so the folder can be reopened.
        if let Some(flusher) = self.flusher.take() {
            let _ = flusher.join();
        }
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
        metrics::counter!("colloquy_store_writes_total").increment(1);
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

    fn durable(&self) -> BoxFuture<'static, StoreResult<()>> {
        let waiter = self.commits.request();
        async move {
            match waiter.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(StoreError::Backend(format!("flush failed: {e}"))),
                Err(_) => Err(StoreError::Backend("the store is shutting down".into())),
            }
        }
        .boxed()
    }

    fn size_on_disk(&self) -> StoreResult<u64> {
        Ok(self.db.size_on_disk()?)
    }
}

/// Group commit: writers register after their write is applied; the flusher takes every
/// registered waiter, flushes once, and answers them all. A waiter is only answered by a flush
/// that started after it registered, so the flush covers its write.
#[derive(Default)]
struct GroupCommit {
    state: Mutex<CommitState>,
    wake: Condvar,
}

#[derive(Default)]
struct CommitState {
    waiters: Vec<FlushWaiter>,
    shutting_down: bool,
}

impl GroupCommit {
    fn request(&self) -> oneshot::Receiver<Result<(), String>> {
        let (tx, rx) = oneshot::channel();
        if let Ok(mut state) = self.state.lock()
            && !state.shutting_down
        {
            state.waiters.push(tx);
            self.wake.notify_one();
        }
        rx
    }

    fn shut_down(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.shutting_down = true;
            self.wake.notify_one();
        }
    }

    fn run(&self, db: &sled::Db) {
        loop {
            let waiters = {
                let Ok(mut state) = self.state.lock() else {
                    return;
                };
                while state.waiters.is_empty() && !state.shutting_down {
                    state = match self.wake.wait(state) {
                        Ok(state) => state,
                        Err(_) => return,
                    };
                }
                if state.waiters.is_empty() && state.shutting_down {
                    return;
                }
                std::mem::take(&mut state.waiters)
            };
            let started = Instant::now();
            let result = db.flush().map(|_| ()).map_err(|e| e.to_string());
            metrics::histogram!("colloquy_store_flush_seconds").record(started.elapsed());
            metrics::counter!("colloquy_store_flushes_total").increment(1);
            metrics::counter!("colloquy_store_flush_waiters_total").increment(waiters.len() as u64);
            for waiter in waiters {
                let _ = waiter.send(result.clone());
            }
        }
    }
}
