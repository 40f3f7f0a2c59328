//! `Arbiters`: the threads that host the conversation actors. The composition root starts them
//! before it opens the store, so that a store whose work is all asynchronous (PostgreSQL) can
//! run it on the arbiter itself when there is only one (`app.rs`): a turn's steps then reach
//! the database and come back without a thread crossing. The directory places actors on them
//! and joins them on shutdown.

use actix::prelude::*;

pub struct Arbiters {
    threads: Vec<Arbiter>,
}

impl Arbiters {
    /// Starts `count` arbiter threads (at least one). Needs a running actix System.
    pub fn start(count: usize) -> Arbiters {
        Arbiters {
            threads: (0..count.max(1)).map(|_| Arbiter::new()).collect(),
        }
    }

    /// The tokio runtime of the only arbiter; `None` when there are several, for then one of
    /// them would carry the store's work for every conversation.
    pub async fn sole_runtime(&self) -> Option<tokio::runtime::Handle> {
        let [arbiter] = self.threads.as_slice() else {
            return None;
        };
        let (sender, handle) = tokio::sync::oneshot::channel();
        arbiter.spawn(async move {
            let _ = sender.send(tokio::runtime::Handle::current());
        });
        handle.await.ok()
    }

    pub(super) fn handles(&self) -> Vec<ArbiterHandle> {
        self.threads.iter().map(Arbiter::handle).collect()
    }

    /// Stops every arbiter and waits for its thread to end, so that every actor on it (and
    /// whatever it held of the store) is gone. Blocks: call it off the async threads.
    pub fn stop(mut self) {
        let threads = std::mem::take(&mut self.threads);
        for arbiter in &threads {
            arbiter.stop();
        }
        for arbiter in threads {
            let _ = arbiter.join();
        }
    }
}

/// Arbiters dropped unstopped (a node that failed to start) stop with their owner, unjoined.
impl Drop for Arbiters {
    fn drop(&mut self) {
        for arbiter in &self.threads {
            arbiter.stop();
        }
    }
}
