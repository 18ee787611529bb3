//! The file behind an in-memory index (offset or time index). Entries live
//! in memory; the file is written behind them when the segment flushes,
//! through a descriptor opened for that write and closed after it. So a
//! segment holds one open file, its `.log`, however many partitions a node
//! has: with 10,000 partition replicas, three descriptors per segment would
//! pass the usual limit of open files.
//!
//! An index file is derived data. After a crash it may miss the entries
//! added since the last flush; loading checks what it holds and the segment
//! scans the log after its last entry, so a short index is only slower.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::Result;

#[derive(Debug)]
pub struct IndexFile {
    path: PathBuf,
    entry_bytes: usize,
    /// Entries written to the file (the first ones of the in-memory index).
    written: AtomicUsize,
}

impl IndexFile {
    /// Creates an empty file at `path`, replacing any there.
    pub fn create(path: &Path, entry_bytes: usize) -> Result<Self> {
        OpenOptions::new().write(true).create(true).truncate(true).open(path)?;
        Ok(Self { path: path.to_path_buf(), entry_bytes, written: AtomicUsize::new(0) })
    }

    /// A file that already holds `entries` entries (just loaded).
    pub fn existing(path: &Path, entry_bytes: usize, entries: usize) -> Self {
        Self { path: path.to_path_buf(), entry_bytes, written: AtomicUsize::new(entries) }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the entries the file lacks, without fsync. `encoded` holds
    /// every entry of the in-memory index, `entry_bytes` each. The file to
    /// fsync is returned (`None` when nothing was written), so the sync can
    /// be made without the segment's owner's lock.
    pub fn write_behind(&self, encoded: impl FnOnce(usize) -> Vec<u8>) -> Result<Option<std::fs::File>> {
        let written = self.written.load(Ordering::Acquire);
        let bytes = encoded(written);
        if bytes.is_empty() {
            return Ok(None);
        }
        let file = OpenOptions::new().write(true).open(&self.path)?;
        file.write_all_at(&bytes, (written * self.entry_bytes) as u64)?;
        self.written.store(written + bytes.len() / self.entry_bytes, Ordering::Release);
        Ok(Some(file))
    }

    /// The in-memory index kept its first `keep` entries: the file keeps no more.
    pub fn truncate(&self, keep: usize) -> Result<()> {
        if self.written.load(Ordering::Acquire) > keep {
            let file = OpenOptions::new().write(true).open(&self.path)?;
            file.set_len((keep * self.entry_bytes) as u64)?;
            self.written.store(keep, Ordering::Release);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_behind_and_truncates() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("0.index");
        let file = IndexFile::create(&path, 4)?;
        let entries: Vec<u32> = vec![1, 2, 3];
        let encode = |from: usize| entries[from..].iter().flat_map(|e| e.to_be_bytes()).collect::<Vec<u8>>();
        assert_eq!(std::fs::metadata(&path)?.len(), 0, "nothing written before a flush");
        file.write_behind(encode)?;
        assert_eq!(std::fs::read(&path)?, [0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3]);
        file.truncate(1)?;
        assert_eq!(std::fs::metadata(&path)?.len(), 4);
        let entries: Vec<u32> = vec![1, 9];
        file.write_behind(|from| entries[from..].iter().flat_map(|e| e.to_be_bytes()).collect())?;
        assert_eq!(std::fs::read(&path)?, [0, 0, 0, 1, 0, 0, 0, 9]);
        Ok(())
    }
}
