//! Fan-out of one running task's events to any number of streams.
//!
//! The hub keeps a snapshot of the task (status and every artifact with all content so far) and
//! updates it under the same lock that publishes each event, so a subscriber joining at any point
//! gets the snapshot and then exactly the events after it: no prefix lost, none doubled.
//! Each subscriber has a bounded buffer; one that falls behind is dropped and told so, never
//! silently skipped ahead, and never slows the agent or the other subscribers.

use crate::model::{Artifact, Part, SendResult, Task, TaskEvent, TaskStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::{mpsc, watch};

pub use crate::model::StreamItem;

/// The name of the one artifact every streamed reply is appended to.
pub const REPLY_ARTIFACT_NAME: &str = "reply";

pub struct TaskHub {
    pub principal: String,
    pub task_id: String,
    state: Mutex<HubState>,
    done: watch::Sender<Option<SendResult>>,
    buffer: usize,
}

struct HubState {
    task: Task,
    reply_artifact: Option<usize>,
    /// Streams get the task once it is open; until then a message-capable agent may still answer
    /// with a plain message instead.
    open: bool,
    finished: bool,
    subscribers: Vec<Subscriber>,
}

struct Subscriber {
    tx: mpsc::Sender<StreamItem>,
    overflowed: Arc<AtomicBool>,
}

/// One stream's view of a task.
pub struct Subscription {
    pub items: mpsc::Receiver<StreamItem>,
    overflowed: Arc<AtomicBool>,
}

impl Subscription {
    /// True when the stream ended because this subscriber fell behind its buffer.
    pub fn overflowed(&self) -> bool {
        self.overflowed.load(Ordering::Acquire)
    }

    /// A subscription that yields just `item` and ends.
    pub fn single(item: StreamItem) -> Self {
        let (tx, rx) = mpsc::channel(1);
        let _ = tx.try_send(item);
        Subscription {
            items: rx,
            overflowed: Arc::new(AtomicBool::new(false)),
        }
    }
}

/// The sending side of a subscription fed from elsewhere (one that follows several turns).
pub struct Forwarder {
    pub tx: mpsc::Sender<StreamItem>,
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
    pub fn forwarding(buffer: usize) -> (Forwarder, Subscription) {
        let (tx, items) = mpsc::channel(buffer);
        let overflowed = Arc::new(AtomicBool::new(false));
        let forwarder = Forwarder {
            tx,
            overflowed: overflowed.clone(),
        };
        (forwarder, Subscription { items, overflowed })
    }
}

/// An update of the reply artifact carrying one chunk of text.
fn reply_chunk(
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
    pub fn new(principal: String, task: Task, open: bool, buffer: usize) -> Arc<Self> {
        let (done, _) = watch::channel(None);
        Arc::new(TaskHub {
            principal,
            task_id: task.id.clone(),
            state: Mutex::new(HubState {
                task,
                reply_artifact: None,
                open,
                finished: false,
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
        self.lock().task.clone()
    }

    pub fn subscribe(&self) -> Subscription {
        let mut state = self.lock();
        let (tx, rx) = mpsc::channel(self.buffer);
        let overflowed = Arc::new(AtomicBool::new(false));
        if state.finished {
            let final_item = match self.done.borrow().clone() {
                Some(SendResult::Message(message)) => StreamItem::Message(message),
                _ => StreamItem::Task(state.task.clone()),
            };
            let _ = tx.try_send(final_item);
        } else {
            if state.open {
                let _ = tx.try_send(StreamItem::Task(state.task.clone()));
            }
            state.subscribers.push(Subscriber {
                tx,
                overflowed: overflowed.clone(),
            });
        }
        Subscription {
            items: rx,
            overflowed,
        }
    }

    /// Lets streams see the task (sending each waiting subscriber the snapshot).
    pub fn open(&self) {
        let mut state = self.lock();
        Self::open_locked(&mut state);
    }

    fn open_locked(state: &mut HubState) {
        if !state.open {
            state.open = true;
            let item = StreamItem::Task(state.task.clone());
            Self::broadcast(state, item);
        }
    }

    fn broadcast(state: &mut HubState, item: StreamItem) {
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
        Self::open_locked(&mut state);
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
        let task = &mut state.task;
        let artifact = &mut task.artifacts[index];
        if let Some(Part {
            content: crate::model::PartContent::Text { text },
            ..
        }) = artifact.parts.first_mut()
        {
            text.push_str(chunk);
        }
        let event = reply_chunk(task, &task.artifacts[index], chunk, append, false);
        Self::broadcast(&mut state, StreamItem::Event(event));
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
        Self::open_locked(&mut state);
        state.task.artifacts.push(artifact.clone());
        let event = TaskEvent::Artifact {
            task_id: state.task.id.clone(),
            context_id: state.task.context_id.clone(),
            artifact,
            append: false,
            last_chunk: true,
        };
        Self::broadcast(&mut state, StreamItem::Event(event));
    }

    /// A status change that does not end the stream.
    pub fn status(&self, status: TaskStatus) {
        let mut state = self.lock();
        Self::open_locked(&mut state);
        state.task.status = status.clone();
        let event = TaskEvent::Status {
            task_id: state.task.id.clone(),
            context_id: state.task.context_id.clone(),
            status,
            is_final: false,
        };
        Self::broadcast(&mut state, StreamItem::Event(event));
    }

    /// Ends the turn: closes the reply artifact, sends the final status, closes every stream and
    /// wakes blocking senders. Call only after the outcome is durable.
    pub fn finish(&self, result: SendResult) {
        let mut state = self.lock();
        if state.finished {
            return;
        }
        match &result {
            SendResult::Message(message) if !state.open => {
                Self::broadcast(&mut state, StreamItem::Message(message.clone()));
            }
            SendResult::Message(_) => {}
            SendResult::Task(task) => {
                Self::open_locked(&mut state);
                if let Some(index) = state.reply_artifact {
                    // The closing chunk is empty: chunks are sent as they come, before the end is known.
                    let event =
                        reply_chunk(&state.task, &state.task.artifacts[index], "", true, true);
                    Self::broadcast(&mut state, StreamItem::Event(event));
                }
                let event = TaskEvent::Status {
                    task_id: task.id.clone(),
                    context_id: task.context_id.clone(),
                    status: task.status.clone(),
                    is_final: true,
                };
                Self::broadcast(&mut state, StreamItem::Event(event));
                state.task = task.clone();
            }
        }
        state.finished = true;
        state.subscribers.clear();
        drop(state);
        self.done.send_replace(Some(result));
    }

    /// Resolves with the turn's outcome once [`TaskHub::finish`] ran.
    pub async fn wait_final(&self) -> Option<SendResult> {
        let mut rx = self.done.subscribe();
        let result = rx.wait_for(Option::is_some).await.ok()?;
        result.clone()
    }

    /// Every artifact so far (the reply with all its text, then whole ones).
    pub fn artifacts(&self) -> Vec<Artifact> {
        self.lock().task.artifacts.clone()
    }
}
