//! The embedded store's push-notification side: configs kept beside their task and the outbox.
//!
//! Keys (beside `records.rs`'s):
//! - `n` ++ task id ++ 0xFF ++ config id -> [`StoredConfig`] (0xFF never occurs in UTF-8, so
//!   one task's prefix never covers another's)
//! - `o` ++ seq (u64 BE)                  -> [`Notification`], in the order of the changes
//!
//! Outbox entries are written by the task-changing operations of `ops.rs`, in their own batch
//! ([`enqueue`]), so a status change and its notifications are durable together or not at all.

use super::EmbeddedStore;
use super::records::{Records, TaskRecord, WriteBatch, decode, encode};
use crate::model::PushConfig;
use crate::store::{Notification, PushError, PushStore, StoreResult};
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use std::ops::Bound;
use std::sync::atomic::Ordering;

const CONFIG: u8 = b'n';
const OUTBOX: u8 = b'o';

/// A config and the principal it belongs to.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredConfig {
    principal: String,
    config: PushConfig,
}

fn config_prefix(task_id: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(task_id.len() + 2);
    key.push(CONFIG);
    key.extend_from_slice(task_id.as_bytes());
    key.push(0xFF);
    key
}

fn config_key(task_id: &str, config_id: &str) -> Vec<u8> {
    let mut key = config_prefix(task_id);
    key.extend_from_slice(config_id.as_bytes());
    key
}

fn outbox_key(seq: u64) -> Vec<u8> {
    let mut key = vec![OUTBOX];
    key.extend_from_slice(&seq.to_be_bytes());
    key
}

/// Every value under `prefix`, in key order.
fn scan_prefix<T: for<'de> Deserialize<'de>>(
    records: &Records,
    prefix: &[u8],
    limit: usize,
) -> StoreResult<Vec<T>> {
    let mut items = Vec::new();
    let scan = records
        .backend()
        .scan(Bound::Included(prefix.to_vec()), Bound::Unbounded, false);
    for entry in scan {
        let (key, value) = entry?;
        if !key.starts_with(prefix) || items.len() >= limit {
            break;
        }
        items.push(decode(&value)?);
    }
    Ok(items)
}

fn configs_of(records: &Records, task_id: &str) -> StoreResult<Vec<StoredConfig>> {
    if !records.push_configs_stored.load(Ordering::Relaxed) {
        return Ok(Vec::new());
    }
    scan_prefix(records, &config_prefix(task_id), usize::MAX)
}

/// Notes whether any config is stored (at open): a store that never had one skips the lookup
/// of a task's configs at every status change.
pub(super) fn note_stored_configs(records: &Records) -> StoreResult<()> {
    let first = records
        .backend()
        .scan(Bound::Included(vec![CONFIG]), Bound::Unbounded, false)
        .next()
        .transpose()?;
    let any = first.is_some_and(|(key, _)| key.first() == Some(&CONFIG));
    records.push_configs_stored.store(any, Ordering::Relaxed);
    Ok(())
}

/// Adds a config write to `batch`; from now on status changes look for configs.
fn put_stored(records: &Records, batch: &mut WriteBatch, stored: &StoredConfig) {
    records.push_configs_stored.store(true, Ordering::Relaxed);
    batch.put_raw(
        config_key(&stored.config.task_id, &stored.config.id),
        encode(stored),
    );
}

/// Adds to `batch` one notification per config of the task, reporting its state as `record`
/// holds it. Called by every operation that changes a task's status.
pub(super) fn enqueue(
    records: &Records,
    batch: &mut WriteBatch,
    record: &TaskRecord,
) -> StoreResult<()> {
    enqueue_with(records, batch, record, "", &[])
}

/// Stores the configs a send registers, in the batch that starts its task.
pub(super) fn put_with_start(
    records: &Records,
    principal: &str,
    configs: &[PushConfig],
    task_id: &str,
    batch: &mut WriteBatch,
) {
    for config in configs {
        let stored = StoredConfig {
            principal: principal.to_owned(),
            config: PushConfig {
                task_id: task_id.to_owned(),
                ..config.clone()
            },
        };
        put_stored(records, batch, &stored);
    }
}

/// [`enqueue`], counting also configs written earlier in the same batch (a send's own).
pub(super) fn enqueue_with(
    records: &Records,
    batch: &mut WriteBatch,
    record: &TaskRecord,
    principal: &str,
    added: &[PushConfig],
) -> StoreResult<()> {
    let mut configs = configs_of(records, &record.task.id)?;
    for config in added {
        configs.retain(|stored| stored.config.id != config.id);
        configs.push(StoredConfig {
            principal: principal.to_owned(),
            config: PushConfig {
                task_id: record.task.id.clone(),
                ..config.clone()
            },
        });
    }
    if configs.is_empty() {
        return Ok(());
    }
    let mut task = record.task.clone();
    task.history.clear();
    let now = crate::model::now();
    for stored in configs {
        let seq = crate::store::outbox_seq(0);
        let notification = Notification {
            id: uuid::Uuid::new_v4().to_string(),
            seq,
            principal: stored.principal,
            config: stored.config,
            task: task.clone(),
            created_at: now,
            attempts: 0,
            not_before: now,
            claim: None,
        };
        batch.put_raw(outbox_key(seq), encode(&notification));
    }
    Ok(())
}

/// The keys of a task's configs (removed with its conversation).
pub(super) fn config_keys(records: &Records, task_id: &str) -> StoreResult<Vec<Vec<u8>>> {
    Ok(configs_of(records, task_id)?
        .into_iter()
        .map(|stored| config_key(task_id, &stored.config.id))
        .collect())
}

/// The task's configs if it is the principal's; else not found.
fn owned_configs(
    records: &Records,
    principal: &str,
    task_id: &str,
) -> Result<Vec<PushConfig>, PushError> {
    let owned = records
        .task(task_id)?
        .is_some_and(|record| record.principal == principal);
    if !owned {
        return Err(PushError::TaskNotFound(task_id.to_owned()));
    }
    Ok(configs_of(records, task_id)?
        .into_iter()
        .map(|stored| stored.config)
        .collect())
}

fn put_config(
    records: &Records,
    principal: &str,
    config: PushConfig,
    max_per_task: usize,
) -> Result<PushConfig, PushError> {
    let existing = owned_configs(records, principal, &config.task_id)?;
    let replaces = existing.iter().any(|c| c.id == config.id);
    if !replaces && existing.len() >= max_per_task {
        return Err(PushError::TooManyConfigs {
            task_id: config.task_id,
            limit: max_per_task,
        });
    }
    let mut batch = WriteBatch::new();
    let stored = StoredConfig {
        principal: principal.to_owned(),
        config: config.clone(),
    };
    put_stored(records, &mut batch, &stored);
    records.apply(batch)?;
    Ok(config)
}

fn not_found(task_id: &str, config_id: &str) -> PushError {
    PushError::ConfigNotFound {
        task_id: task_id.to_owned(),
        config_id: config_id.to_owned(),
    }
}

fn delete_config(
    records: &Records,
    principal: &str,
    task_id: &str,
    config_id: &str,
) -> Result<(), PushError> {
    let existing = owned_configs(records, principal, task_id)?;
    if !existing.iter().any(|c| c.id == config_id) {
        return Err(not_found(task_id, config_id));
    }
    let mut batch = WriteBatch::new();
    batch.delete_raw(config_key(task_id, config_id));
    records.apply(batch)?;
    Ok(())
}

fn remove_notification(records: &Records, seq: u64) -> StoreResult<()> {
    let mut batch = WriteBatch::new();
    batch.delete_raw(outbox_key(seq));
    records.apply(batch)
}

impl PushStore for EmbeddedStore {
    fn put_push_config(
        &self,
        principal: &str,
        config: PushConfig,
        max_per_task: usize,
    ) -> BoxFuture<'static, Result<PushConfig, PushError>> {
        let principal = principal.to_owned();
        let written =
            self.write(move |records, _| Ok(put_config(records, &principal, config, max_per_task)));
        Box::pin(async move { written.await? })
    }

    fn push_config(
        &self,
        principal: &str,
        task_id: &str,
        config_id: &str,
    ) -> BoxFuture<'static, Result<PushConfig, PushError>> {
        let (principal, task_id, config_id) = (
            principal.to_owned(),
            task_id.to_owned(),
            config_id.to_owned(),
        );
        let read = self.read(move |records| {
            Ok(
                owned_configs(records, &principal, &task_id).and_then(|configs| {
                    configs
                        .into_iter()
                        .find(|c| c.id == config_id)
                        .ok_or_else(|| not_found(&task_id, &config_id))
                }),
            )
        });
        Box::pin(async move { read.await? })
    }

    fn push_configs(
        &self,
        principal: &str,
        task_id: &str,
    ) -> BoxFuture<'static, Result<Vec<PushConfig>, PushError>> {
        let (principal, task_id) = (principal.to_owned(), task_id.to_owned());
        let read = self.read(move |records| Ok(owned_configs(records, &principal, &task_id)));
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
        let written = self
            .write(move |records, _| Ok(delete_config(records, &principal, &task_id, &config_id)));
        Box::pin(async move { written.await? })
    }

    fn pending_notifications(
        &self,
        limit: usize,
    ) -> BoxFuture<'static, StoreResult<Vec<Notification>>> {
        let read = self.read(move |records| scan_prefix(records, &[OUTBOX], limit));
        let this = self.clone();
        Box::pin(async move {
            let pending = read.await?;
            // What the read saw was applied, not necessarily durable: answer once a flush has
            // followed it, so no notification goes out for a change a crash could still undo.
            if !pending.is_empty() {
                this.write(|_, _| Ok(())).await?;
            }
            Ok(pending)
        })
    }

    fn pending_count(&self) -> BoxFuture<'static, StoreResult<usize>> {
        self.read(|records| {
            let prefix = [OUTBOX];
            let mut count = 0;
            let scan =
                records
                    .backend()
                    .scan(Bound::Included(prefix.to_vec()), Bound::Unbounded, false);
            for entry in scan {
                if !entry?.0.starts_with(&prefix) {
                    break;
                }
                count += 1;
            }
            Ok(count)
        })
    }

    fn notification_delivered(&self, seq: u64) -> BoxFuture<'static, StoreResult<()>> {
        self.write(move |records, _| remove_notification(records, seq))
    }

    fn reschedule_notification(
        &self,
        notification: Notification,
    ) -> BoxFuture<'static, StoreResult<()>> {
        self.write(move |records, _| {
            // Delivered or given up meanwhile (a duplicate worker): leave it gone.
            let key = outbox_key(notification.seq);
            if records.backend().get(&key)?.is_none() {
                return Ok(());
            }
            let mut batch = WriteBatch::new();
            batch.put_raw(key, encode(&notification));
            records.apply(batch)
        })
    }

    fn give_up_notification(&self, seq: u64) -> BoxFuture<'static, StoreResult<()>> {
        self.write(move |records, _| remove_notification(records, seq))
    }

    fn outbox_waker(&self) -> std::sync::Arc<tokio::sync::Notify> {
        self.outbox.clone()
    }
}
