//! Producer-state snapshots (Kafka's `<offset>.snapshot` files): the
//! producers a partition remembers and the aborted transactions of its log,
//! as they stood below an offset. Written when a segment rolls; opening a
//! partition loads the newest snapshot at or below its log end and reads
//! only the batches after it, instead of the whole log.
//!
//! Format: a version byte, the CRC-32C of the rest, then the state in
//! Strom's one encoding (`strom_raft::codec`). A snapshot that does not
//! read back is skipped (with a log line) for an older one, or a full scan.
//! Files are written by rename, without fsync (a snapshot lost or torn in a
//! crash only costs a longer scan: the CRC catches a torn one), under the
//! partition's writer lock, so no truncation runs meanwhile; those past the
//! log end (a truncation, or records lost in a crash before they were
//! fsynced) are deleted when found.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::producer_state::ProducerStateMap;
use crate::log::segment::{parse_segment_file_name, segment_file_name};
use crate::log::txn::AbortedTxn;

pub const SNAPSHOT_SUFFIX: &str = ".snapshot";
const VERSION: u8 = 1;

/// What a snapshot holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProducerSnapshot {
    pub producers: ProducerStateMap,
    pub aborted: Vec<AbortedTxn>,
}

fn path(dir: &Path, offset: i64) -> PathBuf {
    dir.join(segment_file_name(offset, SNAPSHOT_SUFFIX))
}

/// The offsets of the snapshots in `dir`, ascending.
fn offsets(dir: &Path) -> io::Result<Vec<i64>> {
    let mut out: Vec<i64> = fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter_map(|e| parse_segment_file_name(e.file_name().to_str()?, SNAPSHOT_SUFFIX))
        .collect();
    out.sort_unstable();
    Ok(out)
}

/// Encodes a snapshot (under the owner's lock: no I/O).
pub fn encode(snapshot: &ProducerSnapshot) -> Option<Vec<u8>> {
    let payload = strom_raft::codec::encode(snapshot).ok()?;
    let mut out = Vec::with_capacity(payload.len() + 5);
    out.push(VERSION);
    out.extend_from_slice(&crc32c::crc32c(&payload).to_be_bytes());
    out.extend_from_slice(&payload);
    Some(out)
}

fn decode(bytes: &[u8]) -> Result<ProducerSnapshot, String> {
    if bytes.len() < 5 || bytes[0] != VERSION {
        return Err(format!("not a version {VERSION} snapshot"));
    }
    let stored = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
    if crc32c::crc32c(&bytes[5..]) != stored {
        return Err("CRC-32C mismatch".to_string());
    }
    strom_raft::codec::decode(&bytes[5..]).map_err(|e| e.to_string())
}

/// Writes an encoded snapshot of the state below `offset` (a temporary
/// file renamed into place; a leftover one is removed when the log opens).
pub fn write(dir: &Path, offset: i64, encoded: &[u8]) -> io::Result<()> {
    let target = path(dir, offset);
    let mut tmp = target.clone().into_os_string();
    tmp.push(crate::log::checkpoint::TMP_SUFFIX);
    fs::write(&tmp, encoded)?;
    fs::rename(&tmp, &target)
}

/// The newest snapshot at or below `log_end` that reads back, with its
/// offset; snapshots past `log_end` are deleted.
pub fn load_latest(dir: &Path, log_end: i64) -> Option<(i64, ProducerSnapshot)> {
    let found = offsets(dir).ok()?;
    for &offset in found.iter().rev() {
        if offset > log_end {
            let _ = fs::remove_file(path(dir, offset));
            continue;
        }
        match fs::read(path(dir, offset)).map_err(|e| e.to_string()).and_then(|b| decode(&b)) {
            Ok(snapshot) => return Some((offset, snapshot)),
            Err(e) => tracing::warn!(dir = %dir.display(), offset, error = %e,
                "unreadable producer snapshot skipped; producer state is rebuilt from the log"),
        }
    }
    None
}

/// Drops from every snapshot the aborted transactions `keep` refuses
/// (compaction removed their markers), rewriting only the snapshots that
/// change; an unreadable one is left to be skipped at the next start.
pub fn retain_aborted(dir: &Path, keep: impl Fn(&AbortedTxn) -> bool) -> io::Result<()> {
    for offset in offsets(dir)? {
        let Ok(mut snapshot) = fs::read(path(dir, offset)).map_err(|e| e.to_string()).and_then(|b| decode(&b)) else {
            continue;
        };
        let before = snapshot.aborted.len();
        snapshot.aborted.retain(&keep);
        if snapshot.aborted.len() != before {
            let encoded = encode(&snapshot).ok_or_else(|| io::Error::other("encoding a producer snapshot failed"))?;
            write(dir, offset, &encoded)?;
        }
    }
    Ok(())
}

/// Deletes the snapshots past `offset` (the log was truncated to it).
pub fn delete_after(dir: &Path, offset: i64) {
    for o in offsets(dir).unwrap_or_default().into_iter().filter(|o| *o > offset) {
        let _ = fs::remove_file(path(dir, o));
    }
}

/// Deletes the snapshots below `offset` (the log start) but the newest of them.
pub fn delete_before(dir: &Path, offset: i64) {
    let below: Vec<i64> = offsets(dir).unwrap_or_default().into_iter().filter(|o| *o < offset).collect();
    for o in below.iter().rev().skip(1) {
        let _ = fs::remove_file(path(dir, *o));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replication::producer_state::BatchMeta;

    fn snapshot(producer_id: i64) -> ProducerSnapshot {
        let mut producers = ProducerStateMap::default();
        let meta = BatchMeta { first_seq: 0, last_seq: 1, base_offset: 3, last_offset: 4, max_timestamp: 9 };
        producers.record(producer_id, 0, meta, true);
        let aborted = vec![AbortedTxn { producer_id: 1, first_offset: 0, last_offset: 2, last_stable_offset: 3 }];
        ProducerSnapshot { producers, aborted }
    }

    #[test]
    fn the_newest_readable_snapshot_at_or_below_the_end_is_loaded() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (offset, pid) in [(5, 1), (10, 2), (20, 3)] {
            write(dir.path(), offset, &encode(&snapshot(pid)).expect("encodes")).expect("writes");
        }
        // Corrupt the one at 10: the one at 5 is used instead; 20 is past the end and goes.
        let ten = path(dir.path(), 10);
        let mut bytes = fs::read(&ten).expect("reads");
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        fs::write(&ten, bytes).expect("writes");
        let (offset, mut loaded) = load_latest(dir.path(), 15).expect("a snapshot");
        assert_eq!(offset, 5);
        assert_eq!(loaded.producers.active()[0].producer_id, 1);
        assert_eq!(loaded.producers.first_unstable_offset(5), Some(3), "the open transaction came back");
        assert_eq!(loaded.aborted.len(), 1);
        assert!(!path(dir.path(), 20).exists());
        delete_after(dir.path(), 7);
        assert!(!ten.exists());
        write(dir.path(), 30, &encode(&snapshot(4)).expect("encodes")).expect("writes");
        write(dir.path(), 40, &encode(&snapshot(5)).expect("encodes")).expect("writes");
        delete_before(dir.path(), 35);
        assert_eq!(offsets(dir.path()).expect("lists"), vec![30, 40], "the newest below the start stays");
    }
}
