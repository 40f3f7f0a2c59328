//! The embedded store's records over an ordered key-value backend: key layout, encoding, and
//! typed reads and batched writes. Store operations (`ops.rs`) are built from these.
//!
//! Key layout (one keyspace, a record-type byte first):
//! - `c` ++ conversation key                         -> [`ConversationMeta`] and its number
//! - `M` ++ number (u64 BE) ++ seq (u64 BE)          -> [`Message`]
//! - `t` ++ task id                                  -> [`TaskRecord`]
//! - `I` ++ number ++ !status ms ++ task id          -> state byte (tasks of a conversation, newest first)
//! - `p` ++ principal key ++ !status ms ++ task id    -> state byte (tasks of a principal, newest first)
//! - `l` ++ principal key ++ !updated ms ++ conv key  -> empty (conversations, newest first)
//! - `r` ++ task id                                  -> empty (tasks whose turn is running: read at
//!   start to fail what a crash cut off, without scanning the tasks)
//! - `n` (push configs) and `o` (the notification outbox): see `push.rs`
//! - `#conversations`                                -> the number the next new conversation gets
//!
//! A conversation's messages and task index entries sit under the number it was given when it
//! was created ([`Place`]), so a new conversation's writes land beside the other new ones, in
//! the tree's newest leaves, not all over a tree hashed keys spread them across (where, as the
//! store grew, most writes had to page a leaf in first). New task ids are time-ordered UUIDs for
//! the same reason. Conversations stored before numbers keep their messages and index entries
//! under their hashed key (`m` and `i` in place of `M` and `I`).
//!
//! Values: a marker byte and a version, then MessagePack ([`encode`], [`decode`]): messages,
//! tasks and conversation metadata in version 2 (`compact.rs`), read with version 1 and JSON
//! records of earlier stores. A message records only that its contextId is its conversation's,
//! so reading a conversation's messages takes that contextId.

use super::compact;
use super::kv::{KvBackend, KvOp};
use crate::model::{Message, Part, Task, TaskState};
use crate::store::{
    ConversationKey, ConversationMeta, Page, PrincipalKey, StoreError, StoreResult, page_token,
};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::ops::Bound;
use std::sync::Arc;

/// A task as stored: its history lives in the conversation, referenced by sequence number.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    pub task: Task,
    pub principal: String,
    pub history_seqs: Vec<u64>,
    /// Set when an artifact's text is the reply message's, stored once, in the message.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "r")]
    pub reply_in: Option<ReplyRef>,
    /// Its conversation's number (None: a conversation stored before numbers; see [`Place`]).
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "n")]
    pub conversation_number: Option<u64>,
    /// Its latest turn's stream, when one was outlined.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "o")]
    pub stream: Option<crate::store::StreamOutline>,
}

/// Which artifact's text is the reply message at `seq`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ReplyRef {
    #[serde(rename = "a")]
    pub artifact: usize,
    #[serde(rename = "s")]
    pub seq: u64,
}

/// The text of a message or artifact that is exactly one text part.
fn sole_text(parts: &[crate::model::Part]) -> Option<&str> {
    match parts {
        [part] => part.as_text(),
        _ => None,
    }
}

impl TaskRecord {
    pub fn conversation(&self) -> ConversationKey {
        ConversationKey::new(&self.principal, &self.task.context_id)
    }

    /// Where its conversation's messages are (hashing its key only for a conversation stored
    /// before numbers).
    pub fn place(&self) -> Place {
        match self.conversation_number {
            Some(number) => Place::Numbered(number),
            None => Place::Hashed(self.conversation()),
        }
    }

    /// Leaves out of the record an artifact text that is the reply's (stored at `seq`): the
    /// streamed reply artifact and the reply message hold the same text.
    pub fn elide_reply(&mut self, reply: &Message, seq: u64) {
        let Some(text) = sole_text(&reply.parts) else {
            return;
        };
        let artifact = self
            .task
            .artifacts
            .iter()
            .position(|a| sole_text(&a.parts) == Some(text));
        if let Some(artifact) = artifact {
            if let Some(crate::model::PartContent::Text { text }) = self.task.artifacts[artifact]
                .parts
                .first_mut()
                .map(|p| &mut p.content)
            {
                text.clear();
            }
            self.reply_in = Some(ReplyRef { artifact, seq });
        }
    }

    /// Puts an elided reply text back.
    fn restore_reply(&mut self, reply_text: String) {
        let Some(reply) = self.reply_in.take() else {
            return;
        };
        let part = self
            .task
            .artifacts
            .get_mut(reply.artifact)
            .and_then(|a| a.parts.first_mut());
        if let Some(crate::model::Part {
            content: crate::model::PartContent::Text { text },
            ..
        }) = part
        {
            *text = reply_text;
        }
    }
}

/// A task in a listing, not yet loaded: its id and the page token that resumes after it.
#[derive(Debug, Clone)]
pub struct ListedTask {
    pub task_id: String,
    pub resume_token: String,
}

/// The page token that resumes a listing after the index entry whose key ends in `suffix`: its
/// order (the inverted time every index key holds first), then its id.
fn resume_after(suffix: &[u8]) -> String {
    match suffix.split_first_chunk::<8>() {
        Some((order, tail)) => page_token::for_listing(*order, tail),
        // Not an index key of this version: nothing to resume after.
        None => String::new(),
    }
}

/// Collects writes, already encoded, to be applied atomically.
#[derive(Debug)]
pub struct WriteBatch {
    ops: Vec<KvOp>,
}

const CONVERSATION: u8 = b'c';
const MESSAGE: u8 = b'M';
const HASHED_MESSAGE: u8 = b'm';
const TASK: u8 = b't';
const TASKS_BY_CONVERSATION: u8 = b'I';
const HASHED_TASKS_BY_CONVERSATION: u8 = b'i';
const TASKS_BY_PRINCIPAL: u8 = b'p';
pub(super) const CONVERSATIONS_BY_PRINCIPAL: u8 = b'l';
const RUNNING_TASKS: u8 = b'r';
const NEXT_CONVERSATION_NUMBER: &[u8] = b"#conversations";

/// Where a conversation's messages and task index entries are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Under the number the conversation was given at creation.
    Numbered(u64),
    /// Under its hashed key: a conversation stored before numbers.
    Hashed(ConversationKey),
}

impl Place {
    fn of(number: Option<u64>, key: ConversationKey) -> Self {
        number.map_or(Place::Hashed(key), Place::Numbered)
    }

    pub fn number(&self) -> Option<u64> {
        match self {
            Place::Numbered(number) => Some(*number),
            Place::Hashed(_) => None,
        }
    }

    /// A key of this conversation's: the record type byte (`numbered` or `hashed`), the
    /// conversation's part, then `rest`, in one allocation of the key's length.
    fn key(&self, numbered: u8, hashed: u8, rest: &[&[u8]]) -> Vec<u8> {
        let number;
        let (kind, own): (u8, &[u8]) = match self {
            Place::Numbered(n) => {
                number = n.to_be_bytes();
                (numbered, &number)
            }
            Place::Hashed(key) => (hashed, key.as_bytes()),
        };
        joined(kind, own, rest)
    }

    fn message_key(&self, seq: u64) -> Vec<u8> {
        self.key(MESSAGE, HASHED_MESSAGE, &[&seq.to_be_bytes()])
    }

    fn task_index_prefix(&self) -> Vec<u8> {
        self.task_index_key(&[])
    }

    fn task_index_key(&self, rest: &[&[u8]]) -> Vec<u8> {
        self.key(TASKS_BY_CONVERSATION, HASHED_TASKS_BY_CONVERSATION, rest)
    }
}

/// A conversation as stored: its metadata and where its messages are.
#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    pub meta: ConversationMeta,
    pub place: Place,
}

fn prefixed(kind: u8, parts: &[&[u8]]) -> Vec<u8> {
    joined(kind, &[], parts)
}

/// `kind`, `first`, then `rest`, in one allocation of the key's length.
fn joined(kind: u8, first: &[u8], rest: &[&[u8]]) -> Vec<u8> {
    let len = 1 + first.len() + rest.iter().map(|part| part.len()).sum::<usize>();
    let mut key = Vec::with_capacity(len);
    key.push(kind);
    key.extend_from_slice(first);
    for part in rest {
        key.extend_from_slice(part);
    }
    key
}

/// Newest first in a forward scan.
fn inverted_millis(t: &DateTime<Utc>) -> [u8; 8] {
    (u64::MAX - t.timestamp_millis().max(0) as u64).to_be_bytes()
}

fn conversation_key(key: &ConversationKey) -> Vec<u8> {
    prefixed(CONVERSATION, &[key.as_bytes()])
}

fn task_key(task_id: &str) -> Vec<u8> {
    prefixed(TASK, &[task_id.as_bytes()])
}

fn running_task_key(task_id: &str) -> Vec<u8> {
    prefixed(RUNNING_TASKS, &[task_id.as_bytes()])
}

/// A task is running from the batch that starts its turn to the one that ends it.
fn is_running(record: &TaskRecord) -> bool {
    !record.task.status.state.ends_turn()
}

/// A conversation's key and its principal's: SHA-256 hashes, so computed once per operation
/// (they were a seventh of a turn's instructions when each index key hashed its own).
#[derive(Clone, Copy)]
pub struct Keys {
    pub conversation: ConversationKey,
    pub principal: PrincipalKey,
}

impl Keys {
    pub fn new(principal: &str, context_id: &str) -> Self {
        Keys {
            conversation: ConversationKey::new(principal, context_id),
            principal: PrincipalKey::new(principal),
        }
    }
}

fn task_index_keys(keys: &Keys, record: &TaskRecord) -> [Vec<u8>; 2] {
    let ts = inverted_millis(&record.task.status.timestamp);
    let id = record.task.id.as_bytes();
    [
        record.place().task_index_key(&[&ts, id]),
        prefixed(TASKS_BY_PRINCIPAL, &[keys.principal.as_bytes(), &ts, id]),
    ]
}

fn conversation_index_key(keys: &Keys, meta: &ConversationMeta) -> Vec<u8> {
    prefixed(
        CONVERSATIONS_BY_PRINCIPAL,
        &[
            keys.principal.as_bytes(),
            &inverted_millis(&meta.updated_at),
            keys.conversation.as_bytes(),
        ],
    )
}

/// The first byte of a record in the binary encoding: 0xC1 begins no MessagePack value and no
/// JSON text, so a record says which encoding it is in. The second byte is the version:
/// 1 is MessagePack with field names of the model's types (the push side's records still are);
/// 2 is the compact stored forms of messages, tasks and conversation metadata (`compact.rs`),
/// written for every such record since. Each version stays readable, as do the JSON records of
/// stores before them: no migration, every record rewritten is in the newest version.
const RECORD_V1: [u8; 2] = [0xC1, 1];
const RECORD_V2: [u8; 2] = [0xC1, 2];

/// A record in version 1: MessagePack with field names (so optional fields may be left out and
/// added), after [`RECORD_V1`]. About half the bytes of JSON and cheaper to read and write;
/// JSON stays on the wire.
pub(super) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let mut bytes = RECORD_V1.to_vec();
    // Writing our own plain data types into a Vec cannot fail.
    let _ = rmp_serde::encode::write_named(&mut bytes, value);
    bytes
}

/// Reads a record in version 1, or in JSON as stores before it wrote them.
pub(super) fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> StoreResult<T> {
    match bytes {
        [0xC1, 1, body @ ..] => rmp_serde::from_slice(body).map_err(StoreError::corrupt),
        [b'{', ..] => serde_json::from_slice(bytes).map_err(StoreError::corrupt),
        _ => Err(StoreError::corrupt_msg(
            "a record in an encoding this version does not know",
        )),
    }
}

/// Reads a record in version 2 with `read`, or in an earlier encoding.
fn decode_versioned<T: for<'de> Deserialize<'de>>(
    bytes: &[u8],
    read: impl FnOnce(&[u8]) -> Result<T, compact::ReadError>,
) -> StoreResult<T> {
    match bytes {
        [0xC1, 2, body @ ..] => read(body).map_err(StoreError::corrupt),
        _ => decode(bytes),
    }
}

/// What a record takes besides its texts: ids, times, states and the field markers.
const RECORD_FIELDS: usize = 192;

/// A record in version 2, its buffer sized once for `texts` bytes of text and its fields
/// (grown from empty, a 300-byte message took five reallocations).
fn in_v2(texts: usize, write: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(RECORD_V2.len() + texts + RECORD_FIELDS);
    bytes.extend_from_slice(&RECORD_V2);
    write(&mut bytes);
    bytes
}

/// A message of the conversation whose contextId is `context_id`.
fn encode_message(message: &Message, context_id: &str) -> Vec<u8> {
    in_v2(texts_len(&message.parts), |out| {
        compact::write_message(out, message, context_id)
    })
}

fn texts_len(parts: &[Part]) -> usize {
    parts.iter().filter_map(Part::as_text).map(str::len).sum()
}

fn decode_message(bytes: &[u8], context_id: &str) -> StoreResult<Message> {
    decode_versioned(bytes, |body| compact::read_message(body, context_id))
}

fn encode_task(record: &TaskRecord) -> Vec<u8> {
    // A reply's text is stored once, in its message (`TaskRecord::reply_in`).
    let texts = match record.reply_in {
        Some(_) => 0,
        None => record
            .task
            .artifacts
            .iter()
            .map(|a| texts_len(&a.parts))
            .sum(),
    };
    in_v2(texts, |out| compact::write_task(out, record))
}

fn decode_task(bytes: &[u8]) -> StoreResult<TaskRecord> {
    decode_versioned(bytes, compact::read_task)
}

fn encode_conversation(meta: &ConversationMeta, number: Option<u64>) -> Vec<u8> {
    in_v2(0, |out| compact::write_conversation(out, meta, number))
}

/// The metadata and the number (None in records of stores before numbers).
fn decode_conversation(bytes: &[u8]) -> StoreResult<(ConversationMeta, Option<u64>)> {
    match bytes {
        [0xC1, 2, body @ ..] => compact::read_conversation(body).map_err(StoreError::corrupt),
        _ => Ok((decode(bytes)?, None)),
    }
}

fn decode_conversation_at(bytes: &[u8], key: ConversationKey) -> StoreResult<Conversation> {
    let (meta, number) = decode_conversation(bytes)?;
    Ok(Conversation {
        meta,
        place: Place::of(number, key),
    })
}

/// Room for a turn step's writes (a start writes about eight, an end about ten) and the log's
/// position the write-ahead log adds: no step's batch grows as it is built and applied.
const BATCH_ROOM: usize = 16;

impl WriteBatch {
    pub fn new() -> Self {
        WriteBatch {
            ops: Vec::with_capacity(BATCH_ROOM),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Writes the conversation's metadata; `previous` is what is stored now, to move its index entry.
    ///
    /// With `previous`, the new index entry is a creation: a conversation has one entry, the
    /// one deleted just before (a new key equal to it finds that delete in the memtable and
    /// stays a put). A turn's start moves the entry and its end moves it again, so the start's
    /// entry then leaves nothing for the checkpoint to write.
    pub fn put_conversation(
        &mut self,
        keys: &Keys,
        conversation: &Conversation,
        previous: Option<&ConversationMeta>,
    ) {
        let meta = &conversation.meta;
        let index_write = match previous {
            Some(previous) => {
                self.ops
                    .push(KvOp::Delete(conversation_index_key(keys, previous)));
                KvOp::Create
            }
            None => KvOp::Put,
        };
        self.ops
            .push(index_write(conversation_index_key(keys, meta), Vec::new()));
        self.ops.push(KvOp::Put(
            conversation_key(&keys.conversation),
            encode_conversation(meta, conversation.place.number()),
        ));
    }

    /// Appends a message to the conversation at `place` whose contextId is `context_id`.
    pub fn append_message(&mut self, place: &Place, context_id: &str, seq: u64, message: &Message) {
        self.ops.push(KvOp::Put(
            place.message_key(seq),
            encode_message(message, context_id),
        ));
    }

    /// A write of a record kept beside these (the push side's, `push.rs`).
    pub(super) fn put_raw(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.ops.push(KvOp::Put(key, value));
    }

    pub(super) fn delete_raw(&mut self, key: Vec<u8>) {
        self.ops.push(KvOp::Delete(key));
    }

    /// Drops a running-task index entry whose task is gone or no longer running.
    pub fn forget_running_task(&mut self, task_id: &str) {
        self.ops.push(KvOp::Delete(running_task_key(task_id)));
    }

    /// Writes the task; `previous` is what is stored now, to move its index entries. Without
    /// one the task is new (its id in no key yet), and its index entries are creations.
    pub fn put_task(&mut self, keys: &Keys, record: &TaskRecord, previous: Option<&TaskRecord>) {
        let index_write = match previous {
            Some(_) => KvOp::Put,
            None => KvOp::Create,
        };
        if let Some(previous) = previous {
            for key in task_index_keys(keys, previous) {
                self.ops.push(KvOp::Delete(key));
            }
        }
        let state = vec![record.task.status.state.code()];
        for key in task_index_keys(keys, record) {
            self.ops.push(index_write(key, state.clone()));
        }
        let was_running = previous.is_some_and(is_running);
        if is_running(record) {
            self.ops
                .push(index_write(running_task_key(&record.task.id), Vec::new()));
        } else if was_running {
            self.ops
                .push(KvOp::Delete(running_task_key(&record.task.id)));
        }
        self.ops
            .push(KvOp::Put(task_key(&record.task.id), encode_task(record)));
    }
}

/// Filters of a task listing, as the index can apply them.
#[derive(Debug, Clone, Default)]
pub struct TaskFilter {
    pub conversation: Option<Place>,
    pub state: Option<TaskState>,
    pub status_after: Option<DateTime<Utc>>,
}

/// Typed access to the records. Reads may touch the disk: call them off actor and worker
/// threads.
#[derive(Clone)]
pub struct Records {
    backend: Arc<dyn KvBackend>,
    /// Some push-notification config may be stored: until one is, a status change need not
    /// look for its task's configs (`push.rs`).
    pub(super) push_configs_stored: Arc<std::sync::atomic::AtomicBool>,
    /// The number the next new conversation gets, once read (only the store thread writes).
    next_number: Arc<parking_lot::Mutex<Option<u64>>>,
}

impl Records {
    pub fn new(backend: Arc<dyn KvBackend>) -> Self {
        Records {
            backend,
            push_configs_stored: Arc::default(),
            next_number: Arc::default(),
        }
    }

    /// A number for a new conversation: the batch that stores the conversation also stores the
    /// next one, so no two conversations are ever given the same (a number taken by a batch
    /// that is then not applied is skipped, never reused in this process).
    pub fn number_new_conversation(&self, batch: &mut WriteBatch) -> StoreResult<u64> {
        let mut next = self.next_number.lock();
        let number = match *next {
            Some(number) => number,
            None => self.stored_next_number()?,
        };
        let following = number
            .checked_add(1)
            .ok_or_else(|| StoreError::corrupt_msg("conversation numbers are exhausted"))?;
        *next = Some(following);
        batch.put_raw(
            NEXT_CONVERSATION_NUMBER.to_vec(),
            following.to_be_bytes().to_vec(),
        );
        Ok(number)
    }

    fn stored_next_number(&self) -> StoreResult<u64> {
        match self.backend.get(NEXT_CONVERSATION_NUMBER)? {
            None => Ok(0),
            Some(bytes) => <[u8; 8]>::try_from(bytes.as_slice())
                .map(u64::from_be_bytes)
                .map_err(|_| StoreError::corrupt_msg("the next conversation number")),
        }
    }

    pub fn backend(&self) -> &Arc<dyn KvBackend> {
        &self.backend
    }

    /// Applies the batch atomically (durable after the next flush).
    pub fn apply(&self, batch: WriteBatch) -> StoreResult<()> {
        if batch.is_empty() {
            return Ok(());
        }
        self.backend.apply(batch.ops)
    }

    /// Writes a probe record, to show the store takes writes (readiness).
    pub fn probe(&self) -> StoreResult<()> {
        let stamp = crate::model::now()
            .timestamp_millis()
            .to_be_bytes()
            .to_vec();
        self.backend
            .apply(vec![KvOp::Put(b"zprobe".to_vec(), stamp)])
    }

    pub fn conversation(&self, key: &ConversationKey) -> StoreResult<Option<Conversation>> {
        self.backend
            .get(&conversation_key(key))?
            .map(|bytes| decode_conversation_at(&bytes, *key))
            .transpose()
    }

    /// The `limit` messages before sequence number `next_seq` (a conversation's `next_seq`: its
    /// most recent ones), oldest first. Sequence numbers have no gaps, so this is one bounded
    /// forward range scan, O(limit) however long the conversation. Reading a conversation's
    /// messages takes its contextId (`context_id`): a message stores only that it has it.
    pub fn recent_messages(
        &self,
        place: &Place,
        context_id: &str,
        next_seq: u64,
        limit: usize,
    ) -> StoreResult<Vec<(u64, Message)>> {
        let from = place.message_key(next_seq.saturating_sub(limit as u64));
        let to = place.message_key(next_seq);
        self.backend
            .scan(Bound::Included(from), Bound::Excluded(to), false)
            .map(|entry| {
                let (k, v) = entry?;
                Ok((seq_of(&k)?, decode_message(&v, context_id)?))
            })
            .collect()
    }

    /// A conversation's messages from the one a page token names (or from sequence number
    /// `from`), oldest first, read lazily, each with its stored size in bytes (a cheap estimate
    /// of its size in a response).
    pub fn messages_from<'a>(
        &'a self,
        place: &Place,
        context_id: &'a str,
        from: u64,
        page_token: Option<&str>,
    ) -> StoreResult<impl Iterator<Item = StoreResult<(u64, Message, usize)>> + 'a> {
        let from = match page_token.filter(|t| !t.is_empty()) {
            Some(token) => page_token::message_seq(token)?,
            None => from,
        };
        let scan = self.backend.scan(
            Bound::Included(place.message_key(from)),
            Bound::Included(place.message_key(u64::MAX)),
            false,
        );
        Ok(scan.map(|entry| {
            let (k, v) = entry?;
            Ok((seq_of(&k)?, decode_message(&v, context_id)?, v.len()))
        }))
    }

    pub fn messages(
        &self,
        place: &Place,
        context_id: &str,
        seqs: &[u64],
    ) -> StoreResult<Vec<Message>> {
        Ok(self.messages_sized(place, context_id, seqs)?.0)
    }

    /// The messages and their total stored size in bytes.
    pub fn messages_sized(
        &self,
        place: &Place,
        context_id: &str,
        seqs: &[u64],
    ) -> StoreResult<(Vec<Message>, usize)> {
        let mut messages = Vec::with_capacity(seqs.len());
        let mut bytes_read = 0;
        for seq in seqs {
            if let Some(bytes) = self.backend.get(&place.message_key(*seq))? {
                bytes_read += bytes.len();
                messages.push(decode_message(&bytes, context_id)?);
            }
        }
        Ok((messages, bytes_read))
    }

    pub fn task(&self, task_id: &str) -> StoreResult<Option<TaskRecord>> {
        Ok(self.task_sized(task_id)?.map(|(record, _)| record))
    }

    /// The task, whole (an elided reply text put back), and its size in bytes (its artifacts
    /// included).
    pub fn task_sized(&self, task_id: &str) -> StoreResult<Option<(TaskRecord, usize)>> {
        let Some(bytes) = self.backend.get(&task_key(task_id))? else {
            return Ok(None);
        };
        let mut record = decode_task(&bytes)?;
        let mut size = bytes.len();
        if let Some(reply) = record.reply_in {
            let key = record.place().message_key(reply.seq);
            let text = match self.backend.get(&key)? {
                Some(message) => decode_message(&message, &record.task.context_id)?.text(),
                None => String::new(),
            };
            size += text.len();
            record.restore_reply(text);
        }
        Ok(Some((record, size)))
    }

    /// The ids of the tasks stored as running: one scan of the running-task index, however many
    /// conversations and tasks are stored.
    pub fn running_tasks(&self) -> StoreResult<Vec<String>> {
        self.index_ids(&[RUNNING_TASKS], 0)
    }

    /// The ids an index holds under `prefix`, in key order: what follows the prefix in each
    /// key, past `skip` bytes of ordering.
    fn index_ids(&self, prefix: &[u8], skip: usize) -> StoreResult<Vec<String>> {
        let mut ids = Vec::new();
        for entry in self
            .backend
            .scan(Bound::Included(prefix.to_vec()), Bound::Unbounded, false)
        {
            let (key, _) = entry?;
            if !key.starts_with(prefix) {
                break;
            }
            let id = key.get(prefix.len() + skip..).unwrap_or_default();
            ids.push(String::from_utf8_lossy(id).into_owned());
        }
        Ok(ids)
    }

    /// The principal's tasks (or one conversation's), newest status first: their ids, for the
    /// caller to load (and stop early, resuming from an entry's token).
    pub fn list_tasks(
        &self,
        principal: &str,
        query: &TaskFilter,
        page_size: usize,
        page_token: Option<&str>,
    ) -> StoreResult<Page<ListedTask>> {
        let prefix = match &query.conversation {
            Some(place) => place.task_index_prefix(),
            None => prefixed(
                TASKS_BY_PRINCIPAL,
                &[PrincipalKey::new(principal).as_bytes()],
            ),
        };
        let wanted = |key: &[u8], value: &[u8]| {
            let state_ok = query.state.is_none_or(|s| value.first() == Some(&s.code()));
            let time_ok = query.status_after.is_none_or(|after| {
                key.get(prefix.len()..prefix.len() + 8)
                    .and_then(|b| b.try_into().ok())
                    .is_some_and(|b: [u8; 8]| {
                        u64::MAX - u64::from_be_bytes(b) > after.timestamp_millis().max(0) as u64
                    })
            });
            state_ok && time_ok
        };
        let page = self.page(&prefix, page_size, page_token, wanted)?;
        let items = page
            .items
            .iter()
            .map(|key| ListedTask {
                task_id: String::from_utf8_lossy(&key[prefix.len() + 8..]).into_owned(),
                resume_token: resume_after(&key[prefix.len()..]),
            })
            .collect();
        Ok(Page {
            items,
            next_page_token: page.next_page_token,
            total_size: page.total_size,
        })
    }

    /// The principal's conversations, most recently updated first.
    pub fn list_conversations(
        &self,
        principal: &str,
        page_size: usize,
        page_token: Option<&str>,
    ) -> StoreResult<Page<ConversationMeta>> {
        let prefix = prefixed(
            CONVERSATIONS_BY_PRINCIPAL,
            &[PrincipalKey::new(principal).as_bytes()],
        );
        // An entry naming a key of another namespace version is not this version's to list.
        let current_version =
            |key: &[u8], _: &[u8]| ConversationKey::from_bytes(&key[prefix.len() + 8..]).is_some();
        let page = self.page(&prefix, page_size, page_token, current_version)?;
        let mut items = Vec::with_capacity(page.items.len());
        for key in &page.items {
            let Some(conversation) = ConversationKey::from_bytes(&key[prefix.len() + 8..]) else {
                continue;
            };
            if let Some(stored) = self.conversation(&conversation)? {
                items.push(stored.meta);
            }
        }
        Ok(Page {
            items,
            next_page_token: page.next_page_token,
            total_size: page.total_size,
        })
    }

    /// One page of index keys under `prefix`, resuming after the token's key.
    fn page(
        &self,
        prefix: &[u8],
        page_size: usize,
        page_token: Option<&str>,
        wanted: impl Fn(&[u8], &[u8]) -> bool,
    ) -> StoreResult<Page<Vec<u8>>> {
        let start = match page_token.filter(|t| !t.is_empty()) {
            Some(token) => {
                let (order, tail) = page_token::listing(token)?;
                Bound::Excluded(prefixed(prefix[0], &[&prefix[1..], &order, &tail]))
            }
            None => Bound::Included(prefix.to_vec()),
        };
        let mut items = Vec::new();
        let mut next_page_token = String::new();
        let mut total_size = 0;
        let mut counted_before = 0;
        if page_token.is_some_and(|t| !t.is_empty()) {
            // totalSize counts every match, also those on earlier pages.
            counted_before = self.count_matching(prefix, &start, &wanted)?;
        }
        for entry in self.backend.scan(start, Bound::Unbounded, false) {
            let (key, value) = entry?;
            if !key.starts_with(prefix) {
                break;
            }
            if !wanted(&key, &value) {
                continue;
            }
            total_size += 1;
            if items.len() < page_size {
                items.push(key);
            } else if next_page_token.is_empty()
                && let Some(last) = items.last()
            {
                next_page_token = resume_after(&last[prefix.len()..]);
            }
        }
        Ok(Page {
            items,
            next_page_token,
            total_size: total_size + counted_before,
        })
    }

    fn count_matching(
        &self,
        prefix: &[u8],
        before: &Bound<Vec<u8>>,
        wanted: &impl Fn(&[u8], &[u8]) -> bool,
    ) -> StoreResult<usize> {
        let end = match before {
            Bound::Excluded(key) => Bound::Included(key.clone()),
            _ => return Ok(0),
        };
        let mut count = 0;
        for entry in self
            .backend
            .scan(Bound::Included(prefix.to_vec()), end, false)
        {
            let (key, value) = entry?;
            if wanted(&key, &value) {
                count += 1;
            }
        }
        Ok(count)
    }

    /// Every conversation in key order, after `after` if given, read lazily.
    pub fn conversations_after(
        &self,
        after: Option<&ConversationKey>,
    ) -> impl Iterator<Item = StoreResult<Conversation>> + '_ {
        let start = match after {
            Some(key) => Bound::Excluded(conversation_key(key)),
            None => Bound::Included(vec![CONVERSATION]),
        };
        self.backend
            .scan(start, Bound::Excluded(vec![CONVERSATION + 1]), false)
            .filter_map(|entry| match entry {
                Err(e) => Some(Err(e)),
                // A key of another namespace version is not this version's to load.
                Ok((key, value)) => ConversationKey::from_bytes(&key[1..])
                    .map(|key| decode_conversation_at(&value, key)),
            })
    }

    /// The ids of a conversation's tasks (in the index's order: newest status first).
    pub fn conversation_task_ids(&self, place: &Place) -> StoreResult<Vec<String>> {
        // Past the inverted status time each entry is ordered by.
        self.index_ids(&place.task_index_prefix(), 8)
    }

    /// Removes a conversation: its metadata, messages, tasks and index entries.
    pub fn delete_conversation(&self, conversation: &Conversation) -> StoreResult<()> {
        let meta = &conversation.meta;
        let place = &conversation.place;
        let keys = Keys::new(&meta.principal, &meta.context_id);
        let mut ops = vec![
            KvOp::Delete(conversation_key(&keys.conversation)),
            KvOp::Delete(conversation_index_key(&keys, meta)),
        ];
        let messages = self.backend.scan(
            Bound::Included(place.message_key(0)),
            Bound::Included(place.message_key(u64::MAX)),
            false,
        );
        for entry in messages {
            ops.push(KvOp::Delete(entry?.0));
        }
        for task_id in self.conversation_task_ids(place)? {
            if let Some(record) = self.task(&task_id)? {
                ops.extend(
                    task_index_keys(&keys, &record)
                        .into_iter()
                        .map(KvOp::Delete),
                );
                ops.push(KvOp::Delete(running_task_key(&task_id)));
                ops.push(KvOp::Delete(task_key(&task_id)));
                let configs = super::push::config_keys(self, &task_id)?;
                ops.extend(configs.into_iter().map(KvOp::Delete));
            }
        }
        self.backend.apply(ops)
    }
}

fn seq_of(key: &[u8]) -> StoreResult<u64> {
    key.len()
        .checked_sub(8)
        .and_then(|at| key[at..].try_into().ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| StoreError::corrupt_msg("message key too short"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Part, Role, Task};

    fn message() -> Message {
        let mut message = Message::agent_text("héllo \"world\"\n", "ctx", Some("task"));
        message.role = Role::User;
        let mut data = Part::text("");
        data.content = crate::model::PartContent::Data {
            data: serde_json::json!({"a": [1, 2.5, null], "b": {"c": true}}),
        };
        data.media_type = Some("application/json".into());
        message.parts.push(data);
        message.metadata = serde_json::json!({"k": "v"}).as_object().cloned();
        message
    }

    #[test]
    fn records_round_trip_in_the_binary_encoding() {
        let message = message();
        let bytes = encode(&message);
        assert_eq!(bytes[..2], RECORD_V1);
        assert!(bytes.len() < serde_json::to_vec(&message).unwrap().len());
        assert_eq!(decode::<Message>(&bytes).unwrap(), message);
        let meta = ConversationMeta::new("p", "c");
        assert_eq!(decode::<ConversationMeta>(&encode(&meta)).unwrap(), meta);
    }

    #[test]
    fn json_records_of_earlier_versions_stay_readable() {
        let message = message();
        let json = serde_json::to_vec(&message).unwrap();
        assert_eq!(decode::<Message>(&json).unwrap(), message);
    }

    #[test]
    fn a_reply_text_is_stored_once_and_put_back_exactly() {
        let text = "the answer, at the length of a real one. ".repeat(5);
        let reply = Message::agent_text(text.clone(), "ctx", Some("task"));
        let mut artifact_part = Part::text(text.clone());
        artifact_part.metadata = serde_json::json!({"m": 1}).as_object().cloned();
        let task = Task {
            id: "task".into(),
            context_id: "ctx".into(),
            status: crate::model::TaskStatus::new(crate::model::TaskState::Completed, None),
            artifacts: vec![crate::model::Artifact {
                artifact_id: "a".into(),
                name: Some("reply".into()),
                description: None,
                parts: vec![artifact_part],
                metadata: None,
            }],
            history: Vec::new(),
            metadata: None,
        };
        let whole = TaskRecord {
            task,
            principal: "p".into(),
            history_seqs: vec![0, 1],
            reply_in: None,
            conversation_number: None,
            stream: None,
        };
        let mut stored = whole.clone();
        stored.elide_reply(&reply, 1);
        assert_eq!(
            stored.reply_in,
            Some(ReplyRef {
                artifact: 0,
                seq: 1
            })
        );
        assert!(encode(&stored).len() + text.len() - 16 <= encode(&whole).len());
        let mut read: TaskRecord = decode(&encode(&stored)).unwrap();
        read.restore_reply(reply.text());
        assert_eq!(read, whole);
        // An artifact that is not the reply stays as it is.
        let mut other = whole.clone();
        other.elide_reply(&Message::agent_text("something else", "ctx", None), 1);
        assert_eq!(other, whole);
    }

    #[test]
    fn an_unknown_encoding_is_reported_not_guessed() {
        let mut bytes = encode(&message());
        bytes[1] = 2;
        assert!(matches!(
            decode::<Message>(&bytes),
            Err(StoreError::Corrupt { .. })
        ));
        assert!(matches!(
            decode::<Message>(&[]),
            Err(StoreError::Corrupt { .. })
        ));
    }

    #[test]
    fn a_moved_conversation_index_entry_is_a_creation() {
        let (meta, _, _) = typical_turn();
        let keys = Keys::new(&meta.principal, &meta.context_id);
        let mut moved = meta.clone();
        moved.updated_at += chrono::Duration::milliseconds(5);
        let conversation = Conversation {
            meta: moved.clone(),
            place: Place::Numbered(7),
        };
        let index = |meta: &ConversationMeta| conversation_index_key(&keys, meta);
        let mut first = WriteBatch::new();
        first.put_conversation(&keys, &conversation, None);
        assert!(matches!(&first.ops[0], KvOp::Put(key, _) if *key == index(&moved)));
        // Its one entry deleted first, the new one is a creation: a turn's start then leaves
        // nothing for a checkpoint once its end moves the entry again.
        let mut next = WriteBatch::new();
        next.put_conversation(&keys, &conversation, Some(&meta));
        assert!(matches!(&next.ops[0], KvOp::Delete(key) if *key == index(&meta)));
        assert!(matches!(&next.ops[1], KvOp::Create(key, _) if *key == index(&moved)));
    }

    /// A turn as the server stores it: a 200-character user message, the agent's reply, and
    /// the completed task whose reply artifact is the reply's text.
    fn typical_turn() -> (ConversationMeta, [Message; 2], TaskRecord) {
        let context_id = uuid::Uuid::new_v4().to_string();
        let task_id = uuid::Uuid::new_v4().to_string();
        let mut user = Message::agent_text("x".repeat(200), &context_id, Some(&task_id));
        user.role = Role::User;
        let reply = Message::agent_text(format!("echo: {}", user.text()), &context_id, None);
        let mut record = TaskRecord {
            task: Task {
                id: task_id,
                context_id: context_id.clone(),
                status: crate::model::TaskStatus::new(TaskState::Completed, None),
                artifacts: vec![crate::model::Artifact {
                    artifact_id: uuid::Uuid::new_v4().to_string(),
                    name: Some("reply".into()),
                    description: None,
                    parts: vec![Part::text(reply.text())],
                    metadata: None,
                }],
                history: Vec::new(),
                metadata: None,
            },
            principal: crate::model::ANONYMOUS.into(),
            history_seqs: vec![0, 1],
            reply_in: None,
            conversation_number: None,
            stream: None,
        };
        record.elide_reply(&reply, 1);
        let mut meta = ConversationMeta::new(crate::model::ANONYMOUS, &context_id);
        meta.turns = 1;
        meta.next_seq = 2;
        meta.token = 1;
        (meta, [user, reply], record)
    }

    #[test]
    fn messages_tasks_and_conversations_are_written_in_version_2() {
        let (meta, [user, reply], record) = typical_turn();
        let context_id = &meta.context_id;
        for message in [&user, &reply] {
            let bytes = encode_message(message, context_id);
            assert_eq!(bytes[..2], RECORD_V2);
            assert_eq!(&decode_message(&bytes, context_id).unwrap(), message);
        }
        let mut record = record;
        record.conversation_number = Some(7);
        let bytes = encode_task(&record);
        assert_eq!(bytes[..2], RECORD_V2);
        assert_eq!(decode_task(&bytes).unwrap(), record);
        let bytes = encode_conversation(&meta, Some(7));
        assert_eq!(bytes[..2], RECORD_V2);
        assert_eq!(decode_conversation(&bytes).unwrap(), (meta, Some(7)));
    }

    #[test]
    fn version_1_and_json_records_stay_readable() {
        let (meta, [user, reply], record) = typical_turn();
        let mut messages = vec![message(), user, reply];
        messages[0].context_id = None;
        for message in &messages {
            for bytes in [encode(message), serde_json::to_vec(message).unwrap()] {
                assert_eq!(&decode_message(&bytes, &meta.context_id).unwrap(), message);
            }
        }
        for bytes in [encode(&record), serde_json::to_vec(&record).unwrap()] {
            assert_eq!(decode_task(&bytes).unwrap(), record);
        }
        for bytes in [encode(&meta), serde_json::to_vec(&meta).unwrap()] {
            assert_eq!(decode_conversation(&bytes).unwrap(), (meta.clone(), None));
        }
    }

    #[test]
    fn a_version_no_reader_knows_is_corrupt_not_guessed() {
        let (meta, [user, _], record) = typical_turn();
        for version in [0, 3, 0xFF] {
            let mut bytes = encode_message(&user, &meta.context_id);
            bytes[1] = version;
            assert!(matches!(
                decode_message(&bytes, &meta.context_id),
                Err(StoreError::Corrupt { .. })
            ));
            let mut bytes = encode_task(&record);
            bytes[1] = version;
            assert!(matches!(
                decode_task(&bytes),
                Err(StoreError::Corrupt { .. })
            ));
            let mut bytes = encode_conversation(&meta, None);
            bytes[1] = version;
            assert!(matches!(
                decode_conversation(&bytes),
                Err(StoreError::Corrupt { .. })
            ));
        }
        // A version 1 body under the version 2 marker is not read as either.
        let mut bytes = encode(&user);
        bytes[1] = 2;
        assert!(matches!(
            decode_message(&bytes, &meta.context_id),
            Err(StoreError::Corrupt { .. })
        ));
        let truncated = &encode_task(&record)[..20];
        assert!(matches!(
            decode_task(truncated),
            Err(StoreError::Corrupt { .. })
        ));
    }

    #[test]
    fn a_turn_takes_at_least_a_quarter_fewer_bytes_in_version_2() {
        let (meta, [user, reply], record) = typical_turn();
        let context_id = &meta.context_id;
        let v1 = encode(&user).len() + encode(&reply).len() + encode(&record).len();
        let v2 = encode_message(&user, context_id).len()
            + encode_message(&reply, context_id).len()
            + encode_task(&record).len();
        assert!(v2 * 4 <= v1 * 3, "version 1: {v1} bytes, version 2: {v2}");
        assert!(encode_conversation(&meta, Some(1 << 40)).len() < encode(&meta).len());
    }

    /// The task as it is read: the elided reply text put back.
    fn whole(record: &TaskRecord, reply: &Message) -> TaskRecord {
        let mut whole = record.clone();
        whole.restore_reply(reply.text());
        whole
    }

    #[test]
    fn a_conversation_whose_records_are_in_every_version_reads_whole() {
        let dir = tempfile::tempdir().unwrap();
        let backend = super::super::SledBackend::open(dir.path(), 1 << 20).unwrap();
        let records = Records::new(Arc::new(backend));
        let (mut meta, [user, reply], first) = typical_turn();
        let context_id = meta.context_id.clone();
        let keys = Keys::new(&meta.principal, &context_id);
        let key = keys.conversation;
        // The first turn as earlier versions stored it (JSON, then version 1), under its
        // hashed key: stores before numbers had no other.
        let place = Place::Hashed(key);
        let mut batch = WriteBatch::new();
        batch.put_raw(place.message_key(0), serde_json::to_vec(&user).unwrap());
        batch.put_raw(place.message_key(1), encode(&reply));
        batch.put_raw(task_key(&first.task.id), encode(&first));
        batch.put_raw(conversation_key(&key), encode(&meta));
        records.apply(batch).unwrap();
        let stored = records.conversation(&key).unwrap().unwrap();
        assert_eq!((&stored.meta, stored.place), (&meta, place));
        // The second turn in version 2, its user message without a contextId.
        let mut second_user = Message::agent_text("second", &context_id, None);
        second_user.role = Role::User;
        second_user.context_id = None;
        let second_reply = Message::agent_text("second reply", &context_id, None);
        let mut second = whole(&first, &reply);
        second.task.id = uuid::Uuid::new_v4().to_string();
        second.task.artifacts[0].parts = vec![Part::text(second_reply.text())];
        second.history_seqs = vec![2, 3];
        second.elide_reply(&second_reply, 3);
        let previous_meta = meta.clone();
        meta.next_seq = 4;
        meta.turns = 2;
        let mut batch = WriteBatch::new();
        batch.append_message(&place, &context_id, 2, &second_user);
        batch.append_message(&place, &context_id, 3, &second_reply);
        batch.put_task(&keys, &second, None);
        let conversation = Conversation { meta, place };
        batch.put_conversation(&keys, &conversation, Some(&previous_meta));
        records.apply(batch).unwrap();

        assert_eq!(records.conversation(&key).unwrap(), Some(conversation));
        let all = vec![user, reply.clone(), second_user, second_reply.clone()];
        let recent = records.recent_messages(&place, &context_id, 4, 4).unwrap();
        assert_eq!(recent.into_iter().map(|(_, m)| m).collect::<Vec<_>>(), all);
        let paged: Vec<Message> = records
            .messages_from(&place, &context_id, 0, None)
            .unwrap()
            .map(|entry| entry.unwrap().1)
            .collect();
        assert_eq!(paged, all);
        assert_eq!(
            records.messages(&place, &context_id, &[1, 2]).unwrap(),
            all[1..3]
        );
        let read = records.task(&first.task.id).unwrap().unwrap();
        let artifact_text = read.task.artifacts[0].parts[0].as_text();
        assert_eq!(artifact_text, Some(reply.text().as_str()));
        assert_eq!(read, whole(&first, &reply));
        assert_eq!(
            records.task(&second.task.id).unwrap(),
            Some(whole(&second, &second_reply))
        );
        let filter = TaskFilter {
            conversation: Some(place),
            ..TaskFilter::default()
        };
        // The first task was stored without index entries above; the second is indexed at the
        // conversation's hashed place.
        let listed = records.list_tasks("", &filter, 10, None).unwrap();
        let ids: Vec<_> = listed.items.into_iter().map(|t| t.task_id).collect();
        assert_eq!(ids, [second.task.id.clone()]);
    }

    #[test]
    fn conversation_numbers_are_never_given_twice_across_opens() {
        let dir = tempfile::tempdir().unwrap();
        let numbers = |count: usize| {
            let backend = super::super::SledBackend::open(dir.path(), 1 << 20).unwrap();
            let records = Records::new(Arc::new(backend));
            let mut batch = WriteBatch::new();
            let numbers: Vec<u64> = (0..count)
                .map(|_| records.number_new_conversation(&mut batch).unwrap())
                .collect();
            records.apply(batch).unwrap();
            // Taken, but its batch never applied: skipped in this process, given again after.
            records
                .number_new_conversation(&mut WriteBatch::new())
                .unwrap();
            records.backend().flush().unwrap();
            numbers
        };
        assert_eq!(numbers(3), [0, 1, 2]);
        assert_eq!(numbers(2), [3, 4]);
    }

    #[test]
    fn numbered_conversations_keep_their_messages_and_tasks_apart() {
        let dir = tempfile::tempdir().unwrap();
        let backend = super::super::SledBackend::open(dir.path(), 1 << 20).unwrap();
        let records = Records::new(Arc::new(backend));
        let mut batch = WriteBatch::new();
        let mut turns = Vec::new();
        // Numbers 255 and 256 differ in two bytes; 1 and 256 would share a prefix as text.
        for number in [1u64, 255, 256] {
            let (meta, [user, reply], mut record) = typical_turn();
            let keys = Keys::new(&meta.principal, &meta.context_id);
            let place = Place::Numbered(number);
            record.conversation_number = Some(number);
            batch.append_message(&place, &meta.context_id, 0, &user);
            batch.append_message(&place, &meta.context_id, 1, &reply);
            batch.put_task(&keys, &record, None);
            batch.put_conversation(
                &keys,
                &Conversation {
                    meta: meta.clone(),
                    place,
                },
                None,
            );
            turns.push((meta, place, [user, reply], record));
        }
        records.apply(batch).unwrap();
        for (meta, place, messages, record) in turns {
            let stored = records.conversation(&meta.key()).unwrap().unwrap();
            assert_eq!(stored.place, place);
            let read: Vec<Message> = records
                .messages_from(&place, &meta.context_id, 0, None)
                .unwrap()
                .map(|entry| entry.unwrap().1)
                .collect();
            assert_eq!(read, messages);
            assert_eq!(
                records.conversation_task_ids(&place).unwrap(),
                std::slice::from_ref(&record.task.id)
            );
            let read = records.task(&record.task.id).unwrap().unwrap();
            assert_eq!(read.place(), place);
            assert_eq!(
                read.task.artifacts[0].parts[0].as_text(),
                Some(messages[1].text().as_str())
            );
        }
    }
}
