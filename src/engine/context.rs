//! `ContextActor`: one per live conversation. Serialises its turns, rejects a second while one
//! runs, persists first, and stops when idle (its state lives on disk).

use super::agent_actor::{AgentActor, RunTurn, StopReason, TurnOutcome};
use super::directory::Directory;
use super::error::{EngineError, EngineResult};
use super::hub::{Subscription, TaskHub};
use super::turn::{self, BegunTurn, TurnStart};
use crate::model::{Message, SendResult, Task};
use crate::store::ConversationKey;
use actix::prelude::*;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tracing::Instrument;

/// Start a turn with `message`; `task_id` names the (waiting) task it answers.
#[derive(Message, Clone)]
#[rtype(result = "EngineResult<TurnStarted>")]
pub struct StartTurn {
    pub message: Message,
    pub task_id: Option<String>,
    /// Subscribe before the agent starts, so the caller's stream sees every event.
    pub stream: bool,
}

pub struct TurnStarted {
    pub hub: Arc<TaskHub>,
    pub subscription: Option<Subscription>,
}

#[derive(Message, Clone)]
#[rtype(result = "EngineResult<CancelOutcome>")]
pub struct CancelTask {
    pub task_id: String,
}

pub enum CancelOutcome {
    /// The task was running: its hub reports the canceled state once it is stored.
    Running(Arc<TaskHub>),
    /// The task is still being stored: its hub comes once the turn has started.
    Starting(oneshot::Receiver<Arc<TaskHub>>),
    Done(Box<Task>),
}

#[derive(Message, Clone)]
#[rtype(result = "EngineResult<bool>")]
pub struct DeleteConversation;

/// Stops the actor if no turn runs in it (to make room under the resident limit).
#[derive(Message, Clone)]
#[rtype(result = "()")]
pub struct StopIfIdle;

impl Handler<StopIfIdle> for ContextActor {
    type Result = ();

    fn handle(&mut self, _: StopIfIdle, ctx: &mut Context<Self>) {
        if self.running.is_none() {
            metrics::counter!("colloquy_context_evictions_total").increment(1);
            ctx.stop();
        }
    }
}

/// Ends the running turn (if any) as failed: the server is going down.
#[derive(Message, Clone)]
#[rtype(result = "()")]
pub struct Shutdown;

struct RunningTurn {
    task_id: String,
    stop: Option<oneshot::Sender<StopReason>>,
    hub: Option<Arc<TaskHub>>,
    /// Cancels that arrived while the turn was still being stored.
    hub_waiters: Vec<oneshot::Sender<Arc<TaskHub>>>,
}

pub struct ContextActor {
    key: ConversationKey,
    principal: Arc<str>,
    context_id: Arc<str>,
    generation: u64,
    directory: Arc<Directory>,
    agent: Addr<AgentActor>,
    running: Option<RunningTurn>,
    last_activity: Instant,
}

impl ContextActor {
    pub fn new(
        key: ConversationKey,
        principal: &str,
        context_id: &str,
        generation: u64,
        directory: Arc<Directory>,
        agent: Addr<AgentActor>,
    ) -> Self {
        ContextActor {
            key,
            principal: principal.into(),
            context_id: context_id.into(),
            generation,
            directory,
            agent,
            running: None,
            last_activity: Instant::now(),
        }
    }

    fn schedule_idle_check(&self, ctx: &mut Context<Self>, after: Duration) {
        ctx.run_later(after, |act, ctx| {
            let timeout = act.directory.config().idle_timeout;
            let idle_for = act.last_activity.elapsed();
            if act.running.is_none() && idle_for >= timeout {
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
        self.running
            .as_ref()
            .map(|running| EngineError::ContextBusy {
                context_id: self.context_id.to_string(),
                task_id: running.task_id.clone(),
            })
    }

    /// Marks the context busy with `task_id` for work that is not a turn.
    fn reserve(&mut self, task_id: &str) {
        self.running = Some(RunningTurn {
            task_id: task_id.to_owned(),
            stop: None,
            hub: None,
            hub_waiters: Vec::new(),
        });
    }

    /// Runs the agent, stores the outcome, then frees the context and answers every waiter.
    fn run_agent(
        &mut self,
        begun: BegunTurn,
        hub: Arc<TaskHub>,
        stop: oneshot::Receiver<StopReason>,
        span: tracing::Span,
        ctx: &mut Context<Self>,
    ) {
        let shared = self.directory.shared().clone();
        let run = RunTurn {
            request: begun.request.clone(),
            hub: hub.clone(),
            stop,
            timeout: shared.config.agent_timeout,
        };
        let agent = self.agent.clone();
        let finish_hub = hub.clone();
        let work = async move {
            let outcome = agent.send(run).await.unwrap_or_else(|_| TurnOutcome {
                state: crate::model::TaskState::Failed,
                status_text: Some("the agent runner stopped".into()),
                message: None,
                agent_state: None,
            });
            let artifacts = finish_hub.artifacts();
            let reply_text = finish_hub.reply_text();
            let (result, batch) = turn::finish(begun, outcome, artifacts, reply_text);
            shared.store.commit(batch).await?;
            Ok::<_, EngineError>(result)
        }
        .instrument(span);
        ctx.spawn(work.into_actor(self).map(move |result, act, _| {
            act.running = None;
            act.last_activity = Instant::now();
            let shared = act.directory.shared();
            shared.live.remove(&hub);
            shared.turn_ended();
            let result = match result {
                Ok(result) => result,
                Err(e) => {
                    tracing::error!(error = %e, "could not store the end of a turn");
                    let mut task = hub.snapshot();
                    task.status = crate::model::TaskStatus::new(
                        crate::model::TaskState::Failed,
                        Some(Message::agent_text(
                            format!("the reply could not be stored: {e}"),
                            &task.context_id,
                            Some(&task.id),
                        )),
                    );
                    SendResult::Task(task)
                }
            };
            if let SendResult::Task(task) = &result {
                metrics::counter!("colloquy_tasks_total", "state" => task.status.state.as_str())
                    .increment(1);
            }
            hub.finish(result);
        }));
    }
}

impl Actor for ContextActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(256);
        metrics::counter!("colloquy_context_starts_total").increment(1);
        self.schedule_idle_check(ctx, self.directory.config().idle_timeout);
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        self.directory.forget(&self.key, self.generation);
    }
}

impl Handler<StartTurn> for ContextActor {
    type Result = ResponseActFuture<Self, EngineResult<TurnStarted>>;

    fn handle(&mut self, start: StartTurn, _: &mut Context<Self>) -> Self::Result {
        self.last_activity = Instant::now();
        if let Some(busy) = self.busy_error() {
            metrics::counter!("colloquy_busy_rejections_total").increment(1);
            return Box::pin(actix::fut::ready(Err(busy)));
        }
        let shared = self.directory.shared().clone();
        if let Err(e) = shared.turn_started() {
            return Box::pin(actix::fut::ready(Err(e)));
        }
        let continuing = start.task_id.is_some();
        let task_id = start
            .task_id
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let (stop_tx, stop_rx) = oneshot::channel();
        self.running = Some(RunningTurn {
            task_id: task_id.clone(),
            stop: Some(stop_tx),
            hub: None,
            hub_waiters: Vec::new(),
        });
        let key = self.key;
        let principal = self.principal.clone();
        let context_id = self.context_id.clone();
        let store = shared.store.clone();
        let limits = shared.config.history;
        let message = start.message;
        let stream = start.stream;
        let span = tracing::info_span!("turn", context_id = %self.context_id, task_id = %task_id);
        let turn_span = span.clone();
        let persist = async move {
            store
                .write(move |store| {
                    turn::begin(TurnStart {
                        store,
                        key,
                        principal: &principal,
                        context_id: &context_id,
                        message,
                        task_id,
                        continuing,
                        limits,
                    })
                })
                .await
        }
        .instrument(span);
        Box::pin(persist.into_actor(self).map(move |begun, act, ctx| {
            let begun = match begun {
                Ok(begun) => begun,
                Err(e) => {
                    act.running = None;
                    act.directory.shared().turn_ended();
                    return Err(e);
                }
            };
            let shared = act.directory.shared();
            let open = !shared.agent.may_answer_with_message();
            let hub = TaskHub::new(
                act.principal.to_string(),
                begun.task.clone(),
                open,
                shared.config.subscriber_buffer,
            );
            shared.live.insert(hub.clone());
            if let Some(running) = act.running.as_mut() {
                running.hub = Some(hub.clone());
                for waiter in running.hub_waiters.drain(..) {
                    let _ = waiter.send(hub.clone());
                }
            }
            let subscription = stream.then(|| hub.subscribe());
            act.run_agent(begun, hub.clone(), stop_rx, turn_span, ctx);
            Ok(TurnStarted { hub, subscription })
        }))
    }
}

impl Handler<CancelTask> for ContextActor {
    type Result = ResponseActFuture<Self, EngineResult<CancelOutcome>>;

    fn handle(&mut self, cancel: CancelTask, _: &mut Context<Self>) -> Self::Result {
        self.last_activity = Instant::now();
        if let Some(running) = self
            .running
            .as_mut()
            .filter(|r| r.task_id == cancel.task_id)
        {
            if let Some(stop) = running.stop.take() {
                let _ = stop.send(StopReason::Canceled);
            }
            let outcome = match running.hub.clone() {
                Some(hub) => CancelOutcome::Running(hub),
                // Still being stored: the agent sees the cancel the moment it starts.
                None => {
                    let (tx, rx) = oneshot::channel();
                    running.hub_waiters.push(tx);
                    CancelOutcome::Starting(rx)
                }
            };
            return Box::pin(actix::fut::ready(Ok(outcome)));
        }
        let store = self.directory.shared().store.clone();
        let principal = self.principal.clone();
        let work = async move {
            let task = store
                .write(move |store| turn::cancel_waiting(store, &principal, &cancel.task_id))
                .await?;
            Ok(CancelOutcome::Done(Box::new(task)))
        };
        Box::pin(work.into_actor(self))
    }
}

impl Handler<DeleteConversation> for ContextActor {
    type Result = ResponseActFuture<Self, EngineResult<bool>>;

    fn handle(&mut self, _: DeleteConversation, _: &mut Context<Self>) -> Self::Result {
        if let Some(busy) = self.busy_error() {
            return Box::pin(actix::fut::ready(Err(busy)));
        }
        // Reserve the context so no turn starts while the delete runs.
        self.reserve("(deleting)");
        let store = self.directory.shared().store.clone();
        let key = self.key;
        let work = async move {
            store
                .write(move |store| match store.conversation(&key)? {
                    Some(meta) => store.delete_conversation(&meta),
                    None => Ok(false),
                })
                .await
                .map_err(EngineError::from)
        };
        Box::pin(work.into_actor(self).map(|result, act, _| {
            act.running = None;
            result
        }))
    }
}

impl Handler<Shutdown> for ContextActor {
    type Result = ();

    fn handle(&mut self, _: Shutdown, _: &mut Context<Self>) {
        if let Some(stop) = self.running.as_mut().and_then(|r| r.stop.take()) {
            let _ = stop.send(StopReason::ShuttingDown);
        }
    }
}
