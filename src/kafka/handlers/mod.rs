//! One file per Kafka API or small family of APIs. A handler takes the
//! decoded request and the node's services and returns the response.

pub mod acls;
pub mod cluster;
pub mod configs;
pub mod consumer_groups;
pub mod delete_records;
pub mod denied;
pub mod elections;
pub mod fetch;
pub mod groups;
pub mod list_offsets;
pub mod log_dirs;
pub mod metadata;
pub mod produce;
pub mod producers;
pub mod quorum;
pub mod quotas;
pub mod reassignments;
pub mod topic_partitions;
pub mod topics;
pub mod txn;
pub mod txn_markers;
pub mod users;

use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use strom_raft::TopicId;

use crate::error::ApiError;
use crate::log::validator::Violation;
use crate::log::LogError;
use crate::replication::producer_state::Refusal;
use crate::replication::PartitionError;

/// `host:port` → (host, port); a bad address gives port -1.
pub fn split_addr(addr: &str) -> (StrBytes, i32) {
    match addr.rsplit_once(':') {
        Some((host, port)) => (StrBytes::from_string(host.to_string()), port.parse().unwrap_or(-1)),
        None => (StrBytes::from_string(addr.to_string()), -1),
    }
}

pub fn topic_uuid(id: TopicId) -> uuid::Uuid {
    uuid::Uuid::from_u128(id.0)
}

pub fn str_bytes(s: impl Into<String>) -> StrBytes {
    StrBytes::from_string(s.into())
}

/// The code for a partition this broker does not host: NOT_LEADER_OR_FOLLOWER
/// when the partition exists (the client's metadata is stale), else
/// UNKNOWN_TOPIC_OR_PARTITION.
pub fn missing_partition_code(image: &strom_raft::MetadataImage, topic: &str, partition: i32) -> i16 {
    let known = image.topics.get(topic).is_some_and(|t| t.partitions.contains_key(&partition));
    if known { ResponseError::NotLeaderOrFollower } else { ResponseError::UnknownTopicOrPartition }.code()
}

/// The one mapping from partition errors to Kafka error codes.
pub fn partition_error_code(e: &PartitionError) -> i16 {
    let code = match e {
        PartitionError::NotLeader | PartitionError::FollowerOutOfStep { .. } => ResponseError::NotLeaderOrFollower,
        PartitionError::FencedLeaderEpoch { .. } => ResponseError::FencedLeaderEpoch,
        PartitionError::UnknownLeaderEpoch { .. } => ResponseError::UnknownLeaderEpoch,
        PartitionError::NotEnoughReplicas { .. } => ResponseError::NotEnoughReplicas,
        PartitionError::OutOfOrderSequence { .. } => ResponseError::OutOfOrderSequenceNumber,
        PartitionError::EarlierBatchRefused { why, .. } => match why {
            Refusal::NotLeader => ResponseError::NotLeaderOrFollower,
            Refusal::NotEnoughReplicas => ResponseError::NotEnoughReplicas,
            Refusal::Storage => ResponseError::KafkaStorageError,
        },
        PartitionError::InvalidProducerEpoch { .. } => ResponseError::InvalidProducerEpoch,
        PartitionError::TransactionCoordinatorFenced { .. } => ResponseError::TransactionCoordinatorFenced,
        PartitionError::OffsetNotAvailable { .. } => ResponseError::OffsetNotAvailable,
        PartitionError::Log(LogError::MessageTooLarge { .. }) => ResponseError::MessageTooLarge,
        PartitionError::Log(LogError::CorruptBatch(_)) => ResponseError::CorruptMessage,
        PartitionError::Log(LogError::OffsetOutOfRange { .. }) => ResponseError::OffsetOutOfRange,
        PartitionError::Log(LogError::StaleLeaderEpoch { .. }) => ResponseError::FencedLeaderEpoch,
        PartitionError::Log(LogError::InvalidRecords(e)) => match e.violation {
            Violation::InvalidRecord => ResponseError::InvalidRecord,
            Violation::InvalidTimestamp => ResponseError::InvalidTimestamp,
        },
        PartitionError::Log(_) => ResponseError::KafkaStorageError,
    };
    code.code()
}

/// An admin API error as a Kafka error code and message.
pub fn api_error(e: &ApiError) -> (i16, Option<StrBytes>) {
    (e.code.kafka_code(), Some(str_bytes(e.message.clone())))
}
