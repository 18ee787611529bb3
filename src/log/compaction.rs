//! Log compaction (`cleanup.policy=compact`), for user topics and
//! `__consumer_offsets` alike. A pass runs in three steps, so that the
//! partition's lock is held only to plan and to swap:
//!
//! 1. Plan, under the lock ([`super::PartitionLog::plan_compaction`]): the
//!    cleanable part of the log is the run of sealed segments from the start
//!    that lie wholly below the high watermark and, with
//!    `min.compaction.lag.ms`, whose newest record is at least that old. A
//!    pass is due when the dirty part (the segments past the log's
//!    `cleaner-offset`) is at least `min.cleanable.dirty.ratio` of it, or
//!    its first segment is older than `max.compaction.lag.ms`.
//! 2. Clean, without the lock ([`clean`]): read the planned segments'
//!    files (sealed segments never change) batch by batch, note every key's
//!    latest offset, and write into a scratch directory beside the log each
//!    segment that loses records, and each run of consecutive segments
//!    small enough to merge into one.
//! 3. Swap, under the lock, one segment at a time
//!    ([`super::PartitionLog::install_compacted_segment`]): each written
//!    segment replaces its originals if they are still the segments that
//!    were read.
//!
//! What a segment keeps: every key's latest record, records without a key,
//! control batches (transaction markers), each producer's last batch whole (its sequence and
//! epoch are what a restart rebuilds the producer's state from), and the
//! last batch of each segment whole, so every segment keeps its end offset
//! and is never empty. Offsets never change: batches are re-encoded around
//! the surviving records with their compression, producer fields and
//! timestamp type, so readers and followers see gaps, as in Kafka. A
//! tombstone (a null value) that is its key's latest record goes once its
//! segment's file was last written more than `delete.retention.ms` ago
//! (Kafka's horizon before KIP-534); rewriting a segment keeps that time.
//!
//! Transactions: a pass cleans only below the last stable offset, where
//! every transaction is decided. The records of an aborted transaction
//! supersede nothing and go (but in a segment's last batch); a committed
//! transaction's records are cleaned like any others. A marker goes once
//! no record of its transaction is left and its segment is past the
//! tombstone horizon, as in Kafka.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

use super::batch::{BatchHeader, CRC_COVERED_FROM, HEADER_BYTES};
use super::segment::{segment_file_name, BatchInfo, LogSegment, LOG_SUFFIX};
use super::txn::AbortedTxn;
use super::{LogConfig, LogError, Result};

/// A record without producer or headers, as Strom writes its own records.
pub fn plain_record(offset: i64, key: Option<Bytes>, value: Option<Bytes>, timestamp: i64) -> Record {
    Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset,
        sequence: -1,
        timestamp,
        key,
        value,
        headers: Default::default(),
    }
}

/// `records` (offsets increasing, no producer) as one uncompressed v2 batch.
pub fn encode_batch(records: Vec<Record>) -> Option<Vec<u8>> {
    encode(records, Compression::None)
}

/// `records` (offsets increasing, one batch's attributes) as one v2 batch.
/// kafka-protocol starts a new batch wherever `offset - sequence` changes, so
/// records without a producer are renumbered to follow their offsets (base
/// sequence -1); a producer's keep their sequences.
fn encode(records: Vec<Record>, compression: Compression) -> Option<Vec<u8>> {
    let first = records.first()?;
    let (first_offset, producer) = (first.offset, first.producer_id);
    let records: Vec<Record> = if producer >= 0 {
        records
    } else {
        records.into_iter().map(|r| Record { sequence: (r.offset - first_offset) as i32 - 1, ..r }).collect()
    };
    let mut encoded = bytes::BytesMut::new();
    RecordBatchEncoder::encode(&mut encoded, &records, &RecordEncodeOptions { version: 2, compression }).ok()?;
    Some(encoded.to_vec())
}

/// Bytes read from a segment file at a time; a larger batch is read whole.
const READ_CHUNK_BYTES: u64 = 4 << 20;

/// A compaction pass's inputs, taken under the partition's lock.
#[derive(Debug)]
pub struct CompactionPlan {
    pub(super) scratch: PathBuf,
    pub(super) config: LogConfig,
    /// Records at or past this are not cleaned and supersede nothing.
    pub(super) end: i64,
    pub(super) segments: Vec<PlannedSegment>,
    /// The log's truncation count when planned: a swap after a truncation
    /// is dropped.
    pub(super) truncations: u64,
    /// The aborted transactions with records below `end`.
    pub(super) aborted: Vec<AbortedTxn>,
}

/// One sealed segment of a plan.
#[derive(Debug)]
pub struct PlannedSegment {
    pub(super) base_offset: i64,
    pub(super) next_offset: i64,
    pub(super) size_bytes: u64,
    pub(super) file: Arc<File>,
    /// When the `.log` was last written: the tombstone clock.
    pub(super) modified: Option<SystemTime>,
}

/// What [`clean`] wrote: segments in the plan's scratch directory, each to
/// replace the segment of the same base offset.
#[derive(Debug)]
pub struct CompactionResult {
    pub(super) scratch: PathBuf,
    pub(super) end: i64,
    pub(super) truncations: u64,
    pub(super) rewritten: Vec<RewrittenSegment>,
}

impl CompactionResult {
    /// How many segments the pass rewrote.
    pub fn rewritten_len(&self) -> usize {
        self.rewritten.len()
    }
}

/// A segment written by a pass, to replace one or more consecutive
/// segments (merged into one when they fit).
#[derive(Debug)]
pub struct RewrittenSegment {
    pub(super) base_offset: i64,
    /// Each original's base offset, end and size, checked again before the swap.
    pub(super) replaces: Vec<(i64, i64, u64)>,
    pub(super) size_after: u64,
    /// The offsets of the transaction markers it no longer holds.
    pub(super) removed_markers: Vec<i64>,
}

/// What the cleaner learned from the cleanable part of a log.
#[derive(Debug, Default)]
struct OffsetMap {
    /// Every key's latest offset below the plan's end.
    latest: HashMap<Bytes, i64>,
    /// Each producer's last batch below the end (its base offset).
    last_batch_of: HashMap<i64, i64>,
    /// The aborted transactions' offset ranges (first batch to marker), by producer.
    aborted: HashMap<i64, Vec<(i64, i64)>>,
    /// Transaction markers that go in this pass (their offsets): see [`Markers`].
    removable_markers: HashSet<i64>,
}

impl OffsetMap {
    fn with_aborted(aborted: &[AbortedTxn]) -> Self {
        let mut map = OffsetMap::default();
        for t in aborted {
            map.aborted.entry(t.producer_id).or_default().push((t.first_offset, t.last_offset));
        }
        map
    }

    /// Whether `header`'s batch belongs to an aborted transaction.
    fn is_aborted(&self, header: &BatchHeader<'_>) -> bool {
        header.is_transactional()
            && self.aborted.get(&header.producer_id()).is_some_and(|ranges| {
                ranges.iter().any(|&(first, last)| first <= header.base_offset() && header.base_offset() <= last)
            })
    }

    fn note(&mut self, batch: &Bytes, end: i64) -> Result<()> {
        let header = BatchHeader::parse(batch)?;
        if header.base_offset() >= end || header.is_control() || self.is_aborted(&header) {
            return Ok(());
        }
        if header.producer_id() >= 0 {
            self.last_batch_of.insert(header.producer_id(), header.base_offset());
        }
        // A batch the cleaner cannot decode supersedes nothing, and is kept.
        let Ok(set) = decode(batch) else { return Ok(()) };
        for r in set.records {
            if let (Some(key), true) = (r.key, r.offset < end) {
                self.latest.insert(key, r.offset);
            }
        }
        Ok(())
    }

    /// Whether record `r` (of a batch below the end) stays.
    fn keeps(&self, r: &Record, drop_tombstones: bool) -> bool {
        let Some(key) = &r.key else { return true };
        match self.latest.get(key) {
            Some(&latest) if latest > r.offset => false,
            Some(&latest) if latest == r.offset => !(drop_tombstones && r.value.is_none()),
            _ => true,
        }
    }
}

fn decode(batch: &Bytes) -> Result<kafka_protocol::records::RecordSet> {
    RecordBatchDecoder::decode(&mut batch.clone()).map_err(|e| LogError::Compaction(format!("undecodable batch: {e}")))
}

/// Calls `each` with every whole batch of a sealed segment's file, in order.
fn for_each_batch(segment: &PlannedSegment, mut each: impl FnMut(Bytes) -> Result<()>) -> Result<()> {
    let mut position = 0u64;
    while position < segment.size_bytes {
        let want = READ_CHUNK_BYTES.min(segment.size_bytes - position);
        let mut chunk = read_at(&segment.file, position, want)?;
        let first = BatchHeader::parse(&chunk)?.total_size() as u64;
        if first > want {
            chunk = read_at(&segment.file, position, first)?;
        }
        let chunk = Bytes::from(chunk);
        let mut at = 0usize;
        while at + HEADER_BYTES <= chunk.len() {
            let size = BatchHeader::parse(&chunk[at..])?.total_size();
            if size == 0 || at + size > chunk.len() {
                break;
            }
            each(chunk.slice(at..at + size))?;
            at += size;
        }
        if at == 0 {
            return Err(LogError::Compaction(format!("no whole batch at position {position}")));
        }
        position += at as u64;
    }
    Ok(())
}

fn read_at(file: &File, position: u64, len: u64) -> Result<Vec<u8>> {
    let mut bytes = vec![0u8; len as usize];
    file.read_exact_at(&mut bytes, position)?;
    Ok(bytes)
}

/// Paces the cleaner's reads and writes to
/// `log.cleaner.io.max.bytes.per.second`, sleeping in short steps, and
/// ends the pass when the node stops.
struct Throttle<'a> {
    rate: Option<f64>,
    started: Instant,
    bytes: f64,
    stopping: &'a dyn Fn() -> bool,
}

impl Throttle<'_> {
    fn spend(&mut self, bytes: usize) -> Result<()> {
        self.bytes += bytes as f64;
        loop {
            if (self.stopping)() {
                return Err(LogError::Compaction("the node is stopping".into()));
            }
            let Some(rate) = self.rate else { return Ok(()) };
            let due = self.bytes / rate.max(1.0);
            let ahead = due - self.started.elapsed().as_secs_f64();
            if ahead <= 0.0 {
                return Ok(());
            }
            std::thread::sleep(Duration::from_secs_f64(ahead.min(0.1)));
        }
    }
}

/// What becomes of one batch: kept as it is, dropped, or re-encoded around
/// the records that stay.
enum Outcome {
    Whole,
    Dropped,
    Rewritten(Vec<u8>),
}

fn clean_batch(batch: &Bytes, map: &OffsetMap, last_in_segment: bool, drop_tombstones: bool) -> Result<Outcome> {
    let header = BatchHeader::parse(batch)?;
    let producer = header.producer_id();
    let producers_last = producer >= 0 && map.last_batch_of.get(&producer) == Some(&header.base_offset());
    if last_in_segment || producers_last {
        return Ok(Outcome::Whole);
    }
    if header.is_control() {
        return Ok(if map.removable_markers.contains(&header.base_offset()) {
            Outcome::Dropped
        } else {
            Outcome::Whole
        });
    }
    if map.is_aborted(&header) {
        return Ok(Outcome::Dropped);
    }
    let Ok(set) = decode(batch) else { return Ok(Outcome::Whole) };
    let total = set.records.len();
    let kept: Vec<Record> = set.records.into_iter().filter(|r| map.keeps(r, drop_tombstones)).collect();
    if kept.is_empty() {
        return Ok(Outcome::Dropped);
    }
    if kept.len() == total {
        return Ok(Outcome::Whole);
    }
    let Some(mut encoded) = encode(kept, set.compression) else { return Ok(Outcome::Whole) };
    if header.is_log_append_time() {
        // The encoder knows only CreateTime: restore the type bit and the
        // append time, then the CRC they are under.
        restore_log_append_time(&mut encoded, header.max_timestamp());
    }
    Ok(Outcome::Rewritten(encoded))
}

/// Marks a batch LogAppendTime with `append_time` as its max timestamp.
fn restore_log_append_time(batch: &mut [u8], append_time: i64) {
    const ATTRIBUTES_AT: usize = 21;
    const MAX_TIMESTAMP_AT: usize = 35;
    const LOG_APPEND_TIME_BIT: u8 = 1 << 3;
    batch[ATTRIBUTES_AT + 1] |= LOG_APPEND_TIME_BIT;
    batch[MAX_TIMESTAMP_AT..MAX_TIMESTAMP_AT + 8].copy_from_slice(&append_time.to_be_bytes());
    let crc = crc32c::crc32c(&batch[CRC_COVERED_FROM..]);
    batch[CRC_COVERED_FROM - 4..CRC_COVERED_FROM].copy_from_slice(&crc.to_be_bytes());
}

/// Which transaction markers a pass removes, decided batch by batch in
/// offset order from the start of the log (Kafka's rule): a marker goes
/// once no record of its transaction is left, and its segment is past the
/// tombstone horizon (`delete.retention.ms`), so a consumer that read the
/// transaction's records in time also read its marker.
#[derive(Debug, Default)]
struct Markers {
    /// Producers whose current transaction still has records after cleaning.
    retained: HashSet<i64>,
    removable: HashSet<i64>,
}

impl Markers {
    /// Notes one batch and what cleaning does to it; true when the batch is
    /// a marker that goes.
    fn see(&mut self, header: &BatchHeader<'_>, outcome: &Outcome, last_in_segment: bool, past_horizon: bool) -> bool {
        let producer = header.producer_id();
        if !header.is_transactional() || producer < 0 {
            return false;
        }
        if !header.is_control() {
            if !matches!(outcome, Outcome::Dropped) {
                self.retained.insert(producer);
            }
            return false;
        }
        // A marker ends its producer's transaction either way.
        let had_records = self.retained.remove(&producer);
        if had_records || last_in_segment || !past_horizon {
            return false;
        }
        self.removable.insert(header.base_offset());
        true
    }
}

/// Step 2 of a pass, without the partition's lock (see the module's doc).
/// `stopping` ends a throttled pass early, with an error.
pub fn clean(plan: &CompactionPlan, now: SystemTime, stopping: &dyn Fn() -> bool) -> Result<CompactionResult> {
    let mut throttle =
        Throttle { rate: plan.config.cleaner_io_max_bytes_per_second, started: Instant::now(), bytes: 0.0, stopping };
    let mut map = OffsetMap::with_aborted(&plan.aborted);
    for segment in &plan.segments {
        for_each_batch(segment, |batch| {
            throttle.spend(batch.len())?;
            map.note(&batch, plan.end)
        })?;
    }
    match fs::remove_dir_all(&plan.scratch) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
        _ => {}
    }
    // Not create_dir_all: a partition deleted meanwhile must not come back.
    fs::create_dir(&plan.scratch)?;
    let retention = Duration::from_millis(plan.config.delete_retention_ms);
    let drop_tombstones = |segment: &PlannedSegment| {
        segment.modified.and_then(|m| now.duration_since(m).ok()).is_some_and(|age| age > retention)
    };
    let last_in_segment = |segment: &PlannedSegment, batch: &Bytes| {
        BatchHeader::parse(batch).map(|h| h.last_offset() + 1 >= segment.next_offset).unwrap_or(true)
    };
    // Which segments lose something, and which markers go: one read of
    // every segment in order (a marker's fate depends on what became of its
    // transaction's records before it).
    let mut markers = Markers::default();
    let mut loses = HashSet::new();
    for segment in &plan.segments {
        for_each_batch(segment, |batch| {
            throttle.spend(batch.len())?;
            let last = last_in_segment(segment, &batch);
            let outcome = clean_batch(&batch, &map, last, drop_tombstones(segment))?;
            let marker_goes = markers.see(&BatchHeader::parse(&batch)?, &outcome, last, drop_tombstones(segment));
            if marker_goes || !matches!(outcome, Outcome::Whole) {
                loses.insert(segment.base_offset);
            }
            Ok(())
        })?;
    }
    map.removable_markers = markers.removable;
    let mut rewritten = Vec::new();
    for group in merge_groups(&plan.segments, &plan.config) {
        if let [segment] = group {
            // Alone: rewritten only if it loses something.
            if !loses.contains(&segment.base_offset) {
                continue;
            }
        }
        let base_offset = group[0].base_offset;
        let mut removed_markers = Vec::new();
        let mut fresh = LogSegment::create(&plan.scratch, base_offset, &plan.config, 0)?;
        for segment in group {
            for_each_batch(segment, |batch| {
                throttle.spend(batch.len())?;
                let last = last_in_segment(segment, &batch);
                let out = match clean_batch(&batch, &map, last, drop_tombstones(segment))? {
                    Outcome::Whole => batch.to_vec(),
                    Outcome::Dropped => {
                        let header = BatchHeader::parse(&batch)?;
                        if header.is_control() {
                            removed_markers.push(header.base_offset());
                        }
                        return Ok(());
                    }
                    Outcome::Rewritten(encoded) => encoded,
                };
                throttle.spend(out.len())?;
                let info = BatchInfo::from_header(&BatchHeader::parse(&out)?);
                fresh.append(&[], &out, &info)
            })?;
        }
        fresh.on_become_inactive()?;
        let size_after = fresh.size_bytes();
        drop(fresh);
        // The tombstone clock of a merged segment is its newest part's.
        if let Some(modified) = group.iter().filter_map(|s| s.modified).max() {
            let path = plan.scratch.join(segment_file_name(base_offset, LOG_SUFFIX));
            fs::OpenOptions::new().write(true).open(path)?.set_modified(modified)?;
        }
        rewritten.push(RewrittenSegment {
            base_offset,
            replaces: group.iter().map(|s| (s.base_offset, s.next_offset, s.size_bytes)).collect(),
            size_after,
            removed_markers,
        });
    }
    Ok(CompactionResult { scratch: plan.scratch.clone(), end: plan.end, truncations: plan.truncations, rewritten })
}

/// Runs of consecutive segments that fit in one segment as they are now
/// (Kafka's grouping by size: a segment cleaned before is small, so cleaned
/// segments merge on later passes): at most `segment.bytes`, as many bytes
/// as the indexes of one segment can cover, and offsets within 2^31 of the
/// first.
fn merge_groups<'a>(segments: &'a [PlannedSegment], config: &LogConfig) -> Vec<&'a [PlannedSegment]> {
    const TIME_INDEX_ENTRY_BYTES: u64 = 12;
    let index_covers =
        (config.segment_index_bytes / TIME_INDEX_ENTRY_BYTES).saturating_sub(1) * config.index_interval_bytes;
    let max_bytes = config.segment_bytes.min(index_covers).max(1);
    let mut groups = Vec::new();
    let mut start = 0;
    while start < segments.len() {
        let mut end = start + 1;
        let mut bytes = segments[start].size_bytes;
        while let Some(next) = segments.get(end) {
            let fits = bytes + next.size_bytes <= max_bytes
                && next.next_offset - segments[start].base_offset <= i64::from(i32::MAX);
            if !fits {
                break;
            }
            bytes += next.size_bytes;
            end += 1;
        }
        groups.push(&segments[start..end]);
        start = end;
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(offset: i64, key: &'static str, value: Option<&'static str>) -> Record {
        let (key, value) = (Bytes::from_static(key.as_bytes()), value.map(|v| Bytes::from_static(v.as_bytes())));
        Record { partition_leader_epoch: 7, ..plain_record(offset, Some(key), value, 1000 + offset) }
    }

    fn batch(records: &[(i64, &'static str, Option<&'static str>)]) -> Bytes {
        let records = records.iter().map(|(o, k, v)| record(*o, k, *v)).collect();
        Bytes::from(encode_batch(records).expect("encodes"))
    }

    fn encoded(records: &[Record], compression: Compression) -> Bytes {
        let mut out = bytes::BytesMut::new();
        RecordBatchEncoder::encode(&mut out, records, &RecordEncodeOptions { version: 2, compression })
            .expect("encodes");
        out.freeze()
    }

    fn kept(outcome: Outcome) -> Vec<(i64, String, Option<String>)> {
        let Outcome::Rewritten(raw) = outcome else { panic!("not rewritten") };
        BatchHeader::validate(&raw).expect("a valid batch");
        let text = |b: Option<Bytes>| b.map(|b| String::from_utf8_lossy(&b).into_owned());
        decode(&Bytes::from(raw))
            .expect("decodes")
            .records
            .into_iter()
            .map(|r| (r.offset, text(r.key).unwrap_or_default(), text(r.value)))
            .collect()
    }

    fn map_of(batches: &[&Bytes], end: i64) -> OffsetMap {
        let mut map = OffsetMap::default();
        for b in batches {
            map.note(b, end).expect("notes");
        }
        map
    }

    #[test]
    fn superseded_records_go_and_offsets_stay() {
        let b1 = batch(&[(0, "a", Some("1")), (1, "b", Some("1")), (2, "a", Some("2"))]);
        let b2 = batch(&[(3, "c", Some("1")), (4, "b", None)]);
        let b3 = batch(&[(5, "a", Some("3"))]);
        // Offset 5 is past the end given: it supersedes nothing (the
        // tombstone at 4 supersedes b at 1).
        let map = map_of(&[&b1, &b2, &b3], 5);
        assert_eq!(
            kept(clean_batch(&b1, &map, false, false).expect("cleans")),
            vec![(2, "a".into(), Some("2".into()))]
        );
        let map = map_of(&[&b1, &b2, &b3], i64::MAX);
        assert!(matches!(clean_batch(&b1, &map, false, false).expect("cleans"), Outcome::Dropped));
        assert!(matches!(clean_batch(&b1, &map, true, false).expect("cleans"), Outcome::Whole), "a segment's last");
        // The tombstone of b stays until tombstones may go.
        assert!(matches!(clean_batch(&b2, &map, false, false).expect("cleans"), Outcome::Whole));
        assert_eq!(kept(clean_batch(&b2, &map, false, true).expect("cleans")), vec![(3, "c".into(), Some("1".into()))]);
    }

    #[test]
    fn compressed_batches_keep_their_compression() {
        let records = vec![record(0, "a", Some("1")), record(1, "b", Some("1")), record(2, "a", Some("2"))];
        let records: Vec<Record> = records.into_iter().map(|r| Record { sequence: r.offset as i32 - 1, ..r }).collect();
        for compression in [Compression::Gzip, Compression::Snappy, Compression::Lz4, Compression::Zstd] {
            let b = encoded(&records, compression);
            let map = map_of(&[&b], i64::MAX);
            let Outcome::Rewritten(raw) = clean_batch(&b, &map, false, false).expect("cleans") else {
                panic!("{compression:?}: not rewritten")
            };
            let header = BatchHeader::validate(&raw).expect("valid");
            assert_eq!(header.compression_code(), compression as u8, "{compression:?}");
            assert_eq!((header.base_offset(), header.last_offset()), (1, 2));
            assert_eq!(kept(Outcome::Rewritten(raw)).len(), 2);
        }
    }

    #[test]
    fn a_producers_last_batch_stays_whole_and_its_earlier_ones_keep_their_sequences() {
        let producer = |offset: i64, key: &'static str, sequence: i32| Record {
            producer_id: 42,
            producer_epoch: 3,
            sequence,
            ..record(offset, key, Some("v"))
        };
        let first = encoded(&[producer(0, "a", 10), producer(1, "b", 11), producer(2, "c", 12)], Compression::None);
        let last = encoded(&[producer(3, "a", 13), producer(4, "b", 14)], Compression::None);
        let map = map_of(&[&first, &last], i64::MAX);
        assert!(matches!(clean_batch(&last, &map, false, false).expect("cleans"), Outcome::Whole));
        let Outcome::Rewritten(raw) = clean_batch(&first, &map, false, false).expect("cleans") else {
            panic!("not rewritten")
        };
        let header = BatchHeader::validate(&raw).expect("valid");
        assert_eq!((header.producer_id(), header.producer_epoch(), header.base_sequence()), (42, 3, 12));
        assert_eq!((header.base_offset(), header.last_offset()), (2, 2));
        // Were every record of the last batch superseded, it would still stay whole.
        let later = batch(&[(5, "a", Some("w")), (6, "b", Some("w"))]);
        let map = map_of(&[&first, &last, &later], i64::MAX);
        assert!(matches!(clean_batch(&last, &map, false, false).expect("cleans"), Outcome::Whole));
    }

    #[test]
    fn log_append_time_survives_a_rewrite() {
        let b = batch(&[(0, "a", Some("1")), (1, "a", Some("2")), (2, "b", Some("1"))]);
        let mut raw = b.to_vec();
        restore_log_append_time(&mut raw, 99_999);
        let b = Bytes::from(raw);
        assert!(BatchHeader::validate(&b).expect("valid").is_log_append_time());
        let map = map_of(&[&b], i64::MAX);
        let Outcome::Rewritten(out) = clean_batch(&b, &map, false, false).expect("cleans") else {
            panic!("not rewritten")
        };
        let header = BatchHeader::validate(&out).expect("valid, CRC and all");
        assert!(header.is_log_append_time());
        assert_eq!(header.max_timestamp(), 99_999);
    }

    #[test]
    fn control_and_undecodable_batches_are_kept() {
        let control =
            encoded(&[Record { control: true, producer_id: 9, ..record(0, "k", Some("v")) }], Compression::None);
        let map = map_of(&[&control], i64::MAX);
        assert!(map.latest.is_empty(), "a control batch supersedes nothing");
        assert!(matches!(clean_batch(&control, &map, false, false).expect("cleans"), Outcome::Whole));
        let mut broken = batch(&[(0, "a", Some("1")), (1, "a", Some("2"))]).to_vec();
        let at = broken.len() - 3;
        broken[at] ^= 0xff;
        let broken = Bytes::from(broken);
        let map = map_of(&[&broken], i64::MAX);
        assert!(matches!(clean_batch(&broken, &map, false, false).expect("cleans"), Outcome::Whole));
    }

    #[test]
    fn aborted_records_go_and_committed_transactional_ones_are_cleaned_like_any() {
        let txn = |offset: i64, producer_id, value| {
            let r = Record {
                transactional: true,
                producer_id,
                producer_epoch: 0,
                sequence: offset as i32,
                ..record(offset, "k", Some(value))
            };
            encoded(&[r], Compression::None)
        };
        let plain = batch(&[(0, "k", Some("plain"))]);
        let aborted = txn(1, 9, "aborted");
        let committed = txn(3, 8, "committed");
        let later_aborted = txn(5, 9, "aborted again");
        let mut map = OffsetMap::with_aborted(&[
            AbortedTxn { producer_id: 9, first_offset: 1, last_offset: 2, last_stable_offset: 3 },
            AbortedTxn { producer_id: 9, first_offset: 5, last_offset: 6, last_stable_offset: 7 },
        ]);
        for b in [&plain, &aborted, &committed, &later_aborted] {
            map.note(b, i64::MAX).expect("notes");
        }
        assert_eq!(map.latest.get(&Bytes::from_static(b"k")), Some(&3), "aborted values supersede nothing");
        assert!(matches!(clean_batch(&plain, &map, false, false).expect("cleans"), Outcome::Dropped));
        assert!(matches!(clean_batch(&aborted, &map, false, false).expect("cleans"), Outcome::Dropped));
        assert!(
            matches!(clean_batch(&aborted, &map, true, false).expect("cleans"), Outcome::Whole),
            "a segment's last"
        );
        assert!(matches!(clean_batch(&committed, &map, false, false).expect("cleans"), Outcome::Whole));
        assert!(matches!(clean_batch(&later_aborted, &map, false, false).expect("cleans"), Outcome::Dropped));
    }

    #[test]
    fn a_marker_goes_once_its_transaction_has_no_records_left_and_its_segment_is_old() {
        let txn = |offset: i64, producer_id, key| {
            let r = Record {
                transactional: true,
                producer_id,
                producer_epoch: 0,
                sequence: offset as i32,
                ..record(offset, key, Some("v"))
            };
            encoded(&[r], Compression::None)
        };
        let marker = |offset: i64, producer_id, commit| {
            let mut raw = crate::log::txn::encode_marker(
                producer_id,
                0,
                crate::log::txn::EndTxnMarker { commit, coordinator_epoch: 0 },
                0,
            )
            .expect("encodes");
            raw[..8].copy_from_slice(&offset.to_be_bytes());
            Bytes::from(raw)
        };
        // Producer 8 commits k (superseded later), 7 commits j (kept), 9
        // aborts, 6 commits m (superseded later). 6 and 8 write again after
        // their markers: a producer's last batch stays whole.
        let log = [
            txn(0, 8, "k"),
            marker(1, 8, true),
            txn(2, 7, "j"),
            marker(3, 7, true),
            txn(4, 9, "a"),
            marker(5, 9, false),
            txn(6, 6, "m"),
            marker(7, 6, true),
            batch(&[(8, "k", Some("new")), (9, "m", Some("new"))]),
            txn(10, 6, "n"),
            txn(11, 8, "p"),
        ];
        let decide = |last: Option<i64>, past_horizon: bool| {
            let mut map = OffsetMap::with_aborted(&[AbortedTxn {
                producer_id: 9,
                first_offset: 4,
                last_offset: 5,
                last_stable_offset: 6,
            }]);
            for b in &log {
                map.note(b, i64::MAX).expect("notes");
            }
            let mut markers = Markers::default();
            for b in &log {
                let header = BatchHeader::parse(b).expect("parses");
                let is_last = Some(header.base_offset()) == last;
                let outcome = clean_batch(b, &map, is_last, past_horizon).expect("cleans");
                markers.see(&header, &outcome, is_last, past_horizon);
            }
            map.removable_markers = markers.removable;
            map
        };
        let map = decide(None, true);
        let mut gone: Vec<i64> = map.removable_markers.iter().copied().collect();
        gone.sort_unstable();
        assert_eq!(gone, vec![1, 5, 7], "7 kept j: its marker stays");
        assert!(matches!(clean_batch(&log[1], &map, false, true).expect("cleans"), Outcome::Dropped));
        assert!(matches!(clean_batch(&log[3], &map, false, true).expect("cleans"), Outcome::Whole));
        assert!(decide(None, false).removable_markers.is_empty(), "younger than delete.retention.ms: all stay");
        assert!(!decide(Some(1), true).removable_markers.contains(&1), "a segment's last batch stays");
    }
}
