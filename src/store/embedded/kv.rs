//! The ordered key-value layer under the embedded store.

use crate::store::StoreResult;
use std::ops::Bound;

pub type KvPair = (Vec<u8>, Vec<u8>);

/// One write of an atomic batch.
#[derive(Debug, Clone)]
pub enum KvOp {
    Put(Vec<u8>, Vec<u8>),
    /// A put of a key no earlier write made (one holding a new task's id): to the store a
    /// put, but a delete that follows it before a checkpoint leaves nothing to write through
    /// (`wal::memtable`). A turn's start writes its task's index entries so, and its end
    /// deletes them.
    Create(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
}

impl KvOp {
    pub fn key(&self) -> &[u8] {
        match self {
            KvOp::Put(key, _) | KvOp::Create(key, _) | KvOp::Delete(key) => key,
        }
    }

    /// The key and what it is set to: its value, or None for deleted (a creation is a put).
    pub fn into_parts(self) -> (Vec<u8>, Option<Vec<u8>>) {
        match self {
            KvOp::Put(key, value) | KvOp::Create(key, value) => (key, Some(value)),
            KvOp::Delete(key) => (key, None),
        }
    }
}

/// An ordered key-value store with atomic batches and explicit durability.
pub trait KvBackend: Send + Sync + 'static {
    fn get(&self, key: &[u8]) -> StoreResult<Option<Vec<u8>>>;
    /// Applies all operations atomically (not yet durably: see [`KvBackend::flush`]).
    fn apply(&self, ops: Vec<KvOp>) -> StoreResult<()>;
    /// Applies the operations, sorted by key with each key once, each on its own: a crash
    /// may keep any prefix of them. For backends whose atomic batches cost more (sled's lock
    /// readers out).
    fn apply_each(&self, ops: Vec<KvOp>) -> StoreResult<()> {
        self.apply(ops)
    }
    fn scan<'a>(
        &'a self,
        from: Bound<Vec<u8>>,
        to: Bound<Vec<u8>>,
        reverse: bool,
    ) -> Box<dyn Iterator<Item = StoreResult<KvPair>> + 'a>;
    /// Makes everything applied before the call durable (blocks until it is on disk).
    fn flush(&self) -> StoreResult<()>;
    /// Told after a checkpoint made its writes durable, by the thread that writes them: a
    /// moment to shorten the backend's own recovery (sled writes a snapshot now and then).
    fn checkpointed(&self) -> StoreResult<()> {
        Ok(())
    }
    /// Told after the last checkpoint of a clean stop, by the same thread: a moment to leave
    /// the next open nothing of the backend's own to replay (sled writes a snapshot).
    fn closing(&self) -> StoreResult<()> {
        Ok(())
    }
    fn size_on_disk(&self) -> StoreResult<u64>;
}
