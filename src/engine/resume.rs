//! Stream event ids, and the per-task event log that lets a dropped stream resume where it
//! stopped.
//!
//! An event's id is `<turn>.<n>`: the conversation's number of the turn that produced it (each
//! turn of a task has a larger one than the turn before) and its place in that turn, from 1. A
//! snapshot of the task carries the id of the last event it includes, so an id always means
//! "everything up to here". A node logs a turn's events from the moment a stream first watches
//! it (a turn no stream watches logs nothing, so blocking sends pay nothing), in memory, bounded
//! per task ([`ResumeLimits::events`]), in time after the last event ([`ResumeLimits::keep`]) and
//! in bytes across all tasks ([`ResumeLimits::bytes`], oldest logs dropped first).
//!
//! Each watched turn is also outlined ([`StreamOutline`]: what each event was, a few bytes
//! apiece) and the outline stored with the task in the turn's final write, so once the turn's
//! end is durable any node can rebuild its events from the store ([`replay_outline`]) with no
//! write per event.

use super::hub::reply_chunk;
use crate::model::{Part, StreamItem, Task, TaskEvent, TaskStatus};
use crate::store::{OutlinedEvent, StreamOutline};
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Where an event stands in its task's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventId {
    pub turn: u64,
    pub n: u32,
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.turn, self.n)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("not an event id of this server (one is <turn>.<n>, as in 3.17, n from 1)")]
pub struct BadEventId;

impl FromStr for EventId {
    type Err = BadEventId;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (turn, n) = text.trim().split_once('.').ok_or(BadEventId)?;
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(turn) || !digits(n) {
            return Err(BadEventId);
        }
        let id = EventId {
            turn: turn.parse().map_err(|_| BadEventId)?,
            n: n.parse().map_err(|_| BadEventId)?,
        };
        // Events count from 1: no stream is ever given an id with n = 0.
        if id.n == 0 {
            return Err(BadEventId);
        }
        Ok(id)
    }
}

/// A stream item with its id (`None`: a task read from the store, with no event behind it on
/// this node; SSE then writes no `id:` line and a client keeps the last id it had).
#[derive(Debug, Clone)]
pub struct Sequenced {
    pub id: Option<EventId>,
    pub item: StreamItem,
}

/// How a resumed stream starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resumed {
    /// With the events right after the client's id.
    Replayed,
    /// With the task as it stands: the client's id is older than what is kept.
    Snapshot,
}

impl Resumed {
    pub fn label(self) -> &'static str {
        match self {
            Resumed::Replayed => "replayed",
            Resumed::Snapshot => "snapshot",
        }
    }

    /// The outcome a [`Resumed::label`] names.
    pub fn from_label(label: &str) -> Option<Resumed> {
        [Resumed::Replayed, Resumed::Snapshot]
            .into_iter()
            .find(|resumed| resumed.label() == label)
    }

    /// Counts one resume in `colloquy_stream_resumes_total`.
    pub fn count(self) {
        metrics::counter!("colloquy_stream_resumes_total", "outcome" => self.label()).increment(1);
    }
}

/// What a log answers for a client's last id.
#[derive(Debug)]
pub enum Replay {
    /// The events after it, oldest first (possibly none).
    After(Vec<Sequenced>),
    /// It is older than the oldest event kept.
    TooOld,
    /// The task never had it: it lies beyond the newest event.
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResumeLimits {
    /// Events kept per task (0: no log, every resume starts from a snapshot).
    pub events: usize,
    /// How long a task's log is kept after its last event.
    pub keep: Duration,
    /// What all logs may hold together, estimated.
    pub bytes: usize,
}

impl Default for ResumeLimits {
    fn default() -> Self {
        ResumeLimits {
            events: 1024,
            keep: Duration::from_secs(300),
            bytes: 64 * 1024 * 1024,
        }
    }
}

/// One task's recent events, across its turns on this node.
pub struct TaskLog {
    state: Mutex<LogState>,
    limits: ResumeLimits,
    total: Arc<AtomicUsize>,
}

struct LogState {
    entries: VecDeque<Entry>,
    bytes: usize,
    /// When the log was opened or last recorded an event.
    touched: Instant,
    /// Dropped from the registry: records nothing more, answers every resume with a snapshot.
    evicted: bool,
}

struct Entry {
    id: EventId,
    item: StreamItem,
    bytes: usize,
}

/// What a log itself holds, besides its events: the log and its place in the registry (the
/// task id twice, the principal). Counted in the budget so that logs without events are bounded
/// too.
const LOG_BYTES: usize = 512;

impl TaskLog {
    /// An empty log, counted at [`LOG_BYTES`] and expiring [`ResumeLimits::keep`] from now
    /// unless events come.
    fn new(limits: ResumeLimits, total: Arc<AtomicUsize>) -> Self {
        total.fetch_add(LOG_BYTES, Ordering::Relaxed);
        TaskLog {
            state: Mutex::new(LogState {
                entries: VecDeque::new(),
                bytes: LOG_BYTES,
                touched: Instant::now(),
                evicted: false,
            }),
            limits,
            total,
        }
    }

    fn lock(&self) -> MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends the event `id` (larger than any recorded before).
    pub fn record(&self, id: EventId, item: &StreamItem) {
        let mut state = self.lock();
        if state.evicted || self.limits.events == 0 {
            return;
        }
        let bytes = approx_bytes(item);
        state.entries.push_back(Entry {
            id,
            item: item.clone(),
            bytes,
        });
        state.bytes += bytes;
        self.total.fetch_add(bytes, Ordering::Relaxed);
        while state.entries.len() > self.limits.events {
            if let Some(old) = state.entries.pop_front() {
                state.bytes -= old.bytes;
                self.total.fetch_sub(old.bytes, Ordering::Relaxed);
            }
        }
        state.touched = Instant::now();
    }

    /// The newest event recorded.
    pub fn newest(&self) -> Option<EventId> {
        self.lock().entries.back().map(|e| e.id)
    }

    /// Whether the newest event recorded ends the task (a terminal status or a message).
    pub fn ended(&self) -> bool {
        self.lock().entries.back().is_some_and(|e| match &e.item {
            StreamItem::Message(_) => true,
            StreamItem::Task(task) => task.status.state.is_terminal(),
            StreamItem::Event(TaskEvent::Status { status, .. }) => status.state.is_terminal(),
            StreamItem::Event(TaskEvent::Artifact { .. }) => false,
        })
    }

    /// The events after `after`, if this log still holds `after` itself; `newest` is the newest
    /// id the task has reached (a live turn may be ahead of what was recorded).
    pub fn replay_after(&self, after: EventId, newest: Option<EventId>) -> Replay {
        let state = self.lock();
        if state.evicted {
            return Replay::TooOld;
        }
        let newest = newest.max(state.entries.back().map(|e| e.id));
        if newest.is_none_or(|newest| after > newest) {
            return Replay::Unknown;
        }
        let Some(at) = state.entries.iter().position(|e| e.id == after) else {
            return Replay::TooOld;
        };
        let items = state
            .entries
            .iter()
            .skip(at + 1)
            .map(|e| Sequenced {
                id: Some(e.id),
                item: e.item.clone(),
            })
            .collect();
        Replay::After(items)
    }

    fn expired(&self, now: Instant) -> bool {
        now.duration_since(self.lock().touched) >= self.limits.keep
    }

    fn evict(&self) {
        let mut state = self.lock();
        state.evicted = true;
        state.entries.clear();
        self.total.fetch_sub(state.bytes, Ordering::Relaxed);
        state.bytes = 0;
    }
}

/// Every task's log on this node.
pub struct ResumeLogs {
    limits: ResumeLimits,
    total: Arc<AtomicUsize>,
    /// Logs kept: `by_task`'s length, read without the lock.
    tasks: AtomicUsize,
    logs: Mutex<Logs>,
}

#[derive(Default)]
struct Logs {
    /// By task id (unique across principals), with the principal the task belongs to.
    by_task: HashMap<String, (String, Arc<TaskLog>)>,
    /// Oldest first, roughly: each sweep moves the logs it keeps to the back.
    order: VecDeque<String>,
}

/// Logs a sweep looks at, at most, each time a log is opened: keeps opening O(1).
const SWEEP_STEP: usize = 8;

impl ResumeLogs {
    pub fn new(limits: ResumeLimits) -> Self {
        ResumeLogs {
            limits,
            total: Arc::new(AtomicUsize::new(0)),
            tasks: AtomicUsize::new(0),
            logs: Mutex::new(Logs::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Logs> {
        self.logs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The task's log, if this node keeps one.
    pub fn get(&self, principal: &str, task_id: &str) -> Option<Arc<TaskLog>> {
        // Every turn asks (`TaskHub::new`): without streams there is no lock to take.
        if self.tasks.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut logs = self.lock();
        self.sweep(&mut logs);
        let (owner, log) = logs.by_task.get(task_id)?;
        (owner == principal).then(|| log.clone())
    }

    /// The task's log, made if this node keeps none.
    pub fn open(&self, principal: &str, task_id: &str) -> Arc<TaskLog> {
        let mut logs = self.lock();
        self.sweep(&mut logs);
        if let Some((owner, log)) = logs.by_task.get(task_id)
            && owner == principal
        {
            return log.clone();
        }
        let log = Arc::new(TaskLog::new(self.limits, self.total.clone()));
        let entry = (principal.to_owned(), log.clone());
        if let Some((_, replaced)) = logs.by_task.insert(task_id.to_owned(), entry) {
            replaced.evict();
        }
        logs.order.push_back(task_id.to_owned());
        self.count(&logs);
        log
    }

    /// Drops logs past their time, and the oldest while all hold more than the byte budget. Runs
    /// whenever a log is looked up or opened (each turn does), a few logs at a time; on a server
    /// that takes no turns expired logs wait, within the byte budget.
    fn sweep(&self, logs: &mut Logs) {
        let now = Instant::now();
        let mut looked = 0;
        while looked < SWEEP_STEP || self.total.load(Ordering::Relaxed) > self.limits.bytes {
            let Some(key) = logs.order.pop_front() else {
                break;
            };
            looked += 1;
            let Some((_, log)) = logs.by_task.get(&key) else {
                continue;
            };
            let over = self.total.load(Ordering::Relaxed) > self.limits.bytes;
            if over || log.expired(now) {
                log.evict();
                logs.by_task.remove(&key);
            } else {
                logs.order.push_back(key);
            }
        }
        self.count(logs);
    }

    fn count(&self, logs: &Logs) {
        self.tasks.store(logs.by_task.len(), Ordering::Relaxed);
        metrics::gauge!("colloquy_stream_logs").set(logs.by_task.len() as f64);
        metrics::gauge!("colloquy_stream_log_bytes").set(self.total.load(Ordering::Relaxed) as f64);
    }

    /// Events kept per task (and outlined per turn: see [`replay_outline`]).
    pub fn events_per_task(&self) -> usize {
        self.limits.events
    }

    /// What the logs hold together, estimated.
    pub fn bytes(&self) -> usize {
        self.total.load(Ordering::Relaxed)
    }
}

/// The events after `after` rebuilt from a turn's stored outline and the task as stored at that
/// turn's end, each as it was streamed (a chunk is the same slice of the reply's text): how a
/// node that did not run the turn, or no longer logs it, serves a resume. Only while the task
/// still stands where that turn left it (not running again).
pub fn replay_outline(outline: &StreamOutline, task: &Task, after: EventId) -> Replay {
    if after.turn != outline.turn || !task.status.state.ends_turn() {
        return Replay::TooOld;
    }
    let skip = after.n as usize;
    if skip > outline.events.len() {
        return Replay::Unknown;
    }
    let reply = outline.reply.and_then(|i| task.artifacts.get(i as usize));
    let reply_text = reply
        .and_then(|a| a.parts.first())
        .and_then(Part::as_text)
        .unwrap_or_default();
    let mut start = 0;
    let mut chunked = false;
    for event in &outline.events[..skip] {
        if let OutlinedEvent::Chunk(end) = event {
            start = *end as usize;
            chunked = true;
        }
    }
    let mut items = Vec::with_capacity(outline.events.len() - skip);
    for (i, event) in outline.events.iter().enumerate().skip(skip) {
        let event = match (event, reply) {
            (OutlinedEvent::Opened, _) => StreamItem::Task(task.clone()),
            (OutlinedEvent::Chunk(end), Some(reply)) => {
                let Some(text) = reply_text.get(start..*end as usize) else {
                    return Replay::TooOld;
                };
                start = *end as usize;
                let append = std::mem::replace(&mut chunked, true);
                StreamItem::Event(reply_chunk(task, reply, text, append, false))
            }
            (OutlinedEvent::Closed, Some(reply)) => {
                StreamItem::Event(reply_chunk(task, reply, "", true, true))
            }
            (OutlinedEvent::Chunk(_) | OutlinedEvent::Closed, None) => return Replay::TooOld,
            (OutlinedEvent::Artifact(index), _) => {
                let Some(artifact) = task.artifacts.get(*index as usize) else {
                    return Replay::TooOld;
                };
                StreamItem::Event(TaskEvent::Artifact {
                    task_id: task.id.clone(),
                    context_id: task.context_id.clone(),
                    artifact: artifact.clone(),
                    append: false,
                    last_chunk: true,
                })
            }
            (OutlinedEvent::Status(status), _) => status_event(task, (**status).clone(), false),
            (OutlinedEvent::Final, _) => status_event(task, task.status.clone(), true),
        };
        let id = EventId {
            turn: outline.turn,
            n: i as u32 + 1,
        };
        items.push(Sequenced {
            id: Some(id),
            item: event,
        });
    }
    Replay::After(items)
}

fn status_event(task: &Task, status: TaskStatus, is_final: bool) -> StreamItem {
    StreamItem::Event(TaskEvent::Status {
        task_id: task.id.clone(),
        context_id: task.context_id.clone(),
        status,
        is_final,
    })
}

/// Roughly what an item holds in memory: its texts and a fixed share for the rest (its place
/// in the log, 360 bytes, and its ids and names, a few small allocations). Calibrated
/// (2026-12-06) against RSS: 20 s of `colloquy loadgen --stream` kept 12,366 logs of four
/// events each, and RSS was 45 MB above a run with 1 MiB of logs, about 3.9 KB a log.
fn approx_bytes(item: &StreamItem) -> usize {
    const FIXED: usize = 640;
    let parts = |parts: &[Part]| -> usize {
        parts
            .iter()
            .map(|p| p.as_text().map_or(FIXED, str::len))
            .sum()
    };
    FIXED
        + match item {
            StreamItem::Message(message) => parts(&message.parts),
            StreamItem::Task(task) => {
                task.history.iter().map(|m| parts(&m.parts)).sum::<usize>()
                    + task
                        .artifacts
                        .iter()
                        .map(|a| parts(&a.parts))
                        .sum::<usize>()
            }
            StreamItem::Event(TaskEvent::Artifact { artifact, .. }) => parts(&artifact.parts),
            StreamItem::Event(TaskEvent::Status { status, .. }) => {
                status.message.as_ref().map_or(0, |m| parts(&m.parts))
            }
        }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{TaskState, TaskStatus};

    fn id(turn: u64, n: u32) -> EventId {
        EventId { turn, n }
    }

    fn status(n: u32) -> StreamItem {
        StreamItem::Event(TaskEvent::Status {
            task_id: "t".into(),
            context_id: format!("c{n}"),
            status: TaskStatus::new(TaskState::Working, None),
            is_final: false,
        })
    }

    fn ids(replay: Replay) -> Vec<EventId> {
        match replay {
            Replay::After(items) => items.into_iter().filter_map(|s| s.id).collect(),
            other => panic!("expected events, got {other:?}"),
        }
    }

    #[test]
    fn ids_round_trip_and_refuse_anything_else() {
        assert_eq!("3.17".parse(), Ok(id(3, 17)));
        assert_eq!(id(3, 17).to_string(), "3.17");
        for bad in [
            "",
            "3",
            "3.",
            ".1",
            "3.0",
            "a.1",
            "1.-2",
            "1.2.3",
            "99999999999999999999.1",
        ] {
            assert_eq!(bad.parse::<EventId>(), Err(BadEventId), "{bad:?}");
        }
        assert!(id(3, 99) < id(4, 1));
    }

    #[test]
    fn replays_after_an_id_it_holds_and_tells_old_from_unknown() {
        let logs = ResumeLogs::new(ResumeLimits {
            events: 4,
            ..ResumeLimits::default()
        });
        let log = logs.open("p", "t");
        for n in 1..=3 {
            log.record(id(1, n), &status(n));
        }
        for n in 1..=3 {
            log.record(id(2, n), &status(n));
        }
        assert!(logs.get("another principal", "t").is_none());
        // Four kept: 1.3, 2.1, 2.2, 2.3.
        assert_eq!(
            ids(log.replay_after(id(1, 3), None)),
            [id(2, 1), id(2, 2), id(2, 3)]
        );
        assert_eq!(ids(log.replay_after(id(2, 3), None)), []);
        assert!(matches!(log.replay_after(id(1, 2), None), Replay::TooOld));
        assert!(matches!(log.replay_after(id(2, 4), None), Replay::Unknown));
        assert!(matches!(log.replay_after(id(3, 1), None), Replay::Unknown));
        // A live turn ahead of the log: an id between is old, not unknown.
        assert!(matches!(
            log.replay_after(id(3, 1), Some(id(3, 5))),
            Replay::TooOld
        ));
    }

    #[test]
    fn the_byte_budget_drops_the_oldest_logs() {
        let logs = ResumeLogs::new(ResumeLimits {
            bytes: 2_000,
            ..ResumeLimits::default()
        });
        let first = logs.open("p", "first");
        for n in 1..=10 {
            first.record(id(1, n), &status(n));
        }
        assert!(logs.bytes() > 1_800);
        let second = logs.open("p", "second");
        second.record(id(1, 1), &status(1));
        let _third = logs.open("p", "third");
        assert!(
            logs.get("p", "first").is_none(),
            "the oldest log goes first"
        );
        assert!(matches!(first.replay_after(id(1, 1), None), Replay::TooOld));
        assert!(logs.get("p", "second").is_some());
        assert!(logs.bytes() <= 2_000);
    }

    #[test]
    fn logs_expire_after_their_last_event() {
        let logs = ResumeLogs::new(ResumeLimits {
            keep: Duration::ZERO,
            ..ResumeLimits::default()
        });
        let log = logs.open("p", "t");
        log.record(id(1, 1), &status(1));
        let _other = logs.open("p", "other");
        assert!(logs.get("p", "t").is_none());
        assert_eq!(logs.bytes(), 0);
    }

    #[test]
    fn logs_without_events_are_bounded_too() {
        let logs = ResumeLogs::new(ResumeLimits {
            events: 0,
            bytes: 10 * LOG_BYTES,
            ..ResumeLimits::default()
        });
        for n in 0..100 {
            logs.open("p", &format!("t{n}"));
        }
        assert!(logs.bytes() <= 11 * LOG_BYTES, "{}", logs.bytes());
        assert!(logs.tasks.load(Ordering::Relaxed) <= 11);
    }
}
