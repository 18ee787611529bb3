//! The metadata state machine: the applied [`MetadataImage`], stored in sled.
//!
//! Tree `sm` holds the last applied state (log id, membership, image) and the
//! current snapshot. Applying publishes the new image on a watch channel, so
//! the rest of the node reacts to committed changes without polling. A
//! snapshot is the serialized image with its snapshot metadata.

use std::io::Cursor;
use std::sync::Arc;

use openraft::storage::RaftStateMachine;
use openraft::{AnyError, EntryPayload, OptionalSend, RaftSnapshotBuilder, Snapshot, StorageIOError};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::codec;
use crate::durable::Durable;
use crate::image::MetadataImage;
use crate::types::{Entry, LogId, SnapshotMeta, StorageError, StoredMembership, TypeConfig};

const KEY_STATE: &[u8] = b"state";
const KEY_SNAPSHOT: &[u8] = b"snapshot";

/// What the state machine persists after each applied batch.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct AppliedState {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    image: MetadataImage,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta,
    data: Vec<u8>,
}

/// The image as of an applied log index, as published to the node.
#[derive(Debug, Clone, Default)]
pub struct AppliedImage {
    pub applied_index: u64,
    pub image: Arc<MetadataImage>,
}

pub struct StateMachine {
    db: sled::Db,
    durable: Durable,
    tree: sled::Tree,
    state: AppliedState,
    snapshot_seq: u64,
    publish: watch::Sender<AppliedImage>,
}

fn sm_read_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::read_state_machine(AnyError::new(&e)).into()
}

fn sm_write_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::write_state_machine(AnyError::new(&e)).into()
}

fn snap_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::write_snapshot(None, AnyError::new(&e)).into()
}

impl StateMachine {
    /// Opens the state machine; a stored state that fails to decode is an
    /// error (a corrupt store must stop the node, not empty its metadata).
    pub fn open(db: &sled::Db, durable: Durable) -> Result<(Self, watch::Receiver<AppliedImage>), StorageError> {
        let tree = db.open_tree("sm").map_err(sm_read_err)?;
        let state: AppliedState = match tree.get(KEY_STATE).map_err(sm_read_err)? {
            Some(bytes) => codec::decode(&bytes).map_err(sm_read_err)?,
            None => AppliedState::default(),
        };
        let (publish, rx) = watch::channel(AppliedImage {
            applied_index: state.last_applied.map_or(0, |l| l.index),
            image: Arc::new(state.image.clone()),
        });
        Ok((Self { db: db.clone(), durable, tree, state, snapshot_seq: 0, publish }, rx))
    }

    fn persist(&self) -> Result<(), StorageError> {
        let bytes = codec::encode(&self.state).map_err(sm_write_err)?;
        self.tree.insert(KEY_STATE, bytes).map_err(sm_write_err)?;
        Ok(())
    }

    fn publish(&self) {
        self.publish.send_replace(AppliedImage {
            applied_index: self.state.last_applied.map_or(0, |l| l.index),
            image: Arc::new(self.state.image.clone()),
        });
    }
}

pub struct SnapshotBuilder {
    db: sled::Db,
    durable: Durable,
    tree: sled::Tree,
    state: AppliedState,
    snapshot_id: String,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let data = codec::encode(&self.state.image).map_err(snap_err)?;
        let meta = SnapshotMeta {
            last_log_id: self.state.last_applied,
            last_membership: self.state.membership.clone(),
            snapshot_id: self.snapshot_id.clone(),
        };
        let stored = StoredSnapshot { meta: meta.clone(), data: data.clone() };
        let bytes = codec::encode(&stored).map_err(snap_err)?;
        self.tree.insert(KEY_SNAPSHOT, bytes).map_err(snap_err)?;
        self.durable.flush(&self.db).await.map_err(snap_err)?;
        tracing::info!(last_log_id = ?meta.last_log_id, bytes = data.len(), "metadata snapshot built");
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(data)) })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        Ok((self.state.last_applied, self.state.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<()>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut responses = Vec::new();
        for entry in entries {
            self.state.last_applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(command) => {
                    for record in &command.records {
                        if let Err(e) = self.state.image.apply(record) {
                            tracing::warn!(index = entry.log_id.index, error = %e, "metadata record changed nothing");
                        }
                    }
                }
                EntryPayload::Membership(m) => {
                    self.state.membership = StoredMembership::new(Some(entry.log_id), m);
                }
            }
            responses.push(());
        }
        self.persist()?;
        self.publish();
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.snapshot_seq += 1;
        let last = self.state.last_applied.map_or(0, |l| l.index);
        SnapshotBuilder {
            db: self.db.clone(),
            durable: self.durable.clone(),
            tree: self.tree.clone(),
            state: self.state.clone(),
            snapshot_id: format!("{last}-{}", self.snapshot_seq),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        let image: MetadataImage = codec::decode(&data)
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), AnyError::new(&e)))?;
        self.state = AppliedState { last_applied: meta.last_log_id, membership: meta.last_membership.clone(), image };
        let stored = StoredSnapshot { meta: meta.clone(), data };
        self.tree.insert(KEY_SNAPSHOT, codec::encode(&stored).map_err(snap_err)?).map_err(snap_err)?;
        self.persist()?;
        self.durable.flush(&self.db).await.map_err(snap_err)?;
        tracing::info!(last_log_id = ?meta.last_log_id, "metadata snapshot installed");
        self.publish();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        match self.tree.get(KEY_SNAPSHOT).map_err(sm_read_err)? {
            None => Ok(None),
            Some(bytes) => {
                let stored: StoredSnapshot = codec::decode(&bytes).map_err(sm_read_err)?;
                Ok(Some(Snapshot { meta: stored.meta, snapshot: Box::new(Cursor::new(stored.data)) }))
            }
        }
    }
}
