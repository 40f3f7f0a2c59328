//! Surviving a failover: which failures mean the database is unreachable (the caller may send
//! the same request again), a running turn's writes carried over to the new primary, and the
//! undoing of a turn's start whose commit went unanswered.
//!
//! A node names every host in `store.url` (`target_session_attrs=read-write` picks the
//! primary). When the primary dies its connections close; the pool drops them on their next
//! checkout and connects to whichever host now takes writes. With a synchronous standby every
//! commit PostgreSQL acknowledged is on the promoted standby, leases included, so a turn that
//! started before the failover can finish after it.

use super::ops::{StoredTask, load_task, put_task};
use super::{Failure, Ops, retrying};
use crate::error::chain;
use crate::store::{ConversationKey, FinishTurn, Lease, StoreError, StoreResult};
use deadpool_postgres::Pool;
use std::future::Future;
use std::time::{Duration, Instant};

/// How long a node waits for a host to accept a connection, and for the database to
/// acknowledge data it sent, before it tries the next host or gives up on the connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const UNACKNOWLEDGED_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle time before TCP keepalives probe a connection (a host that vanished from the network).
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
/// The pause between attempts while the database is unreachable.
const PAUSE: Duration = Duration::from_millis(200);
/// How long a node keeps trying to undo a turn start whose commit went unanswered.
const UNDO_FOR: Duration = Duration::from_secs(120);

/// Bounds how long a dead host can hold a connection, unless `store.url` says otherwise: a
/// primary that vanished without closing its sockets is given up on within seconds.
pub(super) fn bound_dead_hosts(config: &mut tokio_postgres::Config) {
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(UNACKNOWLEDGED_TIMEOUT);
    }
    if config.get_keepalives_idle() > KEEPALIVE_IDLE {
        config.keepalives_idle(KEEPALIVE_IDLE);
    }
}

/// Whether `error` means the connection is gone or the server will not take writes on it (shut
/// down, in recovery, read-only): what a failover looks like from a node.
pub(super) fn connection_lost(error: &tokio_postgres::Error) -> bool {
    if error.is_closed() {
        return true;
    }
    if let Some(db) = error.as_db_error() {
        let code = db.code().code();
        // Class 08: connection exception; 57P01-03: shutdown, crash, not yet accepting
        // connections; 25006: a read-only transaction (a standby).
        return code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03" | "25006");
    }
    std::error::Error::source(error).is_some_and(|cause| cause.is::<std::io::Error>())
}

/// Runs a write of a running turn (token-conditional, so repeating it is safe) again while the
/// database is unreachable, for up to `window`: the turn's lease survives a failover.
pub(super) async fn across_failover<T, F, Fut>(window: Duration, mut attempt: F) -> StoreResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Failure>>,
{
    let started = Instant::now();
    loop {
        match retrying(&mut attempt).await {
            Err(e @ StoreError::Unavailable { .. }) if started.elapsed() < window => {
                tracing::warn!(error = %chain(&e), "the database is unreachable; retrying a turn's write");
                tokio::time::sleep(PAUSE).await;
            }
            other => return other,
        }
    }
}

impl Ops {
    /// How long a running turn's writes wait for the database to come back.
    fn failover_window(&self) -> Duration {
        Duration::from_secs_f64(self.lease_secs)
    }

    /// Stores a turn's end, waiting out a failover. An attempt whose commit went unanswered
    /// may have been stored: a later attempt refused for its token then checks whether the
    /// task already holds this end.
    pub(super) async fn finish_across_failover(&self, end: &FinishTurn) -> StoreResult<()> {
        let window = self.failover_window();
        let started = Instant::now();
        let mut interrupted = false;
        loop {
            match retrying(|| self.finish(end)).await {
                Err(e @ StoreError::Unavailable { .. }) if started.elapsed() < window => {
                    tracing::warn!(error = %chain(&e), task_id = %end.lease.task_id, "the database is unreachable; retrying a turn's end");
                    interrupted = true;
                    tokio::time::sleep(PAUSE).await;
                }
                Err(stale @ StoreError::StaleToken { .. }) if interrupted => {
                    return match self.holds_end(end).await {
                        Ok(true) => Ok(()),
                        _ => Err(stale),
                    };
                }
                other => return other,
            }
        }
    }

    /// Records a status of a running turn, waiting out a failover (the same status again is
    /// harmless).
    pub(super) async fn record_status_across_failover(
        &self,
        lease: &Lease,
        status: &crate::model::TaskStatus,
    ) -> StoreResult<()> {
        across_failover(self.failover_window(), || self.record_status(lease, status)).await
    }

    /// Whether the task already stores `end`'s final status (an earlier attempt committed).
    async fn holds_end(&self, end: &FinishTurn) -> Result<bool, Failure> {
        let client = self.client().await?;
        let row = load_task(&client, &end.lease.task_id, false).await?;
        Ok(row.is_some_and(|row| row.key == end.lease.key && row.stored.task.status == end.status))
    }
}

/// What a turn's start wrote, to take back if its commit went unanswered.
pub(super) struct UnansweredStart {
    pub key: ConversationKey,
    pub principal: String,
    pub task_id: String,
    /// The lease's token, if the start's answer came back; without it the start's task id,
    /// new or locked by the start, tells its lease.
    pub token: Option<u64>,
    /// The task as it was before (a continued task), or None for a task this start created.
    pub before: Option<StoredTask>,
}

/// Takes back a turn's start whose caller was told to retry (its commit went unanswered, or it
/// was stored but what came after it failed), once the database is back: if it was stored and
/// its lease still holds the conversation, its message and task go and the conversation is as
/// before. Nothing else can have written to the conversation under that lease.
pub(super) fn undo_unanswered_start(pool: Pool, start: UnansweredStart) {
    tokio::spawn(async move {
        let started = Instant::now();
        loop {
            match undo_start(&pool, &start).await {
                Ok(undone) => {
                    if undone {
                        tracing::warn!(task_id = %start.task_id, "took back a turn's start whose caller was told to retry");
                    }
                    return;
                }
                Err(failure) if started.elapsed() < UNDO_FOR => {
                    tracing::debug!(error = %failure.into_store(), "could not yet undo an unanswered start");
                    tokio::time::sleep(PAUSE).await;
                }
                Err(failure) => {
                    tracing::error!(error = %chain(&failure.into_store()), task_id = %start.task_id, "gave up undoing an unanswered start; its lease expires instead");
                    return;
                }
            }
        }
    });
}

/// One attempt at [`undo_unanswered_start`]; whether there was something to undo.
async fn undo_start(pool: &Pool, start: &UnansweredStart) -> Result<bool, Failure> {
    let mut client = pool.get().await.map_err(Failure::Pool)?;
    let tx = client.transaction().await?;
    let key = start.key.as_bytes();
    let key = key.as_slice();
    let held = tx
        .query_opt(
            "SELECT turns, next_seq FROM colloquy_conversations \
             WHERE conv_key = $1 AND running_task = $3 AND ($2::BIGINT IS NULL OR token = $2) \
             FOR UPDATE",
            &[
                &key,
                &start.token.map(|t| t as i64),
                &start.task_id.as_bytes(),
            ],
        )
        .await?;
    let Some(held) = held else {
        return Ok(false);
    };
    // Under the start's lease nothing else moved `next_seq`: the caller's message is the last.
    let seq: i64 = held.try_get::<_, i64>("next_seq")? - 1;
    tx.execute(
        "DELETE FROM colloquy_messages WHERE conv_key = $1 AND seq = $2",
        &[&key, &seq],
    )
    .await?;
    match &start.before {
        Some(before) => put_task(&tx, &start.key, &start.principal, before, None).await?,
        None => {
            tx.execute(
                "DELETE FROM colloquy_tasks WHERE conv_key = $1 AND task_id = $2",
                &[&key, &start.task_id.as_bytes()],
            )
            .await?;
        }
    }
    let turns: i64 = held.try_get("turns")?;
    if turns <= 1 {
        // The start created the conversation.
        tx.execute(
            "DELETE FROM colloquy_conversations WHERE conv_key = $1",
            &[&key],
        )
        .await?;
    } else {
        tx.execute(
            "UPDATE colloquy_conversations SET running_task = NULL, lease_expires = NULL, \
                 lease_holder = NULL, turns = turns - 1, next_seq = next_seq - 1 \
             WHERE conv_key = $1",
            &[&key],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_postgres::config::TargetSessionAttrs;

    #[test]
    fn a_multi_host_url_names_every_host_and_bounds_dead_ones() {
        let url = "postgresql://u@db-a:5432,db-b:5433/colloquy?target_session_attrs=read-write";
        let mut config: tokio_postgres::Config = url.parse().expect("a multi-host URL");
        assert_eq!(config.get_hosts().len(), 2);
        assert_eq!(config.get_ports(), [5432, 5433]);
        assert_eq!(
            config.get_target_session_attrs(),
            TargetSessionAttrs::ReadWrite
        );
        bound_dead_hosts(&mut config);
        assert_eq!(config.get_connect_timeout(), Some(&CONNECT_TIMEOUT));
        assert_eq!(config.get_tcp_user_timeout(), Some(&UNACKNOWLEDGED_TIMEOUT));
        assert_eq!(config.get_keepalives_idle(), KEEPALIVE_IDLE);
        // The URL's own settings stay.
        let mut config: tokio_postgres::Config = "postgres://u@db/c?connect_timeout=1"
            .parse()
            .expect("a URL");
        bound_dead_hosts(&mut config);
        assert_eq!(config.get_connect_timeout(), Some(&Duration::from_secs(1)));
    }

    #[test]
    fn store_url_takes_urls_and_key_value_strings_naming_hosts() {
        use super::super::is_postgres_url;
        for url in [
            "postgres://u@db/c",
            "postgresql://u@a:5432,b:5433/c?target_session_attrs=read-write",
            "host=a,b port=5432,5433 user=u dbname=c target_session_attrs=read-write",
        ] {
            assert!(is_postgres_url(url), "{url}");
        }
        for not in [
            "./data",
            "sled",
            "mysql://db/c",
            "dbname=c",
            "host='unclosed",
        ] {
            assert!(!is_postgres_url(not), "{not}");
        }
    }
}
