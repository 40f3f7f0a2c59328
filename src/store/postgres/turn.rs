//! A turn's start and end in one round trip each, on the usual path: one statement whose
//! data-modifying CTEs write what the turn writes, committed on its own, with the starts and
//! the ends waiting beside it (`group.rs`). The checks the general path (`ops.rs`) makes in
//! Rust between its round trips are the statement's own conditions, so a refused step writes
//! nothing. What the usual path
//! does not cover goes the general way: a continued task or a send that registers a push
//! config (start), an expired lease to take over (start), a task with push configs (end: its
//! notifications are built in Rust).
//!
//! One statement reads from one snapshot, taken before it waits for a row lock; each statement
//! says how it stays right when the row changed meanwhile. Locks are taken conversation row
//! first, as everywhere else.

use super::group::{Column, Step, column};
use super::ops::{StoredTask, TakeValues, Taken, decode, encode, take_sql};
use super::{Failure, Ops, failover};
use crate::model::{Message, Task, TaskState, TaskStatus};
use crate::store::{
    BeginTurn, ConversationKey, ConversationMark, FinishTurn, Lease, StoreError, TurnBegun,
};
use crate::telemetry::kept;
use tokio_postgres::Row;

/// The starts' part of [`GROUP_SQL`] (parameters 1 to 16, [`StartStep`]'s columns). Takes each
/// free conversation of the group (no holder at all: an expired lease goes the general way,
/// which fails its task), stores the caller's message at the next sequence number and the new
/// task with it. Rows are taken in key order, as every group does, so two groups wait rather
/// than deadlock where they can. A taken row carries its step's place in the parameters' arrays
/// (`n`: a group holds a conversation once), so the writes after the take read their values
/// from the arrays by it rather than joining the take back to its input: a join of two CTEs is
/// a nested loop over both (the planner has no index for either), its cost the square of the
/// group's size (docs/performance.md, "Joins without a square"). So `start_input` unnests only
/// the arrays the take and the refused rows read; a CTE copies each row it yields, and the
/// message and the record were copied there for nothing.
macro_rules! start_ctes {
    () => {
        concat!(
            "start_input AS (SELECT * FROM unnest($1::BYTEA[], $2::BYTEA[], $3::BYTEA[], \
                 $4::BYTEA[], $5::TIMESTAMPTZ[], $6::BIGINT[], $7::BYTEA[], $8::FLOAT8[], \
                 $9::TEXT[], $16::BIGINT[]) \
                 AS i(conv_key, principal_key, principal, context_id, at, at_ms, task_id, \
                     lease_secs, holder, token)), \
             taken AS (",
            take_sql!(
                "SELECT conv_key, principal_key, principal, context_id, at, at, at_ms, 1, 1, \
                     token, task_id, now() + lease_secs * INTERVAL '1 second', holder, NULL::TEXT \
                 FROM start_input ORDER BY conv_key",
                "colloquy_conversations.running_task IS NULL",
                ", array_position($1::BYTEA[], conv_key) AS n"
            ),
            "), \
             message AS (INSERT INTO colloquy_messages (conv_key, seq, body) \
                 SELECT conv_key, next_seq - 1, ($10::TEXT[])[n] FROM taken), \
             new_task AS (INSERT INTO colloquy_tasks (conv_key, task_id, principal_key, \
                     principal, state, status_ms, record, has_push) \
                 SELECT conv_key, ($7::BYTEA[])[n], ($2::BYTEA[])[n], ($3::BYTEA[])[n], \
                     ($11::SMALLINT[])[n], ($12::BIGINT[])[n], \
                     ($13::TEXT[])[n] || (next_seq - 1)::TEXT || ($14::TEXT[])[n], FALSE \
                 FROM taken)"
        )
    };
}

/// The snapshot's row of the conversation keyed by `$key` (a column of the row it joins).
macro_rules! seen {
    ($key:literal) => {
        concat!(
            " LEFT JOIN LATERAL (SELECT next_seq, token, running_task, lease_expires \
                 FROM colloquy_conversations WHERE conv_key = ",
            $key,
            ") AS seen ON TRUE"
        )
    };
}

/// The starts' rows of [`GROUP_SQL`]: one per step, keyed by the conversation, the taken ones
/// with the history window as it was before. The window comes from the statement's snapshot
/// (the main query does not see what its CTEs write): `seen_seq` (the conversation's
/// `next_seq` in it) tells whether a turn ended between that snapshot and the take, and the
/// window is then read again. The snapshot's row is a `LATERAL` lookup by key, which
/// PostgreSQL may flatten into a join: the group's connections keep that join an index lookup
/// per row (`KEYED_PLANS` in `group.rs`). The refused steps are those not taken (a hashed
/// lookup, not a join).
macro_rules! start_rows {
    () => {
        concat!(
            "(SELECT taken.conv_key, FALSE AS is_end, taken.turns, taken.next_seq, taken.token, \
                 taken.agent_state, seen.next_seq AS seen_seq, seen.token AS seen_token, \
                 seen.running_task, seen.lease_expires <= now() AS expired, \
                 ARRAY(SELECT body FROM colloquy_messages WHERE conv_key = taken.conv_key \
                     AND seq >= taken.next_seq - 1 - ($15::BIGINT[])[taken.n] ORDER BY seq) \
                     AS recent, \
                 NULL::BIGINT AS ended \
             FROM taken",
            seen!("taken.conv_key"),
            ") UNION ALL (SELECT start_input.conv_key, FALSE, NULL, NULL, NULL, NULL, \
                 seen.next_seq, seen.token, seen.running_task, seen.lease_expires <= now(), \
                 NULL, NULL \
             FROM start_input",
            seen!("start_input.conv_key"),
            " WHERE start_input.conv_key NOT IN (SELECT conv_key FROM taken))"
        )
    };
}

/// The ends' part of [`GROUP_SQL`] (parameters 17 to 28, [`EndStep`]'s columns). For each
/// step of the group: stores the reply, the task's final record and releases the
/// conversation, if the lease still holds it at the expected sequence number and the task has
/// no push configs; else nothing (`ended` 0). The release returns its step's values, so the
/// task's update and the reply read them from its rows (no join of two CTEs: see
/// [`start_ctes`]). `has_push` is read twice: by `held` from the snapshot (the usual refusal),
/// and by the task's update from the row it locked, in case a config was added in between;
/// then the statement fails (a cast error), so that what `held` wrote goes too.
macro_rules! end_ctes {
    () => {
        "end_input AS (SELECT * FROM unnest($17::BYTEA[], $18::BIGINT[], $19::BYTEA[], \
             $20::BIGINT[], $21::TIMESTAMPTZ[], $22::BIGINT[], $23::TEXT[], $24::BIGINT[], \
             $25::TEXT[], $26::SMALLINT[], $27::BIGINT[], $28::TEXT[]) \
             AS i(conv_key, token, task_id, next_seq, at, at_ms, agent_state, reply_seq, reply, \
                 state, status_ms, record)), \
         held AS (UPDATE colloquy_conversations AS c SET running_task = NULL, \
                 lease_expires = NULL, lease_holder = NULL, next_seq = end_input.next_seq, \
                 updated_at = end_input.at, updated_ms = end_input.at_ms, \
                 agent_state = COALESCE(end_input.agent_state, c.agent_state) \
             FROM end_input \
             WHERE c.conv_key = end_input.conv_key AND c.token = end_input.token \
                 AND c.running_task = end_input.task_id AND c.next_seq = end_input.reply_seq \
                 AND NOT EXISTS (SELECT 1 FROM colloquy_tasks \
                     WHERE conv_key = end_input.conv_key AND task_id = end_input.task_id \
                         AND has_push) \
             RETURNING c.conv_key, end_input.task_id, end_input.reply_seq, end_input.reply, \
                 end_input.state, end_input.status_ms, end_input.record), \
         ended_task AS (UPDATE colloquy_tasks AS t SET state = held.state, \
                 status_ms = held.status_ms, record = held.record \
             FROM held \
             WHERE t.task_id = held.task_id AND t.conv_key = held.conv_key AND NOT t.has_push \
             RETURNING t.conv_key), \
         reply AS (INSERT INTO colloquy_messages (conv_key, seq, body) \
             SELECT conv_key, reply_seq, reply FROM held WHERE reply IS NOT NULL)"
    };
}

/// The ends' rows of [`GROUP_SQL`].
macro_rules! end_rows {
    () => {
        "SELECT end_input.conv_key, TRUE, NULL, NULL, NULL, NULL, NULL, NULL, \
         NULL, NULL, NULL, \
         CAST(CASE WHEN (SELECT count(*) FROM held) = (SELECT count(*) FROM ended_task) \
             THEN (end_input.conv_key IN (SELECT conv_key FROM ended_task))::INT::TEXT \
             ELSE 'push config added' END AS BIGINT) \
         FROM end_input"
    };
}

/// A group's starts and ends in one statement. Its CTEs write rows of different conversations
/// (`group.rs` keeps a conversation's start out of a round that ends it) and all read the
/// snapshot the statement began with.
pub(super) const GROUP_SQL: &str = concat!(
    "WITH ",
    start_ctes!(),
    ", ",
    end_ctes!(),
    " ",
    "(",
    start_rows!(),
    ") UNION ALL (",
    end_rows!(),
    ")"
);

/// The `$3` messages before sequence number `$2`, oldest first.
const WINDOW_BEFORE_SQL: &str = "SELECT body FROM colloquy_messages \
     WHERE conv_key = $1 AND seq >= $2::BIGINT - $3::BIGINT AND seq < $2 ORDER BY seq";

/// The SQLSTATE of [`GROUP_SQL`]'s refusal when a push config came between its reads.
const PUSH_CONFIG_ADDED: &str = "22P02";

/// A start the usual way ([`GROUP_SQL`]'s first columns).
pub(super) struct StartStep {
    take: TakeValues,
    message: String,
    state: i16,
    status_ms: i64,
    record_prefix: String,
    record_suffix: &'static str,
    window_len: i64,
}

impl Step for StartStep {
    const NAME: &'static str = "start";

    fn conversation(&self) -> &[u8] {
        &self.take.key
    }

    fn columns<'a>(steps: &[&'a Self]) -> Vec<Column<'a>> {
        vec![
            column(steps, |s| s.take.key.as_slice()),
            column(steps, |s| s.take.principal_key.as_slice()),
            column(steps, |s| s.take.principal.as_slice()),
            column(steps, |s| s.take.context_id.as_slice()),
            column(steps, |s| s.take.now),
            column(steps, |s| s.take.now_ms),
            column(steps, |s| s.take.task_id.as_slice()),
            column(steps, |s| s.take.lease_secs),
            column(steps, |s| s.take.holder.as_str()),
            column(steps, |s| s.message.as_str()),
            column(steps, |s| s.state),
            column(steps, |s| s.status_ms),
            column(steps, |s| s.record_prefix.as_str()),
            column(steps, |s| s.record_suffix),
            column(steps, |s| s.window_len),
            column(steps, |s| s.take.token),
        ]
    }
}

/// An end the usual way ([`GROUP_SQL`]'s last columns).
pub(super) struct EndStep {
    key: Vec<u8>,
    token: i64,
    task_id: Vec<u8>,
    next_seq: i64,
    at: chrono::DateTime<chrono::Utc>,
    at_ms: i64,
    agent_state: Option<String>,
    reply_seq: i64,
    reply: Option<String>,
    state: i16,
    status_ms: i64,
    record: String,
}

impl Step for EndStep {
    const NAME: &'static str = "end";

    fn conversation(&self) -> &[u8] {
        &self.key
    }

    fn columns<'a>(steps: &[&'a Self]) -> Vec<Column<'a>> {
        vec![
            column(steps, |s| s.key.as_slice()),
            column(steps, |s| s.token),
            column(steps, |s| s.task_id.as_slice()),
            column(steps, |s| s.next_seq),
            column(steps, |s| s.at),
            column(steps, |s| s.at_ms),
            column(steps, |s| s.agent_state.as_deref()),
            column(steps, |s| s.reply_seq),
            column(steps, |s| s.reply.as_deref()),
            column(steps, |s| s.state),
            column(steps, |s| s.status_ms),
            column(steps, |s| s.record.as_str()),
        ]
    }
}

/// What a node remembers of a turn it started, for its end: the task as stored and the
/// sequence number its reply takes.
#[derive(Debug, Clone)]
pub(super) struct StartedTurn {
    pub(super) stored: StoredTask,
    pub(super) reply_seq: u64,
}

/// The task record with its history's sequence numbers left open: the record is
/// `prefix ++ seq ++ "]}"` once the statement knows the caller's message's `seq`. `history_seqs`
/// is the record's last field and a new task's is empty (`…,"history_seqs":[]}`); None if not.
fn record_around_seq(stored: &StoredTask) -> Option<(String, &'static str)> {
    let record = encode(stored);
    let prefix = record.strip_suffix("\"history_seqs\":[]}")?;
    Some((format!("{prefix}\"history_seqs\":["), "]}"))
}

fn new_task(turn: &BeginTurn) -> StoredTask {
    let mut task = turn.new_task();
    task.status = TaskStatus::new(TaskState::Working, None);
    StoredTask {
        task,
        stream: None,
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
        let key = turn.key;
        let stored = new_task(turn);
        let Some((record_prefix, record_suffix)) = record_around_seq(&stored) else {
            return Ok(None);
        };
        let window_len = turn.history_limit.min(i64::MAX as usize) as i64;
        // A caller that kept the window reads none (the usual case: an empty array), and only
        // if the conversation moved meanwhile, after the take.
        let read_len = if turn.known.is_some() { 0 } else { window_len };
        let status = &stored.task.status;
        let step = StartStep {
            take: TakeValues::of(self, turn, &key),
            message: encode(&turn.message),
            state: status.state.code() as i16,
            status_ms: status.timestamp.timestamp_millis().max(0),
            record_prefix,
            record_suffix,
            window_len: read_len,
        };
        let row = self.steps.start(step).await.inspect_err(|failure| {
            // A lost connection leaves it unknown whether the commit was stored.
            if failure.connection_lost() {
                // The caller is told to retry: take back what may have been stored.
                failover::undo_unanswered_start(self.pool.clone(), self.unanswered(turn, &key));
            }
        })?;
        // The start is committed from here on: whatever fails now (reading the row, the
        // window's read, a failover between the two round trips) tells the caller to retry, so
        // the start must be taken back as well, or the conversation would keep a message
        // nobody answered.
        let take_back = |_: &Failure| {
            failover::undo_unanswered_start(self.pool.clone(), self.unanswered(turn, &key));
        };
        let Some(taken) = Taken::of(&row).inspect_err(take_back)? else {
            return busy_or_general(turn, &row);
        };
        self.after_start(turn, key, stored, taken, &row, window_len)
            .await
            .inspect_err(take_back)
            .map(Some)
    }

    /// A taken start's committed row, read into the turn begun.
    async fn after_start(
        &self,
        turn: &BeginTurn,
        key: ConversationKey,
        mut stored: StoredTask,
        taken: Taken,
        row: &Row,
        window_len: i64,
    ) -> Result<TurnBegun, Failure> {
        let seq = taken.next_seq - 1;
        // The snapshot is the conversation as the take found it unless a turn ended between
        // them (it moved `next_seq`; a fencing step that moved only the token changed no message).
        let seen_seq: Option<i64> = row.try_get("seen_seq")?;
        let seen_token: Option<i64> = row.try_get("seen_token")?;
        let snapshot_current = seen_seq.unwrap_or(0) as u64 == seq;
        let before = seen_token.map(|token| ConversationMark {
            token: token as u64,
            next_seq: seq,
        });
        let recent = if snapshot_current && turn.known.is_some() && turn.known == before {
            None
        } else if snapshot_current && turn.known.is_none() {
            let bodies: Vec<String> = row.try_get("recent")?;
            Some(
                bodies
                    .iter()
                    .map(|body| decode(body))
                    .collect::<Result<_, _>>()?,
            )
        } else {
            // A turn ended after the snapshot (its messages are committed), or the caller's
            // window is not current: read it now.
            // Boxed: rare, and its states would make every start's future larger.
            Some(Box::pin(self.window_before(&key, seq, window_len)).await?)
        };
        stored.history_seqs.push(seq);
        let mut task = stored.task.clone();
        task.history = vec![turn.message.clone()];
        Ok(self.begun(turn, key, taken, stored, task, recent))
    }

    /// A committed start: remembered for its end and counted.
    pub(super) fn begun(
        &self,
        turn: &BeginTurn,
        key: ConversationKey,
        taken: Taken,
        stored: StoredTask,
        task: Task,
        recent: Option<Vec<Message>>,
    ) -> TurnBegun {
        let started = StartedTurn {
            stored,
            reply_seq: taken.next_seq,
        };
        self.started.lock().insert((key, taken.token), started);
        kept!(counter, "colloquy_leases_taken_total").increment(1);
        TurnBegun {
            lease: Lease {
                key,
                task_id: turn.task_id.clone(),
                token: taken.token,
                trace: turn.trace.clone(),
            },
            task,
            recent,
            mark: ConversationMark {
                token: taken.token,
                next_seq: taken.next_seq,
            },
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
        stored.stream = end.stream.clone();
        let now = crate::model::now();
        let status = &stored.task.status;
        let step = EndStep {
            key: lease.key.as_bytes().to_vec(),
            token: lease.token as i64,
            task_id: lease.task_id.as_bytes().to_vec(),
            next_seq: next_seq as i64,
            at: now,
            at_ms: now.timestamp_millis(),
            agent_state: end.agent_state.as_ref().map(encode),
            reply_seq: reply_seq as i64,
            reply: end.reply.as_ref().map(encode),
            state: status.state.code() as i16,
            status_ms: status.timestamp.timestamp_millis().max(0),
            record: encode(&stored),
        };
        let ended = match self.steps.end(step).await {
            Ok(row) => row.try_get::<_, i64>("ended")?,
            Err(failure) if failure.refused_with() == Some(PUSH_CONFIG_ADDED) => 0,
            Err(failure) => return Err(failure),
        };
        // Not ended: the task has push configs (their notifications are built in Rust) or the
        // lease moved on; the general path tells which.
        Ok(ended == 1)
    }

    /// The `limit` messages before `seq`, oldest first.
    async fn window_before(
        &self,
        key: &ConversationKey,
        seq: u64,
        limit: i64,
    ) -> Result<Vec<Message>, Failure> {
        let client = self.client().await?;
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
            stream: None,
            history_seqs: Vec::new(),
        };
        let (prefix, suffix) = record_around_seq(&stored).expect("history_seqs is last");
        let read: StoredTask =
            serde_json::from_str(&format!("{prefix}7{suffix}")).expect("a record");
        stored.history_seqs.push(7);
        assert_eq!(read, stored);
    }
}
