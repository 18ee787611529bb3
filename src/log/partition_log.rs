//! The log of one topic partition, Kafka's `UnifiedLog`/`LocalLog`: an
//! ordered run of segments in `<logs dir>/<topic>-<partition>/`, the last one
//! active, plus the leader epoch cache.
//!
//! It owns offset assignment, segment rolling, retention, truncation,
//! flushing and recovery on open. It never decides who may append (the
//! partition layer checks leadership) nor how far a consumer may read (the
//! caller passes the high watermark as `max_offset`). On-disk contract: the
//! segments' base offsets increase and every batch of a later segment has
//! larger offsets than every batch of an earlier one; everything below the
//! recovery point has been fsynced; `leader-epoch-checkpoint` never names an
//! epoch starting at or past the log end offset.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use tracing::{info, warn};

use super::batch::{self, split_record_set, BatchHeader};
use super::checkpoint::{sync_dir, TMP_SUFFIX};
use super::compaction::{CompactionPlan, CompactionResult, PlannedSegment};
use super::leader_epoch::{EpochEndOffset, EpochEntry, LeaderEpochCache};
use super::segment::{
    parse_segment_file_name, segment_file_name, BatchInfo, LogSegment, INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX,
};
use super::slice::FileSlice;
use super::txn::{AbortedTxn, AbortedTxns};
use super::validator::{self, TimestampType};
use super::{LogConfig, LogError, Result};

/// What an append wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendInfo {
    pub base_offset: i64,
    pub last_offset: i64,
    /// Largest batch max timestamp in the append; -1 when none.
    pub max_timestamp: i64,
    pub record_count: u64,
    pub size_bytes: u64,
}

/// A batch found by timestamp: its base offset and max timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimestampOffset {
    pub timestamp: i64,
    pub offset: i64,
}

/// What one retention pass deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionOutcome {
    pub deleted_segments: usize,
    pub deleted_bytes: u64,
}

#[derive(Debug)]
pub struct PartitionLog {
    dir: PathBuf,
    topic: String,
    partition: i32,
    config: LogConfig,
    /// By base offset; never empty, the last one is the active segment.
    segments: BTreeMap<i64, LogSegment>,
    /// Every offset below this is fsynced.
    recovery_point: i64,
    leader_epoch_cache: LeaderEpochCache,
    unflushed_messages: u64,
    last_flush_ms: i64,
    /// The latest time the owner passed in; used by calls that take none.
    last_seen_ms: i64,
    /// Sealed segments up to here were compacted already (in this process).
    compacted_up_to: i64,
    /// Counts truncations from the end, so a flush ticket taken before one
    /// does not move the recovery point over records written after it.
    truncations: u64,
    /// Index files of sealed segments, written behind but not yet fsynced:
    /// the next flush ticket takes them.
    unsynced_indexes: Vec<std::fs::File>,
    /// The log start offset DeleteRecords moved to, when it is past the
    /// first segment's base (0 otherwise); kept in `log-start-offset`.
    start_offset: i64,
    /// The aborted transactions whose markers this log holds (the owner
    /// records them as it appends markers, and rebuilds them on open).
    aborted: AbortedTxns,
}

/// The file, in a partition's directory, that keeps the offset below which
/// compaction has cleaned the log (Kafka keeps one
/// `cleaner-offset-checkpoint` per data dir), so that a restart does not
/// count the whole log as dirty. Advisory: a missing or unreadable file
/// means 0, and a truncation removes it.
pub const CLEANER_OFFSET_FILE: &str = "cleaner-offset";

/// The directory, in a partition's directory, where compaction builds the
/// segments it swaps in (left over after a crash, it is emptied by the next
/// pass).
pub const COMPACTION_SCRATCH_DIR: &str = "compacting";

/// The file, in a partition's directory, that keeps a log start offset
/// DeleteRecords set inside the first segment (Kafka keeps one
/// `log-start-offset-checkpoint` per data dir; one small file per partition
/// follows `leader-epoch-checkpoint` here). Written atomically and fsynced.
pub const LOG_START_OFFSET_FILE: &str = "log-start-offset";

/// Reads `dir/log-start-offset`: 0 when there is none. A file that does not
/// parse is an error, never "0": records DeleteRecords removed would return.
fn read_start_offset(dir: &Path) -> Result<i64> {
    match fs::read_to_string(dir.join(LOG_START_OFFSET_FILE)) {
        Ok(text) => text.trim().parse::<i64>().ok().filter(|o| *o >= 0).ok_or_else(|| LogError::CorruptCheckpoint {
            path: dir.join(LOG_START_OFFSET_FILE),
            reason: format!("`{}` is not an offset", text.trim()),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e.into()),
    }
}

/// What an fdatasync made outside the log's owner's lock needs: the files
/// of the segments not yet synced and the log end offset they cover once
/// synced.
#[derive(Debug)]
pub struct FlushTicket {
    /// The `.log` of every segment from the one holding the recovery point
    /// to the active one: a segment a roll sealed is fsynced by the next
    /// flush (which the roll asks for), not by the roll.
    files: Vec<std::sync::Arc<std::fs::File>>,
    /// Index files of segments sealed since the last flush, written behind
    /// their entries.
    indexes: Vec<std::fs::File>,
    end: i64,
    truncations: u64,
}

impl FlushTicket {
    /// The offset below which every record is durable once `sync` returns.
    pub fn end(&self) -> i64 {
        self.end
    }

    /// fdatasync of the segment files and of the sealed segments' indexes
    /// (blocks; call it off the async threads and without the log's owner's
    /// lock).
    pub fn sync(&self) -> std::io::Result<()> {
        self.files.iter().try_for_each(|file| file.sync_data())?;
        self.indexes.iter().try_for_each(|index| index.sync_data())
    }
}

/// An append checked and placed under the log's owner's lock
/// ([`PartitionLog::prepare_append_as_leader`] or
/// [`PartitionLog::prepare_append_as_follower`]), to be written without it
/// ([`PreparedAppend::write`], the system calls that can block) and then
/// recorded under it again ([`PartitionLog::finish_append`]). Between the
/// two the active segment must not change: the owner serializes appends and
/// truncations behind one writer lock (retention and compaction never touch
/// the active segment).
#[derive(Debug)]
pub struct PreparedAppend {
    ranges: Vec<std::ops::Range<usize>>,
    heads: Vec<Vec<u8>>,
    infos: Vec<BatchInfo>,
    append: AppendInfo,
    file: std::sync::Arc<std::fs::File>,
    segment_base: i64,
    position: u64,
    truncations: u64,
    /// A roll for this append sealed the segment before: the owner asks for
    /// a flush once the append is recorded (Kafka flushes a rolled segment
    /// in the background too), so no append waits for that fsync.
    rolled: bool,
}

impl PreparedAppend {
    /// Whether a roll sealed a segment for this append (see `rolled`).
    pub fn rolled(&self) -> bool {
        self.rolled
    }

    /// Gives up an append that was written but will not be recorded: the
    /// file is cut back to where the append began, so no stray batch lies
    /// past the segment's end for a recovery scan to take after a crash.
    /// Call it with the owner's writer lock still held.
    pub fn abandon(&self) -> std::io::Result<()> {
        self.file.set_len(self.position)
    }

    /// Writes each batch at its place in the active segment's file. Needs
    /// no borrow of the log; `records` is the record set the append was
    /// prepared with.
    pub fn write(&self, records: &[u8]) -> Result<()> {
        let mut position = self.position;
        for ((range, head), info) in self.ranges.iter().zip(&self.heads).zip(&self.infos) {
            super::segment::write_batch(&self.file, position, head, &records[range.clone()], info)?;
            position += info.size_bytes;
        }
        Ok(())
    }
}

/// A read within this many bytes of the log end is taken to come from the
/// page cache (recently written); one further behind is warmed on a
/// blocking thread before it is made (see [`PartitionLog::prefetch_range`]).
pub const HOT_TAIL_BYTES: u64 = 64 << 20;

/// The partition directory name, `<topic>-<partition>`.
pub fn partition_dir_name(topic: &str, partition: i32) -> String {
    format!("{topic}-{partition}")
}

impl PartitionLog {
    /// Opens (creating if needed) `<logs_dir>/<topic>-<partition>/`.
    /// Segments wholly below `recovery_point` are trusted and their index
    /// files loaded; the rest are recovered (each batch's length and CRC-32C
    /// checked, a torn or corrupt tail cut, indexes rebuilt), and segments
    /// after a cut are deleted. The recovered part is fsynced, so the
    /// recovery point is the log end offset afterwards.
    pub fn open(
        logs_dir: &Path,
        topic: &str,
        partition: i32,
        config: LogConfig,
        recovery_point: i64,
        now_ms: i64,
    ) -> Result<Self> {
        config.validate()?;
        let dir = logs_dir.join(partition_dir_name(topic, partition));
        fs::create_dir_all(&dir)?;
        let base_offsets = scan_partition_dir(&dir)?;
        let segments = load_segments(&dir, &base_offsets, &config, recovery_point, now_ms)?;
        let mut log = Self {
            dir: dir.clone(),
            topic: topic.to_string(),
            partition,
            config,
            segments,
            recovery_point: 0,
            leader_epoch_cache: LeaderEpochCache::open(&dir)?,
            unflushed_messages: 0,
            last_flush_ms: now_ms,
            last_seen_ms: now_ms,
            compacted_up_to: 0,
            truncations: 0,
            unsynced_indexes: Vec::new(),
            start_offset: 0,
            aborted: AbortedTxns::default(),
        };
        // A start offset past the log end (a crash lost unflushed records
        // DeleteRecords had already passed): the log starts at its end.
        log.start_offset = read_start_offset(&dir)?.min(log.log_end_offset());
        log.compacted_up_to = fs::read_to_string(dir.join(CLEANER_OFFSET_FILE))
            .ok()
            .and_then(|text| text.trim().parse::<i64>().ok())
            .unwrap_or(0)
            .clamp(0, log.log_end_offset());
        log.recovery_point = log.log_end_offset();
        log.leader_epoch_cache.truncate_from_end(log.log_end_offset())?;
        log.leader_epoch_cache.truncate_from_start(log.log_start_offset())?;
        info!(
            topic,
            partition,
            log_start_offset = log.log_start_offset(),
            log_end_offset = log.log_end_offset(),
            segments = log.segments.len(),
            "opened partition log"
        );
        Ok(log)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn topic(&self) -> &str {
        &self.topic
    }
    pub fn partition(&self) -> i32 {
        self.partition
    }
    pub fn config(&self) -> &LogConfig {
        &self.config
    }
    /// Takes effect from the next append or retention pass.
    pub fn set_config(&mut self, config: LogConfig) -> Result<()> {
        config.validate()?;
        self.config = config;
        Ok(())
    }

    fn active(&self) -> &LogSegment {
        self.segments.values().next_back().expect("a log always has an active segment")
    }

    fn active_mut(&mut self) -> &mut LogSegment {
        self.segments.values_mut().next_back().expect("a log always has an active segment")
    }

    pub fn log_start_offset(&self) -> i64 {
        let first = *self.segments.keys().next().expect("a log always has an active segment");
        first.max(self.start_offset)
    }

    /// Moves the log start offset up to `offset` (at most the log end), as
    /// DeleteRecords does on a leader and a follower learns from its leader:
    /// the offset is made durable first, then the segments wholly below it
    /// are deleted (the active one always stays). Returns whether it moved.
    pub fn advance_start(&mut self, offset: i64) -> Result<bool> {
        let offset = offset.min(self.log_end_offset());
        if offset <= self.log_start_offset() {
            return Ok(false);
        }
        super::checkpoint::write_atomic(&self.dir.join(LOG_START_OFFSET_FILE), format!("{offset}\n").as_bytes())?;
        self.start_offset = offset;
        loop {
            let mut bases = self.segments.keys().copied();
            let (Some(oldest), Some(next_base)) = (bases.next(), bases.next()) else { break };
            if next_base > offset {
                break;
            }
            if let Some(segment) = self.segments.remove(&oldest) {
                segment.delete()?;
            }
        }
        self.recovery_point = self.recovery_point.max(offset);
        self.leader_epoch_cache.truncate_from_start(offset)?;
        self.aborted.trim_before(offset);
        info!(topic = %self.topic, partition = self.partition, log_start_offset = offset, "log start offset moved");
        Ok(true)
    }

    /// The offset the next appended record gets.
    pub fn log_end_offset(&self) -> i64 {
        self.active().next_offset()
    }

    /// Every offset below this has been fsynced.
    pub fn recovery_point(&self) -> i64 {
        self.recovery_point
    }

    pub fn size_bytes(&self) -> u64 {
        self.segments.values().map(LogSegment::size_bytes).sum()
    }

    /// Bytes of the batches from the one holding `offset` to the log end
    /// (what a replica at `offset` still has to copy); the whole log below
    /// the log start offset.
    pub fn size_bytes_from(&self, offset: i64) -> Result<u64> {
        let floor = self.segments.range(..=offset).next_back().map_or(i64::MIN, |(&base, _)| base);
        let mut total = 0;
        for segment in self.segments.range(floor..).map(|(_, segment)| segment) {
            total += if offset <= segment.base_offset() {
                segment.size_bytes()
            } else {
                segment.translate_offset(offset)?.map_or(0, |at| segment.size_bytes() - at.position)
            };
        }
        Ok(total)
    }

    pub fn segment_base_offsets(&self) -> Vec<i64> {
        self.segments.keys().copied().collect()
    }

    /// Appends a record set produced to this leader: validates every batch
    /// (length, magic 2, CRC-32C, at most `max_message_bytes`), assigns
    /// offsets from the log end offset by rewriting each base offset, stamps
    /// `leader_epoch`, and writes the bytes as given. The topic's per-record
    /// checks ([`validator`]) run first; a LogAppendTime topic stamps each
    /// batch with `now_ms`. All or nothing: a bad batch or record rejects
    /// the whole set before anything is written.
    pub fn append_as_leader(&mut self, records: &[u8], leader_epoch: i32, now_ms: i64) -> Result<AppendInfo> {
        let prepared = self.prepare_append_as_leader(records, leader_epoch, now_ms)?;
        prepared.write(records)?;
        self.finish_append(prepared)
    }

    /// `append_as_leader` up to the write: checks, offsets and heads
    /// assigned, the segment rolled if due. Nothing is written or recorded.
    pub fn prepare_append_as_leader(
        &mut self,
        records: &[u8],
        leader_epoch: i32,
        now_ms: i64,
    ) -> Result<PreparedAppend> {
        let ranges = split_record_set(records)?;
        for range in &ranges {
            let size = range.len() as u64;
            if size > self.config.max_message_bytes {
                return Err(LogError::MessageTooLarge { size, max: self.config.max_message_bytes });
            }
        }
        if let Some(latest_epoch) = self.leader_epoch_cache.latest_epoch() {
            if leader_epoch < latest_epoch {
                return Err(LogError::StaleLeaderEpoch { epoch: leader_epoch, latest_epoch });
            }
        }
        let topic_partition = partition_dir_name(&self.topic, self.partition);
        validator::validate_records(records, &ranges, &self.config, now_ms, &topic_partition)?;
        // The record set is written as received; only each batch's head, with
        // the offsets and epoch the log assigns, is new. Those fields lie
        // outside the CRC. LogAppendTime rewrites fields inside it, so such a
        // batch is copied whole.
        let log_append_time = self.config.timestamp_type == TimestampType::LogAppendTime;
        let mut next_offset = self.log_end_offset();
        let mut heads = Vec::with_capacity(ranges.len());
        for range in &ranges {
            let batch_bytes = &records[range.clone()];
            let mut head =
                batch_bytes[..if log_append_time { batch_bytes.len() } else { batch::ASSIGNED_HEAD_BYTES }].to_vec();
            if log_append_time {
                batch::set_log_append_time(&mut head, now_ms);
            }
            batch::set_base_offset(&mut head, next_offset);
            batch::set_partition_leader_epoch(&mut head, leader_epoch);
            next_offset += i64::from(BatchHeader::parse(batch_bytes)?.last_offset_delta()) + 1;
            heads.push(head);
        }
        self.prepare_validated(records, ranges, heads, now_ms)
    }

    /// Appends a record set fetched from the leader, offsets and epochs as
    /// the leader assigned them. Batches must be valid and start at or after
    /// the log end offset, offsets increasing.
    pub fn append_as_follower(&mut self, records: &[u8], now_ms: i64) -> Result<AppendInfo> {
        let prepared = self.prepare_append_as_follower(records, now_ms)?;
        prepared.write(records)?;
        self.finish_append(prepared)
    }

    /// `append_as_follower` up to the write (see `prepare_append_as_leader`).
    pub fn prepare_append_as_follower(&mut self, records: &[u8], now_ms: i64) -> Result<PreparedAppend> {
        let ranges = split_record_set(records)?;
        let mut next_offset = self.log_end_offset();
        for range in &ranges {
            let header = BatchHeader::parse(&records[range.clone()])?;
            if header.base_offset() < next_offset {
                return Err(LogError::NonMonotonicAppend {
                    base_offset: header.base_offset(),
                    log_end_offset: next_offset,
                });
            }
            next_offset = header.last_offset() + 1;
        }
        let heads = vec![Vec::new(); ranges.len()];
        self.prepare_validated(records, ranges, heads, now_ms)
    }

    /// Places the batches at `ranges` of `records`, each to be written as
    /// its `heads` entry followed by the rest of the batch as received, at
    /// the end of the active segment (rolled first if due).
    fn prepare_validated(
        &mut self,
        records: &[u8],
        ranges: Vec<std::ops::Range<usize>>,
        heads: Vec<Vec<u8>>,
        now_ms: i64,
    ) -> Result<PreparedAppend> {
        assert_eq!(ranges.len(), heads.len(), "one head per batch");
        let infos: Vec<BatchInfo> = ranges
            .iter()
            .zip(&heads)
            .map(|(range, head)| BatchInfo::with_head(&records[range.clone()], head))
            .collect::<std::result::Result<_, _>>()?;
        let (Some(first), Some(last)) = (infos.first(), infos.last()) else {
            return Err(LogError::CorruptBatch(batch::BatchError::TooShort { len: records.len() }));
        };
        let append = AppendInfo {
            base_offset: first.base_offset,
            last_offset: last.last_offset,
            max_timestamp: infos.iter().map(|info| info.max_timestamp).max().unwrap_or(-1),
            record_count: infos.iter().map(|info| info.record_count.max(0) as u64).sum(),
            size_bytes: records.len() as u64,
        };
        self.last_seen_ms = self.last_seen_ms.max(now_ms);
        let rolled = self.maybe_roll(&append, now_ms)?;
        let active = self.active();
        Ok(PreparedAppend {
            ranges,
            heads,
            infos,
            append,
            file: active.log_file().clone(),
            segment_base: active.base_offset(),
            position: active.size_bytes(),
            truncations: self.truncations,
            rolled,
        })
    }

    /// Records an append [`PreparedAppend::write`] wrote: the batches join
    /// the active segment and its indexes, and the log end offset moves.
    pub fn finish_append(&mut self, prepared: PreparedAppend) -> Result<AppendInfo> {
        let active = self.active();
        if prepared.truncations != self.truncations
            || active.base_offset() != prepared.segment_base
            || active.size_bytes() != prepared.position
        {
            // The owner's writer lock rules this out; refused rather than
            // recorded over whatever changed.
            return Err(LogError::Io(std::io::Error::other("the log changed while an append was being written")));
        }
        for info in &prepared.infos {
            self.leader_epoch_cache.assign(info.partition_leader_epoch, info.base_offset)?;
            self.active_mut().note_written(info)?;
        }
        self.unflushed_messages += prepared.append.record_count;
        Ok(prepared.append)
    }

    /// Rolls before an append when the active segment is full (bytes or
    /// index), old enough, or cannot hold the offsets as 32-bit deltas.
    /// Returns whether it sealed a segment (which the next flush fsyncs).
    fn maybe_roll(&mut self, append: &AppendInfo, now_ms: i64) -> Result<bool> {
        let active = self.active();
        let offsets_overflow = append.last_offset - active.base_offset() > i64::from(u32::MAX);
        let should_roll = offsets_overflow
            || (!active.is_empty()
                && (active.size_bytes() + append.size_bytes > self.config.segment_bytes
                    || now_ms.saturating_sub(active.created_ms()) >= as_ms(self.config.segment_ms)
                    || active.indexes_full()));
        if !should_roll {
            return Ok(false);
        }
        // A follower may append past a gap: roll at the batch's own base.
        self.roll(append.base_offset.max(self.log_end_offset()), now_ms)
    }

    /// Seals the active segment (final time index entry, index files
    /// written behind) and starts a new one at `new_base_offset`. An empty
    /// active segment is replaced. The sealed segment is not fsynced here:
    /// the recovery point stays where it is until a flush covers it, and the
    /// owner asks for one. Returns whether a segment was sealed.
    fn roll(&mut self, new_base_offset: i64, now_ms: i64) -> Result<bool> {
        assert!(new_base_offset >= self.log_end_offset(), "a new segment starts at or after the log end");
        let active_base = self.active().base_offset();
        let mut sealed = false;
        if self.active().is_empty() {
            if active_base == new_base_offset {
                return Ok(false);
            }
            if let Some(empty) = self.segments.remove(&active_base) {
                empty.delete()?;
            }
        } else {
            let indexes = self.active_mut().seal()?;
            self.unsynced_indexes.extend(indexes);
            sealed = true;
        }
        let segment = LogSegment::create(&self.dir, new_base_offset, &self.config, now_ms)?;
        self.segments.insert(new_base_offset, segment);
        sync_dir(&self.dir)?;
        info!(topic = %self.topic, partition = self.partition, base_offset = new_base_offset, "rolled log segment");
        Ok(sealed)
    }

    /// Whole raw batches starting with the one that holds `start_offset`,
    /// up to `max_bytes` but always at least one batch, none whose base
    /// offset is >= `max_offset` (the caller's high watermark, or the log
    /// end offset). Reads from one segment, as Kafka does. Empty at the log
    /// end; `OffsetOutOfRange` outside [log start offset, log end offset].
    pub fn read(&self, start_offset: i64, max_bytes: usize, max_offset: i64) -> Result<Bytes> {
        for segment in self.segments_from(start_offset)? {
            if let Some(bytes) = segment.read(start_offset, max_bytes, max_offset, true)? {
                return Ok(Bytes::from(bytes));
            }
        }
        Ok(Bytes::new())
    }

    /// The segments from the one that would hold `start_offset` on;
    /// `OffsetOutOfRange` outside [log start offset, log end offset].
    fn segments_from(&self, start_offset: i64) -> Result<impl Iterator<Item = &LogSegment>> {
        let log_end_offset = self.log_end_offset();
        let log_start_offset = self.log_start_offset();
        if start_offset < log_start_offset || start_offset > log_end_offset {
            return Err(LogError::OffsetOutOfRange { offset: start_offset, log_start_offset, log_end_offset });
        }
        let floor = self.segments.range(..=start_offset).next_back().map_or(log_start_offset, |(&base, _)| base);
        Ok(self.segments.range(floor..).map(|(_, segment)| segment))
    }

    /// What a Fetch sends: as [`Self::read`], but as a file range, not the
    /// bytes (see [`LogSegment::slice`]; the range may end inside a batch).
    /// The first batch is returned when larger than `max_bytes` only if
    /// `min_one_batch` (the first non-empty partition of a response,
    /// KIP-74); otherwise nothing is.
    pub fn slice(
        &self,
        start_offset: i64,
        max_bytes: usize,
        max_offset: i64,
        min_one_batch: bool,
    ) -> Result<FileSlice> {
        Ok(self.slice_with_bound(start_offset, max_bytes, max_offset, min_one_batch)?.0)
    }

    /// [`Self::slice`], and an offset the records of the slice all lie
    /// below (the end of the segment it reads, at most `max_offset`): the
    /// bound of the aborted transactions a `read_committed` answer reports.
    pub fn slice_with_bound(
        &self,
        start_offset: i64,
        max_bytes: usize,
        max_offset: i64,
        min_one_batch: bool,
    ) -> Result<(FileSlice, i64)> {
        for segment in self.segments_from(start_offset)? {
            if let Some(slice) = segment.slice(start_offset, max_bytes, max_offset, min_one_batch)? {
                return Ok((slice, segment.next_offset().min(max_offset)));
            }
        }
        Ok((FileSlice::empty(), start_offset))
    }

    /// Records the aborted transaction a marker just appended ended.
    pub fn record_aborted(&mut self, txn: AbortedTxn) {
        self.aborted.push(txn);
    }

    /// Every aborted transaction the log holds, in marker order (for a
    /// producer-state snapshot).
    pub fn aborted_txns(&self) -> &[AbortedTxn] {
        self.aborted.entries()
    }

    /// Puts back the aborted transactions a snapshot kept (those wholly
    /// before the log start are left out).
    pub fn restore_aborted(&mut self, txns: Vec<AbortedTxn>) {
        self.aborted.clear();
        for t in txns {
            self.aborted.push(t);
        }
        self.aborted.trim_before(self.log_start_offset());
    }

    /// The aborted transactions with records in `[from, to)`, in marker order.
    pub fn aborted_overlapping(&self, from: i64, to: i64) -> Vec<AbortedTxn> {
        self.aborted.overlapping(from, to)
    }

    /// For a read from `offset` far behind the log end (more than
    /// [`HOT_TAIL_BYTES`] before it, so perhaps no longer in the page
    /// cache): the file range it will read, from the offset index's entry
    /// at or before `offset`, `max_bytes` and the index's spacing long, to
    /// warm without the lock before the read (see [`FileSlice::warm`]).
    /// `None` near the end, where consumers keeping up read, and outside
    /// the log. In memory only: no I/O.
    pub fn prefetch_range(&self, offset: i64, max_bytes: u64) -> Option<FileSlice> {
        if offset < self.log_start_offset() || offset >= self.log_end_offset() {
            return None;
        }
        let (&base, segment) = self.segments.range(..=offset).next_back()?;
        let position = segment.position_at_or_before(offset);
        if self.bytes_after(base, position) <= HOT_TAIL_BYTES {
            return None;
        }
        let len = (max_bytes + self.config.index_interval_bytes).min(segment.size_bytes().saturating_sub(position));
        Some(FileSlice::new(segment.log_file().clone(), position, len))
    }

    /// Bytes of the log from `position` of the segment at `segment_base` to
    /// the log end.
    pub fn bytes_after(&self, segment_base: i64, position: u64) -> u64 {
        self.segments
            .range(segment_base..)
            .map(|(&base, segment)| {
                if base == segment_base {
                    segment.size_bytes().saturating_sub(position)
                } else {
                    segment.size_bytes()
                }
            })
            .sum()
    }

    /// The first batch whose max timestamp is >= `target_timestamp`
    /// (ListOffsets by time): its base offset and max timestamp. Kafka goes
    /// on to the exact record inside the batch; that needs the records
    /// decoded, which this module never does, so the answer may be a few
    /// records early. `None` when every batch is older.
    pub fn offset_for_timestamp(&self, target_timestamp: i64) -> Result<Option<TimestampOffset>> {
        for segment in self.segments.values() {
            if let Some(found) = segment.find_batch_by_timestamp(target_timestamp)? {
                return Ok(Some(TimestampOffset { timestamp: found.max_timestamp, offset: found.base_offset }));
            }
        }
        Ok(None)
    }

    /// The batch holding the largest timestamp below `max_offset`
    /// (ListOffsets MAX_TIMESTAMP, KIP-734): that timestamp and the batch's
    /// base offset, the earliest batch on a tie; `None` when no batch there
    /// has a timestamp.
    pub fn max_timestamp_batch(&self, max_offset: i64) -> Result<Option<TimestampOffset>> {
        let mut best: Option<TimestampOffset> = None;
        for segment in self.segments.values() {
            if let Some(found) = segment.max_timestamp_batch(max_offset)? {
                if best.is_none_or(|b| found.timestamp > b.timestamp) {
                    best = Some(TimestampOffset { timestamp: found.timestamp, offset: found.base_offset });
                }
            }
        }
        Ok(best)
    }

    /// Deletes the oldest sealed segments while they breach `retention_ms`
    /// (by their largest timestamp) or `retention_bytes`, never the active
    /// segment and never one holding offsets at or above `high_watermark`.
    /// Moves the log start offset and trims the leader epoch cache.
    pub fn apply_retention(&mut self, now_ms: i64, high_watermark: i64) -> Result<RetentionOutcome> {
        let mut outcome = RetentionOutcome::default();
        let mut excess_bytes =
            self.config.retention_bytes.map_or(0, |limit| self.size_bytes().saturating_sub(limit) as i128);
        loop {
            let mut bases = self.segments.keys().copied();
            let (Some(oldest), Some(next_base)) = (bases.next(), bases.next()) else {
                break; // Only the active segment is left.
            };
            if next_base > high_watermark {
                break;
            }
            let segment = &self.segments[&oldest];
            let time_breach = self
                .config
                .retention_ms
                .is_some_and(|limit| now_ms.saturating_sub(segment.largest_timestamp()) > as_ms(limit));
            let size_breach =
                self.config.retention_bytes.is_some() && excess_bytes - i128::from(segment.size_bytes()) >= 0;
            if !(time_breach || size_breach) {
                break;
            }
            let Some(segment) = self.segments.remove(&oldest) else {
                break;
            };
            let size = segment.size_bytes();
            excess_bytes -= i128::from(size);
            segment.delete()?;
            outcome.deleted_segments += 1;
            outcome.deleted_bytes += size;
            info!(
                topic = %self.topic, partition = self.partition, base_offset = oldest, size_bytes = size,
                time_breach, size_breach, "deleted log segment by retention"
            );
        }
        if outcome.deleted_segments > 0 {
            let log_start_offset = self.log_start_offset();
            self.recovery_point = self.recovery_point.max(log_start_offset);
            self.leader_epoch_cache.truncate_from_start(log_start_offset)?;
            self.aborted.trim_before(log_start_offset);
        }
        Ok(outcome)
    }

    /// Step 1 of a compaction pass (see [`super::compaction`]): the sealed
    /// segments to clean, below `high_watermark` (the owner passes the last
    /// stable offset, below which every transaction is decided), or `None`
    /// when no pass is due.
    pub fn plan_compaction(&self, high_watermark: i64, now_ms: i64) -> Result<Option<CompactionPlan>> {
        if !self.config.compact {
            return Ok(None);
        }
        let active_base = self.active().base_offset();
        let lag = self.config.min_compaction_lag_ms as i64;
        let cleanable: Vec<&LogSegment> = self
            .segments
            .values()
            .take_while(|s| {
                s.base_offset() != active_base
                    && s.next_offset() <= high_watermark
                    && (lag == 0 || s.largest_timestamp() <= now_ms.saturating_sub(lag))
            })
            .collect();
        let Some(last) = cleanable.last() else { return Ok(None) };
        let end = last.next_offset();
        let (mut clean, mut dirty) = (0u64, 0u64);
        let mut oldest_dirty = None;
        for s in &cleanable {
            if s.next_offset() <= self.compacted_up_to {
                clean += s.size_bytes();
            } else {
                dirty += s.size_bytes();
                oldest_dirty.get_or_insert(s.largest_timestamp());
            }
        }
        let Some(oldest_dirty) = oldest_dirty else { return Ok(None) };
        let ratio = dirty as f64 / (clean + dirty).max(1) as f64;
        let overdue =
            self.config.max_compaction_lag_ms.is_some_and(|max| oldest_dirty < now_ms.saturating_sub(max as i64));
        if ratio < self.config.min_cleanable_dirty_ratio && !overdue {
            return Ok(None);
        }
        let segments = cleanable
            .iter()
            .map(|s| {
                let file = s.log_file().clone();
                let modified = file.metadata()?.modified().ok();
                Ok(PlannedSegment {
                    base_offset: s.base_offset(),
                    next_offset: s.next_offset(),
                    size_bytes: s.size_bytes(),
                    file,
                    modified,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(CompactionPlan {
            scratch: self.dir.join(COMPACTION_SCRATCH_DIR),
            config: self.config.clone(),
            end,
            segments,
            truncations: self.truncations,
            aborted: self.aborted.overlapping(self.log_start_offset(), end),
        }))
    }

    /// Step 3 of a compaction pass, at once: [`Self::install_compacted_segment`]
    /// for each rewritten segment, then [`Self::finish_compaction`]. Returns
    /// the number of segments swapped.
    pub fn install_compacted(&mut self, result: CompactionResult, now_ms: i64) -> Result<usize> {
        let mut swapped = 0;
        for i in 0..result.rewritten.len() {
            if self.install_compacted_segment(&result, i, now_ms)? {
                swapped += 1;
            }
        }
        self.finish_compaction(result)?;
        Ok(swapped)
    }

    /// Swaps in the `i`th segment a pass rewrote, if its originals are
    /// still the segments that were read (it was built beside the log and
    /// fsynced, its indexes with it; they go in after it, so a crash in
    /// between leaves a segment whose indexes are rebuilt on open). The
    /// caller may let go of the log between segments: each swap stands on
    /// its own. Returns whether it was swapped.
    pub fn install_compacted_segment(&mut self, result: &CompactionResult, i: usize, now_ms: i64) -> Result<bool> {
        let Some(r) = result.rewritten.get(i) else { return Ok(false) };
        if result.truncations != self.truncations {
            return Ok(false);
        }
        let active_base = self.active().base_offset();
        let unchanged = r.replaces.iter().all(|&(base, next_offset, size)| {
            self.segments
                .get(&base)
                .is_some_and(|s| base != active_base && s.next_offset() == next_offset && s.size_bytes() == size)
        });
        if !unchanged {
            return Ok(false);
        }
        let name = |suffix| segment_file_name(r.base_offset, suffix);
        for suffix in [INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
            match fs::remove_file(self.dir.join(name(suffix))) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
        }
        // The merged segment goes in first: a crash before the segments it
        // covers are deleted leaves them overlapping it, and opening the log
        // deletes them (see `load_segments`).
        fs::rename(result.scratch.join(name(LOG_SUFFIX)), self.dir.join(name(LOG_SUFFIX)))?;
        sync_dir(&self.dir)?;
        for &(base, _, _) in &r.replaces[1..] {
            if let Some(merged) = self.segments.remove(&base) {
                merged.delete()?;
            }
        }
        for suffix in [INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
            fs::rename(result.scratch.join(name(suffix)), self.dir.join(name(suffix)))?;
        }
        sync_dir(&self.dir)?;
        self.segments.remove(&r.base_offset);
        // Written and fsynced by the cleaner with its indexes: opened as a
        // flushed segment, without reading it all again.
        let (reopened, _) = LogSegment::open_clean(&self.dir, r.base_offset, &self.config, now_ms)?;
        self.segments.insert(r.base_offset, reopened);
        self.aborted.forget_markers(&r.removed_markers.iter().copied().collect());
        let bytes_before: u64 = r.replaces.iter().map(|&(_, _, size)| size).sum();
        info!(topic = %self.topic, partition = self.partition, base_offset = r.base_offset,
            segments = r.replaces.len(), bytes_before, bytes_after = r.size_after, "compacted log segment");
        Ok(true)
    }

    /// The end of a pass: notes where it got to (unless a truncation came
    /// in between) and removes its scratch directory.
    pub fn finish_compaction(&mut self, result: CompactionResult) -> Result<()> {
        if result.truncations == self.truncations && result.end > self.compacted_up_to {
            self.compacted_up_to = result.end;
            super::checkpoint::write_atomic(
                &self.dir.join(CLEANER_OFFSET_FILE),
                format!("{}\n", result.end).as_bytes(),
            )?;
        }
        match fs::remove_dir_all(&result.scratch) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
        Ok(())
    }

    /// After a truncation: nothing at or past `offset` counts as cleaned.
    fn forget_cleaned_past(&mut self, offset: i64) -> Result<()> {
        if self.compacted_up_to > offset {
            self.compacted_up_to = offset;
            match fs::remove_file(self.dir.join(CLEANER_OFFSET_FILE)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
        }
        Ok(())
    }

    /// A whole compaction pass below `high_watermark`, holding the log
    /// throughout (the partition layer runs step 2 without its lock).
    /// Returns the number of segments rewritten.
    pub fn compact(&mut self, high_watermark: i64, now_ms: i64) -> Result<usize> {
        let Some(plan) = self.plan_compaction(high_watermark, now_ms)? else { return Ok(0) };
        let result = super::compaction::clean(&plan, std::time::SystemTime::now(), &|| false)?;
        self.install_compacted(result, now_ms)
    }

    /// Removes every record at or after `target_offset` (a whole batch if
    /// the target falls inside one), for a replica that diverged from its
    /// leader. Below the log start offset this empties the log and starts
    /// it at `target_offset`. Returns whether anything was removed.
    pub fn truncate_to(&mut self, target_offset: i64) -> Result<bool> {
        if target_offset >= self.log_end_offset() {
            return Ok(false);
        }
        if target_offset < self.log_start_offset() {
            self.truncate_fully_and_start_at(target_offset)?;
            return Ok(true);
        }
        let doomed: Vec<i64> = self.segments.range(target_offset + 1..).map(|(&base, _)| base).collect();
        for base in doomed {
            if let Some(segment) = self.segments.remove(&base) {
                segment.delete()?;
            }
        }
        let removed = self.active_mut().truncate_to(target_offset)?;
        self.active().flush()?;
        self.truncations += 1;
        let log_end_offset = self.log_end_offset();
        self.forget_cleaned_past(log_end_offset)?;
        self.recovery_point = self.recovery_point.min(log_end_offset);
        self.leader_epoch_cache.truncate_from_end(log_end_offset)?;
        self.aborted.truncate_to(log_end_offset);
        warn!(
            topic = %self.topic, partition = self.partition, target_offset, log_end_offset, removed_bytes = removed,
            "truncated log"
        );
        Ok(true)
    }

    /// Deletes every segment and starts an empty log at `new_offset`
    /// (a follower whose leader no longer has the follower's offsets).
    pub fn truncate_fully_and_start_at(&mut self, new_offset: i64) -> Result<()> {
        assert!(new_offset >= 0, "offsets are never negative");
        let old_segments = std::mem::take(&mut self.segments);
        self.truncations += 1;
        self.forget_cleaned_past(0)?;
        // Create the new segment first, so a crash midway still leaves a
        // log that starts no later than the new one.
        let fresh = LogSegment::create(&self.dir, new_offset, &self.config, self.last_seen_ms)?;
        self.segments.insert(new_offset, fresh);
        for (base, segment) in old_segments {
            if base != new_offset {
                segment.delete()?;
            }
        }
        // The new first segment's base is the log start now.
        if self.start_offset != 0 {
            match fs::remove_file(self.dir.join(LOG_START_OFFSET_FILE)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
            self.start_offset = 0;
        }
        sync_dir(&self.dir)?;
        self.leader_epoch_cache.clear()?;
        self.aborted.clear();
        self.recovery_point = new_offset;
        self.unflushed_messages = 0;
        warn!(topic = %self.topic, partition = self.partition, new_offset, "truncated log fully");
        Ok(())
    }

    /// fsyncs the active segment (older ones were fsynced when they rolled)
    /// and moves the recovery point to the log end offset.
    pub fn flush(&mut self) -> Result<()> {
        let ticket = self.flush_ticket()?;
        ticket.sync()?;
        self.flushed(&ticket);
        Ok(())
    }

    /// Whether `flush_messages` records are unflushed. Appends never flush:
    /// the owner checks this after one and flushes, off its lock with a
    /// `flush_ticket` (group commit), or here with `maybe_flush`.
    pub fn flush_due_by_count(&self) -> bool {
        self.config.flush_messages.is_some_and(|limit| self.unflushed_messages >= limit)
    }

    /// Starts a flush of everything appended so far, to be made by
    /// `FlushTicket::sync` without this log borrowed and recorded with
    /// `flushed`. Appends after the ticket count toward the next flush.
    pub fn flush_ticket(&mut self) -> Result<FlushTicket> {
        // The active segment's indexes are not written: a log opens its last
        // segment by scanning it whatever they hold (see `load_segments`), and
        // two more fsyncs per flush would halve what a group commit carries.
        // A sealed segment's are, as its recovery trusts them.
        let indexes = std::mem::take(&mut self.unsynced_indexes);
        // From the segment holding the recovery point on: usually the active
        // one alone, and a segment sealed since the last flush.
        let first = self.segments.range(..=self.recovery_point).next_back().map_or(i64::MIN, |(&base, _)| base);
        let files = self.segments.range(first..).map(|(_, segment)| segment.log_file().clone()).collect();
        self.unflushed_messages = 0;
        self.last_flush_ms = self.last_seen_ms;
        Ok(FlushTicket { files, indexes, end: self.log_end_offset(), truncations: self.truncations })
    }

    /// Records a ticket's sync: the recovery point moves to its end, unless
    /// the log was truncated since (what lies there now may be newer).
    pub fn flushed(&mut self, ticket: &FlushTicket) {
        if ticket.truncations == self.truncations {
            self.recovery_point = self.recovery_point.max(ticket.end.min(self.log_end_offset()));
        }
    }

    /// Flushes if `flush_messages` records are unflushed or `flush_ms` has
    /// passed since the last flush. Called periodically by the owner (and
    /// by owners that do not flush with tickets). Returns whether it flushed.
    pub fn maybe_flush(&mut self, now_ms: i64) -> Result<bool> {
        if self.flush_due(now_ms) {
            self.flush()?;
            self.last_flush_ms = now_ms;
            return Ok(true);
        }
        Ok(false)
    }

    /// Whether `flush_messages` records are unflushed or `flush_ms` has
    /// passed since the last flush (with records to flush).
    pub fn flush_due(&mut self, now_ms: i64) -> bool {
        if self.unflushed_messages == 0 {
            self.last_flush_ms = now_ms;
            return false;
        }
        self.flush_due_by_count()
            || self.config.flush_ms.is_some_and(|limit| now_ms.saturating_sub(self.last_flush_ms) >= as_ms(limit))
    }

    pub fn unflushed_messages(&self) -> u64 {
        self.unflushed_messages
    }

    pub fn latest_epoch(&self) -> Option<i32> {
        self.leader_epoch_cache.latest_epoch()
    }

    pub fn epoch_entries(&self) -> &[EpochEntry] {
        self.leader_epoch_cache.entries()
    }

    /// OffsetsForLeaderEpoch: where `leader_epoch` ended in this log.
    pub fn end_offset_for_epoch(&self, leader_epoch: i32) -> Option<EpochEndOffset> {
        self.leader_epoch_cache.end_offset_for(leader_epoch, self.log_end_offset())
    }

    /// Flushes and closes the log.
    pub fn close(mut self) -> Result<()> {
        self.flush()
    }

    /// Deletes the whole partition directory (topic deletion).
    pub fn delete(self) -> Result<()> {
        let dir = self.dir.clone();
        drop(self);
        fs::remove_dir_all(&dir)?;
        Ok(())
    }
}

/// A duration setting as a signed millisecond count, saturating (a setting
/// beyond i64::MAX means "never").
fn as_ms(setting_ms: u64) -> i64 {
    i64::try_from(setting_ms).unwrap_or(i64::MAX)
}

/// Lists the segment base offsets in a partition directory, sorted, after
/// removing leftovers of interrupted work: checkpoint temp files and index
/// files whose `.log` is gone (a deletion cut short).
fn scan_partition_dir(dir: &Path) -> Result<Vec<i64>> {
    let mut log_bases = Vec::new();
    let mut index_files = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(TMP_SUFFIX) {
            warn!(file = %entry.path().display(), "removing leftover temporary file");
            fs::remove_file(entry.path())?;
        } else if let Some(base) = parse_segment_file_name(&name, LOG_SUFFIX) {
            log_bases.push(base);
        } else if let Some(base) =
            parse_segment_file_name(&name, INDEX_SUFFIX).or_else(|| parse_segment_file_name(&name, TIME_INDEX_SUFFIX))
        {
            index_files.push((base, entry.path()));
        }
    }
    log_bases.sort_unstable();
    for (base, path) in index_files {
        if log_bases.binary_search(&base).is_err() {
            warn!(file = %path.display(), "removing index file without a segment");
            fs::remove_file(path)?;
        }
    }
    Ok(log_bases)
}

/// Opens the segments found on disk (or creates the first one at offset 0).
/// A segment is trusted when the next one starts at or below the recovery
/// point; the last segment is always recovered. Once recovery cuts a
/// segment (or finds an empty one before others), the segments after it are
/// leftovers that no longer follow on, and are deleted.
fn load_segments(
    dir: &Path,
    base_offsets: &[i64],
    config: &LogConfig,
    recovery_point: i64,
    now_ms: i64,
) -> Result<BTreeMap<i64, LogSegment>> {
    let mut segments = BTreeMap::new();
    if base_offsets.is_empty() {
        segments.insert(0, LogSegment::create(dir, 0, config, now_ms)?);
        sync_dir(dir)?;
        return Ok(segments);
    }
    let mut cut_at = None;
    for (i, &base) in base_offsets.iter().enumerate() {
        if let Some(cut_base) = cut_at {
            warn!(dir = %dir.display(), base_offset = base, after = cut_base, "deleting segment after a corrupt one");
            for suffix in [LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
                let path = dir.join(super::segment::segment_file_name(base, suffix));
                if path.exists() {
                    fs::remove_file(path)?;
                }
            }
            continue;
        }
        // A segment that starts inside the one before is what a crash in
        // the middle of a compaction merge leaves: its records are in the
        // merged segment already.
        if let Some(end_before) = segments.values().next_back().map(LogSegment::next_offset) {
            if base < end_before {
                let (leftover, _) = LogSegment::open_and_recover(dir, base, config, now_ms)?;
                if !leftover.is_empty() && leftover.next_offset() <= end_before {
                    warn!(dir = %dir.display(), base_offset = base, end_before,
                        "deleting a segment a compaction merged into the one before it");
                    leftover.delete()?;
                    continue;
                }
            }
        }
        let trusted = base_offsets.get(i + 1).is_some_and(|&next| next <= recovery_point);
        let (segment, cut_bytes) = if trusted {
            LogSegment::open_clean(dir, base, config, now_ms)?
        } else {
            let opened = LogSegment::open_and_recover(dir, base, config, now_ms)?;
            opened.0.flush()?;
            opened
        };
        // An empty segment before others is what a crash inside
        // truncate_fully_and_start_at leaves; what follows it was meant to go.
        let is_last = i + 1 == base_offsets.len();
        if cut_bytes > 0 || (segment.is_empty() && !is_last) {
            cut_at = Some(base);
        }
        segments.insert(base, segment);
    }
    Ok(segments)
}

#[cfg(test)]
#[path = "partition_log_tests.rs"]
mod tests;
