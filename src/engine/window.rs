//! The history window a conversation's actor keeps between turns.
//!
//! A turn shows its agent the conversation's latest messages, and reading and decoding them
//! was the largest part of a turn's store work (docs/architecture.md, "The cost of a turn").
//! The turn that just ended knows them: the window it was shown, the caller's message and the
//! reply. It leaves them with its conversation's actor, marked with where it left the
//! conversation ([`ConversationMark`]); the next turn hands the mark to the store, which reads
//! no window if the conversation still stands there, that is, if no other turn (on this node or
//! another) wrote to it since.
//!
//! Memory stays bounded: an actor drops its window once it has been kept for
//! `contexts.history_cache_secs` without a turn, and all windows together stay under
//! `contexts.history_cache_bytes` (a turn that would pass it keeps nothing).

use super::shared::Shared;
use crate::history::HistoryEntry;
use crate::store::ConversationMark;
use crate::telemetry::kept;
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How kept windows are bounded (`contexts.history_cache_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowLimits {
    /// A window unused for this long is dropped.
    pub keep: Duration,
    /// All kept windows together, estimated; 0 keeps none.
    pub bytes: usize,
}

impl WindowLimits {
    /// Windows are kept at all (a zero budget or a zero keep turns them off).
    pub fn enabled(&self) -> bool {
        self.bytes > 0 && !self.keep.is_zero()
    }
}

impl Default for WindowLimits {
    fn default() -> Self {
        WindowLimits {
            keep: Duration::from_secs(10),
            bytes: 64 * 1024 * 1024,
        }
    }
}

/// The bytes all kept windows hold, against [`WindowLimits::bytes`].
pub struct WindowBudget {
    limit: usize,
    used: AtomicUsize,
}

impl WindowBudget {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(WindowBudget {
            limit,
            used: AtomicUsize::new(0),
        })
    }

    fn reserve(self: &Arc<Self>, bytes: usize) -> Option<Reservation> {
        let reserved = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|total| *total <= self.limit)
            })
            .is_ok();
        reserved.then(|| {
            cache_gauge().increment(bytes as f64);
            Reservation {
                budget: self.clone(),
                bytes,
            }
        })
    }
}

/// A window's share of the budget, given back when the window goes.
struct Reservation {
    budget: Arc<WindowBudget>,
    bytes: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
        cache_gauge().decrement(self.bytes as f64);
    }
}

fn cache_gauge() -> metrics::Gauge {
    kept!(gauge, "colloquy_history_cache_bytes")
}

/// A conversation's latest messages as the store holds them at `mark`.
pub(super) struct Window {
    pub(super) mark: ConversationMark,
    /// Oldest first, at most the history limit.
    pub(super) entries: Vec<HistoryEntry>,
    kept_at: Instant,
    _reservation: Reservation,
}

impl Window {
    /// The window after a turn: the one its agent was shown, then the caller's message and the
    /// reply, cut to the latest `limit`; None if the budget cannot hold it.
    pub(super) fn after_turn(
        mut entries: Vec<HistoryEntry>,
        message: HistoryEntry,
        reply: Option<HistoryEntry>,
        mark: ConversationMark,
        limit: usize,
        budget: &Arc<WindowBudget>,
    ) -> Option<Window> {
        entries.push(message);
        entries.extend(reply);
        let excess = entries.len().saturating_sub(limit);
        entries.drain(..excess);
        let bytes = entries.iter().map(entry_bytes).sum::<usize>()
            + std::mem::size_of::<Window>()
            + entries.capacity() * std::mem::size_of::<HistoryEntry>();
        let reservation = budget.reserve(bytes)?;
        Some(Window {
            mark,
            entries,
            kept_at: Instant::now(),
            _reservation: reservation,
        })
    }
}

/// The heap bytes of an entry besides its own size.
fn entry_bytes(entry: &HistoryEntry) -> usize {
    entry.text.capacity()
        + entry.message_id.capacity()
        + entry.task_id.as_ref().map_or(0, String::capacity)
}

/// The window a conversation's actor keeps, shared with the turn running in it (the actor's
/// slot lets one turn run at a time, so the turn takes it at its start and leaves the next one
/// at its end).
#[derive(Clone, Default)]
pub(super) struct KeptWindow(Arc<Mutex<Option<Window>>>);

impl KeptWindow {
    pub(super) fn take(&self) -> Option<Window> {
        self.0.lock().take()
    }

    pub(super) fn keep(&self, window: Window) {
        *self.0.lock() = Some(window);
    }

    /// Keeps the window after a turn that stored the caller's `message` and `reply` and left
    /// its conversation at `mark`; `shown` is the window its agent was shown.
    pub(super) fn keep_after(
        &self,
        shared: &Shared,
        shown: Arc<Vec<HistoryEntry>>,
        message: HistoryEntry,
        reply: Option<HistoryEntry>,
        mark: ConversationMark,
    ) {
        if !shared.config.window.enabled() {
            return;
        }
        let limit = shared.config.history.limit;
        // The agent's request is gone by now, so the entries are the turn's alone.
        let entries = Arc::unwrap_or_clone(shown);
        if let Some(window) =
            Window::after_turn(entries, message, reply, mark, limit, &shared.windows)
        {
            self.keep(window);
        }
    }

    pub(super) fn forget(&self) {
        self.0.lock().take();
    }

    /// Drops the window if it was kept `keep` ago or earlier. Returns how long the window
    /// left has to go, if there is one.
    pub(super) fn expire(&self, keep: Duration) -> Option<Duration> {
        let mut kept = self.0.lock();
        let left = keep.saturating_sub(kept.as_ref()?.kept_at.elapsed());
        if left.is_zero() {
            kept.take();
            return None;
        }
        Some(left)
    }
}
