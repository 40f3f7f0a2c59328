//! Group commit: one store thread runs the store's write operations and makes them durable
//! together.
//!
//! Writers hand the thread a job (one of `ops.rs`'s operations); it drains every job queued, runs
//! them in order (so each operation's checks and writes are one step), flushes once, then answers
//! all of them. A job is answered only by a flush that followed its writes, so an
//! answer means on disk; concurrent writers share flushes, and a write plus its flush costs one
//! hand-off to this thread and one back.

use super::records::Records;
use crate::store::{StoreError, StoreResult};
use crate::telemetry::kept;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Instant;

/// Runs on the store thread; returns what to do once the flush is known.
pub(super) type Job = Box<dyn FnOnce(&Records) -> Completion + Send>;
pub(super) type Completion = Box<dyn FnOnce(&StoreResult<()>) + Send>;

/// Jobs taken into one flush at most (keeps a flood from delaying the first answers).
const MAX_JOBS_PER_FLUSH: usize = 1024;

pub(super) struct GroupCommit {
    jobs: Option<mpsc::Sender<Job>>,
    worker: Option<JoinHandle<()>>,
}

impl GroupCommit {
    pub(super) fn start(records: Records) -> StoreResult<Self> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let worker = std::thread::Builder::new()
            .name("colloquy-store".into())
            .spawn(move || run(records, queue))
            .map_err(|e| StoreError::backend("cannot start the store thread", e))?;
        Ok(GroupCommit {
            jobs: Some(jobs),
            worker: Some(worker),
        })
    }

    /// Queues a job; false when the store thread is gone.
    pub(super) fn submit(&self, job: Job) -> bool {
        self.jobs
            .as_ref()
            .is_some_and(|jobs| jobs.send(job).is_ok())
    }
}

impl Drop for GroupCommit {
    fn drop(&mut self) {
        // Closing the queue ends the thread once it has answered what is queued.
        self.jobs.take();
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

fn run(store: Records, queue: mpsc::Receiver<Job>) {
    let backend = store.backend().clone();
    while let Ok(first) = queue.recv() {
        let mut completions = vec![first(&store)];
        while completions.len() < MAX_JOBS_PER_FLUSH {
            match queue.try_recv() {
                Ok(job) => completions.push(job(&store)),
                Err(_) => break,
            }
        }
        let started = Instant::now();
        let flushed = backend.flush();
        kept!(histogram, "colloquy_store_flush_seconds").record(started.elapsed());
        kept!(counter, "colloquy_store_flushes_total").increment(1);
        kept!(counter, "colloquy_store_flush_waiters_total").increment(completions.len() as u64);
        for complete in completions {
            complete(&flushed);
        }
    }
}
