//! A turn's start and end in one round trip each, on the usual path: `BEGIN`, one statement
//! whose data-modifying CTEs write what the turn writes, and `COMMIT`, sent together
//! (pipelined). The checks the general path (`ops.rs`) makes in Rust between its round trips
//! are the statement's own conditions, so a refused step writes nothing. What the usual path
//! does not cover goes the general way: a continued task or a send that registers a push
//! config (start), an expired lease to take over (start), a task with push configs (end: its
//! notifications are built in Rust).
//!
//! One statement reads from one snapshot, taken before it waits for a row lock; each statement
//! says how it stays right when the row changed meanwhile. Locks are taken conversation row
//! first, as everywhere else.

use super::ops::{StoredTask, TakeValues, Taken, decode, encode, take_sql};
use super::{Failure, Ops, failover};
use crate::model::{Message, Task, TaskState, TaskStatus};
use crate::store::{BeginTurn, ConversationKey, FinishTurn, Lease, StoreError, TurnBegun};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

/// Takes a free conversation (no holder at all: an expired lease goes the general way, which
/// fails its task), stores the caller's message at the next sequence number and the new task
/// with it, and returns the history window as it was before. The window comes from the
/// statement's snapshot: `seen_seq` (the conversation's `next_seq` in it) tells whether a turn
/// ended between that snapshot and the take, and the window is then read again.
const START_SQL: &str = concat!(
    "WITH seen AS (\
         SELECT next_seq, running_task, lease_expires <= now() AS expired \
         FROM colloquy_conversations WHERE conv_key = $1), \
     taken AS (",
    take_sql!("colloquy_conversations.running_task IS NULL"),
    "), \
     message AS (INSERT INTO colloquy_messages (conv_key, seq, body) \
         SELECT $1, next_seq - 1, $10 FROM taken), \
     task AS (INSERT INTO colloquy_tasks (conv_key, task_id, principal_key, principal, state, \
             status_ms, record, has_push) \
         SELECT $1, $7, $2, $3, $11, $12, $13 || (next_seq - 1)::TEXT || $14, FALSE FROM taken) \
     SELECT taken.turns, taken.next_seq, taken.token, taken.agent_state, \
         seen.next_seq AS seen_seq, seen.running_task, seen.expired, \
         ARRAY(SELECT body FROM colloquy_messages \
             WHERE conv_key = $1 AND seq >= taken.next_seq - 1 - $15 ORDER BY seq) AS recent \
     FROM (SELECT 1) AS one LEFT JOIN taken ON TRUE LEFT JOIN seen ON TRUE"
);

/// The `$3` messages before sequence number `$2`, oldest first.
const WINDOW_BEFORE_SQL: &str = "SELECT body FROM colloquy_messages \
     WHERE conv_key = $1 AND seq >= $2::BIGINT - $3::BIGINT AND seq < $2 ORDER BY seq";

/// Stores the reply, the task's final record and releases the conversation, if the lease still
/// holds it at the expected sequence number and the task has no push configs; else nothing.
/// `has_push` is read twice: by `held` from the snapshot (the usual refusal), and by the task's
/// update from the row it locked, in case a config was added in between; then the statement
/// fails (a cast error), so that what `held` wrote goes too.
const END_SQL: &str = "WITH held AS (\
     UPDATE colloquy_conversations SET running_task = NULL, lease_expires = NULL, \
         lease_holder = NULL, next_seq = $4, updated_at = $5, updated_ms = $6, \
         agent_state = COALESCE($7, agent_state) \
     WHERE conv_key = $1 AND token = $2 AND running_task = $3 AND next_seq = $8 \
         AND NOT EXISTS (SELECT 1 FROM colloquy_tasks \
             WHERE conv_key = $1 AND task_id = $3 AND has_push) \
     RETURNING conv_key), \
 task AS (UPDATE colloquy_tasks SET state = $10, status_ms = $11, record = $12 \
     WHERE conv_key = $1 AND task_id = $3 AND NOT has_push AND EXISTS (SELECT 1 FROM held) \
     RETURNING task_id), \
 reply AS (INSERT INTO colloquy_messages (conv_key, seq, body) \
     SELECT conv_key, $8, $9::TEXT FROM held WHERE $9::TEXT IS NOT NULL) \
 SELECT CAST(CASE WHEN (SELECT count(*) FROM held) = (SELECT count(*) FROM task) \
     THEN (SELECT count(*) FROM task)::TEXT ELSE 'push config added' END AS BIGINT) AS ended";

/// The SQLSTATE of [`END_SQL`]'s refusal when a push config came between its reads.
const PUSH_CONFIG_ADDED: &str = "22P02";

/// What a node remembers of a turn it started, for its end: the task as stored and the
/// sequence number its reply takes.
#[derive(Debug, Clone)]
pub(super) struct StartedTurn {
    pub(super) stored: StoredTask,
    pub(super) reply_seq: u64,
}

/// The task record with its history's sequence numbers left open: the record is
/// `prefix ++ seq ++ "]}"` once the statement knows the caller's message's `seq`. `history_seqs`
/// is the record's last field (`…,"history_seqs":[]}`); None if it is not.
fn record_around_seq(stored: &StoredTask) -> Option<(String, &'static str)> {
    let mut open = stored.clone();
    open.history_seqs.clear();
    let record = encode(&open);
    let prefix = record.strip_suffix("\"history_seqs\":[]}")?;
    Some((format!("{prefix}\"history_seqs\":["), "]}"))
}

fn new_task(turn: &BeginTurn) -> StoredTask {
    let mut task = turn.new_task();
    task.status = TaskStatus::new(TaskState::Working, None);
    StoredTask {
        task,
        history_seqs: Vec::new(),
    }
}

impl Ops {
    /// Starts a new task's turn in one round trip; `None` when the general path must run (a
    /// lease to take over).
    pub(super) async fn start_in_one_trip(
        &self,
        turn: &BeginTurn,
    ) -> Result<Option<TurnBegun>, Failure> {
        let key = ConversationKey::new(&turn.principal, &turn.context_id);
        let mut stored = new_task(turn);
        let Some((record_prefix, record_suffix)) = record_around_seq(&stored) else {
            return Ok(None);
        };
        let limit = turn.history_limit.min(i64::MAX as usize) as i64;
        let status = &stored.task.status;
        let (message, state, status_ms) = (
            encode(&turn.message),
            status.state.code() as i16,
            status.timestamp.timestamp_millis().max(0),
        );
        let take = TakeValues::of(self, turn, &key);
        let mut params = take.params();
        params.extend::<[&(dyn ToSql + Sync); 6]>([
            &message,
            &state,
            &status_ms,
            &record_prefix,
            &record_suffix,
            &limit,
        ]);
        let client = self.client().await?;
        let row = match in_one_trip(&client, START_SQL, &params).await {
            Ok(row) => row,
            Err(e) => {
                // A lost connection leaves it unknown whether the commit was stored.
                if failover::connection_lost(&e) {
                    // The caller is told to retry: take back what may have been stored.
                    failover::undo_unanswered_start(self.pool.clone(), self.unanswered(turn, &key));
                }
                return Err(e.into());
            }
        };
        let Some(taken) = Taken::of(&row)? else {
            return busy_or_general(turn, &row);
        };
        let seq = taken.next_seq - 1;
        let seen_seq: Option<i64> = row.try_get("seen_seq")?;
        let recent = if seen_seq.unwrap_or(0) as u64 == seq {
            let bodies: Vec<String> = row.try_get("recent")?;
            bodies
                .iter()
                .map(|body| decode(body))
                .collect::<Result<_, _>>()?
        } else {
            // A turn ended after the snapshot: its messages are committed, read them now.
            window_before(&client, &key, seq, limit).await?
        };
        stored.history_seqs.push(seq);
        let mut task = stored.task.clone();
        task.history = vec![turn.message.clone()];
        Ok(Some(self.begun(turn, key, taken, stored, task, recent)))
    }

    /// A committed start: remembered for its end and counted.
    pub(super) fn begun(
        &self,
        turn: &BeginTurn,
        key: ConversationKey,
        taken: Taken,
        stored: StoredTask,
        task: Task,
        recent: Vec<Message>,
    ) -> TurnBegun {
        let started = StartedTurn {
            stored,
            reply_seq: taken.next_seq,
        };
        self.started.lock().insert((key, taken.token), started);
        metrics::counter!("colloquy_leases_taken_total").increment(1);
        TurnBegun {
            lease: Lease {
                key,
                task_id: turn.task_id.clone(),
                token: taken.token,
            },
            task,
            recent,
            turn: taken.turns,
            agent_state: taken.agent_state,
        }
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
        let status = &stored.task.status;
        let write_params: [&(dyn ToSql + Sync); 12] = [
            &key_bytes.as_slice(),
            &(lease.token as i64),
            &lease.task_id.as_bytes(),
            &(next_seq as i64),
            &now,
            &now.timestamp_millis(),
            &end.agent_state.as_ref().map(encode),
            &(reply_seq as i64),
            &end.reply.as_ref().map(encode),
            &(status.state.code() as i16),
            &status.timestamp.timestamp_millis().max(0),
            &encode(&stored),
        ];
        let ended = match in_one_trip(&client, END_SQL, &write_params).await {
            Ok(row) => row.try_get::<_, i64>("ended")?,
            Err(e) if e.code().is_some_and(|c| c.code() == PUSH_CONFIG_ADDED) => 0,
            Err(e) => return Err(e.into()),
        };
        // Not ended: the task has push configs (their notifications are built in Rust) or the
        // lease moved on; the general path tells which.
        Ok(ended == 1)
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

/// Runs `sql` in a transaction of its own in one round trip: `BEGIN`, the statement and
/// `COMMIT` leave together (each request goes out on its first poll, in order; the statement is
/// prepared first, once per connection, so it does not wait for its parse). The first error is
/// the outcome: a statement the database refused aborted the transaction, which `COMMIT` then
/// rolls back.
async fn in_one_trip(
    client: &deadpool_postgres::Object,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Row, tokio_postgres::Error> {
    let statement = client.prepare_cached(sql).await?;
    let (began, row, committed) = futures_util::join!(
        client.batch_execute("BEGIN"),
        client.query_one(&statement, params),
        client.batch_execute("COMMIT"),
    );
    began?;
    let row = row?;
    committed?;
    Ok(row)
}

/// A start refused: busy if a live lease holds the conversation (as the snapshot saw it), else
/// the general path.
fn busy_or_general(turn: &BeginTurn, row: &Row) -> Result<Option<TurnBegun>, Failure> {
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

/// The `limit` messages before `seq`, oldest first.
async fn window_before(
    client: &deadpool_postgres::Object,
    key: &ConversationKey,
    seq: u64,
    limit: i64,
) -> Result<Vec<Message>, Failure> {
    let statement = client.prepare_cached(WINDOW_BEFORE_SQL).await?;
    let rows = client
        .query(
            &statement,
            &[&key.as_bytes().as_slice(), &(seq as i64), &limit],
        )
        .await?;
    rows.iter()
        .map(|row| decode(&row.try_get::<_, String>("body")?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_around_its_seq_is_the_record_with_that_seq() {
        let mut stored = StoredTask {
            task: Task {
                id: "t\"1".into(),
                context_id: "c]}".into(),
                status: TaskStatus::new(TaskState::Working, None),
                artifacts: Vec::new(),
                history: Vec::new(),
                metadata: serde_json::json!({"history_seqs": [1]})
                    .as_object()
                    .cloned(),
            },
            history_seqs: Vec::new(),
        };
        let (prefix, suffix) = record_around_seq(&stored).expect("history_seqs is last");
        let read: StoredTask =
            serde_json::from_str(&format!("{prefix}7{suffix}")).expect("a record");
        stored.history_seqs.push(7);
        assert_eq!(read, stored);
    }
}
