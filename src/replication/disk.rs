//! The log directory's free space, and the floor below which the broker
//! stops growing its logs (`storage.min.free.bytes`, Redpanda's idea; Kafka
//! has none and fails on ENOSPC wherever it happens).
//!
//! Below the floor, produce requests get KAFKA_STORAGE_ERROR and followers
//! stop fetching, so partition logs never fill the file system: the metadata
//! store, which writes little, keeps working, reads keep being served, and
//! writes resume on their own once retention or an operator frees space.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use crate::clock::mono_ms;

/// How long a reading of the free space is reused.
const RECHECK_MS: i64 = 100;

#[derive(Debug)]
pub struct DiskGuard {
    dir: PathBuf,
    min_free: u64,
    free: AtomicU64,
    checked_ms: AtomicI64,
    low: AtomicBool,
}

impl DiskGuard {
    pub fn new(dir: PathBuf, min_free: u64) -> Self {
        Self {
            dir,
            min_free,
            free: AtomicU64::new(u64::MAX),
            checked_ms: AtomicI64::new(i64::MIN),
            low: AtomicBool::new(false),
        }
    }

    /// Bytes free for this process in the log directory's file system (as of
    /// at most [`RECHECK_MS`] ago); `u64::MAX` when it cannot be read.
    pub fn free_bytes(&self) -> u64 {
        let now = mono_ms();
        if now.saturating_sub(self.checked_ms.load(Ordering::Acquire)) >= RECHECK_MS {
            let free = match nix::sys::statvfs::statvfs(&self.dir) {
                Ok(s) => s.blocks_available().saturating_mul(s.fragment_size()),
                Err(e) => {
                    tracing::debug!(dir = %self.dir.display(), error = %e, "cannot read the free space");
                    u64::MAX
                }
            };
            self.free.store(free, Ordering::Release);
            self.checked_ms.store(now, Ordering::Release);
        }
        self.free.load(Ordering::Acquire)
    }

    /// Whether logs may grow: at least `storage.min.free.bytes` are free.
    pub fn has_room(&self) -> bool {
        let free = self.free_bytes();
        let room = free >= self.min_free;
        if room == self.low.load(Ordering::Acquire) {
            self.low.store(!room, Ordering::Release);
            if room {
                tracing::info!(dir = %self.dir.display(), free, "free space is back above storage.min.free.bytes: taking writes");
            } else {
                tracing::warn!(dir = %self.dir.display(), free, min_free = self.min_free,
                    "free space below storage.min.free.bytes: refusing produce requests and pausing follower fetches until space is freed");
            }
        }
        room
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_floor_above_the_free_space_refuses_and_zero_allows() {
        let dir = tempfile::tempdir().expect("tempdir");
        let free = DiskGuard::new(dir.path().to_path_buf(), 0).free_bytes();
        assert!(free > 0 && free < u64::MAX, "{free}");
        assert!(DiskGuard::new(dir.path().to_path_buf(), 0).has_room());
        assert!(!DiskGuard::new(dir.path().to_path_buf(), u64::MAX - 1).has_room());
    }
}
