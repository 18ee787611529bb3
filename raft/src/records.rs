//! Metadata records: the only way cluster metadata changes.
//!
//! Names follow KRaft's (`RegisterBrokerRecord`, `PartitionChangeRecord`, …).
//! The controller decides and proposes records; every node applies the same
//! committed records in the same order to its [`crate::MetadataImage`].
//! A record carries its decision fully: applying it needs no clock, no
//! randomness and no I/O.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A topic's id: 128 random bits, chosen by the controller at creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TopicId(pub u128);

impl fmt::Display for TopicId {
    /// The 8-4-4-4-12 hex form of a UUID.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = format!("{:032x}", self.0);
        write!(f, "{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
    }
}

/// A registered broker's lifecycle state (KRaft's fenced / unfenced /
/// in-controlled-shutdown).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BrokerState {
    /// Registered but not (or no longer) trusted to serve: it has not caught
    /// up yet, or its heartbeats stopped for `broker.session.timeout.ms`.
    Fenced,
    /// Serving and eligible to lead and to be in ISRs.
    Active,
    /// Leaving through a controlled shutdown; leads nothing.
    ShuttingDown,
}

impl BrokerState {
    pub fn as_str(self) -> &'static str {
        match self {
            BrokerState::Fenced => "fenced",
            BrokerState::Active => "active",
            BrokerState::ShuttingDown => "shutting_down",
        }
    }
}

/// What a [`MetadataRecord::PartitionChange`] does to the leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaderChange {
    Unchanged,
    /// The partition has no leader (offline).
    None,
    Elect(i32),
}

/// What a config record applies to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ConfigResource {
    /// Cluster-wide broker defaults (dynamic broker configs).
    Broker,
    Topic(String),
    /// One broker's dynamic configs, over the cluster-wide defaults (KIP-226).
    BrokerId(i32),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum MetadataRecord {
    /// The cluster's id, written once by the first controller.
    ClusterId {
        cluster_id: String,
    },
    /// A broker (re)registers; a new incarnation starts fenced.
    RegisterBroker {
        broker_id: i32,
        incarnation_id: u64,
        kafka: String,
        admin: String,
        raft: String,
        /// `broker.rack`: replicas of one partition go to different racks.
        rack: Option<String>,
        /// Every Kafka listener's advertised address, by listener name.
        listeners: Vec<(String, String)>,
    },
    /// Fenced, unfenced or shutting down.
    BrokerRegistrationChange {
        broker_id: i32,
        state: BrokerState,
    },
    Topic {
        name: String,
        topic_id: TopicId,
    },
    /// A new partition with its full initial registration.
    Partition {
        topic_id: TopicId,
        partition: i32,
        replicas: Vec<i32>,
        isr: Vec<i32>,
        leader: Option<i32>,
    },
    /// A change to an existing partition. A new leader bumps the leader
    /// epoch; every change bumps the partition epoch (KIP-631).
    PartitionChange {
        topic_id: TopicId,
        partition: i32,
        leader: LeaderChange,
        isr: Option<Vec<i32>>,
        replicas: Option<Vec<i32>>,
    },
    RemoveTopic {
        topic_id: TopicId,
    },
    /// Sets (`Some`) or resets (`None`) one config key.
    Config {
        resource: ConfigResource,
        key: String,
        value: Option<String>,
    },
    /// Hands the block `[next_producer_id - block_size, next_producer_id)` to a broker.
    ProducerIds {
        broker_id: i32,
        next_producer_id: i64,
    },
    /// A step of a partition reassignment (KIP-455): its start or
    /// replacement (`replicas` = target then the remaining originals,
    /// with `adding` and `removing` set), its completion or its cancellation
    /// (both empty). Carries the whole replica set and ISR; a new leader
    /// bumps the leader epoch, and every step bumps the partition epoch.
    PartitionReassignment {
        topic_id: TopicId,
        partition: i32,
        replicas: Vec<i32>,
        adding: Vec<i32>,
        removing: Vec<i32>,
        isr: Vec<i32>,
        leader: LeaderChange,
    },
    /// A broker enters (or leaves) maintenance: it keeps its replicas and
    /// leads nothing.
    BrokerMaintenance {
        broker_id: i32,
        on: bool,
    },
    /// A broker starts (or stops) being drained for retirement.
    BrokerDecommission {
        broker_id: i32,
        on: bool,
    },
    /// A broker leaves the metadata (Kafka's UnregisterBroker); its running
    /// incarnation may not register again.
    UnregisterBroker {
        broker_id: i32,
    },
    /// A user's SCRAM credential for one mechanism (KRaft's
    /// UserScramCredentialRecord): never the password.
    UserScramCredential {
        name: String,
        /// Kafka's mechanism code: 1 SCRAM-SHA-256, 2 SCRAM-SHA-512.
        mechanism: i8,
        credential: ScramCredential,
    },
    /// Removes a user's credential for one mechanism.
    RemoveUserScramCredential {
        name: String,
        mechanism: i8,
    },
    /// Adds an ACL (KRaft's AccessControlEntryRecord); adding one that exists changes nothing.
    Acl {
        binding: AclBinding,
    },
    /// Removes an ACL.
    RemoveAcl {
        binding: AclBinding,
    },
    /// Sets (`Some`) or removes one client quota value (KRaft's ClientQuotaRecord).
    ClientQuota {
        entity: QuotaEntity,
        key: String,
        value: Option<f64>,
    },
}

/// One part of a quota entity: not part of it, the default, or a name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum EntityName {
    Unset,
    Default,
    Named(String),
}

/// Who a client quota applies to (KIP-55): a user, a client id, or both;
/// each a name or the default.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct QuotaEntity {
    pub user: EntityName,
    pub client_id: EntityName,
}

/// An ACL in Kafka's model, with Kafka's numeric codes: who (principal and
/// host) may or may not (permission) do what (operation) to which resources
/// (type, name and pattern).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AclBinding {
    /// 2 topic, 3 group, 4 cluster, 5 transactional id.
    pub resource_type: i8,
    pub resource_name: String,
    /// 3 literal, 4 prefixed.
    pub pattern_type: i8,
    /// `User:NAME` or `User:*`.
    pub principal: String,
    /// An IP address, or `*`.
    pub host: String,
    /// Kafka's AclOperation code (2 ALL, 3 READ, ... 12 IDEMPOTENT_WRITE).
    pub operation: i8,
    /// 2 deny, 3 allow.
    pub permission: i8,
}

/// A SCRAM credential as RFC 5802 stores it: the salt, the iteration count,
/// and keys derived from the salted password (which cannot be turned back
/// into it).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScramCredential {
    pub salt: Vec<u8>,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
    pub iterations: u32,
}

impl std::fmt::Debug for ScramCredential {
    /// Keys stay out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramCredential").field("iterations", &self.iterations).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_id_renders_as_uuid() {
        let id = TopicId(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
        assert_eq!(id.to_string(), "01234567-89ab-cdef-0123-456789abcdef");
    }
}
