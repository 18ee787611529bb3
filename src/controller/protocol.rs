//! What brokers and admin front ends ask the controller, and its answers.
//!
//! These travel as `App` frames of the quorum RPC (encoded by
//! `strom_raft::codec`) or as direct calls when the asker is the controller.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use strom_raft::records::{AclBinding, QuotaEntity, ScramCredential};

use crate::error::ApiError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ElectionType {
    Preferred,
    Unclean,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ControllerRequest {
    RegisterBroker {
        broker_id: i32,
        incarnation_id: u64,
        kafka: String,
        admin: String,
        raft: String,
        rack: Option<String>,
        /// Every Kafka listener's advertised address, by listener name.
        listeners: Vec<(String, String)>,
    },
    Heartbeat {
        broker_id: i32,
        incarnation_id: u64,
        applied_index: u64,
        /// Bytes held by the partitions this broker leads (topic, partition,
        /// bytes), for the balancer; sent every few heartbeats, else empty.
        sizes: Vec<(String, i32, u64)>,
    },
    ControlledShutdown {
        broker_id: i32,
        incarnation_id: u64,
    },
    CreateTopic {
        name: String,
        partitions: i64,
        replication_factor: i64,
        configs: BTreeMap<String, String>,
    },
    /// CreateTopics with the replicas of each partition given, in partition order.
    CreateTopicAssigned {
        name: String,
        assignment: Vec<Vec<i32>>,
        configs: BTreeMap<String, String>,
    },
    DeleteTopic {
        name: String,
    },
    CreatePartitions {
        name: String,
        count: i64,
    },
    AlterConfigs {
        name: String,
        changes: BTreeMap<String, Option<String>>,
    },
    /// Dynamic broker configs (KIP-226): of one broker (`broker_id`) or the
    /// cluster-wide defaults (`None`); set (`Some`) or reset (`None`).
    AlterBrokerConfigs {
        broker_id: Option<i32>,
        changes: BTreeMap<String, Option<String>>,
    },
    ElectLeader {
        topic: String,
        partition: i32,
        election: ElectionType,
    },
    /// A partition leader asks for new ISRs (KIP-497's AlterPartition),
    /// each based on the leader and partition epochs it knows; batched like
    /// Kafka's, so a broker coming back into thousands of ISRs costs a few
    /// metadata writes, not one each. Answered with `Partitions`.
    AlterPartition {
        broker_id: i32,
        changes: Vec<IsrChange>,
    },
    /// A block of producer ids for a broker's idempotent producers.
    AllocateProducerIds {
        broker_id: i32,
    },
    /// A broker enters (`on`) or leaves maintenance: it keeps its replicas
    /// and leads nothing.
    SetMaintenance {
        broker_id: i32,
        on: bool,
    },
    /// Starts (`on`) or stops draining a broker for retirement.
    Decommission {
        broker_id: i32,
        on: bool,
    },
    /// Removes a dead or drained broker that holds no replica (Kafka's UnregisterBroker).
    Unregister {
        broker_id: i32,
    },
    /// Promotes a caught-up observer to a voter of the metadata quorum (KIP-853).
    AddVoter {
        node_id: u64,
    },
    /// Turns a voter into an observer.
    RemoveVoter {
        node_id: u64,
    },
    /// Moves a partition to `target` replicas (KIP-455), replacing a running
    /// reassignment; `None` cancels the running one.
    Reassign {
        topic: String,
        partition: i32,
        target: Option<Vec<i32>>,
    },
    /// Sets (`Some`) or removes (`None`) users' SCRAM credentials, by
    /// Kafka's mechanism code, all at once.
    AlterScramCredentials {
        changes: Vec<(String, i8, Option<ScramCredential>)>,
    },
    /// Sets (`Some`) or removes client quota values, all at once.
    AlterClientQuotas {
        changes: Vec<(QuotaEntity, String, Option<f64>)>,
    },
    /// Adds and removes ACLs, all at once.
    AlterAcls {
        add: Vec<AclBinding>,
        remove: Vec<AclBinding>,
    },
}

impl ControllerRequest {
    /// Whether sending it again after an unknown outcome is harmless: the
    /// controller answers a repeat as it answered the first (heartbeats,
    /// registrations, changes checked against a partition epoch, settings
    /// set to a value). Creating and deleting topics, adding partitions,
    /// elections and voter changes are not: a repeat is decided against the
    /// first and answers as if it had failed.
    pub fn retry_safe(&self) -> bool {
        !matches!(
            self,
            Self::CreateTopic { .. }
                | Self::CreateTopicAssigned { .. }
                | Self::DeleteTopic { .. }
                | Self::CreatePartitions { .. }
                | Self::ElectLeader { .. }
                | Self::AddVoter { .. }
                | Self::RemoveVoter { .. }
        )
    }
}

/// One partition's ISR change in an `AlterPartition` request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IsrChange {
    pub topic: String,
    pub partition: i32,
    pub leader_epoch: i32,
    pub partition_epoch: i32,
    pub isr: Vec<i32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ControllerResponse {
    /// Done; the change is in the metadata log at `index` (0: nothing to write).
    Done {
        index: u64,
    },
    /// A heartbeat's answer: whether the broker is fenced after it.
    Heartbeat {
        fenced: bool,
        index: u64,
    },
    /// Producer ids `[start, start + len)` belong to the asking broker.
    ProducerIds {
        start: i64,
        len: i64,
        index: u64,
    },
    /// Per change of a batched request, in its order: `None` when it is in
    /// the metadata log at `index`, else why it was refused (nothing was
    /// proposed for it). A failure of the whole batch is `Error`.
    Partitions {
        index: u64,
        refused: Vec<Option<ApiError>>,
    },
    /// The broker must register (again) before heartbeating.
    UnknownBroker,
    Error(ApiError),
    /// Ask the quorum leader instead (its id and `--raft` address when known).
    NotController {
        leader: Option<u64>,
        leader_addr: Option<String>,
    },
}
