//! Group commit for the one-trip turn steps (`turn.rs`): the starts and the ends that wait at
//! the same time go to the database as one statement over arrays, one for each column of each
//! kind, which commits on its own. A durable commit costs the database about as much as the
//! rows a turn writes (the WAL flush, the wake-ups, the executor's set-up), so sharing it among
//! the turns that wait together is what brings the database's CPU per turn down as load grows;
//! alone, a step is a group of one.
//!
//! One group is in flight at a time (`IN_FLIGHT`); the steps that arrive while it is wait and
//! leave together as the next group, so groups grow with load. Only a group that follows one
//! carrying starts waits for a timer, a millisecond at most, for those starts' ends
//! ([`Gathered::wait_for_ends`]). A group holds each conversation once (a node runs one turn
//! per conversation at a time, but a step for a key already in the group goes in a later one,
//! whatever sent it). A group the database refuses (a deadlock with another node's group, one
//! step's conflict) is run again step by step, so each step gets its own answer; a connection
//! lost mid-commit answers every step of the group with it, as it would have answered each
//! alone.
//!
//! Groups go over connections of their own ([`group_pool`]), set up once for the group's
//! statement: a statement alone in its round trip (one `Sync`) is its own transaction, so a
//! group is one statement to parse, run and answer, with no `BEGIN`, settings or `COMMIT`
//! around it (docs/performance.md, "A group as one statement").

use super::Failure;
use crate::telemetry::Handles;
use deadpool_postgres::{Hook, HookError, Manager, Pool};
use metrics::Counter;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::time::Instant;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

/// Groups in flight at once. One, as in a classic group commit: the steps that come
/// while it commits wait for it and leave together. Two halved the groups and cost the database
/// a third more per turn (`benches/cluster_compare.sh`, docs/performance.md); the price of one
/// is that a group waiting on a row lock (another node's turn of one of its conversations, held
/// for a few round trips) holds back the node's next group until it is granted.
const IN_FLIGHT: usize = 1;

/// The longest a group waits for the ends of the turns the group before it started
/// ([`Gathered::wait_for_ends`]); tokio's timer counts whole milliseconds.
const WAVE_WAIT: Duration = Duration::from_millis(1);

/// A parameter of a group's statement: one array per column.
pub(super) type Column<'a> = Box<dyn ToSql + Sync + Send + 'a>;

/// The column of `steps`' `value`s.
pub(super) fn column<'a, S, T>(steps: &[&'a S], value: impl Fn(&'a S) -> T) -> Column<'a>
where
    T: ToSql + Sync + Send + 'a,
{
    Box::new(steps.iter().map(|&step| value(step)).collect::<Vec<T>>())
}

/// A turn step that can go to the database with others of its kind.
pub(super) trait Step: Send + Sync + 'static {
    /// The `step` label of the group metrics.
    const NAME: &'static str;
    fn conversation(&self) -> &[u8];
    fn columns<'a>(steps: &[&'a Self]) -> Vec<Column<'a>>;
}

struct Waiting<S> {
    step: S,
    answer: oneshot::Sender<Result<Row, Failure>>,
}

/// A step waiting for its group: a turn's start or its end.
enum Pending<S, E> {
    Start(Waiting<S>),
    End(Waiting<E>),
}

/// Where a node's turn steps wait for their group: its starts (`S`) and its ends (`E`) go to
/// the database together, in one statement.
pub(super) struct Group<S: Step, E: Step> {
    queue: mpsc::UnboundedSender<Pending<S, E>>,
}

/// Connections a node's groups use at most: one group is in flight at a time, and a group the
/// database refused runs its steps again side by side, a few at a time.
const GROUP_CONNECTIONS: usize = 4;

/// Every statement of a group reaches each conversation's rows by its key: its plan is nested
/// loops over index lookups, whatever the tables' statistics say. Left to them, a plan made
/// while a table was nearly empty (a generic plan is kept until the next analyze) joins it
/// whole by hash, and scans all of it at every group once it has grown.
const KEYED_PLANS: &str =
    "SET enable_seqscan = off; SET enable_hashjoin = off; SET enable_mergejoin = off";

/// On PostgreSQL 12 and later the group's statement is planned once per connection, not at each
/// execution: left to choose, PostgreSQL plans it anew every time, because a plan for the
/// group's own number of rows always looks cheaper than one for any number, and planning the
/// statement costs about as much as running it. Both settings are PostgreSQL's planner's:
/// other engines that speak its protocol plan their own way and get neither.
const GENERIC_PLANS: &str = "SET plan_cache_mode = force_generic_plan";

/// The pool of the groups' connections ([`GROUP_CONNECTIONS`]), each set up for the group's
/// statement when it connects ([`KEYED_PLANS`], [`GENERIC_PLANS`]): settings that hold for the
/// connection's life, which the store's other statements (listings, exports) do not share.
pub(super) fn group_pool(manager: Manager) -> Result<Pool, deadpool_postgres::BuildError> {
    Pool::builder(manager)
        .max_size(GROUP_CONNECTIONS)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(30)))
        .create_timeout(Some(Duration::from_secs(10)))
        .post_create(Hook::async_fn(|client, _| {
            Box::pin(async move {
                let row = client
                    .query_one(
                        "SELECT version(), current_setting('server_version_num')",
                        &[],
                    )
                    .await
                    .map_err(HookError::Backend)?;
                let version: String = row.try_get(0).map_err(HookError::Backend)?;
                let number: String = row.try_get(1).map_err(HookError::Backend)?;
                if !version.starts_with("PostgreSQL ") {
                    return Ok(());
                }
                let settings = match number.parse::<u32>().is_ok_and(|n| n >= 120_000) {
                    true => format!("{KEYED_PLANS}; {GENERIC_PLANS}"),
                    false => KEYED_PLANS.to_owned(),
                };
                client
                    .batch_execute(&settings)
                    .await
                    .map_err(HookError::Backend)
            })
        }))
        .build()
}

impl<S: Step, E: Step> Group<S, E> {
    /// Starts the group's collector on `runtime`, for groups of at most `most` steps of each
    /// kind, committed by `sql` over connections of `pool` ([`group_pool`]); it stops when the
    /// group is dropped. `sql` takes [`Step::columns`] of the starts, then of the ends, and
    /// answers a row a step, keyed by its first column, the conversation key, with `is_end`
    /// telling the ends' rows.
    pub(super) fn spawn(
        pool: Pool,
        sql: &'static str,
        most: usize,
        runtime: &tokio::runtime::Handle,
    ) -> Group<S, E> {
        let (queue, waiting) = mpsc::unbounded_channel();
        let database = Database { pool, sql };
        runtime.spawn(collect(database, most.max(1), waiting));
        Group { queue }
    }

    /// Commits a turn's start with the steps waiting beside it: its row of the statement.
    pub(super) async fn start(&self, step: S) -> Result<Row, Failure> {
        self.commit(|answer| Pending::Start(Waiting { step, answer }))
            .await
    }

    /// Commits a turn's end with the steps waiting beside it: its row of the statement.
    pub(super) async fn end(&self, step: E) -> Result<Row, Failure> {
        self.commit(|answer| Pending::End(Waiting { step, answer }))
            .await
    }

    async fn commit(
        &self,
        pending: impl FnOnce(oneshot::Sender<Result<Row, Failure>>) -> Pending<S, E>,
    ) -> Result<Row, Failure> {
        let (answer, answered) = oneshot::channel();
        self.queue.send(pending(answer)).map_err(|_| closed())?;
        answered.await.map_err(|_| closed())?
    }
}

fn closed() -> Failure {
    Failure::Store(crate::store::StoreError::Closed)
}

fn no_row() -> Failure {
    Failure::Store(crate::store::StoreError::backend_msg(
        "a turn step got no row back from its statement",
    ))
}

/// Where groups are committed, and by which statement.
#[derive(Clone)]
struct Database {
    pool: Pool,
    sql: &'static str,
}

/// Takes the waiting steps as groups, one group in flight at a time.
async fn collect<S: Step, E: Step>(
    database: Database,
    most: usize,
    mut waiting: mpsc::UnboundedReceiver<Pending<S, E>>,
) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    // The starts the group last back carried: their turns' ends are on their way.
    let started = Arc::new(AtomicUsize::new(0));
    while let Some(first) = waiting.recv().await {
        // Waiting for a slot is what lets the next group gather.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut group = Gathered::new(most);
        group.push(first);
        group.take_ready(&mut waiting);
        group
            .wait_for_ends(started.swap(0, Ordering::Relaxed), &mut waiting)
            .await;
        let database = database.clone();
        let started = started.clone();
        tokio::spawn(async move {
            let starts_carried = group.starts.len();
            let (mut starts, mut ends) =
                (distinct_rounds(group.starts), distinct_rounds(group.ends));
            while !starts.is_empty() || !ends.is_empty() {
                let ends = first_round(&mut ends);
                let starts = starts_beside(&ends, &mut starts);
                commit_round(&database, starts, ends).await;
            }
            started.store(starts_carried, Ordering::Relaxed);
            drop(slot);
        });
    }
}

/// The steps of the group being gathered.
struct Gathered<S, E> {
    starts: Vec<Waiting<S>>,
    ends: Vec<Waiting<E>>,
    most: usize,
}

impl<S, E> Gathered<S, E> {
    fn new(most: usize) -> Self {
        Gathered {
            starts: Vec::new(),
            ends: Vec::new(),
            most,
        }
    }

    fn push(&mut self, pending: Pending<S, E>) {
        match pending {
            Pending::Start(start) => self.starts.push(start),
            Pending::End(end) => self.ends.push(end),
        }
    }

    /// Takes the steps already waiting, while the group has room.
    fn take_ready(&mut self, waiting: &mut mpsc::UnboundedReceiver<Pending<S, E>>) {
        while !self.full() {
            match waiting.try_recv() {
                Ok(pending) => self.push(pending),
                Err(_) => break,
            }
        }
    }

    /// Waits, [`WAVE_WAIT`] at most, until the group holds as many ends as the group before it
    /// carried starts. The steps a group answers come back together, and their turns' next
    /// steps follow within a moment (an echo's end a fraction of a millisecond after its
    /// start): left to leave at once, the next group took the first of them and the rest
    /// waited a whole round trip for the one after: with the database far away a turn's two
    /// steps took about four group round trips (docs/performance.md, "where a turn's time
    /// goes"). An agent slower than the wait costs each group the wait, in which more steps
    /// gather.
    async fn wait_for_ends(
        &mut self,
        expected: usize,
        waiting: &mut mpsc::UnboundedReceiver<Pending<S, E>>,
    ) {
        let until = Instant::now() + WAVE_WAIT;
        while self.ends.len() < expected && !self.full() {
            match tokio::time::timeout_at(until, waiting.recv()).await {
                Ok(Some(pending)) => {
                    self.push(pending);
                    self.take_ready(waiting);
                }
                Ok(None) | Err(_) => return,
            }
        }
    }

    fn full(&self) -> bool {
        self.starts.len() >= self.most || self.ends.len() >= self.most
    }
}

/// The steps split so that each round holds a conversation once, in arrival order.
fn distinct_rounds<S: Step>(mut steps: Vec<Waiting<S>>) -> Vec<Vec<Waiting<S>>> {
    let mut rounds = Vec::new();
    while !steps.is_empty() {
        let mut seen = HashSet::new();
        let (round, later) = steps
            .into_iter()
            .partition(|w| seen.insert(w.step.conversation().to_vec()));
        rounds.push(round);
        steps = later;
    }
    rounds
}

/// The next of `rounds` (none when all are taken).
fn first_round<S>(rounds: &mut Vec<Vec<Waiting<S>>>) -> Vec<Waiting<S>> {
    match rounds.is_empty() {
        true => Vec::new(),
        false => rounds.remove(0),
    }
}

/// The next round's starts, less those of a conversation one of `ends` ends: one statement
/// writes a row once, so such a start waits for the next round (on one node a turn's next
/// start follows its end, so this is for a step sent some other way).
fn starts_beside<S: Step, E: Step>(
    ends: &[Waiting<E>],
    rounds: &mut Vec<Vec<Waiting<S>>>,
) -> Vec<Waiting<S>> {
    let round = first_round(rounds);
    let ending: HashSet<&[u8]> = ends.iter().map(|w| w.step.conversation()).collect();
    let (beside, later): (Vec<_>, Vec<_>) = round
        .into_iter()
        .partition(|w| !ending.contains(w.step.conversation()));
    if !later.is_empty() {
        rounds.insert(0, later);
    }
    beside
}

async fn commit_round<S: Step, E: Step>(
    database: &Database,
    starts: Vec<Waiting<S>>,
    ends: Vec<Waiting<E>>,
) {
    let start_steps: Vec<&S> = starts.iter().map(|w| &w.step).collect();
    let end_steps: Vec<&E> = ends.iter().map(|w| &w.step).collect();
    match execute(database, &start_steps, &end_steps).await {
        Ok((start_rows, end_rows)) => {
            answer_by_conversation(starts, start_rows);
            answer_by_conversation(ends, end_rows);
        }
        Err(failure) if starts.len() + ends.len() > 1 && failure.refused_with().is_some() => {
            // One step's conflict or a deadlock: each step alone gets its own answer.
            let starts = starts.into_iter().map(|waiting| async move {
                let outcome = execute::<S, E>(database, &[&waiting.step], &[]).await;
                let _ = waiting
                    .answer
                    .send(outcome.and_then(|(mut rows, _)| rows.pop().ok_or_else(no_row)));
            });
            let ends = ends.into_iter().map(|waiting| async move {
                let outcome = execute::<S, E>(database, &[], &[&waiting.step]).await;
                let _ = waiting
                    .answer
                    .send(outcome.and_then(|(_, mut rows)| rows.pop().ok_or_else(no_row)));
            });
            futures_util::future::join(
                futures_util::future::join_all(starts),
                futures_util::future::join_all(ends),
            )
            .await;
        }
        Err(failure) => {
            let mut failures = failure.shared(starts.len() + ends.len()).into_iter();
            for answer in starts
                .into_iter()
                .map(|w| w.answer)
                .chain(ends.into_iter().map(|w| w.answer))
            {
                if let Some(failure) = failures.next() {
                    let _ = answer.send(Err(failure));
                }
            }
        }
    }
}

/// Each waiting step gets the row of its conversation.
fn answer_by_conversation<S: Step>(round: Vec<Waiting<S>>, mut rows: Vec<Row>) {
    for waiting in round {
        let row = rows
            .iter()
            .position(|row| row.try_get::<_, &[u8]>(0).ok() == Some(waiting.step.conversation()))
            .map(|at| rows.swap_remove(at))
            .ok_or_else(no_row);
        let _ = waiting.answer.send(row);
    }
}

/// A round in one round trip: the group's statement, alone before its `Sync`, so that it is
/// its own transaction (the connection's settings were made when it connected). A statement
/// the database refused wrote nothing.
async fn execute<S: Step, E: Step>(
    database: &Database,
    starts: &[&S],
    ends: &[&E],
) -> Result<(Vec<Row>, Vec<Row>), Failure> {
    let client = database.pool.get().await.map_err(Failure::Pool)?;
    let statement = client.prepare_cached(database.sql).await?;
    count_group::<S>(starts.len());
    count_group::<E>(ends.len());
    let mut columns = S::columns(starts);
    columns.extend(E::columns(ends));
    let params: Vec<&(dyn ToSql + Sync)> = columns
        .iter()
        .map(|column| column.as_ref() as &(dyn ToSql + Sync))
        .collect();
    let (mut started, mut ended) = (Vec::new(), Vec::new());
    for row in client.query(&statement, &params).await? {
        match row.try_get::<_, bool>("is_end")? {
            true => ended.push(row),
            false => started.push(row),
        }
    }
    Ok((started, ended))
}

/// Counts a group's steps of one kind (nothing when it carries none).
fn count_group<S: Step>(steps: usize) {
    static GROUPS: Handles<&str, Counter> = Handles::new();
    static STEPS: Handles<&str, Counter> = Handles::new();
    if steps == 0 {
        return;
    }
    GROUPS
        .get(
            S::NAME,
            || metrics::counter!("colloquy_store_groups_total", "step" => S::NAME),
        )
        .increment(1);
    STEPS
        .get(
            S::NAME,
            || metrics::counter!("colloquy_store_grouped_steps_total", "step" => S::NAME),
        )
        .increment(steps as u64);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end() -> Pending<(), ()> {
        Pending::End(Waiting {
            step: (),
            answer: oneshot::channel().0,
        })
    }

    #[tokio::test]
    async fn a_group_waits_for_the_ends_of_the_starts_before_it_and_no_longer() {
        let (queue, mut waiting) = mpsc::unbounded_channel();
        let late = queue.clone();
        // A thread of its own: tokio's timer would round the 200 µs up to the wait's millisecond.
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_micros(200));
            let _ = late.send(end());
            let _ = late.send(end());
        });
        let mut group = Gathered::new(64);
        group.wait_for_ends(2, &mut waiting).await;
        assert_eq!(
            group.ends.len(),
            2,
            "the two ends that came within the wait board"
        );

        // An end that never comes costs the wait, not more.
        let mut group = Gathered::new(64);
        let started = std::time::Instant::now();
        group.wait_for_ends(1, &mut waiting).await;
        assert!(group.ends.is_empty());
        assert!(started.elapsed() >= WAVE_WAIT);
        assert!(
            started.elapsed() < WAVE_WAIT * 50,
            "{:?}",
            started.elapsed()
        );
        drop(queue);
    }

    #[tokio::test]
    async fn a_group_after_no_starts_leaves_at_once() {
        let (_queue, mut waiting) = mpsc::unbounded_channel::<Pending<(), ()>>();
        let mut group = Gathered::new(64);
        let started = std::time::Instant::now();
        group.wait_for_ends(0, &mut waiting).await;
        assert!(started.elapsed() < WAVE_WAIT);
    }
}
