//! The embedded store's operations. Writes run on the store thread (`writer.rs`), one after
//! another, so each one's checks and its batch are one step; reads run on blocking threads.
//!
//! On one process the lease of a conversation is "a turn of this process holds it": [`LiveTurns`]
//! records which. A conversation whose stored `running_task` has no live turn was cut off by a
//! crash (sled allows one process per folder), so its task is failed when the conversation is
//! next taken.

use super::records::{
    Conversation, Keys, ListedTask, Place, Records, TaskFilter, TaskRecord, WriteBatch,
};
use crate::model::{Message, Task, TaskState, TaskStatus};
use crate::store::{
    BeginTurn, BudgetedPage, ConversationKey, ConversationMeta, ConversationPage,
    ConversationRecords, FinishTurn, Imported, Lease, MessagesFrom, Page, ResponseBudget,
    StoreError, StoreResult, StreamOutline, TaskQuery, TaskRecords, TurnBegun, as_listed,
    shown_history,
};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// What a task cut off by a crash says when it is marked failed.
pub(super) const INTERRUPTED_TASK_TEXT: &str = "the server stopped before the agent finished";

/// The conversations whose turns run in this process: each turn's token, and its conversation
/// and task as last written (only the store thread writes them, so this is what is stored, and
/// the turn's later writes need not read and decode them again).
#[derive(Default)]
pub struct LiveTurns(Mutex<HashMap<ConversationKey, LiveTurn>>);

/// Shared, so that checking a lease (`held`) copies neither record.
struct LiveTurn {
    token: u64,
    keys: Keys,
    conversation: Arc<Conversation>,
    record: Arc<TaskRecord>,
}

impl LiveTurns {
    fn holder(&self, key: &ConversationKey) -> Option<u64> {
        self.0.lock().get(key).map(|turn| turn.token)
    }
}

/// Stores the caller's message and the task as working, in one batch, if no live turn holds
/// the conversation.
pub fn begin(records: &Records, live: &LiveTurns, turn: BeginTurn) -> StoreResult<TurnBegun> {
    turn.debug_check_keys();
    let keys = Keys {
        conversation: turn.key,
        principal: turn.principal_key,
    };
    let key = keys.conversation;
    // A minted contextId is in no stored conversation: looking would page in a leaf of the
    // conversations' hashed keys, at random, on the store thread (most of what a turn's cost
    // grew by as the store grew).
    let stored = if turn.new_context {
        None
    } else {
        records.conversation(&key)?
    };
    let mut batch = WriteBatch::new();
    let mut conversation = match &stored {
        Some(stored) => stored.clone(),
        None => Conversation {
            meta: ConversationMeta::new(&turn.principal, &turn.context_id),
            place: Place::Numbered(records.number_new_conversation(&mut batch)?),
        },
    };
    let place = conversation.place;
    let meta = &mut conversation.meta;
    if let Some(running) = meta.running_task.take() {
        if live.holder(&key).is_some() {
            return Err(StoreError::Busy {
                context_id: turn.context_id,
                task_id: running,
            });
        }
        fail_interrupted_task(records, &running, &mut batch)?;
    }
    // A conversation never stored has no messages to read; one where the caller saw it last
    // has the window the caller kept.
    let recent = match &stored {
        Some(stored) if turn.known == Some(stored.meta.mark()) => None,
        Some(stored) => Some(records.recent_messages(
            &place,
            &turn.context_id,
            stored.meta.next_seq,
            turn.history_limit,
        )?),
        None => Some(Vec::new()),
    };
    let (mut record, previous) = if turn.continuing {
        let record = owned_task(records, &turn.principal, &turn.task_id)?;
        if record.task.context_id != turn.context_id {
            return Err(StoreError::TaskNotFound(turn.task_id));
        }
        ensure_open(&record)?;
        (record.clone(), Some(record))
    } else {
        (new_task_record(&turn, &place), None)
    };
    let seq = meta.next_seq;
    meta.next_seq += 1;
    meta.turns += 1;
    meta.token = crate::store::new_token();
    meta.updated_at = crate::model::now();
    meta.running_task = Some(turn.task_id.clone());
    batch.append_message(&place, &turn.context_id, seq, &turn.message);
    record.history_seqs.push(seq);
    record.task.status = TaskStatus::new(TaskState::Working, None);
    record.task.artifacts.clear();
    record.reply_in = None;
    batch.put_task(&keys, &record, previous.as_ref());
    super::push::put_with_start(
        records,
        &turn.principal,
        &turn.push_configs,
        &turn.task_id,
        &mut batch,
    );
    super::push::enqueue_with(
        records,
        &mut batch,
        &record,
        turn.trace.as_deref(),
        &turn.principal,
        &turn.push_configs,
    )?;
    let mark = meta.mark();
    let turns = meta.turns;
    let agent_state = meta.agent_state.clone();
    batch.put_conversation(&keys, &conversation, stored.as_ref().map(|s| &s.meta));

    let mut task = record.task.clone();
    let earlier = &record.history_seqs[..record.history_seqs.len() - 1];
    task.history = records.messages(&place, &turn.context_id, earlier)?;
    task.history.push(turn.message);
    records.apply(batch)?;
    let live_turn = LiveTurn {
        token: mark.token,
        keys,
        conversation: Arc::new(conversation),
        record: Arc::new(record),
    };
    live.0.lock().insert(key, live_turn);
    Ok(TurnBegun {
        lease: Lease {
            key,
            task_id: turn.task_id,
            token: mark.token,
            trace: turn.trace,
        },
        task,
        recent: recent.map(|recent| recent.into_iter().map(|(_, m)| m).collect()),
        mark,
        turn: turns,
        agent_state,
    })
}

fn new_task_record(turn: &BeginTurn, place: &Place) -> TaskRecord {
    TaskRecord {
        task: turn.new_task(),
        principal: turn.principal.clone(),
        history_seqs: Vec::new(),
        reply_in: None,
        conversation_number: place.number(),
        stream: None,
    }
}

/// The conversation's metadata and the lease's task as stored, if the lease still holds the
/// conversation: its turn is live here with that token (a newer take replaced it otherwise).
fn held(
    live: &LiveTurns,
    lease: &Lease,
) -> StoreResult<(Keys, Arc<Conversation>, Arc<TaskRecord>)> {
    let turns = live.0.lock();
    match turns.get(&lease.key) {
        Some(turn) if turn.token == lease.token && turn.record.task.id == lease.task_id => {
            Ok((turn.keys, turn.conversation.clone(), turn.record.clone()))
        }
        _ => Err(StoreError::StaleToken {
            task_id: lease.task_id.clone(),
        }),
    }
}

/// A lease of this process holds while its turn is live: nothing to extend, only to check.
pub fn renew(live: &LiveTurns, lease: &Lease) -> StoreResult<()> {
    held(live, lease).map(|_| ())
}

pub fn record_status(
    records: &Records,
    live: &LiveTurns,
    lease: &Lease,
    status: TaskStatus,
) -> StoreResult<()> {
    let (keys, _, previous) = held(live, lease)?;
    let mut record = TaskRecord::clone(&previous);
    record.task.status = status;
    let mut batch = WriteBatch::new();
    batch.put_task(&keys, &record, Some(&previous));
    super::push::enqueue(records, &mut batch, &record, lease.trace.as_deref())?;
    records.apply(batch)?;
    if let Some(turn) = live.0.lock().get_mut(&lease.key) {
        turn.record = Arc::new(record);
    }
    Ok(())
}

/// Appends the reply, stores the final state and releases the conversation.
pub fn finish(records: &Records, live: &LiveTurns, end: FinishTurn) -> StoreResult<()> {
    let lease = &end.lease;
    let (keys, stored, previous) = held(live, lease)?;
    let mut conversation = Conversation::clone(&stored);
    let meta = &mut conversation.meta;
    let mut record = TaskRecord::clone(&previous);
    let mut batch = WriteBatch::new();
    record.task.status = end.status;
    record.task.artifacts = end.artifacts;
    record.stream = end.stream;
    record.reply_in = None;
    if let Some(reply) = &end.reply {
        batch.append_message(&conversation.place, &meta.context_id, meta.next_seq, reply);
        record.history_seqs.push(meta.next_seq);
        record.elide_reply(reply, meta.next_seq);
        meta.next_seq += 1;
    }
    batch.put_task(&keys, &record, Some(&previous));
    super::push::enqueue(records, &mut batch, &record, lease.trace.as_deref())?;
    meta.running_task = None;
    meta.updated_at = crate::model::now();
    if end.agent_state.is_some() {
        meta.agent_state = end.agent_state;
    }
    batch.put_conversation(&keys, &conversation, Some(&stored.meta));
    records.apply(batch)?;
    live.0.lock().remove(&lease.key);
    Ok(())
}

/// Cancels a task that waits for input: it becomes canceled.
pub fn cancel_waiting(
    records: &Records,
    live: &LiveTurns,
    principal: &str,
    task_id: &str,
) -> StoreResult<Task> {
    let previous = owned_task(records, principal, task_id)?;
    let state = previous.task.status.state;
    if state.is_terminal() {
        return Err(StoreError::TaskNotCancelable {
            task_id: task_id.to_owned(),
            state,
        });
    }
    let keys = Keys::new(principal, &previous.task.context_id);
    let key = keys.conversation;
    let running_here = records
        .conversation(&key)?
        .is_some_and(|stored| stored.meta.running_task.as_deref() == Some(task_id));
    if running_here && live.holder(&key).is_some() {
        return Err(StoreError::Busy {
            context_id: previous.task.context_id.clone(),
            task_id: task_id.to_owned(),
        });
    }
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
    batch.put_task(&keys, &record, Some(&previous));
    super::push::enqueue(records, &mut batch, &record, None)?;
    records.apply(batch)?;
    let place = record.place();
    let mut task = record.task;
    task.history = records.messages(&place, &task.context_id, &record.history_seqs)?;
    Ok(task)
}

/// A task left working by a process that died: it will never finish, so it failed. Returns
/// whether it was still running.
fn fail_interrupted_task(
    records: &Records,
    task_id: &str,
    batch: &mut WriteBatch,
) -> StoreResult<bool> {
    let Some(previous) = records.task(task_id)? else {
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
    let keys = Keys::new(&record.principal, &record.task.context_id);
    batch.put_task(&keys, &record, Some(&previous));
    super::push::enqueue(records, batch, &record, None)?;
    Ok(true)
}

/// Fails every task the running-task index holds whose conversation no live turn holds,
/// reading only that index. A conversation's stale `running_task` is then found already failed
/// when the conversation is next taken.
pub fn fail_interrupted(records: &Records, live: &LiveTurns) -> StoreResult<usize> {
    let mut batch = WriteBatch::new();
    let mut failed = 0;
    for task_id in records.running_tasks()? {
        let held_here = records
            .task(&task_id)?
            .is_some_and(|r| live.holder(&r.conversation()).is_some());
        if held_here {
            continue;
        }
        if fail_interrupted_task(records, &task_id, &mut batch)? {
            failed += 1;
        } else {
            batch.forget_running_task(&task_id);
        }
    }
    records.apply(batch)?;
    Ok(failed)
}

pub fn delete_conversation(
    records: &Records,
    live: &LiveTurns,
    key: &ConversationKey,
) -> StoreResult<bool> {
    let Some(stored) = records.conversation(key)? else {
        return Ok(false);
    };
    if let Some(task_id) = stored
        .meta
        .running_task
        .clone()
        .filter(|_| live.holder(key).is_some())
    {
        return Err(StoreError::Busy {
            context_id: stored.meta.context_id,
            task_id,
        });
    }
    records.delete_conversation(&stored)?;
    Ok(true)
}

/// What an import does with a conversation the store already holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Existing {
    /// Leaves it alone (counted as skipped): `colloquy import`, safe to run again.
    Skip,
    /// Writes the given metadata over it and adds the messages (a bulk load, benchmarks).
    Overwrite,
}

/// Stores conversations with their messages and tasks as given, in one batch.
pub fn import(
    records: &Records,
    items: Vec<ConversationRecords>,
    existing: Existing,
) -> StoreResult<Imported> {
    let mut batch = WriteBatch::new();
    let mut imported = Imported::default();
    let mut conversations = HashSet::new();
    let mut task_ids = HashSet::new();
    for item in items {
        item.check()?;
        let keys = Keys::new(&item.meta.principal, &item.meta.context_id);
        let key = keys.conversation;
        let previous = records.conversation(&key)?;
        let seen = !conversations.insert(key);
        if existing == Existing::Skip && (seen || previous.is_some()) {
            imported.skipped += 1;
            continue;
        }
        for record in &item.tasks {
            let id = &record.task.id;
            if !task_ids.insert(id.clone()) || records.task(id)?.is_some() {
                return Err(StoreError::ImportRefused(format!(
                    "task {id} is already stored (in another conversation or twice)"
                )));
            }
        }
        // Overwritten, a conversation keeps its place; a new one is numbered.
        let place = match &previous {
            Some(previous) => previous.place,
            None => Place::Numbered(records.number_new_conversation(&mut batch)?),
        };
        for (offset, message) in item.messages.iter().enumerate() {
            batch.append_message(
                &place,
                &item.meta.context_id,
                item.first_seq + offset as u64,
                message,
            );
        }
        for task in item.tasks {
            let record = TaskRecord {
                task: task.task,
                principal: item.meta.principal.clone(),
                history_seqs: task.history_seqs,
                reply_in: None,
                conversation_number: place.number(),
                stream: None,
            };
            batch.put_task(&keys, &record, None);
        }
        let conversation = Conversation {
            meta: item.meta,
            place,
        };
        batch.put_conversation(&keys, &conversation, previous.as_ref().map(|p| &p.meta));
        imported.conversations += 1;
    }
    records.apply(batch)?;
    Ok(imported)
}

/// Up to `limit` conversations whole, in key order after `after`; only `principal`'s if given.
pub fn export(
    records: &Records,
    principal: Option<&str>,
    after: Option<ConversationKey>,
    limit: usize,
) -> StoreResult<Vec<ConversationRecords>> {
    let mut page = Vec::new();
    for stored in records.conversations_after(after.as_ref()) {
        let stored = stored?;
        if principal.is_some_and(|p| p != stored.meta.principal) {
            continue;
        }
        page.push(export_one(records, stored)?);
        if page.len() >= limit {
            break;
        }
    }
    Ok(page)
}

fn export_one(records: &Records, stored: Conversation) -> StoreResult<ConversationRecords> {
    let Conversation { meta, place } = stored;
    let mut first_seq = None;
    let mut messages = Vec::new();
    for entry in records.messages_from(&place, &meta.context_id, 0, None)? {
        let (seq, message, _) = entry?;
        if seq != *first_seq.get_or_insert(seq) + messages.len() as u64 {
            return Err(StoreError::corrupt_msg(format!(
                "conversation {:?} has a gap before message {seq}",
                meta.context_id
            )));
        }
        messages.push(message);
    }
    let mut task_ids = records.conversation_task_ids(&place)?;
    task_ids.sort_unstable();
    let mut tasks = Vec::with_capacity(task_ids.len());
    for id in task_ids {
        if let Some(record) = records.task(&id)? {
            let mut task = record.task;
            task.history.clear();
            tasks.push(TaskRecords {
                task,
                stream: None,
                history_seqs: record.history_seqs,
            });
        }
    }
    Ok(ConversationRecords {
        meta,
        first_seq: first_seq.unwrap_or(0),
        messages,
        tasks,
    })
}

/// The stored task if it belongs to `principal`; another principal's task is simply not found.
fn owned_task(records: &Records, principal: &str, task_id: &str) -> StoreResult<TaskRecord> {
    records
        .task(task_id)?
        .filter(|r| r.principal == principal)
        .ok_or_else(|| StoreError::TaskNotFound(task_id.to_owned()))
}

/// A message may continue a task only while it is not terminal.
fn ensure_open(record: &TaskRecord) -> StoreResult<()> {
    let state = record.task.status.state;
    if state.is_terminal() {
        return Err(StoreError::TaskTerminal {
            task_id: record.task.id.clone(),
            state,
        });
    }
    Ok(())
}

/// A stored task with its whole history.
pub fn task(records: &Records, principal: &str, task_id: &str) -> StoreResult<Option<Task>> {
    let Some(record) = records.task(task_id)?.filter(|r| r.principal == principal) else {
        return Ok(None);
    };
    let mut task = record.task.clone();
    task.history = records.messages(&record.place(), &task.context_id, &record.history_seqs)?;
    Ok(Some(task))
}

pub fn stream_outline(
    records: &Records,
    principal: &str,
    task_id: &str,
) -> StoreResult<Option<StreamOutline>> {
    Ok(records
        .task(task_id)?
        .filter(|r| r.principal == principal)
        .and_then(|r| r.stream))
}

pub fn list_tasks(records: &Records, principal: &str, query: TaskQuery) -> StoreResult<Page<Task>> {
    let conversation = match query.context_id.as_deref() {
        None => None,
        Some(context_id) => {
            let key = ConversationKey::new(principal, context_id);
            // A conversation never stored has no tasks at either place.
            let stored = records.conversation(&key)?;
            Some(stored.map_or(Place::Hashed(key), |stored| stored.place))
        }
    };
    let filter = TaskFilter {
        conversation,
        state: query.state,
        status_after: query.status_after,
    };
    let listed = records.list_tasks(
        principal,
        &filter,
        query.page_size,
        query.page_token.as_deref(),
    )?;
    let mut page = BudgetedPage::new(query.max_bytes, listed.next_page_token);
    for ListedTask {
        task_id,
        resume_token,
    } in &listed.items
    {
        match listed_task(records, task_id, &query)? {
            Some((task, bytes)) => {
                if !page.offer(task, bytes, resume_token) {
                    break;
                }
            }
            None => page.pass(resume_token),
        }
    }
    Ok(page.finish(listed.total_size))
}

/// A listed task as the view shows it, and its estimated size: the stored sizes of its record
/// (less its artifacts' text when they are not shown) and of the messages shown. None if it is
/// gone.
fn listed_task(
    records: &Records,
    task_id: &str,
    query: &TaskQuery,
) -> StoreResult<Option<(Task, usize)>> {
    let Some((record, record_bytes)) = records.task_sized(task_id)? else {
        return Ok(None);
    };
    let (history, history_bytes) = records.messages_sized(
        &record.place(),
        &record.task.context_id,
        shown_history(&query.view, &record.history_seqs),
    )?;
    Ok(Some(as_listed(
        &query.view,
        record.task,
        history,
        record_bytes + history_bytes,
    )))
}

/// A conversation's metadata and one page of its messages, oldest first, within the budget.
pub fn conversation_page(
    records: &Records,
    key: &ConversationKey,
    from: MessagesFrom,
    max_bytes: usize,
) -> StoreResult<Option<ConversationPage>> {
    let Some(Conversation { meta, place }) = records.conversation(key)? else {
        return Ok(None);
    };
    let (first, page_token) = match &from {
        MessagesFrom::Latest(n) => (meta.next_seq.saturating_sub(*n as u64), None),
        MessagesFrom::PageToken(token) => (0, Some(token.as_str())),
    };
    let mut budget = ResponseBudget::new(max_bytes);
    let mut messages = Vec::new();
    let mut next_page_token = String::new();
    for entry in records.messages_from(&place, &meta.context_id, first, page_token)? {
        let (seq, message, bytes) = entry?;
        if !budget.take(bytes) {
            next_page_token = crate::store::page_token::for_message(seq);
            break;
        }
        messages.push(message);
    }
    Ok(Some(ConversationPage {
        meta,
        messages,
        next_page_token,
    }))
}
