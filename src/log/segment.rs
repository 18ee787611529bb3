//! One log segment, Kafka's `LogSegment`: the `<base offset, 20 digits>.log`
//! file plus its `.index` and `.timeindex`, and the recovery scan that
//! rebuilds them.
//!
//! On-disk contract: the `.log` is a plain concatenation of v2 record batches
//! exactly as appended (see [`super::batch`]); batch base offsets strictly
//! increase, all are >= the segment's base offset and within 2^32 of it, and
//! the file stays below 2^32 bytes. Nothing else is in the file: a byte
//! range that does not parse as a batch with a valid CRC-32C is a torn or
//! corrupt tail, and recovery cuts it off. The segment never decides when to
//! roll or what to delete; [`super::partition_log`] does.

use std::fs::{self, File, OpenOptions};
use std::io::{BufReader, ErrorKind, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::warn;

use super::batch::{BatchError, BatchHeader, ASSIGNED_HEAD_BYTES, CRC_COVERED_FROM, HEADER_BYTES, LOG_OVERHEAD};
use super::offset_index::OffsetIndex;
use super::slice::FileSlice;
use super::time_index::TimeIndex;
use super::{LogConfig, LogError, Result};

pub const LOG_SUFFIX: &str = ".log";
pub const INDEX_SUFFIX: &str = ".index";
pub const TIME_INDEX_SUFFIX: &str = ".timeindex";

/// Read buffer for the recovery scan; bounds memory however large a batch is.
const RECOVERY_CHUNK_BYTES: usize = 64 * 1024;

/// `<base offset, 20 digits><suffix>`, Kafka's segment file naming.
pub fn segment_file_name(base_offset: i64, suffix: &str) -> String {
    format!("{base_offset:020}{suffix}")
}

/// The base offset encoded in a segment file name with `suffix`, if any.
pub fn parse_segment_file_name(file_name: &str, suffix: &str) -> Option<i64> {
    let digits = file_name.strip_suffix(suffix)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The header fields the log needs, copied out of a batch header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchInfo {
    pub base_offset: i64,
    pub last_offset: i64,
    pub max_timestamp: i64,
    pub partition_leader_epoch: i32,
    pub record_count: i32,
    pub size_bytes: u64,
}

impl BatchInfo {
    /// The info of `batch` as written with `head` in place of its first
    /// bytes: a whole rewritten header, or the first
    /// [`super::batch::ASSIGNED_HEAD_BYTES`] (base offset and leader epoch),
    /// or nothing (written as received).
    pub fn with_head(batch: &[u8], head: &[u8]) -> std::result::Result<Self, BatchError> {
        if head.len() >= HEADER_BYTES {
            return Ok(Self::from_header(&BatchHeader::parse(head)?));
        }
        let mut info = Self::from_header(&BatchHeader::parse(batch)?);
        if head.len() >= ASSIGNED_HEAD_BYTES {
            let assigned = BatchHeader::parse_assigned(head);
            info.last_offset = assigned.0 + (info.last_offset - info.base_offset);
            (info.base_offset, info.partition_leader_epoch) = assigned;
        }
        Ok(info)
    }

    pub fn from_header(header: &BatchHeader<'_>) -> Self {
        Self {
            base_offset: header.base_offset(),
            last_offset: header.last_offset(),
            max_timestamp: header.max_timestamp(),
            partition_leader_epoch: header.partition_leader_epoch(),
            record_count: header.record_count(),
            size_bytes: header.total_size() as u64,
        }
    }
}

/// A batch's max timestamp and base offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimestampAt {
    pub timestamp: i64,
    pub base_offset: i64,
}

/// A batch found at a file position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchAt {
    pub position: u64,
    pub info: BatchInfo,
}

#[derive(Debug)]
pub struct LogSegment {
    base_offset: i64,
    log_path: PathBuf,
    /// Shared with the [`FileSlice`]s reads hand out, which may outlive the segment.
    log_file: Arc<File>,
    size_bytes: u64,
    /// Last offset + 1 of the last batch; the base offset when empty.
    next_offset: i64,
    /// Largest batch max timestamp so far; -1 when none.
    max_timestamp: i64,
    /// Base offset of the batch holding `max_timestamp`.
    offset_of_max_timestamp: i64,
    bytes_since_last_index_entry: u64,
    /// When this process created or opened the segment (for `segment.ms`).
    created_ms: i64,
    index_interval_bytes: u64,
    segment_index_bytes: u64,
    offset_index: OffsetIndex,
    time_index: TimeIndex,
}

impl LogSegment {
    /// Creates an empty segment, replacing any files at its paths.
    pub fn create(dir: &Path, base_offset: i64, config: &LogConfig, now_ms: i64) -> Result<Self> {
        let log_path = dir.join(segment_file_name(base_offset, LOG_SUFFIX));
        let log_file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&log_path)?;
        Self::assemble(dir, base_offset, config, now_ms, log_path, log_file)
    }

    fn assemble(
        dir: &Path,
        base_offset: i64,
        config: &LogConfig,
        now_ms: i64,
        log_path: PathBuf,
        log_file: File,
    ) -> Result<Self> {
        let offset_index = OffsetIndex::create(
            &dir.join(segment_file_name(base_offset, INDEX_SUFFIX)),
            base_offset,
            config.segment_index_bytes,
        )?;
        let time_index = TimeIndex::create(
            &dir.join(segment_file_name(base_offset, TIME_INDEX_SUFFIX)),
            base_offset,
            config.segment_index_bytes,
        )?;
        Ok(Self {
            base_offset,
            log_path,
            log_file: Arc::new(log_file),
            size_bytes: 0,
            next_offset: base_offset,
            max_timestamp: -1,
            offset_of_max_timestamp: base_offset,
            bytes_since_last_index_entry: 0,
            created_ms: now_ms,
            index_interval_bytes: config.index_interval_bytes,
            segment_index_bytes: config.segment_index_bytes,
            offset_index,
            time_index,
        })
    }

    /// Opens an existing segment and recovers it: every batch is checked
    /// (length, magic, CRC-32C, increasing offsets), indexes are rebuilt,
    /// and a torn or corrupt tail is cut off. Returns the bytes cut.
    pub fn open_and_recover(dir: &Path, base_offset: i64, config: &LogConfig, now_ms: i64) -> Result<(Self, u64)> {
        let log_path = dir.join(segment_file_name(base_offset, LOG_SUFFIX));
        let log_file = OpenOptions::new().read(true).write(true).open(&log_path)?;
        let mut segment = Self::assemble(dir, base_offset, config, now_ms, log_path, log_file)?;
        let truncated_bytes = segment.recover()?;
        Ok((segment, truncated_bytes))
    }

    /// Opens a segment below the recovery point (known flushed): loads its
    /// index files and reads only the batches after the last index entry. If
    /// an index fails its sanity checks, falls back to a full recovery.
    pub fn open_clean(dir: &Path, base_offset: i64, config: &LogConfig, now_ms: i64) -> Result<(Self, u64)> {
        let log_path = dir.join(segment_file_name(base_offset, LOG_SUFFIX));
        let log_file = OpenOptions::new().read(true).write(true).open(&log_path)?;
        let size_bytes = log_file.metadata()?.len();
        let index_path = dir.join(segment_file_name(base_offset, INDEX_SUFFIX));
        let time_index_path = dir.join(segment_file_name(base_offset, TIME_INDEX_SUFFIX));
        if let Some(offset_index) = OffsetIndex::load(&index_path, base_offset, config.segment_index_bytes, size_bytes)?
        {
            let tail_from = offset_index.last_entry().map_or(0, |entry| u64::from(entry.position));
            if let Ok(tail) = walk_batches(&log_file, tail_from, size_bytes) {
                let next_offset = tail.last().map_or(base_offset, |batch| batch.info.last_offset + 1);
                let loaded = TimeIndex::load(&time_index_path, base_offset, config.segment_index_bytes, next_offset)?;
                if let (Some(time_index), true) = (loaded, tail_ends_at(&tail, tail_from, size_bytes)) {
                    let mut segment = Self {
                        base_offset,
                        log_path,
                        log_file: Arc::new(log_file),
                        size_bytes,
                        next_offset,
                        max_timestamp: -1,
                        offset_of_max_timestamp: base_offset,
                        bytes_since_last_index_entry: size_bytes - tail_from,
                        created_ms: now_ms,
                        index_interval_bytes: config.index_interval_bytes,
                        segment_index_bytes: config.segment_index_bytes,
                        offset_index,
                        time_index,
                    };
                    segment.absorb_tail_timestamps(&tail);
                    return Ok((segment, 0));
                }
            }
        }
        warn!(segment = %log_path.display(), "index of a flushed segment is unusable; recovering the segment");
        Self::open_and_recover(dir, base_offset, config, now_ms)
    }

    fn absorb_tail_timestamps(&mut self, tail: &[BatchAt]) {
        if let Some(last) = self.time_index.last_entry() {
            self.max_timestamp = last.timestamp;
            self.offset_of_max_timestamp = last.offset;
        }
        for batch in tail {
            if batch.info.max_timestamp > self.max_timestamp {
                self.max_timestamp = batch.info.max_timestamp;
                self.offset_of_max_timestamp = batch.info.base_offset;
            }
        }
    }

    /// Rebuilds this segment's state from its `.log`, cutting the file after
    /// the last good batch. Returns the number of bytes cut.
    pub fn recover(&mut self) -> Result<u64> {
        self.offset_index.truncate_to(self.base_offset)?;
        self.time_index.truncate_to(self.base_offset)?;
        self.next_offset = self.base_offset;
        self.max_timestamp = -1;
        self.offset_of_max_timestamp = self.base_offset;
        self.bytes_since_last_index_entry = 0;
        let file_len = self.log_file.metadata()?.len();
        // A second handle, so the scan can read while the indexes are rebuilt.
        let mut reader = BufReader::with_capacity(RECOVERY_CHUNK_BYTES, self.log_file.try_clone()?);
        let mut position = 0u64;
        let mut stop_reason = None;
        while position < file_len {
            match scan_batch(&mut reader, position, file_len)? {
                Err(reason) => {
                    stop_reason = Some(reason);
                    break;
                }
                Ok(info)
                    if info.base_offset < self.next_offset
                        || info.last_offset - self.base_offset > i64::from(u32::MAX) =>
                {
                    stop_reason = Some(format!(
                        "batch offsets {}..={} do not follow {} in segment {}",
                        info.base_offset, info.last_offset, self.next_offset, self.base_offset
                    ));
                    break;
                }
                Ok(info) => {
                    self.note_batch(&info, position)?;
                    position += info.size_bytes;
                }
            }
        }
        drop(reader);
        self.size_bytes = position;
        let cut_bytes = file_len - position;
        if cut_bytes > 0 {
            warn!(
                segment = %self.log_path.display(), valid_bytes = position, cut_bytes,
                reason = stop_reason.as_deref().unwrap_or("unknown"),
                "truncating torn or corrupt tail of log segment"
            );
            self.log_file.set_len(position)?;
            self.log_file.sync_all()?;
        }
        Ok(cut_bytes)
    }

    /// Index bookkeeping for a batch just written at `position` (Kafka's
    /// rule: an entry once more than `index_interval_bytes` were appended
    /// since the last one). Full indexes are left alone; the owner rolls.
    fn note_batch(&mut self, info: &BatchInfo, position: u64) -> Result<()> {
        if info.max_timestamp > self.max_timestamp {
            self.max_timestamp = info.max_timestamp;
            self.offset_of_max_timestamp = info.base_offset;
        }
        if self.bytes_since_last_index_entry > self.index_interval_bytes && !self.offset_index.is_full() {
            let position = u32::try_from(position)
                .map_err(|_| LogError::InvalidIndexAppend(format!("position {position} exceeds 32 bits")))?;
            self.offset_index.append(info.base_offset, position)?;
            if self.max_timestamp >= 0 && !self.time_index.is_full() {
                self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)?;
            }
            self.bytes_since_last_index_entry = 0;
        }
        self.bytes_since_last_index_entry += info.size_bytes;
        self.next_offset = info.last_offset + 1;
        Ok(())
    }

    /// Appends one validated batch, written as `head` (the first bytes with
    /// the offsets the log assigned, or empty) and then the rest of `batch`
    /// as received, in one vectored write: the record set is not copied.
    pub fn append(&mut self, head: &[u8], batch: &[u8], info: &BatchInfo) -> Result<()> {
        assert!(info.base_offset >= self.next_offset, "offsets only grow within a segment");
        write_batch(&self.log_file, self.size_bytes, head, batch, info)?;
        self.note_written(info)
    }

    /// Records a batch that [`write_batch`] wrote at the end of this
    /// segment's file (made without the segment borrowed).
    pub fn note_written(&mut self, info: &BatchInfo) -> Result<()> {
        assert!(info.base_offset >= self.next_offset, "offsets only grow within a segment");
        let position = self.size_bytes;
        self.size_bytes += info.size_bytes;
        self.note_batch(info, position)
    }

    /// The file position of the offset index's entry at or before
    /// `offset` (where a read of `offset` starts scanning; in memory).
    pub fn position_at_or_before(&self, offset: i64) -> u64 {
        u64::from(self.offset_index.lookup(offset).position)
    }

    /// The first batch whose last offset is >= `offset`, found through the
    /// offset index and then a scan of batch headers.
    pub fn translate_offset(&self, offset: i64) -> Result<Option<BatchAt>> {
        let start = u64::from(self.offset_index.lookup(offset).position);
        let mut position = start;
        while position < self.size_bytes {
            let info = read_batch_info(&self.log_file, position, self.size_bytes)?;
            if info.last_offset >= offset {
                return Ok(Some(BatchAt { position, info }));
            }
            position += info.size_bytes;
        }
        Ok(None)
    }

    /// Whole batches starting with the one holding `start_offset`, up to
    /// `max_bytes` (the first batch is returned even if larger when
    /// `min_one_batch`), stopping before any batch whose base offset is >=
    /// `max_offset`. `None` when this segment holds nothing at or after
    /// `start_offset`.
    pub fn read(
        &self,
        start_offset: i64,
        max_bytes: usize,
        max_offset: i64,
        min_one_batch: bool,
    ) -> Result<Option<Vec<u8>>> {
        let Some(first) = self.translate_offset(start_offset)? else {
            return Ok(None);
        };
        let max_bytes = max_bytes as u64;
        if first.info.base_offset >= max_offset || (first.info.size_bytes > max_bytes && !min_one_batch) {
            return Ok(Some(Vec::new()));
        }
        // One read of everything that may be returned, then the batch
        // boundaries are walked in memory (not one header read per batch).
        let available = self.size_bytes - first.position;
        let want = available.min(max_bytes.max(first.info.size_bytes));
        let mut bytes = read_range(&self.log_file, first.position, want)?;
        let mut total = first.info.size_bytes;
        while total + HEADER_BYTES as u64 <= want {
            let header = BatchHeader::parse(&bytes[total as usize..])?;
            let info = BatchInfo::from_header(&header);
            if info.base_offset >= max_offset || total + info.size_bytes > want {
                break;
            }
            total += info.size_bytes;
        }
        bytes.truncate(total as usize);
        Ok(Some(bytes))
    }

    /// Kafka's read: the file range from the batch holding `start_offset` up
    /// to `max_bytes` (raised to the first batch's size when
    /// `min_one_batch`, else nothing if the first batch is larger), ending
    /// before the first batch whose base offset is >= `max_offset`. Where
    /// `max_bytes` cuts a batch, the range ends at the batch boundary before
    /// it (Kafka sends the partial batch; clients drop it and fetch it again).
    /// Costs index lookups and short header scans (within one index
    /// interval), never a read of the records. `None` when this segment holds
    /// nothing at or after `start_offset`.
    pub fn slice(
        &self,
        start_offset: i64,
        max_bytes: usize,
        max_offset: i64,
        min_one_batch: bool,
    ) -> Result<Option<FileSlice>> {
        let Some(first) = self.translate_offset(start_offset)? else {
            return Ok(None);
        };
        let empty = || Ok(Some(FileSlice::new(self.log_file.clone(), first.position, 0)));
        let max_bytes = max_bytes as u64;
        if first.info.base_offset >= max_offset || (first.info.size_bytes > max_bytes && !min_one_batch) {
            return empty();
        }
        let end = if max_offset >= self.next_offset {
            self.size_bytes
        } else {
            match self.translate_offset(max_offset)? {
                Some(at) if at.info.base_offset >= max_offset => at.position,
                Some(at) => at.position + at.info.size_bytes,
                None => self.size_bytes,
            }
        };
        let limit = first.position + max_bytes.max(first.info.size_bytes);
        let end = if limit < end { self.batch_boundary_at_or_before(limit, first.position)? } else { end };
        Ok(Some(FileSlice::new(self.log_file.clone(), first.position, end - first.position)))
    }

    /// The last batch boundary at or before `position`, and not before
    /// `floor` (itself a boundary, followed by a batch that ends by `position`).
    fn batch_boundary_at_or_before(&self, position: u64, floor: u64) -> Result<u64> {
        let mut at = u64::from(self.offset_index.lookup_position(position).position).max(floor);
        while at + HEADER_BYTES as u64 <= position {
            let info = read_batch_info(&self.log_file, at, self.size_bytes)?;
            if at + info.size_bytes > position {
                break;
            }
            at += info.size_bytes;
        }
        Ok(at)
    }

    /// The first batch whose max timestamp is >= `target`.
    pub fn find_batch_by_timestamp(&self, target: i64) -> Result<Option<BatchInfo>> {
        if self.max_timestamp < target {
            return Ok(None);
        }
        let scan_from = self.time_index.scan_start_offset(target);
        let Some(start) = self.translate_offset(scan_from)? else {
            return Ok(None);
        };
        let mut position = start.position;
        while position < self.size_bytes {
            let info = read_batch_info(&self.log_file, position, self.size_bytes)?;
            if info.max_timestamp >= target {
                return Ok(Some(info));
            }
            position += info.size_bytes;
        }
        Ok(None)
    }

    /// The batch holding this segment's largest timestamp among the batches
    /// whose base offset is below `max_offset` (ListOffsets MAX_TIMESTAMP,
    /// KIP-734): its max timestamp and base offset, the earliest batch on a
    /// tie. Scans the batch headers only when the tracked maximum lies at or
    /// past `max_offset` (not yet below the high watermark).
    pub fn max_timestamp_batch(&self, max_offset: i64) -> Result<Option<TimestampAt>> {
        if self.base_offset >= max_offset || self.max_timestamp < 0 {
            return Ok(None);
        }
        if self.offset_of_max_timestamp < max_offset {
            return Ok(Some(TimestampAt { timestamp: self.max_timestamp, base_offset: self.offset_of_max_timestamp }));
        }
        let mut best: Option<TimestampAt> = None;
        let mut position = 0;
        while position < self.size_bytes {
            let info = read_batch_info(&self.log_file, position, self.size_bytes)?;
            if info.base_offset >= max_offset {
                break;
            }
            if best.is_none_or(|b| info.max_timestamp > b.timestamp) {
                best = Some(TimestampAt { timestamp: info.max_timestamp, base_offset: info.base_offset });
            }
            position += info.size_bytes;
        }
        Ok(best.filter(|b| b.timestamp >= 0))
    }

    /// Removes the batch holding `offset` and everything after it; the
    /// segment then ends at that batch's base offset. Returns bytes removed.
    pub fn truncate_to(&mut self, offset: i64) -> Result<u64> {
        let Some(cut) = self.translate_offset(offset)? else {
            return Ok(0);
        };
        let removed = self.size_bytes - cut.position;
        self.offset_index.truncate_to(cut.info.base_offset)?;
        self.time_index.truncate_to(cut.info.base_offset)?;
        self.log_file.set_len(cut.position)?;
        self.size_bytes = cut.position;
        // Rebuild the in-memory tail state from the last index entry on.
        let tail_from = self.offset_index.last_entry().map_or(0, |entry| u64::from(entry.position));
        let tail = walk_batches(&self.log_file, tail_from, self.size_bytes)?;
        self.next_offset = tail.last().map_or(self.base_offset, |batch| batch.info.last_offset + 1);
        self.max_timestamp = -1;
        self.offset_of_max_timestamp = self.base_offset;
        self.absorb_tail_timestamps(&tail);
        self.bytes_since_last_index_entry = self.size_bytes - tail_from;
        Ok(removed)
    }

    /// Called when a newer segment takes over: records the largest
    /// timestamp in the time index (so a restart finds it) and fsyncs.
    pub fn on_become_inactive(&mut self) -> Result<()> {
        for index in self.seal()? {
            index.sync_data()?;
        }
        self.log_file.sync_data()?;
        Ok(())
    }

    /// `on_become_inactive` without its fsyncs: the index files written
    /// behind are returned, to be fsynced with the `.log` off the owner's lock.
    pub fn seal(&mut self) -> Result<Vec<File>> {
        if self.max_timestamp >= 0 {
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)?;
        }
        self.write_behind_indexes()
    }

    /// Writes both index files behind their in-memory entries, without
    /// fsync; the files written, to fsync.
    pub fn write_behind_indexes(&self) -> Result<Vec<File>> {
        Ok([self.offset_index.write_behind()?, self.time_index.write_behind()?].into_iter().flatten().collect())
    }

    /// The `.log` file, for an fdatasync made without holding the log (group
    /// commit, see `PartitionLog::flush_ticket`).
    pub fn log_file(&self) -> &Arc<File> {
        &self.log_file
    }

    /// fsyncs the `.log` and both indexes.
    pub fn flush(&self) -> Result<()> {
        self.log_file.sync_data()?;
        self.offset_index.flush()?;
        self.time_index.flush()?;
        Ok(())
    }

    /// Deletes the segment's three files.
    pub fn delete(self) -> Result<()> {
        let index_path = self.offset_index.path().to_path_buf();
        let time_index_path = index_path.with_extension(&TIME_INDEX_SUFFIX[1..]);
        for path in [&self.log_path, &index_path, &time_index_path] {
            match fs::remove_file(path) {
                Err(err) if err.kind() != ErrorKind::NotFound => return Err(err.into()),
                _ => {}
            }
        }
        Ok(())
    }

    pub fn base_offset(&self) -> i64 {
        self.base_offset
    }
    pub fn next_offset(&self) -> i64 {
        self.next_offset
    }
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    pub fn is_empty(&self) -> bool {
        self.size_bytes == 0
    }
    pub fn created_ms(&self) -> i64 {
        self.created_ms
    }
    /// The largest batch timestamp, or the creation time when no batch has
    /// one (Kafka falls back to the file's modification time).
    pub fn largest_timestamp(&self) -> i64 {
        if self.max_timestamp >= 0 {
            self.max_timestamp
        } else {
            self.created_ms
        }
    }
    pub fn indexes_full(&self) -> bool {
        self.offset_index.is_full() || self.time_index.is_full()
    }
    pub fn offset_index(&self) -> &OffsetIndex {
        &self.offset_index
    }
    pub fn time_index(&self) -> &TimeIndex {
        &self.time_index
    }
    pub fn segment_index_bytes(&self) -> u64 {
        self.segment_index_bytes
    }
}

/// Reads `len` bytes at `position` without zeroing the buffer first (reads
/// go through `read_to_end`, which fills spare capacity). The file's cursor
/// is moved; appends use positional writes, so it is never relied on.
/// Writes one batch at `position` of `file`: `head` (the first bytes with the
/// offsets the log assigned, or empty) and then the rest of `batch` as
/// received, in one vectored write, so the record set is not copied. Needs
/// no borrow of the segment: appends write with only the partition's writer
/// lock held, and record the batch after ([`LogSegment::note_written`]).
pub fn write_batch(file: &File, position: u64, head: &[u8], batch: &[u8], info: &BatchInfo) -> Result<()> {
    assert_eq!(batch.len() as u64, info.size_bytes, "batch bytes and header disagree");
    assert!(head.len() <= batch.len(), "a batch's head is part of it");
    let mut parts = [std::io::IoSlice::new(head), std::io::IoSlice::new(&batch[head.len()..])];
    let mut parts = &mut parts[..];
    let mut at = position;
    while !parts.is_empty() {
        match rustix::io::pwritev(file, parts, at) {
            Ok(0) => return Err(LogError::Io(ErrorKind::WriteZero.into())),
            Ok(n) => {
                at += n as u64;
                std::io::IoSlice::advance_slices(&mut parts, n);
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(LogError::Io(e.into())),
        }
    }
    Ok(())
}

fn read_range(file: &File, position: u64, len: u64) -> Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut bytes = Vec::with_capacity(len as usize);
    let mut reader = file;
    reader.seek(SeekFrom::Start(position))?;
    reader.take(len).read_to_end(&mut bytes)?;
    if (bytes.len() as u64) < len {
        return Err(LogError::Io(std::io::ErrorKind::UnexpectedEof.into()));
    }
    Ok(bytes)
}

/// Reads and parses the batch header at `position` (no CRC check: batches
/// in a recovered segment were already validated).
fn read_batch_info(file: &File, position: u64, size_bytes: u64) -> Result<BatchInfo> {
    let mut header = [0u8; HEADER_BYTES];
    file.read_exact_at(&mut header, position)?;
    let info = BatchInfo::from_header(&BatchHeader::parse(&header)?);
    if position + info.size_bytes > size_bytes {
        return Err(LogError::CorruptBatch(BatchError::BadLength {
            batch_length: (info.size_bytes - LOG_OVERHEAD as u64) as i32,
            available: (size_bytes.saturating_sub(position) as usize).saturating_sub(LOG_OVERHEAD),
        }));
    }
    Ok(info)
}

/// Header-walks batches from `from` to `to`; fails on any bad header.
fn walk_batches(file: &File, from: u64, to: u64) -> Result<Vec<BatchAt>> {
    let mut batches = Vec::new();
    let mut position = from;
    while position < to {
        let info = read_batch_info(file, position, to)?;
        batches.push(BatchAt { position, info });
        position += info.size_bytes;
    }
    Ok(batches)
}

fn tail_ends_at(tail: &[BatchAt], from: u64, end: u64) -> bool {
    tail.last().map_or(from == end, |batch| batch.position + batch.info.size_bytes == end)
}

/// Reads one batch at `position` from a sequential reader and checks it
/// fully, streaming the CRC-32C in bounded chunks. The outer error is I/O;
/// the inner error says why the bytes are not a good batch (a torn write or
/// corruption), which recovery treats as the end of the valid log.
fn scan_batch(reader: &mut impl Read, position: u64, file_len: u64) -> Result<std::result::Result<BatchInfo, String>> {
    let mut header = [0u8; HEADER_BYTES];
    match reader.read_exact(&mut header) {
        Ok(()) => {}
        Err(err) if err.kind() == ErrorKind::UnexpectedEof => {
            return Ok(Err(format!("partial batch header at {position}")))
        }
        Err(err) => return Err(err.into()),
    }
    let parsed = match BatchHeader::parse(&header) {
        Ok(parsed) => parsed,
        Err(err) => return Ok(Err(format!("bad batch header at {position}: {err}"))),
    };
    let info = BatchInfo::from_header(&parsed);
    if position + info.size_bytes > file_len {
        return Ok(Err(format!("batch at {position} of {} bytes is cut off by the file end", info.size_bytes)));
    }
    let mut crc = crc32c::crc32c(&header[CRC_COVERED_FROM..]);
    let mut remaining = info.size_bytes - HEADER_BYTES as u64;
    let mut chunk = vec![0u8; RECOVERY_CHUNK_BYTES.min(remaining as usize)];
    while remaining > 0 {
        let take = RECOVERY_CHUNK_BYTES.min(remaining as usize);
        reader.read_exact(&mut chunk[..take])?;
        crc = crc32c::crc32c_append(crc, &chunk[..take]);
        remaining -= take as u64;
    }
    if crc != parsed.crc() {
        return Ok(Err(format!("CRC-32C mismatch in batch at {position}")));
    }
    Ok(Ok(info))
}
