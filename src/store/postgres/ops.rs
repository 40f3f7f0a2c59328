//! The PostgreSQL store's operations: each one attempt of one transaction (the caller retries
//! conflicts). They give the embedded store's answers (`store/embedded/ops.rs`); the lease is
//! the conversation row's `running_task`, `token` and `lease_expires`.
//!
//! Locks are taken conversation row first, then task rows, in every operation.

use super::{ABANDONED_TASK_TEXT, Failure, Ops};
use crate::model::{Message, Task, TaskState, TaskStatus};
use crate::store::{
    BeginTurn, BudgetedPage, ConversationKey, ConversationMeta, ConversationPage, FinishTurn,
    Lease, MessagesFrom, Page, PrincipalKey, ResponseBudget, StoreError, StreamOutline, TaskQuery,
    TurnBegun, as_listed, page_token, shown_history,
};
use deadpool_postgres::{GenericClient, Object};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

/// The lease: a conditional insert-or-update of the conversations in `$rows` (the columns of the
/// insert below) that succeeds only while `$free` holds of a conversation's row (by the
/// database's clock). Moves the token.
macro_rules! take_sql {
    ($rows:literal, $free:literal) => {
        take_sql!($rows, $free, "")
    };
    // `$more`: further `RETURNING` columns, a comma first.
    ($rows:literal, $free:literal, $more:literal) => {
        concat!(
            "INSERT INTO colloquy_conversations (conv_key, principal_key, principal, \
                 context_id, created_at, updated_at, updated_ms, turns, next_seq, token, \
                 running_task, lease_expires, lease_holder, agent_state) ",
            $rows,
            " ON CONFLICT (conv_key) DO UPDATE SET \
                 updated_at = excluded.updated_at, updated_ms = excluded.updated_ms, \
                 turns = colloquy_conversations.turns + 1, \
                 next_seq = colloquy_conversations.next_seq + 1, \
                 token = excluded.token, \
                 running_task = excluded.running_task, \
                 lease_expires = excluded.lease_expires, \
                 lease_holder = excluded.lease_holder \
             WHERE ",
            $free,
            " RETURNING conv_key, turns, next_seq, token, agent_state",
            $more
        )
    };
}
pub(super) use take_sql;

/// The general path's take: a free conversation, or one whose holder's lease expired.
const TAKE_SQL: &str = take_sql!(
    "VALUES ($1, $2, $3, $4, $5, $5, $6, 1, 1, $10, $7, \
         now() + $8::FLOAT8 * INTERVAL '1 second', $9, NULL)",
    "colloquy_conversations.running_task IS NULL \
     OR colloquy_conversations.lease_expires <= now()"
);
/// Locks the conversation (before a turn starts).
const LOCK_CONVERSATION_SQL: &str = "SELECT running_task, lease_expires <= now() AS expired \
     FROM colloquy_conversations WHERE conv_key = $1 FOR UPDATE";
/// The latest `$2` messages, read before the lease moves `next_seq` on.
const HISTORY_WINDOW_SQL: &str = "SELECT body FROM colloquy_messages WHERE conv_key = $1 \
     AND seq >= (SELECT next_seq FROM colloquy_conversations WHERE conv_key = $1) - $2 \
     ORDER BY seq";
/// Locks the conversation if the lease (token and task) still holds it.
const HELD_SQL: &str = "SELECT next_seq FROM colloquy_conversations \
     WHERE conv_key = $1 AND token = $2 AND running_task = $3 FOR UPDATE";
const LOAD_TASK_SQL: &str =
    "SELECT conv_key, principal, record FROM colloquy_tasks WHERE task_id = $1";
const LOCK_TASK_SQL: &str =
    "SELECT conv_key, principal, record FROM colloquy_tasks WHERE task_id = $1 FOR UPDATE";

/// The tasks of one conversation or principal (`t.{scope} = $1`, `scope` a column both tables
/// have: `conv_key` or `principal_key`) that meet `condition` (on `t`), each of the two parts
/// ending with `tail` (an order and limit): the settled tasks (past working: `TaskState::code`,
/// submitted 0, working 1), which the listing indexes hold (migration 8), and the running
/// conversations' tasks, which they do not. A task that is not settled is its conversation's
/// running task: the same transactions set its state and `running_task`.
pub(super) fn scoped_tasks(scope: &str, columns: &str, condition: &str, tail: &str) -> String {
    format!(
        "(SELECT {columns} FROM colloquy_tasks t \
             WHERE t.{scope} = $1 AND t.state > 1 AND {condition} {tail}) \
         UNION ALL (SELECT {columns} FROM colloquy_conversations c JOIN colloquy_tasks t \
                 ON t.task_id = c.running_task AND t.conv_key = c.conv_key \
             WHERE c.{scope} = $1 AND c.running_task IS NOT NULL AND t.state <= 1 \
                 AND {condition} {tail})"
    )
}

/// Turn starts and ends written the general way, in several round trips (`turn.rs` says when).
const GENERAL_STEPS: &str = "colloquy_store_general_turn_steps_total";

/// Prepares `statements` on this connection: the first time in one round trip (their parses
/// pipelined), after that from the connection's cache at no cost. A pipelined batch must have
/// its statements prepared, or one that still waits for its prepare goes out after those that
/// do not, out of the batch's order (taking locks task row first, or moving `next_seq` before
/// the history window is read).
async fn prepared(client: &impl GenericClient, statements: &[&str]) -> Result<(), Failure> {
    futures_util::future::try_join_all(statements.iter().map(|sql| client.prepare_cached(sql)))
        .await?;
    Ok(())
}

/// A task as stored (its `record` column, in JSON): the one type both stores and transfers use.
pub(super) type StoredTask = crate::store::TaskRecords;

/// A task row: the record and who owns it.
pub(super) struct TaskRow {
    pub(super) key: ConversationKey,
    principal: String,
    pub(super) stored: StoredTask,
    bytes: usize,
}

pub(super) const META_COLUMNS: &str = "context_id, principal, created_at, updated_at, turns, next_seq, \
                            running_task, token, agent_state";

/// Messages read per query while filling a page.
const MESSAGE_BATCH: i64 = 256;

pub(super) fn encode<T: Serialize>(value: &T) -> String {
    // Sized for a usual record (a message, a task), so that it is written without growing the
    // buffer again and again; it lives only until its statement is sent. JSON text is UTF-8.
    String::from_utf8(crate::json::to_vec(value, 2048)).unwrap_or_default()
}

pub(super) fn decode<T: for<'de> Deserialize<'de>>(text: &str) -> Result<T, Failure> {
    serde_json::from_str(text).map_err(|e| StoreError::corrupt(e).into())
}

/// An id column: its UTF-8 bytes.
pub(super) fn text(row: &Row, column: &str) -> Result<String, Failure> {
    let bytes: Vec<u8> = row.try_get(column)?;
    String::from_utf8(bytes).map_err(|e| StoreError::corrupt(e).into())
}

pub(super) fn opt_text(row: &Row, column: &str) -> Result<Option<String>, Failure> {
    let bytes: Option<Vec<u8>> = row.try_get(column)?;
    bytes
        .map(|b| String::from_utf8(b).map_err(|e| StoreError::corrupt(e).into()))
        .transpose()
}

pub(super) fn meta_of(row: &Row) -> Result<ConversationMeta, Failure> {
    let agent_state: Option<String> = row.try_get("agent_state")?;
    Ok(ConversationMeta {
        context_id: text(row, "context_id")?,
        principal: text(row, "principal")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        turns: row.try_get::<_, i64>("turns")? as u64,
        next_seq: row.try_get::<_, i64>("next_seq")? as u64,
        running_task: opt_text(row, "running_task")?,
        token: row.try_get::<_, i64>("token")? as u64,
        agent_state: agent_state.as_deref().map(decode).transpose()?,
    })
}

fn task_row(row: &Row) -> Result<TaskRow, Failure> {
    let key_bytes: Vec<u8> = row.try_get("conv_key")?;
    let key = ConversationKey::from_bytes(&key_bytes).ok_or_else(|| {
        StoreError::corrupt_msg("a task names a conversation key of another version")
    })?;
    let record: String = row.try_get("record")?;
    Ok(TaskRow {
        key,
        principal: text(row, "principal")?,
        stored: decode(&record)?,
        bytes: record.len(),
    })
}

/// A listing's page token, resuming after the row ordered by `ordinal`, then `tail`.
pub(super) fn resume_token(ordinal: i64, tail: &[u8]) -> String {
    page_token::for_listing(ordinal.to_be_bytes(), tail)
}

pub(super) fn parse_page_token(token: Option<&str>) -> Result<Option<(i64, Vec<u8>)>, Failure> {
    let Some(token) = token.filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    let (order, tail) = page_token::listing(token)?;
    Ok(Some((i64::from_be_bytes(order), tail)))
}

fn failed_status(task: &Task, text: &str) -> TaskStatus {
    TaskStatus::new(
        TaskState::Failed,
        Some(Message::agent_text(text, &task.context_id, Some(&task.id))),
    )
}

impl Ops {
    pub(super) async fn client(&self) -> Result<Object, Failure> {
        self.pool.get().await.map_err(Failure::Pool)
    }

    /// Stores the caller's message and the task as working, and takes the conversation's
    /// lease, in one transaction, unless a live lease holds it: in one round trip when it can
    /// (`turn.rs`), else in the general way.
    pub(super) async fn begin(&self, turn: &BeginTurn) -> Result<TurnBegun, Failure> {
        turn.debug_check_keys();
        if !turn.continuing
            && turn.push_configs.is_empty()
            && let Some(begun) = self.start_in_one_trip(turn).await?
        {
            return Ok(begun);
        }
        metrics::counter!(GENERAL_STEPS).increment(1);
        // Boxed, as the end's: the general path's states would otherwise make every start's
        // future their size, and it is moved whole when spawned.
        let begun = Box::pin(self.begin_in_transaction(turn)).await;
        self.outbox.notify_one();
        begun
    }

    /// The general start: any task, any lease.
    ///
    /// Four round trips on the usual path: `BEGIN`; the conversation's lock, its history
    /// window, the task it continues and the lease, pipelined; the message, the task and its
    /// push configs, pipelined; `COMMIT` (a send that registers a push config stores it first,
    /// one more). Statements go in that order, so locks are still taken conversation row first.
    async fn begin_in_transaction(&self, turn: &BeginTurn) -> Result<TurnBegun, Failure> {
        let key = turn.key;
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        prepared(
            &tx,
            &[
                LOCK_CONVERSATION_SQL,
                HISTORY_WINDOW_SQL,
                LOCK_TASK_SQL,
                TAKE_SQL,
            ],
        )
        .await?;
        let (current, recent, continued, taken) = futures_util::try_join!(
            lock_conversation(&tx, &key),
            history_window(&tx, &key, turn.history_limit),
            continued_task(&tx, turn),
            self.take(&tx, turn, &key),
        )?;
        free_for(&tx, turn, current).await?;
        let mut stored = task_to_run(turn, &key, continued)?;
        let before = turn.continuing.then(|| stored.clone());
        let Some(taken) = taken else {
            // Taken by another node between its read and ours.
            return Err(busy(&tx, turn, &key).await?.into());
        };
        let seq = taken.next_seq - 1;
        stored.history_seqs.push(seq);
        stored.task.status = TaskStatus::new(TaskState::Working, None);
        stored.task.artifacts.clear();
        let earlier = &stored.history_seqs[..stored.history_seqs.len() - 1];
        // A send's push configs are stored before the task row, whose write reads them to
        // notify (no round trip when the send has none).
        super::push::put_with_start(
            &tx,
            &key,
            &turn.principal,
            &turn.push_configs,
            &turn.task_id,
        )
        .await?;
        let (_, _, (history, _)) = futures_util::try_join!(
            insert_message(&tx, &key, seq, &turn.message),
            put_task(&tx, &key, &turn.principal, &stored, turn.trace.as_deref()),
            messages_at(&tx, &key, earlier),
        )?;
        let mut task = stored.task.clone();
        task.history = history;
        task.history.push(turn.message.clone());
        if let Err(e) = tx.commit().await {
            if super::failover::connection_lost(&e) {
                // Perhaps stored (and on the standby): the caller is told to retry, so take it back.
                let start = super::failover::UnansweredStart {
                    key,
                    principal: turn.principal.clone(),
                    task_id: turn.task_id.clone(),
                    token: Some(taken.token),
                    before,
                };
                super::failover::undo_unanswered_start(self.pool.clone(), start);
            }
            return Err(e.into());
        }
        Ok(self.begun(turn, key, taken, stored, task, Some(recent)))
    }

    /// The lease itself ([`TAKE_SQL`]).
    async fn take(
        &self,
        tx: &impl GenericClient,
        turn: &BeginTurn,
        key: &ConversationKey,
    ) -> Result<Option<Taken>, Failure> {
        let values = TakeValues::of(self, turn, key);
        let row = tx
            .query_opt(&tx.prepare_cached(TAKE_SQL).await?, &values.params())
            .await?;
        row.as_ref().map(Taken::of).transpose().map(Option::flatten)
    }

    pub(super) async fn record_status(
        &self,
        lease: &Lease,
        status: &TaskStatus,
    ) -> Result<(), Failure> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        held(&tx, lease).await?;
        let mut row = load_task(&tx, &lease.task_id, true)
            .await?
            .ok_or_else(|| stale(lease))?;
        row.stored.task.status = status.clone();
        put_task(
            &tx,
            &lease.key,
            &row.principal,
            &row.stored,
            lease.trace.as_deref(),
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Extends the lease by the database's clock, if the token still holds it.
    pub(super) async fn renew(&self, lease: &Lease) -> Result<(), Failure> {
        let client = self.client().await?;
        let renewed = client
            .execute(
                &client
                    .prepare_cached(
                        "UPDATE colloquy_conversations \
                 SET lease_expires = now() + $4::FLOAT8 * INTERVAL '1 second' \
                 WHERE conv_key = $1 AND token = $2 AND running_task = $3",
                    )
                    .await?,
                &[
                    &lease.key.as_bytes().as_slice(),
                    &(lease.token as i64),
                    &lease.task_id.as_bytes(),
                    &self.lease_secs,
                ],
            )
            .await?;
        if renewed == 0 {
            return Err(stale(lease).into());
        }
        Ok(())
    }

    /// Appends the reply, stores the final state and releases the conversation: in one round
    /// trip when it can (`turn.rs`), else in the general way.
    pub(super) async fn finish(&self, end: &FinishTurn) -> Result<(), Failure> {
        if self.end_in_one_trip(end).await? {
            return Ok(());
        }
        metrics::counter!(GENERAL_STEPS).increment(1);
        let finished = Box::pin(self.finish_in_transaction(end)).await;
        self.outbox.notify_one();
        finished
    }

    /// The general end: any task, with its push notifications.
    async fn finish_in_transaction(&self, end: &FinishTurn) -> Result<(), Failure> {
        let lease = &end.lease;
        let key = lease.key.as_bytes().as_slice();
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        // Four round trips: `BEGIN`; the lease's and the task's locks, pipelined; the reply,
        // the task and the conversation's release, pipelined; `COMMIT`.
        prepared(&tx, &[HELD_SQL, LOCK_TASK_SQL]).await?;
        let (mut next_seq, row) =
            futures_util::try_join!(held(&tx, lease), load_task(&tx, &lease.task_id, true))?;
        let mut row = row.ok_or_else(|| stale(lease))?;
        let reply_seq = end.reply.as_ref().map(|_| next_seq);
        if let Some(seq) = reply_seq {
            row.stored.history_seqs.push(seq as u64);
            next_seq += 1;
        }
        row.stored.task.status = end.status.clone();
        row.stored.task.artifacts = end.artifacts.clone();
        let now = crate::model::now();
        let agent_state = end.agent_state.as_ref().map(encode);
        let store_reply = async {
            match (&end.reply, reply_seq) {
                (Some(reply), Some(seq)) => {
                    insert_message(&tx, &lease.key, seq as u64, reply).await
                }
                _ => Ok(()),
            }
        };
        let release = async {
            tx.execute(
                &tx.prepare_cached(
                    "UPDATE colloquy_conversations SET running_task = NULL, lease_expires = NULL, \
                     lease_holder = NULL, next_seq = $2, updated_at = $3, updated_ms = $4, \
                     agent_state = COALESCE($5, agent_state) \
                 WHERE conv_key = $1",
                )
                .await?,
                &[&key, &next_seq, &now, &now.timestamp_millis(), &agent_state],
            )
            .await
            .map_err(Failure::from)
        };
        futures_util::try_join!(
            store_reply,
            put_task(
                &tx,
                &lease.key,
                &row.principal,
                &row.stored,
                lease.trace.as_deref()
            ),
            release,
        )?;
        tx.commit().await?;
        Ok(())
    }

    /// Cancels a task that waits for input. A task whose holder's lease expired is released
    /// (its token moved on) and canceled.
    pub(super) async fn cancel_waiting(
        &self,
        principal: &str,
        task_id: &str,
    ) -> Result<Task, Failure> {
        let not_found = || Failure::Store(StoreError::TaskNotFound(task_id.to_owned()));
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let found = load_task(&tx, task_id, false)
            .await?
            .filter(|r| r.principal == principal)
            .ok_or_else(not_found)?;
        let key = found.key;
        let conversation = tx
            .query_opt(
                &tx.prepare_cached(
                    "SELECT running_task, lease_expires <= now() AS expired \
                 FROM colloquy_conversations WHERE conv_key = $1 FOR UPDATE",
                )
                .await?,
                &[&key.as_bytes().as_slice()],
            )
            .await?;
        let mut row = load_task(&tx, task_id, true).await?.ok_or_else(not_found)?;
        let state = row.stored.task.status.state;
        if state.is_terminal() {
            return Err(StoreError::TaskNotCancelable {
                task_id: task_id.to_owned(),
                state,
            }
            .into());
        }
        if let Some(conversation) = conversation {
            let running = opt_text(&conversation, "running_task")?;
            let expired: Option<bool> = conversation.try_get("expired")?;
            if running.as_deref() == Some(task_id) {
                if expired != Some(true) {
                    return Err(StoreError::Busy {
                        context_id: row.stored.task.context_id.clone(),
                        task_id: task_id.to_owned(),
                    }
                    .into());
                }
                release(&tx, &key).await?;
            }
        }
        let context_id = row.stored.task.context_id.clone();
        row.stored.task.status = TaskStatus::new(
            TaskState::Canceled,
            Some(Message::agent_text(
                "canceled by the client",
                &context_id,
                Some(task_id),
            )),
        );
        put_task(&tx, &key, principal, &row.stored, None).await?;
        let mut task = row.stored.task.clone();
        task.history = messages_at(&tx, &key, &row.stored.history_seqs).await?.0;
        tx.commit().await?;
        Ok(task)
    }

    /// The sweeper: fails the tasks whose holders' leases expired and releases their
    /// conversations (moving the token, so a holder that wakes up can no longer write).
    pub(super) async fn fail_expired(&self) -> Result<usize, Failure> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let expired = tx
            .query(
                &tx.prepare_cached(
                    "SELECT conv_key, running_task FROM colloquy_conversations \
                 WHERE lease_expires <= now() AND running_task IS NOT NULL \
                 ORDER BY conv_key LIMIT 1000 FOR UPDATE",
                )
                .await?,
                &[],
            )
            .await?;
        let mut failed = 0;
        for row in &expired {
            let key_bytes: Vec<u8> = row.try_get("conv_key")?;
            let task_id = text(row, "running_task")?;
            if fail_abandoned_task(&tx, &task_id).await? {
                failed += 1;
            }
            tx.execute(
                &tx.prepare_cached(
                    "UPDATE colloquy_conversations SET running_task = NULL, lease_expires = NULL, \
                     lease_holder = NULL, token = token + 1 WHERE conv_key = $1",
                )
                .await?,
                &[&key_bytes],
            )
            .await?;
        }
        tx.commit().await?;
        metrics::counter!("colloquy_leases_expired_total").increment(failed as u64);
        Ok(failed)
    }

    /// Fails one conversation's task if its holder's lease expired (a read found it running).
    async fn fail_if_abandoned(&self, key: &ConversationKey, task_id: &str) -> Result<(), Failure> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let abandoned = tx
            .query_opt(
                &tx.prepare_cached(
                    "SELECT 1 FROM colloquy_conversations WHERE conv_key = $1 \
                 AND running_task = $2 AND lease_expires <= now() FOR UPDATE",
                )
                .await?,
                &[&key.as_bytes().as_slice(), &task_id.as_bytes()],
            )
            .await?;
        if abandoned.is_some() {
            if fail_abandoned_task(&tx, task_id).await? {
                metrics::counter!("colloquy_leases_expired_total").increment(1);
            }
            release(&tx, key).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn conversation(
        &self,
        key: &ConversationKey,
    ) -> Result<Option<ConversationMeta>, Failure> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!("SELECT {META_COLUMNS} FROM colloquy_conversations WHERE conv_key = $1"),
                &[&key.as_bytes().as_slice()],
            )
            .await?;
        row.as_ref().map(meta_of).transpose()
    }

    pub(super) async fn conversation_page(
        &self,
        key: &ConversationKey,
        from: &MessagesFrom,
        max_bytes: usize,
    ) -> Result<Option<ConversationPage>, Failure> {
        let Some(meta) = self.conversation(key).await? else {
            return Ok(None);
        };
        let mut next = match from {
            MessagesFrom::Latest(n) => meta.next_seq.saturating_sub(*n as u64),
            MessagesFrom::PageToken(token) if token.is_empty() => 0,
            MessagesFrom::PageToken(token) => page_token::message_seq(token)?,
        } as i64;
        let client = self.client().await?;
        let mut budget = ResponseBudget::new(max_bytes);
        let mut messages = Vec::new();
        let mut next_page_token = String::new();
        'pages: loop {
            let rows = client
                .query(
                    &client.prepare_cached("SELECT seq, body FROM colloquy_messages WHERE conv_key = $1 AND seq >= $2 \
                     ORDER BY seq LIMIT $3").await?,
                    &[&key.as_bytes().as_slice(), &next, &MESSAGE_BATCH],
                )
                .await?;
            for row in &rows {
                let seq: i64 = row.try_get("seq")?;
                let body: String = row.try_get("body")?;
                if !budget.take(body.len()) {
                    next_page_token = page_token::for_message(seq as u64);
                    break 'pages;
                }
                messages.push(decode(&body)?);
                next = seq + 1;
            }
            if (rows.len() as i64) < MESSAGE_BATCH {
                break;
            }
        }
        Ok(Some(ConversationPage {
            meta,
            messages,
            next_page_token,
        }))
    }

    /// The principal's task with its whole history. A task found running whose holder's lease
    /// expired is failed first.
    pub(super) async fn task(
        &self,
        principal: &str,
        task_id: &str,
    ) -> Result<Option<Task>, Failure> {
        let mut row = self.owned_task(principal, task_id).await?;
        if let Some(found) = row
            .as_ref()
            .filter(|r| !r.stored.task.status.state.ends_turn())
        {
            self.fail_if_abandoned(&found.key, task_id).await?;
            row = self.owned_task(principal, task_id).await?;
        }
        let Some(row) = row else {
            return Ok(None);
        };
        let client = self.client().await?;
        let mut task = row.stored.task;
        task.history = messages_at(&client, &row.key, &row.stored.history_seqs)
            .await?
            .0;
        Ok(Some(task))
    }

    pub(super) async fn stream_outline(
        &self,
        principal: &str,
        task_id: &str,
    ) -> Result<Option<StreamOutline>, Failure> {
        let row = self.owned_task(principal, task_id).await?;
        Ok(row.and_then(|row| row.stored.stream))
    }

    async fn owned_task(&self, principal: &str, task_id: &str) -> Result<Option<TaskRow>, Failure> {
        let client = self.client().await?;
        Ok(load_task(&client, task_id, false)
            .await?
            .filter(|r| r.principal == principal))
    }

    pub(super) async fn list_tasks(
        &self,
        principal: &str,
        query: &TaskQuery,
    ) -> Result<Page<Task>, Failure> {
        let scope = match &query.context_id {
            Some(context_id) => (
                "conv_key",
                ConversationKey::new(principal, context_id)
                    .as_bytes()
                    .to_vec(),
            ),
            None => (
                "principal_key",
                PrincipalKey::new(principal).as_bytes().to_vec(),
            ),
        };
        let after = parse_page_token(query.page_token.as_deref())?;
        let (after_ms, after_id) = match &after {
            Some((ms, id)) => (Some(*ms), Some(id.clone())),
            None => (None, None),
        };
        let state = query.state.map(|s| s.code() as i16);
        let status_after = query.status_after.map(|t| t.timestamp_millis().max(0));
        let filters =
            "($2::SMALLINT IS NULL OR t.state = $2) AND ($3::BIGINT IS NULL OR t.status_ms > $3)";
        let client = self.client().await?;
        let counts = scoped_tasks(scope.0, "count(*) AS n", filters, "");
        let total: i64 = client
            .query_one(
                &format!("SELECT COALESCE(sum(n), 0)::BIGINT FROM ({counts}) AS counts"),
                &[&scope.1, &state, &status_after],
            )
            .await?
            .get(0);
        let limit = query.page_size.min(i64::MAX as usize - 1) as i64 + 1;
        let page = scoped_tasks(
            scope.0,
            "t.conv_key, t.principal, t.record, t.status_ms, t.task_id",
            &format!(
                "{filters} AND ($4::BIGINT IS NULL OR t.status_ms < $4 \
                     OR (t.status_ms = $4 AND t.task_id > $5))"
            ),
            "ORDER BY t.status_ms DESC, t.task_id LIMIT $6",
        );
        let rows = client
            .query(
                &format!(
                    "SELECT conv_key, principal, record, status_ms, task_id FROM ({page}) AS page \
                     ORDER BY status_ms DESC, task_id LIMIT $6"
                ),
                &[
                    &scope.1,
                    &state,
                    &status_after,
                    &after_ms,
                    &after_id,
                    &limit,
                ],
            )
            .await?;
        let mut next_page_token = String::new();
        let mut listed: Vec<(TaskRow, String)> = Vec::with_capacity(rows.len());
        for (i, row) in rows.iter().enumerate() {
            let status_ms: i64 = row.try_get("status_ms")?;
            let task_id: Vec<u8> = row.try_get("task_id")?;
            let resume = resume_token(status_ms, &task_id);
            if i == query.page_size {
                next_page_token = listed
                    .last()
                    .map(|(_, token)| token.clone())
                    .unwrap_or_default();
                break;
            }
            listed.push((task_row(row)?, resume));
        }
        let mut page = BudgetedPage::new(query.max_bytes, next_page_token);
        for (row, resume) in &listed {
            let (task, bytes) = listed_task(&client, row, query).await?;
            if !page.offer(task, bytes, resume) {
                break;
            }
        }
        Ok(page.finish(total as usize))
    }

    pub(super) async fn list_conversations(
        &self,
        principal: &str,
        page_size: usize,
        page_token: Option<&str>,
    ) -> Result<Page<ConversationMeta>, Failure> {
        let principal_key = PrincipalKey::new(principal).as_bytes().to_vec();
        let (after_ms, after_key) = match parse_page_token(page_token)? {
            Some((ms, key)) => (Some(ms), Some(key)),
            None => (None, None),
        };
        let client = self.client().await?;
        let total: i64 = client
            .query_one(
                &client
                    .prepare_cached(
                        "SELECT count(*) FROM colloquy_conversations WHERE principal_key = $1",
                    )
                    .await?,
                &[&principal_key],
            )
            .await?
            .get(0);
        let limit = page_size.min(i64::MAX as usize - 1) as i64 + 1;
        let rows = client
            .query(
                &format!(
                    "SELECT {META_COLUMNS}, updated_ms, conv_key FROM colloquy_conversations \
                     WHERE principal_key = $1 AND ($2::BIGINT IS NULL OR updated_ms < $2 \
                         OR (updated_ms = $2 AND conv_key > $3)) \
                     ORDER BY updated_ms DESC, conv_key LIMIT $4"
                ),
                &[&principal_key, &after_ms, &after_key, &limit],
            )
            .await?;
        let mut items = Vec::with_capacity(rows.len());
        let mut next_page_token = String::new();
        let mut last_token = String::new();
        for (i, row) in rows.iter().enumerate() {
            if i == page_size {
                next_page_token = last_token;
                break;
            }
            let updated_ms: i64 = row.try_get("updated_ms")?;
            let conv_key: Vec<u8> = row.try_get("conv_key")?;
            last_token = resume_token(updated_ms, &conv_key);
            items.push(meta_of(row)?);
        }
        Ok(Page {
            items,
            next_page_token,
            total_size: total as usize,
        })
    }

    pub(super) async fn delete_conversation(&self, key: &ConversationKey) -> Result<bool, Failure> {
        let key_bytes = key.as_bytes().as_slice();
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let Some(row) = tx
            .query_opt(
                &tx.prepare_cached(
                    "SELECT context_id, running_task, lease_expires <= now() AS expired \
                 FROM colloquy_conversations WHERE conv_key = $1 FOR UPDATE",
                )
                .await?,
                &[&key_bytes],
            )
            .await?
        else {
            return Ok(false);
        };
        let running = opt_text(&row, "running_task")?;
        let expired: Option<bool> = row.try_get("expired")?;
        if let Some(task_id) = running.filter(|_| expired != Some(true)) {
            return Err(StoreError::Busy {
                context_id: text(&row, "context_id")?,
                task_id,
            }
            .into());
        }
        let tasks = scoped_tasks("conv_key", "t.task_id", "TRUE", "");
        for (table, which) in [
            ("colloquy_push_configs", String::new()),
            ("colloquy_messages", String::new()),
            (
                "colloquy_tasks",
                format!(" AND task_id IN (SELECT task_id FROM ({tasks}) AS tasks)"),
            ),
            ("colloquy_conversations", String::new()),
        ] {
            tx.execute(
                &format!("DELETE FROM {table} WHERE conv_key = $1{which}"),
                &[&key_bytes],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// The holder of the live lease running the principal's task, unless it is this node.
    pub(super) async fn running_holder(
        &self,
        principal: &str,
        task_id: &str,
    ) -> Result<Option<String>, Failure> {
        let Some(task) = self.owned_task(principal, task_id).await? else {
            return Ok(None);
        };
        let client = self.client().await?;
        let row = client
            .query_opt(
                &client
                    .prepare_cached(
                        "SELECT lease_holder FROM colloquy_conversations WHERE conv_key = $1 \
                 AND running_task = $2 AND lease_expires > now()",
                    )
                    .await?,
                &[&task.key.as_bytes().as_slice(), &task_id.as_bytes()],
            )
            .await?;
        let holder: Option<String> = match row {
            Some(row) => row.try_get("lease_holder")?,
            None => None,
        };
        let me = self.holder.read().clone();
        Ok(holder.filter(|holder| *holder != me))
    }

    pub(super) async fn probe(&self) -> Result<(), Failure> {
        let client = self.client().await?;
        client
            .execute(
                &client
                    .prepare_cached(
                        "INSERT INTO colloquy_probe (id, at) VALUES (1, now()) \
                 ON CONFLICT (id) DO UPDATE SET at = excluded.at",
                    )
                    .await?,
                &[],
            )
            .await?;
        Ok(())
    }

    /// The database's size (PostgreSQL's own function).
    pub(super) async fn size_on_disk(&self) -> Result<u64, Failure> {
        let client = self.client().await?;
        let row = client
            .query_one(
                &client
                    .prepare_cached("SELECT pg_database_size(current_database())")
                    .await?,
                &[],
            )
            .await?;
        Ok(row.try_get::<_, i64>(0)?.max(0) as u64)
    }
}

/// What taking a conversation returned.
pub(super) struct Taken {
    pub(super) turns: u64,
    /// The conversation's next sequence number after the caller's message.
    pub(super) next_seq: u64,
    pub(super) token: u64,
    pub(super) agent_state: Option<serde_json::Value>,
}

impl Taken {
    /// What a row of `take_sql!`'s `RETURNING` says, if the row took the conversation.
    pub(super) fn of(row: &Row) -> Result<Option<Taken>, Failure> {
        let Some(turns) = row.try_get::<_, Option<i64>>("turns")? else {
            return Ok(None);
        };
        let agent_state: Option<String> = row.try_get("agent_state")?;
        Ok(Some(Taken {
            turns: turns as u64,
            next_seq: row.try_get::<_, i64>("next_seq")? as u64,
            token: row.try_get::<_, i64>("token")? as u64,
            agent_state: agent_state.as_deref().map(decode).transpose()?,
        }))
    }
}

/// The values of `take_sql!`'s `$1`-`$10` for a turn.
pub(super) struct TakeValues {
    pub(super) key: Vec<u8>,
    pub(super) principal_key: Vec<u8>,
    pub(super) principal: Vec<u8>,
    pub(super) context_id: Vec<u8>,
    pub(super) now: chrono::DateTime<chrono::Utc>,
    pub(super) now_ms: i64,
    pub(super) task_id: Vec<u8>,
    pub(super) lease_secs: f64,
    pub(super) holder: String,
    /// The take's token ([`crate::store::new_token`]).
    pub(super) token: i64,
}

impl TakeValues {
    pub(super) fn of(ops: &Ops, turn: &BeginTurn, key: &ConversationKey) -> TakeValues {
        let now = crate::model::now();
        TakeValues {
            key: key.as_bytes().to_vec(),
            principal_key: turn.principal_key.as_bytes().to_vec(),
            principal: turn.principal.as_bytes().to_vec(),
            context_id: turn.context_id.as_bytes().to_vec(),
            now,
            now_ms: now.timestamp_millis(),
            task_id: turn.task_id.as_bytes().to_vec(),
            lease_secs: ops.lease_secs,
            holder: ops.holder.read().clone(),
            token: crate::store::new_token() as i64,
        }
    }

    pub(super) fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        vec![
            &self.key,
            &self.principal_key,
            &self.principal,
            &self.context_id,
            &self.now,
            &self.now_ms,
            &self.task_id,
            &self.lease_secs,
            &self.holder,
            &self.token,
        ]
    }
}

fn stale(lease: &Lease) -> StoreError {
    StoreError::StaleToken {
        task_id: lease.task_id.clone(),
    }
}

/// Locks the conversation: its row as it was before this turn, if it is stored.
async fn lock_conversation(
    tx: &impl GenericClient,
    key: &ConversationKey,
) -> Result<Option<Row>, Failure> {
    let statement = tx.prepare_cached(LOCK_CONVERSATION_SQL).await?;
    Ok(tx
        .query_opt(&statement, &[&key.as_bytes().as_slice()])
        .await?)
}

/// The conversation's latest `limit` messages, oldest first, for the agent's history: none for
/// a conversation never stored. Read before this turn's lease moves `next_seq` on.
async fn history_window(
    tx: &impl GenericClient,
    key: &ConversationKey,
    limit: usize,
) -> Result<Vec<Message>, Failure> {
    let limit = limit.min(i64::MAX as usize) as i64;
    let rows = tx
        .query(
            &tx.prepare_cached(HISTORY_WINDOW_SQL).await?,
            &[&key.as_bytes().as_slice(), &limit],
        )
        .await?;
    rows.iter()
        .map(|row| decode(&row.try_get::<_, String>("body")?))
        .collect()
}

/// Checks no live lease held the conversation (`current`, as locked), failing the task of an
/// expired one.
async fn free_for(
    tx: &impl GenericClient,
    turn: &BeginTurn,
    current: Option<Row>,
) -> Result<(), Failure> {
    let Some(row) = current else {
        return Ok(());
    };
    if let Some(running) = opt_text(&row, "running_task")? {
        let expired: Option<bool> = row.try_get("expired")?;
        if expired != Some(true) {
            return Err(StoreError::Busy {
                context_id: turn.context_id.clone(),
                task_id: running,
            }
            .into());
        }
        if fail_abandoned_task(tx, &running).await? {
            metrics::counter!("colloquy_leases_expired_total").increment(1);
        }
    }
    Ok(())
}

/// The stored task a continuing turn answers, locked (None for a new task).
async fn continued_task(
    tx: &impl GenericClient,
    turn: &BeginTurn,
) -> Result<Option<TaskRow>, Failure> {
    if !turn.continuing {
        return Ok(None);
    }
    load_task(tx, &turn.task_id, true).await
}

/// Appends `message` to the conversation at `seq`.
async fn insert_message(
    tx: &impl GenericClient,
    key: &ConversationKey,
    seq: u64,
    message: &Message,
) -> Result<(), Failure> {
    let sql = "INSERT INTO colloquy_messages (conv_key, seq, body) VALUES ($1, $2, $3)";
    tx.execute(
        &tx.prepare_cached(sql).await?,
        &[&key.as_bytes().as_slice(), &(seq as i64), &encode(message)],
    )
    .await?;
    Ok(())
}

/// The task the turn runs: the principal's task waiting for input in this conversation
/// (`continued`, as loaded), or a new one.
fn task_to_run(
    turn: &BeginTurn,
    key: &ConversationKey,
    continued: Option<TaskRow>,
) -> Result<StoredTask, Failure> {
    if !turn.continuing {
        return Ok(StoredTask {
            task: turn.new_task(),
            stream: None,
            history_seqs: Vec::new(),
        });
    }
    let row = continued
        .filter(|r| r.principal == turn.principal && r.key == *key)
        .ok_or_else(|| StoreError::TaskNotFound(turn.task_id.clone()))?;
    let state = row.stored.task.status.state;
    if state.is_terminal() {
        return Err(StoreError::TaskTerminal {
            task_id: turn.task_id.clone(),
            state,
        }
        .into());
    }
    Ok(row.stored)
}

/// The refusal of a turn whose conversation another turn took first.
async fn busy(
    tx: &impl GenericClient,
    turn: &BeginTurn,
    key: &ConversationKey,
) -> Result<StoreError, Failure> {
    let running = tx
        .query_opt(
            &tx.prepare_cached(
                "SELECT running_task FROM colloquy_conversations WHERE conv_key = $1",
            )
            .await?,
            &[&key.as_bytes().as_slice()],
        )
        .await?
        .map(|row| opt_text(&row, "running_task"))
        .transpose()?
        .flatten()
        .unwrap_or_default();
    Ok(StoreError::Busy {
        context_id: turn.context_id.clone(),
        task_id: running,
    })
}

/// Locks the conversation if the lease still holds it; returns its next sequence number.
async fn held(tx: &impl GenericClient, lease: &Lease) -> Result<i64, Failure> {
    let row = tx
        .query_opt(
            &tx.prepare_cached(HELD_SQL).await?,
            &[
                &lease.key.as_bytes().as_slice(),
                &(lease.token as i64),
                &lease.task_id.as_bytes(),
            ],
        )
        .await?
        .ok_or_else(|| stale(lease))?;
    Ok(row.try_get("next_seq")?)
}

/// Frees a conversation whose holder's lease expired, moving the token on.
async fn release(tx: &impl GenericClient, key: &ConversationKey) -> Result<(), Failure> {
    tx.execute(
        &tx.prepare_cached(
            "UPDATE colloquy_conversations SET running_task = NULL, lease_expires = NULL, \
             lease_holder = NULL, token = token + 1 WHERE conv_key = $1",
        )
        .await?,
        &[&key.as_bytes().as_slice()],
    )
    .await?;
    Ok(())
}

pub(super) async fn load_task(
    client: &impl GenericClient,
    task_id: &str,
    lock: bool,
) -> Result<Option<TaskRow>, Failure> {
    let sql = if lock { LOCK_TASK_SQL } else { LOAD_TASK_SQL };
    let row = client
        .query_opt(&client.prepare_cached(sql).await?, &[&task_id.as_bytes()])
        .await?;
    row.as_ref().map(task_row).transpose()
}

/// Writes the task's row, with a notification for each of its push configs (`trace`: the
/// turn's, if any).
pub(super) async fn put_task(
    client: &impl GenericClient,
    key: &ConversationKey,
    principal: &str,
    stored: &StoredTask,
    trace: Option<&str>,
) -> Result<(), Failure> {
    let mut record = stored.clone();
    record.task.history.clear();
    let status = &record.task.status;
    let upsert = async {
        // `has_push` tells a turn's end whether it must build notifications (`turn.rs`).
        let sql = "INSERT INTO colloquy_tasks (conv_key, task_id, principal_key, principal, \
                   state, status_ms, record, has_push) VALUES ($1, $2, $3, $4, $5, $6, $7, \
                   EXISTS (SELECT 1 FROM colloquy_push_configs \
                       WHERE conv_key = $1 AND task_id = $2)) \
                   ON CONFLICT (conv_key, task_id) DO UPDATE SET state = excluded.state, \
                   status_ms = excluded.status_ms, record = excluded.record, \
                   has_push = excluded.has_push";
        let statement = client.prepare_cached(sql).await?;
        client
            .execute(
                &statement,
                &[
                    &key.as_bytes().as_slice(),
                    &record.task.id.as_bytes(),
                    &PrincipalKey::new(principal).as_bytes().as_slice(),
                    &principal.as_bytes(),
                    &(status.state.code() as i16),
                    &status.timestamp.timestamp_millis().max(0),
                    &encode(&record),
                ],
            )
            .await?;
        Ok::<(), Failure>(())
    };
    // The task's push configs are read as the row is written, in the same round trip.
    futures_util::try_join!(
        upsert,
        super::push::enqueue(client, key, &record.task, trace)
    )?;
    Ok(())
}

/// A task left running by a node whose lease expired: it will never finish, so it failed.
/// Returns whether it was still running.
async fn fail_abandoned_task(tx: &impl GenericClient, task_id: &str) -> Result<bool, Failure> {
    let Some(mut row) = load_task(tx, task_id, true).await? else {
        return Ok(false);
    };
    if row.stored.task.status.state.ends_turn() {
        return Ok(false);
    }
    row.stored.task.status = failed_status(&row.stored.task, ABANDONED_TASK_TEXT);
    put_task(tx, &row.key, &row.principal, &row.stored, None).await?;
    Ok(true)
}

/// The messages at `seqs`, in that order, and their stored size in bytes.
async fn messages_at(
    client: &impl GenericClient,
    key: &ConversationKey,
    seqs: &[u64],
) -> Result<(Vec<Message>, usize), Failure> {
    if seqs.is_empty() {
        return Ok((Vec::new(), 0));
    }
    let wanted: Vec<i64> = seqs.iter().map(|s| *s as i64).collect();
    let rows = client
        .query(
            &client
                .prepare_cached(
                    "SELECT seq, body FROM colloquy_messages WHERE conv_key = $1 AND seq = ANY($2)",
                )
                .await?,
            &[&key.as_bytes().as_slice(), &wanted],
        )
        .await?;
    let mut bodies = HashMap::with_capacity(rows.len());
    for row in &rows {
        bodies.insert(
            row.try_get::<_, i64>("seq")?,
            row.try_get::<_, String>("body")?,
        );
    }
    let mut messages = Vec::with_capacity(seqs.len());
    let mut bytes = 0;
    for seq in &wanted {
        if let Some(body) = bodies.get(seq) {
            bytes += body.len();
            messages.push(decode(body)?);
        }
    }
    Ok((messages, bytes))
}

/// A listed task as the view shows it, and its estimated size (as the embedded store counts).
async fn listed_task(
    client: &impl GenericClient,
    row: &TaskRow,
    query: &TaskQuery,
) -> Result<(Task, usize), Failure> {
    let shown = shown_history(&query.view, &row.stored.history_seqs);
    let (history, history_bytes) = messages_at(client, &row.key, shown).await?;
    Ok(as_listed(
        &query.view,
        row.stored.task.clone(),
        history,
        row.bytes + history_bytes,
    ))
}
