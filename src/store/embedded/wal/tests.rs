use super::log::{encode_record, list_segments, segment_path};
use super::*;
use crate::store::embedded::sled_backend::SledBackend;
use std::fs;
use std::path::PathBuf;

fn put(key: &str, value: &str) -> KvOp {
    KvOp::Put(key.as_bytes().to_vec(), value.as_bytes().to_vec())
}

fn value(backend: &impl KvBackend, key: &str) -> Option<String> {
    backend
        .get(key.as_bytes())
        .unwrap()
        .map(|v| String::from_utf8(v).unwrap())
}

fn keys(backend: &impl KvBackend, reverse: bool) -> Vec<String> {
    backend
        .scan(Bound::Unbounded, Bound::Excluded(b"z".to_vec()), reverse)
        .map(|entry| String::from_utf8(entry.unwrap().0).unwrap())
        .collect()
}

fn sled_at(dir: &Path) -> SledBackend {
    SledBackend::open(dir, 1 << 20).unwrap()
}

/// A sled store as a crash left it: holding `write`, at log position `seq`.
fn sled_holding(dir: &Path, write: KvOp, seq: u64) {
    sled_at(dir).apply(vec![write, applied(seq)]).unwrap();
}

/// Writes a segment by hand, as a crashed server would have left it.
fn write_segment(dir: &Path, segment: u64, records: &[(u64, Vec<KvOp>)], torn_tail: bool) {
    let mut bytes = Vec::new();
    for (seq, ops) in records {
        let mut ops = ops.clone();
        ops.push(applied(*seq));
        encode_record(&mut bytes, *seq, &ops);
    }
    if torn_tail {
        let mut torn = Vec::new();
        encode_record(&mut torn, 99, &[put("torn", "x")]);
        bytes.extend_from_slice(&torn[..torn.len() - 3]);
    }
    fs::create_dir_all(dir).unwrap();
    fs::write(segment_path(dir, segment), bytes).unwrap();
}

/// Checkpoints only when asked to (or at a stop): a test sees the log before it is moved.
fn no_periodic_checkpoints() -> WalLimits {
    WalLimits {
        checkpoint_every: Duration::from_secs(3600),
        ..WalLimits::default()
    }
}

/// Opens, in `dir`, what a crash leaves: a store holding `write` at position `seq`, and a copy
/// of `wal`'s segments as they are.
fn reopened_after_a_crash(
    dir: &Path,
    wal: &Path,
    write: KvOp,
    seq: u64,
) -> WalBackend<SledBackend> {
    let crashed_wal = dir.join("wal");
    sled_holding(dir, write, seq);
    fs::create_dir_all(&crashed_wal).unwrap();
    for (segment, path) in list_segments(wal).unwrap() {
        fs::copy(path, segment_path(&crashed_wal, segment)).unwrap();
    }
    WalBackend::open(sled_at(dir), &crashed_wal, WalLimits::default()).unwrap()
}

/// The log of a crash: segment 3 holds batches 1 and 2 (the store, at 1, has the first), and
/// segment 4 batch 3 and a torn record.
fn crashed_log(dir: &Path) -> PathBuf {
    let wal = dir.join("wal");
    sled_holding(dir, put("a", "1"), 1);
    write_segment(
        &wal,
        3,
        &[(1, vec![put("a", "stale")]), (2, vec![put("a", "2")])],
        false,
    );
    write_segment(
        &wal,
        4,
        &[(3, vec![put("b", "3"), KvOp::Delete(b"a".to_vec())])],
        true,
    );
    wal
}

fn segments(wal: &Path) -> Vec<u64> {
    list_segments(wal).unwrap().iter().map(|s| s.0).collect()
}

#[test]
fn replays_logged_batches_the_inner_store_missed_and_stops_at_a_torn_record() {
    let dir = tempfile::tempdir().unwrap();
    let wal = crashed_log(dir.path());
    let backend = WalBackend::open(sled_at(dir.path()), &wal, no_periodic_checkpoints()).unwrap();
    assert_eq!(
        value(&backend, "a"),
        None,
        "2 then 3 replayed in order; 1 skipped"
    );
    assert_eq!(value(&backend, "b").as_deref(), Some("3"));
    assert_eq!(
        value(&backend, "torn"),
        None,
        "a torn record was never acknowledged"
    );
    assert_eq!(
        backend.shared.inner.get(APPLIED_KEY).unwrap(),
        Some(1u64.to_le_bytes().to_vec()),
        "opening leaves the replayed batches to the first checkpoint"
    );
    assert_eq!(
        segments(&wal),
        vec![3, 4, 5],
        "kept until the store has them"
    );
    backend.apply(vec![put("c", "4")]).unwrap();
    backend.flush().unwrap();
    assert_eq!(
        backend.shared.pending.lock().last_seq,
        4,
        "numbering continues"
    );
    drop(backend);
    assert_eq!(
        sled_at(dir.path()).get(APPLIED_KEY).unwrap(),
        Some(4u64.to_le_bytes().to_vec()),
        "the stop's checkpoint moved the replayed batches and the new one"
    );
    assert_eq!(
        segments(&wal),
        vec![6],
        "replayed segments are deleted once the store has them"
    );
}

#[test]
fn a_crash_before_the_replayed_log_reaches_the_store_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let wal = crashed_log(dir.path());
    let backend = WalBackend::open(sled_at(dir.path()), &wal, no_periodic_checkpoints()).unwrap();
    backend.apply(vec![put("c", "4")]).unwrap();
    backend.flush().unwrap();
    // What a crash now leaves: the store as opening found it, the old segments (the torn
    // record cut off) and the new one after them.
    let crashed = tempfile::tempdir().unwrap();
    let reopened = reopened_after_a_crash(crashed.path(), &wal, put("a", "1"), 1);
    assert_eq!(value(&reopened, "a"), None);
    assert_eq!(value(&reopened, "b").as_deref(), Some("3"));
    assert_eq!(value(&reopened, "c").as_deref(), Some("4"));
    assert_eq!(value(&reopened, "torn"), None);
}

#[test]
fn an_inner_store_ahead_of_the_log_is_not_rolled_back() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    sled_holding(dir.path(), put("a", "6"), 6);
    write_segment(
        &wal,
        0,
        &[(4, vec![put("a", "4")]), (5, vec![put("a", "5")])],
        false,
    );
    let backend = WalBackend::open(sled_at(dir.path()), &wal, WalLimits::default()).unwrap();
    assert_eq!(value(&backend, "a").as_deref(), Some("6"));
    backend.apply(vec![put("a", "7")]).unwrap();
    assert_eq!(backend.shared.pending.lock().last_seq, 7);
}

#[test]
fn acknowledged_writes_survive_when_only_the_log_has_them() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    let backend = WalBackend::open(sled_at(dir.path()), &wal, WalLimits::default()).unwrap();
    for i in 0..50 {
        backend
            .apply(vec![put(&format!("k{i:02}"), &i.to_string())])
            .unwrap();
    }
    backend.flush().unwrap();
    // What a crash right now leaves: the synced log over a store that never saw the writes.
    let segment = fs::read(&list_segments(&wal).unwrap().last().unwrap().1).unwrap();
    let crashed = tempfile::tempdir().unwrap();
    let crashed_wal = crashed.path().join("wal");
    fs::create_dir_all(&crashed_wal).unwrap();
    fs::write(segment_path(&crashed_wal, 0), segment).unwrap();
    let reopened =
        WalBackend::open(sled_at(crashed.path()), &crashed_wal, WalLimits::default()).unwrap();
    for i in 0..50 {
        assert_eq!(value(&reopened, &format!("k{i:02}")), Some(i.to_string()));
    }
}

#[test]
fn reads_merge_the_memtable_over_the_store_before_and_after_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let backend = WalBackend::open(
        sled_at(dir.path()),
        &dir.path().join("wal"),
        WalLimits::default(),
    )
    .unwrap();
    backend
        .apply(vec![put("a", "1"), put("b", "1"), put("d", "1")])
        .unwrap();
    backend.flush().unwrap();
    backend.shared.checkpoint().unwrap();
    assert!(backend.shared.tables.read().frozen.is_none());
    assert!(
        backend.shared.tables.read().active.is_empty(),
        "moved into sled"
    );
    backend
        .apply(vec![
            put("c", "2"),
            KvOp::Delete(b"b".to_vec()),
            put("d", "2"),
        ])
        .unwrap();
    let expect = |backend: &WalBackend<SledBackend>| {
        assert_eq!(keys(backend, false), ["a", "c", "d"]);
        assert_eq!(keys(backend, true), ["d", "c", "a"]);
        assert_eq!(value(backend, "b"), None);
        assert_eq!(value(backend, "d").as_deref(), Some("2"));
    };
    expect(&backend);
    backend.flush().unwrap();
    backend.shared.freeze().unwrap();
    expect(&backend);
    // One write in each layer: "e" active, "c" and "d" frozen, "a" in sled.
    backend.apply(vec![put("e", "3")]).unwrap();
    assert_eq!(keys(&backend, false), ["a", "c", "d", "e"]);
    backend.shared.checkpoint().unwrap();
    assert_eq!(keys(&backend, true), ["e", "d", "c", "a"]);
    backend.apply(vec![KvOp::Delete(b"e".to_vec())]).unwrap();
    backend.flush().unwrap();
    backend.shared.checkpoint().unwrap();
    expect(&backend);
    drop(backend);
    let reopened = WalBackend::open(
        sled_at(dir.path()),
        &dir.path().join("wal"),
        WalLimits::default(),
    )
    .unwrap();
    expect(&reopened);
}

/// The conversation index's moves (`WriteBatch::put_conversation`): the one entry deleted, its
/// successor created, with checkpoints between any two moves and a move onto the same key (two
/// writes in one millisecond).
#[test]
fn an_entry_moved_by_delete_and_create_stays_one_entry_across_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    let backend = WalBackend::open(sled_at(dir.path()), &wal, no_periodic_checkpoints()).unwrap();
    let create = |key: &str| KvOp::Create(key.as_bytes().to_vec(), Vec::new());
    let delete = |key: &str| KvOp::Delete(key.as_bytes().to_vec());
    backend.apply(vec![put("i1", "")]).unwrap();
    // Each move, then whether a checkpoint follows it.
    let moves = [
        ("i1", "i2", true),
        ("i2", "i3", false),
        ("i3", "i3", false),
        ("i3", "i4", true),
        ("i4", "i4", true),
        ("i4", "i5", false),
        ("i5", "i6", false),
    ];
    for (from, to, checkpoint) in moves {
        backend.apply(vec![delete(from), create(to)]).unwrap();
        backend.flush().unwrap();
        assert_eq!(keys(&backend, false), [to], "after moving {from} to {to}");
        if checkpoint {
            backend.shared.checkpoint().unwrap();
            assert_eq!(keys(&backend, false), [to], "after checkpointing {to}");
        }
    }
    // i5 was created and moved on within one table: nothing of it is left to write into sled.
    let pending = backend
        .shared
        .tables
        .read()
        .active
        .writes_after(None, 16, usize::MAX);
    let pending: Vec<_> = pending.iter().map(|op| op.key().to_vec()).collect();
    assert_eq!(pending, [b"i4".to_vec(), b"i6".to_vec()]);
    drop(backend);
    let reopened = WalBackend::open(sled_at(dir.path()), &wal, WalLimits::default()).unwrap();
    assert_eq!(keys(&reopened, false), ["i6"]);
}

#[test]
fn a_checkpoint_does_not_wait_for_a_reader_and_the_reader_keeps_its_view() {
    let dir = tempfile::tempdir().unwrap();
    let backend = WalBackend::open(
        sled_at(dir.path()),
        &dir.path().join("wal"),
        WalLimits::default(),
    )
    .unwrap();
    backend.apply(vec![put("a", "1"), put("b", "1")]).unwrap();
    backend.flush().unwrap();
    let mut held = backend.scan(Bound::Unbounded, Bound::Excluded(b"z".to_vec()), false);
    let first = held.next().unwrap().unwrap();
    backend.apply(vec![put("c", "2")]).unwrap();
    backend.flush().unwrap();
    // Moves "a" and "b" into sled and drops the table the held scan reads.
    backend.shared.checkpoint().unwrap();
    backend.shared.checkpoint().unwrap();
    let rest: Vec<Vec<u8>> = held.map(|entry| entry.unwrap().0).collect();
    assert_eq!(first.0, b"a");
    assert_eq!(
        rest[0], b"b",
        "the held scan still sees what moved into sled"
    );
    assert_eq!(keys(&backend, false), ["a", "b", "c"]);
}

#[test]
fn after_a_failed_log_write_nothing_more_is_acknowledged_or_checkpointed() {
    let dir = tempfile::tempdir().unwrap();
    let backend = WalBackend::open(
        sled_at(dir.path()),
        &dir.path().join("wal"),
        WalLimits::default(),
    )
    .unwrap();
    backend.apply(vec![put("k", "v")]).unwrap();
    backend.shared.segments.lock().fail_writes_for_test();
    assert!(
        backend.shared.freeze().is_err(),
        "the cut could not be logged"
    );
    assert!(
        backend.flush().is_err(),
        "its batch must not be acknowledged"
    );
    assert!(backend.apply(vec![put("k2", "v")]).is_err());
    assert!(backend.shared.checkpoint().is_err());
    assert_eq!(
        backend.shared.inner.get(b"k").unwrap(),
        None,
        "an unlogged cut never reaches sled"
    );
}

#[test]
fn a_damaged_record_before_later_segments_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    write_segment(&wal, 0, &[(1, vec![put("a", "1")])], true);
    write_segment(&wal, 1, &[(2, vec![put("b", "2")])], false);
    let opened = WalBackend::open(sled_at(dir.path()), &wal, WalLimits::default());
    assert!(matches!(opened, Err(StoreError::Corrupt { .. })));
}

/// Writers wait for a checkpoint once the memtable holds its limit, so the log's memory is
/// what it was given (a container's share), whatever the load; nothing is lost by waiting.
#[test]
fn the_memtable_stays_within_its_limit() {
    let dir = tempfile::tempdir().unwrap();
    // No timed checkpoints: only the limit starts them.
    let limits = WalLimits {
        checkpoint_every: Duration::from_secs(3600),
        memtable_bytes: 64 << 10,
        ..WalLimits::default()
    };
    let backend = WalBackend::open(sled_at(dir.path()), &dir.path().join("wal"), limits).unwrap();
    let text = "v".repeat(1024);
    let mut largest = 0;
    for i in 0..1_000 {
        backend
            .apply(vec![put(&format!("k{i:04}"), &text)])
            .unwrap();
        largest = largest.max(backend.shared.tables.read().active.bytes());
    }
    // At most one batch past the limit: the one that found it full.
    assert!(largest <= limits.memtable_bytes + 4096, "largest {largest}");
    assert_eq!(keys(&backend, false).len(), 1_000);
    assert_eq!(value(&backend, "k0999").as_deref(), Some(text.as_str()));
}

/// The sequence number of the last batch the inner store has (0: none).
fn applied_in_store(backend: &WalBackend<SledBackend>) -> u64 {
    backend
        .shared
        .inner
        .get(APPLIED_KEY)
        .unwrap()
        .map_or(0, |bytes| u64::from_le_bytes(bytes.try_into().unwrap()))
}

/// Polls until the inner store has batch `seq`, for up to `within`.
fn store_reaches(backend: &WalBackend<SledBackend>, seq: u64, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if applied_in_store(backend) >= seq {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// A log whose checkpoint thread looks every 10 ms.
fn ticking_every_10ms(dir: &Path, min_bytes: usize, max_wait: Duration) -> WalBackend<SledBackend> {
    let limits = WalLimits {
        checkpoint_every: Duration::from_millis(10),
        checkpoint_min_bytes: min_bytes,
        checkpoint_max_wait: max_wait,
        ..WalLimits::default()
    };
    WalBackend::open(sled_at(dir), &dir.join("wal"), limits).unwrap()
}

/// A timed checkpoint waits while the memtable holds less than its minimum, and runs at the next
/// tick once it holds that much.
#[test]
fn a_small_memtable_waits_for_more_writes_before_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let backend = ticking_every_10ms(dir.path(), 16 << 10, Duration::from_secs(3600));
    backend.apply(vec![put("small", "x")]).unwrap();
    backend.flush().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(applied_in_store(&backend), 0, "30 ticks and no checkpoint");
    assert_eq!(value(&backend, "small").as_deref(), Some("x"));
    let text = "v".repeat(1024);
    for i in 0..16 {
        backend
            .apply(vec![put(&format!("k{i:02}"), &text)])
            .unwrap();
    }
    backend.flush().unwrap();
    assert!(
        store_reaches(&backend, 17, Duration::from_secs(5)),
        "past its minimum, the memtable moved at a tick"
    );
    assert_eq!(value(&backend, "small").as_deref(), Some("x"));
}

/// However little it holds, a memtable is moved at the latest its longest wait after the last
/// checkpoint, so the log replayed after a crash stays short under light load.
#[test]
fn a_small_memtable_is_moved_after_its_longest_wait() {
    let dir = tempfile::tempdir().unwrap();
    let backend = ticking_every_10ms(dir.path(), 1 << 30, Duration::from_millis(200));
    let started = Instant::now();
    backend.apply(vec![put("small", "x")]).unwrap();
    backend.flush().unwrap();
    assert!(store_reaches(&backend, 1, Duration::from_secs(5)));
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "moved after {:?}, before its wait",
        started.elapsed()
    );
}

/// A checkpointed segment becomes the next one, written over from its start, and rotation
/// cuts its old records off once it is closed.
#[test]
fn checkpointed_segments_are_written_over_and_cut_when_closed() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    let backend = WalBackend::open(sled_at(dir.path()), &wal, no_periodic_checkpoints()).unwrap();
    let text = "v".repeat(1024);
    for i in 0..64 {
        backend
            .apply(vec![put(&format!("k{i:02}"), &text)])
            .unwrap();
    }
    backend.flush().unwrap();
    backend.shared.checkpoint().unwrap();
    let spare = wal.join(log::SPARE);
    let spare_len = fs::metadata(&spare).unwrap().len();
    assert!(spare_len > 64 * 1024, "the checkpointed segment is kept");
    backend.apply(vec![put("a", "1")]).unwrap();
    backend.flush().unwrap();
    backend.shared.checkpoint().unwrap();
    let current = || list_segments(&wal).unwrap().last().unwrap().1.clone();
    assert_eq!(
        fs::metadata(current()).unwrap().len(),
        spare_len,
        "the spare became the segment written to, its length kept"
    );
    backend.apply(vec![put("b", "2")]).unwrap();
    backend.flush().unwrap();
    let closed = current();
    backend.shared.checkpoint().unwrap();
    let mut record = Vec::new();
    encode_record(&mut record, 0, &[put("b", "2"), applied(0)]);
    assert_eq!(
        fs::metadata(wal.join(log::SPARE)).unwrap().len(),
        (log::SEGMENT_HEADER + record.len()) as u64,
        "closed at rotation, it was cut to its header and its one record, then kept as the spare"
    );
    assert!(!closed.exists());
    assert_eq!(value(&backend, "b").as_deref(), Some("2"));
}

/// What a power cut can leave in a recycled segment: its last write lost, the old bytes under
/// it read as records again, and a later write kept. Old records are skipped; a record after a
/// gap in the numbers was never acknowledged (its predecessor was not synced) and is not read.
#[test]
fn a_recycled_segment_replays_its_new_records_only() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    sled_holding(dir.path(), put("a", "10"), 10);
    write_segment(
        &wal,
        7,
        &[
            (11, vec![put("a", "11")]),
            (3, vec![put("a", "3")]),
            (4, vec![put("old", "4")]),
            (13, vec![put("a", "13")]),
        ],
        false,
    );
    let backend = WalBackend::open(sled_at(dir.path()), &wal, no_periodic_checkpoints()).unwrap();
    assert_eq!(value(&backend, "a").as_deref(), Some("11"));
    assert_eq!(value(&backend, "old"), None);
    backend.apply(vec![put("c", "12")]).unwrap();
    assert_eq!(
        backend.shared.pending.lock().last_seq,
        12,
        "numbering goes on after the last record read"
    );
    backend.flush().unwrap();
    drop(backend);
    let reopened = WalBackend::open(sled_at(dir.path()), &wal, WalLimits::default()).unwrap();
    assert_eq!(value(&reopened, "a").as_deref(), Some("11"));
    assert_eq!(value(&reopened, "c").as_deref(), Some("12"));
}

/// A value can hold bytes shaped as records, checksums and all; in a recycled segment they lie
/// under the new records. After a crash that leaves them right after the last new record, they
/// do not check out: each segment's checksums are salted afresh.
#[test]
fn record_shaped_bytes_in_a_recycled_segments_old_values_are_not_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    let backend = WalBackend::open(sled_at(dir.path()), &wal, no_periodic_checkpoints()).unwrap();
    let mut forged = Vec::new();
    for seq in 1..=50u64 {
        encode_record(&mut forged, seq, &[put("admin", "pwned")]);
    }
    // The record written over it later ends where the forged records begin.
    let later = "v".repeat(100);
    let mut later_record = Vec::new();
    encode_record(&mut later_record, 3, &[put("v", &later), applied(3)]);
    let value_starts = 8 + 8 + 4 + 1 + 4 + 1 + 4;
    let mut shaped = vec![b'p'; later_record.len() - value_starts];
    shaped.extend_from_slice(&forged);
    backend
        .apply(vec![KvOp::Put(b"x".to_vec(), shaped)])
        .unwrap();
    backend.flush().unwrap();
    backend.shared.checkpoint().unwrap();
    backend.apply(vec![put("w", "2")]).unwrap();
    backend.flush().unwrap();
    backend.shared.checkpoint().unwrap();
    backend.apply(vec![put("v", &later)]).unwrap();
    backend.flush().unwrap();
    // What `kill -9` now leaves: these segments, over a store at position 2.
    let crashed = tempfile::tempdir().unwrap();
    let reopened = reopened_after_a_crash(crashed.path(), &wal, put("w", "2"), 2);
    assert_eq!(value(&reopened, "v").as_deref(), Some(later.as_str()));
    assert_eq!(
        value(&reopened, "admin"),
        None,
        "a batch never written was replayed"
    );
}

/// A recycled segment left before its first write (its old records only) after a segment that
/// ends torn is not damage: its records were all read already.
#[test]
fn old_records_after_a_torn_segment_do_not_refuse_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    sled_holding(dir.path(), put("a", "10"), 10);
    write_segment(&wal, 7, &[(11, vec![put("a", "11")])], true);
    write_segment(
        &wal,
        8,
        &[(3, vec![put("a", "3")]), (4, vec![put("a", "4")])],
        false,
    );
    let backend = WalBackend::open(sled_at(dir.path()), &wal, no_periodic_checkpoints()).unwrap();
    assert_eq!(value(&backend, "a").as_deref(), Some("11"));
}
