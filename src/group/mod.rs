//! The consumer-group coordinator. Groups are spread over the partitions of
//! `__consumer_offsets` by a hash of their id; the broker leading a partition
//! coordinates its groups. Group metadata and committed offsets are written
//! to that partition as records and answered once the high watermark passes
//! them, so they are replicated like any data. When this broker becomes the
//! leader of such a partition it reads the partition back into memory
//! (requests meanwhile get COORDINATOR_LOAD_IN_PROGRESS); when it stops
//! leading it drops those groups (NOT_COORDINATOR).
//!
//! The state machine of one group is pure and lives in `state.rs`; this
//! module holds the groups, does the writing and loading, and runs the timers.

pub mod assignment;
pub mod consumer;
pub mod records;
pub mod state;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use kafka_protocol::records::{Record, RecordBatchDecoder};
use kafka_protocol::ResponseError;
use tokio::sync::{oneshot, watch};

use crate::clock::wall_ms;
use crate::config::Settings;
use crate::log::compaction::{encode_batch, plain_record};
use crate::replication::partition::{CommitWait, PartitionError};
use crate::replication::ReplicaManager;
use consumer::classic::ClassicJoin;
use consumer::{ConsumerGroup, ConsumerLimits, Heartbeat, HeartbeatAnswer, Topics};
use records::{GroupValue, OffsetValue, RecordKey};
pub use state::{
    CommitAuth, Committed, Group, GroupLimits, GroupState, JoinRequest, JoinResult, SyncRequest, SyncResult,
};

pub const OFFSETS_TOPIC: &str = "__consumer_offsets";

/// How often session and rebalance timeouts are checked.
const TICK: Duration = Duration::from_millis(100);
/// Bytes read per step while loading a partition.
const LOAD_CHUNK: usize = 1 << 20;

/// The `__consumer_offsets` partition of `group`: Kafka's
/// `abs(groupId.hashCode) % partitions`, with Java's string hash, so a group
/// lands on the same partition as it would in Kafka.
pub fn partition_for(group: &str, partitions: i32) -> i32 {
    let mut h: i32 = 0;
    for unit in group.encode_utf16() {
        h = h.wrapping_mul(31).wrapping_add(i32::from(unit));
    }
    // Kafka's `Utils.abs`: the absolute value, and 0 for i32::MIN.
    h.checked_abs().unwrap_or(0) % partitions.max(1)
}

/// A topic name and partition index.
pub type TopicPartition = (String, i32);

/// The groups of one `__consumer_offsets` partition led here.
#[derive(Debug)]
struct Shard {
    leader_epoch: i32,
    loaded: bool,
    groups: HashMap<String, Group>,
    /// Transactions whose marker reached the partition while it was being
    /// loaded (producer id, committed), applied once it is: the load may
    /// have read the log before the marker was written.
    ended_while_loading: Vec<(i64, bool)>,
}

/// Records appended to a partition of `__consumer_offsets` as its leader,
/// not yet known to be committed.
#[derive(Debug, Clone, Copy)]
struct Appended {
    partition: i32,
    base_offset: i64,
    last_offset: i64,
    leader_epoch: i32,
}

/// Group metadata appended for a group, waiting for the high watermark.
#[derive(Debug)]
struct PendingStore {
    partition: i32,
    group_id: String,
    /// The generation whose leader's assignment this is, if it is one.
    generation: Option<i32>,
    appended: Result<Appended, ResponseError>,
}

/// One partition's commit as a handler hands it in.
#[derive(Debug, Clone)]
pub struct OffsetCommit {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
}

/// A group as ListGroups and the admin list show it.
#[derive(Debug, Clone)]
pub struct GroupListing {
    pub group_id: String,
    pub protocol_type: String,
    /// Kafka's name of its state, in its protocol.
    pub state: &'static str,
    /// `classic` or `consumer`.
    pub group_type: &'static str,
}

/// A member as DescribeGroups and the admin view show it.
#[derive(Debug, Clone)]
pub struct MemberDescription {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub metadata: Bytes,
    pub assignment: Bytes,
}

#[derive(Debug, Clone)]
pub struct GroupDescription {
    pub group_id: String,
    pub state: GroupState,
    /// Kafka's name of its state, in its protocol.
    pub state_name: &'static str,
    /// The group's state under the consumer protocol, if it uses it.
    pub consumer: Option<ConsumerGroup>,
    pub generation: i32,
    pub protocol_type: String,
    pub protocol: String,
    pub members: Vec<MemberDescription>,
    pub offsets: BTreeMap<(String, i32), i64>,
}

pub struct GroupCoordinator {
    settings: Arc<Settings>,
    replicas: Arc<ReplicaManager>,
    shards: Mutex<HashMap<i32, Shard>>,
    limits: GroupLimits,
}

fn write_error(e: &PartitionError) -> ResponseError {
    // Kafka's mapping for group writes: clients retry the coordinator lookup.
    match e {
        PartitionError::NotLeader | PartitionError::FencedLeaderEpoch { .. } => ResponseError::NotCoordinator,
        PartitionError::NotEnoughReplicas { .. } => ResponseError::CoordinatorNotAvailable,
        PartitionError::Log(crate::log::LogError::MessageTooLarge { .. }) => ResponseError::InvalidCommitOffsetSize,
        _ => ResponseError::UnknownServerError,
    }
}

impl GroupCoordinator {
    pub fn new(settings: Arc<Settings>, replicas: Arc<ReplicaManager>) -> Self {
        let ms = |k: &str, d: u64| Duration::from_millis(settings.int(k).map_or(d, |v| v.max(0) as u64));
        let limits = GroupLimits {
            min_session_timeout: ms("group.min.session.timeout.ms", 6000),
            max_session_timeout: ms("group.max.session.timeout.ms", 1_800_000),
            max_size: settings.int("group.max.size").map_or(usize::MAX, |v| v.max(1) as usize),
            initial_rebalance_delay: ms("group.initial.rebalance.delay.ms", 3000),
        };
        GroupCoordinator { settings, replicas, shards: Mutex::new(HashMap::new()), limits }
    }

    fn shards(&self) -> MutexGuard<'_, HashMap<i32, Shard>> {
        self.shards.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many partitions `__consumer_offsets` has (or will have).
    fn partition_count(&self, image: &strom_raft::MetadataImage) -> i32 {
        image.topics.get(OFFSETS_TOPIC).map_or_else(
            || self.settings.int("offsets.topic.num.partitions").unwrap_or(50) as i32,
            |t| t.partitions.len() as i32,
        )
    }

    /// The partition coordinating `group`, given the current metadata.
    pub fn partition_of(&self, image: &strom_raft::MetadataImage, group: &str) -> i32 {
        partition_for(group, self.partition_count(image))
    }

    /// Runs `f` on the group (created when `create`), if this broker coordinates it.
    /// `Ok(None)`: the group does not exist. Any metadata the transition asks
    /// to store is appended before the lock is released, so group records
    /// reach the log in the order of the transitions that made them; the wait
    /// for the high watermark happens in the background.
    fn with_group<R>(
        self: &Arc<Self>,
        partition: i32,
        group_id: &str,
        create: bool,
        f: impl FnOnce(&mut Group) -> R,
    ) -> Result<Option<R>, ResponseError> {
        let Some((result, consumer_store)) = self.with_group_unwaited(partition, group_id, create, f)? else {
            return Ok(None);
        };
        if let Some(appended) = consumer_store {
            self.finish_consumer_store(group_id, appended);
        }
        Ok(Some(result))
    }

    /// [`Self::with_group`], handing back the append of a consumer-protocol
    /// group's state for the caller to wait on.
    fn with_group_unwaited<R>(
        self: &Arc<Self>,
        partition: i32,
        group_id: &str,
        create: bool,
        f: impl FnOnce(&mut Group) -> R,
    ) -> Result<Option<(R, Option<ConsumerAppend>)>, ResponseError> {
        let (result, store, consumer_store) = {
            let mut shards = self.shards();
            let shard = loaded_shard(&mut shards, partition)?;
            if !shard.groups.contains_key(group_id) {
                if !create {
                    return Ok(None);
                }
                shard.groups.insert(group_id.to_string(), Group::new(group_id, wall_ms()));
            }
            let Some(group) = shard.groups.get_mut(group_id) else { return Ok(None) };
            let result = f(group);
            let store = self.append_group(partition, group);
            let consumer_store = self.append_consumer(partition, group);
            if group.is_unused() {
                shard.groups.remove(group_id);
            }
            (result, store, consumer_store)
        };
        if let Some(store) = store {
            self.finish_store(store);
        }
        Ok(Some((result, consumer_store)))
    }

    /// Appends a consumer-protocol group's state if it changed since it was
    /// last stored, or its tombstone once the group stopped being one. Called
    /// with the shards lock held, like [`Self::append_group`].
    fn append_consumer(&self, partition: i32, group: &mut Group) -> Option<Result<Appended, ResponseError>> {
        let key = RecordKey::ConsumerGroup { group: group.id.clone() }.encode();
        if std::mem::take(&mut group.consumer_dropped) {
            return Some(self.append(partition, vec![(key, None)]));
        }
        let c = group.consumer.as_mut().filter(|c| c.dirty)?;
        c.dirty = false;
        Some(match serde_json::to_vec(c) {
            Ok(value) => self.append(partition, vec![(key, Some(Bytes::from(value)))]),
            Err(e) => {
                tracing::error!(group = %group.id, error = %e, "cannot encode a consumer group");
                Err(ResponseError::UnknownServerError)
            }
        })
    }

    /// Waits in the background for a consumer group's stored state to be committed.
    fn finish_consumer_store(self: &Arc<Self>, group_id: &str, appended: Result<Appended, ResponseError>) {
        let (this, group_id) = (self.clone(), group_id.to_string());
        tokio::spawn(async move {
            let result = match appended {
                Ok(a) => this.await_commit(a).await.map(|_| ()),
                Err(e) => Err(e),
            };
            if let Err(e) = result {
                tracing::warn!(group = %group_id, error = ?e, "storing consumer group state failed");
            }
        });
    }

    /// The consumer protocol's settings (`group.consumer.*`).
    fn consumer_limits(&self) -> ConsumerLimits {
        let ms = |k: &str, d: u64| Duration::from_millis(self.settings.int(k).map_or(d, |v| v.max(1) as u64));
        let assignors: Vec<String> = self
            .settings
            .get("group.consumer.assignors")
            .unwrap_or_else(|| "uniform,range".to_string())
            .split(',')
            .map(|a| a.trim().to_string())
            .filter(|a| consumer::assignor::KNOWN.contains(&a.as_str()))
            .collect();
        ConsumerLimits {
            session_timeout: ms("group.consumer.session.timeout.ms", 45_000),
            heartbeat_interval: ms("group.consumer.heartbeat.interval.ms", 5_000),
            assignors: if assignors.is_empty() { vec!["uniform".to_string()] } else { assignors },
            max_size: self.settings.int("group.consumer.max.size").map_or(usize::MAX, |v| v.max(1) as usize),
        }
    }

    /// `group.consumer.migration.policy` (Kafka's): whether a classic group
    /// with members converts when a member of the consumer protocol joins
    /// (upgrade), and whether a consumer group left with classic members only
    /// converts back (downgrade).
    fn migration_policy(&self) -> (bool, bool) {
        match self.settings.get("group.consumer.migration.policy").as_deref() {
            Some("disabled") => (false, false),
            Some("upgrade") => (true, false),
            Some("downgrade") => (false, true),
            _ => (true, true),
        }
    }

    /// ConsumerGroupHeartbeat (KIP-848): the member's transition, stored and
    /// committed before it is answered, as Kafka does, so a member never acts
    /// on an epoch or assignment a new coordinator would not know.
    pub async fn consumer_heartbeat(
        self: &Arc<Self>,
        partition: i32,
        group_id: &str,
        hb: Heartbeat,
        topics: &Topics,
    ) -> Result<HeartbeatAnswer, ResponseError> {
        let limits = self.consumer_limits();
        let (upgrade, downgrade) = self.migration_policy();
        let now = Instant::now();
        let (answer, store, appended) = {
            let mut shards = self.shards();
            let shard = loaded_shard(&mut shards, partition)?;
            if !shard.groups.contains_key(group_id) {
                if hb.member_epoch != consumer::JOIN_EPOCH {
                    return Err(ResponseError::UnknownMemberId);
                }
                shard.groups.insert(group_id.to_string(), Group::new(group_id, wall_ms()));
            }
            let Some(g) = shard.groups.get_mut(group_id) else { return Err(ResponseError::UnknownMemberId) };
            // An empty classic group (offsets only) becomes a consumer group
            // once a member joins it; one with members is taken over with
            // them (KIP-848's online upgrade), if the policy allows.
            let converting = g.consumer.is_none();
            let upgrading = converting && !(g.members.is_empty() && g.state == GroupState::Empty);
            if upgrading {
                if hb.member_epoch != consumer::JOIN_EPOCH {
                    return Err(ResponseError::UnknownMemberId);
                }
                if !(upgrade && g.can_upgrade()) {
                    return Err(ResponseError::GroupIdNotFound);
                }
            }
            let mut c = match g.consumer.take() {
                Some(c) => c,
                None if upgrading => {
                    let (members, generation) = g.members_to_hand_over();
                    ConsumerGroup::from_classic(members, generation, topics, now)
                }
                None => ConsumerGroup::default(),
            };
            let epoch = c.assignment_epoch;
            let answer = c.heartbeat(hb, topics, &limits, now, consumer::new_member_id);
            if c.assignment_epoch != epoch {
                tracing::info!(
                    group = %group_id,
                    epoch = c.assignment_epoch,
                    members = c.members.len(),
                    assignor = c.assignor.as_deref().unwrap_or_default(),
                    topics = ?c.topics_seen.keys().collect::<Vec<_>>(),
                    "consumer group target assignment"
                );
            }
            if !(converting && answer.is_err()) {
                if upgrading {
                    tracing::info!(
                        group = %group_id,
                        classic_members = g.members.len(),
                        generation = g.generation,
                        "classic group converted to the consumer protocol: a member of it joined"
                    );
                    g.hand_over(wall_ms());
                }
                g.consumer = Some(c);
            }
            downgrade_if_all_classic(g, downgrade, now, wall_ms());
            g.sync_consumer_state(wall_ms());
            let store = self.append_group(partition, g);
            let appended = self.append_consumer(partition, g);
            if g.is_unused() {
                shard.groups.remove(group_id);
            }
            (answer, store, appended)
        };
        if let Some(store) = store {
            self.finish_store(store);
        }
        if let Some(appended) = appended {
            self.await_commit(appended?).await?;
        }
        answer
    }

    /// Appends the group metadata a transition asked to store, if any. Called
    /// with the shards lock held: see [`GroupCoordinator::append`].
    fn append_group(&self, partition: i32, group: &mut Group) -> Option<PendingStore> {
        let value = group.take_persist()?;
        let key = RecordKey::Group { group: group.id.clone() };
        let appended = self.append(partition, vec![(key.encode(), Some(value.encode()))]);
        Some(PendingStore { partition, group_id: group.id.clone(), generation: group.awaiting_store, appended })
    }

    /// Waits in the background for stored group metadata to be committed; a
    /// leader's assignment (generation `Some`) is then handed to its members.
    fn finish_store(self: &Arc<Self>, store: PendingStore) {
        let this = self.clone();
        tokio::spawn(async move {
            let PendingStore { partition, group_id, generation, appended } = store;
            let result = match appended {
                Ok(a) => this.await_commit(a).await.map(|_| ()),
                Err(e) => Err(e),
            };
            if let Err(e) = result {
                tracing::warn!(group = %group_id, error = ?e, "storing group metadata failed");
            }
            let Some(generation) = generation else { return };
            let next = {
                let mut shards = this.shards();
                let Some(g) = shards.get_mut(&partition).and_then(|s| s.groups.get_mut(&group_id)) else { return };
                g.stored(generation, result, Instant::now(), wall_ms());
                if g.state == GroupState::Stable {
                    tracing::info!(group = %group_id, generation, members = g.members.len(), "group stable");
                }
                this.append_group(partition, g)
            };
            if let Some(next) = next {
                this.finish_store(next);
            }
        });
    }

    /// Appends `(key, value)` records to a partition of `__consumer_offsets`
    /// as its leader, without waiting for the high watermark.
    ///
    /// Synchronous on purpose: every caller appends while it holds the shards
    /// lock, in the same critical section as the transition or check that
    /// decided the write, so the log holds a group's records in the order
    /// they were decided (and the last record written is the newest). An
    /// OffsetCommit is checked and appended before its handler first waits.
    fn append(&self, partition: i32, records: Vec<(Bytes, Option<Bytes>)>) -> Result<Appended, ResponseError> {
        self.append_as(partition, records, None)
    }

    /// [`Self::append`], as one transactional batch of `producer` (id,
    /// epoch) when given: offsets a transaction commits (TxnOffsetCommit),
    /// which its marker in this partition later commits or aborts.
    fn append_as(
        &self,
        partition: i32,
        records: Vec<(Bytes, Option<Bytes>)>,
        producer: Option<(i64, i16)>,
    ) -> Result<Appended, ResponseError> {
        let p = self.replicas.get(OFFSETS_TOPIC, partition).ok_or(ResponseError::NotCoordinator)?;
        let now = wall_ms();
        let batch: Vec<Record> = records
            .into_iter()
            .enumerate()
            .map(|(i, (key, value))| {
                let record = plain_record(i as i64, Some(key), value, now);
                match producer {
                    Some((producer_id, producer_epoch)) => {
                        Record { transactional: true, producer_id, producer_epoch, ..record }
                    }
                    None => record,
                }
            })
            .collect();
        let buf = encode_batch(batch).ok_or(ResponseError::UnknownServerError)?;
        let appended = p.append_as_leader(&buf, true).map_err(|e| write_error(&e))?;
        Ok(Appended {
            partition,
            base_offset: appended.base_offset,
            last_offset: appended.last_offset,
            leader_epoch: appended.leader_epoch,
        })
    }

    /// Waits until the high watermark passes appended records; the log offset
    /// of the first one.
    async fn await_commit(&self, appended: Appended) -> Result<i64, ResponseError> {
        let p = self.replicas.get(OFFSETS_TOPIC, appended.partition).ok_or(ResponseError::NotCoordinator)?;
        let timeout =
            Duration::from_millis(self.settings.int("offsets.commit.timeout.ms").unwrap_or(5000).max(1) as u64);
        match p.wait_for_commit(appended.last_offset, appended.leader_epoch, timeout).await {
            CommitWait::Committed => Ok(appended.base_offset),
            CommitWait::TimedOut => Err(ResponseError::CoordinatorNotAvailable),
            CommitWait::NotLeader => Err(ResponseError::NotCoordinator),
        }
    }

    /// Follows leadership of `__consumer_offsets` partitions and runs the
    /// session, rebalance and offset-retention timers until `shutdown`.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut roles = self.replicas.subscribe();
        let mut tick = tokio::time::interval(TICK);
        let retention_every = Duration::from_millis(
            self.settings.int("offsets.retention.check.interval.ms").unwrap_or(600_000).max(100) as u64,
        );
        let mut retention = tokio::time::interval(retention_every);
        for t in [&mut tick, &mut retention] {
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        }
        self.follow_leadership();
        loop {
            tokio::select! {
                changed = roles.changed() => {
                    if changed.is_err() { break }
                    self.follow_leadership();
                }
                _ = tick.tick() => self.tick(),
                _ = retention.tick() => self.expire_offsets().await,
                _ = shutdown.changed() => break,
            }
        }
    }

    /// Loads the partitions newly led here and drops the ones no longer led.
    fn follow_leadership(self: &Arc<Self>) {
        let led: HashMap<i32, i32> = self
            .replicas
            .all()
            .into_iter()
            .filter(|p| p.topic == OFFSETS_TOPIC && p.is_leader())
            .map(|p| (p.index, p.leader_epoch()))
            .collect();
        let mut to_load = Vec::new();
        {
            let mut shards = self.shards();
            shards.retain(|index, shard| {
                let keep = led.get(index) == Some(&shard.leader_epoch);
                if !keep {
                    tracing::info!(
                        partition = index,
                        groups = shard.groups.len(),
                        "no longer coordinating the groups of this partition"
                    );
                    for g in shard.groups.values_mut() {
                        g.abandon();
                    }
                }
                keep
            });
            for (&index, &epoch) in &led {
                if let std::collections::hash_map::Entry::Vacant(e) = shards.entry(index) {
                    e.insert(Shard {
                        leader_epoch: epoch,
                        loaded: false,
                        groups: HashMap::new(),
                        ended_while_loading: Vec::new(),
                    });
                    to_load.push((index, epoch));
                }
            }
        }
        for (index, epoch) in to_load {
            let this = self.clone();
            tokio::spawn(async move { this.load(index, epoch).await });
        }
    }

    /// Reads a partition of `__consumer_offsets` into memory.
    async fn load(self: Arc<Self>, index: i32, epoch: i32) {
        let started = Instant::now();
        let Some(p) = self.replicas.get(OFFSETS_TOPIC, index) else { return };
        let mut groups: HashMap<String, Option<GroupValue>> = HashMap::new();
        let mut consumers: HashMap<String, Option<ConsumerGroup>> = HashMap::new();
        let mut offsets: HashMap<String, BTreeMap<(String, i32), Option<Committed>>> = HashMap::new();
        let mut pending: PendingTxnOffsets = HashMap::new();
        let mut next = 0i64;
        let mut records = 0usize;
        loop {
            let (chunk, end) = match p.read_local(next, LOAD_CHUNK, epoch) {
                Ok(r) => r,
                Err(e) => {
                    tracing::info!(partition = index, error = %e, "loading groups abandoned");
                    return;
                }
            };
            if chunk.is_empty() {
                break;
            }
            let mut buf = chunk;
            while buf.remaining() > 0 {
                let set = match RecordBatchDecoder::decode(&mut buf) {
                    Ok(set) => set,
                    Err(e) => {
                        tracing::error!(partition = index, offset = next, error = %e, "unreadable batch in __consumer_offsets; skipping the rest of the chunk");
                        break;
                    }
                };
                for r in set.records {
                    next = next.max(r.offset + 1);
                    if r.control {
                        let commit = r.key.as_deref().and_then(crate::log::txn::marker_commits);
                        if let Some(commit) = commit {
                            end_loaded_txn(&mut offsets, &mut pending, r.producer_id, commit);
                        }
                        continue;
                    }
                    records += 1;
                    if r.transactional && r.producer_id >= 0 {
                        apply_loaded_txn(&mut pending, &r);
                    } else {
                        apply_loaded(&mut groups, &mut consumers, &mut offsets, &r);
                    }
                }
            }
            if next >= end {
                break;
            }
            tokio::task::yield_now().await;
        }
        let now = Instant::now();
        let now_ms = wall_ms();
        let mut loaded: HashMap<String, Group> = HashMap::new();
        for (id, value) in groups {
            if let Some(value) = value {
                loaded.insert(id.clone(), Group::from_stored(&id, &value, now, now_ms));
            }
        }
        for (id, state) in consumers {
            if let Some(state) = state {
                let group = loaded.entry(id.clone()).or_insert_with(|| Group::new(&id, now_ms));
                group.consumer = Some(state.restored(now));
                group.sync_consumer_state(now_ms);
            }
        }
        for (id, commits) in offsets {
            let group = loaded.entry(id.clone()).or_insert_with(|| Group::new(&id, now_ms));
            for ((topic, partition), c) in commits {
                if let Some(c) = c {
                    group.apply_offset(&topic, partition, c);
                }
            }
        }
        for (producer_id, commits) in pending {
            for (group, topic, partition, c) in commits {
                let g = loaded.entry(group.clone()).or_insert_with(|| Group::new(&group, now_ms));
                g.add_pending_txn_offset(producer_id, &topic, partition, c);
            }
        }
        loaded.retain(|_, g| !g.is_unused());
        let mut shards = self.shards();
        if let Some(shard) = shards.get_mut(&index).filter(|s| s.leader_epoch == epoch && !s.loaded) {
            let millis = started.elapsed().as_millis() as u64;
            if records > 0 {
                tracing::info!(
                    partition = index,
                    leader_epoch = epoch,
                    groups = loaded.len(),
                    records,
                    millis,
                    "loaded consumer groups"
                );
            } else {
                tracing::debug!(partition = index, leader_epoch = epoch, "coordinating an empty partition");
            }
            shard.groups = loaded;
            for (producer_id, commit) in std::mem::take(&mut shard.ended_while_loading) {
                shard.groups.values_mut().for_each(|g| g.end_txn(producer_id, commit));
            }
            shard.groups.retain(|_, g| !g.is_unused());
            shard.loaded = true;
        }
    }

    fn tick(self: &Arc<Self>) {
        let now = Instant::now();
        let now_ms = wall_ms();
        let mut stores = Vec::new();
        let mut consumer_stores = Vec::new();
        {
            let mut shards = self.shards();
            let consumers = shards.values().any(|s| s.groups.values().any(|g| g.consumer.is_some()));
            let limits = consumers.then(|| self.consumer_limits());
            let (_, downgrade) = self.migration_policy();
            for (&index, shard) in shards.iter_mut().filter(|(_, s)| s.loaded) {
                for g in shard.groups.values_mut() {
                    g.tick(now, now_ms);
                    stores.extend(self.append_group(index, g));
                    if let (Some(c), Some(limits)) = (g.consumer.as_mut(), limits.as_ref()) {
                        for member in c.expire(limits, now) {
                            tracing::info!(group = %g.id, member = %member, "consumer group member removed: session or rebalance timeout");
                        }
                        downgrade_if_all_classic(g, downgrade, now, now_ms);
                        g.sync_consumer_state(now_ms);
                        stores.extend(self.append_group(index, g));
                        if let Some(appended) = self.append_consumer(index, g) {
                            consumer_stores.push((g.id.clone(), appended));
                        }
                    }
                }
                // A group that only ever had pending member ids, now lapsed.
                shard.groups.retain(|_, g| !g.is_unused());
            }
        }
        for store in stores {
            self.finish_store(store);
        }
        for (group_id, appended) in consumer_stores {
            self.finish_consumer_store(&group_id, appended);
        }
    }

    /// Drops the offsets of groups empty for longer than `offsets.retention.minutes`,
    /// and groups left with nothing.
    async fn expire_offsets(self: &Arc<Self>) {
        let retention_ms = self.settings.int("offsets.retention.minutes").unwrap_or(10_080).saturating_mul(60_000);
        let now_ms = wall_ms();
        // (partition, group, expired offsets, whether the group goes too, the tombstones appended)
        type Expiry = (i32, String, Vec<(String, i32)>, bool, Result<Appended, ResponseError>);
        let mut work: Vec<Expiry> = Vec::new();
        {
            // Decided and appended in one critical section: no commit of the
            // group is appended between the check and the tombstones.
            let shards = self.shards();
            for (&index, shard) in shards.iter().filter(|(_, s)| s.loaded) {
                for g in shard.groups.values() {
                    let expired = g.expired_offsets(now_ms, retention_ms);
                    let drop_group = g.state == GroupState::Empty && expired.len() == g.offsets.len();
                    if expired.is_empty() && !(drop_group && g.members.is_empty()) {
                        continue;
                    }
                    let mut tombstones: Vec<(Bytes, Option<Bytes>)> = expired
                        .iter()
                        .map(|(t, p)| {
                            (RecordKey::Offset { group: g.id.clone(), topic: t.clone(), partition: *p }.encode(), None)
                        })
                        .collect();
                    if drop_group {
                        if g.consumer.is_some() {
                            tombstones.push((RecordKey::ConsumerGroup { group: g.id.clone() }.encode(), None));
                        }
                        tombstones.push((RecordKey::Group { group: g.id.clone() }.encode(), None));
                    }
                    let appended = self.append(index, tombstones);
                    work.push((index, g.id.clone(), expired, drop_group, appended));
                }
            }
        }
        for (index, id, expired, drop_group, appended) in work {
            let written = match appended {
                Ok(a) => self.await_commit(a).await,
                Err(e) => Err(e),
            };
            match written {
                Ok(base) => {
                    let mut shards = self.shards();
                    if let Some(shard) = shards.get_mut(&index) {
                        if let Some(g) = shard.groups.get_mut(&id) {
                            for (n, (t, p)) in expired.iter().enumerate() {
                                g.remove_offset(t, *p, base + n as i64);
                            }
                            if drop_group && g.state == GroupState::Empty && g.offsets.is_empty() {
                                shard.groups.remove(&id);
                            }
                        }
                    }
                    tracing::info!(group = %id, offsets = expired.len(), group_removed = drop_group, "expired committed offsets");
                }
                Err(e) => tracing::warn!(group = %id, error = ?e, "expiring offsets failed"),
            }
        }
    }

    /// JoinGroup. In a group of the consumer protocol with members, a classic
    /// member joins it (KIP-848's online migration), and is answered once the
    /// group's new state is committed, as a heartbeat of the new protocol is.
    pub async fn join(
        self: &Arc<Self>,
        partition: i32,
        group_id: &str,
        req: JoinRequest,
        topics: impl FnOnce() -> Topics,
    ) -> JoinResult {
        let member_id = req.member_id.clone();
        let (tx, rx) = oneshot::channel();
        let limits = self.limits;
        let consumer_limits = self.consumer_limits();
        let (upgrade, downgrade) = self.migration_policy();
        let now = Instant::now();
        let joined = self.with_group_unwaited(partition, group_id, true, |g| {
            if let Some(c) = g.consumer.as_mut() {
                if !c.members.is_empty() {
                    if !(upgrade || downgrade) || req.protocol_type != "consumer" {
                        return Some(Err(ResponseError::InconsistentGroupProtocol));
                    }
                    let session = Duration::from_millis(req.session_timeout_ms.max(0) as u64);
                    if req.session_timeout_ms < 0
                        || session < limits.min_session_timeout
                        || session > limits.max_session_timeout
                    {
                        return Some(Err(ResponseError::InvalidSessionTimeout));
                    }
                    let join = ClassicJoin {
                        member_id: req.member_id,
                        instance_id: req.instance_id,
                        client_id: req.client_id,
                        client_host: req.client_host,
                        session_timeout_ms: req.session_timeout_ms,
                        rebalance_timeout_ms: req.rebalance_timeout_ms,
                        protocols: req.protocols,
                    };
                    let joined = c.classic_join(join, &topics(), &consumer_limits, now, consumer::new_member_id);
                    g.sync_consumer_state(wall_ms());
                    return Some(joined);
                }
                // An empty one becomes a classic group again.
                g.consumer = None;
                g.consumer_dropped = true;
            }
            g.join(req, tx, &limits, now, wall_ms());
            None
        });
        match joined {
            Ok(Some((Some(classic), appended))) => {
                let committed = match appended {
                    Some(a) => match a {
                        Ok(a) => self.await_commit(a).await.map(|_| ()),
                        Err(e) => Err(e),
                    },
                    None => Ok(()),
                };
                match (classic, committed) {
                    (Ok(j), Ok(())) => JoinResult {
                        error: None,
                        generation: j.generation,
                        protocol_type: Some("consumer".to_string()),
                        protocol: Some(j.protocol),
                        // The broker assigns: every classic member is a follower.
                        leader: String::new(),
                        member_id: j.member_id,
                        members: Vec::new(),
                        skip_assignment: false,
                    },
                    (Err(e), _) | (_, Err(e)) => JoinResult::error(e, &member_id),
                }
            }
            Ok(Some((None, appended))) => {
                if let Some(appended) = appended {
                    self.finish_consumer_store(group_id, appended);
                }
                rx.await.unwrap_or_else(|_| JoinResult::error(ResponseError::NotCoordinator, &member_id))
            }
            Ok(None) => JoinResult::error(ResponseError::NotCoordinator, &member_id),
            Err(e) => JoinResult::error(e, &member_id),
        }
    }

    pub async fn sync(self: &Arc<Self>, partition: i32, group_id: &str, req: SyncRequest<'_>) -> SyncResult {
        let (tx, rx) = oneshot::channel();
        let now = Instant::now();
        let call = self.with_group(partition, group_id, false, |g| match g.consumer.as_mut() {
            Some(c) => Some(
                c.classic_sync(req.member_id, req.instance_id, req.generation, req.protocol_type, req.protocol, now)
                    .map_or_else(SyncResult::error, |(protocol, assigned)| SyncResult {
                        error: None,
                        protocol_type: Some("consumer".to_string()),
                        protocol: Some(protocol),
                        assignment: assignment::encode_assignment(&assigned),
                    }),
            ),
            None => {
                g.sync(req, tx, now);
                None
            }
        });
        match call {
            Ok(Some(Some(classic))) => classic,
            Ok(Some(None)) => rx.await.unwrap_or_else(|_| SyncResult::error(ResponseError::NotCoordinator)),
            Ok(None) => SyncResult::error(ResponseError::UnknownMemberId),
            Err(e) => SyncResult::error(e),
        }
    }

    pub fn heartbeat(
        self: &Arc<Self>,
        partition: i32,
        group_id: &str,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
        topics: impl FnOnce() -> Topics,
    ) -> Result<(), ResponseError> {
        let now = Instant::now();
        let limits = self.consumer_limits();
        self.with_group(partition, group_id, false, |g| match g.consumer.as_mut() {
            Some(c) => c.classic_heartbeat(member_id, instance_id, generation, &topics(), &limits, now),
            None => g.heartbeat(member_id, instance_id, generation, now),
        })?
        .unwrap_or(Err(ResponseError::UnknownMemberId))
    }

    /// Removes members (by member id, or instance id); one result per member.
    pub fn leave(
        self: &Arc<Self>,
        partition: i32,
        group_id: &str,
        members: &[(String, Option<String>)],
        topics: impl FnOnce() -> Topics,
    ) -> Result<Vec<Result<String, ResponseError>>, ResponseError> {
        let now = Instant::now();
        let limits = self.consumer_limits();
        let results = self.with_group(partition, group_id, false, |g| {
            let topics = if g.consumer.is_some() { topics() } else { Topics::new() };
            let results = members
                .iter()
                .map(|(m, i)| match g.consumer.as_mut() {
                    Some(c) => c.classic_leave(m, i.as_deref(), &topics, &limits, now),
                    None => g.leave(m, i.as_deref(), now, wall_ms()),
                })
                .collect::<Vec<_>>();
            g.sync_consumer_state(wall_ms());
            results
        })?;
        Ok(results.unwrap_or_else(|| members.iter().map(|_| Err(ResponseError::UnknownMemberId)).collect()))
    }

    /// Validates and stores offset commits; one error (or none) per commit, in order.
    ///
    /// The check and the append happen before the first await, in one
    /// critical section: a connection that polls this future once per
    /// commit, in arrival order, gets its commits appended in that order
    /// (Kafka applies a connection's requests in order, and a group's commits
    /// in the order they were appended). Only the wait for the high watermark
    /// runs concurrently.
    pub async fn commit(
        self: &Arc<Self>,
        partition: i32,
        group_id: &str,
        auth: CommitAuth<'_>,
        commits: Vec<OffsetCommit>,
    ) -> Result<Vec<Option<ResponseError>>, ResponseError> {
        let now = Instant::now();
        let simple = auth.generation < 0 && auth.member_id.is_empty();
        let max_metadata = self.settings.int("offset.metadata.max.bytes").unwrap_or(4096).max(0) as usize;
        let timestamp = wall_ms();
        let (mut results, to_write, records) = commit_records(group_id, &commits, max_metadata, timestamp);
        let checked = self.with_group(partition, group_id, simple, |g| {
            g.check_commit(&auth, now)?;
            Ok((!records.is_empty()).then(|| self.append(partition, records)))
        })?;
        let appended = match checked {
            None => return Err(ResponseError::IllegalGeneration),
            Some(Err(e)) => return Err(e),
            Some(Ok(None)) => return Ok(results),
            Some(Ok(Some(appended))) => appended,
        };
        let written = match appended {
            Ok(a) => self.await_commit(a).await,
            Err(e) => Err(e),
        };
        match written {
            Ok(base) => {
                // Applied by record offset, not by completion order: a commit
                // answered later but appended earlier never replaces a newer one.
                let _ = self.with_group(partition, group_id, true, |g| {
                    for (n, &i) in to_write.iter().enumerate() {
                        let c = &commits[i];
                        g.apply_offset(
                            &c.topic,
                            c.partition,
                            Committed {
                                offset: c.offset,
                                leader_epoch: c.leader_epoch,
                                metadata: c.metadata.clone(),
                                commit_timestamp: timestamp,
                                record_offset: base + n as i64,
                            },
                        );
                    }
                });
            }
            Err(e) => {
                for &i in &to_write {
                    results[i] = Some(e);
                }
            }
        }
        Ok(results)
    }

    /// Committed offsets of a group: of `partitions`, or all when `None`,
    /// each with whether a transaction not ended yet holds a newer one.
    /// An unknown group has none.
    pub fn fetch_offsets(
        self: &Arc<Self>,
        partition: i32,
        group_id: &str,
        partitions: Option<&[(String, i32)]>,
    ) -> Result<Vec<(TopicPartition, Option<Committed>, bool)>, ResponseError> {
        let found = self.with_group(partition, group_id, false, |g| {
            let row = |k: &TopicPartition, c: Option<Committed>| (k.clone(), c, g.has_pending_txn_offset(&k.0, k.1));
            match partitions {
                Some(wanted) => wanted.iter().map(|k| row(k, g.offsets.get(k).cloned())).collect(),
                None => g.offsets.iter().map(|(k, c)| row(k, Some(c.clone()))).collect::<Vec<_>>(),
            }
        })?;
        Ok(found.unwrap_or_else(|| partitions.unwrap_or_default().iter().map(|k| (k.clone(), None, false)).collect()))
    }

    /// OffsetFetch v9 naming a member: in a consumer-protocol group it must
    /// be a member at that epoch (STALE_MEMBER_EPOCH, UNKNOWN_MEMBER_ID).
    pub fn check_member_epoch(
        self: &Arc<Self>,
        partition: i32,
        group_id: &str,
        member_id: &str,
        epoch: i32,
    ) -> Result<(), ResponseError> {
        let checked = self.with_group(partition, group_id, false, |g| match &g.consumer {
            Some(c) => c.check_member_epoch(member_id, epoch, ResponseError::StaleMemberEpoch),
            None => Ok(()),
        })?;
        checked.unwrap_or(Ok(()))
    }

    /// TxnOffsetCommit: stores offsets a transaction of `producer` (id,
    /// epoch) commits, as a transactional batch; they count as committed
    /// once the transaction's commit marker reaches the group's partition
    /// ([`Self::end_txn`]). One error (or none) per commit, in order.
    pub async fn txn_commit(
        self: &Arc<Self>,
        partition: i32,
        group_id: &str,
        producer: (i64, i16),
        auth: CommitAuth<'_>,
        commits: Vec<OffsetCommit>,
    ) -> Result<Vec<Option<ResponseError>>, ResponseError> {
        let now = Instant::now();
        let simple = auth.generation < 0 && auth.member_id.is_empty();
        let max_metadata = self.settings.int("offset.metadata.max.bytes").unwrap_or(4096).max(0) as usize;
        let timestamp = wall_ms();
        let (results, to_write, records) = commit_records(group_id, &commits, max_metadata, timestamp);
        if records.is_empty() {
            return Ok(results);
        }
        let checked = self.with_group(partition, group_id, simple, |g| {
            g.check_commit(&auth, now)?;
            self.append_as(partition, records, Some(producer))
        })?;
        let appended = checked.ok_or(ResponseError::IllegalGeneration)??;
        let base = self.await_commit(appended).await?;
        let _ = self.with_group(partition, group_id, true, |g| {
            for (n, &i) in to_write.iter().enumerate() {
                let c = &commits[i];
                let committed = Committed {
                    offset: c.offset,
                    leader_epoch: c.leader_epoch,
                    metadata: c.metadata.clone(),
                    commit_timestamp: timestamp,
                    record_offset: base + n as i64,
                };
                g.add_pending_txn_offset(producer.0, &c.topic, c.partition, committed);
            }
        });
        Ok(results)
    }

    /// The transaction of `producer_id` ended in `__consumer_offsets`
    /// partition `partition` (its marker is committed there): the offsets
    /// it committed for the partition's groups become committed, or go.
    pub fn end_txn(&self, partition: i32, producer_id: i64, commit: bool) {
        let mut shards = self.shards();
        let Some(shard) = shards.get_mut(&partition) else { return };
        if !shard.loaded {
            shard.ended_while_loading.push((producer_id, commit));
            return;
        }
        for g in shard.groups.values_mut() {
            g.end_txn(producer_id, commit);
        }
        shard.groups.retain(|_, g| !g.is_unused());
    }

    /// Every group this broker coordinates; an error while any partition is loading.
    pub fn list(&self) -> Result<Vec<GroupListing>, ResponseError> {
        let shards = self.shards();
        if shards.values().any(|s| !s.loaded) {
            return Err(ResponseError::CoordinatorLoadInProgress);
        }
        let mut out: Vec<GroupListing> = shards
            .values()
            .flat_map(|s| s.groups.values())
            .filter(|g| g.state != GroupState::Dead)
            .map(|g| GroupListing {
                group_id: g.id.clone(),
                protocol_type: match &g.consumer {
                    Some(_) => "consumer".to_string(),
                    None => g.protocol_type.clone().unwrap_or_default(),
                },
                state: g.state_name(),
                group_type: g.group_type(),
            })
            .collect();
        out.sort_by(|a, b| a.group_id.cmp(&b.group_id));
        Ok(out)
    }

    /// A group as DescribeGroups shows it; `Ok(None)` if it does not exist.
    pub fn describe(
        self: &Arc<Self>,
        partition: i32,
        group_id: &str,
    ) -> Result<Option<GroupDescription>, ResponseError> {
        self.with_group(partition, group_id, false, |g| GroupDescription {
            group_id: g.id.clone(),
            state: g.state,
            state_name: g.state_name(),
            consumer: g.consumer.clone(),
            generation: g.generation,
            protocol_type: g.protocol_type.clone().unwrap_or_default(),
            protocol: g.protocol.clone().unwrap_or_default(),
            members: g
                .members
                .values()
                .map(|m| MemberDescription {
                    member_id: m.id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    metadata: g
                        .protocol
                        .as_deref()
                        .and_then(|p| m.protocols.iter().find(|(n, _)| n == p))
                        .map(|(_, b)| b.clone())
                        .unwrap_or_default(),
                    assignment: m.assignment.clone(),
                })
                .collect(),
            offsets: g.offsets.iter().map(|(k, c)| (k.clone(), c.offset)).collect(),
        })
    }

    /// Deletes an empty group with its offsets.
    pub async fn delete_group(self: &Arc<Self>, partition: i32, group_id: &str) -> Result<(), ResponseError> {
        // Dead while its tombstones are written: a member joining meanwhile is
        // told to retry, and cannot bring back offsets the log no longer has.
        let appended = self.with_group(partition, group_id, false, |g| match g.state {
            GroupState::Empty => {
                let mut tombstones: Vec<(Bytes, Option<Bytes>)> = g
                    .offsets
                    .keys()
                    .map(|(topic, p)| {
                        let key = RecordKey::Offset { group: g.id.clone(), topic: topic.clone(), partition: *p };
                        (key.encode(), None)
                    })
                    .collect();
                if g.consumer.is_some() {
                    tombstones.push((RecordKey::ConsumerGroup { group: g.id.clone() }.encode(), None));
                }
                tombstones.push((RecordKey::Group { group: g.id.clone() }.encode(), None));
                let appended = self.append(partition, tombstones)?;
                g.state = GroupState::Dead;
                Ok(appended)
            }
            GroupState::Dead => Err(ResponseError::GroupIdNotFound),
            _ => Err(ResponseError::NonEmptyGroup),
        })?;
        let appended = appended.ok_or(ResponseError::GroupIdNotFound)??;
        let written = self.await_commit(appended).await;
        let mut shards = self.shards();
        if let Some(shard) = shards.get_mut(&partition) {
            match written {
                Ok(_) => {
                    shard.groups.remove(group_id);
                    tracing::info!(group = %group_id, "group deleted");
                }
                Err(_) => {
                    if let Some(g) = shard.groups.get_mut(group_id) {
                        g.state = GroupState::Empty;
                    }
                }
            }
        }
        written.map(|_| ())
    }

    /// OffsetDelete: removes committed offsets of topics no member subscribes to.
    pub async fn delete_offsets(
        self: &Arc<Self>,
        partition: i32,
        group_id: &str,
        partitions: &[(String, i32)],
    ) -> Result<Vec<Option<ResponseError>>, ResponseError> {
        // Checked and appended in one critical section, like a commit.
        let planned = self.with_group(partition, group_id, false, |g| {
            let subscribed = g.subscribed_topics();
            if g.state != GroupState::Empty && subscribed.is_none() {
                return Err(ResponseError::NonEmptyGroup);
            }
            let subscribed = subscribed.unwrap_or_default();
            let results: Vec<Option<ResponseError>> = partitions
                .iter()
                .map(|(t, _)| subscribed.contains(t).then_some(ResponseError::GroupSubscribedToTopic))
                .collect();
            let tombstones: Vec<(Bytes, Option<Bytes>)> = partitions
                .iter()
                .zip(&results)
                .filter(|(_, r)| r.is_none())
                .map(|((t, p), _)| {
                    (RecordKey::Offset { group: g.id.clone(), topic: t.clone(), partition: *p }.encode(), None)
                })
                .collect();
            let appended = (!tombstones.is_empty()).then(|| self.append(partition, tombstones)).transpose()?;
            Ok((results, appended))
        })?;
        let (results, appended) = planned.ok_or(ResponseError::GroupIdNotFound)??;
        let Some(appended) = appended else { return Ok(results) };
        let base = self.await_commit(appended).await?;
        let _ = self.with_group(partition, group_id, false, |g| {
            let deleted = partitions.iter().zip(&results).filter(|(_, r)| r.is_none());
            for (n, ((t, p), _)) in deleted.enumerate() {
                g.remove_offset(t, *p, base + n as i64);
            }
        });
        Ok(results)
    }
}

/// The append of a consumer-protocol group's state, to wait on.
type ConsumerAppend = Result<Appended, ResponseError>;

/// KIP-848's downgrade: a group of the consumer protocol left with classic
/// members only (its last member of the new protocol left or timed out)
/// becomes a classic group again, at the newest epoch of its members, and
/// rebalances. The policy may forbid it.
fn downgrade_if_all_classic(g: &mut Group, allowed: bool, now: Instant, now_ms: i64) {
    if !allowed || !g.consumer.as_ref().is_some_and(ConsumerGroup::all_classic) {
        return;
    }
    let Some(c) = g.consumer.take() else { return };
    let generation = c.members.values().map(|m| m.epoch).max().unwrap_or(c.group_epoch);
    let members = c.into_classic();
    tracing::info!(
        group = %g.id,
        members = members.len(),
        generation,
        "consumer group converted back to a classic group: only classic members are left"
    );
    g.consumer_dropped = true;
    g.take_back_members(members, generation, now, now_ms);
}

/// The shard of a `__consumer_offsets` partition coordinated here, once loaded.
fn loaded_shard(shards: &mut HashMap<i32, Shard>, partition: i32) -> Result<&mut Shard, ResponseError> {
    let shard = shards.get_mut(&partition).ok_or(ResponseError::NotCoordinator)?;
    if !shard.loaded {
        return Err(ResponseError::CoordinatorLoadInProgress);
    }
    Ok(shard)
}

/// One answer per commit, the indexes of the commits to write, their records.
type CommitRecords = (Vec<Option<ResponseError>>, Vec<usize>, Vec<(Bytes, Option<Bytes>)>);

/// What an (Txn)OffsetCommit writes: one answer per commit (metadata over
/// `max_metadata` bytes is OFFSET_METADATA_TOO_LARGE), the commits to write,
/// and their records, stamped `timestamp`.
fn commit_records(group_id: &str, commits: &[OffsetCommit], max_metadata: usize, timestamp: i64) -> CommitRecords {
    let results: Vec<Option<ResponseError>> = commits
        .iter()
        .map(|c| (c.metadata.len() > max_metadata).then_some(ResponseError::OffsetMetadataTooLarge))
        .collect();
    let to_write: Vec<usize> = (0..commits.len()).filter(|&i| results[i].is_none()).collect();
    let records = to_write
        .iter()
        .map(|&i| {
            let c = &commits[i];
            let key = RecordKey::Offset { group: group_id.to_string(), topic: c.topic.clone(), partition: c.partition };
            let value = OffsetValue {
                offset: c.offset,
                leader_epoch: c.leader_epoch,
                metadata: c.metadata.clone(),
                commit_timestamp: timestamp,
            };
            (key.encode(), Some(value.encode()))
        })
        .collect();
    (results, to_write, records)
}

/// Offsets of transactions not ended (yet) in a load, by producer id: the
/// group, topic, partition and commit of each.
type PendingTxnOffsets = HashMap<i64, Vec<(String, String, i32, Committed)>>;

/// Notes a load's transactional offset commit (TxnOffsetCommit), pending
/// until its producer's marker.
fn apply_loaded_txn(pending: &mut PendingTxnOffsets, r: &Record) {
    let (Some(key), Some(value)) = (r.key.clone(), r.value.clone()) else { return };
    let (Ok(RecordKey::Offset { group, topic, partition }), Ok(v)) =
        (RecordKey::decode(key), OffsetValue::decode(value))
    else {
        tracing::warn!(offset = r.offset, "unreadable transactional offset commit in __consumer_offsets");
        return;
    };
    let committed = Committed {
        offset: v.offset,
        leader_epoch: v.leader_epoch,
        metadata: v.metadata,
        commit_timestamp: v.commit_timestamp,
        record_offset: r.offset,
    };
    pending.entry(r.producer_id).or_default().push((group, topic, partition, committed));
}

/// A marker in a load: the producer's pending offsets are committed (unless
/// a later commit replaced them already) or dropped.
fn end_loaded_txn(
    offsets: &mut HashMap<String, BTreeMap<(String, i32), Option<Committed>>>,
    pending: &mut PendingTxnOffsets,
    producer_id: i64,
    commit: bool,
) {
    let Some(commits) = pending.remove(&producer_id) else { return };
    if !commit {
        return;
    }
    for (group, topic, partition, c) in commits {
        let slot = offsets.entry(group).or_default().entry((topic, partition)).or_insert(None);
        if slot.as_ref().is_none_or(|existing| existing.record_offset < c.record_offset) {
            *slot = Some(c);
        }
    }
}

/// Folds one record of `__consumer_offsets` into what a load has seen so far.
fn apply_loaded(
    groups: &mut HashMap<String, Option<GroupValue>>,
    consumers: &mut HashMap<String, Option<ConsumerGroup>>,
    offsets: &mut HashMap<String, BTreeMap<(String, i32), Option<Committed>>>,
    r: &Record,
) {
    let Some(key) = r.key.clone() else { return };
    let key = match RecordKey::decode(key) {
        Ok(k) => k,
        Err(e) => {
            tracing::warn!(offset = r.offset, error = %e, "unreadable key in __consumer_offsets");
            return;
        }
    };
    match key {
        RecordKey::Offset { group, topic, partition } => {
            let value = match r.value.clone().map(OffsetValue::decode).transpose() {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(offset = r.offset, error = %e, "unreadable offset commit in __consumer_offsets");
                    return;
                }
            };
            let committed = value.map(|v| Committed {
                offset: v.offset,
                leader_epoch: v.leader_epoch,
                metadata: v.metadata,
                commit_timestamp: v.commit_timestamp,
                record_offset: r.offset,
            });
            offsets.entry(group).or_default().insert((topic, partition), committed);
        }
        RecordKey::Group { group } => match r.value.clone().map(GroupValue::decode).transpose() {
            Ok(Some(v)) => {
                groups.insert(group, Some(v));
            }
            Ok(None) => {
                // A deleted group takes its offsets with it.
                groups.insert(group.clone(), None);
                consumers.remove(&group);
                offsets.remove(&group);
            }
            Err(e) => tracing::warn!(offset = r.offset, error = %e, "unreadable group metadata in __consumer_offsets"),
        },
        RecordKey::ConsumerGroup { group } => {
            let state = r.value.as_ref().map(|v| serde_json::from_slice::<ConsumerGroup>(v)).transpose();
            match state {
                Ok(state) => {
                    consumers.insert(group, state);
                }
                Err(e) => {
                    tracing::warn!(offset = r.offset, error = %e, "unreadable consumer group in __consumer_offsets")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_land_where_kafka_puts_them() {
        // Java: "my-group".hashCode() == -1_906_497_762; Kafka takes the absolute value.
        assert_eq!(partition_for("my-group", 50), 12);
        assert_eq!(partition_for("", 50), 0);
        for g in ["a", "consumer-group-with-a-long-name", "ü-group"] {
            assert!((0..7).contains(&partition_for(g, 7)));
        }
    }

    fn record(offset: i64, key: RecordKey, value: Option<Bytes>) -> Record {
        plain_record(offset, Some(key.encode()), value, 0)
    }

    #[test]
    fn loading_keeps_the_last_commit_and_honours_tombstones() {
        let mut groups = HashMap::new();
        let mut offsets = HashMap::new();
        let commit = |o: i64| {
            Some(OffsetValue { offset: o, leader_epoch: 0, metadata: String::new(), commit_timestamp: 1 }.encode())
        };
        let k = |g: &str, p| RecordKey::Offset { group: g.into(), topic: "t".into(), partition: p };
        for r in [
            record(0, k("a", 0), commit(5)),
            record(1, k("a", 0), commit(9)),
            record(2, k("a", 1), commit(3)),
            record(3, k("a", 1), None),
            record(4, k("b", 0), commit(1)),
            record(5, RecordKey::Group { group: "b".into() }, None),
        ] {
            apply_loaded(&mut groups, &mut HashMap::new(), &mut offsets, &r);
        }
        let a = &offsets["a"];
        assert_eq!(a[&("t".to_string(), 0)].as_ref().map(|c| (c.offset, c.record_offset)), Some((9, 1)));
        assert_eq!(a[&("t".to_string(), 1)], None);
        assert!(!offsets.contains_key("b"), "a group tombstone drops its offsets");
        assert_eq!(groups.get("b"), Some(&None));
    }

    #[test]
    fn loading_applies_transactional_offsets_at_their_commit_marker_only() {
        let mut groups = HashMap::new();
        let mut offsets = HashMap::new();
        let mut pending = HashMap::new();
        let commit = |o: i64| {
            Some(OffsetValue { offset: o, leader_epoch: 0, metadata: String::new(), commit_timestamp: 1 }.encode())
        };
        let k = |p| RecordKey::Offset { group: "g".into(), topic: "t".into(), partition: p };
        let txn = |offset, key, value, producer_id| Record {
            transactional: true,
            producer_id,
            producer_epoch: 0,
            ..record(offset, key, value)
        };
        apply_loaded_txn(&mut pending, &txn(0, k(0), commit(10), 7));
        apply_loaded_txn(&mut pending, &txn(1, k(1), commit(20), 8));
        apply_loaded(&mut groups, &mut HashMap::new(), &mut offsets, &record(2, k(0), commit(5)));
        end_loaded_txn(&mut offsets, &mut pending, 7, true);
        end_loaded_txn(&mut offsets, &mut pending, 8, false);
        let g = &offsets["g"];
        assert_eq!(
            g[&("t".to_string(), 0)].as_ref().map(|c| c.offset),
            Some(5),
            "a plain commit written after the transactional one stays"
        );
        assert!(!g.contains_key(&("t".to_string(), 1)), "an aborted transaction's offsets go");
        apply_loaded_txn(&mut pending, &txn(3, k(1), commit(30), 7));
        end_loaded_txn(&mut offsets, &mut pending, 7, true);
        assert_eq!(offsets["g"][&("t".to_string(), 1)].as_ref().map(|c| (c.offset, c.record_offset)), Some((30, 3)));
        assert!(pending.is_empty());
    }

    #[test]
    fn a_groups_transactional_offsets_wait_for_the_outcome() {
        let mut g = Group::new("g", 0);
        let c = |offset, record_offset| Committed {
            offset,
            leader_epoch: -1,
            metadata: String::new(),
            commit_timestamp: 0,
            record_offset,
        };
        g.add_pending_txn_offset(7, "t", 0, c(10, 1));
        g.add_pending_txn_offset(8, "t", 1, c(20, 2));
        assert!(g.offsets.is_empty() && g.has_pending_txn_offset("t", 0) && !g.is_unused());
        g.end_txn(7, true);
        g.end_txn(8, false);
        assert_eq!(g.offsets.get(&("t".to_string(), 0)).map(|c| c.offset), Some(10));
        assert!(!g.offsets.contains_key(&("t".to_string(), 1)));
        assert!(!g.has_pending_txn_offset("t", 0) && !g.has_pending_txn_offset("t", 1));
    }
}
