//! The Raft log and vote, stored in sled.
//!
//! Tree `log`: big-endian log index → encoded entry, so key order is log
//! order. Tree `store`: the vote, the committed log id and the last purged
//! log id. Every write that openraft must see as durable (vote, appended
//! entries) is flushed and fsynced ([`crate::durable`]) before it is reported;
//! stored bytes that fail to decode are a storage error, never "nothing there".

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{AnyError, LogState, OptionalSend, RaftLogId, RaftLogReader, StorageIOError};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::codec;
use crate::durable::Durable;
use crate::types::{Entry, LogId, StorageError, TypeConfig, Vote};

const KEY_VOTE: &[u8] = b"vote";
const KEY_COMMITTED: &[u8] = b"committed";
const KEY_LAST_PURGED: &[u8] = b"last_purged";

/// Cheap to clone: clones share the same sled trees.
#[derive(Clone)]
pub struct LogStore {
    db: sled::Db,
    durable: Durable,
    log: sled::Tree,
    store: sled::Tree,
}

fn read_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::read_logs(AnyError::new(&e)).into()
}

fn write_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::write_logs(AnyError::new(&e)).into()
}

impl LogStore {
    pub fn open(db: &sled::Db, durable: Durable) -> Result<Self, sled::Error> {
        Ok(Self { db: db.clone(), durable, log: db.open_tree("log")?, store: db.open_tree("store")? })
    }

    fn get_meta<T: DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>, StorageError> {
        match self.store.get(key).map_err(read_err)? {
            None => Ok(None),
            Some(bytes) => Ok(Some(codec::decode(&bytes).map_err(read_err)?)),
        }
    }

    fn put_meta<T: Serialize>(&self, key: &[u8], value: &T) -> Result<(), StorageError> {
        let bytes = codec::encode(value).map_err(write_err)?;
        self.store.insert(key, bytes).map_err(write_err)?;
        Ok(())
    }

    fn last_entry_log_id(&self) -> Result<Option<LogId>, StorageError> {
        match self.log.last().map_err(read_err)? {
            None => Ok(None),
            Some((_, bytes)) => {
                let entry: Entry = codec::decode(&bytes).map_err(read_err)?;
                Ok(Some(*entry.get_log_id()))
            }
        }
    }
}

fn bound_key(b: Bound<&u64>) -> Bound<[u8; 8]> {
    match b {
        Bound::Included(i) => Bound::Included(i.to_be_bytes()),
        Bound::Excluded(i) => Bound::Excluded(i.to_be_bytes()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let range = (bound_key(range.start_bound()), bound_key(range.end_bound()));
        let mut entries = Vec::new();
        for item in self.log.range(range) {
            let (_, bytes) = item.map_err(read_err)?;
            entries.push(codec::decode(&bytes).map_err(read_err)?);
        }
        Ok(entries)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id: Option<LogId> = self.get_meta(KEY_LAST_PURGED)?;
        let last_log_id = self.last_entry_log_id()?.or(last_purged_log_id);
        Ok(LogState { last_purged_log_id, last_log_id })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let bytes = codec::encode(vote).map_err(|e| StorageIOError::write_vote(AnyError::new(&e)))?;
        self.store.insert(KEY_VOTE, bytes).map_err(|e| StorageIOError::write_vote(AnyError::new(&e)))?;
        self.durable.flush(&self.db).await.map_err(|e| StorageIOError::write_vote(AnyError::new(&e)))?;
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        self.get_meta(KEY_VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        // Not flushed here: a lost committed id is recomputed from the quorum.
        self.put_meta(KEY_COMMITTED, &committed)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.get_meta::<Option<LogId>>(KEY_COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = sled::Batch::default();
        for entry in entries {
            let bytes = codec::encode(&entry).map_err(write_err)?;
            batch.insert(&entry.get_log_id().index.to_be_bytes(), bytes);
        }
        self.log.apply_batch(batch).map_err(write_err)?;
        // Acknowledged means durable: report only after the flush.
        let flushed = self.durable.flush(&self.db).await;
        callback.log_io_completed(flushed);
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let mut batch = sled::Batch::default();
        for item in self.log.range(log_id.index.to_be_bytes()..) {
            let (key, _) = item.map_err(write_err)?;
            batch.remove(key);
        }
        self.log.apply_batch(batch).map_err(write_err)?;
        self.durable.flush(&self.db).await.map_err(write_err)?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        // Record the purge point first so a crash midway never shows a gap.
        self.put_meta(KEY_LAST_PURGED, &log_id)?;
        self.durable.flush(&self.db).await.map_err(write_err)?;
        let mut batch = sled::Batch::default();
        for item in self.log.range(..=log_id.index.to_be_bytes()) {
            let (key, _) = item.map_err(write_err)?;
            batch.remove(key);
        }
        self.log.apply_batch(batch).map_err(write_err)?;
        Ok(())
    }
}
