//! A subscription that follows a task, not a turn: when a turn ends waiting for input
//! (`input-required`, `auth-required`), it stays open, takes up the turn that continues the
//! task, and closes only when the task reaches a terminal state (or the server stops).

use super::Engine;
use super::hub::{StreamItem, Subscription};
use super::resume::{EventId, Replay, Sequenced};
use crate::model::{TaskEvent, TaskState};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// How often a subscriber waiting for the next turn looks for it on this node.
const LIVE_POLL: Duration = Duration::from_millis(50);
/// How often it reads the stored task (a cancel while waiting ends the task without a turn).
const STORE_POLL: Duration = Duration::from_secs(1);

/// What the last item forwarded said about the task.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Seen {
    Running,
    Waiting,
    Ended,
}

fn seen(item: &StreamItem) -> Option<TaskState> {
    match item {
        StreamItem::Task(task) => Some(task.status.state),
        StreamItem::Event(TaskEvent::Status { status, .. }) => Some(status.state),
        _ => None,
    }
}

/// `first` (the current turn's subscription, or the waiting task alone), then the turns that
/// continue the task, as one subscription; `waiting`: the task waits for input even if `first`
/// says nothing of its state (a resume with nothing left to replay).
pub(super) fn follow(
    engine: Engine,
    principal: String,
    task_id: String,
    first: Subscription,
    waiting: bool,
) -> Subscription {
    let (forwarder, subscription) =
        Subscription::forwarding(engine.shared().config.subscriber_buffer, first.resumed);
    tokio::spawn(async move {
        let tx = &forwarder.tx;
        let mut current = first;
        let mut before = if waiting {
            Seen::Waiting
        } else {
            Seen::Running
        };
        let mut last_id = None;
        loop {
            let last = forward(&mut current, tx, before, &mut last_id).await;
            before = Seen::Running;
            if current.overflowed() {
                forwarder.overflowed();
                return;
            }
            if last != Seen::Waiting {
                return;
            }
            match next_turn(&engine, &principal, &task_id, last_id, tx).await {
                Some(next) => current = next,
                None => return,
            }
        }
    });
    subscription
}

/// Forwards one turn's items; an interrupted status is not the stream's last event any more.
async fn forward(
    current: &mut Subscription,
    tx: &mpsc::Sender<Sequenced>,
    before: Seen,
    last_id: &mut Option<EventId>,
) -> Seen {
    let mut last = before;
    while let Some(mut sequenced) = current.items.recv().await {
        *last_id = sequenced.id.or(*last_id);
        let item = &mut sequenced.item;
        if let Some(state) = seen(item) {
            last = match state {
                s if s.is_terminal() => Seen::Ended,
                s if s.is_interrupted() => Seen::Waiting,
                _ => Seen::Running,
            };
        }
        if let StreamItem::Event(TaskEvent::Status { is_final, .. }) = item {
            *is_final = last == Seen::Ended;
        }
        if tx.send(sequenced).await.is_err() {
            return Seen::Ended;
        }
    }
    last
}

/// Waits for the turn that continues the task (on this node), and goes on right after
/// `last_id`, the last event forwarded: from that turn's hub, or from the task's log when the
/// turn already ended (a log, once kept, records a task's later turns whole). On a cancel while
/// waiting, sends the final status and returns `None`, as when the subscriber leaves or the
/// server stops.
async fn next_turn(
    engine: &Engine,
    principal: &str,
    task_id: &str,
    last_id: Option<EventId>,
    tx: &mpsc::Sender<Sequenced>,
) -> Option<Subscription> {
    let mut next_read = Instant::now() + STORE_POLL;
    // When the store says running but no turn is live here yet: a turn registers its hub just
    // after storing its start, so give it this long before deciding it runs elsewhere.
    let mut running_seen: Option<Instant> = None;
    loop {
        if tx.is_closed() || engine.is_shutting_down() {
            return None;
        }
        if let Some(hub) = engine.shared().live.get(principal, task_id) {
            return Some(match last_id.map(|id| hub.resume(id)) {
                Some(Ok(resumed)) => resumed,
                _ => hub.subscribe(),
            });
        }
        if let Some(after) = last_id
            && let Some(log) = engine.shared().resume.get(principal, task_id)
            && log.newest() > Some(after)
            && let Replay::After(items) = log.replay_after(after, None)
        {
            return Some(Subscription::fixed(items, None));
        }
        if Instant::now() >= next_read {
            next_read = Instant::now() + STORE_POLL;
            let task = engine.get_task(principal, task_id).await.ok()?;
            if task.status.state.is_terminal() {
                let end = TaskEvent::Status {
                    task_id: task.id,
                    context_id: task.context_id,
                    status: task.status,
                    is_final: true,
                };
                let end = Sequenced {
                    id: None,
                    item: StreamItem::Event(end),
                };
                let _ = tx.send(end).await;
                return None;
            }
            if !task.status.state.is_interrupted() {
                let since = *running_seen.get_or_insert_with(Instant::now);
                if since.elapsed() >= STORE_POLL {
                    // Running, but not here: its turn is on another node, whose streams carry
                    // it; this one ends rather than wait for ever.
                    return None;
                }
                next_read = Instant::now();
            }
        }
        tokio::time::sleep(LIVE_POLL).await;
    }
}
