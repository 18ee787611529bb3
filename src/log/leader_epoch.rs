//! The leader epoch cache of one partition and its `leader-epoch-checkpoint`
//! file, Kafka's `LeaderEpochFileCache` (KIP-101, KIP-279).
//!
//! On-disk contract: Kafka's text checkpoint format — a version line `0`, a
//! count line, then one `<epoch> <start offset>` line per entry, epochs and
//! start offsets strictly increasing. The file is replaced atomically on
//! every change. Entries are added when a batch with a new epoch is appended
//! and trimmed whenever the log is truncated at either end, so the file
//! always describes the log beside it. `end_offset_for` answers
//! OffsetsForLeaderEpoch, which followers use to find where they diverge.

use std::path::{Path, PathBuf};

use tracing::warn;

use super::checkpoint::{parse_lines, render_lines, write_atomic};
use super::{LogError, Result};

/// The checkpoint file's name inside the partition directory.
pub const LEADER_EPOCH_CHECKPOINT_FILE: &str = "leader-epoch-checkpoint";

/// The first offset written under a leader epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochEntry {
    pub epoch: i32,
    pub start_offset: i64,
}

/// An OffsetsForLeaderEpoch answer: the largest epoch <= the requested one
/// that this log knows, and the offset where it ended (exclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochEndOffset {
    pub leader_epoch: i32,
    pub end_offset: i64,
}

#[derive(Debug)]
pub struct LeaderEpochCache {
    path: PathBuf,
    entries: Vec<EpochEntry>,
}

impl LeaderEpochCache {
    /// Reads `<dir>/leader-epoch-checkpoint`; a missing file means no
    /// entries. A file that does not parse, or is not strictly increasing,
    /// is an error.
    pub fn open(dir: &Path) -> Result<Self> {
        let path = dir.join(LEADER_EPOCH_CHECKPOINT_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Self { path, entries: Vec::new() }),
            Err(err) => return Err(err.into()),
        };
        let mut entries: Vec<EpochEntry> = Vec::new();
        for line in parse_lines(&path, &text)? {
            let corrupt = |reason: &str| LogError::CorruptCheckpoint {
                path: path.clone(),
                reason: format!("{reason}: {line:?}"),
            };
            let mut fields = line.split_whitespace();
            let epoch: i32 = fields.next().and_then(|f| f.parse().ok()).ok_or_else(|| corrupt("bad epoch"))?;
            let start_offset: i64 = fields.next().and_then(|f| f.parse().ok()).ok_or_else(|| corrupt("bad offset"))?;
            if fields.next().is_some() {
                return Err(corrupt("extra fields"));
            }
            if entries.last().is_some_and(|last| epoch <= last.epoch || start_offset <= last.start_offset) {
                return Err(corrupt("entries are not increasing"));
            }
            entries.push(EpochEntry { epoch, start_offset });
        }
        Ok(Self { path, entries })
    }

    pub fn entries(&self) -> &[EpochEntry] {
        &self.entries
    }

    pub fn latest_epoch(&self) -> Option<i32> {
        self.entries.last().map(|entry| entry.epoch)
    }

    fn persist(&self) -> Result<()> {
        let lines: Vec<String> =
            self.entries.iter().map(|entry| format!("{} {}", entry.epoch, entry.start_offset)).collect();
        write_atomic(&self.path, render_lines(&lines).as_bytes())
    }

    /// Records that `epoch` starts at `start_offset`, if that is news. As in
    /// Kafka, an entry that contradicts later ones (an older epoch, or an
    /// offset at or below a later entry's start) first removes them: the log
    /// itself was truncated there before this append.
    pub fn assign(&mut self, epoch: i32, start_offset: i64) -> Result<()> {
        if epoch < 0 {
            return Ok(()); // Batches never stamped by a leader carry -1.
        }
        if let Some(last) = self.entries.last() {
            if last.epoch == epoch && last.start_offset <= start_offset {
                return Ok(());
            }
        }
        let before = self.entries.len();
        self.entries.retain(|entry| entry.epoch < epoch && entry.start_offset < start_offset);
        if self.entries.len() != before {
            warn!(
                path = %self.path.display(), epoch, start_offset, removed = before - self.entries.len(),
                "leader epoch entry contradicts later entries; removing them"
            );
        }
        self.entries.push(EpochEntry { epoch, start_offset });
        self.persist()
    }

    /// The log was truncated to end at `end_offset` (exclusive): forget
    /// epochs that start at or after it.
    pub fn truncate_from_end(&mut self, end_offset: i64) -> Result<()> {
        let before = self.entries.len();
        self.entries.retain(|entry| entry.start_offset < end_offset);
        if self.entries.len() != before {
            self.persist()?;
        }
        Ok(())
    }

    /// The log now starts at `start_offset`: drop epochs wholly before it
    /// and move the start of the epoch containing it up to it.
    pub fn truncate_from_start(&mut self, start_offset: i64) -> Result<()> {
        let first_kept = self.entries.partition_point(|entry| entry.start_offset <= start_offset);
        if first_kept == 0 {
            return Ok(());
        }
        let containing = self.entries[first_kept - 1];
        if first_kept == 1 && containing.start_offset == start_offset {
            return Ok(());
        }
        self.entries.drain(..first_kept - 1);
        self.entries[0] = EpochEntry { epoch: containing.epoch, start_offset };
        self.persist()
    }

    /// Forgets every entry (the log was emptied).
    pub fn clear(&mut self) -> Result<()> {
        self.entries.clear();
        self.persist()
    }

    /// Kafka's `endOffsetFor`: for the latest epoch, the log end offset; for
    /// an older one, the start offset of the first later epoch, paired with
    /// the largest known epoch <= the requested one (the requested epoch
    /// itself when it predates every entry). `None` (UNDEFINED) for a
    /// negative epoch or one newer than any known.
    pub fn end_offset_for(&self, requested_epoch: i32, log_end_offset: i64) -> Option<EpochEndOffset> {
        if requested_epoch < 0 {
            return None;
        }
        if self.latest_epoch() == Some(requested_epoch) {
            return Some(EpochEndOffset { leader_epoch: requested_epoch, end_offset: log_end_offset });
        }
        let higher = self.entries.partition_point(|entry| entry.epoch <= requested_epoch);
        let next = self.entries.get(higher)?;
        let leader_epoch = match higher {
            0 => requested_epoch,
            n => self.entries[n - 1].epoch,
        };
        Some(EpochEndOffset { leader_epoch, end_offset: next.start_offset })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(epoch: i32, start_offset: i64) -> EpochEntry {
        EpochEntry { epoch, start_offset }
    }

    #[test]
    fn assigns_persists_and_reloads() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let mut cache = LeaderEpochCache::open(dir.path())?;
        cache.assign(0, 0)?;
        cache.assign(0, 5)?;
        cache.assign(2, 10)?;
        cache.assign(5, 30)?;
        assert_eq!(cache.entries(), &[entry(0, 0), entry(2, 10), entry(5, 30)]);
        let text = std::fs::read_to_string(dir.path().join(LEADER_EPOCH_CHECKPOINT_FILE))?;
        assert_eq!(text, "0\n3\n0 0\n2 10\n5 30\n");
        let reopened = LeaderEpochCache::open(dir.path())?;
        assert_eq!(reopened.entries(), cache.entries());
        Ok(())
    }

    #[test]
    fn end_offset_for_epoch_follows_kafka() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let mut cache = LeaderEpochCache::open(dir.path())?;
        assert_eq!(cache.end_offset_for(0, 0), None);
        cache.assign(1, 0)?;
        cache.assign(3, 10)?;
        cache.assign(4, 25)?;
        let answer = |epoch, end| Some(EpochEndOffset { leader_epoch: epoch, end_offset: end });
        assert_eq!(cache.end_offset_for(4, 40), answer(4, 40));
        assert_eq!(cache.end_offset_for(3, 40), answer(3, 25));
        assert_eq!(cache.end_offset_for(2, 40), answer(1, 10));
        assert_eq!(cache.end_offset_for(0, 40), answer(0, 0));
        assert_eq!(cache.end_offset_for(7, 40), None);
        assert_eq!(cache.end_offset_for(-1, 40), None);
        Ok(())
    }

    #[test]
    fn truncation_trims_entries() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let mut cache = LeaderEpochCache::open(dir.path())?;
        cache.assign(1, 0)?;
        cache.assign(2, 10)?;
        cache.assign(3, 20)?;
        cache.truncate_from_end(20)?;
        assert_eq!(cache.entries(), &[entry(1, 0), entry(2, 10)]);
        cache.truncate_from_start(12)?;
        assert_eq!(cache.entries(), &[entry(2, 12)]);
        // A follower append under an older epoch at a lower offset replaces
        // the contradicting entries.
        cache.assign(4, 15)?;
        cache.assign(3, 14)?;
        assert_eq!(cache.entries(), &[entry(2, 12), entry(3, 14)]);
        cache.clear()?;
        assert!(LeaderEpochCache::open(dir.path())?.entries().is_empty());
        Ok(())
    }

    #[test]
    fn corrupt_file_is_an_error() -> Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join(LEADER_EPOCH_CHECKPOINT_FILE), "0\n2\n3 10\n2 20\n")?;
        assert!(matches!(LeaderEpochCache::open(dir.path()), Err(LogError::CorruptCheckpoint { .. })));
        Ok(())
    }
}
