//! `ContextActor`: one per live conversation. Its mailbox orders what happens to the
//! conversation: a turn claims it (a second is refused while one runs), a cancel reaches the
//! running turn, a delete waits for none to run. It stops when idle (its state lives on disk;
//! the history window it keeps between turns, `window.rs`, only spares the store a read).
//!
//! The turn itself runs in a task of its own on the actor's arbiter ([`turn::run`]), holding the
//! conversation's [`Slot`] until it ends, so the mailbox stays free for cancels meanwhile.

use super::drive::StopReason;
use super::error::{EngineError, EngineResult};
use super::shared::{Permit, Shared};
use super::turn::{self, Answer, AnswerWhen, Slot, Stopping, Turn, TurnRequest};
use super::window::KeptWindow;
use crate::model::{Message, Task};
use crate::store::{ConversationKey, PrincipalKey};
use actix::prelude::*;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tracing::Instrument;

/// Start a turn with `message`; `task_id` names the (waiting) task it answers.
#[derive(Message, Clone)]
#[rtype(result = "EngineResult<Answer>")]
pub struct StartTurn {
    /// Validated, its contextId set.
    pub message: Message,
    pub task_id: Option<String>,
    /// The contextId was minted for this message (see [`crate::store::BeginTurn`]).
    pub new_context: bool,
    pub when: When,
    /// Push-notification configs stored with the task's start.
    pub push_configs: Vec<crate::model::PushConfig>,
    /// The request's trace context (traces on): the turn's parent, across the actor's mailbox.
    /// Not the request's `tracing` span, which would stay open until the turn ends.
    pub trace: Option<opentelemetry::Context>,
}

/// When the sender of a [`StartTurn`] hears back.
#[derive(Clone, Copy)]
pub enum When {
    /// Once the start is stored; `subscribe` takes a subscription before the agent starts.
    Started { subscribe: bool },
    /// Once the outcome is stored.
    Finished,
}

#[derive(Message, Clone)]
#[rtype(result = "EngineResult<CancelOutcome>")]
pub struct CancelTask {
    pub task_id: String,
}

pub enum CancelOutcome {
    /// The task was running: it is being stopped.
    Stopping(Stopping),
    /// The task was waiting for input: it is canceled.
    Done(Box<Task>),
}

#[derive(Message, Clone)]
#[rtype(result = "EngineResult<bool>")]
pub struct DeleteConversation;

/// Stops the actor if no turn runs in it (to make room under the resident limit).
#[derive(Message, Clone)]
#[rtype(result = "()")]
pub struct StopIfIdle;

/// Ends the running turn (if any) as failed: the server is going down.
#[derive(Message, Clone)]
#[rtype(result = "()")]
pub struct Shutdown;

/// Called once when the actor stops, so the directory forgets it.
pub type OnStop = Box<dyn FnOnce() + Send>;

pub struct ContextActor {
    key: ConversationKey,
    principal_key: PrincipalKey,
    principal: Arc<str>,
    context_id: Arc<str>,
    shared: Arc<Shared>,
    slot: Slot,
    on_stop: Option<OnStop>,
    last_activity: Instant,
    /// The history window the last turn left (see `window.rs`).
    window: KeptWindow,
    /// A check that drops the window once unused is scheduled.
    window_check: bool,
}

impl ContextActor {
    /// Hashes the conversation's and the principal's store keys, once for the actor's life.
    pub fn new(
        principal: Arc<str>,
        context_id: Arc<str>,
        shared: Arc<Shared>,
        on_stop: OnStop,
    ) -> Self {
        ContextActor {
            key: ConversationKey::new(&principal, &context_id),
            principal_key: PrincipalKey::new(&principal),
            principal,
            context_id,
            shared,
            slot: Slot::default(),
            on_stop: Some(on_stop),
            last_activity: Instant::now(),
            window: KeptWindow::default(),
            window_check: false,
        }
    }

    /// Drops the kept window once unused for `contexts.history_cache_secs`: checks again while
    /// a turn runs (it leaves a new one) or the window is younger.
    fn schedule_window_check(&mut self, ctx: &mut Context<Self>, after: Duration) {
        self.window_check = true;
        ctx.run_later(after, |act, ctx| {
            act.window_check = false;
            let keep = act.shared.config.window.keep;
            match act.window.expire(keep) {
                Some(left) => act.schedule_window_check(ctx, left),
                None if act.slot.occupant().is_some() => act.schedule_window_check(ctx, keep),
                None => {}
            }
        });
    }

    fn schedule_idle_check(&self, ctx: &mut Context<Self>, after: Duration) {
        ctx.run_later(after, |act, ctx| {
            let timeout = act.shared.config.idle_timeout;
            let idle_for = act.last_activity.elapsed();
            if act.slot.occupant().is_none() && idle_for >= timeout {
                metrics::counter!("colloquy_context_evictions_total").increment(1);
                ctx.stop();
            } else {
                act.schedule_idle_check(
                    ctx,
                    timeout
                        .saturating_sub(idle_for)
                        .max(Duration::from_millis(10)),
                );
            }
        });
    }

    fn busy_error(&self) -> Option<EngineError> {
        self.slot
            .occupant()
            .map(|task_id| EngineError::ContextBusy {
                context_id: self.context_id.to_string(),
                task_id,
            })
    }

    /// Claims the conversation for a new turn and starts it in a task of its own.
    fn start(&mut self, start: StartTurn) -> EngineResult<oneshot::Receiver<EngineResult<Answer>>> {
        if let Some(busy) = self.busy_error() {
            metrics::counter!("colloquy_busy_rejections_total").increment(1);
            return Err(busy);
        }
        let permit = Permit::take(&self.shared)?;
        let continuing = start.task_id.is_some();
        // Time-ordered (UUIDv7, 74 random bits): the embedded store keys tasks by id, so new
        // tasks land in its newest leaves.
        let task_id = start
            .task_id
            .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let (stop_tx, stop) = oneshot::channel();
        let claim = self
            .slot
            .claim(&task_id, Some(stop_tx))
            .ok_or_else(|| EngineError::Internal("the conversation's slot was taken".into()))?;
        let mut message = start.message;
        message.task_id = Some(task_id.clone());
        message.timestamp = Some(crate::model::now());
        let (answer, answered) = oneshot::channel();
        // Debug-level: a span per turn and per request cost 6% of a turn's instructions at the
        // default level (fields formatted on creation). Log lines of a turn name it themselves.
        // Traces get it (`crate::telemetry::traces`), with the conversation as its key's hash.
        let span = tracing::debug_span!(
            parent: None,
            "turn",
            conversation = %self.key,
            task_id = %task_id,
            trace_id = tracing::field::Empty,
            span_id = tracing::field::Empty,
        );
        if let Some(parent) = start.trace {
            crate::telemetry::propagation::continue_in(&span, parent);
        }
        let request = TurnRequest {
            principal: self.principal.clone(),
            context_id: self.context_id.clone(),
            key: self.key,
            principal_key: self.principal_key,
            message,
            task_id,
            continuing,
            new_context: start.new_context,
            push_configs: start.push_configs,
            stop,
            when: match start.when {
                When::Started { subscribe } => AnswerWhen::Started { subscribe },
                When::Finished => AnswerWhen::Finished,
            },
            answer,
            window: self.window.clone(),
        };
        let turn = Turn::new(self.shared.clone(), claim, permit);
        // Boxed: a turn's future is a few KB, which spawning and finishing would each copy.
        actix_rt::spawn(Box::pin(turn::run(turn, request)).instrument(span));
        Ok(answered)
    }
}

impl Actor for ContextActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(256);
        metrics::counter!("colloquy_context_starts_total").increment(1);
        self.schedule_idle_check(ctx, self.shared.config.idle_timeout);
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        if let Some(on_stop) = self.on_stop.take() {
            on_stop();
        }
    }
}

impl Handler<StartTurn> for ContextActor {
    type Result = ResponseFuture<EngineResult<Answer>>;

    fn handle(&mut self, start: StartTurn, ctx: &mut Context<Self>) -> Self::Result {
        self.last_activity = Instant::now();
        let started = self.start(start);
        if started.is_ok() && !self.window_check && self.shared.config.window.enabled() {
            self.schedule_window_check(ctx, self.shared.config.window.keep);
        }
        Box::pin(async move {
            started?
                .await
                .unwrap_or_else(|_| Err(EngineError::Internal("the turn stopped".into())))
        })
    }
}

impl Handler<CancelTask> for ContextActor {
    type Result = ResponseFuture<EngineResult<CancelOutcome>>;

    fn handle(&mut self, cancel: CancelTask, _: &mut Context<Self>) -> Self::Result {
        self.last_activity = Instant::now();
        if let Some(stopping) = self.slot.stop(&cancel.task_id, StopReason::Canceled) {
            return Box::pin(async move { Ok(CancelOutcome::Stopping(stopping)) });
        }
        let canceled = self
            .shared
            .store
            .cancel_waiting(&self.principal, &cancel.task_id);
        Box::pin(async move { Ok(CancelOutcome::Done(Box::new(canceled.await?))) })
    }
}

impl Handler<DeleteConversation> for ContextActor {
    type Result = ResponseFuture<EngineResult<bool>>;

    fn handle(&mut self, _: DeleteConversation, _: &mut Context<Self>) -> Self::Result {
        if let Some(busy) = self.busy_error() {
            return Box::pin(async move { Err(busy) });
        }
        // Hold the conversation so no turn starts while the delete runs.
        let claim = self.slot.claim("(deleting)", None);
        self.window.forget();
        let deleted = self.shared.store.delete_conversation(self.key);
        Box::pin(async move {
            let deleted = deleted.await;
            drop(claim);
            Ok(deleted?)
        })
    }
}

impl Handler<StopIfIdle> for ContextActor {
    type Result = ();

    fn handle(&mut self, _: StopIfIdle, ctx: &mut Context<Self>) {
        if self.slot.occupant().is_none() {
            metrics::counter!("colloquy_context_evictions_total").increment(1);
            ctx.stop();
        }
    }
}

impl Handler<Shutdown> for ContextActor {
    type Result = ();

    fn handle(&mut self, _: Shutdown, _: &mut Context<Self>) {
        self.slot.stop_any(StopReason::ShuttingDown);
    }
}
