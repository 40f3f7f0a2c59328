//! The log's on-disk form: numbered segment files of checksummed records.
//!
//! Segment file `NNNNNNNNNNNNNNNNNNNN.log`; record `len u32 | crc32 u32 | payload`, payload
//! `seq u64 | op count u32 | ops`, op `0 | key` (delete) or `1 | key | value`, each byte string
//! `len u32 | bytes`, integers little-endian. A torn record ends the log: it was never synced,
//! so never acknowledged. A damaged record with records after it is refused (see [`read_all`]).
//!
//! Segments are recycled: a checkpointed segment is kept as [`SPARE`] and becomes the next
//! segment, written over from its start. Appending to a new file grows it, and each `fdatasync`
//! then writes the file's size and block map too (on ext4, a second device write); writing over
//! blocks already there syncs the data alone: about a quarter less CPU and a third fewer bytes
//! to the device a sync (docs/performance.md). A recycled segment holds its old bytes after
//! the new records until rotation cuts them off, so each segment starts with a header
//! (`SEGMENT_MAGIC`, then a random salt) and its records' checksums are XORed with its salt:
//! an old record, or a record-shaped run of bytes inside an old value, does not check out in
//! the segment's new life. Segments without the header (written before it) have salt 0.
//! Sequence numbers follow one another, so a record after a gap is not read either.

use crate::durable;
use crate::error::chain;
use crate::store::embedded::kv::KvOp;
use crate::store::{StoreError, StoreResult};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

const RECORD_HEADER: usize = 8;
/// What a segment starts with: this, its salt (u32) at `SALT_AT`, 4 bytes of zeros.
const SEGMENT_MAGIC: [u8; 8] = *b"cqwal\0\0\x01";
const SALT_AT: usize = SEGMENT_MAGIC.len();
pub(super) const SEGMENT_HEADER: usize = 16;
/// A checkpointed segment kept to be written over as the next one (not a `.log`: never read).
pub(super) const SPARE: &str = "spare.wal";
/// A larger checkpointed segment (written while checkpoints lagged) is deleted, not kept.
const SPARE_MAX_BYTES: u64 = 64 << 20;

/// The segment being appended to, and the closed ones a checkpoint has not yet covered.
pub(super) struct SegmentFiles {
    dir: PathBuf,
    current: Current,
    segment: u64,
    /// The last sequence number written to the current segment.
    last_seq: u64,
    /// Whether [`SPARE`] exists.
    spare: bool,
    /// Closed segments with their last sequence numbers.
    closed: Vec<(u64, u64)>,
    /// A failed write or sync leaves the file's state unknown: refuse further acknowledgements.
    failed: Option<String>,
}

impl SegmentFiles {
    /// Starts a new segment after every existing one. The existing ones hold batches up to
    /// `last_seq` at most; [`SegmentFiles::remove_covered`] deletes them once the inner store
    /// has those.
    pub(super) fn create(dir: &Path, last_seq: u64) -> StoreResult<Self> {
        let closed: Vec<(u64, u64)> = list_segments(dir)?
            .into_iter()
            .map(|(segment, _)| (segment, last_seq))
            .collect();
        let segment = closed.last().map_or(0, |(n, _)| n + 1);
        let mut spare = dir.join(SPARE).exists();
        let current = open_segment(dir, segment, &mut spare)?;
        Ok(SegmentFiles {
            dir: dir.to_owned(),
            current,
            segment,
            last_seq,
            spare,
            closed,
            failed: None,
        })
    }

    /// Writes encoded records ending at `last_seq` (salting their checksums for this segment)
    /// and syncs them.
    pub(super) fn append(&mut self, records: &mut [u8], last_seq: u64) -> StoreResult<()> {
        if let Some(reason) = &self.failed {
            return Err(StoreError::backend_msg(format!(
                "the write-ahead log failed earlier: {reason}"
            )));
        }
        let current = &mut self.current;
        salt_records(records, current.salt);
        let written = (current.file.write_all(records)).and_then(|()| current.file.sync_data());
        if let Err(e) = written {
            let reason = format!("segment {}: {e}", self.segment);
            self.failed = Some(reason.clone());
            return Err(StoreError::backend(
                format_args!("write-ahead log: segment {}", self.segment),
                e,
            ));
        }
        current.bytes += records.len() as u64;
        self.last_seq = last_seq;
        Ok(())
    }

    /// Makes every later write fail, as a full or failing disk would.
    #[cfg(test)]
    pub(super) fn fail_writes_for_test(&mut self) {
        if let Ok(read_only) = File::open(segment_path(&self.dir, self.segment)) {
            self.current.file = read_only;
        }
    }

    /// Starts a new segment if the current one holds anything.
    pub(super) fn rotate(&mut self) -> StoreResult<()> {
        let current = &self.current;
        if current.bytes <= SEGMENT_HEADER as u64 || self.failed.is_some() {
            return Ok(());
        }
        // A closed segment ends with its last record: only the last one may hold old records
        // after its own (a gap or damage in a closed one is refused at open).
        if current.recycled_len > current.bytes {
            let path = segment_path(&self.dir, self.segment);
            (current.file.set_len(current.bytes))
                .and_then(|()| current.file.sync_data())
                .map_err(|e| io_error("cutting the old records off", &path, e))?;
        }
        let next = self.segment + 1;
        self.current = open_segment(&self.dir, next, &mut self.spare)?;
        self.closed.push((self.segment, self.last_seq));
        self.segment = next;
        Ok(())
    }

    /// Deletes the closed segments whose records are all at or before `covered`, which the
    /// caller has made durable in the inner store.
    pub(super) fn remove_covered(&mut self, covered: u64) {
        let dir = &self.dir;
        let before = self.closed.len();
        let newest = (self.closed.iter())
            .filter(|&&(_, last_seq)| last_seq <= covered)
            .map(|&(segment, _)| segment)
            .next_back();
        let spare = &mut self.spare;
        self.closed.retain(|&(segment, last_seq)| {
            let done = last_seq <= covered;
            if done {
                if !*spare && Some(segment) == newest && keep_as_spare(dir, segment) {
                    *spare = true;
                } else {
                    remove(&segment_path(dir, segment));
                }
            }
            !done
        });
        // Not needed for safety (a segment that comes back holds only records at or before the
        // store's position, which replay skips), but
        // it keeps a power cut from bringing back a pile of old segments to read at start.
        if self.closed.len() < before
            && let Err(e) = sync_dir(dir)
        {
            tracing::warn!(error = %chain(&e), "could not sync the log folder after deleting segments");
        }
    }

    pub(super) fn size_on_disk(&self) -> StoreResult<u64> {
        Ok(list_segments(&self.dir)?
            .iter()
            .filter_map(|(_, path)| fs::metadata(path).ok())
            .map(|m| m.len())
            .sum())
    }
}

/// The records in `dir`'s segments after position `after`, in order, to `visit`. Records at or
/// before the last one read (or `after`) are skipped: checkpointed ones, or those of a spare
/// renamed but not yet written. The log ends at the first torn or corrupt record (a write cut
/// off by a crash, never acknowledged; a recycled segment's old bytes fail their checksum under
/// its new salt), or at a record past the next number: what follows a lost write was never
/// acknowledged either. Any record
/// after that end means damage to acknowledged data, and opening stops there rather than skip
/// it. The end is cut off its segment (durably), so that segments written after it, before this
/// one is deleted, do not look like damage at the next open.
pub(super) fn read_all(
    dir: &Path,
    after: u64,
    mut visit: impl FnMut(u64, Vec<KvOp>) -> StoreResult<()>,
) -> StoreResult<()> {
    let mut last = after;
    // The segment that ends in a torn record, and the length of its whole records.
    let mut ended_at: Option<(PathBuf, usize)> = None;
    for (_, path) in list_segments(dir)? {
        let bytes = fs::read(&path).map_err(|e| io_error("reading", &path, e))?;
        let (salt, mut rest) = segment_body(&bytes);
        if let Some((torn, _)) = &ended_at {
            // Records read already (a recycled segment left before its first write) are not
            // damage; one past the end is.
            if holds_records_after(rest, salt, last) {
                return Err(StoreError::corrupt_msg(format!(
                    "write-ahead log: {} has a damaged record but the later {} holds records; \
                     move the log aside to open without them",
                    torn.display(),
                    path.display()
                )));
            }
            continue;
        }
        while !rest.is_empty() {
            let record = decode_record(rest, salt).filter(|(seq, _, _)| *seq <= last + 1);
            let Some((seq, ops, tail)) = record else {
                tracing::warn!(segment = %path.display(), "write-ahead log ends in a torn record or past a gap; that was never acknowledged");
                ended_at = Some((path.clone(), bytes.len() - rest.len()));
                break;
            };
            rest = tail;
            if seq == last + 1 {
                last = seq;
                visit(seq, ops)?;
            }
        }
    }
    match ended_at {
        Some((path, whole)) => cut_torn_tail(&path, whole as u64),
        None => Ok(()),
    }
}

/// A segment's salt and records: after its header, or (written before segments had one) the
/// whole file with salt 0.
fn segment_body(bytes: &[u8]) -> (u32, &[u8]) {
    match bytes.split_first_chunk::<SEGMENT_HEADER>() {
        Some((header, records)) if header.starts_with(&SEGMENT_MAGIC) => {
            let salt = take_u32(&header[SALT_AT..]).map_or(0, |(salt, _)| salt);
            (salt, records)
        }
        _ => (0, bytes),
    }
}

/// The header [`segment_body`] reads.
fn segment_header(salt: u32) -> [u8; SEGMENT_HEADER] {
    let mut header = [0; SEGMENT_HEADER];
    header[..SALT_AT].copy_from_slice(&SEGMENT_MAGIC);
    header[SALT_AT..SALT_AT + 4].copy_from_slice(&salt.to_le_bytes());
    header
}

/// Whether `records` hold a whole record numbered after `last`.
fn holds_records_after(mut records: &[u8], salt: u32, last: u64) -> bool {
    while let Some((seq, _, rest)) = decode_record(records, salt) {
        if seq > last {
            return true;
        }
        records = rest;
    }
    false
}

/// XORs the checksum of each record in `records` (whole records, as encoded) with `salt`.
fn salt_records(records: &mut [u8], salt: u32) {
    let mut at = 0;
    while let Some(header) = records.get_mut(at..at + RECORD_HEADER) {
        let (len, crc) = header.split_at_mut(4);
        let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let salted = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]) ^ salt;
        crc.copy_from_slice(&salted.to_le_bytes());
        at += RECORD_HEADER + len;
    }
}

fn cut_torn_tail(path: &Path, whole: u64) -> StoreResult<()> {
    OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|file| {
            file.set_len(whole)?;
            file.sync_data()
        })
        .map_err(|e| io_error("cutting a torn record off", path, e))
}

/// A record stores lengths as u32.
pub(super) fn ensure_loggable(ops: &[KvOp]) -> StoreResult<()> {
    let fits = |bytes: &[u8]| bytes.len() < u32::MAX as usize;
    let ok = ops.len() < u32::MAX as usize
        && ops.iter().all(|op| match op {
            KvOp::Put(key, value) | KvOp::Create(key, value) => fits(key) && fits(value),
            KvOp::Delete(key) => fits(key),
        });
    if ok {
        Ok(())
    } else {
        Err(StoreError::backend_msg(
            "a write of 4 GiB or more cannot be logged",
        ))
    }
}

/// Creates the log folder and makes its entry durable in its parent.
pub(super) fn create_dir(dir: &Path) -> StoreResult<()> {
    durable::create_dir_all(dir).map_err(|e| io_error("creating", dir, e))
}

fn sync_dir(dir: &Path) -> StoreResult<()> {
    durable::sync_dir(dir).map_err(|e| io_error("syncing", dir, e))
}

pub(super) fn encode_record(out: &mut Vec<u8>, seq: u64, ops: &[KvOp]) {
    let start = out.len();
    out.extend_from_slice(&[0; RECORD_HEADER]);
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    let put_bytes = |out: &mut Vec<u8>, bytes: &[u8]| {
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(bytes);
    };
    for op in ops {
        match op {
            KvOp::Delete(key) => {
                out.push(0);
                put_bytes(out, key);
            }
            // Logged as a put: replayed, a creation is one (what it saves is only the memtable's).
            KvOp::Put(key, value) | KvOp::Create(key, value) => {
                out.push(1);
                put_bytes(out, key);
                put_bytes(out, value);
            }
        }
    }
    let payload_len = (out.len() - start - RECORD_HEADER) as u32;
    let crc = crc32fast::hash(&out[start + RECORD_HEADER..]);
    out[start..start + 4].copy_from_slice(&payload_len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// One record off the front of `bytes`, its checksum salted with `salt`: its sequence number,
/// its operations and what follows.
fn decode_record(bytes: &[u8], salt: u32) -> Option<(u64, Vec<KvOp>, &[u8])> {
    let (len, rest) = take_u32(bytes)?;
    let (crc, rest) = take_u32(rest)?;
    let payload = rest.get(..len as usize)?;
    if crc32fast::hash(payload) ^ salt != crc {
        return None;
    }
    let (seq, body) = payload.split_first_chunk::<8>()?;
    let (count, mut body) = take_u32(body)?;
    let mut ops = Vec::with_capacity(count.min(1024) as usize);
    for _ in 0..count {
        let (&kind, rest) = body.split_first()?;
        let (key, rest) = take_bytes(rest)?;
        body = rest;
        ops.push(match kind {
            0 => KvOp::Delete(key.to_vec()),
            1 => {
                let (value, rest) = take_bytes(body)?;
                body = rest;
                KvOp::Put(key.to_vec(), value.to_vec())
            }
            _ => return None,
        });
    }
    Some((u64::from_le_bytes(*seq), ops, &rest[len as usize..]))
}

fn take_u32(bytes: &[u8]) -> Option<(u32, &[u8])> {
    let (head, rest) = bytes.split_first_chunk::<4>()?;
    Some((u32::from_le_bytes(*head), rest))
}

fn take_bytes(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, rest) = take_u32(bytes)?;
    let len = len as usize;
    (rest.len() >= len).then(|| rest.split_at(len))
}

pub(super) fn segment_path(dir: &Path, segment: u64) -> PathBuf {
    dir.join(format!("{segment:020}.log"))
}

/// The log's segments, oldest first.
pub(super) fn list_segments(dir: &Path) -> StoreResult<Vec<(u64, PathBuf)>> {
    let entries = fs::read_dir(dir).map_err(|e| io_error("listing", dir, e))?;
    let mut segments: Vec<(u64, PathBuf)> = entries
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let name = entry.file_name();
            let number = name.to_str()?.strip_suffix(".log")?.parse().ok()?;
            Some((number, entry.path()))
        })
        .collect();
    segments.sort();
    Ok(segments)
}

/// The segment being written, its header written.
struct Current {
    file: File,
    /// Bytes in it, its header included.
    bytes: u64,
    /// What its records' checksums are XORed with.
    salt: u32,
    /// The file's length when it was the spare (its old bytes follow what is written).
    recycled_len: u64,
}

/// Opens `segment` to be written: the spare written over if there is one, else a new, empty
/// file; then writes its header with a new salt (synced with the first records).
fn open_segment(dir: &Path, segment: u64, spare: &mut bool) -> StoreResult<Current> {
    let path = segment_path(dir, segment);
    let (mut file, recycled_len) = match recycle_spare(dir, &path, spare)? {
        Some(recycled) => recycled,
        None => (create_segment(dir, segment)?, 0),
    };
    let salt = rand::random::<u32>().max(1);
    file.write_all(&segment_header(salt))
        .map_err(|e| io_error("writing the header of", &path, e))?;
    Ok(Current {
        file,
        bytes: SEGMENT_HEADER as u64,
        salt,
        recycled_len,
    })
}

/// The spare renamed to `path` and opened, with its length, if there is one. Should opening
/// it fail, it goes back to being the spare: left under the segment's name, its old records
/// would follow a crash's torn record as a later segment.
fn recycle_spare(dir: &Path, path: &Path, spare: &mut bool) -> StoreResult<Option<(File, u64)>> {
    if !std::mem::take(spare) {
        return Ok(None);
    }
    if let Err(e) = fs::rename(dir.join(SPARE), path) {
        tracing::warn!(error = %chain(&e), "could not reuse the spare log segment");
        return Ok(None);
    }
    let opened = OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|file| Ok((file.metadata()?.len(), file)))
        // The name is durable before anything is written under it.
        .and_then(|(len, file)| durable::sync_dir(dir).map(|()| (file, len)));
    match opened {
        Ok(opened) => Ok(Some(opened)),
        Err(e) => {
            if fs::rename(path, dir.join(SPARE)).is_err() {
                remove(path);
            }
            Err(io_error("reusing the spare as", path, e))
        }
    }
}

/// Keeps a checkpointed segment as the spare. Its records are all at or before the store's
/// position: should a power cut bring the old name back, they read as such.
fn keep_as_spare(dir: &Path, segment: u64) -> bool {
    let path = segment_path(dir, segment);
    if fs::metadata(&path).map_or(true, |m| m.len() > SPARE_MAX_BYTES) {
        return false;
    }
    match fs::rename(&path, dir.join(SPARE)) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(segment, error = %chain(&e), "could not keep a log segment to reuse");
            false
        }
    }
}

/// Creates an empty segment and makes its name durable (a synced record in an unsynced
/// directory entry could vanish with it).
fn create_segment(dir: &Path, segment: u64) -> StoreResult<File> {
    let path = segment_path(dir, segment);
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)
        .map_err(|e| io_error("creating", &path, e))?;
    sync_dir(dir)?;
    Ok(file)
}

fn remove(path: &Path) {
    if let Err(e) = fs::remove_file(path) {
        tracing::warn!(segment = %path.display(), error = %chain(&e), "could not delete a checkpointed log segment");
    }
}

pub(super) fn io_error(what: &str, path: &Path, e: std::io::Error) -> StoreError {
    StoreError::backend(
        format_args!("write-ahead log: {what} {}", path.display()),
        e,
    )
}
