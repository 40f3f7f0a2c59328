//! The PostgreSQL store's push-notification side: configs beside their task, and the outbox
//! every node drains.
//!
//! A task's status is written only by `put_task` (`ops.rs`), which also adds one outbox row per
//! config of the task in the same transaction ([`enqueue`]): a change and its notifications
//! commit together. Outbox positions come from the clock, above the task's last one (a task's
//! changes are ordered by its conversation's lease, so a node with a slower clock still keeps
//! them in order), retried on the rare clash. Both tables are keyed by the conversation key
//! first, so a sharded database keeps them with the conversation's other rows (migration 6); a
//! position is unique within its conversation, and found by both (`OutboxRow`). Two nodes
//! taking one position for two conversations in the same nanosecond only delays one of them
//! behind the other in a delivery worker, which tells in-flight notifications apart by position.
//!
//! Several nodes share the outbox: a node delivers a notification only after claiming it (a
//! token and an expiry judged by the database's clock), and reads other nodes' live claims as
//! not due until they expire, so no notification is in flight twice at once while its holder
//! lives (a holder that stops past its hold lets another node try again: at least once).
//!
//! The worker reads only what is due, from the index on `due` (a claim moves `due` to the
//! claim's expiry). A notification with an earlier one of its lane (its task and URL) pending
//! is set aside by its claim (`due` NULL); removing the one before it makes it due. Both hold
//! the lane's earlier rows locked, so a removal and a setting aside never miss each other.

use super::ops::{decode, encode};
use super::{Failure, Ops, PgStore, retrying};
use crate::model::{PushConfig, Task};
use crate::store::{
    ConversationKey, DueNotifications, Notification, PrincipalKey, PushError, PushStore,
    StoreResult, outbox_seq,
};
use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use futures_util::future::BoxFuture;
use std::sync::Arc;
use std::time::Duration;

/// Where a notification sits in the outbox: its conversation's key and its position.
pub(super) struct OutboxRow {
    key: ConversationKey,
    seq: i64,
}

impl OutboxRow {
    pub(super) fn of(notification: &Notification) -> OutboxRow {
        OutboxRow {
            key: notification.conversation(),
            seq: notification.seq as i64,
        }
    }

    fn key(&self) -> &[u8] {
        self.key.as_bytes().as_slice()
    }
}

/// Stores configs a send registers, with the task's id, in the transaction starting the task.
pub(super) async fn put_with_start(
    client: &impl GenericClient,
    key: &ConversationKey,
    principal: &str,
    configs: &[PushConfig],
    task_id: &str,
) -> Result<(), Failure> {
    for config in configs {
        let config = PushConfig {
            task_id: task_id.to_owned(),
            ..config.clone()
        };
        put_row(client, key.as_bytes(), principal, &config).await?;
    }
    Ok(())
}

async fn put_row(
    client: &impl GenericClient,
    key: &[u8],
    principal: &str,
    config: &PushConfig,
) -> Result<(), Failure> {
    client
        .execute(
            "INSERT INTO colloquy_push_configs (conv_key, task_id, config_id, principal, config) \
             VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (conv_key, task_id, config_id) DO UPDATE SET config = excluded.config",
            &[
                &key,
                &config.task_id.as_bytes(),
                &config.id.as_bytes(),
                &principal.as_bytes(),
                &encode(config),
            ],
        )
        .await?;
    Ok(())
}

/// Adds one notification per config of the task, reporting `task` (without history) as it is
/// now. Called with every status write, in its transaction.
pub(super) async fn enqueue(
    client: &impl GenericClient,
    key: &ConversationKey,
    task: &Task,
    trace: Option<&str>,
) -> Result<(), Failure> {
    let (key, task_id) = (key.as_bytes().as_slice(), task.id.as_bytes());
    let rows = client
        .query(
            "SELECT principal, config FROM colloquy_push_configs \
             WHERE conv_key = $1 AND task_id = $2 ORDER BY config_id",
            &[&key, &task_id],
        )
        .await?;
    if rows.is_empty() {
        return Ok(());
    }
    let last = client
        .query_one(
            "SELECT COALESCE(MAX(seq), 0) FROM colloquy_outbox \
             WHERE conv_key = $1 AND task_id = $2",
            &[&key, &task_id],
        )
        .await?;
    let mut floor = last.try_get::<_, i64>(0)?.max(0) as u64;
    let now = crate::model::now();
    for row in &rows {
        let principal = String::from_utf8_lossy(row.try_get::<_, &[u8]>("principal")?);
        let mut notification = Notification {
            id: uuid::Uuid::new_v4().to_string(),
            seq: 0,
            principal: principal.into_owned(),
            config: decode(row.try_get::<_, &str>("config")?)?,
            task: task.clone(),
            created_at: now,
            attempts: 0,
            not_before: now,
            claim: None,
            trace: trace.map(str::to_owned),
            last_error: None,
        };
        // Another node may take the same position at the same moment: take the next one.
        loop {
            notification.seq = outbox_seq(floor);
            let inserted = client
                .execute(
                    "INSERT INTO colloquy_outbox (conv_key, seq, task_id, not_before, record, \
                         due, lane, principal_key) \
                     VALUES ($7, $1, $2, $3, $4, $3, $5, $6) ON CONFLICT (conv_key, seq) DO NOTHING",
                    &[
                        &(notification.seq as i64),
                        &task_id,
                        &notification.not_before,
                        &encode(&notification),
                        &notification.lane().as_slice(),
                        &PrincipalKey::new(&notification.principal)
                            .as_bytes()
                            .as_slice(),
                        &key,
                    ],
                )
                .await?;
            floor = notification.seq;
            if inserted == 1 {
                break;
            }
        }
    }
    Ok(())
}

/// Claims the due notification `seq` unless a live claim holds it: its `due` moves to the
/// claim's expiry, so no node reads it as due meanwhile. Returns it as stored, with the claim.
async fn claim_row(
    client: &impl GenericClient,
    at: &OutboxRow,
    hold: Duration,
) -> Result<Option<Notification>, Failure> {
    let token = uuid::Uuid::new_v4().to_string();
    let row = client
        .query_opt(
            "UPDATE colloquy_outbox SET claim_token = $2, \
                 claimed_until = now() + $3::FLOAT8 * INTERVAL '1 second', \
                 due = now() + $3::FLOAT8 * INTERVAL '1 second' \
             WHERE conv_key = $4 AND seq = $1 AND due <= now() \
                 AND (claimed_until IS NULL OR claimed_until <= now()) \
             RETURNING record",
            &[&at.seq, &token, &hold.as_secs_f64(), &at.key()],
        )
        .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let mut notification: Notification = decode(row.try_get::<_, &str>("record")?)?;
    notification.claim = Some(token);
    Ok(Some(notification))
}

/// The conversation key of a task of the principal, from `row` (its task row, or None); else
/// the task is not found (another principal's task is not there for this one).
fn owned_task_key(
    row: Option<&tokio_postgres::Row>,
    principal: &str,
    task_id: &str,
) -> Result<Result<Vec<u8>, PushError>, Failure> {
    match row {
        Some(row) if row.try_get::<_, &[u8]>("principal")? == principal.as_bytes() => {
            Ok(Ok(row.try_get::<_, Vec<u8>>("conv_key")?))
        }
        _ => Ok(Err(PushError::TaskNotFound(task_id.to_owned()))),
    }
}

/// The task's configs, by config id.
async fn configs_of(
    client: &impl GenericClient,
    key: &[u8],
    task_id: &str,
) -> Result<Vec<PushConfig>, Failure> {
    let rows = client
        .query(
            "SELECT config FROM colloquy_push_configs WHERE conv_key = $1 AND task_id = $2 \
             ORDER BY config_id",
            &[&key, &task_id.as_bytes()],
        )
        .await?;
    rows.iter()
        .map(|row| decode(row.try_get::<_, &str>("config")?))
        .collect()
}

/// The principal's task's conversation key (a lookup by task id: on a sharded database, the
/// one step of a config's operations that asks every shard).
async fn owned_task(
    client: &impl GenericClient,
    principal: &str,
    task_id: &str,
) -> Result<Result<Vec<u8>, PushError>, Failure> {
    let row = client
        .query_opt(
            "SELECT conv_key, principal FROM colloquy_tasks WHERE task_id = $1",
            &[&task_id.as_bytes()],
        )
        .await?;
    owned_task_key(row.as_ref(), principal, task_id)
}

impl Ops {
    async fn configs(
        &self,
        principal: &str,
        task_id: &str,
    ) -> Result<Result<Vec<PushConfig>, PushError>, Failure> {
        let client = self.client().await?;
        Ok(match owned_task(&client, principal, task_id).await? {
            Ok(key) => Ok(configs_of(&client, &key, task_id).await?),
            Err(refused) => Err(refused),
        })
    }

    async fn put_config(
        &self,
        principal: &str,
        config: &PushConfig,
        max_per_task: usize,
    ) -> Result<Result<PushConfig, PushError>, Failure> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        // The task row, locked: two nodes adding configs at once count each other's, and a
        // turn's end sees `has_push` (and builds notifications) once this commits. Another
        // principal's task is marked too, and then rolled back.
        let task = tx
            .query_opt(
                "UPDATE colloquy_tasks SET has_push = TRUE WHERE task_id = $1 \
                 RETURNING conv_key, principal",
                &[&config.task_id.as_bytes()],
            )
            .await?;
        let key = match owned_task_key(task.as_ref(), principal, &config.task_id)? {
            Ok(key) => key,
            Err(refused) => return Ok(Err(refused)),
        };
        let existing = configs_of(&tx, &key, &config.task_id).await?;
        let replaces = existing.iter().any(|c| c.id == config.id);
        if !replaces && existing.len() >= max_per_task {
            return Ok(Err(PushError::TooManyConfigs {
                task_id: config.task_id.clone(),
                limit: max_per_task,
            }));
        }
        put_row(&tx, &key, principal, config).await?;
        tx.commit().await?;
        Ok(Ok(config.clone()))
    }

    async fn delete_config(
        &self,
        principal: &str,
        task_id: &str,
        config_id: &str,
    ) -> Result<Result<(), PushError>, Failure> {
        let client = self.client().await?;
        let key = match owned_task(&client, principal, task_id).await? {
            Ok(key) => key,
            Err(refused) => return Ok(Err(refused)),
        };
        let deleted = client
            .execute(
                "DELETE FROM colloquy_push_configs \
                 WHERE conv_key = $1 AND task_id = $2 AND config_id = $3",
                &[&key, &task_id.as_bytes(), &config_id.as_bytes()],
            )
            .await?;
        if deleted == 0 {
            return Ok(Err(PushError::ConfigNotFound {
                task_id: task_id.to_owned(),
                config_id: config_id.to_owned(),
            }));
        }
        Ok(Ok(()))
    }

    /// The first `limit` notifications; one another node holds reads as not due before its
    /// claim expires.
    async fn pending(&self, limit: usize) -> Result<Vec<Notification>, Failure> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT record, CASE WHEN claimed_until > now() THEN claimed_until END AS held \
                 FROM colloquy_outbox ORDER BY seq LIMIT $1",
                &[&(limit.min(i64::MAX as usize) as i64)],
            )
            .await?;
        let mut pending = Vec::with_capacity(rows.len());
        for row in &rows {
            let mut notification: Notification = decode(row.try_get::<_, &str>("record")?)?;
            if let Some(held) = row.try_get::<_, Option<DateTime<Utc>>>("held")? {
                notification.not_before = notification.not_before.max(held);
            }
            pending.push(notification);
        }
        Ok(pending)
    }

    async fn pending_count(&self) -> Result<usize, Failure> {
        let client = self.client().await?;
        let row = client
            .query_one("SELECT COUNT(*) FROM colloquy_outbox", &[])
            .await?;
        Ok(row.try_get::<_, i64>(0)?.max(0) as usize)
    }

    /// Up to `limit` due notifications, earliest first, and when the next one is due: one
    /// range of the due index.
    async fn due(&self, limit: usize) -> Result<DueNotifications, Failure> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT record, due, due <= now() AS ready FROM colloquy_outbox \
                 WHERE due IS NOT NULL ORDER BY due, seq LIMIT $1",
                &[&(limit.saturating_add(1).min(i64::MAX as usize) as i64)],
            )
            .await?;
        let mut found = DueNotifications::default();
        for row in &rows {
            let due: DateTime<Utc> = row.try_get("due")?;
            if !row.try_get::<_, bool>("ready")? || found.due.len() >= limit {
                found.next_due = Some(due);
                break;
            }
            found.due.push(decode(row.try_get::<_, &str>("record")?)?);
        }
        Ok(found)
    }

    async fn pending_of(&self, principal: &str, limit: usize) -> Result<usize, Failure> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "SELECT COUNT(*) FROM (SELECT 1 FROM colloquy_outbox WHERE principal_key = $1 \
                 LIMIT $2) AS pending",
                &[
                    &PrincipalKey::new(principal).as_bytes().as_slice(),
                    &(limit.min(i64::MAX as usize) as i64),
                ],
            )
            .await?;
        Ok(row.try_get::<_, i64>(0)?.max(0) as usize)
    }

    /// Claims a due notification no live claim holds, if it is the first of its lane (else
    /// sets it aside); returns it as stored, with the claim.
    async fn claim(
        &self,
        notification: &Notification,
        hold: Duration,
    ) -> Result<Option<Notification>, Failure> {
        let at = OutboxRow::of(notification);
        let (task_id, lane) = (notification.config.task_id.as_bytes(), notification.lane());
        let earlier = "SELECT seq FROM colloquy_outbox WHERE conv_key = $4 AND task_id = $1 \
                       AND lane = $2 AND seq < $3";
        let mut client = self.client().await?;
        // An earlier one of the lane is never added later (positions only grow): without one
        // now, no lock is needed.
        let any = client
            .query_opt(
                &format!("{earlier} LIMIT 1"),
                &[&task_id, &lane.as_slice(), &at.seq, &at.key()],
            )
            .await?;
        if any.is_none() {
            return claim_row(&client, &at, hold).await;
        }
        let tx = client.transaction().await?;
        // Locked, so the removal of one of them waits for this (or this for it, and then
        // sees it gone): never set aside behind a notification already removed.
        let rows = tx
            .query(
                &format!("{earlier} FOR UPDATE"),
                &[&task_id, &lane.as_slice(), &at.seq, &at.key()],
            )
            .await?;
        let claimed = if rows.is_empty() {
            claim_row(&tx, &at, hold).await?
        } else {
            tx.execute(
                "UPDATE colloquy_outbox SET due = NULL WHERE conv_key = $2 AND seq = $1 \
                 AND (claimed_until IS NULL OR claimed_until <= now())",
                &[&at.seq, &at.key()],
            )
            .await?;
            None
        };
        tx.commit().await?;
        Ok(claimed)
    }

    /// Removes a notification; the next of its lane, if set aside, is due now.
    async fn remove(&self, at: &OutboxRow) -> Result<(), Failure> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let removed = tx
            .query_opt(
                "DELETE FROM colloquy_outbox WHERE conv_key = $1 AND seq = $2 \
                 RETURNING task_id, lane",
                &[&at.key(), &at.seq],
            )
            .await?;
        if let Some(row) = removed {
            let (task_id, lane): (&[u8], Option<&[u8]>) =
                (row.try_get("task_id")?, row.try_get("lane")?);
            tx.execute(
                "UPDATE colloquy_outbox SET due = now() \
                 WHERE conv_key = $3 AND due IS NULL AND seq = \
                     (SELECT MIN(seq) FROM colloquy_outbox \
                      WHERE conv_key = $3 AND task_id = $1 AND lane = $2)",
                &[&task_id, &lane, &at.key()],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Whether the sweep should repair the outbox now (at most every `OUTBOX_REPAIR_PERIOD`).
    pub(super) fn outbox_repair_due(&self) -> bool {
        let mut last = self.outbox_repaired.lock();
        if last.elapsed() < super::OUTBOX_REPAIR_PERIOD {
            return false;
        }
        *last = std::time::Instant::now();
        true
    }

    /// Repairs what nodes of a build before migration 3, still running beside this one during a
    /// rolling upgrade, leave in the outbox: rows without a due time, lane or principal (filled
    /// from the record), and the first row of a lane left waiting (`due` NULL) because such a
    /// node deleted the row before it without waking it. At start, and in the sweep every
    /// [`OUTBOX_REPAIR_PERIOD`](super::OUTBOX_REPAIR_PERIOD).
    pub(super) async fn repair_outbox(&self) -> Result<(), Failure> {
        self.fill_outbox_columns().await?;
        let client = self.client().await?;
        // Configs stored by a node of a build before `has_push` (migration 4) mark their task.
        client
            .execute(
                "UPDATE colloquy_tasks t SET has_push = TRUE WHERE NOT has_push \
                 AND EXISTS (SELECT 1 FROM colloquy_push_configs p \
                     WHERE p.conv_key = t.conv_key AND p.task_id = t.task_id)",
                &[],
            )
            .await?;
        client
            .execute(
                "UPDATE colloquy_outbox o SET due = now() WHERE o.due IS NULL \
                 AND NOT EXISTS (SELECT 1 FROM colloquy_outbox e \
                     WHERE e.conv_key = o.conv_key AND e.task_id = o.task_id \
                         AND e.lane = o.lane AND e.seq < o.seq)",
                &[],
            )
            .await?;
        Ok(())
    }

    /// Gives rows written before migration 3 their due time, lane and principal (from the
    /// record), where any are left.
    pub(super) async fn fill_outbox_columns(&self) -> Result<(), Failure> {
        let client = self.client().await?;
        loop {
            let rows = client
                .query(
                    "SELECT conv_key, seq, record FROM colloquy_outbox WHERE lane IS NULL \
                     LIMIT 500",
                    &[],
                )
                .await?;
            if rows.is_empty() {
                return Ok(());
            }
            for row in &rows {
                let notification: Notification = decode(row.try_get::<_, &str>("record")?)?;
                client
                    .execute(
                        "UPDATE colloquy_outbox SET lane = $2, principal_key = $3, \
                             due = COALESCE(due, CASE WHEN claimed_until > not_before \
                                 THEN claimed_until ELSE not_before END) \
                         WHERE conv_key = $4 AND seq = $1 AND lane IS NULL",
                        &[
                            &row.try_get::<_, i64>("seq")?,
                            &notification.lane().as_slice(),
                            &PrincipalKey::new(&notification.principal)
                                .as_bytes()
                                .as_slice(),
                            &row.try_get::<_, &[u8]>("conv_key")?,
                        ],
                    )
                    .await?;
            }
        }
    }

    /// Stores the next attempt and releases the claim, if the claim still holds.
    async fn reschedule(&self, notification: &Notification) -> Result<(), Failure> {
        let client = self.client().await?;
        let stored = Notification {
            claim: None,
            ..notification.clone()
        };
        client
            .execute(
                "UPDATE colloquy_outbox SET not_before = $2, due = $2, record = $3, \
                     claim_token = NULL, claimed_until = NULL \
                 WHERE conv_key = $5 AND seq = $1 AND claim_token IS NOT DISTINCT FROM $4",
                &[
                    &(notification.seq as i64),
                    &notification.not_before,
                    &encode(&stored),
                    &notification.claim,
                    &notification.conversation().as_bytes().as_slice(),
                ],
            )
            .await?;
        Ok(())
    }
}

impl PushStore for PgStore {
    fn put_push_config(
        &self,
        principal: &str,
        config: PushConfig,
        max_per_task: usize,
    ) -> BoxFuture<'static, Result<PushConfig, PushError>> {
        let principal = principal.to_owned();
        let put = self.run(move |ops| async move {
            retrying(|| ops.put_config(&principal, &config, max_per_task)).await
        });
        Box::pin(async move { put.await? })
    }

    fn push_config(
        &self,
        principal: &str,
        task_id: &str,
        config_id: &str,
    ) -> BoxFuture<'static, Result<PushConfig, PushError>> {
        let configs = self.push_configs(principal, task_id);
        let (task_id, config_id) = (task_id.to_owned(), config_id.to_owned());
        Box::pin(async move {
            configs
                .await?
                .into_iter()
                .find(|c| c.id == config_id)
                .ok_or(PushError::ConfigNotFound { task_id, config_id })
        })
    }

    fn push_configs(
        &self,
        principal: &str,
        task_id: &str,
    ) -> BoxFuture<'static, Result<Vec<PushConfig>, PushError>> {
        let (principal, task_id) = (principal.to_owned(), task_id.to_owned());
        let read = self
            .run(move |ops| async move { retrying(|| ops.configs(&principal, &task_id)).await });
        Box::pin(async move { read.await? })
    }

    fn delete_push_config(
        &self,
        principal: &str,
        task_id: &str,
        config_id: &str,
    ) -> BoxFuture<'static, Result<(), PushError>> {
        let (principal, task_id, config_id) = (
            principal.to_owned(),
            task_id.to_owned(),
            config_id.to_owned(),
        );
        let deleted = self.run(move |ops| async move {
            retrying(|| ops.delete_config(&principal, &task_id, &config_id)).await
        });
        Box::pin(async move { deleted.await? })
    }

    fn pending_notifications(
        &self,
        limit: usize,
    ) -> BoxFuture<'static, StoreResult<Vec<Notification>>> {
        self.run(move |ops| async move { retrying(|| ops.pending(limit)).await })
    }

    fn due_notifications(&self, limit: usize) -> BoxFuture<'static, StoreResult<DueNotifications>> {
        self.run(move |ops| async move { retrying(|| ops.due(limit)).await })
    }

    fn pending_count(&self) -> BoxFuture<'static, StoreResult<usize>> {
        self.run(|ops| async move { retrying(|| ops.pending_count()).await })
    }

    fn pending_of(&self, principal: &str, limit: usize) -> BoxFuture<'static, StoreResult<usize>> {
        let principal = principal.to_owned();
        self.run(move |ops| async move { retrying(|| ops.pending_of(&principal, limit)).await })
    }

    fn claim_notification(
        &self,
        notification: Notification,
        hold: Duration,
    ) -> BoxFuture<'static, StoreResult<Option<Notification>>> {
        self.run(move |ops| async move { retrying(|| ops.claim(&notification, hold)).await })
    }

    fn notification_delivered(
        &self,
        notification: &Notification,
    ) -> BoxFuture<'static, StoreResult<()>> {
        let at = OutboxRow::of(notification);
        self.run(move |ops| async move { retrying(|| ops.remove(&at)).await })
    }

    fn reschedule_notification(
        &self,
        notification: Notification,
    ) -> BoxFuture<'static, StoreResult<()>> {
        self.run(move |ops| async move { retrying(|| ops.reschedule(&notification)).await })
    }

    /// Removed as a delivered one is: the next of its lane is due.
    fn give_up_notification(
        &self,
        notification: &Notification,
    ) -> BoxFuture<'static, StoreResult<()>> {
        self.notification_delivered(notification)
    }

    fn outbox_waker(&self) -> Arc<tokio::sync::Notify> {
        self.ops.outbox.clone()
    }
}
