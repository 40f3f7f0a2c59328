//! The embedded store: sled behind colloquy's write-ahead log, one process per data folder.
//!
//! Writes are the store's own operations (`ops.rs`), run in order on one store thread with group
//! commit (`writer.rs`): each answers once a flush that followed it is on disk. Reads run on
//! blocking threads. What is synced when, so that an acknowledged write survives a power cut:
//! `docs/durability.md`.

mod compact;
mod console;
mod kv;
mod ops;
mod push;
mod records;
mod sled_backend;
mod wal;
mod writer;

pub use kv::{KvBackend, KvOp};
pub use ops::Existing;
pub use sled_backend::{
    DEFAULT_COMPRESSION_LEVEL, DEFAULT_LEAF_FANOUT, DEFAULT_SEGMENT_CLEANUP_PERCENT,
    DEFAULT_SNAPSHOT_LOG_BYTES, MAX_LEAF_FANOUT, MIN_LEAF_FANOUT, SEGMENT_CLEANUP_PERCENTS,
    SledBackend,
};
pub use wal::{
    DEFAULT_CHECKPOINT_EVERY, DEFAULT_CHECKPOINT_MAX_WAIT, DEFAULT_CHECKPOINT_MIN_BYTES,
    DEFAULT_MEMTABLE_BYTES, WalLimits,
};

use super::{
    BeginTurn, ConversationKey, ConversationMeta, ConversationPage, ConversationRecords,
    ConversationStore, FinishTurn, Imported, Lease, MessagesFrom, Page, StoreError, StoreResult,
    StreamOutline, TaskQuery, TurnBegun,
};
use crate::model::{Message, Task, TaskStatus};
use futures_util::future::BoxFuture;
use ops::LiveTurns;
use records::Records;
use std::path::Path;
use std::sync::Arc;
use wal::WalBackend;
use writer::GroupCommit;

/// How the embedded store is tuned.
#[derive(Clone, Debug)]
pub struct SledOptions {
    /// sled's page cache.
    pub cache_bytes: u64,
    /// How often the write-ahead log's memtable moves into sled, and how large it may grow.
    pub wal: WalLimits,
    /// sled's log written between its recovery snapshots (see [`SledBackend`]).
    pub snapshot_log_bytes: u64,
    /// zstd level for a folder created now (None: uncompressed); see [`SledBackend::open_with`].
    pub zstd_level: Option<i32>,
    /// Entries a sled leaf holds before it splits: fewer, larger pages.
    pub leaf_fanout: usize,
    /// Live share (percent) at or below which sled cleans a segment: higher takes less disk
    /// and more rewriting.
    pub segment_cleanup_percent: usize,
}

impl SledOptions {
    /// The defaults, with a `cache_bytes` page cache and the folder uncompressed.
    pub fn with_cache(cache_bytes: u64) -> Self {
        SledOptions {
            cache_bytes,
            wal: WalLimits::default(),
            snapshot_log_bytes: DEFAULT_SNAPSHOT_LOG_BYTES,
            zstd_level: None,
            leaf_fanout: DEFAULT_LEAF_FANOUT,
            segment_cleanup_percent: DEFAULT_SEGMENT_CLEANUP_PERCENT,
        }
    }
}

#[derive(Clone)]
pub struct EmbeddedStore {
    records: Records,
    writer: Arc<GroupCommit>,
    live: Arc<LiveTurns>,
    /// Told when a status change (and so perhaps a notification) is durable (`push.rs`).
    outbox: Arc<tokio::sync::Notify>,
}

impl EmbeddedStore {
    /// sled in `path`, behind the write-ahead log in `path/wal`. Blocks (opening reads the disk).
    pub fn open(path: &Path, options: &SledOptions) -> StoreResult<Self> {
        let started = std::time::Instant::now();
        let sled = SledBackend::open_with(path, options)?;
        let sled_opened = started.elapsed();
        let log = WalBackend::open(sled, &path.join("wal"), options.wal)?;
        tracing::info!(
            folder = %path.display(),
            sled = ?sled_opened,
            total = ?started.elapsed(),
            "opened the data folder"
        );
        EmbeddedStore::over(Arc::new(log))
    }

    /// sled in `path` with a `cache_bytes` page cache and the default checkpoint interval.
    pub fn open_sled(path: &Path, cache_bytes: u64) -> StoreResult<Self> {
        EmbeddedStore::open(path, &SledOptions::with_cache(cache_bytes))
    }

    /// The store over any ordered key-value backend, with its own store thread.
    pub fn over(backend: Arc<dyn KvBackend>) -> StoreResult<Self> {
        let records = Records::new(backend);
        push::note_stored_configs(&records)?;
        push::index_outbox(&records)?;
        Ok(EmbeddedStore {
            writer: Arc::new(GroupCommit::start(records.clone())?),
            records,
            live: Arc::new(LiveTurns::default()),
            outbox: Arc::new(tokio::sync::Notify::new()),
        })
    }

    /// The latest `limit` messages of a conversation, oldest first (the CLI's history).
    pub fn recent_messages(
        &self,
        key: ConversationKey,
        limit: usize,
    ) -> BoxFuture<'static, StoreResult<Vec<Message>>> {
        self.read(move |records| {
            let Some(stored) = records.conversation(&key)? else {
                return Ok(Vec::new());
            };
            let meta = &stored.meta;
            let recent =
                records.recent_messages(&stored.place, &meta.context_id, meta.next_seq, limit)?;
            Ok(recent.into_iter().map(|(_, m)| m).collect())
        })
    }

    /// Stores conversations with their messages and tasks as given, in one atomic, durable
    /// write; `existing` says what becomes of conversations already stored (benchmarks bulk
    /// load with [`Existing::Overwrite`]). Never while a server uses the conversations.
    pub fn import(
        &self,
        items: Vec<ConversationRecords>,
        existing: Existing,
    ) -> BoxFuture<'static, StoreResult<Imported>> {
        self.write(move |records, _| ops::import(records, items, existing))
    }

    /// The ids of the tasks stored as running: one scan of the running-task index.
    pub fn running_tasks(&self) -> BoxFuture<'static, StoreResult<Vec<String>>> {
        self.read(|records| records.running_tasks())
    }

    /// Runs a store operation on the store thread; resolves once its writes are on disk.
    fn write<T: Send + 'static>(
        &self,
        op: impl FnOnce(&Records, &LiveTurns) -> StoreResult<T> + Send + 'static,
    ) -> BoxFuture<'static, StoreResult<T>> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let live = self.live.clone();
        let job: writer::Job = Box::new(move |records| {
            let result = op(records, &live);
            Box::new(move |flushed: &StoreResult<()>| {
                let result = match (result, flushed) {
                    (Ok(value), Ok(())) => Ok(value),
                    (Ok(_), Err(e)) => Err(e.clone()),
                    (Err(e), _) => Err(e),
                };
                let _ = answer.send(result);
            })
        });
        let submitted = self.writer.submit(job);
        Box::pin(async move {
            if !submitted {
                return Err(StoreError::Closed);
            }
            answered.await.unwrap_or(Err(StoreError::Closed))
        })
    }

    /// A write that changes a task's status, and so may add notifications to the outbox: wakes
    /// the delivery worker once it is durable.
    fn status_write<T: Send + 'static>(
        &self,
        op: impl FnOnce(&Records, &LiveTurns) -> StoreResult<T> + Send + 'static,
    ) -> BoxFuture<'static, StoreResult<T>> {
        let written = self.write(op);
        let outbox = self.outbox.clone();
        Box::pin(async move {
            let result = written.await;
            outbox.notify_one();
            result
        })
    }

    /// Runs a read on a blocking thread (it may touch the disk).
    fn read<T: Send + 'static>(
        &self,
        op: impl FnOnce(&Records) -> StoreResult<T> + Send + 'static,
    ) -> BoxFuture<'static, StoreResult<T>> {
        let records = self.records.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || op(&records))
                .await
                .map_err(|e| StoreError::backend("store read", e))?
        })
    }
}

impl ConversationStore for EmbeddedStore {
    fn console_conversations(
        &self,
        filter: super::ConversationFilter,
    ) -> BoxFuture<'static, StoreResult<Page<ConversationMeta>>> {
        self.read(move |records| console::conversations(records, &filter))
    }

    fn held_leases(&self, limit: usize) -> BoxFuture<'static, StoreResult<Vec<super::HeldLease>>> {
        self.read(move |records| console::held_leases(records, limit))
    }

    fn begin_turn(&self, turn: BeginTurn) -> BoxFuture<'static, StoreResult<TurnBegun>> {
        self.status_write(move |records, live| ops::begin(records, live, turn))
    }

    fn record_status(
        &self,
        lease: &Lease,
        status: TaskStatus,
    ) -> BoxFuture<'static, StoreResult<()>> {
        let lease = lease.clone();
        self.status_write(move |records, live| ops::record_status(records, live, &lease, status))
    }

    fn renew_lease(&self, lease: &Lease) -> BoxFuture<'static, StoreResult<()>> {
        // The lease lives in this process: renewing it writes nothing, only checks it holds.
        Box::pin(std::future::ready(ops::renew(&self.live, lease)))
    }

    fn finish_turn(&self, end: FinishTurn) -> BoxFuture<'static, StoreResult<()>> {
        self.status_write(move |records, live| ops::finish(records, live, end))
    }

    fn cancel_waiting(
        &self,
        principal: &str,
        task_id: &str,
    ) -> BoxFuture<'static, StoreResult<Task>> {
        let (principal, task_id) = (principal.to_owned(), task_id.to_owned());
        self.status_write(move |records, live| {
            ops::cancel_waiting(records, live, &principal, &task_id)
        })
    }

    fn fail_interrupted_turns(&self) -> BoxFuture<'static, StoreResult<usize>> {
        let this = self.clone();
        Box::pin(async move {
            // A clean stop leaves the index empty: then start-up writes (and flushes) nothing.
            let running = this.running_tasks().await?;
            if running.is_empty() {
                return Ok(0);
            }
            this.status_write(ops::fail_interrupted).await
        })
    }

    fn conversation(
        &self,
        key: ConversationKey,
    ) -> BoxFuture<'static, StoreResult<Option<ConversationMeta>>> {
        self.read(move |records| Ok(records.conversation(&key)?.map(|stored| stored.meta)))
    }

    fn conversation_page(
        &self,
        key: ConversationKey,
        from: MessagesFrom,
        max_bytes: usize,
    ) -> BoxFuture<'static, StoreResult<Option<ConversationPage>>> {
        self.read(move |records| ops::conversation_page(records, &key, from, max_bytes))
    }

    fn task(
        &self,
        principal: &str,
        task_id: &str,
    ) -> BoxFuture<'static, StoreResult<Option<Task>>> {
        let (principal, task_id) = (principal.to_owned(), task_id.to_owned());
        self.read(move |records| ops::task(records, &principal, &task_id))
    }

    fn stream_outline(
        &self,
        principal: &str,
        task_id: &str,
    ) -> BoxFuture<'static, StoreResult<Option<StreamOutline>>> {
        let (principal, task_id) = (principal.to_owned(), task_id.to_owned());
        self.read(move |records| ops::stream_outline(records, &principal, &task_id))
    }

    fn list_tasks(
        &self,
        principal: &str,
        query: TaskQuery,
    ) -> BoxFuture<'static, StoreResult<Page<Task>>> {
        let principal = principal.to_owned();
        self.read(move |records| ops::list_tasks(records, &principal, query))
    }

    fn list_conversations(
        &self,
        principal: &str,
        page_size: usize,
        page_token: Option<String>,
    ) -> BoxFuture<'static, StoreResult<Page<ConversationMeta>>> {
        let principal = principal.to_owned();
        self.read(move |records| {
            records.list_conversations(&principal, page_size, page_token.as_deref())
        })
    }

    fn delete_conversation(&self, key: ConversationKey) -> BoxFuture<'static, StoreResult<bool>> {
        self.write(move |records, live| ops::delete_conversation(records, live, &key))
    }

    fn probe(&self) -> BoxFuture<'static, StoreResult<()>> {
        self.write(|records, _| records.probe())
    }

    fn export_conversations(
        &self,
        principal: Option<String>,
        after: Option<ConversationKey>,
        limit: usize,
    ) -> BoxFuture<'static, StoreResult<Vec<ConversationRecords>>> {
        self.read(move |records| ops::export(records, principal.as_deref(), after, limit))
    }

    fn import_conversations(
        &self,
        items: Vec<ConversationRecords>,
    ) -> BoxFuture<'static, StoreResult<Imported>> {
        self.import(items, Existing::Skip)
    }

    fn flush(&self) -> BoxFuture<'static, StoreResult<()>> {
        self.write(|_, _| Ok(()))
    }

    fn size_on_disk(&self) -> BoxFuture<'static, StoreResult<u64>> {
        self.read(|records| records.backend().size_on_disk())
    }
}
