//! Unit tests of [`PartitionLog`]: append/read round trips across rolls,
//! index and time lookups, retention, truncation, the leader epoch
//! checkpoint, flushing, and recovery from torn or corrupt segments.
#![allow(clippy::unwrap_used)]

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use proptest::prelude::*;

use super::*;
use crate::log::batch::test_batches::build_batch;
use crate::log::leader_epoch::LEADER_EPOCH_CHECKPOINT_FILE;
use crate::log::segment::segment_file_name;

const TOPIC: &str = "orders";
const PARTITION: i32 = 3;

impl PartitionLog {
    /// `append_as_leader`, then the same rewrite of `records` the log made
    /// on disk (offsets, epoch, append time), so tests compare what they
    /// appended with what they read back.
    fn append_in_place(&mut self, records: &mut [u8], leader_epoch: i32, now_ms: i64) -> Result<AppendInfo> {
        let info = self.append_as_leader(records, leader_epoch, now_ms)?;
        let mut next_offset = info.base_offset;
        for range in split_record_set(records).expect("appended, so valid") {
            let batch_bytes = &mut records[range];
            if self.config.timestamp_type == TimestampType::LogAppendTime {
                batch::set_log_append_time(batch_bytes, now_ms);
            }
            batch::set_base_offset(batch_bytes, next_offset);
            batch::set_partition_leader_epoch(batch_bytes, leader_epoch);
            next_offset = BatchHeader::parse(batch_bytes).expect("valid").last_offset() + 1;
        }
        Ok(info)
    }
}

fn small_config() -> LogConfig {
    LogConfig {
        segment_bytes: 1024,
        segment_ms: 3_600_000,
        retention_ms: None,
        retention_bytes: None,
        flush_messages: None,
        flush_ms: None,
        index_interval_bytes: 128,
        segment_index_bytes: 4096,
        max_message_bytes: 4096,
        compact: false,
        ..LogConfig::default()
    }
}

fn open(dir: &Path, config: LogConfig, recovery_point: i64) -> PartitionLog {
    PartitionLog::open(dir, TOPIC, PARTITION, config, recovery_point, 0).expect("partition log test step")
}

fn payload(seed: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (seed * 31 + i) as u8).collect()
}

/// Appends `count` batches of 3 records, ~100 bytes each, timestamps
/// 1000, 2000, ...; returns the batches as stored (offsets assigned).
fn append_batches(log: &mut PartitionLog, count: usize, leader_epoch: i32) -> Vec<Vec<u8>> {
    (0..count)
        .map(|i| {
            let mut batch = build_batch(3, 1_000 * (i as i64 + 1), &payload(i, 40));
            log.append_in_place(&mut batch, leader_epoch, 0).expect("partition log test step");
            batch
        })
        .collect()
}

/// Reads every batch from the log start to the log end, one read at a time.
fn read_all(log: &PartitionLog) -> Vec<Vec<u8>> {
    let mut batches = Vec::new();
    let mut offset = log.log_start_offset();
    while offset < log.log_end_offset() {
        let bytes = log.read(offset, 1 << 20, i64::MAX).expect("partition log test step");
        assert!(!bytes.is_empty(), "no data at {offset} below the log end");
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let header = BatchHeader::validate(rest).expect("partition log test step");
            batches.push(rest[..header.total_size()].to_vec());
            offset = header.last_offset() + 1;
            rest = &rest[header.total_size()..];
        }
    }
    batches
}

fn segment_path(log: &PartitionLog, base_offset: i64) -> PathBuf {
    log.dir().join(segment_file_name(base_offset, ".log"))
}

#[test]
fn append_and_read_round_trip_across_rolls() {
    let dir = tempfile::tempdir().expect("partition log test step");
    let mut log = open(dir.path(), small_config(), 0);
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (0, 0));
    let mut first = build_batch(3, 1_000, b"first");
    let info = log.append_in_place(&mut first, 0, 0).expect("partition log test step");
    assert_eq!((info.base_offset, info.last_offset, info.record_count), (0, 2, 3));
    let mut batches = vec![first];
    batches.extend(append_batches(&mut log, 40, 0));
    assert_eq!(log.log_end_offset(), 41 * 3);
    assert!(log.segment_base_offsets().len() > 3, "small segments roll");
    assert!(log.segment_base_offsets().windows(2).all(|w| w[0] < w[1]));
    assert_eq!(read_all(&log), batches);
    // Every offset reads back starting with the batch that holds it.
    for offset in 0..log.log_end_offset() {
        let bytes = log.read(offset, 1, i64::MAX).expect("partition log test step");
        let header = BatchHeader::validate(&bytes).expect("partition log test step");
        assert!(header.base_offset() <= offset && offset <= header.last_offset());
        assert_eq!(header.total_size(), bytes.len(), "max_bytes 1 still returns one whole batch");
    }
    drop(log);
    let reopened = open(dir.path(), small_config(), 0);
    assert_eq!(reopened.log_end_offset(), 41 * 3);
    assert_eq!(read_all(&reopened), batches);
}

#[test]
fn read_respects_max_bytes_max_offset_and_range() {
    let dir = tempfile::tempdir().expect("partition log test step");
    let mut config = small_config();
    config.segment_bytes = 1 << 20;
    let mut log = open(dir.path(), config, 0);
    let batches = append_batches(&mut log, 5, 0);
    let size = batches[0].len();
    assert_eq!(log.read(0, size * 2 + size / 2, i64::MAX).expect("partition log test step").len(), size * 2);
    assert_eq!(log.read(3, size * 10, i64::MAX).expect("partition log test step").len(), size * 4);
    // The high watermark bounds what is returned.
    assert_eq!(log.read(0, size * 10, 6).expect("partition log test step").len(), size * 2);
    assert!(log.read(6, size * 10, 6).expect("partition log test step").is_empty());
    assert!(log.read(15, 100, i64::MAX).expect("partition log test step").is_empty(), "empty at the log end");
    assert!(matches!(log.read(16, 100, i64::MAX), Err(LogError::OffsetOutOfRange { offset: 16, .. })));
    assert!(matches!(log.read(-1, 100, i64::MAX), Err(LogError::OffsetOutOfRange { .. })));
}

#[test]
fn offset_index_is_used_for_lookups() {
    let dir = tempfile::tempdir().expect("partition log test step");
    let mut config = small_config();
    config.segment_bytes = 1 << 20;
    let mut log = open(dir.path(), config, 0);
    let batches = append_batches(&mut log, 30, 0);
    let segment = log.segments.values().next().expect("partition log test step");
    assert!(segment.offset_index().len() >= 10, "an entry about every 128 bytes");
    let entry = segment.offset_index().lookup(50);
    assert!(entry.offset <= 50 && entry.position > 0);
    let bytes = log.read(50, 1, i64::MAX).expect("partition log test step");
    assert_eq!(bytes.as_ref(), &batches[16][..]);
}

#[test]
fn rejects_too_large_and_corrupt_batches() {
    let dir = tempfile::tempdir().expect("partition log test step");
    let mut config = small_config();
    config.max_message_bytes = 200;
    let mut log = open(dir.path(), config, 0);
    let mut big = build_batch(1, 0, &[7u8; 300]);
    assert!(matches!(log.append_in_place(&mut big, 0, 0), Err(LogError::MessageTooLarge { size: 361, max: 200 })));
    let mut corrupt = build_batch(1, 0, b"abc");
    let last = corrupt.len() - 1;
    corrupt[last] ^= 1;
    assert!(matches!(log.append_in_place(&mut corrupt, 0, 0), Err(LogError::CorruptBatch(_))));
    // A record set with one good and one bad batch writes nothing.
    let mut set = build_batch(1, 0, b"good");
    set.extend_from_slice(&big);
    assert!(log.append_in_place(&mut set, 0, 0).is_err());
    assert_eq!((log.log_end_offset(), log.size_bytes()), (0, 0));
    let mut two = build_batch(2, 0, b"a");
    two.extend(build_batch(4, 0, b"b"));
    let info = log.append_in_place(&mut two, 0, 0).expect("partition log test step");
    assert_eq!((info.base_offset, info.last_offset, info.record_count), (0, 5, 6));
    assert_eq!(read_all(&log).len(), 2);
}

#[test]
fn offset_for_timestamp_finds_first_batch_at_or_after() {
    let dir = tempfile::tempdir().expect("partition log test step");
    let mut log = open(dir.path(), small_config(), 0);
    append_batches(&mut log, 30, 0); // batch i: offsets 3i..3i+2, timestamp 1000(i+1)
    let at = |ts| log.offset_for_timestamp(ts).expect("partition log test step");
    assert_eq!(at(0), Some(TimestampOffset { timestamp: 1_000, offset: 0 }));
    assert_eq!(at(1_000), Some(TimestampOffset { timestamp: 1_000, offset: 0 }));
    assert_eq!(at(1_001), Some(TimestampOffset { timestamp: 2_000, offset: 3 }));
    assert_eq!(at(17_500), Some(TimestampOffset { timestamp: 18_000, offset: 51 }));
    assert_eq!(at(30_000), Some(TimestampOffset { timestamp: 30_000, offset: 87 }));
    assert_eq!(at(30_001), None);
    drop(log);
    // After a clean reopen (indexes loaded, not rebuilt) the answers hold.
    let log = open(dir.path(), small_config(), i64::MAX);
    assert_eq!(log.offset_for_timestamp(17_500).expect("partition log test step").map(|found| found.offset), Some(51));
}

#[test]
fn offset_for_timestamp_matches_brute_force_with_unordered_timestamps() {
    let dir = tempfile::tempdir().expect("partition log test step");
    let mut log = open(dir.path(), small_config(), 0);
    let mut stored = Vec::new();
    for i in 0..60u64 {
        let timestamp = ((i * 7_919) % 61) as i64 * 100; // a permutation-like jumble
        let mut batch = build_batch(2, timestamp, &payload(i as usize, 30));
        log.append_in_place(&mut batch, 0, 0).expect("partition log test step");
        stored.push(batch);
    }
    for target in (0..6_200).step_by(50) {
        let expected = stored
            .iter()
            .map(|batch| BatchHeader::validate(batch).expect("partition log test step"))
            .find_map(|header| {
                (header.max_timestamp() >= target)
                    .then(|| TimestampOffset { timestamp: header.max_timestamp(), offset: header.base_offset() })
            });
        assert_eq!(log.offset_for_timestamp(target).expect("partition log test step"), expected, "target {target}");
    }
}

#[test]
fn rolls_by_segment_ms() {
    let dir = tempfile::tempdir().expect("partition log test step");
    let mut config = small_config();
    config.segment_ms = 1_000;
    let mut log = open(dir.path(), config, 0);
    log.append_in_place(&mut build_batch(1, 0, b"a"), 0, 10).expect("partition log test step");
    log.append_in_place(&mut build_batch(1, 0, b"b"), 0, 500).expect("partition log test step");
    assert_eq!(log.segment_base_offsets(), vec![0]);
    log.append_in_place(&mut build_batch(1, 0, b"c"), 0, 1_000).expect("partition log test step");
    assert_eq!(log.segment_base_offsets(), vec![0, 2]);
    assert_eq!(log.recovery_point(), 0, "the sealed segment waits for the next flush");
    log.flush().expect("partition log test step");
    assert_eq!(log.recovery_point(), 3);
}

#[test]
fn retention_by_time_deletes_old_sealed_segments() {
    let dir = tempfile::tempdir().expect("partition log test step");
    let mut config = small_config();
    config.retention_ms = Some(10_000);
    let mut log = open(dir.path(), config, 0);
    append_batches(&mut log, 30, 0); // timestamps 1000..=30000
    let bases = log.segment_base_offsets();
    // The high watermark protects everything: nothing goes.
    assert_eq!(log.apply_retention(100_000, 0).expect("partition log test step").deleted_segments, 0);
    // At now = 25000, segments whose largest timestamp is < 15000 go.
    let outcome = log.apply_retention(25_000, log.log_end_offset()).expect("partition log test step");
    assert!(outcome.deleted_segments > 0);
    let start = log.log_start_offset();
    assert!(start > 0 && bases.contains(&start));
    let first_kept = log.offset_for_timestamp(0).expect("partition log test step").expect("partition log test step");
    assert_eq!(first_kept.offset, start);
    assert!(first_kept.timestamp >= 15_000 - 1_000 * 4, "only whole segments are deleted");
    assert!(matches!(log.read(0, 100, i64::MAX), Err(LogError::OffsetOutOfRange { .. })));
    // Far in the future every sealed segment goes, the active one stays.
    log.apply_retention(1_000_000, log.log_end_offset()).expect("partition log test step");
    assert_eq!(log.segment_base_offsets().len(), 1);
    assert_eq!(log.log_end_offset(), 90);
    assert_eq!(read_all(&log).len(), 90 / 3 - log.log_start_offset() as usize / 3);
}

#[test]
fn retention_by_size_keeps_at_most_retention_bytes() {
    let dir = tempfile::tempdir().expect("partition log test step");
    let mut config = small_config();
    config.retention_bytes = Some(2_000);
    let mut log = open(dir.path(), config, 0);
    append_batches(&mut log, 60, 0);
    let before = log.size_bytes();
    let outcome = log.apply_retention(0, log.log_end_offset()).expect("partition log test step");
    assert!(outcome.deleted_segments > 0);
    assert_eq!(log.size_bytes(), before - outcome.deleted_bytes);
    assert!(log.size_bytes() <= 2_000 + 1024, "within one segment of the limit");
    assert!(log.size_bytes() > 2_000 - 1024);
}

#[test]
fn truncate_to_removes_the_tail_and_epochs() {
    let dir = tempfile::tempdir().expect("partition log test step");
    let mut log = open(dir.path(), small_config(), 0);
    let mut batches = append_batches(&mut log, 20, 1);
    batches.extend(append_batches(&mut log, 20, 4));
    assert_eq!(log.end_offset_for_epoch(1).expect("partition log test step").end_offset, 60);
    // Offset 64 is inside the batch 63..=65: the whole batch goes.
    assert!(log.truncate_to(64).expect("partition log test step"));
    assert_eq!(log.log_end_offset(), 63);
    assert_eq!(read_all(&log), batches[..21]);
    assert_eq!(log.latest_epoch(), Some(4));
    assert!(log.truncate_to(45).expect("partition log test step"));
    assert_eq!(log.log_end_offset(), 45);
    assert_eq!(log.epoch_entries(), &[EpochEntry { epoch: 1, start_offset: 0 }]);
    assert!(!log.truncate_to(100).expect("partition log test step"), "nothing past the log end");
    // Appends continue from the new log end; the state survives a reopen.
    let info = log.append_in_place(&mut build_batch(2, 99_000, b"new"), 5, 0).expect("partition log test step");
    assert_eq!(info.base_offset, 45);
    drop(log);
    let log = open(dir.path(), small_config(), 0);
    assert_eq!(log.log_end_offset(), 47);
    assert_eq!(read_all(&log).len(), 16);
    assert_eq!(log.end_offset_for_epoch(1), Some(EpochEndOffset { leader_epoch: 1, end_offset: 45 }));
    assert_eq!(log.end_offset_for_epoch(5), Some(EpochEndOffset { leader_epoch: 5, end_offset: 47 }));
}

#[test]
fn truncate_fully_and_start_at_resets_the_log() {
    let dir = tempfile::tempdir().expect("partition log test step");
    let mut log = open(dir.path(), small_config(), 0);
    append_batches(&mut log, 30, 2);
    log.truncate_fully_and_start_at(500).expect("partition log test step");
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (500, 500));
    assert_eq!(log.segment_base_offsets(), vec![500]);
    assert!(log.epoch_entries().is_empty());
    let info = log.append_in_place(&mut build_batch(1, 0, b"x"), 3, 0).expect("partition log test step");
    assert_eq!(info.base_offset, 500);
    drop(log);
    let log = open(dir.path(), small_config(), 0);
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (500, 501));
    // Truncating below the log start empties the log and starts it there.
    let mut log = log;
    log.truncate_to(100).expect("partition log test step");
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (100, 100));
}

#[test]
fn advance_start_hides_records_deletes_whole_segments_and_persists() {
    let dir = tempfile::tempdir().expect("partition log test step");
    let mut log = open(dir.path(), small_config(), 0);
    append_batches(&mut log, 30, 2); // 90 records over several segments
    let bases = log.segment_base_offsets();
    assert!(bases.len() >= 3, "{bases:?}");
    // Inside the third segment: the two before it go, the third stays.
    let target = bases[2] + 1;
    assert!(log.advance_start(target).expect("partition log test step"));
    assert_eq!(log.log_start_offset(), target);
    assert_eq!(log.segment_base_offsets()[0], bases[2]);
    assert!(matches!(log.read(target - 1, 1 << 20, i64::MAX), Err(LogError::OffsetOutOfRange { .. })));
    assert!(!log.read(target, 1 << 20, i64::MAX).expect("partition log test step").is_empty());
    // Not backwards, and never past the log end.
    assert!(!log.advance_start(target - 1).expect("partition log test step"));
    drop(log);
    let mut log = open(dir.path(), small_config(), 0);
    assert_eq!(log.log_start_offset(), target, "kept across a restart");
    assert!(log.advance_start(1_000).expect("partition log test step"));
    assert_eq!(log.log_start_offset(), 90);
    // A full truncation starts the log where it says, whatever the old start.
    log.truncate_fully_and_start_at(40).expect("partition log test step");
    drop(log);
    let log = open(dir.path(), small_config(), 0);
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (40, 40));
    // A file that does not parse is refused, not read as no start offset.
    drop(log);
    fs::write(dir.path().join(partition_dir_name(TOPIC, PARTITION)).join(LOG_START_OFFSET_FILE), "x")
        .expect("partition log test step");
    assert!(matches!(
        PartitionLog::open(dir.path(), TOPIC, PARTITION, small_config(), 0, 0),
        Err(LogError::CorruptCheckpoint { .. })
    ));
}

#[test]
fn leader_epoch_checkpoint_tracks_appends() {
    let dir = tempfile::tempdir().expect("partition log test step");
    let mut log = open(dir.path(), small_config(), 0);
    append_batches(&mut log, 2, 0);
    append_batches(&mut log, 2, 2);
    append_batches(&mut log, 1, 5);
    let text = fs::read_to_string(log.dir().join(LEADER_EPOCH_CHECKPOINT_FILE)).expect("partition log test step");
    assert_eq!(text, "0\n3\n0 0\n2 6\n5 12\n");
    let answer = |epoch, end| Some(EpochEndOffset { leader_epoch: epoch, end_offset: end });
    assert_eq!(log.end_offset_for_epoch(0), answer(0, 6));
    assert_eq!(log.end_offset_for_epoch(1), answer(0, 6));
    assert_eq!(log.end_offset_for_epoch(5), answer(5, 15));
    assert_eq!(log.end_offset_for_epoch(6), None);
    assert!(matches!(
        log.append_in_place(&mut build_batch(1, 0, b"old"), 4, 0),
        Err(LogError::StaleLeaderEpoch { epoch: 4, latest_epoch: 5 })
    ));
    // Stored batches carry the stamped epoch.
    let stored = log.read(12, 1, i64::MAX).expect("partition log test step");
    assert_eq!(BatchHeader::validate(&stored).expect("partition log test step").partition_leader_epoch(), 5);
}

#[test]
fn follower_appends_keep_leader_offsets() {
    let dir = tempfile::tempdir().expect("partition log test step");
    let leader_dir = tempfile::tempdir().expect("partition log test step");
    let mut leader = open(leader_dir.path(), small_config(), 0);
    let batches = append_batches(&mut leader, 10, 7);
    let mut follower = open(dir.path(), small_config(), 0);
    let mut offset = 0;
    while offset < leader.log_end_offset() {
        let fetched = leader.read(offset, 500, i64::MAX).expect("partition log test step");
        let info = follower.append_as_follower(&fetched, 0).expect("partition log test step");
        offset = info.last_offset + 1;
    }
    assert_eq!(read_all(&follower), batches);
    assert_eq!(follower.epoch_entries(), &[EpochEntry { epoch: 7, start_offset: 0 }]);
    let again = leader.read(0, 1, i64::MAX).expect("partition log test step");
    assert!(matches!(follower.append_as_follower(&again, 0), Err(LogError::NonMonotonicAppend { .. })));
}

#[test]
fn flush_follows_flush_messages_and_flush_ms() {
    let dir = tempfile::tempdir().expect("partition log test step");
    let mut config = small_config();
    config.segment_bytes = 1 << 20;
    config.flush_messages = Some(7);
    config.flush_ms = Some(1_000);
    let mut log = open(dir.path(), config, 0);
    log.append_in_place(&mut build_batch(3, 0, b"a"), 0, 100).expect("partition log test step");
    log.append_in_place(&mut build_batch(3, 0, b"b"), 0, 200).expect("partition log test step");
    assert_eq!((log.unflushed_messages(), log.recovery_point(), log.flush_due_by_count()), (6, 0, false));
    log.append_in_place(&mut build_batch(3, 0, b"c"), 0, 300).expect("partition log test step");
    assert_eq!((log.unflushed_messages(), log.recovery_point()), (9, 0), "appends never flush");
    assert!(log.flush_due_by_count(), "7 messages reached");
    assert!(log.maybe_flush(300).expect("partition log test step"));
    assert_eq!((log.unflushed_messages(), log.recovery_point()), (0, 9));
    log.append_in_place(&mut build_batch(1, 0, b"d"), 0, 400).expect("partition log test step");
    assert!(!log.maybe_flush(1_200).expect("partition log test step"));
    assert!(log.maybe_flush(1_300).expect("partition log test step"), "1000 ms since the last flush");
    assert_eq!(log.recovery_point(), 10);
    log.append_in_place(&mut build_batch(1, 0, b"e"), 0, 1_400).expect("partition log test step");
    log.flush().expect("partition log test step");
    assert_eq!(log.recovery_point(), 11);
}

#[test]
fn a_flush_ticket_covers_what_was_appended_before_it_was_taken() {
    let dir = tempfile::tempdir().expect("partition log test step");
    let mut log = open(dir.path(), small_config(), 0);
    log.append_in_place(&mut build_batch(3, 0, b"a"), 0, 100).expect("partition log test step");
    let ticket = log.flush_ticket().expect("partition log test step");
    assert_eq!((ticket.end(), log.unflushed_messages()), (3, 0));
    // Appended while the sync runs: the next ticket's.
    log.append_in_place(&mut build_batch(2, 0, b"b"), 0, 200).expect("partition log test step");
    ticket.sync().expect("partition log test step");
    log.flushed(&ticket);
    assert_eq!((log.recovery_point(), log.unflushed_messages()), (3, 2));
    let next = log.flush_ticket().expect("partition log test step");
    next.sync().expect("partition log test step");
    log.flushed(&next);
    assert_eq!(log.recovery_point(), 5);
}

#[test]
fn a_flush_ticket_taken_before_a_truncation_moves_nothing() {
    let dir = tempfile::tempdir().expect("partition log test step");
    let mut log = open(dir.path(), small_config(), 0);
    log.append_in_place(&mut build_batch(3, 0, b"a"), 0, 100).expect("partition log test step");
    log.flush().expect("partition log test step");
    log.append_in_place(&mut build_batch(3, 0, b"b"), 0, 200).expect("partition log test step");
    let ticket = log.flush_ticket().expect("partition log test step");
    // A new leader's answer cuts the unflushed batch; a batch of its own
    // lands at the same offsets before the old ticket's sync is recorded.
    log.truncate_to(3).expect("partition log test step");
    let mut theirs = build_batch(3, 0, b"c");
    batch::set_base_offset(&mut theirs, 3);
    batch::set_partition_leader_epoch(&mut theirs, 9);
    log.append_as_follower(&theirs, 300).expect("partition log test step");
    ticket.sync().expect("partition log test step");
    log.flushed(&ticket);
    assert_eq!(log.recovery_point(), 3, "the new batch at 3..6 was never synced");
}

/// Writes 10 batches (~100 bytes each) into one segment, closes the log,
/// lets `damage` edit the segment file, reopens, and checks that the log
/// recovered to exactly the first `expect_kept` batches.
fn recover_after(damage: impl FnOnce(&Path, &[Vec<u8>]), expect_kept: usize) {
    let dir = tempfile::tempdir().expect("partition log test step");
    let mut config = small_config();
    config.segment_bytes = 1 << 20;
    let mut log = open(dir.path(), config.clone(), 0);
    let batches = append_batches(&mut log, 10, 0);
    let path = segment_path(&log, 0);
    log.close().expect("partition log test step");
    damage(&path, &batches);
    let mut log = open(dir.path(), config, 0);
    assert_eq!(read_all(&log), batches[..expect_kept]);
    assert_eq!(log.log_end_offset(), expect_kept as i64 * 3);
    let kept_bytes: usize = batches[..expect_kept].iter().map(Vec::len).sum();
    assert_eq!(fs::metadata(&path).expect("partition log test step").len(), kept_bytes as u64, "tail was cut on disk");
    // The recovered log takes appends again.
    let info = log.append_in_place(&mut build_batch(1, 0, b"after"), 0, 0).expect("partition log test step");
    assert_eq!(info.base_offset, expect_kept as i64 * 3);
}

#[test]
fn recovery_cuts_garbage_after_the_last_batch() {
    recover_after(
        |path, _| {
            let mut file = OpenOptions::new().append(true).open(path).expect("partition log test step");
            file.write_all(&[0xab; 77]).expect("partition log test step");
        },
        10,
    );
}

#[test]
fn recovery_cuts_a_batch_torn_mid_write() {
    recover_after(
        |path, batches| {
            let len = fs::metadata(path).expect("partition log test step").len();
            let file = OpenOptions::new().write(true).open(path).expect("partition log test step");
            file.set_len(len - batches[9].len() as u64 / 2).expect("partition log test step");
        },
        9,
    );
}

#[test]
fn recovery_cuts_a_batch_with_a_flipped_byte() {
    recover_after(
        |path, _| {
            let mut bytes = fs::read(path).expect("partition log test step");
            let at = bytes.len() - 5;
            bytes[at] ^= 0x10;
            fs::write(path, bytes).expect("partition log test step");
        },
        9,
    );
}

#[test]
fn recovery_of_an_unflushed_segment_deletes_later_ones() {
    let dir = tempfile::tempdir().expect("partition log test step");
    let mut log = open(dir.path(), small_config(), 0);
    let batches = append_batches(&mut log, 30, 0);
    let bases = log.segment_base_offsets();
    assert!(bases.len() >= 3);
    let second = segment_path(&log, bases[1]);
    drop(log);
    let mut bytes = fs::read(&second).expect("partition log test step");
    bytes[70] ^= 0xff; // Inside the first batch's records.
    fs::write(&second, bytes).expect("partition log test step");
    let log = open(dir.path(), small_config(), 0);
    assert_eq!(log.segment_base_offsets(), bases[..2]);
    assert_eq!(log.log_end_offset(), bases[1]);
    assert_eq!(read_all(&log), batches[..bases[1] as usize / 3]);
}

#[test]
fn clean_segments_reuse_or_rebuild_their_indexes() {
    let dir = tempfile::tempdir().expect("partition log test step");
    let mut log = open(dir.path(), small_config(), 0);
    let batches = append_batches(&mut log, 30, 0);
    let end = log.log_end_offset();
    log.close().expect("partition log test step");
    // Trusted reopen: loads the index files of every sealed segment.
    let log = open(dir.path(), small_config(), end);
    assert_eq!(read_all(&log), batches);
    let index = log.dir().join(segment_file_name(0, ".index"));
    drop(log);
    // A damaged index of a trusted segment is rebuilt, not believed.
    fs::write(&index, [0xff; 13]).expect("partition log test step");
    let log = open(dir.path(), small_config(), end);
    assert_eq!(read_all(&log), batches);
    assert_eq!(fs::metadata(&index).expect("partition log test step").len() % 8, 0);
    assert_eq!(log.offset_for_timestamp(2_500).expect("partition log test step").map(|found| found.offset), Some(6));
}

#[test]
fn leftover_files_are_cleaned_on_open() {
    let dir = tempfile::tempdir().expect("partition log test step");
    let log = open(dir.path(), small_config(), 0);
    let part_dir = log.dir().to_path_buf();
    drop(log);
    fs::write(part_dir.join("leader-epoch-checkpoint.tmp"), "junk").expect("partition log test step");
    fs::write(part_dir.join(segment_file_name(900, ".index")), [0u8; 8]).expect("partition log test step");
    let _log = open(dir.path(), small_config(), 0);
    assert!(!part_dir.join("leader-epoch-checkpoint.tmp").exists());
    assert!(!part_dir.join(segment_file_name(900, ".index")).exists());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random appends, then a random cut of one segment file: the log always
    /// reopens, and exactly the batches wholly before the cut survive, intact.
    #[test]
    fn random_truncation_always_recovers(
        appends in prop::collection::vec((1i32..6, 0usize..300, 0i64..1_000_000), 1..40),
        segment_pick in any::<prop::sample::Index>(),
        cut_fraction in prop_oneof![1 => Just(0.0f64), 1 => Just(1.0f64), 6 => 0.0f64..1.0],
    ) {
        let dir = tempfile::tempdir().expect("partition log test step");
        let mut config = small_config();
        config.segment_bytes = 2048;
        let mut log = open(dir.path(), config.clone(), 0);
        let mut stored = Vec::new();
        for (i, (records, len, timestamp)) in appends.iter().enumerate() {
            let mut batch = build_batch(*records, *timestamp, &payload(i, *len));
            log.append_in_place(&mut batch, 0, 0).expect("partition log test step");
            stored.push(batch);
        }
        let bases = log.segment_base_offsets();
        let victim = bases[segment_pick.index(bases.len())];
        let path = segment_path(&log, victim);
        drop(log);
        let len = fs::metadata(&path).expect("partition log test step").len();
        let cut = (len as f64 * cut_fraction) as u64;
        OpenOptions::new().write(true).open(&path).expect("partition log test step").set_len(cut).expect("partition log test step");

        // Expected survivors: batches of earlier segments, plus batches of
        // the victim that end at or before the cut. Later segments survive
        // only when the cut falls exactly between two batches of a victim
        // left non-empty (nothing is corrupt then; the log has a gap).
        let next_base = bases.iter().copied().find(|&b| b > victim).unwrap_or(i64::MAX);
        let mut expected = Vec::new();
        let mut later = Vec::new();
        let mut position = 0u64;
        let mut on_boundary = cut == 0;
        for batch in &stored {
            let base = BatchHeader::validate(batch).expect("partition log test step").base_offset();
            if base < victim {
                expected.push(batch.clone());
            } else if base < next_base {
                position += batch.len() as u64;
                if position <= cut {
                    expected.push(batch.clone());
                }
                on_boundary |= position == cut;
            } else {
                later.push(batch.clone());
            }
        }
        if on_boundary && cut > 0 {
            expected.extend(later);
        }
        let log = PartitionLog::open(dir.path(), TOPIC, PARTITION, config, 0, 0);
        prop_assert!(log.is_ok(), "reopen failed: {:?}", log.err());
        let log = log.expect("partition log test step");
        let expected_end = expected
            .last()
            .map_or(victim, |batch| BatchHeader::validate(batch).expect("partition log test step").last_offset() + 1);
        prop_assert_eq!(read_all(&log), expected);
        prop_assert_eq!(log.log_end_offset(), expected_end);
    }
}

/// A batch of keyed records (`key`, `value`), offsets relative (the log assigns them).
fn keyed_batch(records: &[(&str, Option<&str>)]) -> Vec<u8> {
    use crate::log::compaction::{encode_batch, plain_record};
    let text = |s: &str| bytes::Bytes::from(s.to_string());
    let records = records
        .iter()
        .enumerate()
        .map(|(i, (k, v))| plain_record(i as i64, Some(text(k)), v.map(text), 1_000))
        .collect();
    encode_batch(records).unwrap()
}

/// Every record from the log start: (offset, key, value).
fn read_records(log: &PartitionLog) -> Vec<(i64, String, Option<String>)> {
    let mut out = Vec::new();
    for batch in read_all(log) {
        let mut buf = bytes::Bytes::from(batch);
        for r in kafka_protocol::records::RecordBatchDecoder::decode(&mut buf).unwrap().records {
            let text = |b: Option<bytes::Bytes>| b.map(|b| String::from_utf8_lossy(&b).into_owned());
            out.push((r.offset, text(r.key).unwrap_or_default(), text(r.value)));
        }
    }
    out
}

#[test]
fn compaction_keeps_the_latest_record_of_each_key_and_every_offset() {
    let dir = tempfile::tempdir().unwrap();
    let config = compact_config();
    let mut log = open(dir.path(), config.clone(), 0);
    // 40 batches of two records over 4 keys, and a key `gone` written once
    // and deleted (a tombstone) later.
    for i in 0..40 {
        let (key, value) = match i {
            5 => ("gone".to_string(), Some("v".to_string())),
            21 => ("gone".to_string(), None),
            _ => (format!("g{}", i % 4), Some(format!("v{i}"))),
        };
        let other = format!("g{}", (i + 1) % 4);
        let mut batch = keyed_batch(&[(key.as_str(), value.as_deref()), (other.as_str(), Some("x"))]);
        log.append_in_place(&mut batch, 0, 0).unwrap();
    }
    let before = read_records(&log);
    let (end, segments) = (log.log_end_offset(), log.segment_base_offsets().len());
    assert!(segments > 3, "the test needs sealed segments");
    // Only below the high watermark: nothing past 60 supersedes anything.
    let rewritten = log.compact(60, 0).unwrap();
    assert!(rewritten > 0);
    assert_eq!(log.compact(60, 0).unwrap(), 0, "nothing new to compact");
    let after = read_records(&log);
    assert_eq!((log.log_end_offset(), log.segment_base_offsets().len()), (end, segments));
    assert!(after.len() < before.len());
    // Every record kept is one of the originals, at its own offset.
    for r in &after {
        assert!(before.contains(r), "{r:?} was not in the log");
    }
    // The latest value of each key below 60 survives, and so does everything from 60 on.
    let latest_below = |key: &str| before.iter().rev().find(|r| r.1 == key && r.0 < 60).cloned().unwrap();
    for key in ["g0", "g1", "g2", "g3", "gone"] {
        assert!(after.contains(&latest_below(key)), "latest {key} lost");
    }
    assert!(after.contains(&latest_below("gone")) && latest_below("gone").2.is_none(), "the tombstone stays");
    assert!(before.iter().filter(|r| r.0 >= 60).all(|r| after.contains(r)));
    // A dropped record is superseded by a later one below 60.
    for r in before.iter().filter(|r| !after.contains(r)) {
        assert!(before.iter().any(|l| l.1 == r.1 && l.0 > r.0 && l.0 < 60), "{r:?} dropped without a successor");
    }
    // The rewritten segments survive a reopen (indexes and all), and appends go on.
    drop(log);
    let mut log = open(dir.path(), config, 0);
    assert_eq!(read_records(&log), after);
    let mut batch = keyed_batch(&[("g0", Some("late"))]);
    assert_eq!(log.append_in_place(&mut batch, 0, 0).unwrap().base_offset, end);
    assert!(!dir.path().join(partition_dir_name(TOPIC, PARTITION)).join("compacting").exists());
}

#[test]
fn slice_returns_an_oversized_first_batch_only_when_asked() {
    let dir = tempfile::tempdir().expect("partition log test step");
    let mut config = small_config();
    config.segment_bytes = 1 << 20;
    let mut log = open(dir.path(), config, 0);
    let batches = append_batches(&mut log, 3, 0);
    let size = batches[0].len();
    let slice =
        |offset, max_bytes, max_offset, min_one| log.slice(offset, max_bytes, max_offset, min_one).expect("slice");
    // KIP-74: the first batch of a response goes whole even past the limit...
    assert_eq!(slice(0, 1, i64::MAX, true).to_vec().expect("read"), batches[0]);
    // ...but a later partition's oversized first batch is not sent at all.
    assert!(slice(0, size - 1, i64::MAX, false).is_empty());
    assert!(slice(0, 0, i64::MAX, false).is_empty());
    assert_eq!(slice(0, size * 2, i64::MAX, false).to_vec().expect("read"), batches[..2].concat());
    // A byte limit inside a batch ends the range at the batch before it.
    assert_eq!(slice(0, size * 2 + 7, i64::MAX, false).to_vec().expect("read"), batches[..2].concat());
    assert_eq!(slice(0, size * 3 - 1, i64::MAX, true).len(), size * 2);
    // It stops before the batch that starts at the bound (the high watermark).
    let second = log.read(0, size * 10, i64::MAX).expect("read");
    let bound = BatchHeader::parse(&second[size..]).expect("header").base_offset();
    assert_eq!(slice(0, size * 10, bound, false).len(), size);
    assert!(slice(bound, size * 10, bound, true).is_empty(), "nothing at the bound itself");
    assert_eq!(slice(0, size * 10, i64::MAX, false).len(), size * 3);
    assert!(slice(log.log_end_offset(), 100, i64::MAX, true).is_empty(), "empty at the log end");
    assert!(matches!(log.slice(log.log_end_offset() + 1, 100, i64::MAX, true), Err(LogError::OffsetOutOfRange { .. })));
}

#[test]
fn a_slice_outlives_its_segment() {
    let dir = tempfile::tempdir().expect("partition log test step");
    let mut log = open(dir.path(), small_config(), 0);
    let batches = append_batches(&mut log, 2, 0);
    let slice = log.slice(0, 1 << 20, i64::MAX, true).expect("slice");
    drop(log);
    fs::remove_dir_all(dir.path()).expect("delete the log");
    assert_eq!(slice.to_vec().expect("the open file still reads"), batches.concat());
}

#[test]
fn max_timestamp_batch_finds_the_largest_timestamp_below_the_bound() {
    let dir = tempfile::tempdir().expect("partition log test step");
    let mut log = open(dir.path(), small_config(), 0);
    assert_eq!(log.max_timestamp_batch(i64::MAX).expect("partition log test step"), None, "empty log");
    // Small segments: the batches spread over several of them.
    for (i, ts) in [100, 400, 250, 400, 300, 900].into_iter().enumerate() {
        let mut batch = build_batch(3, ts, &payload(i, 300));
        log.append_in_place(&mut batch, 0, 0).expect("partition log test step");
    }
    assert!(log.segments.len() > 1, "the test wants several segments");
    let found = |max_offset| log.max_timestamp_batch(max_offset).expect("partition log test step");
    assert_eq!(found(i64::MAX), Some(TimestampOffset { timestamp: 900, offset: 15 }));
    // Below a high watermark of 15 the 900 batch does not count; of the two 400s
    // the earlier one wins.
    assert_eq!(found(15), Some(TimestampOffset { timestamp: 400, offset: 3 }));
    assert_eq!(found(3), Some(TimestampOffset { timestamp: 100, offset: 0 }));
    assert_eq!(found(0), None);
}

#[test]
fn size_bytes_from_counts_what_a_replica_still_has_to_copy() {
    let dir = tempfile::tempdir().expect("partition log test step");
    let mut log = open(dir.path(), small_config(), 0);
    let batches = append_batches(&mut log, 30, 0);
    assert!(log.segments.len() > 2, "the test wants several segments");
    let size = batches[0].len() as u64;
    let total = log.size_bytes();
    assert_eq!(log.size_bytes_from(0).expect("partition log test step"), total);
    assert_eq!(log.size_bytes_from(-5).expect("partition log test step"), total);
    // Offset 4 is inside the second batch: it and everything after it.
    assert_eq!(log.size_bytes_from(4).expect("partition log test step"), total - size);
    assert_eq!(log.size_bytes_from(3 * 29).expect("partition log test step"), size);
    assert_eq!(log.size_bytes_from(log.log_end_offset()).expect("partition log test step"), 0);
}

#[test]
fn a_large_produce_is_written_without_copying_its_records() {
    let dir = tempfile::tempdir().expect("partition log test step");
    let mut config = small_config();
    config.segment_bytes = 64 << 20;
    config.max_message_bytes = 8 << 20;
    let mut log = open(dir.path(), config, 0);
    let batch = build_batch(1_000, 1_000, &payload(1, 4 << 20));
    // A warm-up append, so the measured one finds the segment and its indexes set up.
    log.append_as_leader(&build_batch(1, 1_000, b"warm"), 0, 0).expect("partition log test step");
    let allocated = allocation_counter::measure(|| {
        log.append_as_leader(&batch, 0, 0).expect("partition log test step");
    });
    assert!(
        allocated.bytes_total < 64 * 1024,
        "appending a {} byte record set allocated {} bytes: it was copied",
        batch.len(),
        allocated.bytes_total
    );
    let stored = log.read(1, 8 << 20, i64::MAX).expect("partition log test step");
    assert_eq!(stored.len(), batch.len());
    assert_eq!(stored[batch::ASSIGNED_HEAD_BYTES..], batch[batch::ASSIGNED_HEAD_BYTES..], "written as received");
    assert_eq!(BatchHeader::validate(&stored).expect("valid").base_offset(), 1);
}

#[test]
fn a_slice_cut_by_bytes_ends_at_the_last_whole_batch() {
    let dir = tempfile::tempdir().expect("partition log test step");
    let mut config = small_config();
    config.segment_bytes = 1 << 20;
    config.index_interval_bytes = 300;
    let mut log = open(dir.path(), config, 0);
    // Batches of different sizes, so boundaries fall at uneven positions.
    let mut ends = vec![0u64];
    for i in 0..60 {
        let batch = build_batch(1, 1_000, &payload(i, 20 + (i * 37) % 400));
        log.append_as_leader(&batch, 0, 0).expect("partition log test step");
        ends.push(ends.last().expect("an end") + batch.len() as u64);
    }
    for max_bytes in (0..*ends.last().expect("an end") as usize + 50).step_by(97) {
        let slice = log.slice(0, max_bytes, i64::MAX, true).expect("slice");
        let whole = ends.iter().copied().filter(|&e| e <= max_bytes as u64).max().expect("an end");
        let expected = whole.max(ends[1]);
        assert_eq!(slice.len() as u64, expected, "max_bytes {max_bytes}");
    }
}

/// A compacted topic's config with small segments.
fn compact_config() -> LogConfig {
    LogConfig { compact: true, segment_bytes: 600, ..small_config() }
}

/// A log of `batches` two-record batches over the keys g0..g3 (every key
/// written many times), with timestamps `ts`.
fn keyed_log(dir: &Path, config: LogConfig, batches: usize) -> PartitionLog {
    let mut log = open(dir, config, 0);
    for i in 0..batches {
        let (a, b) = (format!("g{}", i % 4), format!("g{}", (i + 1) % 4));
        let mut batch = keyed_batch(&[(a.as_str(), Some("v")), (b.as_str(), Some("w"))]);
        log.append_in_place(&mut batch, 0, 0).unwrap();
    }
    log
}

#[test]
fn a_tombstone_goes_once_its_segment_is_older_than_delete_retention() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { compact: true, segment_bytes: 600, delete_retention_ms: 3_600_000, ..small_config() };
    let mut log = open(dir.path(), config.clone(), 0);
    let mut batch = keyed_batch(&[("gone", Some("v")), ("x", Some("1"))]);
    log.append_in_place(&mut batch, 0, 0).unwrap();
    let mut batch = keyed_batch(&[("gone", None), ("x", Some("2"))]);
    log.append_in_place(&mut batch, 0, 0).unwrap();
    for i in 0..30 {
        let mut batch = keyed_batch(&[("x", Some(format!("{i}").as_str())), ("y", Some("1"))]);
        log.append_in_place(&mut batch, 0, 0).unwrap();
    }
    let end = log.log_end_offset();
    assert!(log.compact(end, 0).unwrap() > 0);
    let tombstone = |log: &PartitionLog| read_records(log).iter().any(|r| r.1 == "gone" && r.2.is_none());
    assert!(tombstone(&log), "a fresh tombstone stays");
    assert!(!read_records(&log).iter().any(|r| r.1 == "gone" && r.2.is_some()), "its key's value went");
    // delete.retention.ms of 0: the segment is older than that; the next pass
    // (dirty ratio 0, as nothing new was written) drops the tombstone.
    log.set_config(LogConfig { delete_retention_ms: 0, min_cleanable_dirty_ratio: 0.0, ..config }).unwrap();
    log.compacted_up_to = 0;
    assert!(log.compact(end, 0).unwrap() > 0);
    assert!(!tombstone(&log), "the old tombstone went");
    assert_eq!(log.log_end_offset(), end);
}

#[test]
fn min_compaction_lag_keeps_young_segments_and_the_dirty_ratio_waits_for_enough_new_data() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        compact: true,
        segment_bytes: 600,
        min_compaction_lag_ms: 10_000,
        min_cleanable_dirty_ratio: 0.99,
        ..small_config()
    };
    // The records' timestamps are 1,000 (keyed_batch). The first pass cleans
    // everything (nothing was clean: a ratio of 1).
    let mut log = keyed_log(dir.path(), config.clone(), 40);
    let end = log.log_end_offset();
    assert_eq!(log.compact(end, 5_000).unwrap(), 0, "every segment is younger than the lag");
    assert!(log.compact(end, 20_000).unwrap() > 0, "older than the lag: cleaned");
    // New data, but less than 99% of the cleanable log: no pass.
    for _ in 0..6 {
        let mut batch = keyed_batch(&[("g0", Some("late")), ("g1", Some("late"))]);
        log.append_in_place(&mut batch, 0, 0).unwrap();
    }
    let end = log.log_end_offset();
    assert!(log.plan_compaction(end, 20_000).unwrap().is_none(), "under the dirty ratio");
    // max.compaction.lag.ms forces it.
    log.set_config(LogConfig { max_compaction_lag_ms: Some(1), ..config }).unwrap();
    assert!(log.plan_compaction(end, 20_000).unwrap().is_some(), "overdue");
}

#[test]
fn a_segment_that_changed_while_it_was_cleaned_is_not_swapped() {
    let dir = tempfile::tempdir().unwrap();
    let config = compact_config();
    let mut log = keyed_log(dir.path(), config, 40);
    let end = log.log_end_offset();
    let before = read_records(&log);
    let plan = log.plan_compaction(end, 0).unwrap().expect("a pass is due");
    let result = super::super::compaction::clean(&plan, std::time::SystemTime::now(), &|| false).unwrap();
    assert!(!result.rewritten.is_empty());
    // A truncation between the clean and the swap: nothing is swapped.
    assert!(log.truncate_to(end - 1).unwrap());
    assert_eq!(log.install_compacted(result, 0).unwrap(), 0);
    let kept: Vec<_> = before.iter().filter(|r| r.0 < log.log_end_offset()).cloned().collect();
    assert_eq!(read_records(&log), kept);
    assert!(!dir.path().join(partition_dir_name(TOPIC, PARTITION)).join(COMPACTION_SCRATCH_DIR).exists());
}

#[test]
fn the_cleaner_keeps_to_its_io_rate_and_stops_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let config = compact_config();
    let mut log = keyed_log(dir.path(), config.clone(), 40);
    let end = log.log_end_offset();
    let sealed: u64 = log.segments.values().filter(|s| s.next_offset() <= end).map(|s| s.size_bytes()).sum();
    // Every sealed byte is read at least twice (the key map, then the check
    // of what goes): at sealed / 0.2 bytes a second that takes 0.4 s or more.
    let rate = sealed as f64 / 0.2;
    log.set_config(LogConfig { cleaner_io_max_bytes_per_second: Some(rate), ..config }).unwrap();
    let plan = log.plan_compaction(end, 0).unwrap().expect("a pass is due");
    let stopped = super::super::compaction::clean(&plan, std::time::SystemTime::now(), &|| true);
    assert!(matches!(stopped, Err(LogError::Compaction(_))), "a stopping node ends a throttled pass");
    let started = std::time::Instant::now();
    let result = super::super::compaction::clean(&plan, std::time::SystemTime::now(), &|| false).unwrap();
    assert!(started.elapsed() >= std::time::Duration::from_millis(380), "{:?}", started.elapsed());
    assert!(log.install_compacted(result, 0).unwrap() > 0);
}

/// A log compacted once, whose cleaned segments are small enough to merge:
/// (the log, its records).
fn compacted_once(dir: &Path) -> (PartitionLog, Vec<(i64, String, Option<String>)>) {
    let config = LogConfig { compact: true, segment_bytes: 600, min_cleanable_dirty_ratio: 0.0, ..small_config() };
    let mut log = keyed_log(dir, config, 60);
    let end = log.log_end_offset();
    assert!(log.compact(end, 0).unwrap() > 0);
    let records = read_records(&log);
    // Nothing new: a pass again finds only segments to merge.
    log.compacted_up_to = 0;
    (log, records)
}

#[test]
fn cleaned_segments_merge_on_a_later_pass() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, records) = compacted_once(dir.path());
    let (end, before) = (log.log_end_offset(), log.segment_base_offsets().len());
    assert!(log.compact(end, 0).unwrap() > 0);
    let after = log.segment_base_offsets().len();
    assert!(after < before, "{before} segments became {after}");
    assert_eq!(read_records(&log), records, "merging loses nothing more");
    assert_eq!(log.log_end_offset(), end);
    drop(log);
    let log = open(dir.path(), compact_config(), 0);
    assert_eq!(read_records(&log), records);
    assert_eq!(log.segment_base_offsets().len(), after);
}

#[test]
fn a_crash_in_the_middle_of_a_merge_leaves_a_log_that_opens_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (log, records) = compacted_once(dir.path());
    let end = log.log_end_offset();
    let plan = log.plan_compaction(end, 0).unwrap().expect("a pass is due");
    let result = super::super::compaction::clean(&plan, std::time::SystemTime::now(), &|| false).unwrap();
    let merge = result.rewritten.iter().find(|r| r.replaces.len() > 1).expect("a merge");
    // The crash: the merged .log is in place, the segments it covers are not deleted yet.
    let partition_dir = dir.path().join(partition_dir_name(TOPIC, PARTITION));
    let name = |suffix| segment_file_name(merge.base_offset, suffix);
    for suffix in [INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
        fs::remove_file(partition_dir.join(name(suffix))).unwrap();
    }
    fs::rename(result.scratch.join(name(LOG_SUFFIX)), partition_dir.join(name(LOG_SUFFIX))).unwrap();
    let covered: Vec<i64> = merge.replaces[1..].iter().map(|r| r.0).collect();
    drop(log);
    let log = open(dir.path(), compact_config(), end);
    assert_eq!(read_records(&log), records);
    assert_eq!(log.log_end_offset(), end);
    for base in covered {
        assert!(!log.segment_base_offsets().contains(&base), "segment {base} was merged");
        assert!(!partition_dir.join(segment_file_name(base, LOG_SUFFIX)).exists());
    }
}

#[test]
fn the_cleaned_offset_survives_a_restart_and_a_truncation_forgets_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = compact_config();
    let mut log = keyed_log(dir.path(), config.clone(), 40);
    let end = log.log_end_offset();
    assert!(log.compact(end, 0).unwrap() > 0);
    let cleaned = log.compacted_up_to;
    assert!(cleaned > 0);
    drop(log);
    let mut log = open(dir.path(), config.clone(), 0);
    assert_eq!(log.compacted_up_to, cleaned, "read back from {CLEANER_OFFSET_FILE}");
    assert!(log.plan_compaction(end, 0).unwrap().is_none(), "nothing dirty after the restart");
    assert!(log.truncate_to(cleaned - 5).unwrap());
    assert!(log.compacted_up_to <= cleaned - 5);
    drop(log);
    assert_eq!(open(dir.path(), config, 0).compacted_up_to, 0, "the truncation removed the file");
}

#[test]
fn a_pass_over_a_partition_deleted_meanwhile_puts_nothing_back() {
    let dir = tempfile::tempdir().unwrap();
    let config = compact_config();
    let log = keyed_log(dir.path(), config, 40);
    let plan = log.plan_compaction(log.log_end_offset(), 0).unwrap().expect("a pass is due");
    let partition_dir = dir.path().join(partition_dir_name(TOPIC, PARTITION));
    fs::remove_dir_all(&partition_dir).unwrap();
    assert!(super::super::compaction::clean(&plan, std::time::SystemTime::now(), &|| false).is_err());
    assert!(!partition_dir.exists(), "the cleaner made the deleted partition's directory again");
}

#[test]
fn a_roll_leaves_the_sealed_segments_fsync_to_the_next_flush() {
    let dir = tempfile::tempdir().expect("partition log test step");
    let mut log = open(dir.path(), small_config(), 0);
    let first = build_batch(3, 0, &payload(1, 900));
    log.append_as_leader(&first, 0, 100).expect("partition log test step");
    assert_eq!(log.recovery_point(), 0, "nothing flushed yet");
    // Past segment.bytes: the prepare rolls, without an fsync.
    let second = build_batch(2, 0, &payload(2, 300));
    let prepared = log.prepare_append_as_leader(&second, 0, 200).expect("partition log test step");
    assert!(prepared.rolled());
    assert_eq!(log.segment_base_offsets(), vec![0, 3], "rolled at the log end");
    assert_eq!(log.log_end_offset(), 3, "placed, not yet recorded");
    let read = log.read(0, 1 << 20, i64::MAX).expect("partition log test step");
    assert_eq!(read.len(), first.len(), "readers see the sealed segment only");
    prepared.write(&second).expect("partition log test step");
    let info = log.finish_append(prepared).expect("partition log test step");
    assert_eq!((info.base_offset, info.last_offset), (3, 4));
    assert_eq!(log.read(3, 1 << 20, i64::MAX).expect("partition log test step").len(), second.len());
    // The sealed segment is not durable until a flush covers it, and the
    // next flush does: both segments' files, and the recovery point then
    // passes them.
    assert_eq!((log.recovery_point(), log.unflushed_messages()), (0, 5));
    let ticket = log.flush_ticket().expect("partition log test step");
    assert_eq!((ticket.files.len(), ticket.end()), (2, 5));
    ticket.sync().expect("partition log test step");
    log.flushed(&ticket);
    assert_eq!(log.recovery_point(), 5);
    let next = log.flush_ticket().expect("partition log test step");
    assert_eq!(next.files.len(), 1, "only the active segment once the sealed one is synced");
}

#[test]
fn an_append_is_refused_at_its_finish_if_the_log_changed_under_it() {
    let dir = tempfile::tempdir().expect("partition log test step");
    let mut log = open(dir.path(), small_config(), 0);
    log.append_as_leader(&build_batch(3, 0, b"a"), 0, 100).expect("partition log test step");
    let late = build_batch(2, 0, b"b");
    let prepared = log.prepare_append_as_leader(&late, 0, 200).expect("partition log test step");
    // What the owner's writer lock rules out: a truncation meanwhile.
    log.truncate_to(0).expect("partition log test step");
    prepared.write(&late).expect("partition log test step");
    assert!(log.finish_append(prepared).is_err(), "not recorded over the truncation");
    assert_eq!(log.log_end_offset(), 0);
}

#[test]
fn a_read_further_than_the_hot_tail_from_the_log_end_gets_a_range_to_warm() {
    let dir = tempfile::tempdir().expect("partition log test step");
    let config = LogConfig { segment_bytes: 16 << 20, max_message_bytes: 2 << 20, ..small_config() };
    let mut log = open(dir.path(), config, 0);
    let batch = build_batch(1, 0, &payload(3, 1 << 20));
    let batches = (HOT_TAIL_BYTES / batch.len() as u64) as i64 + 2;
    for _ in 0..batches {
        log.append_as_leader(&batch, 0, 100).expect("partition log test step");
    }
    assert!(log.segment_base_offsets().len() > 3, "spread over segments");
    let total = log.size_bytes();
    assert_eq!(log.bytes_after(0, 0), total);
    let (last_base, last_size) = (log.active().base_offset(), log.active().size_bytes());
    assert_eq!(log.bytes_after(last_base, 0), last_size);
    assert_eq!(log.bytes_after(last_base, last_size), 0);
    // From the start: far behind; the range covers what the read takes.
    let range = log.prefetch_range(0, 1 << 20).expect("far behind");
    let read = log.slice(0, 1 << 20, i64::MAX, true).expect("partition log test step");
    assert_eq!(range.position(), read.position());
    assert!(range.len() >= read.len(), "{} < {}", range.len(), read.len());
    range.warm().expect("partition log test step");
    // From an offset inside a segment: the range starts at or before it.
    let middle = log.prefetch_range(1, 1 << 20).expect("far behind");
    let read = log.slice(1, 1 << 20, i64::MAX, true).expect("partition log test step");
    assert!(middle.position() <= read.position());
    assert!(middle.position() + middle.len() as u64 >= read.position() + read.len() as u64);
    // Near the end, and outside the log: nothing to warm.
    assert!(log.prefetch_range(batches - 1, 1 << 20).is_none(), "the last batch is in the hot tail");
    assert!(log.prefetch_range(batches, 1 << 20).is_none(), "at the log end");
    assert!(log.prefetch_range(-1, 1 << 20).is_none());
}
