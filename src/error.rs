//! Kafka error codes and the one mapping from Strom's errors to them.
//!
//! The admin API shows the code's name and an HTTP status; the Kafka front
//! end sends the numeric code. Both come from [`ErrorCode`].

use serde::{Deserialize, Serialize};

/// The Kafka error codes Strom answers with (numbers from the Kafka protocol).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorCode {
    UnknownServerError,
    UnknownTopicOrPartition,
    RequestTimedOut,
    NotController,
    InvalidTopicException,
    InvalidPartitions,
    InvalidReplicationFactor,
    InvalidConfig,
    InvalidRequest,
    TopicAlreadyExists,
    ElectionNotNeeded,
    EligibleLeadersNotAvailable,
    BrokerNotAvailable,
    StaleBrokerEpoch,
    GroupIdNotFound,
    NotLeaderOrFollower,
    FencedLeaderEpoch,
    InvalidUpdateVersion,
    IneligibleReplica,
    InvalidReplicaAssignment,
    NoReassignmentInProgress,
    DuplicateVoter,
    VoterNotFound,
    InvalidQuorumChange,
    BrokerIdNotRegistered,
    NotEnoughBrokers,
    BrokerNotEmpty,
    InconsistentClusterId,
    ResourceNotFound,
    DuplicateResource,
    UnsupportedSaslMechanism,
    UnacceptableCredential,
    SaslAuthenticationFailed,
    ClusterAuthorizationFailed,
    TopicAuthorizationFailed,
    GroupAuthorizationFailed,
}

impl ErrorCode {
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::UnknownServerError => "UNKNOWN_SERVER_ERROR",
            ErrorCode::UnknownTopicOrPartition => "UNKNOWN_TOPIC_OR_PARTITION",
            ErrorCode::RequestTimedOut => "REQUEST_TIMED_OUT",
            ErrorCode::NotController => "NOT_CONTROLLER",
            ErrorCode::InvalidTopicException => "INVALID_TOPIC_EXCEPTION",
            ErrorCode::InvalidPartitions => "INVALID_PARTITIONS",
            ErrorCode::InvalidReplicationFactor => "INVALID_REPLICATION_FACTOR",
            ErrorCode::InvalidConfig => "INVALID_CONFIG",
            ErrorCode::InvalidRequest => "INVALID_REQUEST",
            ErrorCode::TopicAlreadyExists => "TOPIC_ALREADY_EXISTS",
            ErrorCode::ElectionNotNeeded => "ELECTION_NOT_NEEDED",
            ErrorCode::EligibleLeadersNotAvailable => "ELIGIBLE_LEADERS_NOT_AVAILABLE",
            ErrorCode::BrokerNotAvailable => "BROKER_NOT_AVAILABLE",
            ErrorCode::StaleBrokerEpoch => "STALE_BROKER_EPOCH",
            ErrorCode::GroupIdNotFound => "GROUP_ID_NOT_FOUND",
            ErrorCode::NotLeaderOrFollower => "NOT_LEADER_OR_FOLLOWER",
            ErrorCode::FencedLeaderEpoch => "FENCED_LEADER_EPOCH",
            ErrorCode::InvalidUpdateVersion => "INVALID_UPDATE_VERSION",
            ErrorCode::IneligibleReplica => "INELIGIBLE_REPLICA",
            ErrorCode::InvalidReplicaAssignment => "INVALID_REPLICA_ASSIGNMENT",
            ErrorCode::NoReassignmentInProgress => "NO_REASSIGNMENT_IN_PROGRESS",
            ErrorCode::DuplicateVoter => "DUPLICATE_VOTER",
            ErrorCode::VoterNotFound => "VOTER_NOT_FOUND",
            ErrorCode::InvalidQuorumChange => "INVALID_QUORUM_CHANGE",
            ErrorCode::BrokerIdNotRegistered => "BROKER_ID_NOT_REGISTERED",
            ErrorCode::NotEnoughBrokers => "NOT_ENOUGH_BROKERS",
            ErrorCode::BrokerNotEmpty => "BROKER_NOT_EMPTY",
            ErrorCode::InconsistentClusterId => "INCONSISTENT_CLUSTER_ID",
            ErrorCode::ResourceNotFound => "RESOURCE_NOT_FOUND",
            ErrorCode::DuplicateResource => "DUPLICATE_RESOURCE",
            ErrorCode::UnsupportedSaslMechanism => "UNSUPPORTED_SASL_MECHANISM",
            ErrorCode::UnacceptableCredential => "UNACCEPTABLE_CREDENTIAL",
            ErrorCode::SaslAuthenticationFailed => "SASL_AUTHENTICATION_FAILED",
            ErrorCode::ClusterAuthorizationFailed => "CLUSTER_AUTHORIZATION_FAILED",
            ErrorCode::TopicAuthorizationFailed => "TOPIC_AUTHORIZATION_FAILED",
            ErrorCode::GroupAuthorizationFailed => "GROUP_AUTHORIZATION_FAILED",
        }
    }

    /// The Kafka protocol's numeric code.
    pub fn kafka_code(self) -> i16 {
        match self {
            ErrorCode::UnknownServerError => -1,
            ErrorCode::UnknownTopicOrPartition => 3,
            ErrorCode::RequestTimedOut => 7,
            ErrorCode::BrokerNotAvailable => 8,
            ErrorCode::NotController => 41,
            ErrorCode::InvalidTopicException => 17,
            ErrorCode::InvalidPartitions => 37,
            ErrorCode::InvalidReplicationFactor => 38,
            ErrorCode::InvalidConfig => 40,
            ErrorCode::InvalidRequest => 42,
            ErrorCode::TopicAlreadyExists => 36,
            ErrorCode::ElectionNotNeeded => 84,
            ErrorCode::EligibleLeadersNotAvailable => 83,
            ErrorCode::StaleBrokerEpoch => 77,
            ErrorCode::GroupIdNotFound => 69,
            ErrorCode::NotLeaderOrFollower => 6,
            ErrorCode::FencedLeaderEpoch => 74,
            ErrorCode::InvalidUpdateVersion => 95,
            ErrorCode::IneligibleReplica => 107,
            ErrorCode::InvalidReplicaAssignment => 39,
            ErrorCode::NoReassignmentInProgress => 85,
            ErrorCode::DuplicateVoter => 126,
            ErrorCode::VoterNotFound => 128,
            // Kafka has no code of its own for this refusal.
            ErrorCode::InvalidQuorumChange => 42,
            ErrorCode::BrokerIdNotRegistered => 102,
            // Kafka refuses a replication factor the brokers cannot hold so.
            ErrorCode::NotEnoughBrokers => 38,
            ErrorCode::BrokerNotEmpty => 42,
            ErrorCode::InconsistentClusterId => 104,
            ErrorCode::ResourceNotFound => 91,
            ErrorCode::DuplicateResource => 92,
            ErrorCode::UnsupportedSaslMechanism => 33,
            ErrorCode::UnacceptableCredential => 93,
            ErrorCode::SaslAuthenticationFailed => 58,
            ErrorCode::ClusterAuthorizationFailed => 31,
            ErrorCode::TopicAuthorizationFailed => 29,
            ErrorCode::GroupAuthorizationFailed => 30,
        }
    }

    /// The HTTP status the admin API answers with.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::UnknownTopicOrPartition
            | ErrorCode::GroupIdNotFound
            | ErrorCode::VoterNotFound
            | ErrorCode::BrokerIdNotRegistered
            | ErrorCode::ResourceNotFound => 404,
            ErrorCode::SaslAuthenticationFailed => 401,
            ErrorCode::ClusterAuthorizationFailed
            | ErrorCode::TopicAuthorizationFailed
            | ErrorCode::GroupAuthorizationFailed => 403,
            ErrorCode::TopicAlreadyExists
            | ErrorCode::ElectionNotNeeded
            | ErrorCode::EligibleLeadersNotAvailable
            | ErrorCode::NoReassignmentInProgress
            | ErrorCode::DuplicateVoter
            | ErrorCode::InvalidQuorumChange
            | ErrorCode::NotEnoughBrokers
            | ErrorCode::BrokerNotEmpty
            | ErrorCode::DuplicateResource => 409,
            ErrorCode::NotController | ErrorCode::RequestTimedOut | ErrorCode::BrokerNotAvailable => 503,
            ErrorCode::UnknownServerError => 500,
            _ => 400,
        }
    }
}

/// An error for a client: a Kafka code and a sentence saying what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{}: {message}", code.name())]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }
}
