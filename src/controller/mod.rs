//! The controller role, active on whichever node leads the metadata quorum.
//!
//! It decides and proposes; it never mutates state itself. Requests
//! (registration, heartbeats, topic changes, elections) are checked against
//! the applied image and turned into records by the pure functions in
//! [`topics`] and [`election`]; one write lock serializes decide-and-propose so
//! every decision sees the effect of the previous one. A background tick
//! follows quorum leadership and fences brokers whose sessions expire.

pub mod balancer;
pub mod broker_configs;
pub mod client;
pub mod drain;
pub mod election;
pub mod liveness;
pub mod placement;
pub mod protocol;
pub mod reassignment;
#[cfg(test)]
mod test_support;
pub mod topics;
pub mod voters;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rand::Rng;
use strom_raft::quorum::ProposeError;
use strom_raft::{BrokerState, MetadataImage, MetadataRecord, Quorum, TopicId};
use tokio::sync::watch;

use crate::config::Settings;
use crate::error::{ApiError, ErrorCode};
use liveness::Liveness;
use protocol::{ControllerRequest, ControllerResponse};

/// How long one proposal may wait for the quorum.
pub const PROPOSE_TIMEOUT: Duration = Duration::from_secs(3);
/// Producer ids handed to a broker at a time (Kafka's block size).
pub const PRODUCER_ID_BLOCK: i64 = 1000;
/// How often the controller checks leadership and broker sessions.
pub const TICK: Duration = Duration::from_millis(100);
/// How often the balancer plans.
pub const BALANCE_EVERY: Duration = Duration::from_secs(1);

pub struct Controller {
    broker_id: i32,
    settings: Arc<Settings>,
    quorum: OnceLock<Arc<Quorum>>,
    write_lock: tokio::sync::Mutex<()>,
    liveness: Mutex<Liveness>,
    active: AtomicBool,
    last_rebalance: Mutex<Instant>,
    /// When each fenced broker was first seen fenced by this controller.
    unavailable_since: Mutex<HashMap<i32, Instant>>,
    /// When the balancer last ran here (wall clock, ms), for the admin API.
    last_balance_ms: std::sync::atomic::AtomicI64,
    /// Moves the balancer started since this node last became controller.
    moves_started: std::sync::atomic::AtomicU64,
    /// Partition sizes the leaders last reported, for the balancer.
    sizes: Mutex<balancer::Sizes>,
}

/// Where a registering broker is reached, and its rack.
struct BrokerAddrs {
    kafka: String,
    admin: String,
    raft: String,
    rack: Option<String>,
    listeners: Vec<(String, String)>,
}

impl Controller {
    pub fn new(broker_id: i32, settings: Arc<Settings>) -> Self {
        let session = Duration::from_millis(settings.u64("broker.session.timeout.ms"));
        Self {
            broker_id,
            settings,
            quorum: OnceLock::new(),
            write_lock: tokio::sync::Mutex::new(()),
            liveness: Mutex::new(Liveness::new(session)),
            active: AtomicBool::new(false),
            last_rebalance: Mutex::new(Instant::now()),
            unavailable_since: Mutex::new(HashMap::new()),
            last_balance_ms: std::sync::atomic::AtomicI64::new(-1),
            moves_started: std::sync::atomic::AtomicU64::new(0),
            sizes: Mutex::new(balancer::Sizes::new()),
        }
    }

    /// Gives the controller its quorum (once, right after the quorum starts).
    pub fn attach(&self, quorum: Arc<Quorum>) {
        let _ = self.quorum.set(quorum);
    }

    fn quorum(&self) -> Option<&Arc<Quorum>> {
        self.quorum.get()
    }

    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    fn liveness(&self) -> std::sync::MutexGuard<'_, Liveness> {
        // A poisoned lock only means another request panicked mid-update of
        // in-memory heartbeat times; those stay usable.
        self.liveness.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn not_controller(&self) -> ControllerResponse {
        let (leader, leader_addr) = match self.quorum() {
            Some(q) => {
                let leader = q.leader();
                (leader, leader.and_then(|l| q.member_addr(l)))
            }
            None => (None, None),
        };
        ControllerResponse::NotController { leader, leader_addr }
    }

    /// Handles one request; answers `NotController` unless this node is the
    /// active controller.
    pub async fn handle(&self, request: ControllerRequest) -> ControllerResponse {
        let Some(quorum) = self.quorum().cloned() else { return self.not_controller() };
        if !self.is_active() || !quorum.is_leader() {
            return self.not_controller();
        }
        let result = match request {
            ControllerRequest::Heartbeat { broker_id, incarnation_id, applied_index, sizes } => {
                // A leader cut off from the other voters answers no
                // heartbeat: its own broker, too, learns it is out of touch.
                if !self.has_quorum(&quorum) {
                    return self.not_controller();
                }
                if !sizes.is_empty() {
                    let mut known = self.sizes.lock().unwrap_or_else(|e| e.into_inner());
                    known.extend(sizes.into_iter().map(|(t, p, bytes)| ((t, p), bytes)));
                }
                return self.heartbeat(&quorum, broker_id, incarnation_id, applied_index).await;
            }
            ControllerRequest::RegisterBroker { broker_id, incarnation_id, kafka, admin, raft, rack, listeners } => {
                let addrs = BrokerAddrs { kafka, admin, raft, rack, listeners };
                self.register(&quorum, broker_id, incarnation_id, addrs).await
            }
            ControllerRequest::ControlledShutdown { broker_id, incarnation_id } => {
                self.controlled_shutdown(&quorum, broker_id, incarnation_id).await
            }
            ControllerRequest::AlterPartition { broker_id, changes } => {
                let _guard = match self.decision_lock(&quorum).await {
                    Ok(guard) => guard,
                    Err(e) => return ControllerResponse::Error(e),
                };
                let image = quorum.image();
                let mut records = Vec::new();
                let refused: Vec<Option<ApiError>> = changes
                    .iter()
                    .map(|c| {
                        election::alter_partition(
                            &image,
                            broker_id,
                            &c.topic,
                            c.partition,
                            c.leader_epoch,
                            c.partition_epoch,
                            &c.isr,
                        )
                        .map(|record| records.push(record))
                        .err()
                    })
                    .collect();
                let accepted = records.len();
                match self.propose(&quorum, records).await {
                    Ok(index) => {
                        if accepted > 0 {
                            tracing::info!(
                                leader = broker_id,
                                changes = accepted,
                                refused = changes.len() - accepted,
                                "ISRs changed"
                            );
                        }
                        return ControllerResponse::Partitions { index, refused };
                    }
                    Err(e) => Err(e),
                }
            }
            ControllerRequest::AllocateProducerIds { broker_id } => {
                return self.allocate_producer_ids(&quorum, broker_id).await;
            }
            ControllerRequest::AddVoter { node_id } => self.change_voters(&quorum, node_id, true).await,
            ControllerRequest::RemoveVoter { node_id } => self.change_voters(&quorum, node_id, false).await,
            other => self.admin_write(&quorum, other).await,
        };
        match result {
            Ok(index) => ControllerResponse::Done { index },
            Err(e) => ControllerResponse::Error(e),
        }
    }

    /// Waits, under the write lock, until every entry in this controller's
    /// log is applied. An entry whose proposal timed out may still commit: a
    /// write checked against the image without it would be decided against
    /// a state about to change (two creates of one topic both accepted).
    async fn settle(&self, quorum: &Quorum) -> Result<(), ApiError> {
        let last = quorum.last_log_index();
        if quorum.applied_index() >= last || quorum.wait_applied(last, PROPOSE_TIMEOUT).await {
            return Ok(());
        }
        Err(ApiError::new(
            ErrorCode::RequestTimedOut,
            format!("an earlier change (log index {last}) is still waiting for the quorum; try again"),
        ))
    }

    /// The write lock, taken once every entry in this controller's log is
    /// applied. Every decision is made under it: a decision read from an
    /// image that lacks an earlier, still uncommitted proposal of this
    /// controller would be applied after it and undo it. (Seen in the fault
    /// harness: a fence of broker 1 computed while the fence of broker 3
    /// waited for a quorum elected broker 3 again, after broker 1 alone had
    /// advanced the high watermark: committed records were lost.)
    async fn decision_lock(&self, quorum: &Quorum) -> Result<tokio::sync::MutexGuard<'_, ()>, ApiError> {
        let guard = self.write_lock.lock().await;
        self.settle(quorum).await?;
        Ok(guard)
    }

    async fn propose(&self, quorum: &Quorum, records: Vec<MetadataRecord>) -> Result<u64, ApiError> {
        if records.is_empty() {
            return Ok(0);
        }
        quorum.propose(records, PROPOSE_TIMEOUT).await.map_err(propose_error)
    }

    /// The broker default, a dynamic broker config over the static setting.
    /// Whether a majority of the voters acknowledged this leader within
    /// `broker.session.timeout.ms` (always, for a single voter).
    fn has_quorum(&self, quorum: &Quorum) -> bool {
        if quorum.voters().len() <= 1 {
            return true;
        }
        let session = self.settings.u64("broker.session.timeout.ms");
        quorum.metrics().millis_since_quorum_ack.is_some_and(|ms| ms <= session)
    }

    fn unclean_default(&self, image: &MetadataImage) -> bool {
        self.settings.layered(&image.broker_configs).bool("unclean.leader.election.enable")
    }

    async fn heartbeat(
        &self,
        quorum: &Quorum,
        broker_id: i32,
        incarnation_id: u64,
        applied: u64,
    ) -> ControllerResponse {
        let image = quorum.image();
        let Some(broker) = image.brokers.get(&broker_id).filter(|b| b.incarnation_id == incarnation_id) else {
            return ControllerResponse::UnknownBroker;
        };
        let was_expired = self.liveness().heartbeat(broker_id, Instant::now());
        // A broker whose session had expired may be being fenced right now
        // (fence_expired decided under the decision lock, before this
        // heartbeat): it is answered after that decision, so that it never
        // hears "not fenced" and then loses its leaderships unawares.
        if !was_expired && broker.state != BrokerState::Fenced {
            return ControllerResponse::Heartbeat { fenced: false, index: 0 };
        }
        if broker.state == BrokerState::Fenced && !self.liveness().caught_up(broker_id, applied) {
            return ControllerResponse::Heartbeat { fenced: true, index: 0 };
        }
        let _guard = match self.decision_lock(quorum).await {
            Ok(guard) => guard,
            Err(e) => return ControllerResponse::Error(e),
        };
        let image = quorum.image();
        if !image
            .brokers
            .get(&broker_id)
            .is_some_and(|b| b.state == BrokerState::Fenced && b.incarnation_id == incarnation_id)
        {
            // Not fenced after all (or unfenced by a concurrent heartbeat):
            // the broker applies what this controller has applied first.
            return ControllerResponse::Heartbeat { fenced: false, index: quorum.applied_index() };
        }
        let mut records = vec![MetadataRecord::BrokerRegistrationChange { broker_id, state: BrokerState::Active }];
        let mut after = (*image).clone();
        for r in &records {
            let _ = after.apply(r);
        }
        records.extend(election::elections_for_returning(&after, broker_id));
        match self.propose(quorum, records).await {
            Ok(index) => {
                tracing::info!(broker_id, "broker unfenced");
                ControllerResponse::Heartbeat { fenced: false, index }
            }
            Err(e) => ControllerResponse::Error(e),
        }
    }

    async fn register(
        &self,
        quorum: &Quorum,
        broker_id: i32,
        incarnation_id: u64,
        addrs: BrokerAddrs,
    ) -> Result<u64, ApiError> {
        let BrokerAddrs { kafka, admin, raft, rack, listeners } = addrs;
        let _guard = self.decision_lock(quorum).await?;
        let node_id =
            u64::try_from(broker_id).map_err(|_| ApiError::new(ErrorCode::InvalidRequest, "bad broker id"))?;
        if quorum.image().retired_brokers.get(&broker_id) == Some(&incarnation_id) {
            return Err(ApiError::new(
                ErrorCode::BrokerIdNotRegistered,
                format!("broker {broker_id} was unregistered; restart it to join the cluster again"),
            ));
        }
        if !quorum.voters().contains_key(&node_id) {
            quorum
                .add_learner(node_id, raft.clone(), PROPOSE_TIMEOUT)
                .await
                .map_err(|e| ApiError::new(ErrorCode::RequestTimedOut, format!("adding observer {broker_id}: {e}")))?;
        }
        let image = quorum.image();
        if image.brokers.get(&broker_id).is_some_and(|b| b.incarnation_id == incarnation_id) {
            self.liveness().heartbeat(broker_id, Instant::now());
            return Ok(0);
        }
        let mut records =
            vec![MetadataRecord::RegisterBroker { broker_id, incarnation_id, kafka, admin, raft, rack, listeners }];
        if image.brokers.contains_key(&broker_id) {
            // A restarted broker lost its in-memory state: nothing stays led by it.
            records.extend(election::elections_without(&image, broker_id, self.unclean_default(&image)));
        }
        let index = self.propose(quorum, records).await?;
        self.liveness().registered(broker_id, index, Instant::now());
        tracing::info!(broker_id, index, "broker registered");
        Ok(index)
    }

    async fn controlled_shutdown(&self, quorum: &Quorum, broker_id: i32, incarnation_id: u64) -> Result<u64, ApiError> {
        let _guard = self.decision_lock(quorum).await?;
        let image = quorum.image();
        if image.brokers.get(&broker_id).is_none_or(|b| b.incarnation_id != incarnation_id) {
            return Ok(0);
        }
        let mut records =
            vec![MetadataRecord::BrokerRegistrationChange { broker_id, state: BrokerState::ShuttingDown }];
        records.extend(election::elections_without(&image, broker_id, self.unclean_default(&image)));
        let moved = records.len() - 1;
        let index = self.propose(quorum, records).await?;
        tracing::info!(broker_id, partitions_changed = moved, "broker in controlled shutdown");
        Ok(index)
    }

    /// Promotes an observer (`add`) or demotes a voter, if the quorum keeps a
    /// live majority; done once the new voter set is committed.
    async fn change_voters(&self, quorum: &Quorum, node_id: u64, add: bool) -> Result<u64, ApiError> {
        let _guard = self.decision_lock(quorum).await?;
        let image = quorum.image();
        let view = voters::QuorumView {
            voters: quorum.voters().into_keys().collect(),
            learners: quorum.learners().into_iter().collect(),
            match_index: quorum.match_indexes(),
            last_log_index: quorum.last_log_index(),
        };
        let me = self.broker_id as u64;
        let alive = |id: u64| id == me || i32::try_from(id).is_ok_and(|b| image.is_active(b));
        let next =
            if add { voters::add_voter(&view, node_id, alive)? } else { voters::remove_voter(&view, node_id, alive)? };
        quorum.set_voters(next, PROPOSE_TIMEOUT * 3).await.map_err(propose_error)
    }

    async fn allocate_producer_ids(&self, quorum: &Quorum, broker_id: i32) -> ControllerResponse {
        let _guard = match self.decision_lock(quorum).await {
            Ok(guard) => guard,
            Err(e) => return ControllerResponse::Error(e),
        };
        let start = quorum.image().next_producer_id;
        let records = vec![MetadataRecord::ProducerIds { broker_id, next_producer_id: start + PRODUCER_ID_BLOCK }];
        match self.propose(quorum, records).await {
            Ok(index) => ControllerResponse::ProducerIds { start, len: PRODUCER_ID_BLOCK, index },
            Err(e) => ControllerResponse::Error(e),
        }
    }

    async fn admin_write(&self, quorum: &Quorum, request: ControllerRequest) -> Result<u64, ApiError> {
        let _guard = self.decision_lock(quorum).await?;
        let image = quorum.image();
        let start = rand::thread_rng().gen_range(0..image.brokers.len().max(1));
        let records = match &request {
            ControllerRequest::CreateTopic { name, partitions, replication_factor, configs } => {
                let random = topics::Randomness { topic_id: TopicId(rand::random()), placement_start: start };
                topics::create_topic(&image, name, *partitions, *replication_factor, configs, random)?
            }
            ControllerRequest::CreateTopicAssigned { name, assignment, configs } => {
                topics::create_topic_assigned(&image, name, assignment, configs, TopicId(rand::random()))?
            }
            ControllerRequest::DeleteTopic { name } => topics::delete_topic(&image, name)?,
            ControllerRequest::CreatePartitions { name, count } => {
                topics::create_partitions(&image, name, *count, start)?
            }
            ControllerRequest::AlterConfigs { name, changes } => topics::alter_configs(&image, name, changes)?,
            ControllerRequest::AlterBrokerConfigs { broker_id, changes } => {
                broker_configs::alter(&image, *broker_id, changes)?
            }
            ControllerRequest::ElectLeader { topic, partition, election } => {
                let unknown =
                    || ApiError::new(ErrorCode::UnknownTopicOrPartition, format!("no partition {topic}-{partition}"));
                let t = image.topics.get(topic).ok_or_else(unknown)?;
                let p = t.partitions.get(partition).ok_or_else(unknown)?;
                vec![election::elect(&image, t, *partition, p, *election)?]
            }
            ControllerRequest::Reassign { topic, partition, target: Some(target) } => {
                reassignment::reassign(&image, topic, *partition, target)?.into_iter().collect()
            }
            ControllerRequest::Reassign { topic, partition, target: None } => {
                vec![reassignment::cancel(&image, topic, *partition)?]
            }
            ControllerRequest::SetMaintenance { broker_id, on } => {
                drain::require_registered(&image, *broker_id)?;
                with_leaderships_moved(&image, MetadataRecord::BrokerMaintenance { broker_id: *broker_id, on: *on })
            }
            ControllerRequest::Decommission { broker_id, on: true } => {
                drain::check_decommission(&image, *broker_id)?;
                with_leaderships_moved(&image, MetadataRecord::BrokerDecommission { broker_id: *broker_id, on: true })
            }
            ControllerRequest::Decommission { broker_id, on: false } => {
                drain::require_registered(&image, *broker_id)?;
                vec![MetadataRecord::BrokerDecommission { broker_id: *broker_id, on: false }]
            }
            ControllerRequest::Unregister { broker_id } => {
                drain::check_unregister(&image, *broker_id)?;
                vec![MetadataRecord::UnregisterBroker { broker_id: *broker_id }]
            }
            ControllerRequest::AlterScramCredentials { changes } => crate::security::users::records(changes)?,
            ControllerRequest::AlterClientQuotas { changes } => {
                let mut records = Vec::with_capacity(changes.len());
                for (entity, key, value) in changes {
                    crate::security::quotas::check(entity, key, *value)?;
                    records.push(MetadataRecord::ClientQuota {
                        entity: entity.clone(),
                        key: key.clone(),
                        value: *value,
                    });
                }
                records
            }
            ControllerRequest::AlterAcls { add, remove } => {
                for b in add {
                    crate::security::acl::check_binding(b)
                        .map_err(|reason| ApiError::new(ErrorCode::InvalidRequest, format!("Invalid ACL: {reason}")))?;
                }
                let removed = remove.iter().map(|b| MetadataRecord::RemoveAcl { binding: b.clone() });
                removed.chain(add.iter().map(|b| MetadataRecord::Acl { binding: b.clone() })).collect()
            }
            _ => return Err(ApiError::new(ErrorCode::InvalidRequest, "not an admin request")),
        };
        let index = self.propose(quorum, records).await?;
        log_admin_write(&request, index);
        if let ControllerRequest::Unregister { broker_id } = &request {
            self.forget_observer(quorum, *broker_id).await;
        }
        Ok(index)
    }

    /// An unregistered broker that is an observer of the quorum leaves its
    /// membership too, so the leader stops replicating to it. A voter stays
    /// until it is removed from the voters.
    async fn forget_observer(&self, quorum: &Quorum, broker_id: i32) {
        let Ok(node_id) = u64::try_from(broker_id) else { return };
        if quorum.voters().contains_key(&node_id) || !quorum.learners().contains(&node_id) {
            return;
        }
        if let Err(e) = quorum.remove_learner(node_id, PROPOSE_TIMEOUT).await {
            tracing::warn!(broker_id, error = %e, "could not remove the unregistered broker from the quorum");
        }
    }

    /// Follows quorum leadership and fences expired brokers, until `shutdown`.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut ticker = tokio::time::interval(TICK);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = shutdown.changed() => return,
            }
            let Some(quorum) = self.quorum().cloned() else { continue };
            let leader = quorum.is_leader();
            if leader && !self.is_active() {
                self.activate(&quorum).await;
            } else if !leader && self.is_active() {
                self.active.store(false, Ordering::Release);
                tracing::info!(broker_id = self.broker_id, "no longer the controller");
            }
            if self.is_active() {
                self.fence_expired(&quorum).await;
                let completed = self.complete_reassignments(&quorum).await;
                self.reshape(&quorum).await;
                self.balance(&quorum, completed).await;
                self.maybe_rebalance(&quorum).await;
            }
        }
    }

    /// Takes over as controller: commits a record of its own term so every
    /// earlier entry is applied before the first decision, then gives every
    /// broker a fresh session.
    async fn activate(&self, quorum: &Quorum) {
        let _guard = self.write_lock.lock().await;
        let image = quorum.image();
        let records = match &image.cluster_id {
            None => vec![MetadataRecord::ClusterId { cluster_id: new_cluster_id() }],
            Some(_) => Vec::new(),
        };
        if let Err(e) = quorum.propose(records, PROPOSE_TIMEOUT).await {
            tracing::warn!(error = %e, "could not take over as controller yet");
            return;
        }
        // A voter change the previous controller left half done (a joint
        // configuration) is finished before anything else.
        if let Some(target) = quorum.joint_target() {
            if let Err(e) = quorum.set_voters(target, PROPOSE_TIMEOUT).await {
                tracing::warn!(error = %e, "could not finish a voter change yet");
                return;
            }
        }
        // Live brokers find the new controller within a heartbeat or two.
        let heartbeat = Duration::from_millis(self.settings.u64("broker.heartbeat.interval.ms"));
        let grace = (heartbeat * 3).max(Duration::from_secs(1));
        let predecessor =
            quorum.previous_leader_contact().and_then(|(id, heard)| Some((i32::try_from(id).ok()?, heard)));
        self.liveness().reset(&quorum.image(), Instant::now(), grace, predecessor);
        self.moves_started.store(0, Ordering::Release);
        self.active.store(true, Ordering::Release);
        tracing::info!(broker_id = self.broker_id, term = quorum.metrics().current_term, "elected controller");
    }

    async fn fence_expired(&self, quorum: &Quorum) {
        let expired = self.liveness().expired(&quorum.image(), Instant::now());
        for broker_id in expired {
            let _guard = match self.decision_lock(quorum).await {
                Ok(guard) => guard,
                Err(e) => {
                    tracing::warn!(broker_id, error = %e, "fencing deferred");
                    return;
                }
            };
            let image = quorum.image();
            if !image.brokers.get(&broker_id).is_some_and(|b| b.state != BrokerState::Fenced) {
                continue;
            }
            // A heartbeat may have come in while this waited for the lock.
            if !self.liveness().is_expired(broker_id, Instant::now()) {
                continue;
            }
            let records = fence_records(&image, broker_id, self.unclean_default(&image));
            let moved = records.len() - 1;
            match self.propose(quorum, records).await {
                Ok(_) => tracing::info!(broker_id, partitions_changed = moved, "broker fenced: session expired"),
                Err(e) => tracing::warn!(broker_id, error = %e, "fencing failed"),
            }
        }
    }
}

impl Controller {
    /// Drains decommissioning brokers (leaderships, then replicas, then the
    /// registration), and with `balancer.mode=continuous` re-creates the
    /// replicas of brokers fenced longer than
    /// `balancer.node.unavailable.timeout.ms` on live brokers.
    async fn reshape(&self, quorum: &Quorum) {
        let now = Instant::now();
        let unavailable_for = Duration::from_millis(self.settings.u64("balancer.node.unavailable.timeout.ms"));
        let healing = self.settings.get("balancer.mode").as_deref() == Some("continuous");
        let mut off: BTreeSet<i32> = BTreeSet::new();
        {
            let image = quorum.image();
            let mut since = self.unavailable_since.lock().unwrap_or_else(|e| e.into_inner());
            since.retain(|b, _| image.brokers.get(b).is_some_and(|r| r.state == BrokerState::Fenced));
            for b in image.brokers.values().filter(|b| b.state == BrokerState::Fenced) {
                let at = *since.entry(b.broker_id).or_insert(now);
                if healing && now.duration_since(at) >= unavailable_for {
                    off.insert(b.broker_id);
                }
            }
            let special = image.brokers.values().any(|b| b.decommissioning || b.maintenance);
            if off.is_empty() && !special {
                return;
            }
        }
        let Ok(_guard) = self.decision_lock(quorum).await else { return };
        let image = quorum.image();
        off.extend(image.brokers.values().filter(|b| b.decommissioning).map(|b| b.broker_id));
        let mut records: Vec<MetadataRecord> = Vec::new();
        for b in image.brokers.values().filter(|b| b.decommissioning || b.maintenance) {
            records.extend(election::leaderships_away_from(&image, b.broker_id));
        }
        // Leaderships first; replicas move on a later tick.
        if records.is_empty() && !off.is_empty() {
            let max_moves = self.settings.u64("balancer.max.concurrent.moves").max(1) as usize;
            records = drain::moves_off(&image, &off, max_moves);
        }
        let finished = drain::finished_drains(&image);
        if records.is_empty() && finished.is_empty() {
            return;
        }
        let changes = records.len();
        records.extend(finished.iter().cloned());
        match self.propose(quorum, records).await {
            Ok(index) => {
                if changes > 0 {
                    tracing::info!(changes, index, brokers = ?off, "moving leaderships and replicas off brokers");
                }
                for r in &finished {
                    if let MetadataRecord::UnregisterBroker { broker_id } = r {
                        tracing::info!(broker_id, index, "drained broker unregistered");
                        self.forget_observer(quorum, *broker_id).await;
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "moving replicas off brokers failed"),
        }
    }

    /// When the balancer last ran on this controller (ms since the epoch), or -1.
    pub fn last_balance_ms(&self) -> i64 {
        self.last_balance_ms.load(Ordering::Acquire)
    }

    /// Moves the balancer started since this node last became controller.
    pub fn moves_started(&self) -> u64 {
        self.moves_started.load(Ordering::Acquire)
    }

    /// The partition sizes leaders reported, of partitions the image still has.
    pub fn sizes(&self, image: &MetadataImage) -> balancer::Sizes {
        let mut sizes = self.sizes.lock().unwrap_or_else(|e| e.into_inner());
        sizes.retain(|(t, p), _| image.topics.get(t).is_some_and(|t| t.partitions.contains_key(p)));
        sizes.clone()
    }

    /// Runs the balancer's plan (`balancer.mode`) every [`BALANCE_EVERY`],
    /// and at once when moves just completed (`freed`), so the next ones
    /// start without waiting: its replica moves as reassignments, its leader
    /// moves as a new replica order and an election of the new preferred leader.
    async fn balance(&self, quorum: &Quorum, freed: bool) {
        let mode = balancer::Mode::parse(self.settings.get("balancer.mode").as_deref());
        let now_ms = crate::clock::wall_ms();
        let last = self.last_balance_ms.load(Ordering::Acquire);
        let due = freed || last < 0 || now_ms - last >= BALANCE_EVERY.as_millis() as i64;
        if mode == balancer::Mode::Off || !due {
            return;
        }
        self.last_balance_ms.store(now_ms, Ordering::Release);
        let max_moves = self.settings.u64("balancer.max.concurrent.moves").max(1) as usize;
        let sizes = self.sizes(&quorum.image());
        // In continuous mode leaders are where the replica order puts them:
        // a preferred replica back in the ISR leads again within a balancer
        // interval, not at the next `leader.imbalance.check.interval.seconds`.
        let continuous = mode == balancer::Mode::Continuous;
        let nothing = |image: &MetadataImage| {
            (!continuous || election::preferred_elections(image).is_empty())
                && balancer::plan(image, &sizes, mode, max_moves).is_empty()
        };
        if nothing(&quorum.image()) {
            return;
        }
        let Ok(_guard) = self.decision_lock(quorum).await else { return };
        let mut image = (*quorum.image()).clone();
        let mut records = Vec::new();
        if continuous {
            for election in election::preferred_elections(&image) {
                if image.apply(&election).is_ok() {
                    records.push(election);
                }
            }
        }
        let elections = records.len();
        let moves = balancer::plan(&image, &sizes, mode, max_moves);
        let mut started = 0;
        for m in &moves {
            let Ok(Some(record)) = reassignment::reassign(&image, &m.topic, m.partition, &m.to) else { continue };
            if image.apply(&record).is_err() {
                continue;
            }
            records.push(record);
            started += 1;
            let Some(t) = image.topics.get(&m.topic) else { continue };
            let Some(p) = t.partitions.get(&m.partition) else { continue };
            let preferred = m.to.first().copied();
            if m.reason == "leader count" && preferred.is_some_and(|b| p.isr.contains(&b) && image.can_lead(b)) {
                records.push(MetadataRecord::PartitionChange {
                    topic_id: t.topic_id,
                    partition: m.partition,
                    leader: strom_raft::LeaderChange::Elect(preferred.unwrap_or(-1)),
                    isr: None,
                    replicas: None,
                });
            }
        }
        if records.is_empty() {
            return;
        }
        match self.propose(quorum, records).await {
            Ok(index) => {
                self.moves_started.fetch_add(started, Ordering::AcqRel);
                tracing::info!(moves = started, elections, index, "balancer moves started");
            }
            Err(e) => tracing::warn!(error = %e, "balancer moves failed"),
        }
    }

    /// Completes every reassignment whose target replicas are all in sync
    /// (also those an earlier controller started).
    /// Whether any did.
    async fn complete_reassignments(&self, quorum: &Quorum) -> bool {
        if reassignment::completions(&quorum.image()).is_empty() {
            return false;
        }
        let Ok(_guard) = self.decision_lock(quorum).await else { return false };
        let records = reassignment::completions(&quorum.image());
        let moved = records.len();
        match self.propose(quorum, records).await {
            Ok(index) => {
                tracing::info!(partitions = moved, index, "reassignments completed");
                moved > 0
            }
            Err(e) => {
                tracing::warn!(error = %e, "completing reassignments failed");
                false
            }
        }
    }

    /// Moves leadership back to preferred replicas that are active ISR
    /// members, every `leader.imbalance.check.interval.seconds`, when
    /// `auto.leader.rebalance.enable` is set.
    async fn maybe_rebalance(&self, quorum: &Quorum) {
        if !self.settings.bool("auto.leader.rebalance.enable") {
            return;
        }
        let every = Duration::from_secs(self.settings.u64("leader.imbalance.check.interval.seconds"));
        {
            let mut last = self.last_rebalance.lock().unwrap_or_else(|e| e.into_inner());
            if last.elapsed() < every {
                return;
            }
            *last = Instant::now();
        }
        let Ok(_guard) = self.decision_lock(quorum).await else { return };
        let image = quorum.image();
        let records = election::preferred_elections(&image);
        if records.is_empty() {
            return;
        }
        let moved = records.len();
        match self.propose(quorum, records).await {
            Ok(_) => tracing::info!(partitions = moved, "leaders moved back to preferred replicas"),
            Err(e) => tracing::warn!(error = %e, "preferred leader election failed"),
        }
    }
}

/// A proposal (or voter change) that was not committed, as a client sees it.
fn propose_error(e: ProposeError) -> ApiError {
    let code = match e {
        ProposeError::NotLeader { .. } => ErrorCode::NotController,
        ProposeError::Timeout(_) => ErrorCode::RequestTimedOut,
        ProposeError::Fatal(_) => ErrorCode::UnknownServerError,
    };
    ApiError::new(code, e.to_string())
}

/// `record`, then the leadership moves it calls for: a broker entering
/// maintenance or being drained leads nothing another ISR member can lead.
fn with_leaderships_moved(image: &MetadataImage, record: MetadataRecord) -> Vec<MetadataRecord> {
    let mut after = image.clone();
    if let Err(e) = after.apply(&record) {
        tracing::warn!(error = %e, "broker change does not apply");
    }
    let broker = match &record {
        MetadataRecord::BrokerMaintenance { broker_id, on: true }
        | MetadataRecord::BrokerDecommission { broker_id, on: true } => Some(*broker_id),
        _ => None,
    };
    let mut records = vec![record];
    if let Some(b) = broker {
        records.extend(election::leaderships_away_from(&after, b));
    }
    records
}

fn fence_records(image: &MetadataImage, broker_id: i32, unclean: bool) -> Vec<MetadataRecord> {
    let mut records = vec![MetadataRecord::BrokerRegistrationChange { broker_id, state: BrokerState::Fenced }];
    records.extend(election::elections_without(image, broker_id, unclean));
    records
}

fn log_admin_write(request: &ControllerRequest, index: u64) {
    match request {
        ControllerRequest::CreateTopic { name, partitions, replication_factor, .. } => {
            tracing::info!(topic = %name, partitions, replication_factor, index, "topic created")
        }
        ControllerRequest::CreateTopicAssigned { name, assignment, .. } => {
            tracing::info!(topic = %name, ?assignment, index, "topic created with the replicas given")
        }
        ControllerRequest::DeleteTopic { name } => tracing::info!(topic = %name, index, "topic deleted"),
        ControllerRequest::CreatePartitions { name, count } => {
            tracing::info!(topic = %name, count, index, "partitions added")
        }
        ControllerRequest::AlterConfigs { name, changes } => {
            tracing::info!(topic = %name, keys = ?changes.keys().collect::<Vec<_>>(), index, "topic configs changed")
        }
        ControllerRequest::AlterBrokerConfigs { broker_id, changes } => {
            tracing::info!(?broker_id, ?changes, index, "dynamic broker configs changed")
        }
        ControllerRequest::ElectLeader { topic, partition, election } => {
            tracing::info!(%topic, partition, ?election, index, "leader moved by operator election")
        }
        ControllerRequest::Reassign { topic, partition, target: Some(target) } => {
            tracing::info!(%topic, partition, ?target, index, "reassignment started")
        }
        ControllerRequest::Reassign { topic, partition, target: None } => {
            tracing::info!(%topic, partition, index, "reassignment cancelled")
        }
        ControllerRequest::SetMaintenance { broker_id, on } => {
            tracing::info!(broker_id, maintenance = on, index, "broker maintenance changed")
        }
        ControllerRequest::Decommission { broker_id, on } => {
            tracing::info!(broker_id, draining = on, index, "broker decommission changed")
        }
        ControllerRequest::Unregister { broker_id } => tracing::info!(broker_id, index, "broker unregistered"),
        ControllerRequest::AlterAcls { add, remove } => {
            tracing::info!(added = ?add, removed = ?remove, index, "ACLs changed")
        }
        ControllerRequest::AlterClientQuotas { changes } => {
            tracing::info!(?changes, index, "client quotas changed")
        }
        ControllerRequest::AlterScramCredentials { changes } => {
            // Names and mechanisms only: never a key.
            let changes: Vec<_> = changes.iter().map(|(user, m, c)| (user, m, c.is_some())).collect();
            tracing::info!(?changes, index, "SCRAM credentials changed (user, mechanism, set)")
        }
        _ => {}
    }
}

fn new_cluster_id() -> String {
    let id: u128 = rand::random();
    TopicId(id).to_string()
}
