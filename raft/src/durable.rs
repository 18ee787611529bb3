//! Making sled's writes durable.
//!
//! sled 0.34's flush writes its log buffers and then calls `sync_file_range`
//! on Linux. That starts writeback and waits for it, but it neither flushes the
//! device's cache nor commits the file's metadata (its grown size), so a power
//! loss can still take what a flush returned for. sled fsyncs only from its
//! background flusher, every 500 ms. Large values go to files under `blobs/`,
//! which sled never syncs at all.
//!
//! openraft must not hear that a vote or an append is stored before it is: a
//! voter that forgets its vote can vote twice in a term, and one that forgets
//! acknowledged entries can let a majority lose committed ones. So every flush
//! that openraft relies on goes through [`Durable::flush`]: sled's flush, then
//! `fdatasync` of the `db` file, `fsync` of every blob file not synced yet, and
//! of the directories whose entries changed.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The files of one sled database, synced after its flushes.
#[derive(Debug, Clone)]
pub struct Durable(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    db_file: File,
    synced_blobs: Mutex<HashSet<OsString>>,
}

impl Durable {
    /// For the sled database opened at `dir`. Syncs what opening it created
    /// (its `conf` and `db` files and their directory entries).
    pub fn open(dir: &Path) -> io::Result<Self> {
        let db_file = File::open(dir.join("db"))?;
        for file in ["conf", "db"] {
            if let Ok(f) = File::open(dir.join(file)) {
                f.sync_all()?;
            }
        }
        sync_dir(dir)?;
        if let Some(parent) = dir.parent() {
            sync_dir(parent)?;
        }
        Ok(Self(Arc::new(Inner { dir: dir.to_path_buf(), db_file, synced_blobs: Mutex::new(HashSet::new()) })))
    }

    /// sled's flush, then the fsyncs it leaves out. Returns once everything
    /// written to `db` before the call is on stable storage.
    pub async fn flush(&self, db: &sled::Db) -> io::Result<()> {
        db.flush_async().await.map_err(io::Error::other)?;
        let inner = self.0.clone();
        tokio::task::spawn_blocking(move || inner.sync())
            .await
            .map_err(|e| io::Error::other(format!("sync task failed: {e}")))?
    }
}

impl Inner {
    fn sync(&self) -> io::Result<()> {
        self.db_file.sync_data()?;
        let blobs = self.dir.join("blobs");
        let entries = match std::fs::read_dir(&blobs) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut synced = self.synced_blobs.lock().unwrap_or_else(|e| e.into_inner());
        let mut present = HashSet::new();
        let mut new_files = false;
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name();
            if !synced.contains(&name) {
                match File::open(entry.path()) {
                    Ok(f) => f.sync_all()?,
                    // sled removed it meanwhile (a rewritten or deleted value).
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                }
                new_files = true;
            }
            present.insert(name);
        }
        // Names sled has deleted are forgotten; a deletion needs no sync to be safe.
        *synced = present;
        if new_files {
            sync_dir(&blobs)?;
        }
        Ok(())
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn flush_syncs_the_db_file_and_new_blobs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("open sled");
        let durable = Durable::open(dir.path()).expect("durable");
        // A value larger than sled's inline limit goes to a blob file.
        db.insert(b"big", vec![7u8; 1 << 20]).expect("insert");
        durable.flush(&db).await.expect("flush");
        let blobs: Vec<_> = std::fs::read_dir(dir.path().join("blobs")).expect("blobs").collect();
        assert!(!blobs.is_empty(), "the large value was not written as a blob");
        assert_eq!(durable.0.synced_blobs.lock().expect("lock").len(), blobs.len());
        db.insert(b"small", b"v".to_vec()).expect("insert");
        durable.flush(&db).await.expect("second flush");
    }
}
