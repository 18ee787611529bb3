//! The metadata image: what every node knows about the cluster, as the fold
//! of the committed metadata records.
//!
//! [`MetadataImage::apply`] is pure and deterministic, so the same log gives
//! the same image on every node. A record that refers to something the image
//! does not have (a partition of a deleted topic, say) changes nothing and is
//! reported; it never panics. The partition and replica state machines of the
//! controller are derived views of the image ([`MetadataImage::partition_state`],
//! [`MetadataImage::replica_state`]), never stored separately.

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

use crate::records::{
    AclBinding, BrokerState, ConfigResource, LeaderChange, MetadataRecord, QuotaEntity, ScramCredential, TopicId,
};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BrokerRegistration {
    pub broker_id: i32,
    pub incarnation_id: u64,
    pub kafka: String,
    pub admin: String,
    pub raft: String,
    /// `broker.rack`, when set.
    pub rack: Option<String>,
    /// Every Kafka listener's advertised address, by listener name.
    pub listeners: Vec<(String, String)>,
    pub state: BrokerState,
    /// In maintenance: keeps its replicas but leads nothing.
    pub maintenance: bool,
    /// Being drained: its replicas move away, and it is unregistered once
    /// it holds none.
    pub decommissioning: bool,
}

impl BrokerRegistration {
    /// Active brokers lead partitions and sit in ISRs.
    pub fn is_active(&self) -> bool {
        self.state == BrokerState::Active
    }

    /// Active, and neither in maintenance nor draining: may take leaderships.
    pub fn can_lead(&self) -> bool {
        self.is_active() && !self.maintenance && !self.decommissioning
    }

    /// The address it advertises on the Kafka listener `name`, if it has
    /// that listener. (A broker registered without listener names has one
    /// listener, `kafka`, answered for any name.)
    pub fn advertised(&self, name: &str) -> Option<&str> {
        if self.listeners.is_empty() {
            return Some(&self.kafka);
        }
        self.listeners.iter().find(|(n, _)| n == name).map(|(_, a)| a.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartitionRegistration {
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
    pub leader: Option<i32>,
    pub leader_epoch: i32,
    pub partition_epoch: i32,
    /// Replicas a reassignment adds (KIP-455); they are in `replicas` too.
    pub adding_replicas: Vec<i32>,
    /// Replicas a reassignment removes once it completes; in `replicas` too.
    pub removing_replicas: Vec<i32>,
}

impl PartitionRegistration {
    /// A new partition's registration: no leader epoch yet, no reassignment.
    pub fn new(replicas: Vec<i32>, isr: Vec<i32>, leader: Option<i32>) -> Self {
        Self {
            replicas,
            isr,
            leader,
            leader_epoch: 0,
            partition_epoch: 0,
            adding_replicas: vec![],
            removing_replicas: vec![],
        }
    }

    /// A new leader (or none) bumps the leader epoch.
    fn change_leader(&mut self, change: LeaderChange) {
        match change {
            LeaderChange::Unchanged => {}
            LeaderChange::None => {
                self.leader = None;
                self.leader_epoch += 1;
            }
            LeaderChange::Elect(id) => {
                self.leader = Some(id);
                self.leader_epoch += 1;
            }
        }
    }

    /// Whether `replica` is one a reassignment adds and is not in sync yet:
    /// its fetches are catch-up traffic, which the replication throttles bound.
    pub fn is_catching_up(&self, replica: i32) -> bool {
        self.adding_replicas.contains(&replica) && !self.isr.contains(&replica)
    }

    pub fn is_reassigning(&self) -> bool {
        !self.adding_replicas.is_empty() || !self.removing_replicas.is_empty()
    }

    /// The replicas a running reassignment moves to: every replica but the
    /// removing ones, in replica order; `replicas` when none runs.
    pub fn target_replicas(&self) -> Vec<i32> {
        self.replicas.iter().copied().filter(|r| !self.removing_replicas.contains(r)).collect()
    }

    /// The replicas before the running reassignment: every replica but the
    /// adding ones.
    pub fn original_replicas(&self) -> Vec<i32> {
        self.replicas.iter().copied().filter(|r| !self.adding_replicas.contains(r)).collect()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopicImage {
    pub name: String,
    pub topic_id: TopicId,
    pub partitions: BTreeMap<i32, PartitionRegistration>,
    /// Topic-level overrides only; defaults come from broker settings.
    pub configs: BTreeMap<String, String>,
}

/// The partition state machine (Kafka's controller names), derived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionState {
    /// Replicas assigned, never had a leader.
    New,
    /// Led by an active broker.
    Online,
    /// Had a leader once and has none now (or its leader is not active).
    Offline,
}

/// The replica state machine, derived per (partition, broker).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaState {
    /// Assigned to an active broker but not (yet) in the ISR.
    New,
    /// On an active broker and in the ISR.
    Online,
    /// On a broker that is fenced, shutting down or not registered.
    Offline,
}

impl PartitionState {
    pub fn as_str(self) -> &'static str {
        match self {
            PartitionState::New => "new",
            PartitionState::Online => "online",
            PartitionState::Offline => "offline",
        }
    }
}

impl ReplicaState {
    pub fn as_str(self) -> &'static str {
        match self {
            ReplicaState::New => "new",
            ReplicaState::Online => "online",
            ReplicaState::Offline => "offline",
        }
    }
}

/// Why a record changed nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    #[error("unknown broker {0}")]
    UnknownBroker(i32),
    #[error("unknown topic id {0}")]
    UnknownTopicId(TopicId),
    #[error("unknown partition {1} of topic id {0}")]
    UnknownPartition(TopicId, i32),
    #[error("topic {0} already exists")]
    TopicExists(String),
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MetadataImage {
    pub cluster_id: Option<String>,
    pub brokers: BTreeMap<i32, BrokerRegistration>,
    pub topics: BTreeMap<String, TopicImage>,
    pub topic_names: BTreeMap<TopicId, String>,
    /// Dynamic cluster-wide broker config overrides.
    pub broker_configs: BTreeMap<String, String>,
    /// The first producer id not yet handed out.
    pub next_producer_id: i64,
    /// Dynamic config overrides of single brokers, by broker id.
    pub per_broker_configs: BTreeMap<i32, BTreeMap<String, String>>,
    /// Unregistered brokers and the incarnation that was running then: that
    /// incarnation may not register again (a restart may).
    pub retired_brokers: BTreeMap<i32, u64>,
    /// SCRAM credentials by user, then by mechanism code.
    pub scram_credentials: BTreeMap<String, BTreeMap<i8, ScramCredential>>,
    pub acls: BTreeSet<AclBinding>,
    /// Client quotas (`producer_byte_rate`, `consumer_byte_rate`, `request_percentage`) by entity.
    pub client_quotas: BTreeMap<QuotaEntity, BTreeMap<String, f64>>,
    /// What a reader derives from `acls` (the authorizer's index), built
    /// once per set of ACLs and shared by every image that has that set:
    /// not stored, and replaced whenever an ACL record applies.
    #[serde(skip)]
    pub acl_cache: DerivedCache,
}

/// A value derived from part of the image, built on first use, then read
/// without a lock. Two images are equal whatever their caches hold.
#[derive(Clone, Default)]
pub struct DerivedCache(Arc<OnceLock<Box<dyn Any + Send + Sync>>>);

impl DerivedCache {
    /// The cached `T`, built by `build` the first time.
    pub fn get_or_init<T: Any + Send + Sync>(&self, build: impl FnOnce() -> T) -> Option<&T> {
        self.0.get_or_init(|| Box::new(build())).downcast_ref()
    }
}

impl PartialEq for DerivedCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for DerivedCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DerivedCache")
    }
}

impl MetadataImage {
    /// Applies one record. Deterministic: no clock, no randomness, no I/O.
    pub fn apply(&mut self, record: &MetadataRecord) -> Result<(), ApplyError> {
        match record {
            MetadataRecord::ClusterId { cluster_id } => {
                if self.cluster_id.is_none() {
                    self.cluster_id = Some(cluster_id.clone());
                }
            }
            MetadataRecord::RegisterBroker { broker_id, incarnation_id, kafka, admin, raft, rack, listeners } => {
                let previous = self.brokers.get(broker_id).cloned();
                self.brokers.insert(
                    *broker_id,
                    BrokerRegistration {
                        broker_id: *broker_id,
                        incarnation_id: *incarnation_id,
                        kafka: kafka.clone(),
                        admin: admin.clone(),
                        raft: raft.clone(),
                        rack: rack.clone(),
                        listeners: listeners.clone(),
                        state: BrokerState::Fenced,
                        // A restart keeps the operator's intent.
                        maintenance: previous.as_ref().is_some_and(|b| b.maintenance),
                        decommissioning: previous.as_ref().is_some_and(|b| b.decommissioning),
                    },
                );
            }
            MetadataRecord::BrokerRegistrationChange { broker_id, state } => {
                let broker = self.brokers.get_mut(broker_id).ok_or(ApplyError::UnknownBroker(*broker_id))?;
                broker.state = *state;
            }
            MetadataRecord::Topic { name, topic_id } => {
                if self.topics.contains_key(name) {
                    return Err(ApplyError::TopicExists(name.clone()));
                }
                self.topic_names.insert(*topic_id, name.clone());
                self.topics.insert(
                    name.clone(),
                    TopicImage {
                        name: name.clone(),
                        topic_id: *topic_id,
                        partitions: BTreeMap::new(),
                        configs: BTreeMap::new(),
                    },
                );
            }
            MetadataRecord::Partition { topic_id, partition, replicas, isr, leader } => {
                let topic = self.topic_by_id_mut(*topic_id)?;
                topic.partitions.insert(*partition, PartitionRegistration::new(replicas.clone(), isr.clone(), *leader));
            }
            MetadataRecord::PartitionChange { topic_id, partition, leader, isr, replicas } => {
                let topic = self.topic_by_id_mut(*topic_id)?;
                let p =
                    topic.partitions.get_mut(partition).ok_or(ApplyError::UnknownPartition(*topic_id, *partition))?;
                p.change_leader(*leader);
                if let Some(isr) = isr {
                    p.isr = isr.clone();
                }
                if let Some(replicas) = replicas {
                    p.replicas = replicas.clone();
                }
                p.partition_epoch += 1;
            }
            MetadataRecord::BrokerMaintenance { broker_id, on } => {
                let broker = self.brokers.get_mut(broker_id).ok_or(ApplyError::UnknownBroker(*broker_id))?;
                broker.maintenance = *on;
            }
            MetadataRecord::BrokerDecommission { broker_id, on } => {
                let broker = self.brokers.get_mut(broker_id).ok_or(ApplyError::UnknownBroker(*broker_id))?;
                broker.decommissioning = *on;
            }
            MetadataRecord::UnregisterBroker { broker_id } => {
                let broker = self.brokers.remove(broker_id).ok_or(ApplyError::UnknownBroker(*broker_id))?;
                self.retired_brokers.insert(*broker_id, broker.incarnation_id);
                self.per_broker_configs.remove(broker_id);
            }
            MetadataRecord::UserScramCredential { name, mechanism, credential } => {
                self.scram_credentials.entry(name.clone()).or_default().insert(*mechanism, credential.clone());
            }
            MetadataRecord::Acl { binding } => {
                if self.acls.insert(binding.clone()) {
                    self.acl_cache = DerivedCache::default();
                }
            }
            MetadataRecord::RemoveAcl { binding } => {
                if self.acls.remove(binding) {
                    self.acl_cache = DerivedCache::default();
                }
            }
            MetadataRecord::ClientQuota { entity, key, value } => match value {
                Some(v) => {
                    self.client_quotas.entry(entity.clone()).or_default().insert(key.clone(), *v);
                }
                None => {
                    if let Some(values) = self.client_quotas.get_mut(entity) {
                        values.remove(key);
                        if values.is_empty() {
                            self.client_quotas.remove(entity);
                        }
                    }
                }
            },
            MetadataRecord::RemoveUserScramCredential { name, mechanism } => {
                if let Some(user) = self.scram_credentials.get_mut(name) {
                    user.remove(mechanism);
                    if user.is_empty() {
                        self.scram_credentials.remove(name);
                    }
                }
            }
            MetadataRecord::PartitionReassignment { topic_id, partition, replicas, adding, removing, isr, leader } => {
                let topic = self.topic_by_id_mut(*topic_id)?;
                let p =
                    topic.partitions.get_mut(partition).ok_or(ApplyError::UnknownPartition(*topic_id, *partition))?;
                p.change_leader(*leader);
                p.replicas = replicas.clone();
                p.adding_replicas = adding.clone();
                p.removing_replicas = removing.clone();
                p.isr = isr.clone();
                p.partition_epoch += 1;
            }
            MetadataRecord::RemoveTopic { topic_id } => {
                let name = self.topic_names.remove(topic_id).ok_or(ApplyError::UnknownTopicId(*topic_id))?;
                self.topics.remove(&name);
            }
            MetadataRecord::Config { resource, key, value } => {
                let configs = match resource {
                    ConfigResource::Broker => &mut self.broker_configs,
                    ConfigResource::BrokerId(id) => self.per_broker_configs.entry(*id).or_default(),
                    ConfigResource::Topic(name) => match self.topics.get_mut(name) {
                        Some(t) => &mut t.configs,
                        None => return Ok(()),
                    },
                };
                match value {
                    Some(v) => configs.insert(key.clone(), v.clone()),
                    None => configs.remove(key),
                };
                if let ConfigResource::BrokerId(id) = resource {
                    self.per_broker_configs.retain(|b, configs| b != id || !configs.is_empty());
                }
            }
            MetadataRecord::ProducerIds { next_producer_id, .. } => {
                self.next_producer_id = self.next_producer_id.max(*next_producer_id);
            }
        }
        Ok(())
    }

    fn topic_by_id_mut(&mut self, topic_id: TopicId) -> Result<&mut TopicImage, ApplyError> {
        let name = self.topic_names.get(&topic_id).ok_or(ApplyError::UnknownTopicId(topic_id))?;
        self.topics.get_mut(name).ok_or(ApplyError::UnknownTopicId(topic_id))
    }

    pub fn topic_by_id(&self, topic_id: TopicId) -> Option<&TopicImage> {
        self.topic_names.get(&topic_id).and_then(|n| self.topics.get(n))
    }

    pub fn is_active(&self, broker_id: i32) -> bool {
        self.brokers.get(&broker_id).is_some_and(BrokerRegistration::is_active)
    }

    /// Whether `broker_id` may take leaderships (see [`BrokerRegistration::can_lead`]).
    pub fn can_lead(&self, broker_id: i32) -> bool {
        self.brokers.get(&broker_id).is_some_and(BrokerRegistration::can_lead)
    }

    /// Ids of active brokers, ascending.
    pub fn active_brokers(&self) -> Vec<i32> {
        self.brokers.values().filter(|b| b.is_active()).map(|b| b.broker_id).collect()
    }

    pub fn partition_state(&self, p: &PartitionRegistration) -> PartitionState {
        match p.leader {
            Some(id) if self.is_active(id) => PartitionState::Online,
            None if p.leader_epoch == 0 => PartitionState::New,
            _ => PartitionState::Offline,
        }
    }

    pub fn replica_state(&self, p: &PartitionRegistration, broker_id: i32) -> ReplicaState {
        if !self.is_active(broker_id) {
            ReplicaState::Offline
        } else if p.isr.contains(&broker_id) {
            ReplicaState::Online
        } else {
            ReplicaState::New
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn register(id: i32) -> MetadataRecord {
        MetadataRecord::RegisterBroker {
            broker_id: id,
            incarnation_id: 1,
            kafka: format!("127.0.0.1:{}", 9091 + id),
            admin: String::new(),
            raft: String::new(),
            rack: None,
            listeners: vec![],
        }
    }

    fn active(id: i32) -> MetadataRecord {
        MetadataRecord::BrokerRegistrationChange { broker_id: id, state: BrokerState::Active }
    }

    fn sample_log() -> Vec<MetadataRecord> {
        let t = TopicId(42);
        vec![
            MetadataRecord::ClusterId { cluster_id: "c1".into() },
            register(1),
            register(2),
            active(1),
            active(2),
            MetadataRecord::Topic { name: "orders".into(), topic_id: t },
            MetadataRecord::Partition {
                topic_id: t,
                partition: 0,
                replicas: vec![1, 2],
                isr: vec![1, 2],
                leader: Some(1),
            },
            MetadataRecord::Config {
                resource: ConfigResource::Topic("orders".into()),
                key: "retention.ms".into(),
                value: Some("1000".into()),
            },
            MetadataRecord::PartitionChange {
                topic_id: t,
                partition: 0,
                leader: LeaderChange::Elect(2),
                isr: Some(vec![2]),
                replicas: None,
            },
        ]
    }

    #[test]
    fn apply_is_deterministic_and_bumps_epochs() {
        let mut a = MetadataImage::default();
        let mut b = MetadataImage::default();
        for r in sample_log() {
            a.apply(&r).expect("apply a");
            b.apply(&r).expect("apply b");
        }
        assert_eq!(a, b);
        let p = &a.topics["orders"].partitions[&0];
        assert_eq!(p.leader, Some(2));
        assert_eq!(p.isr, vec![2]);
        assert_eq!((p.leader_epoch, p.partition_epoch), (1, 1));
        assert_eq!(a.topics["orders"].configs["retention.ms"], "1000");
        assert_eq!(a.cluster_id.as_deref(), Some("c1"));
    }

    #[test]
    fn isr_only_change_keeps_leader_epoch() {
        let mut img = MetadataImage::default();
        for r in sample_log() {
            img.apply(&r).expect("apply");
        }
        let change = MetadataRecord::PartitionChange {
            topic_id: TopicId(42),
            partition: 0,
            leader: LeaderChange::Unchanged,
            isr: Some(vec![2, 1]),
            replicas: None,
        };
        img.apply(&change).expect("apply");
        let p = &img.topics["orders"].partitions[&0];
        assert_eq!((p.leader_epoch, p.partition_epoch), (1, 2));
    }

    #[test]
    fn unknown_references_change_nothing() {
        let mut img = MetadataImage::default();
        for r in sample_log() {
            img.apply(&r).expect("apply");
        }
        let before = img.clone();
        let bad = MetadataRecord::PartitionChange {
            topic_id: TopicId(7),
            partition: 0,
            leader: LeaderChange::None,
            isr: None,
            replicas: None,
        };
        assert_eq!(img.apply(&bad), Err(ApplyError::UnknownTopicId(TopicId(7))));
        assert_eq!(
            img.apply(&MetadataRecord::BrokerRegistrationChange { broker_id: 9, state: BrokerState::Fenced }),
            Err(ApplyError::UnknownBroker(9))
        );
        assert_eq!(
            img.apply(&MetadataRecord::Topic { name: "orders".into(), topic_id: TopicId(8) }),
            Err(ApplyError::TopicExists("orders".into()))
        );
        assert_eq!(img, before);
    }

    #[test]
    fn remove_topic_removes_only_that_topic() {
        let mut img = MetadataImage::default();
        for r in sample_log() {
            img.apply(&r).expect("apply");
        }
        img.apply(&MetadataRecord::Topic { name: "other".into(), topic_id: TopicId(43) }).expect("apply");
        img.apply(&MetadataRecord::RemoveTopic { topic_id: TopicId(42) }).expect("apply");
        assert!(!img.topics.contains_key("orders"));
        assert!(img.topics.contains_key("other"));
        assert_eq!(img.topic_names.len(), 1);
    }

    #[test]
    fn derived_partition_and_replica_states() {
        let mut img = MetadataImage::default();
        for r in sample_log() {
            img.apply(&r).expect("apply");
        }
        let p = img.topics["orders"].partitions[&0].clone();
        assert_eq!(img.partition_state(&p), PartitionState::Online);
        assert_eq!(img.replica_state(&p, 2), ReplicaState::Online);
        assert_eq!(img.replica_state(&p, 1), ReplicaState::New);
        img.apply(&MetadataRecord::BrokerRegistrationChange { broker_id: 2, state: BrokerState::Fenced })
            .expect("apply");
        assert_eq!(img.partition_state(&p), PartitionState::Offline);
        assert_eq!(img.replica_state(&p, 2), ReplicaState::Offline);
        let fresh = PartitionRegistration::new(vec![3], vec![3], None);
        assert_eq!(img.partition_state(&fresh), PartitionState::New);
    }

    #[test]
    fn image_round_trips_through_codec() {
        let mut img = MetadataImage::default();
        for r in sample_log() {
            img.apply(&r).expect("apply");
        }
        let bytes = crate::codec::encode(&img).expect("encode");
        let back: MetadataImage = crate::codec::decode(&bytes).expect("decode");
        assert_eq!(back, img);
    }
}
