//! `Directory`: conversation key -> the `Addr` of its live `ContextActor`.
//!
//! Actors start on demand on the arbiter picked by the key's hash (never on the HTTP worker that
//! took the request) and are forgotten when they stop. A message that reaches an actor that is
//! stopping comes back undelivered (`MailboxError::Closed`) and is sent again to a fresh actor:
//! it was never handled, so nothing ran twice and nothing is lost.

use super::context::{ContextActor, StopIfIdle};
use super::error::{EngineError, EngineResult};
use super::shared::Shared;
use crate::store::ConversationKey;
use actix::prelude::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

const SHARDS: usize = 64;
const DELIVERY_ATTEMPTS: usize = 8;
/// Actors asked to stop-if-idle each time a new one would pass the resident limit.
const EVICTION_BATCH: usize = 64;

struct Resident {
    generation: u64,
    addr: Addr<ContextActor>,
}

/// The arbiter threads, joined on shutdown so every actor (and its store handle) is gone after.
type Threads = Mutex<Vec<Arbiter>>;

pub struct Directory {
    shards: Box<[Mutex<HashMap<ConversationKey, Resident>>]>,
    arbiters: Vec<ArbiterHandle>,
    shared: Arc<Shared>,
    generations: AtomicU64,
    threads: Threads,
    resident: AtomicUsize,
    next_eviction_shard: AtomicUsize,
}

impl Directory {
    /// Starts `arbiters` arbiter threads. Needs a running actix System.
    pub fn start(shared: Arc<Shared>, arbiters: usize) -> Arc<Self> {
        let threads: Vec<Arbiter> = (0..arbiters.max(1)).map(|_| Arbiter::new()).collect();
        Arc::new(Directory {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            arbiters: threads.iter().map(Arbiter::handle).collect(),
            shared,
            generations: AtomicU64::new(0),
            threads: Mutex::new(threads),
            resident: AtomicUsize::new(0),
            next_eviction_shard: AtomicUsize::new(0),
        })
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    fn shard(&self, key: &ConversationKey) -> MutexGuard<'_, HashMap<ConversationKey, Resident>> {
        self.shards[key.shard(SHARDS)]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The live actor for `key`, started if there is none (or only a stopped one).
    fn resident(
        self: &Arc<Self>,
        key: &ConversationKey,
        principal: &str,
        context_id: &str,
    ) -> EngineResult<Addr<ContextActor>> {
        if let Some(resident) = self.shard(key).get(key).filter(|r| r.addr.connected()) {
            return Ok(resident.addr.clone());
        }
        self.make_room()?;
        let mut shard = self.shard(key);
        if let Some(resident) = shard.get(key).filter(|r| r.addr.connected()) {
            return Ok(resident.addr.clone());
        }
        let generation = self.generations.fetch_add(1, Ordering::Relaxed);
        let arbiter = &self.arbiters[key.shard(self.arbiters.len())];
        let directory = self.clone();
        let shared = self.shared.clone();
        let (key, principal, context_id) = (*key, principal.to_owned(), context_id.to_owned());
        let addr = ContextActor::start_in_arbiter(arbiter, move |_| {
            let on_stop = Box::new(move || directory.forget(&key, generation));
            ContextActor::new(key, &principal, &context_id, shared, on_stop)
        });
        let replaced = shard.insert(
            key,
            Resident {
                generation,
                addr: addr.clone(),
            },
        );
        if replaced.is_none() {
            self.resident.fetch_add(1, Ordering::AcqRel);
            metrics::gauge!("colloquy_contexts_resident").increment(1.0);
        }
        Ok(addr)
    }

    /// At the resident limit, asks a batch of actors to stop if idle; past 110%, refuses.
    fn make_room(&self) -> EngineResult<()> {
        let max = self.shared.config.max_resident.max(1);
        let resident = self.resident.load(Ordering::Acquire);
        if resident < max {
            return Ok(());
        }
        let start = self.next_eviction_shard.fetch_add(1, Ordering::Relaxed);
        let mut asked = 0;
        for offset in 0..SHARDS {
            let shard = self.shards[(start + offset) % SHARDS]
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            for resident in shard.values().take(EVICTION_BATCH - asked) {
                resident.addr.do_send(StopIfIdle);
                asked += 1;
            }
            if asked >= EVICTION_BATCH {
                break;
            }
        }
        if resident >= max + max / 10 {
            metrics::counter!("colloquy_overload_rejections_total").increment(1);
            return Err(EngineError::Overloaded {
                running: resident,
                retry_after_ms: 100,
            });
        }
        Ok(())
    }

    /// Removes the entry if it is still the actor of that generation (a newer one may have replaced it).
    fn forget(&self, key: &ConversationKey, generation: u64) {
        let mut shard = self.shard(key);
        if shard.get(key).is_some_and(|r| r.generation == generation) {
            shard.remove(key);
            self.resident.fetch_sub(1, Ordering::AcqRel);
            metrics::gauge!("colloquy_contexts_resident").decrement(1.0);
        }
    }

    /// Delivers `message` to the conversation's actor, starting or restarting it as needed.
    pub async fn call<M>(
        self: &Arc<Self>,
        key: &ConversationKey,
        principal: &str,
        context_id: &str,
        message: M,
    ) -> EngineResult<M::Result>
    where
        M: actix::Message + Clone + Send + 'static,
        M::Result: Send,
        ContextActor: Handler<M>,
    {
        for _ in 0..DELIVERY_ATTEMPTS {
            let addr = self.resident(key, principal, context_id)?;
            match addr.send(message.clone()).await {
                Ok(result) => return Ok(result),
                Err(MailboxError::Closed) => continue,
                Err(MailboxError::Timeout) => break,
            }
        }
        Err(EngineError::Internal(
            "the conversation's actor could not be reached".into(),
        ))
    }

    pub fn resident_count(&self) -> usize {
        self.resident.load(Ordering::Acquire)
    }

    /// Every live actor (for shutdown).
    pub fn all(&self) -> Vec<Addr<ContextActor>> {
        self.shards
            .iter()
            .flat_map(|s| {
                s.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .values()
                    .map(|r| r.addr.clone())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Stops the arbiters and waits for their threads (off the async thread).
    pub async fn stop_arbiters(&self) {
        for arbiter in &self.arbiters {
            arbiter.stop();
        }
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        let joined = actix_rt::task::spawn_blocking(move || {
            for thread in threads {
                let _ = thread.join();
            }
        })
        .await;
        if let Err(e) = joined {
            tracing::warn!(error = %e, "joining the arbiter threads failed");
        }
    }
}
