//! `Directory`: a conversation (principal and contextId) -> the `Addr` of its live `ContextActor`.
//!
//! Conversations are found by their ids as callers give them, with a keyed hash of those: the
//! store's SHA-256 key is computed once, when the conversation's actor starts, not for every
//! message (under callgrind, where SHA-256 runs without the CPU's SHA instructions, it was 7.2k of
//! a turn's 229k instructions). The ids themselves are compared, so two conversations never
//! share an actor however alike their ids.
//!
//! Actors start on demand on the arbiter picked by that hash (never on the HTTP worker that
//! took the request) and are forgotten when they stop. A message that reaches an actor that is
//! stopping comes back undelivered (`MailboxError::Closed`) and is sent again to a fresh actor:
//! it was never handled, so nothing ran twice and nothing is lost.

use super::arbiters::Arbiters;
use super::context::{ContextActor, StopIfIdle};
use super::error::{EngineError, EngineResult};
use super::shared::Shared;
use actix::prelude::*;
use hashbrown::HashTable;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

const SHARDS: usize = 64;
const DELIVERY_ATTEMPTS: usize = 8;
/// Actors asked to stop-if-idle each time a new one would pass the resident limit.
const EVICTION_BATCH: usize = 64;

struct Resident {
    principal: Arc<str>,
    context_id: Arc<str>,
    /// [`Directory::hash`] of the two.
    hash: u64,
    generation: u64,
    addr: Addr<ContextActor>,
}

impl Resident {
    fn is(&self, principal: &str, context_id: &str) -> bool {
        &*self.context_id == context_id && &*self.principal == principal
    }
}

type Shard = HashTable<Resident>;

pub struct Directory {
    shards: Box<[Mutex<Shard>]>,
    /// SipHash with a per-process key: the ids are the callers', so their hashes must not be
    /// predictable enough to pile conversations into one bucket.
    hasher: RandomState,
    arbiters: Vec<ArbiterHandle>,
    shared: Arc<Shared>,
    generations: AtomicU64,
    /// The arbiters' threads, stopped and joined on shutdown (taken then), so that every actor
    /// (and its store handle) is gone after.
    arbiter_threads: Mutex<Option<Arbiters>>,
    resident: AtomicUsize,
    next_eviction_shard: AtomicUsize,
}

impl Directory {
    /// Places actors on `arbiters`, which it stops and joins on shutdown.
    pub fn start(shared: Arc<Shared>, arbiters: Arbiters) -> Arc<Self> {
        Arc::new(Directory {
            shards: (0..SHARDS).map(|_| Mutex::new(HashTable::new())).collect(),
            hasher: RandomState::new(),
            arbiters: arbiters.handles(),
            shared,
            generations: AtomicU64::new(0),
            arbiter_threads: Mutex::new(Some(arbiters)),
            resident: AtomicUsize::new(0),
            next_eviction_shard: AtomicUsize::new(0),
        })
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    fn hash(&self, principal: &str, context_id: &str) -> u64 {
        self.hasher.hash_one((principal, context_id))
    }

    fn shard(&self, hash: u64) -> MutexGuard<'_, Shard> {
        self.shards[(hash % SHARDS as u64) as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The live actor of the conversation, started if there is none (or only a stopped one).
    fn resident(
        self: &Arc<Self>,
        principal: &str,
        context_id: &str,
    ) -> EngineResult<Addr<ContextActor>> {
        let hash = self.hash(principal, context_id);
        let live = |shard: &Shard| {
            shard
                .find(hash, |r| r.is(principal, context_id))
                .filter(|r| r.addr.connected())
                .map(|r| r.addr.clone())
        };
        if let Some(addr) = live(&self.shard(hash)) {
            return Ok(addr);
        }
        self.make_room()?;
        let mut shard = self.shard(hash);
        if let Some(addr) = live(&shard) {
            return Ok(addr);
        }
        let generation = self.generations.fetch_add(1, Ordering::Relaxed);
        // The high bits: the low ones pick the shard.
        let arbiter = &self.arbiters[((hash >> 32) % self.arbiters.len() as u64) as usize];
        let (principal, context_id): (Arc<str>, Arc<str>) = (principal.into(), context_id.into());
        let addr = {
            let directory = self.clone();
            let shared = self.shared.clone();
            let (principal, context_id) = (principal.clone(), context_id.clone());
            ContextActor::start_in_arbiter(arbiter, move |_| {
                let on_stop = {
                    let (principal, context_id) = (principal.clone(), context_id.clone());
                    Box::new(move || directory.forget(&principal, &context_id, generation))
                };
                ContextActor::new(principal, context_id, shared, on_stop)
            })
        };
        let resident = Resident {
            principal,
            context_id,
            hash,
            generation,
            addr: addr.clone(),
        };
        match shard.entry(
            hash,
            |r| r.is(&resident.principal, &resident.context_id),
            |r| r.hash,
        ) {
            hashbrown::hash_table::Entry::Occupied(mut stopped) => *stopped.get_mut() = resident,
            hashbrown::hash_table::Entry::Vacant(vacant) => {
                vacant.insert(resident);
                self.resident.fetch_add(1, Ordering::AcqRel);
                metrics::gauge!("colloquy_contexts_resident").increment(1.0);
            }
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
            for resident in shard.iter().take(EVICTION_BATCH - asked) {
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
    fn forget(&self, principal: &str, context_id: &str, generation: u64) {
        let hash = self.hash(principal, context_id);
        let mut shard = self.shard(hash);
        let entry = shard.find_entry(hash, |r| {
            r.is(principal, context_id) && r.generation == generation
        });
        if let Ok(entry) = entry {
            entry.remove();
            self.resident.fetch_sub(1, Ordering::AcqRel);
            metrics::gauge!("colloquy_contexts_resident").decrement(1.0);
        }
    }

    /// Delivers `message` to the conversation's actor, starting or restarting it as needed.
    pub async fn call<M>(
        self: &Arc<Self>,
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
            let addr = self.resident(principal, context_id)?;
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
                    .iter()
                    .map(|r| r.addr.clone())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Stops the arbiters and waits for their threads (off the async thread).
    pub async fn stop_arbiters(&self) {
        let arbiters = self
            .arbiter_threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let joined = actix_rt::task::spawn_blocking(move || arbiters.map(Arbiters::stop)).await;
        if let Err(e) = joined {
            tracing::warn!(error = %e, "joining the arbiter threads failed");
        }
    }
}
