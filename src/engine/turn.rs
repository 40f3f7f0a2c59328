//! One running turn: a single [`Turn`] owns everything about it (the conversation's slot, the
//! engine-wide permit, the live-task entry, the hub, the lease) from the moment its actor claims
//! the conversation until its outcome is published. Dropping it frees all of that in one place.
//!
//! The path, in [`run`]: store the caller's message and the working task (persist first), render
//! the guarded history, drive the agent, store the reply and final state, then publish.

use super::drive::{Drive, StopReason, TurnOutcome, drive};
use super::error::{EngineError, EngineResult};
use super::hub::{Subscription, TaskHub};
use super::shared::{Permit, Shared};
use super::window::{KeptWindow, Window};
use crate::agent::AgentRequest;
use crate::error::chain;
use crate::history::{HistoryEntry, render_prompt};
use crate::model::{Artifact, Message, Role, SendResult, Task, TaskState, TaskStatus, now};
use crate::store::{
    BeginTurn, ConversationKey, ConversationMark, FinishTurn, Lease, PrincipalKey, TurnBegun,
};
use crate::telemetry::{Handles, kept};
use metrics::Counter;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;

/// Who holds a conversation: the turn running in it, or a delete.
struct Occupant {
    task_id: String,
    stop: Option<oneshot::Sender<StopReason>>,
    hub: HubWait,
}

enum HubWait {
    Ready(Arc<TaskHub>),
    /// The turn is still storing its start: these cancels get the hub once it exists.
    Pending(Vec<oneshot::Sender<Arc<TaskHub>>>),
}

/// A conversation's slot, shared by its actor and the turn that holds it: at most one occupant.
#[derive(Clone, Default)]
pub(super) struct Slot(Arc<Mutex<Option<Occupant>>>);

/// How a cancel reaches a running task.
pub enum Stopping {
    /// Its hub reports the canceled state once it is stored.
    Running(Arc<TaskHub>),
    /// Still storing its start: its hub comes once the turn has started.
    Starting(oneshot::Receiver<Arc<TaskHub>>),
}

impl Slot {
    /// The task of the occupant, if any.
    pub(super) fn occupant(&self) -> Option<String> {
        self.0.lock().as_ref().map(|o| o.task_id.clone())
    }

    /// Takes the slot for `task_id`, unless it is taken.
    pub(super) fn claim(
        &self,
        task_id: &str,
        stop: Option<oneshot::Sender<StopReason>>,
    ) -> Option<Claim> {
        let mut occupant = self.0.lock();
        if occupant.is_some() {
            return None;
        }
        *occupant = Some(Occupant {
            task_id: task_id.to_owned(),
            stop,
            hub: HubWait::Pending(Vec::new()),
        });
        Some(Claim(self.clone()))
    }

    /// Stops the occupant if it runs `task_id`.
    pub(super) fn stop(&self, task_id: &str, reason: StopReason) -> Option<Stopping> {
        let mut guard = self.0.lock();
        let occupant = guard.as_mut().filter(|o| o.task_id == task_id)?;
        if let Some(stop) = occupant.stop.take() {
            let _ = stop.send(reason);
        }
        Some(match &mut occupant.hub {
            HubWait::Ready(hub) => Stopping::Running(hub.clone()),
            HubWait::Pending(waiters) => {
                let (tx, rx) = oneshot::channel();
                waiters.push(tx);
                Stopping::Starting(rx)
            }
        })
    }

    /// Stops whatever turn holds the slot (the server is going down).
    pub(super) fn stop_any(&self, reason: StopReason) {
        if let Some(stop) = self.0.lock().as_mut().and_then(|o| o.stop.take()) {
            let _ = stop.send(reason);
        }
    }
}

/// A held slot; dropping it frees the conversation.
pub(super) struct Claim(Slot);

impl Claim {
    fn set_hub(&self, hub: &Arc<TaskHub>) {
        if let Some(occupant) = self.0.0.lock().as_mut() {
            let waiting = std::mem::replace(&mut occupant.hub, HubWait::Ready(hub.clone()));
            if let HubWait::Pending(waiters) = waiting {
                for waiter in waiters {
                    let _ = waiter.send(hub.clone());
                }
            }
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.0.0.lock().take();
    }
}

/// A running task's hub, findable by id (live reads, subscriptions) while held.
struct Listed {
    shared: Arc<Shared>,
    hub: Arc<TaskHub>,
}

impl Drop for Listed {
    fn drop(&mut self) {
        self.shared.live.remove(&self.hub);
    }
}

/// When the caller of a turn hears back.
pub enum Answer {
    /// Once the start is stored: the hub, and a subscription taken before the agent starts.
    Started {
        hub: Arc<TaskHub>,
        subscription: Option<Subscription>,
    },
    /// Once the outcome is stored: the one the hub publishes, shared rather than copied.
    Finished(Arc<SendResult>),
}

pub(super) enum AnswerWhen {
    Started { subscribe: bool },
    Finished,
}

/// What the actor hands a turn to run.
pub(super) struct TurnRequest {
    pub principal: Arc<str>,
    pub context_id: Arc<str>,
    pub key: ConversationKey,
    pub principal_key: PrincipalKey,
    /// Validated, its contextId and taskId set.
    pub message: Message,
    pub task_id: String,
    pub continuing: bool,
    pub new_context: bool,
    pub push_configs: Vec<crate::model::PushConfig>,
    pub stop: oneshot::Receiver<StopReason>,
    pub when: AnswerWhen,
    pub answer: oneshot::Sender<EngineResult<Answer>>,
    /// The window the conversation's actor keeps: taken at the start, left again at the end.
    pub window: KeptWindow,
}

/// Everything about one running turn; see the module's documentation.
pub(super) struct Turn {
    shared: Arc<Shared>,
    claim: Claim,
    _permit: Permit,
    listed: Option<Listed>,
    hub: Option<Arc<TaskHub>>,
    lease: Option<Lease>,
    ended: bool,
}

impl Turn {
    pub(super) fn new(shared: Arc<Shared>, claim: Claim, permit: Permit) -> Self {
        Turn {
            shared,
            claim,
            _permit: permit,
            listed: None,
            hub: None,
            lease: None,
            ended: false,
        }
    }

    /// The turn's start is stored: make its task live.
    fn started(&mut self, principal: &str, begun: &TurnBegun) -> Arc<TaskHub> {
        let open = !self.shared.agent.may_answer_with_message();
        let hub = TaskHub::new(
            principal.to_owned(),
            begun.task.clone(),
            begun.turn,
            open,
            self.shared.config.subscriber_buffer,
            self.shared.resume.clone(),
        );
        self.shared.live.insert(hub.clone());
        self.listed = Some(Listed {
            shared: self.shared.clone(),
            hub: hub.clone(),
        });
        self.claim.set_hub(&hub);
        self.hub = Some(hub.clone());
        self.lease = Some(begun.lease.clone());
        hub
    }

    /// Frees the conversation, then publishes the outcome: the conversation is free before
    /// anyone hears the reply. The task stays listed live until its hub has published: a
    /// resume arriving meanwhile asks the hub, which logs the last events under its lock, rather
    /// than finding neither a running hub nor a log that has ended (it then answered with the
    /// stored task, without an event id).
    fn end(mut self, result: Arc<SendResult>) {
        self.ended = true;
        let hub = self.hub.take();
        let listed = self.listed.take();
        drop(self);
        if let SendResult::Task(task) = &*result {
            static TASKS: Handles<TaskState, Counter> = Handles::new();
            let state = task.status.state;
            TASKS
                .get(
                    state,
                    || metrics::counter!("colloquy_tasks_total", "state" => state.as_str()),
                )
                .increment(1);
        }
        if let Some(hub) = hub {
            hub.finish(result);
        }
        drop(listed);
    }
}

impl Drop for Turn {
    /// A turn dropped before its end (its task panicked, or the runtime stopped): its task
    /// fails, in the store and for everyone waiting, rather than stay working.
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let (Some(hub), Some(lease)) = (self.hub.take(), self.lease.take()) else {
            return;
        };
        let task = failed_snapshot(&hub, "the turn stopped unexpectedly".into());
        let end = FinishTurn {
            lease,
            reply: None,
            status: task.status.clone(),
            artifacts: task.artifacts.clone(),
            agent_state: None,
            stream: None,
        };
        let write = self.shared.store.finish_turn(end);
        let (context_id, task_id) = (task.context_id.clone(), task.id.clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(e) = write.await {
                    tracing::error!(error = %chain(&e), %context_id, %task_id, "could not store the failure of a dropped turn");
                }
            });
        }
        hub.finish(Arc::new(SendResult::Task(task)));
    }
}

/// Runs a claimed turn to its end; the caller hears back through `request.answer`.
pub(super) async fn run(mut turn: Turn, request: TurnRequest) {
    let TurnRequest {
        principal,
        context_id,
        key,
        principal_key,
        message,
        task_id,
        continuing,
        new_context,
        push_configs,
        stop,
        when,
        answer,
        window,
    } = request;
    let shared = turn.shared.clone();
    let limits = shared.config.history;
    let kept = window.take();
    let begin = BeginTurn {
        principal: principal.to_string(),
        context_id: context_id.to_string(),
        key,
        principal_key,
        message,
        task_id,
        continuing,
        new_context,
        history_limit: limits.limit,
        known: kept.as_ref().map(|kept| kept.mark),
        push_configs,
        trace: crate::telemetry::propagation::traceparent(),
    };
    let (begun, history) = match begin_turn(&shared, begin, kept).await {
        Ok(begun) => begun,
        Err(e) => {
            let _ = answer.send(Err(e));
            return;
        }
    };
    let hub = turn.started(&principal, &begun);
    let answer = match when {
        AnswerWhen::Started { subscribe } => {
            let subscription = subscribe.then(|| hub.subscribe());
            let started = Answer::Started {
                hub: hub.clone(),
                subscription,
            };
            // A caller that left does not stop the turn.
            let _ = answer.send(Ok(started));
            None
        }
        AnswerWhen::Finished => Some(answer),
    };
    let (context_id, task_id) = (begun.task.context_id.clone(), begun.task.id.clone());
    // The caller's message as the window will keep it, and as the prompt shows it.
    let caller = begun.task.history.last().map(HistoryEntry::from);
    let caller_text = caller.as_ref().map_or("", |entry| entry.text.as_str());
    let request = agent_request(&begun, history.clone(), caller_text, limits);
    let outcome = drive(
        &shared.agent,
        request,
        Drive {
            hub: &hub,
            stop,
            timeout: shared.config.agent_timeout,
            store: &shared.store,
            lease: &begun.lease,
            lease_length: shared.config.lease,
        },
    )
    .await;
    let mark = begun.mark;
    let (result, mut end) = conclude(begun, outcome, hub.artifacts(), hub.reply_text());
    end.stream = hub.outline_at_end(&result);
    // What the window keeps of the reply, taken before the store owns it.
    let reply = end.reply.as_ref().map(HistoryEntry::from);
    let write = shared.store.finish_turn(end);
    let span = tracing::debug_span!("store.finish_turn");
    let result = match crate::telemetry::traces::within(span, write).await {
        Ok(()) => {
            let stored = ConversationMark {
                next_seq: mark.next_seq + u64::from(reply.is_some()),
                ..mark
            };
            if let Some(caller) = caller {
                window.keep_after(&shared, history, caller, reply, stored);
            }
            result
        }
        Err(e) => {
            tracing::error!(error = %chain(&e), %context_id, %task_id, "could not store the end of a turn");
            unstored(&hub, &e.to_string())
        }
    };
    let result = Arc::new(result);
    turn.end(result.clone());
    if let Some(answer) = answer {
        let _ = answer.send(Ok(Answer::Finished(result)));
    }
}

/// Stores the turn's start; returns it with the history window, the one the actor kept when
/// the store says it is current (then the store read none). Once the start is stored this
/// fails no more: the turn holds the conversation and must run to its end.
async fn begin_turn(
    shared: &Shared,
    begin: BeginTurn,
    kept: Option<Window>,
) -> EngineResult<(TurnBegun, Arc<Vec<HistoryEntry>>)> {
    let limit = begin.history_limit;
    let span = tracing::debug_span!("store.begin_turn");
    let begun = crate::telemetry::traces::within(span, shared.store.begin_turn(begin)).await?;
    let history = match (&begun.recent, kept) {
        (Some(recent), _) => recent.iter().map(HistoryEntry::from).collect(),
        (None, Some(kept)) => kept.entries,
        // The stores answer None only to a start that named a kept window's mark.
        (None, None) => stored_window(shared, &begun, limit).await,
    };
    let source = if begun.recent.is_some() {
        "store"
    } else {
        "memory"
    };
    static WINDOWS: Handles<&str, Counter> = Handles::new();
    WINDOWS
        .get(
            source,
            || metrics::counter!("colloquy_history_windows_total", "source" => source),
        )
        .increment(1);
    Ok((begun, Arc::new(history)))
}

/// The window read afresh: the latest `limit` messages before the caller's (the last stored).
async fn stored_window(shared: &Shared, begun: &TurnBegun, limit: usize) -> Vec<HistoryEntry> {
    debug_assert!(false, "a history window found current that no one kept");
    let from = crate::store::MessagesFrom::Latest(limit.saturating_add(1));
    match shared
        .store
        .conversation_page(begun.lease.key, from, usize::MAX)
        .await
    {
        Ok(Some(page)) => {
            let before_caller = page.messages.len().saturating_sub(1);
            page.messages[..before_caller]
                .iter()
                .map(HistoryEntry::from)
                .collect()
        }
        Ok(None) => Vec::new(),
        Err(e) => {
            tracing::error!(error = %chain(&e), task_id = %begun.task.id, "could not read the history window; the agent gets none");
            Vec::new()
        }
    }
}

/// What the agent gets: the caller's message, the recent history and the guarded prompt.
fn agent_request(
    begun: &TurnBegun,
    history: Arc<Vec<HistoryEntry>>,
    caller_text: &str,
    limits: crate::history::HistoryLimits,
) -> AgentRequest {
    let render_started = Instant::now();
    let message =
        begun.task.history.last().cloned().unwrap_or_else(|| {
            Message::agent_text("", &begun.task.context_id, Some(&begun.task.id))
        });
    let prompt = render_prompt(&history, caller_text, limits);
    kept!(histogram, "colloquy_history_render_seconds").record(render_started.elapsed());
    kept!(counter, "colloquy_history_messages_rendered_total").increment(history.len() as u64);
    AgentRequest {
        context_id: begun.task.context_id.clone(),
        task_id: begun.task.id.clone(),
        message,
        history,
        prompt,
        turn: begun.turn,
        state: begun.agent_state.clone(),
    }
}

/// The caller's answer and what to store: the reply (the text the caller received, in full)
/// and the task's final state.
fn conclude(
    begun: TurnBegun,
    outcome: TurnOutcome,
    artifacts: Vec<Artifact>,
    reply_text: String,
) -> (SendResult, FinishTurn) {
    let TurnBegun { lease, task, .. } = begun;
    let (context_id, task_id) = (task.context_id.clone(), task.id.clone());
    let status_message = outcome
        .status_text
        .as_deref()
        .map(|text| Message::agent_text(text, &context_id, Some(&task_id)));
    let reply = match (&outcome.message, reply_text.is_empty()) {
        (Some(message), _) => Some(message.clone()),
        (None, false) => Some(Message::agent_text(reply_text, &context_id, Some(&task_id))),
        // The agent's question is part of the conversation; an error message is not.
        (None, true) if outcome.state.is_interrupted() => status_message.clone(),
        (None, true) => None,
    };
    let reply = reply.map(|mut reply| {
        reply.role = Role::Agent;
        reply.context_id = Some(context_id.clone());
        reply.task_id = Some(task_id.clone());
        reply.timestamp.get_or_insert_with(now);
        reply
    });
    let mut final_task = Task {
        status: TaskStatus::new(outcome.state, status_message),
        artifacts,
        ..task
    };
    final_task.history.extend(reply.clone());
    let end = FinishTurn {
        lease,
        reply,
        status: final_task.status.clone(),
        artifacts: final_task.artifacts.clone(),
        agent_state: outcome.agent_state,
        stream: None,
    };
    let result = match outcome.message {
        Some(mut message) => {
            message.context_id = Some(context_id);
            message.task_id = None;
            SendResult::Message(message)
        }
        None => SendResult::Task(final_task),
    };
    (result, end)
}

/// The task as the caller sees it when its end could not be stored.
fn unstored(hub: &TaskHub, error: &str) -> SendResult {
    let why = format!("the reply could not be stored: {error}");
    SendResult::Task(failed_snapshot(hub, why))
}

/// The task as its hub has it, failed, saying `why`.
fn failed_snapshot(hub: &TaskHub, why: String) -> Task {
    let mut task = hub.snapshot();
    task.status = TaskStatus::new(
        TaskState::Failed,
        Some(Message::agent_text(why, &task.context_id, Some(&task.id))),
    );
    task
}

/// Converts what a stop returns into the hub to wait on.
pub(super) async fn stopped_hub(stopping: Stopping, task_id: &str) -> EngineResult<Arc<TaskHub>> {
    match stopping {
        Stopping::Running(hub) => Ok(hub),
        Stopping::Starting(hub) => hub
            .await
            .map_err(|_| EngineError::TaskNotFound(task_id.to_owned())),
    }
}
