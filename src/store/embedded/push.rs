//! The embedded store's push-notification side: configs kept beside their task and the outbox.
//!
//! Keys (beside `records.rs`'s):
//! - `n` ++ task id ++ 0xFF ++ config id -> [`StoredConfig`] (0xFF never occurs in UTF-8, so
//!   one task's prefix never covers another's)
//! - `o` ++ seq (u64 BE)                  -> [`Notification`], in the order of the changes
//! - `d` ++ due (ns, u64 BE) ++ seq       -> (): the due index the worker reads, earliest first
//! - `q` ++ lane (16 bytes) ++ seq        -> its due (ns, u64 BE) in the due index, or empty
//!   while it waits behind an earlier one of its lane (set aside, not in the due index)
//! - `P` ++ principal key ++ seq          -> (): the principal's pending notifications
//!
//! Outbox entries and their index entries are written by the task-changing operations of
//! `ops.rs`, in their own batch ([`enqueue`]), so a status change and its notifications are
//! durable together or not at all; every later change of a notification moves its index entries
//! in the same batch. All writes run in order on the store thread, so a lane's check and its
//! change never interleave with another write.

use super::EmbeddedStore;
use super::records::{Records, TaskRecord, WriteBatch, decode, encode};
use crate::model::PushConfig;
use crate::store::{
    DueNotifications, Notification, PrincipalKey, PushError, PushStore, StoreResult,
};
use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use std::ops::Bound;
use std::sync::atomic::Ordering;

const CONFIG: u8 = b'n';
const OUTBOX: u8 = b'o';
const DUE: u8 = b'd';
const LANE: u8 = b'q';
const BY_PRINCIPAL: u8 = b'P';
/// Written once the index entries of every outbox entry exist (a store written before them
/// gets them at open).
const INDEXED: &[u8] = b"#outbox-indexed";

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

/// Nanoseconds since the epoch (0 before it): big-endian, they sort as the times do.
fn nanos(at: DateTime<Utc>) -> u64 {
    at.timestamp_nanos_opt().unwrap_or(i64::MAX).max(0) as u64
}

fn due_key(due: u64, seq: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(17);
    key.push(DUE);
    key.extend_from_slice(&due.to_be_bytes());
    key.extend_from_slice(&seq.to_be_bytes());
    key
}

fn lane_prefix(lane: &[u8; 16]) -> Vec<u8> {
    let mut key = Vec::with_capacity(25);
    key.push(LANE);
    key.extend_from_slice(lane);
    key
}

fn lane_entry(lane: &[u8; 16], seq: u64) -> Vec<u8> {
    let mut key = lane_prefix(lane);
    key.extend_from_slice(&seq.to_be_bytes());
    key
}

fn principal_prefix(principal: &str) -> Vec<u8> {
    let mut key = vec![BY_PRINCIPAL];
    key.extend_from_slice(PrincipalKey::new(principal).as_bytes());
    key
}

fn principal_entry(principal: &str, seq: u64) -> Vec<u8> {
    let mut key = principal_prefix(principal);
    key.extend_from_slice(&seq.to_be_bytes());
    key
}

/// The u64 at the end of a key.
fn trailing_u64(key: &[u8]) -> u64 {
    let mut bytes = [0u8; 8];
    if key.len() >= 8 {
        bytes.copy_from_slice(&key[key.len() - 8..]);
    }
    u64::from_be_bytes(bytes)
}

/// Adds the notification to `batch` with its index entries, due at its `not_before`.
fn put_notification(batch: &mut WriteBatch, notification: &Notification) {
    let seq = notification.seq;
    batch.put_raw(outbox_key(seq), encode(notification));
    put_index_entries(batch, notification);
}

fn put_index_entries(batch: &mut WriteBatch, notification: &Notification) {
    let (seq, due) = (notification.seq, nanos(notification.not_before));
    batch.put_raw(due_key(due, seq), Vec::new());
    batch.put_raw(
        lane_entry(&notification.lane(), seq),
        due.to_be_bytes().to_vec(),
    );
    batch.put_raw(principal_entry(&notification.principal, seq), Vec::new());
}

/// The first entries of a lane: (seq, due if in the due index), oldest first.
fn lane_entries(
    records: &Records,
    lane: &[u8; 16],
    limit: usize,
) -> StoreResult<Vec<(u64, Option<u64>)>> {
    let prefix = lane_prefix(lane);
    let scan = records
        .backend()
        .scan(Bound::Included(prefix.clone()), Bound::Unbounded, false);
    let mut entries = Vec::new();
    for entry in scan {
        let (key, value) = entry?;
        if !key.starts_with(&prefix) || entries.len() >= limit {
            break;
        }
        let due = (value.len() == 8).then(|| trailing_u64(&value));
        entries.push((trailing_u64(&key), due));
    }
    Ok(entries)
}

/// Gives every outbox entry written before the index its index entries (at open, once an
/// outbox is there). Entries that have theirs are left alone (putting them again could leave
/// a second due entry), so an outbox empty at one open and filled since is only checked.
pub(super) fn index_outbox(records: &Records) -> StoreResult<()> {
    if records.backend().get(INDEXED)?.is_some() {
        return Ok(());
    }
    let pending: Vec<Notification> = scan_prefix(records, &[OUTBOX], usize::MAX)?;
    if pending.is_empty() {
        // Nothing to index: no write (a fresh store opens without one).
        return Ok(());
    }
    let mut batch = WriteBatch::new();
    let mut indexed = 0;
    for notification in &pending {
        let entry = lane_entry(&notification.lane(), notification.seq);
        if records.backend().get(&entry)?.is_none() {
            put_index_entries(&mut batch, notification);
            indexed += 1;
        }
    }
    batch.put_raw(INDEXED.to_vec(), Vec::new());
    records.apply(batch)?;
    records.backend().flush()?;
    if indexed > 0 {
        tracing::info!(
            notifications = indexed,
            "indexed the push outbox by due time"
        );
    }
    Ok(())
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
/// holds it; `trace` is the turn's (its lease's), if any. Called by every operation that
/// changes a task's status.
pub(super) fn enqueue(
    records: &Records,
    batch: &mut WriteBatch,
    record: &TaskRecord,
    trace: Option<&str>,
) -> StoreResult<()> {
    enqueue_with(records, batch, record, trace, "", &[])
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
    trace: Option<&str>,
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
            trace: trace.map(str::to_owned),
            last_error: None,
        };
        put_notification(batch, &notification);
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

fn stored_notification(records: &Records, seq: u64) -> StoreResult<Option<Notification>> {
    records
        .backend()
        .get(&outbox_key(seq))?
        .map(|value| decode(&value))
        .transpose()
}

/// Removes a notification with its index entries; the next of its lane, if set aside, is due
/// now.
fn remove_notification(records: &Records, seq: u64) -> StoreResult<()> {
    let Some(notification) = stored_notification(records, seq)? else {
        return Ok(());
    };
    let lane = notification.lane();
    let mut batch = WriteBatch::new();
    let entries = lane_entries(records, &lane, 2)?;
    if let Some((_, Some(due))) = entries.iter().find(|(s, _)| *s == seq) {
        batch.delete_raw(due_key(*due, seq));
    }
    batch.delete_raw(outbox_key(seq));
    batch.delete_raw(lane_entry(&lane, seq));
    batch.delete_raw(principal_entry(&notification.principal, seq));
    if let Some((next, None)) = entries.iter().find(|(s, _)| *s != seq) {
        let due = nanos(crate::model::now());
        batch.put_raw(due_key(due, *next), Vec::new());
        batch.put_raw(lane_entry(&lane, *next), due.to_be_bytes().to_vec());
    }
    records.apply(batch)
}

/// Stores the notification's next attempt and moves its due index entry.
fn reschedule(records: &Records, notification: &Notification) -> StoreResult<()> {
    let (seq, lane) = (notification.seq, notification.lane());
    // Delivered or given up meanwhile (a duplicate worker): leave it gone.
    let Some(stored) = records.backend().get(&lane_entry(&lane, seq))? else {
        return Ok(());
    };
    let mut batch = WriteBatch::new();
    if stored.len() == 8 {
        batch.delete_raw(due_key(trailing_u64(&stored), seq));
    }
    put_notification(&mut batch, notification);
    records.apply(batch)
}

/// Whether `seq` is the first of its lane (None: it is gone).
fn first_of_lane(records: &Records, lane: &[u8; 16], seq: u64) -> StoreResult<Option<bool>> {
    let entries = lane_entries(records, lane, 1)?;
    Ok(match entries.first() {
        Some((first, _)) if *first == seq => Some(true),
        Some((first, _)) if *first < seq => {
            let stored = records.backend().get(&lane_entry(lane, seq))?;
            stored.map(|_| false)
        }
        _ => None,
    })
}

/// The notification if it is the first of its lane; else sets it aside (out of the due index)
/// until the one before it is removed.
fn claim_or_set_aside(
    records: &Records,
    notification: Notification,
) -> StoreResult<Option<Notification>> {
    let (seq, lane) = (notification.seq, notification.lane());
    match first_of_lane(records, &lane, seq)? {
        Some(true) => Ok(Some(notification)),
        None => Ok(None),
        Some(false) => {
            let entry = lane_entry(&lane, seq);
            if let Some(stored) = records.backend().get(&entry)?
                && stored.len() == 8
            {
                let mut batch = WriteBatch::new();
                batch.delete_raw(due_key(trailing_u64(&stored), seq));
                batch.put_raw(entry, Vec::new());
                records.apply(batch)?;
            }
            Ok(None)
        }
    }
}

/// Up to `limit` notifications of the due index due by now, and when the next is due.
fn due_now(records: &Records, limit: usize) -> StoreResult<DueNotifications> {
    let now = nanos(crate::model::now());
    let mut found = DueNotifications::default();
    let scan = records
        .backend()
        .scan(Bound::Included(vec![DUE]), Bound::Unbounded, false);
    for entry in scan {
        let (key, _) = entry?;
        if key.len() != 17 || key[0] != DUE {
            break;
        }
        let due = trailing_u64(&key[..9]);
        if due > now || found.due.len() >= limit {
            found.next_due = Some(DateTime::from_timestamp_nanos(
                due.min(i64::MAX as u64) as i64
            ));
            break;
        }
        if let Some(notification) = stored_notification(records, trailing_u64(&key))? {
            found.due.push(notification);
        }
    }
    Ok(found)
}

fn count_prefix(records: &Records, prefix: &[u8], limit: usize) -> StoreResult<usize> {
    let mut count = 0;
    let scan = records
        .backend()
        .scan(Bound::Included(prefix.to_vec()), Bound::Unbounded, false);
    for entry in scan {
        if count >= limit || !entry?.0.starts_with(prefix) {
            break;
        }
        count += 1;
    }
    Ok(count)
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

    fn due_notifications(&self, limit: usize) -> BoxFuture<'static, StoreResult<DueNotifications>> {
        let read = self.read(move |records| due_now(records, limit));
        let this = self.clone();
        Box::pin(async move {
            let found = read.await?;
            // As `pending_notifications`: only what a flush has followed.
            if !found.due.is_empty() {
                this.write(|_, _| Ok(())).await?;
            }
            Ok(found)
        })
    }

    fn pending_count(&self) -> BoxFuture<'static, StoreResult<usize>> {
        self.read(|records| count_prefix(records, &[OUTBOX], usize::MAX))
    }

    fn pending_of(&self, principal: &str, limit: usize) -> BoxFuture<'static, StoreResult<usize>> {
        let prefix = principal_prefix(principal);
        self.read(move |records| count_prefix(records, &prefix, limit))
    }

    fn claim_notification(
        &self,
        notification: Notification,
        _hold: std::time::Duration,
    ) -> BoxFuture<'static, StoreResult<Option<Notification>>> {
        // Nobody shares this outbox: only the lane's order decides. Most are their lane's
        // first, which a read shows; setting one aside is a write (rechecked there).
        let (seq, lane) = (notification.seq, notification.lane());
        let first = self.read(move |records| first_of_lane(records, &lane, seq));
        let this = self.clone();
        Box::pin(async move {
            match first.await? {
                Some(true) => Ok(Some(notification)),
                None => Ok(None),
                Some(false) => {
                    this.write(move |records, _| claim_or_set_aside(records, notification))
                        .await
                }
            }
        })
    }

    fn notification_delivered(
        &self,
        notification: &Notification,
    ) -> BoxFuture<'static, StoreResult<()>> {
        let seq = notification.seq;
        self.write(move |records, _| remove_notification(records, seq))
    }

    fn reschedule_notification(
        &self,
        notification: Notification,
    ) -> BoxFuture<'static, StoreResult<()>> {
        self.write(move |records, _| reschedule(records, &notification))
    }

    /// Removed as a delivered one is: the next of its lane is due.
    fn give_up_notification(
        &self,
        notification: &Notification,
    ) -> BoxFuture<'static, StoreResult<()>> {
        self.notification_delivered(notification)
    }

    fn outbox_waker(&self) -> std::sync::Arc<tokio::sync::Notify> {
        self.outbox.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Task, TaskState, TaskStatus};
    use crate::store::embedded::{SledBackend, SledOptions};
    use std::sync::Arc;

    fn notification(seq: u64, task_id: &str) -> Notification {
        let now = crate::model::now();
        Notification {
            id: format!("n{seq}"),
            seq,
            principal: "alice".into(),
            config: PushConfig {
                id: "hook".into(),
                task_id: task_id.into(),
                url: "https://hooks.example/".into(),
                token: None,
                authentication: None,
                wire_version: "1.0".into(),
            },
            task: Task {
                id: task_id.into(),
                context_id: "ctx".into(),
                status: TaskStatus::new(TaskState::Working, None),
                artifacts: Vec::new(),
                history: Vec::new(),
                metadata: None,
            },
            created_at: now,
            attempts: 0,
            not_before: now,
            claim: None,
            trace: None,
            last_error: None,
        }
    }

    /// An outbox written before the due index (records only) gets its index entries at open,
    /// once: a second pass adds no second due entry.
    #[test]
    fn an_outbox_written_before_the_index_is_indexed_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let backend = SledBackend::open_with(dir.path(), &SledOptions::with_cache(1 << 20));
        let records = Records::new(Arc::new(backend.unwrap()));
        index_outbox(&records).unwrap();
        assert_eq!(records.backend().get(INDEXED).unwrap(), None, "no write");
        let mut batch = WriteBatch::new();
        for (seq, task) in [(1, "a"), (2, "a"), (3, "b")] {
            batch.put_raw(outbox_key(seq), encode(&notification(seq, task)));
        }
        records.apply(batch).unwrap();
        index_outbox(&records).unwrap();
        let seqs = |found: DueNotifications| found.due.iter().map(|n| n.seq).collect::<Vec<_>>();
        assert_eq!(seqs(due_now(&records, 10).unwrap()), [1, 2, 3]);
        assert_eq!(
            count_prefix(&records, &principal_prefix("alice"), 10).unwrap(),
            3
        );
        // #2 waits behind #1; indexing again (the marker lost) leaves it aside.
        assert_eq!(
            claim_or_set_aside(&records, notification(2, "a")).unwrap(),
            None
        );
        records
            .backend()
            .apply(vec![crate::store::embedded::KvOp::Delete(INDEXED.to_vec())])
            .unwrap();
        index_outbox(&records).unwrap();
        assert_eq!(seqs(due_now(&records, 10).unwrap()), [1, 3]);
        assert_eq!(count_prefix(&records, &[DUE], usize::MAX).unwrap(), 2);
        remove_notification(&records, 1).unwrap();
        assert_eq!(seqs(due_now(&records, 10).unwrap()), [3, 2]);
    }
}
