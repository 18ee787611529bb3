//! openraft's type configuration for the metadata quorum.

use std::io::Cursor;

use serde::{Deserialize, Serialize};

use crate::records::MetadataRecord;

/// Raft node ids; a node's broker id is the same number.
pub type NodeId = u64;

/// One entry of the metadata log: records applied together, atomically
/// (KRaft's atomic record batches), so that a controller decision is never
/// half-visible.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetaCommand {
    pub records: Vec<MetadataRecord>,
}

openraft::declare_raft_types!(
    /// The metadata quorum's openraft types.
    pub TypeConfig:
        D = MetaCommand,
        R = (),
        NodeId = NodeId,
        Node = openraft::BasicNode,
        SnapshotData = Cursor<Vec<u8>>,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type StorageError = openraft::StorageError<NodeId>;
pub type LogId = openraft::LogId<NodeId>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type StoredMembership = openraft::StoredMembership<NodeId, openraft::BasicNode>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, openraft::BasicNode>;
pub type Vote = openraft::Vote<NodeId>;
