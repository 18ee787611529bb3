//! The sparse offset index of one segment (`<base offset>.index`), Kafka's
//! `OffsetIndex`.
//!
//! On-disk contract: a flat array of 8-byte entries, each a big-endian
//! relative offset u32 (batch base offset minus the segment base offset) and
//! the u32 file position of that batch in the `.log`. Entries are strictly
//! increasing in both fields; the file length is always entries × 8. The
//! segment adds an entry every `index_interval_bytes` of batches, so a lookup
//! gives a position from which a short scan finds any offset. The index is
//! kept in memory and written behind to the file when the segment flushes
//! (`IndexFile`); it is derived data, rebuilt from the `.log` whenever it is
//! in doubt.

use std::path::Path;

use super::index_file::IndexFile;
use super::{LogError, Result};

/// Bytes per index entry on disk.
pub const OFFSET_INDEX_ENTRY_BYTES: u64 = 8;

/// One index entry, with the offset made absolute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffsetPosition {
    pub offset: i64,
    pub position: u32,
}

#[derive(Debug)]
pub struct OffsetIndex {
    file: IndexFile,
    base_offset: i64,
    max_entries: usize,
    /// (relative offset, position), strictly increasing in both.
    entries: Vec<(u32, u32)>,
}

impl OffsetIndex {
    /// Creates an empty index, replacing whatever file was at `path`.
    pub fn create(path: &Path, base_offset: i64, max_index_bytes: u64) -> Result<Self> {
        let file = IndexFile::create(path, OFFSET_INDEX_ENTRY_BYTES as usize)?;
        Ok(Self {
            file,
            base_offset,
            max_entries: (max_index_bytes / OFFSET_INDEX_ENTRY_BYTES).max(1) as usize,
            entries: Vec::new(),
        })
    }

    /// Loads an existing index file. Returns `Ok(None)` when the file is
    /// missing or fails the sanity checks (partial entry, non-increasing
    /// entries, a position at or past `log_size_bytes`): the caller rebuilds.
    pub fn load(path: &Path, base_offset: i64, max_index_bytes: u64, log_size_bytes: u64) -> Result<Option<Self>> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(err.into()),
        };
        if !(bytes.len() as u64).is_multiple_of(OFFSET_INDEX_ENTRY_BYTES) {
            return Ok(None);
        }
        let mut entries = Vec::with_capacity(bytes.len() / OFFSET_INDEX_ENTRY_BYTES as usize);
        for chunk in bytes.chunks_exact(OFFSET_INDEX_ENTRY_BYTES as usize) {
            let relative = u32::from_be_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            let position = u32::from_be_bytes([chunk[4], chunk[5], chunk[6], chunk[7]]);
            let increasing = entries.last().is_none_or(|&(r, p)| relative > r && position > p);
            if !increasing || u64::from(position) >= log_size_bytes {
                return Ok(None);
            }
            entries.push((relative, position));
        }
        let file = IndexFile::existing(path, OFFSET_INDEX_ENTRY_BYTES as usize, entries.len());
        let max_entries = ((max_index_bytes / OFFSET_INDEX_ENTRY_BYTES).max(1) as usize).max(entries.len());
        Ok(Some(Self { file, base_offset, max_entries, entries }))
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn is_full(&self) -> bool {
        self.entries.len() >= self.max_entries
    }

    pub fn last_entry(&self) -> Option<OffsetPosition> {
        self.entries.last().map(|&entry| self.absolute(entry))
    }

    fn absolute(&self, (relative, position): (u32, u32)) -> OffsetPosition {
        OffsetPosition { offset: self.base_offset + i64::from(relative), position }
    }

    /// Appends an entry. Rejects offsets or positions that do not increase,
    /// offsets outside this segment's 32-bit range, and a full index.
    pub fn append(&mut self, offset: i64, position: u32) -> Result<()> {
        let relative = offset - self.base_offset;
        let relative = u32::try_from(relative).map_err(|_| {
            LogError::InvalidIndexAppend(format!(
                "offset {offset} is not within 2^32 of base offset {}",
                self.base_offset
            ))
        })?;
        if let Some(&(last_relative, last_position)) = self.entries.last() {
            if relative <= last_relative || position <= last_position {
                return Err(LogError::InvalidIndexAppend(format!(
                    "entry ({offset}, {position}) does not follow ({}, {last_position})",
                    self.base_offset + i64::from(last_relative)
                )));
            }
        }
        if self.is_full() {
            return Err(LogError::InvalidIndexAppend(format!("index {} is full", self.file.path().display())));
        }
        self.entries.push((relative, position));
        Ok(())
    }

    /// The greatest entry whose offset is <= `target`, or the segment start
    /// (base offset, position 0) when there is none.
    pub fn lookup(&self, target: i64) -> OffsetPosition {
        let below = self.entries.partition_point(|&entry| self.absolute(entry).offset <= target);
        match below {
            0 => OffsetPosition { offset: self.base_offset, position: 0 },
            n => self.absolute(self.entries[n - 1]),
        }
    }

    /// The greatest entry whose position is <= `max_position` (a batch
    /// boundary at or before it), or the segment start when there is none.
    pub fn lookup_position(&self, max_position: u64) -> OffsetPosition {
        let below = self.entries.partition_point(|&(_, position)| u64::from(position) <= max_position);
        match below {
            0 => OffsetPosition { offset: self.base_offset, position: 0 },
            n => self.absolute(self.entries[n - 1]),
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
                .flat_map(|(relative, position)| [relative.to_be_bytes(), position.to_be_bytes()])
                .flatten()
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_finds_greatest_entry_at_or_below() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let mut index = OffsetIndex::create(&dir.path().join("00000000000000000100.index"), 100, 1024)?;
        assert_eq!(index.lookup(150), OffsetPosition { offset: 100, position: 0 });
        index.append(110, 4096)?;
        index.append(130, 8192)?;
        index.append(160, 12288)?;
        assert_eq!(index.lookup(99), OffsetPosition { offset: 100, position: 0 });
        assert_eq!(index.lookup(109), OffsetPosition { offset: 100, position: 0 });
        assert_eq!(index.lookup(110), OffsetPosition { offset: 110, position: 4096 });
        assert_eq!(index.lookup(159), OffsetPosition { offset: 130, position: 8192 });
        assert_eq!(index.lookup(1_000), OffsetPosition { offset: 160, position: 12288 });
        Ok(())
    }

    #[test]
    fn rejects_non_increasing_appends() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let mut index = OffsetIndex::create(&dir.path().join("0.index"), 0, 16)?;
        index.append(5, 100)?;
        assert!(index.append(5, 200).is_err());
        assert!(index.append(4, 200).is_err());
        assert!(index.append(6, 100).is_err());
        index.append(6, 200)?;
        assert!(index.is_full());
        assert!(index.append(7, 300).is_err());
        Ok(())
    }

    #[test]
    fn truncates_and_reloads() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("0.index");
        let mut index = OffsetIndex::create(&path, 0, 1024)?;
        for i in 1..=5u32 {
            index.append(i64::from(i) * 10, i * 100)?;
        }
        index.flush()?;
        index.truncate_to(30)?;
        assert_eq!(index.len(), 2);
        assert_eq!(std::fs::metadata(&path)?.len(), 2 * OFFSET_INDEX_ENTRY_BYTES);
        let reloaded = OffsetIndex::load(&path, 0, 1024, 1_000)?.expect("sane index");
        assert_eq!(reloaded.last_entry(), Some(OffsetPosition { offset: 20, position: 200 }));
        // A position past the end of the log fails the sanity check.
        assert!(OffsetIndex::load(&path, 0, 1024, 150)?.is_none());
        std::fs::write(&path, [0u8; 5])?;
        assert!(OffsetIndex::load(&path, 0, 1024, 1_000)?.is_none());
        Ok(())
    }
}
