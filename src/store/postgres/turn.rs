//! A turn's start and end in one round trip each, on the usual path: `BEGIN`, the row locks,
//! one statement whose data-modifying CTEs write what the turn writes, and `COMMIT`, sent
//! together (pipelined). The checks the general path (`ops.rs`) makes in Rust between its
//! round trips are the statement's own conditions, so a refused turn writes nothing and the
//! `COMMIT` commits only the locks. What the usual path does not cover goes the general way:
//! a continued task or a send that registers a push config (start), an expired lease to take
//! over (start), a task with push configs (end: its notifications are built in Rust).
//!
//! Locks are taken as everywhere else, conversation row first, each by its own statement: a
//! later statement's snapshot then sees what the lock waited for (one statement reads from
//! one snapshot taken before it waits).

use super::ops::{HELD_SQL, LOCK_CONVERSATION_SQL, StoredTask, decode, encode, stale};
use super::{Failure, Ops, failover};
use crate::model::{Message, Task, TaskState, TaskStatus};
use crate::store::{
    BeginTurn, ConversationKey, FinishTurn, Lease, PrincipalKey, StoreError, TurnBegun,
};
use tokio_postgres::Row;

/// Takes a free conversation (no holder at all: an expired lease goes the general way, which
/// fails its task), stores the caller's message at the next sequence number and the new task
/// with it, and returns the history window as it was before.
const START_SQL: &str = "WITH taken AS (\
     INSERT INTO colloquy_conversations (conv_key, principal_key, principal, context_id, \
         created_at, updated_at, updated_ms, turns, next_seq, token, running_task, \
         lease_expires, lease_holder, agent_state) \
     VALUES ($1, $2, $3, $4, $5, $5, $6, 1, 1, 1, $7, \
         now() + $8::FLOAT8 * INTERVAL '1 second', $9, NULL) \
     ON CONFLICT (conv_key) DO UPDATE SET \
         updated_at = excluded.updated_at, updated_ms = excluded.updated_ms, \
         turns = colloquy_conversations.turns + 1, \
         next_seq = colloquy_conversations.next_seq + 1, \
         token = colloquy_conversations.token + 1, \
         running_task = excluded.running_task, \
         lease_expires = excluded.lease_expires, \
         lease_holder = excluded.lease_holder \
     WHERE colloquy_conversations.running_task IS NULL \
     RETURNING turns, next_seq, token, agent_state), \
 message AS (INSERT INTO colloquy_messages (conv_key, seq, body) \
     SELECT $1, next_seq - 1, $10 FROM taken), \
 task AS (INSERT INTO colloquy_tasks (conv_key, task_id, principal_key, principal, state, \
         status_ms, record, has_push) \
     SELECT $1, $7, $2, $3, $11, $12, $13 || (next_seq - 1)::TEXT || $14, FALSE FROM taken) \
 SELECT turns, next_seq, token, agent_state, \
     ARRAY(SELECT body FROM colloquy_messages \
         WHERE conv_key = $1 AND seq >= taken.next_seq - 1 - $15 ORDER BY seq) AS recent \
 FROM taken";

/// Locks the turn's task row (after the conversation's): whether it has push configs.
const LOCK_TASK_PUSH_SQL: &str =
    "SELECT has_push FROM colloquy_tasks WHERE conv_key = $1 AND task_id = $2 FOR UPDATE";

/// Stores the reply, the task's final record and releases the conversation, if the lease still
/// holds it at the expected sequence number and the task has no push configs.
const END_SQL: &str = "WITH held AS (\
     UPDATE colloquy_conversations SET running_task = NULL, lease_expires = NULL, \
         lease_holder = NULL, next_seq = $4, updated_at = $5, updated_ms = $6, \
         agent_state = COALESCE($7, agent_state) \
     WHERE conv_key = $1 AND token = $2 AND running_task = $3 AND next_seq = $8 \
         AND NOT EXISTS (SELECT 1 FROM colloquy_tasks \
             WHERE conv_key = $1 AND task_id = $3 AND has_push) \
     RETURNING conv_key), \
 reply AS (INSERT INTO colloquy_messages (conv_key, seq, body) \
     SELECT conv_key, $8, $9::TEXT FROM held WHERE $9::TEXT IS NOT NULL), \
 task AS (UPDATE colloquy_tasks SET state = $10, status_ms = $11, record = $12 \
     WHERE conv_key = $1 AND task_id = $3 AND EXISTS (SELECT 1 FROM held)) \
 SELECT count(*) AS ended FROM held";

/// What a node remembers of a turn it started, for its end: the task as stored and the
/// sequence number its reply takes.
#[derive(Debug, Clone)]
pub(super) struct StartedTurn {
    pub(super) stored: StoredTask,
    pub(super) reply_seq: u64,
}

/// The task record with its history's sequence numbers left open: the record is
/// `prefix ++ seq ++ suffix` once the statement knows the caller's message's `seq`.
fn record_around_seq(stored: &StoredTask) -> (String, String) {
    let mut open = stored.clone();
    open.history_seqs.clear();
    let record = encode(&open);
    // `history_seqs` is the record's last field: `…,"history_seqs":[]}`.
    match record.strip_suffix("]}") {
        Some(prefix) => (prefix.to_owned(), "]}".to_owned()),
        None => (record, String::new()),
    }
}

fn new_task(turn: &BeginTurn) -> StoredTask {
    StoredTask {
        task: Task {
            id: turn.task_id.clone(),
            context_id: turn.context_id.clone(),
            status: TaskStatus::new(TaskState::Working, None),
            artifacts: Vec::new(),
            history: Vec::new(),
            metadata: None,
        },
        history_seqs: Vec::new(),
    }
}

impl Ops {
    /// Starts a new task's turn in one round trip; `None` when the general path must run (a
    /// lease to take over, or one taken between this node's lock and its write).
    pub(super) async fn start_in_one_trip(
        &self,
        turn: &BeginTurn,
    ) -> Result<Option<TurnBegun>, Failure> {
        let key = ConversationKey::new(&turn.principal, &turn.context_id);
        let key_bytes = key.as_bytes();
        let principal_key = PrincipalKey::new(&turn.principal);
        let mut stored = new_task(turn);
        let (record_prefix, record_suffix) = record_around_seq(&stored);
        let now = crate::model::now();
        let holder = self.holder.read().clone();
        let limit = turn.history_limit.min(i64::MAX as usize) as i64;
        let status = &stored.task.status;
        let client = self.client().await?;
        // Prepared (once per connection) before anything is sent: a batch's statements must
        // leave in order.
        let (lock, start) = futures_util::try_join!(
            client.prepare_cached(LOCK_CONVERSATION_SQL),
            client.prepare_cached(START_SQL),
        )?;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 15] = [
            &key_bytes.as_slice(),
            &principal_key.as_bytes().as_slice(),
            &turn.principal.as_bytes(),
            &turn.context_id.as_bytes(),
            &now,
            &now.timestamp_millis(),
            &turn.task_id.as_bytes(),
            &self.lease_secs,
            &holder,
            &encode(&turn.message),
            &(status.state.code() as i16),
            &status.timestamp.timestamp_millis().max(0),
            &record_prefix,
            &record_suffix,
            &limit,
        ];
        let key_param: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&key_bytes.as_slice()];
        // Each request goes out on its first poll, so all four leave together and in order.
        let (began, locked, started, committed) = futures_util::join!(
            client.batch_execute("BEGIN"),
            client.query_opt(&lock, &key_param),
            client.query_opt(&start, &params),
            client.batch_execute("COMMIT"),
        );
        let outcome = (|| {
            began?;
            let current = locked?;
            let started = started?;
            committed?;
            Ok::<_, tokio_postgres::Error>((current, started))
        })();
        // The first error tells: a statement the database refused aborted the transaction, so
        // nothing was stored; a lost connection leaves it unknown whether the commit was.
        let (current, started) = match outcome {
            Ok(rows) => rows,
            Err(e) => {
                if failover::connection_lost(&e) {
                    // The caller is told to retry: take back what may have been stored.
                    failover::undo_unanswered_start(self.pool.clone(), self.unanswered(turn, &key));
                }
                return Err(e.into());
            }
        };
        let Some(row) = started else {
            return busy_or_general(turn, current.as_ref());
        };
        let taken = Taken::of(&row)?;
        let seq = taken.next_seq - 1;
        stored.history_seqs.push(seq);
        self.remember(&key, taken.token, &stored, taken.next_seq);
        metrics::counter!("colloquy_leases_taken_total").increment(1);
        let mut task = stored.task;
        task.history = vec![turn.message.clone()];
        Ok(Some(TurnBegun {
            lease: Lease {
                key,
                task_id: turn.task_id.clone(),
                token: taken.token,
            },
            task,
            recent: taken.recent,
            turn: taken.turns,
            agent_state: taken.agent_state,
        }))
    }

    /// Ends a turn this node started in one round trip; false when the general path must run
    /// (the task has push configs, or the node does not remember the turn).
    pub(super) async fn end_in_one_trip(&self, end: &FinishTurn) -> Result<bool, Failure> {
        let lease = &end.lease;
        let Some(StartedTurn {
            mut stored,
            reply_seq,
        }) = self.started.lock().remove(&(lease.key, lease.token))
        else {
            return Ok(false);
        };
        let next_seq = match end.reply {
            Some(_) => {
                stored.history_seqs.push(reply_seq);
                reply_seq + 1
            }
            None => reply_seq,
        };
        stored.task.status = end.status.clone();
        stored.task.artifacts = end.artifacts.clone();
        let key_bytes = lease.key.as_bytes();
        let now = crate::model::now();
        let client = self.client().await?;
        let (held, lock_task, write) = futures_util::try_join!(
            client.prepare_cached(HELD_SQL),
            client.prepare_cached(LOCK_TASK_PUSH_SQL),
            client.prepare_cached(END_SQL),
        )?;
        let key = key_bytes.as_slice();
        let (token, task_id) = (lease.token as i64, lease.task_id.as_bytes());
        let status = &stored.task.status;
        let (next_seq, reply_seq) = (next_seq as i64, reply_seq as i64);
        let agent_state = end.agent_state.as_ref().map(encode);
        let reply = end.reply.as_ref().map(encode);
        let write_params: [&(dyn tokio_postgres::types::ToSql + Sync); 12] = [
            &key,
            &token,
            &task_id,
            &next_seq,
            &now,
            &now.timestamp_millis(),
            &agent_state,
            &reply_seq,
            &reply,
            &(status.state.code() as i16),
            &status.timestamp.timestamp_millis().max(0),
            &encode(&stored),
        ];
        let held_params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&key, &token, &task_id];
        let task_params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&key, &task_id];
        let (began, held, task, ended, committed) = futures_util::join!(
            client.batch_execute("BEGIN"),
            client.query_opt(&held, &held_params),
            client.query_opt(&lock_task, &task_params),
            client.query_one(&write, &write_params),
            client.batch_execute("COMMIT"),
        );
        began?;
        let held = held?;
        task?;
        let ended: i64 = ended?.try_get("ended")?;
        committed?;
        if ended == 1 {
            return Ok(true);
        }
        if held.is_none() {
            return Err(stale(lease).into());
        }
        // The task has push configs (their notifications are built in Rust), or the reply's
        // place moved: the general path decides.
        Ok(false)
    }

    /// Remembers a started turn for its end.
    pub(super) fn remember(
        &self,
        key: &ConversationKey,
        token: u64,
        stored: &StoredTask,
        reply_seq: u64,
    ) {
        self.started.lock().insert(
            (*key, token),
            StartedTurn {
                stored: stored.clone(),
                reply_seq,
            },
        );
    }

    fn unanswered(&self, turn: &BeginTurn, key: &ConversationKey) -> failover::UnansweredStart {
        failover::UnansweredStart {
            key: *key,
            principal: turn.principal.clone(),
            task_id: turn.task_id.clone(),
            token: None,
            before: None,
        }
    }
}

/// What the start's statement returned.
struct Taken {
    turns: u64,
    next_seq: u64,
    token: u64,
    agent_state: Option<serde_json::Value>,
    recent: Vec<Message>,
}

impl Taken {
    fn of(row: &Row) -> Result<Taken, Failure> {
        let agent_state: Option<String> = row.try_get("agent_state")?;
        let recent: Vec<String> = row.try_get("recent")?;
        Ok(Taken {
            turns: row.try_get::<_, i64>("turns")? as u64,
            next_seq: row.try_get::<_, i64>("next_seq")? as u64,
            token: row.try_get::<_, i64>("token")? as u64,
            agent_state: agent_state.as_deref().map(decode).transpose()?,
            recent: recent
                .iter()
                .map(|body| decode(body))
                .collect::<Result<_, _>>()?,
        })
    }
}

/// A start refused: busy if a live lease holds the conversation, else the general path.
fn busy_or_general(turn: &BeginTurn, current: Option<&Row>) -> Result<Option<TurnBegun>, Failure> {
    let Some(row) = current else {
        return Ok(None);
    };
    let running: Option<Vec<u8>> = row.try_get("running_task")?;
    let expired: Option<bool> = row.try_get("expired")?;
    match running {
        Some(task) if expired != Some(true) => Err(StoreError::Busy {
            context_id: turn.context_id.clone(),
            task_id: String::from_utf8_lossy(&task).into_owned(),
        }
        .into()),
        _ => Ok(None),
    }
}
