//! The sparse time index of one segment (`<base offset>.timeindex`), Kafka's
//! `TimeIndex`.
//!
//! On-disk contract: a flat array of 12-byte entries, each a big-endian
//! timestamp i64 and relative offset u32. An entry (t, o) says: the batch at
//! offset o has max timestamp t, and no batch before the point where the
//! entry was written has a larger one. Timestamps never decrease; an entry
//! whose timestamp does not exceed the last is skipped. When a segment stops
//! being active its largest timestamp is appended, so the last entry gives
//! the segment's largest timestamp after a restart. Kept in memory, written
//! behind to the file when the segment flushes (`IndexFile`), rebuilt from
//! the `.log` whenever in doubt.

use std::path::Path;

use super::index_file::IndexFile;
use super::{LogError, Result};

/// Bytes per index entry on disk.
pub const TIME_INDEX_ENTRY_BYTES: u64 = 12;

/// One time index entry, with the offset made absolute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimestampEntry {
    pub timestamp: i64,
    pub offset: i64,
}

#[derive(Debug)]
pub struct TimeIndex {
    file: IndexFile,
    base_offset: i64,
    max_entries: usize,
    /// (timestamp, relative offset): timestamps strictly increasing,
    /// offsets non-decreasing.
    entries: Vec<(i64, u32)>,
}

impl TimeIndex {
    /// Creates an empty index, replacing whatever file was at `path`.
    pub fn create(path: &Path, base_offset: i64, max_index_bytes: u64) -> Result<Self> {
        let file = IndexFile::create(path, TIME_INDEX_ENTRY_BYTES as usize)?;
        Ok(Self {
            file,
            base_offset,
            max_entries: (max_index_bytes / TIME_INDEX_ENTRY_BYTES).max(2) as usize,
            entries: Vec::new(),
        })
    }

    /// Loads an existing index file; `Ok(None)` when missing or insane
    /// (partial entry, decreasing timestamps or offsets, offsets at or past
    /// `next_offset`), so the caller rebuilds.
    pub fn load(path: &Path, base_offset: i64, max_index_bytes: u64, next_offset: i64) -> Result<Option<Self>> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(err.into()),
        };
        if !(bytes.len() as u64).is_multiple_of(TIME_INDEX_ENTRY_BYTES) {
            return Ok(None);
        }
        let mut entries: Vec<(i64, u32)> = Vec::with_capacity(bytes.len() / TIME_INDEX_ENTRY_BYTES as usize);
        for chunk in bytes.chunks_exact(TIME_INDEX_ENTRY_BYTES as usize) {
            let mut raw_ts = [0u8; 8];
            raw_ts.copy_from_slice(&chunk[..8]);
            let timestamp = i64::from_be_bytes(raw_ts);
            let relative = u32::from_be_bytes([chunk[8], chunk[9], chunk[10], chunk[11]]);
            let ordered = entries.last().is_none_or(|&(t, r)| timestamp > t && relative >= r);
            if !ordered || base_offset + i64::from(relative) >= next_offset {
                return Ok(None);
            }
            entries.push((timestamp, relative));
        }
        let file = IndexFile::existing(path, TIME_INDEX_ENTRY_BYTES as usize, entries.len());
        let max_entries = ((max_index_bytes / TIME_INDEX_ENTRY_BYTES).max(2) as usize).max(entries.len());
        Ok(Some(Self { file, base_offset, max_entries, entries }))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Full for the purpose of rolling: the last slot is kept for the
    /// entry written when the segment becomes inactive.
    pub fn is_full(&self) -> bool {
        self.entries.len() + 1 >= self.max_entries
    }

    fn absolute(&self, (timestamp, relative): (i64, u32)) -> TimestampEntry {
        TimestampEntry { timestamp, offset: self.base_offset + i64::from(relative) }
    }

    pub fn last_entry(&self) -> Option<TimestampEntry> {
        self.entries.last().map(|&entry| self.absolute(entry))
    }

    /// Appends (timestamp, offset) if the timestamp exceeds the last entry's;
    /// an equal timestamp is skipped. A smaller timestamp or offset, an
    /// offset outside the segment's range, or a full index is rejected.
    /// Returns whether an entry was written.
    pub fn maybe_append(&mut self, timestamp: i64, offset: i64) -> Result<bool> {
        let relative = u32::try_from(offset - self.base_offset).map_err(|_| {
            LogError::InvalidIndexAppend(format!(
                "offset {offset} is not within 2^32 of base offset {}",
                self.base_offset
            ))
        })?;
        if let Some(&(last_timestamp, last_relative)) = self.entries.last() {
            if timestamp < last_timestamp || relative < last_relative {
                return Err(LogError::InvalidIndexAppend(format!(
                    "time entry ({timestamp}, {offset}) precedes ({last_timestamp}, {})",
                    self.base_offset + i64::from(last_relative)
                )));
            }
            if timestamp == last_timestamp {
                return Ok(false);
            }
        }
        if self.entries.len() >= self.max_entries {
            return Err(LogError::InvalidIndexAppend(format!("time index {} is full", self.file.path().display())));
        }
        self.entries.push((timestamp, relative));
        Ok(true)
    }

    /// The first entry whose timestamp is >= `target`: its offset is the
    /// earliest indexed batch at or after the target time.
    pub fn lookup(&self, target: i64) -> Option<TimestampEntry> {
        let index = self.entries.partition_point(|&(timestamp, _)| timestamp < target);
        self.entries.get(index).map(|&entry| self.absolute(entry))
    }

    /// Where a scan for the first batch with max timestamp >= `target` can
    /// safely start: the offset of the last entry with a smaller timestamp
    /// (every batch before it is older than `target`), else the base offset.
    pub fn scan_start_offset(&self, target: i64) -> i64 {
        let index = self.entries.partition_point(|&(timestamp, _)| timestamp < target);
        match index {
            0 => self.base_offset,
            n => self.absolute(self.entries[n - 1]).offset,
        }
    }

    /// Drops every entry whose offset is >= `offset`.
    pub fn truncate_to(&mut self, offset: i64) -> Result<()> {
        let keep = self.entries.partition_point(|&entry| self.absolute(entry).offset < offset);
        self.entries.truncate(keep);
        self.file.truncate(keep)
    }

    /// Writes the entries the file lacks, and fsyncs it.
    pub fn flush(&self) -> Result<()> {
        if let Some(file) = self.write_behind()? {
            file.sync_data()?;
        }
        Ok(())
    }

    /// Writes the entries the file lacks; the file to fsync, if any.
    pub fn write_behind(&self) -> Result<Option<std::fs::File>> {
        self.file.write_behind(|from| {
            self.entries
                .get(from..)
                .unwrap_or_default()
                .iter()
                .flat_map(|(timestamp, relative)| timestamp.to_be_bytes().into_iter().chain(relative.to_be_bytes()))
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_finds_first_entry_at_or_after() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let mut index = TimeIndex::create(&dir.path().join("0.timeindex"), 100, 1200)?;
        assert_eq!(index.lookup(5), None);
        assert!(index.maybe_append(1_000, 100)?);
        assert!(!index.maybe_append(1_000, 105)?, "equal timestamps are skipped");
        assert!(index.maybe_append(2_000, 110)?);
        assert!(index.maybe_append(3_000, 120)?);
        assert_eq!(index.lookup(0), Some(TimestampEntry { timestamp: 1_000, offset: 100 }));
        assert_eq!(index.lookup(1_500), Some(TimestampEntry { timestamp: 2_000, offset: 110 }));
        assert_eq!(index.lookup(2_000), Some(TimestampEntry { timestamp: 2_000, offset: 110 }));
        assert_eq!(index.lookup(3_001), None);
        assert_eq!(index.scan_start_offset(1_000), 100);
        assert_eq!(index.scan_start_offset(2_500), 110);
        assert!(index.maybe_append(2_500, 130).is_err(), "timestamps never decrease");
        assert!(index.maybe_append(4_000, 119).is_err(), "offsets never decrease");
        Ok(())
    }

    #[test]
    fn truncates_and_reloads() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("0.timeindex");
        let mut index = TimeIndex::create(&path, 0, 1200)?;
        for i in 1..=4 {
            index.maybe_append(i * 1_000, i * 10)?;
        }
        index.flush()?;
        index.truncate_to(30)?;
        assert_eq!(index.last_entry(), Some(TimestampEntry { timestamp: 2_000, offset: 20 }));
        let reloaded = TimeIndex::load(&path, 0, 1200, 25)?.expect("sane index");
        assert_eq!(reloaded.len(), 2);
        assert!(TimeIndex::load(&path, 0, 1200, 20)?.is_none(), "offset past next offset");
        Ok(())
    }
}
