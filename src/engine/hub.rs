//! Fan-out of one running task's events to any number of streams.
//!
//! The hub keeps a snapshot of the task (status and every artifact with all content so far) and
//! updates it under the same lock that publishes each event, so a subscriber joining at any point
//! gets the snapshot and then exactly the events after it: no prefix lost, none doubled.
//! Every event gets its id (`resume`) under that lock too, and once a stream watches the turn
//! each event is also written to the task's resume log, so a stream that resumes after an id gets
//! the logged events after it and then the live ones, again with nothing lost or doubled.
//! Each subscriber has a bounded buffer; one that falls behind is dropped and told so, never
//! silently skipped ahead, and never slows the agent or the other subscribers.

use super::resume::{EventId, Replay, ResumeLogs, Resumed, Sequenced, TaskLog};
use crate::model::{Artifact, Part, SendResult, Task, TaskEvent, TaskStatus};
use crate::store::{OutlinedEvent, StreamOutline};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::{mpsc, watch};

pub use crate::model::StreamItem;

/// The name of the one artifact every streamed reply is appended to.
pub const REPLY_ARTIFACT_NAME: &str = "reply";

pub struct TaskHub {
    pub principal: String,
    pub task_id: String,
    /// The conversation's number of this turn: the first half of its events' ids.
    turn: u64,
    logs: Arc<ResumeLogs>,
    state: Mutex<HubState>,
    done: watch::Sender<Option<Arc<SendResult>>>,
    buffer: usize,
}

struct HubState {
    /// The task as the turn builds it. A finished turn's task is its outcome's, in `done`
    /// ([`TaskHub::task_now`]): finishing copies nothing into this one.
    task: Task,
    reply_artifact: Option<usize>,
    /// Streams get the task once it is open; until then a message-capable agent may still answer
    /// with a plain message instead.
    open: bool,
    finished: bool,
    /// Events published so far: the second half of the last one's id.
    published: u32,
    /// The task's resume log, once a stream watches this turn.
    log: Option<Arc<TaskLog>>,
    /// What each event so far was, for the store (None once it cannot be outlined: a plain
    /// message, or more events than a log keeps).
    outline: Option<Vec<OutlinedEvent>>,
    subscribers: Vec<Subscriber>,
}

struct Subscriber {
    tx: mpsc::Sender<Sequenced>,
    overflowed: Arc<AtomicBool>,
}

/// One stream's view of a task.
pub struct Subscription {
    pub items: mpsc::Receiver<Sequenced>,
    overflowed: Arc<AtomicBool>,
    /// How it started, when it resumed after an id.
    pub resumed: Option<Resumed>,
    /// Its events come from another node (`relay`): an end without the turn's is a cut.
    pub relayed: bool,
}

impl Subscription {
    /// True when the stream ended because this subscriber fell behind its buffer.
    pub fn overflowed(&self) -> bool {
        self.overflowed.load(Ordering::Acquire)
    }

    /// A subscription that yields `items` and ends.
    pub fn fixed(items: Vec<Sequenced>, resumed: Option<Resumed>) -> Self {
        let (tx, rx) = mpsc::channel(items.len().max(1));
        for item in items {
            let _ = tx.try_send(item);
        }
        Subscription {
            items: rx,
            overflowed: Arc::new(AtomicBool::new(false)),
            resumed,
            relayed: false,
        }
    }

    /// A subscription that yields just `item`, without an id, and ends.
    pub fn single(item: StreamItem) -> Self {
        Self::fixed(vec![Sequenced { id: None, item }], None)
    }
}

/// The sending side of a subscription fed from elsewhere (one that follows several turns).
pub struct Forwarder {
    pub tx: mpsc::Sender<Sequenced>,
    overflowed: Arc<AtomicBool>,
}

impl Forwarder {
    /// Ends the subscription as fallen behind (the stream says so).
    pub fn overflowed(&self) {
        self.overflowed.store(true, Ordering::Release);
    }
}

impl Subscription {
    /// An empty subscription with `buffer` items of room, and its sending side.
    pub fn forwarding(buffer: usize, resumed: Option<Resumed>) -> (Forwarder, Subscription) {
        let (tx, items) = mpsc::channel(buffer);
        let overflowed = Arc::new(AtomicBool::new(false));
        let forwarder = Forwarder {
            tx,
            overflowed: overflowed.clone(),
        };
        let subscription = Subscription {
            items,
            overflowed,
            resumed,
            relayed: false,
        };
        (forwarder, subscription)
    }
}

/// A resume after an id this task never reached.
#[derive(Debug)]
pub struct UnknownEventId;

/// An update of the reply artifact carrying one chunk of text.
pub(super) fn reply_chunk(
    task: &Task,
    reply: &Artifact,
    chunk: &str,
    append: bool,
    last_chunk: bool,
) -> TaskEvent {
    TaskEvent::Artifact {
        task_id: task.id.clone(),
        context_id: task.context_id.clone(),
        artifact: Artifact {
            artifact_id: reply.artifact_id.clone(),
            name: reply.name.clone(),
            description: None,
            parts: vec![Part::text(chunk)],
            metadata: None,
        },
        append,
        last_chunk,
    }
}

impl TaskHub {
    pub fn new(
        principal: String,
        task: Task,
        turn: u64,
        open: bool,
        buffer: usize,
        logs: Arc<ResumeLogs>,
    ) -> Arc<Self> {
        let (done, _) = watch::channel(None);
        // A task streams have watched before on this node logs its later turns from their
        // start, so that a stream following it misses nothing of a turn shorter than its look.
        let log = logs.get(&principal, &task.id);
        let outline = (logs.events_per_task() > 0).then(|| match open {
            true => vec![OutlinedEvent::Opened],
            false => Vec::new(),
        });
        if let Some(log) = &log
            && open
        {
            log.record(EventId { turn, n: 1 }, &StreamItem::Task(task.clone()));
        }
        Arc::new(TaskHub {
            principal,
            task_id: task.id.clone(),
            turn,
            logs,
            state: Mutex::new(HubState {
                task,
                reply_artifact: None,
                open,
                finished: false,
                published: u32::from(open),
                log,
                outline,
                subscribers: Vec::new(),
            }),
            done,
            buffer: buffer.max(2),
        })
    }

    fn lock(&self) -> MutexGuard<'_, HubState> {
        // A poisoned lock only means another thread panicked mid-update; the snapshot is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn snapshot(&self) -> Task {
        self.task_now(&self.lock())
    }

    /// The task as it stands: the outcome's once the turn finished with a task, else as built.
    fn task_now(&self, state: &HubState) -> Task {
        match self.done.borrow().as_deref() {
            Some(SendResult::Task(task)) => task.clone(),
            _ => state.task.clone(),
        }
    }

    /// The id of the last event published (`n` 0 before the first).
    fn newest(&self, state: &HubState) -> EventId {
        EventId {
            turn: self.turn,
            n: state.published,
        }
    }

    /// A stream of the task from now: the task so far, then every later event.
    pub fn subscribe(&self) -> Subscription {
        let mut state = self.lock();
        self.log_from_now(&mut state);
        self.attach(&mut state, Vec::new(), true, None)
    }

    /// A stream that goes on right after `after`: the logged events after it, then the live
    /// ones; the task so far when `after` is older than the log.
    pub fn resume(&self, after: EventId) -> Result<Subscription, UnknownEventId> {
        let mut state = self.lock();
        let newest = self.newest(&state);
        if after > newest {
            return Err(UnknownEventId);
        }
        let log = self.log_from_now(&mut state);
        let replay = if after == newest {
            Replay::After(Vec::new())
        } else {
            log.replay_after(after, Some(newest))
        };
        match replay {
            Replay::After(items) => {
                Ok(self.attach(&mut state, items, false, Some(Resumed::Replayed)))
            }
            Replay::TooOld => {
                Ok(self.attach(&mut state, Vec::new(), true, Some(Resumed::Snapshot)))
            }
            Replay::Unknown => Err(UnknownEventId),
        }
    }

    /// The task's log, recording this turn's events from now on. A log that starts after the
    /// turn's first event gets the task so far as its entry for what came before.
    fn log_from_now(&self, state: &mut HubState) -> Arc<TaskLog> {
        if let Some(log) = &state.log {
            return log.clone();
        }
        let log = self.logs.open(&self.principal, &self.task_id);
        let newest = self.newest(state);
        if state.open && newest.n > 0 && log.newest() < Some(newest) {
            log.record(newest, &StreamItem::Task(self.task_now(state)));
        }
        state.log = Some(log.clone());
        log
    }

    /// A new subscriber: `replay` first, then (with `snapshot`) the task so far, then the live
    /// events; on a finished turn, the replay or the outcome, and the end.
    fn attach(
        &self,
        state: &mut HubState,
        replay: Vec<Sequenced>,
        snapshot: bool,
        resumed: Option<Resumed>,
    ) -> Subscription {
        let (tx, rx) = mpsc::channel(self.buffer + replay.len());
        let overflowed = Arc::new(AtomicBool::new(false));
        for item in replay {
            let _ = tx.try_send(item);
        }
        let id = Some(self.newest(state));
        if state.finished {
            if snapshot {
                // `task_now`'s choice, with a message besides (one borrow of `done`).
                let item = match self.done.borrow().as_deref() {
                    Some(SendResult::Message(message)) => StreamItem::Message(message.clone()),
                    Some(SendResult::Task(task)) => StreamItem::Task(task.clone()),
                    None => StreamItem::Task(state.task.clone()),
                };
                let _ = tx.try_send(Sequenced { id, item });
            }
        } else {
            if snapshot && state.open {
                let item = StreamItem::Task(state.task.clone());
                let _ = tx.try_send(Sequenced { id, item });
            }
            state.subscribers.push(Subscriber {
                tx,
                overflowed: overflowed.clone(),
            });
        }
        Subscription {
            items: rx,
            overflowed,
            resumed,
            relayed: false,
        }
    }

    /// Lets streams see the task (sending each waiting subscriber the snapshot).
    pub fn open(&self) {
        let mut state = self.lock();
        self.open_locked(&mut state);
    }

    fn open_locked(&self, state: &mut HubState) {
        if !state.open {
            state.open = true;
            self.publish(state, Some(OutlinedEvent::Opened), |state| {
                StreamItem::Task(state.task.clone())
            });
        }
    }

    /// Publishes the next event (the task's state already includes it): its id, `outlined` (what
    /// it is in the turn's outline; None for an event no outline holds), and, for the log and
    /// every subscriber, the event `item` builds. Nobody reads a blocking send's events unless a
    /// stream joins, so they are built only for a log or a subscriber.
    fn publish(
        &self,
        state: &mut HubState,
        outlined: Option<OutlinedEvent>,
        item: impl FnOnce(&HubState) -> StreamItem,
    ) {
        state.published += 1;
        if let Some(events) = &mut state.outline {
            match outlined {
                Some(event) if events.len() < self.logs.events_per_task() => events.push(event),
                _ => state.outline = None,
            }
        }
        if state.log.is_none() && state.subscribers.is_empty() {
            return;
        }
        let item = item(state);
        let id = self.newest(state);
        if let Some(log) = &state.log {
            log.record(id, &item);
        }
        let item = Sequenced { id: Some(id), item };
        state
            .subscribers
            .retain(|sub| match sub.tx.try_send(item.clone()) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    sub.overflowed.store(true, Ordering::Release);
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            });
    }

    /// Appends a chunk to the reply artifact and streams it (`append` after the first chunk).
    pub fn append_text(&self, chunk: &str) {
        let mut state = self.lock();
        self.open_locked(&mut state);
        let (index, append) = match state.reply_artifact {
            Some(index) => (index, true),
            None => {
                state.task.artifacts.push(Artifact {
                    artifact_id: uuid::Uuid::new_v4().to_string(),
                    name: Some(REPLY_ARTIFACT_NAME.into()),
                    description: None,
                    parts: vec![Part::text("")],
                    metadata: None,
                });
                let index = state.task.artifacts.len() - 1;
                state.reply_artifact = Some(index);
                (index, false)
            }
        };
        let mut text_end = 0;
        if let Some(Part {
            content: crate::model::PartContent::Text { text },
            ..
        }) = state.task.artifacts[index].parts.first_mut()
        {
            text.push_str(chunk);
            text_end = text.len();
        }
        let outlined = u32::try_from(text_end).ok().map(OutlinedEvent::Chunk);
        self.publish(&mut state, outlined, |state| {
            let reply = &state.task.artifacts[index];
            StreamItem::Event(reply_chunk(&state.task, reply, chunk, append, false))
        });
    }

    /// The reply text so far.
    pub fn reply_text(&self) -> String {
        let state = self.lock();
        state
            .reply_artifact
            .and_then(|i| state.task.artifacts[i].parts.first())
            .and_then(Part::as_text)
            .unwrap_or_default()
            .to_owned()
    }

    /// Adds a whole artifact besides the reply.
    pub fn add_artifact(&self, artifact: Artifact) {
        let mut state = self.lock();
        self.open_locked(&mut state);
        let index = state.task.artifacts.len();
        state.task.artifacts.push(artifact);
        let outlined = u32::try_from(index).ok().map(OutlinedEvent::Artifact);
        self.publish(&mut state, outlined, |state| {
            StreamItem::Event(TaskEvent::Artifact {
                task_id: state.task.id.clone(),
                context_id: state.task.context_id.clone(),
                artifact: state.task.artifacts[index].clone(),
                append: false,
                last_chunk: true,
            })
        });
    }

    /// A status change that does not end the stream.
    pub fn status(&self, status: TaskStatus) {
        let mut state = self.lock();
        self.open_locked(&mut state);
        let outlined = OutlinedEvent::Status(Box::new(status.clone()));
        state.task.status = status;
        self.publish(&mut state, Some(outlined), |state| {
            StreamItem::Event(TaskEvent::Status {
                task_id: state.task.id.clone(),
                context_id: state.task.context_id.clone(),
                status: state.task.status.clone(),
                is_final: false,
            })
        });
    }

    /// Ends the turn: closes the reply artifact, sends the final status, closes every stream and
    /// wakes blocking senders. Call only after the outcome is durable.
    pub fn finish(&self, result: Arc<SendResult>) {
        let mut state = self.lock();
        if state.finished {
            return;
        }
        match &*result {
            SendResult::Message(message) if !state.open => {
                self.publish(&mut state, None, |_| StreamItem::Message(message.clone()));
            }
            SendResult::Message(_) => {}
            SendResult::Task(task) => {
                self.open_locked(&mut state);
                if let Some(index) = state.reply_artifact {
                    // The closing chunk is empty: chunks are sent as they come, before the end is known.
                    self.publish(&mut state, Some(OutlinedEvent::Closed), |state| {
                        let reply = &state.task.artifacts[index];
                        StreamItem::Event(reply_chunk(&state.task, reply, "", true, true))
                    });
                }
                self.publish(&mut state, Some(OutlinedEvent::Final), |_| {
                    StreamItem::Event(TaskEvent::Status {
                        task_id: task.id.clone(),
                        context_id: task.context_id.clone(),
                        status: task.status.clone(),
                        is_final: true,
                    })
                });
            }
        }
        state.finished = true;
        state.subscribers.clear();
        // Published under the lock: a finished hub's task is the outcome's (`task_now`), so no
        // reader may find the hub finished before the outcome is there.
        self.done.send_replace(Some(result));
    }

    /// The outline of this turn as [`TaskHub::finish`] will end it with `result`, for its final
    /// write: only for a turn a stream watched (no other can be resumed).
    pub fn outline_at_end(&self, result: &SendResult) -> Option<StreamOutline> {
        let state = self.lock();
        if state.log.is_none() || !matches!(result, SendResult::Task(_)) {
            return None;
        }
        let mut events = state.outline.clone()?;
        if !state.open {
            events.push(OutlinedEvent::Opened);
        }
        if state.reply_artifact.is_some() {
            events.push(OutlinedEvent::Closed);
        }
        events.push(OutlinedEvent::Final);
        (events.len() <= self.logs.events_per_task()).then(|| StreamOutline {
            turn: self.turn,
            reply: state.reply_artifact.map(|i| i as u32),
            events,
        })
    }

    /// Resolves with the turn's outcome once [`TaskHub::finish`] ran.
    pub async fn wait_final(&self) -> Option<Arc<SendResult>> {
        let mut rx = self.done.subscribe();
        let result = rx.wait_for(Option::is_some).await.ok()?;
        result.clone()
    }

    /// Every artifact so far (the reply with all its text, then whole ones).
    pub fn artifacts(&self) -> Vec<Artifact> {
        self.lock().task.artifacts.clone()
    }
}
