//! A subscription that follows a task, not a turn: when a turn ends waiting for input
//! (`input-required`, `auth-required`), it stays open, takes up the turn that continues the
//! task, and closes only when the task reaches a terminal state (or the server stops). On
//! several nodes the next turn may run on another node: its events are relayed from there
//! (`relay`). A relayed stream that breaks off (its node died) is followed up in the store:
//! the task's turn moves on elsewhere, or it is failed once the dead node's lease expires, and
//! the stream ends with that state rather than a bare cut.

use super::hub::{StreamItem, Subscription};
use super::resume::{EventId, Replay, Sequenced};
use super::{Engine, Scope};
use crate::model::{TaskEvent, TaskState};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// How often a subscriber waiting for the next turn looks for it on this node.
const LIVE_POLL: Duration = Duration::from_millis(50);
/// How often it reads the stored task (a cancel while waiting ends the task without a turn).
const STORE_POLL: Duration = Duration::from_secs(1);
/// As often on several nodes, where the next turn may run on another node: soon enough to
/// catch all but the shortest turns live there.
const CLUSTER_STORE_POLL: Duration = Duration::from_millis(250);

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
    scope: Scope,
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
            // A turn that ended waiting, or a relayed stream that broke off mid-turn.
            let follow_on = match scope {
                Scope::Task => match last {
                    Seen::Waiting => true,
                    Seen::Running => current.relayed,
                    Seen::Ended => false,
                },
                Scope::Turn => false,
            };
            if !follow_on {
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

/// Waits for the turn that continues the task, and goes on right after `last_id`, the last
/// event forwarded: from that turn's hub, or from the task's log when the turn already ended (a
/// log, once kept, records a task's later turns whole), or relayed from the node that runs it.
/// On a cancel while waiting, or a task failed because its node died, sends the final status
/// and returns `None`, as when the subscriber leaves or the server stops.
async fn next_turn(
    engine: &Engine,
    principal: &str,
    task_id: &str,
    last_id: Option<EventId>,
    tx: &mpsc::Sender<Sequenced>,
) -> Option<Subscription> {
    let relay = engine.relay(Scope::Task);
    // How long the task may read running with its turn nowhere to be found: a turn registers
    // its hub just after storing its start; on several nodes its node may have died, and the
    // task reads failed once that node's lease runs out.
    let (patience, poll) = match relay {
        Some(_) => (engine.config().lease + 2 * STORE_POLL, CLUSTER_STORE_POLL),
        None => (STORE_POLL, STORE_POLL),
    };
    let mut next_read = Instant::now() + poll;
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
            next_read = Instant::now() + poll;
            let task = engine.get_task(principal, task_id).await.ok()?;
            if task.status.state.is_terminal() {
                for item in last_words(task) {
                    if tx.send(Sequenced { id: None, item }).await.is_err() {
                        break;
                    }
                }
                return None;
            }
            if !task.status.state.is_interrupted() {
                if let Some(relay) = &relay
                    && let Some(remote) = relay.subscribe(principal, task_id, last_id).await
                {
                    return Some(remote);
                }
                let since = *running_seen.get_or_insert_with(Instant::now);
                if since.elapsed() >= patience {
                    // Running, but nowhere this node can reach; this stream ends rather than
                    // wait for ever.
                    return None;
                }
                if relay.is_none() {
                    next_read = Instant::now();
                }
            }
        }
        tokio::time::sleep(LIVE_POLL).await;
    }
}

/// What a stream that saw no turn end the task says last: a cancel while the task waited ends
/// it with the canceled status; any other end came from a turn this stream did not see (one
/// that ran and ended between two looks, or one whose node died), so the task as it stands
/// comes first.
fn last_words(task: crate::model::Task) -> Vec<StreamItem> {
    let end = StreamItem::Event(TaskEvent::Status {
        task_id: task.id.clone(),
        context_id: task.context_id.clone(),
        status: task.status.clone(),
        is_final: true,
    });
    if task.status.state == TaskState::Canceled {
        vec![end]
    } else {
        vec![StreamItem::Task(task), end]
    }
}
