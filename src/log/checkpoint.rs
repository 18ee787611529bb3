//! Atomic checkpoint files: the write-tmp / fsync / rename / fsync-dir dance,
//! and Kafka's offset checkpoint format used per data dir for
//! `recovery-point-offset-checkpoint` and `replication-offset-checkpoint`
//! (high watermarks).
//!
//! On-disk contract (Kafka's `CheckpointFile`): a version line `0`, a count
//! line, then one `<topic> <partition> <offset>` line per entry. A reader
//! either sees the old file or the new one, never a mix. A file that does not
//! parse is an error, never "no entries": losing a recovery point silently
//! would skip recovery.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::{LogError, Result};

/// Version line of every checkpoint file Strom writes.
pub const CHECKPOINT_VERSION: u32 = 0;

/// Suffix of the temporary file a checkpoint is written to before renaming.
pub const TMP_SUFFIX: &str = ".tmp";

/// Replaces `path` with `contents` atomically and durably: write a sibling
/// temporary file, fsync it, rename it over `path`, fsync the directory.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<()> {
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(TMP_SUFFIX);
    let tmp_path = PathBuf::from(tmp_name);
    {
        let mut file = OpenOptions::new().write(true).create(true).truncate(true).open(&tmp_path)?;
        file.write_all(contents)?;
        file.sync_all()?;
    }
    fs::rename(&tmp_path, path)?;
    if let Some(dir) = path.parent() {
        sync_dir(dir)?;
    }
    Ok(())
}

/// fsyncs a directory so that creations, renames and deletions in it last.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)?.sync_all()?;
    Ok(())
}

/// Splits a checkpoint body into its entry lines after checking the version
/// and count lines. Shared by the offset and leader-epoch checkpoints.
pub(crate) fn parse_lines<'a>(path: &Path, text: &'a str) -> Result<Vec<&'a str>> {
    let corrupt = |reason: String| LogError::CorruptCheckpoint { path: path.to_path_buf(), reason };
    let mut lines = text.lines();
    let version = lines.next().ok_or_else(|| corrupt("missing version line".into()))?;
    if version.trim() != CHECKPOINT_VERSION.to_string() {
        return Err(corrupt(format!("unsupported version {version:?}")));
    }
    let count_line = lines.next().ok_or_else(|| corrupt("missing count line".into()))?;
    let count: usize = count_line.trim().parse().map_err(|_| corrupt(format!("bad count line {count_line:?}")))?;
    let entries: Vec<&str> = lines.filter(|line| !line.trim().is_empty()).collect();
    if entries.len() != count {
        return Err(corrupt(format!("count says {count} entries, found {}", entries.len())));
    }
    Ok(entries)
}

/// Renders a checkpoint body: version, count, then the given entry lines.
pub(crate) fn render_lines(entries: &[String]) -> String {
    let mut text = format!("{CHECKPOINT_VERSION}\n{}\n", entries.len());
    for entry in entries {
        text.push_str(entry);
        text.push('\n');
    }
    text
}

/// Kafka's per-data-dir `<topic> <partition> <offset>` checkpoint file.
#[derive(Debug, Clone)]
pub struct OffsetCheckpointFile {
    path: PathBuf,
    /// One write at a time (clones included): two would share the temporary file.
    writing: std::sync::Arc<std::sync::Mutex<()>>,
}

impl OffsetCheckpointFile {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into(), writing: Default::default() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads all entries; a missing file means no entries yet.
    pub fn read(&self) -> Result<BTreeMap<(String, i32), i64>> {
        let text = match fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
            Err(err) => return Err(err.into()),
        };
        let mut offsets = BTreeMap::new();
        for line in parse_lines(&self.path, &text)? {
            let corrupt =
                || LogError::CorruptCheckpoint { path: self.path.clone(), reason: format!("bad entry line {line:?}") };
            // Topic names cannot contain spaces (Kafka's legal characters are
            // [a-zA-Z0-9._-]), so splitting on whitespace is unambiguous.
            let mut fields = line.split_whitespace();
            let topic = fields.next().ok_or_else(corrupt)?;
            let partition: i32 = fields.next().and_then(|f| f.parse().ok()).ok_or_else(corrupt)?;
            let offset: i64 = fields.next().and_then(|f| f.parse().ok()).ok_or_else(corrupt)?;
            if fields.next().is_some() {
                return Err(corrupt());
            }
            offsets.insert((topic.to_string(), partition), offset);
        }
        Ok(offsets)
    }

    /// Replaces the file atomically with `offsets`.
    pub fn write(&self, offsets: &BTreeMap<(String, i32), i64>) -> Result<()> {
        let lines: Vec<String> =
            offsets.iter().map(|((topic, partition), offset)| format!("{topic} {partition} {offset}")).collect();
        let _one_at_a_time = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        write_atomic(&self.path, render_lines(&lines).as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_checkpoint_round_trip() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let file = OffsetCheckpointFile::new(dir.path().join("recovery-point-offset-checkpoint"));
        assert!(file.read()?.is_empty());
        let mut offsets = BTreeMap::new();
        offsets.insert(("orders".to_string(), 0), 42);
        offsets.insert(("orders".to_string(), 3), 7);
        file.write(&offsets)?;
        assert_eq!(file.read()?, offsets);
        let text = fs::read_to_string(file.path())?;
        assert_eq!(text, "0\n2\norders 0 42\norders 3 7\n");
        assert!(!dir.path().join("recovery-point-offset-checkpoint.tmp").exists());
        Ok(())
    }

    #[test]
    fn corrupt_checkpoint_is_an_error() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("cp");
        let file = OffsetCheckpointFile::new(&path);
        for body in ["", "1\n0\n", "0\n2\nt 0 1\n", "0\n1\nt x 1\n"] {
            fs::write(&path, body)?;
            assert!(matches!(file.read(), Err(LogError::CorruptCheckpoint { .. })), "{body:?}");
        }
        Ok(())
    }
}
