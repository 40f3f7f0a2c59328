//! What every conversation actor and turn shares: the configuration, the store, the agent,
//! the live tasks and the running-turn count.

use super::error::{EngineError, EngineResult};
use super::hub::TaskHub;
use super::resume::{ResumeLimits, ResumeLogs};
use super::validate::MessageLimits;
use super::window::{WindowBudget, WindowLimits};
use crate::agent::SharedAgent;
use crate::history::HistoryLimits;
use crate::store::SharedStore;
use crate::telemetry::kept;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub history: HistoryLimits,
    /// A conversation's actor stops after this long without a message (its state is on disk).
    pub idle_timeout: Duration,
    /// A turn whose agent has not finished by then fails.
    pub agent_timeout: Duration,
    /// Events a stream may fall behind before it is closed with an error.
    pub subscriber_buffer: usize,
    /// Arbiter threads that host the conversation actors.
    pub arbiters: usize,
    /// Turns running at once across all conversations; beyond, sends are refused as overloaded.
    pub max_running_turns: usize,
    /// What a caller's message may hold.
    pub message: MessageLimits,
    /// Live conversation actors; past it idle ones are stopped first, and past 110% new
    /// conversations are refused as overloaded.
    pub max_resident: usize,
    /// What one listing page may hold, in bytes (estimated from stored sizes): a page stops
    /// early once it is reached, though a single larger record is still returned alone.
    pub response_bytes: usize,
    /// How long a turn's lease on its conversation lasts unless renewed: the turn renews it
    /// every third of this, and stops its agent if it cannot for this long.
    pub lease: Duration,
    /// How the history windows actors keep between turns are bounded.
    pub window: WindowLimits,
    /// What the logs that resumed streams replay from may hold.
    pub resume: ResumeLimits,
}

/// The default of [`EngineConfig::response_bytes`].
pub const DEFAULT_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            history: HistoryLimits::default(),
            idle_timeout: Duration::from_secs(30),
            agent_timeout: Duration::from_secs(600),
            subscriber_buffer: 1024,
            arbiters: crate::config::default_threads(),
            max_running_turns: 10_000,
            message: MessageLimits::default(),
            max_resident: 1_000_000,
            response_bytes: DEFAULT_RESPONSE_BYTES,
            lease: Duration::from_secs(30),
            window: WindowLimits::default(),
            resume: ResumeLimits::default(),
        }
    }
}

/// The hubs of running turns, by task id.
#[derive(Default)]
pub struct TaskRegistry {
    shards: [Mutex<HashMap<String, Arc<TaskHub>>>; 16],
}

impl TaskRegistry {
    fn shard(&self, task_id: &str) -> std::sync::MutexGuard<'_, HashMap<String, Arc<TaskHub>>> {
        let index = task_id
            .bytes()
            .fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(b as usize));
        self.shards[index % self.shards.len()]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn insert(&self, hub: Arc<TaskHub>) {
        self.shard(&hub.task_id).insert(hub.task_id.clone(), hub);
    }

    /// Unlists `hub`, and only it: the task's next turn may have listed its own since.
    pub(super) fn remove(&self, hub: &Arc<TaskHub>) {
        let mut shard = self.shard(&hub.task_id);
        if shard
            .get(&hub.task_id)
            .is_some_and(|listed| Arc::ptr_eq(listed, hub))
        {
            shard.remove(&hub.task_id);
        }
    }

    /// The hub of a running task, if it belongs to `principal`.
    pub(super) fn get(&self, principal: &str, task_id: &str) -> Option<Arc<TaskHub>> {
        self.shard(task_id)
            .get(task_id)
            .filter(|hub| hub.principal == principal)
            .cloned()
    }
}

/// What every actor and turn shares.
pub struct Shared {
    pub store: SharedStore,
    pub agent: SharedAgent,
    pub config: EngineConfig,
    pub live: TaskRegistry,
    pub(super) running: AtomicUsize,
    pub(super) shutting_down: AtomicBool,
    pub(super) readiness: super::readiness::Readiness,
    /// What the actors' kept history windows hold together.
    pub(super) windows: Arc<WindowBudget>,
    /// Each task's recent stream events, for streams that resume.
    pub(super) resume: Arc<ResumeLogs>,
    /// Where the events of turns other nodes run come from (unset on one node).
    pub(super) relay: std::sync::OnceLock<Arc<dyn super::Relay>>,
}

impl Shared {
    pub fn running_turns(&self) -> usize {
        self.running.load(Ordering::Acquire)
    }
}

/// One turn counted in the engine's running total while held.
pub struct Permit(Arc<Shared>);

impl Permit {
    /// Counts a turn in, unless the server is full or shutting down.
    pub fn take(shared: &Arc<Shared>) -> EngineResult<Permit> {
        if shared.shutting_down.load(Ordering::Acquire) {
            return Err(EngineError::ShuttingDown);
        }
        let running = shared.running.fetch_add(1, Ordering::AcqRel) + 1;
        if running > shared.config.max_running_turns {
            shared.running.fetch_sub(1, Ordering::AcqRel);
            metrics::counter!("colloquy_overload_rejections_total").increment(1);
            return Err(EngineError::Overloaded {
                running: running - 1,
                retry_after_ms: 100,
            });
        }
        busy_gauge().set(running as f64);
        Ok(Permit(shared.clone()))
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let running = self
            .0
            .running
            .fetch_sub(1, Ordering::AcqRel)
            .saturating_sub(1);
        busy_gauge().set(running as f64);
    }
}

fn busy_gauge() -> metrics::Gauge {
    kept!(gauge, "colloquy_contexts_busy")
}
