//! The store side of a turn: what is written when it starts and when it ends.
//!
//! [`begin`] reads and writes; it runs on the store thread, so its reads and write are one step,
//! in order with every other write. [`finish`] only computes its batch, which the caller commits
//! ([`Store::commit`]). Either way the caller waits for the write to be durable before anyone
//! hears of it.

use super::error::{EngineError, EngineResult};
use crate::agent::AgentRequest;
use crate::engine::agent_actor::TurnOutcome;
use crate::history::{HistoryEntry, HistoryLimits, render_prompt};
use crate::model::{Artifact, Message, Role, SendResult, Task, TaskState, TaskStatus, now};
use crate::store::{ConversationKey, ConversationMeta, Store, TaskRecord, WriteBatch};

/// What a started turn knows: enough to run the agent and to write the outcome.
pub struct BegunTurn {
    pub meta: ConversationMeta,
    pub record: TaskRecord,
    /// The task with its history, as streams and non-blocking callers first see it.
    pub task: Task,
    pub request: AgentRequest,
}

pub struct TurnStart<'a> {
    pub store: &'a Store,
    pub key: ConversationKey,
    pub principal: &'a str,
    pub context_id: &'a str,
    pub message: Message,
    pub task_id: String,
    pub continuing: bool,
    pub limits: HistoryLimits,
}

/// Stores the caller's message exactly as received and the task as working, in one batch.
pub fn begin(start: TurnStart<'_>) -> EngineResult<BegunTurn> {
    let TurnStart {
        store,
        key,
        principal,
        context_id,
        mut message,
        task_id,
        continuing,
        limits,
    } = start;
    let stored_meta = store.conversation(&key)?;
    let mut meta = stored_meta
        .clone()
        .unwrap_or_else(|| ConversationMeta::new(principal, context_id));
    let mut batch = WriteBatch::new();
    if let Some(stale) = meta.running_task.take() {
        fail_interrupted_task(store, &stale, &mut batch)?;
    }
    let render_started = std::time::Instant::now();
    // A conversation never stored has no messages to read.
    let recent = match &stored_meta {
        Some(stored) => store.recent_messages(&key, stored.next_seq, limits.limit)?,
        None => Vec::new(),
    };
    let history: Vec<HistoryEntry> = recent.iter().map(|(_, m)| HistoryEntry::from(m)).collect();

    let (mut record, previous) = if continuing {
        let record = owned_task(store, principal, &task_id)?;
        if record.task.context_id != context_id {
            return Err(EngineError::TaskNotFound(task_id));
        }
        ensure_open(&record)?;
        (record.clone(), Some(record))
    } else {
        let record = TaskRecord {
            task: Task {
                id: task_id.clone(),
                context_id: context_id.to_owned(),
                status: TaskStatus::new(TaskState::Submitted, None),
                artifacts: Vec::new(),
                history: Vec::new(),
                metadata: None,
            },
            principal: principal.to_owned(),
            history_seqs: Vec::new(),
        };
        (record, None)
    };

    message.context_id = Some(context_id.to_owned());
    message.task_id = Some(task_id.clone());
    message.timestamp = Some(now());
    let seq = meta.next_seq;
    meta.next_seq += 1;
    meta.turns += 1;
    meta.updated_at = now();
    meta.running_task = Some(task_id.clone());
    batch.append_message(&key, seq, &message);
    record.history_seqs.push(seq);
    record.task.status = TaskStatus::new(TaskState::Working, None);
    record.task.artifacts.clear();
    batch.put_task(&record, previous.as_ref());
    batch.put_conversation(&meta, stored_meta.as_ref());

    let mut task = record.task.clone();
    let earlier = &record.history_seqs[..record.history_seqs.len() - 1];
    task.history = store.messages(&key, earlier)?;
    task.history.push(message.clone());
    let prompt = render_prompt(&history, &message.text(), limits);
    metrics::histogram!("colloquy_history_render_seconds").record(render_started.elapsed());
    metrics::counter!("colloquy_history_messages_rendered_total").increment(history.len() as u64);
    let request = AgentRequest {
        context_id: context_id.to_owned(),
        task_id,
        message,
        history,
        prompt,
        turn: meta.turns,
        state: meta.agent_state.clone(),
    };
    store.apply(batch)?;
    Ok(BegunTurn {
        meta,
        record,
        task,
        request,
    })
}

/// What a task cut off by a crash says when it is marked failed.
pub const INTERRUPTED_TASK_TEXT: &str = "the server stopped before the agent finished";

/// A task left working by a process that died: it will never finish, so it failed. Returns
/// whether it was still running.
fn fail_interrupted_task(
    store: &Store,
    task_id: &str,
    batch: &mut WriteBatch,
) -> EngineResult<bool> {
    let Some(previous) = store.task(task_id)? else {
        return Ok(false);
    };
    if previous.task.status.state.ends_turn() {
        return Ok(false);
    }
    let mut record = previous.clone();
    record.task.status = TaskStatus::new(
        TaskState::Failed,
        Some(Message::agent_text(
            INTERRUPTED_TASK_TEXT,
            &record.task.context_id,
            Some(task_id),
        )),
    );
    batch.put_task(&record, Some(&previous));
    Ok(true)
}

/// At start, before any turn runs: fails every task the store's running-task index holds (the
/// turns a crash cut off), reading only that index. A conversation's stale `running_task` is then
/// found already failed when the conversation is next used.
///
/// This assumes one process owns the store: on a store shared by several processes, only the
/// tasks of this process's own earlier run could be failed here.
pub fn fail_interrupted_tasks(store: &Store) -> EngineResult<usize> {
    let mut batch = WriteBatch::new();
    let mut failed = 0;
    for task_id in store.running_tasks()? {
        if fail_interrupted_task(store, &task_id, &mut batch)? {
            failed += 1;
        } else {
            batch.forget_running_task(&task_id);
        }
    }
    store.apply(batch)?;
    Ok(failed)
}

/// The reply (the text the caller received, in full) and the task's final state, to store.
pub fn finish(
    begun: BegunTurn,
    outcome: TurnOutcome,
    artifacts: Vec<Artifact>,
    reply_text: String,
) -> (SendResult, WriteBatch) {
    let BegunTurn {
        meta: began_meta,
        mut record,
        task: begun_task,
        ..
    } = begun;
    // The task's messages so far were loaded when the turn began; only the reply is new.
    let mut history = begun_task.history;
    let key = began_meta.key();
    let mut meta = began_meta.clone();
    let context_id = meta.context_id.clone();
    let task_id = record.task.id.clone();
    let mut batch = WriteBatch::new();

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
    if let Some(mut reply) = reply {
        reply.role = Role::Agent;
        reply.context_id = Some(context_id.clone());
        reply.task_id = Some(task_id.clone());
        reply.timestamp.get_or_insert_with(now);
        batch.append_message(&key, meta.next_seq, &reply);
        record.history_seqs.push(meta.next_seq);
        meta.next_seq += 1;
        history.push(reply);
    }
    let previous = record.clone();
    record.task.status = TaskStatus::new(outcome.state, status_message);
    record.task.artifacts = artifacts;
    batch.put_task(&record, Some(&previous));
    meta.running_task = None;
    meta.updated_at = now();
    if outcome.agent_state.is_some() {
        meta.agent_state = outcome.agent_state.clone();
    }
    batch.put_conversation(&meta, Some(&began_meta));

    if let Some(mut message) = outcome.message {
        message.context_id = Some(context_id);
        message.task_id = None;
        return (SendResult::Message(message), batch);
    }
    let mut task = record.task;
    task.history = history;
    (SendResult::Task(task), batch)
}

/// Cancels a task that is not running (waiting for input): it becomes canceled.
pub fn cancel_waiting(store: &Store, principal: &str, task_id: &str) -> EngineResult<Task> {
    let previous = owned_task(store, principal, task_id)?;
    ensure_cancelable(&previous)?;
    let mut record = previous.clone();
    record.task.status = TaskStatus::new(
        TaskState::Canceled,
        Some(Message::agent_text(
            "canceled by the client",
            &record.task.context_id,
            Some(task_id),
        )),
    );
    let mut batch = WriteBatch::new();
    batch.put_task(&record, Some(&previous));
    store.apply(batch)?;
    let mut task = record.task.clone();
    task.history = store.messages(&record.conversation(), &record.history_seqs)?;
    Ok(task)
}

/// The stored task if it belongs to `principal`; another principal's task is simply not found.
pub fn owned_task(store: &Store, principal: &str, task_id: &str) -> EngineResult<TaskRecord> {
    store
        .task(task_id)?
        .filter(|r| r.principal == principal)
        .ok_or_else(|| EngineError::TaskNotFound(task_id.to_owned()))
}

/// A message may continue this task only while it is not terminal.
pub fn ensure_open(record: &TaskRecord) -> EngineResult<()> {
    let state = record.task.status.state;
    if state.is_terminal() {
        return Err(EngineError::TaskTerminal {
            task_id: record.task.id.clone(),
            state,
        });
    }
    Ok(())
}

/// Only a task that has not ended can be canceled.
pub fn ensure_cancelable(record: &TaskRecord) -> EngineResult<()> {
    let state = record.task.status.state;
    if state.is_terminal() {
        return Err(EngineError::TaskNotCancelable {
            task_id: record.task.id.clone(),
            state,
        });
    }
    Ok(())
}

/// A stored task with its history, as `GetTask` shows it.
pub fn load_task(
    store: &Store,
    principal: &str,
    task_id: &str,
) -> EngineResult<(TaskRecord, Task)> {
    let record = owned_task(store, principal, task_id)?;
    let mut task = record.task.clone();
    task.history = store.messages(&record.conversation(), &record.history_seqs)?;
    Ok((record, task))
}
