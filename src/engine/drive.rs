//! Drives an agent backend through one turn: its events go to the turn's hub as they come.
//!
//! The backend's future is polled beside the turn's other waits, so one that panics or hangs
//! fails only its task: its panic is caught where it is polled, a hang ends at the timeout, a
//! cancel drops it. (It ran as a task of its own until 2026-12-06: a spawn, a join and a wake
//! between the two tasks every turn.)

use super::hub::TaskHub;
use crate::agent::{AgentEvent, AgentRequest, AgentSink, SharedAgent};
use crate::error::chain;
use crate::model::{Message, TaskState, TaskStatus};
use crate::store::{Lease, SharedStore, StoreError};
use crate::telemetry::Handles;
use futures_util::FutureExt;
use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tracing::Instrument;

/// Why a turn was stopped from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Canceled,
    ShuttingDown,
}

/// How the agent ended a turn.
#[derive(Debug, Clone)]
pub struct TurnOutcome {
    pub state: TaskState,
    pub status_text: Option<String>,
    /// A plain-message answer (the agent produced nothing else).
    pub message: Option<Message>,
    pub agent_state: Option<serde_json::Value>,
}

/// What driving a turn needs besides the agent and the request.
pub struct Drive<'a> {
    pub hub: &'a TaskHub,
    pub stop: oneshot::Receiver<StopReason>,
    pub timeout: Duration,
    /// Where statuses the task passes through are recorded, under the turn's lease.
    pub store: &'a SharedStore,
    pub lease: &'a Lease,
    /// How long the lease lasts unless renewed: renewed every third of it while the agent works.
    pub lease_length: Duration,
}

/// Renews the turn's lease; says why the turn must stop if it cannot keep it.
async fn keep_lease(
    store: &SharedStore,
    lease: &Lease,
    length: Duration,
    renewed_at: &mut tokio::time::Instant,
) -> Result<(), LeaseLost> {
    let left = length.saturating_sub(renewed_at.elapsed());
    let attempt = tokio::time::Instant::now();
    match tokio::time::timeout(left, store.renew_lease(lease)).await {
        Ok(Ok(())) => {
            *renewed_at = attempt;
            Ok(())
        }
        Ok(Err(StoreError::StaleToken { .. })) => Err(LeaseLost::Taken),
        Ok(Err(e)) if renewed_at.elapsed() < length => {
            tracing::warn!(error = %chain(&e), task_id = %lease.task_id, "could not renew a turn's lease; retrying");
            Ok(())
        }
        Ok(Err(e)) => Err(LeaseLost::Expired(length, Some(e))),
        Err(_) => Err(LeaseLost::Expired(length, None)),
    }
}

/// Why a turn stopped holding its conversation; the message becomes the task's status message.
#[derive(Debug, thiserror::Error)]
enum LeaseLost {
    #[error("the turn lost its conversation: another turn took it over")]
    Taken,
    /// With the store's last refusal, if it answered at all.
    #[error("the turn's lease could not be renewed within {} s", .0.as_secs_f64())]
    Expired(Duration, #[source] Option<StoreError>),
}

/// Holds back an incomplete UTF-8 sequence at the end of a byte chunk until the next one.
#[derive(Default)]
struct Utf8Assembler {
    pending: Vec<u8>,
}

impl Utf8Assembler {
    fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let valid_up_to = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            // Invalid (not merely incomplete) bytes: replace them rather than stall.
            Err(_) => {
                let text = String::from_utf8_lossy(&self.pending).into_owned();
                self.pending.clear();
                return text;
            }
        };
        let rest = self.pending.split_off(valid_up_to);
        let text = String::from_utf8(std::mem::replace(&mut self.pending, rest));
        text.unwrap_or_default()
    }

    fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

struct Progress {
    outcome: TurnOutcome,
    utf8: Utf8Assembler,
    produced_output: bool,
    may_answer_with_message: bool,
}

impl Progress {
    /// Applies an event; returns a status the task passes through, to record before showing.
    fn apply(&mut self, event: AgentEvent, hub: &TaskHub) -> Option<TaskStatus> {
        match event {
            AgentEvent::Text(text) => self.append(hub, &text),
            AgentEvent::Bytes(bytes) => {
                let text = self.utf8.push(&bytes);
                self.append(hub, &text);
            }
            AgentEvent::Artifact(artifact) => {
                self.produced_output = true;
                hub.add_artifact(artifact);
            }
            AgentEvent::Status { state, text } if !state.ends_turn() => {
                let context_id = hub.snapshot().context_id;
                return Some(TaskStatus::new(
                    state,
                    text.map(|t| Message::agent_text(t, &context_id, None)),
                ));
            }
            AgentEvent::Status { state, text } => {
                self.outcome.state = state;
                self.outcome.status_text = text;
            }
            AgentEvent::Message(message) => {
                if self.may_answer_with_message
                    && !self.produced_output
                    && self.outcome.message.is_none()
                {
                    self.outcome.message = Some(message);
                } else {
                    self.append(hub, &message.text());
                }
            }
            AgentEvent::State(state) => self.outcome.agent_state = Some(state),
        }
        None
    }

    fn append(&mut self, hub: &TaskHub, text: &str) {
        self.produced_output = true;
        if let Some(message) = self.outcome.message.take() {
            // A message is only a plain answer when it is the sole output.
            hub.append_text(&message.text());
        }
        if !text.is_empty() {
            hub.append_text(text);
        }
    }
}

/// Runs the agent on `request` until it ends, is stopped or times out.
pub async fn drive(agent: &SharedAgent, request: AgentRequest, turn: Drive<'_>) -> TurnOutcome {
    let Drive {
        hub,
        mut stop,
        timeout,
        store,
        lease,
        lease_length,
    } = turn;
    let renew_every = lease_length / 3;
    let mut renewed_at = tokio::time::Instant::now();
    let mut renew = tokio::time::interval_at(renewed_at + renew_every, renew_every);
    renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let kind = agent.kind();
    let started = Instant::now();
    let (sink, mut events) = AgentSink::channel(64);
    let span = tracing::debug_span!("agent.run", backend = kind);
    // Made inside the span too: a backend's own spans, made as it builds its future, are its.
    let running = span.in_scope(|| agent.run(request, sink));
    // Fused: the agent's future is dropped as soon as it ends, its sink with it, so its events
    // end too even when it panicked holding the sink (a task's future was dropped so).
    let run = AssertUnwindSafe(running.instrument(span.clone()))
        .catch_unwind()
        .fuse();
    tokio::pin!(run);
    let mut ran = None;
    let mut progress = Progress {
        outcome: TurnOutcome {
            state: TaskState::Completed,
            status_text: None,
            message: None,
            agent_state: None,
        },
        utf8: Utf8Assembler::default(),
        produced_output: false,
        may_answer_with_message: agent.may_answer_with_message(),
    };
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let mut stop_open = true;
    let mut events_open = true;
    let mut stopped: Option<(TaskState, String)> = None;
    // Until the agent has ended and its events too: an agent that drops its sink and then
    // hangs is still under the deadline, a stop and the lease's renewal.
    while ran.is_none() || events_open {
        tokio::select! {
            // In this order: a stop or the deadline wins over more of the agent's work, and the
            // agent's events are taken once it has run as far as it can.
            biased;
            reason = &mut stop, if stop_open => {
                stop_open = false;
                let text = match reason {
                    Ok(StopReason::Canceled) => "canceled by the client",
                    Ok(StopReason::ShuttingDown) => "the server shut down before the agent finished",
                    Err(_) => continue,
                };
                let state = match reason {
                    Ok(StopReason::Canceled) => TaskState::Canceled,
                    _ => TaskState::Failed,
                };
                stopped = Some((state, text.to_owned()));
                break;
            },
            _ = &mut deadline => {
                stopped = Some((
                    TaskState::Failed,
                    format!("the agent did not finish within {} s", timeout.as_secs_f64()),
                ));
                break;
            }
            result = &mut run, if ran.is_none() => ran = Some(result),
            event = events.recv(), if events_open => match event {
                Some(event) => {
                    let Some(status) = progress.apply(event, hub) else { continue };
                    let write = store.record_status(lease, status.clone());
                    let span = tracing::debug_span!("store.record_status");
                    if let Err(e) = crate::telemetry::traces::within(span, write).await {
                        tracing::error!(error = %chain(&e), task_id = %lease.task_id, "could not record a status");
                        stopped = Some((TaskState::Failed, format!("could not record a status: {e}")));
                        break;
                    }
                    hub.status(status);
                }
                None => events_open = false,
            },
            _ = renew.tick() => {
                if let Err(lost) = keep_lease(store, lease, lease_length, &mut renewed_at).await {
                    metrics::counter!("colloquy_leases_lost_total").increment(1);
                    tracing::warn!(error = %chain(&lost), task_id = %lease.task_id, "a turn lost its lease");
                    stopped = Some((TaskState::Failed, lost.to_string()));
                    break;
                }
            },
        }
    }
    let rest = progress.utf8.finish();
    // Only real leftover bytes count as output: an empty append would turn a sole plain-message
    // answer into reply text.
    if !rest.is_empty() {
        progress.append(hub, &rest);
    }
    let mut outcome = progress.outcome;
    if let Some((state, text)) = stopped {
        outcome.state = state;
        outcome.status_text = Some(text);
        outcome.message = None;
    } else if let Some(result) = ran {
        match result {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                // The status message is the error's own; its causes are for the log.
                tracing::warn!(error = %chain(&e), backend = kind, "the agent failed");
                outcome.state = TaskState::Failed;
                outcome.status_text = Some(format!("the agent failed: {e}"));
                outcome.message = None;
            }
            Err(e) => {
                outcome.state = TaskState::Failed;
                outcome.status_text = Some(format!("the agent crashed: {}", panic_text(e)));
                outcome.message = None;
            }
        }
    }
    let elapsed = started.elapsed();
    static AGENT_SECONDS: Handles<&str, metrics::Histogram> = Handles::new();
    AGENT_SECONDS
        .get(
            kind,
            || metrics::histogram!("colloquy_agent_seconds", "backend" => kind),
        )
        .record(elapsed);
    if outcome.state == TaskState::Failed {
        metrics::counter!("colloquy_agent_errors_total", "backend" => kind).increment(1);
        // Not the status text: it may hold what the agent wrote.
        crate::telemetry::traces::fail(&span, "the turn failed");
    }
    outcome
}

fn panic_text(payload: Box<dyn Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

#[cfg(test)]
mod tests {
    use super::Utf8Assembler;

    #[test]
    fn split_characters_are_reassembled() {
        let text = "añ€😀b";
        let bytes = text.as_bytes();
        for cut in 0..=bytes.len() {
            let mut asm = Utf8Assembler::default();
            let mut out = asm.push(&bytes[..cut]);
            out.push_str(&asm.push(&bytes[cut..]));
            out.push_str(&asm.finish());
            assert_eq!(out, text, "cut at {cut}");
        }
    }
}
