//! One consumer group's state machine (Kafka's classic protocol), kept pure:
//! every transition takes the time as an argument, and answers to requests
//! that must wait (JoinGroup until the join phase ends, SyncGroup until the
//! leader's assignment is stored) are parked as oneshot senders and fired by
//! later transitions. No I/O happens here; what must be written to
//! `__consumer_offsets` is handed out through [`Group::take_persist`].
//!
//! States: Empty → PreparingRebalance (a member joins) → CompletingRebalance
//! (every member rejoined, or the rebalance timeout passed) → Stable (the
//! leader's assignment is stored) → PreparingRebalance (a member joins,
//! leaves, changes its subscription or misses its session) …; Dead once deleted.
//!
//! By concern: `membership.rs` (JoinGroup's entry, pending members of
//! KIP-394, static members, Heartbeat, LeaveGroup), `rebalance.rs` (the join
//! and sync phases and their timers), `offsets.rs` (commit checks and the
//! committed offsets in memory).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::ResponseError;
use tokio::sync::oneshot;

use super::consumer::ConsumerGroup;
use super::records::{GroupValue, MemberValue};

mod membership;
mod migration;
mod offsets;
mod rebalance;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
    Dead,
}

impl GroupState {
    /// Kafka's name, as ListGroups, DescribeGroups and the admin API show it.
    pub fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
            GroupState::Dead => "Dead",
        }
    }
}

/// Limits from the broker settings.
#[derive(Debug, Clone, Copy)]
pub struct GroupLimits {
    pub min_session_timeout: Duration,
    pub max_session_timeout: Duration,
    pub max_size: usize,
    pub initial_rebalance_delay: Duration,
}

/// What a JoinGroup asks.
#[derive(Debug, Clone)]
pub struct JoinRequest {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
    /// JoinGroup v4+ (KIP-394): a dynamic member joining without a member id
    /// is given one and must join again with it before it counts.
    pub require_known_member_id: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinedMember {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub metadata: Bytes,
}

/// The answer to a JoinGroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinResult {
    pub error: Option<ResponseError>,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol: Option<String>,
    pub leader: String,
    pub member_id: String,
    /// Every member's metadata for the chosen protocol; for the leader only.
    pub members: Vec<JoinedMember>,
    /// A static leader rejoining a stable group: the assignment stands and
    /// need not be computed again (KIP-814; SyncGroup returns the stored one).
    pub skip_assignment: bool,
}

impl JoinResult {
    pub fn error(error: ResponseError, member_id: &str) -> Self {
        JoinResult {
            error: Some(error),
            generation: -1,
            protocol_type: None,
            protocol: None,
            leader: String::new(),
            member_id: member_id.to_string(),
            members: Vec::new(),
            skip_assignment: false,
        }
    }
}

/// What a SyncGroup asks.
#[derive(Debug, Clone, Default)]
pub struct SyncRequest<'a> {
    pub member_id: &'a str,
    pub instance_id: Option<&'a str>,
    pub generation: i32,
    /// v5+: must match the group's when given.
    pub protocol_type: Option<&'a str>,
    pub protocol: Option<&'a str>,
    /// The leader's assignment: member id → assignment bytes.
    pub assignments: Vec<(String, Bytes)>,
}

/// The answer to a SyncGroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncResult {
    pub error: Option<ResponseError>,
    pub protocol_type: Option<String>,
    pub protocol: Option<String>,
    pub assignment: Bytes,
}

impl SyncResult {
    pub fn error(error: ResponseError) -> Self {
        SyncResult { error: Some(error), protocol_type: None, protocol: None, assignment: Bytes::new() }
    }
}

pub type JoinReply = oneshot::Sender<JoinResult>;
pub type SyncReply = oneshot::Sender<SyncResult>;

#[derive(Debug)]
pub struct Member {
    pub id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout: Duration,
    pub rebalance_timeout: Duration,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
    pub assignment: Bytes,
    /// Last sign of life (join, sync, heartbeat, commit).
    pub last_seen: Instant,
    join_reply: Option<JoinReply>,
    sync_reply: Option<SyncReply>,
}

impl Member {
    fn metadata_for(&self, protocol: &str) -> Bytes {
        self.protocols.iter().find(|(name, _)| name == protocol).map(|(_, m)| m.clone()).unwrap_or_default()
    }

    fn same_protocols(&self, protocols: &[(String, Bytes)]) -> bool {
        self.protocols == protocols
    }
}

/// A committed offset in memory, with where its record sits in the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
    pub commit_timestamp: i64,
    /// Offset of the record in `__consumer_offsets`: a later write wins.
    pub record_offset: i64,
}

/// Who may commit offsets to a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitAuth<'a> {
    pub member_id: &'a str,
    pub instance_id: Option<&'a str>,
    /// The generation, or for a group of the consumer protocol the member epoch.
    pub generation: i32,
    /// The request knows member epochs (OffsetCommit v9+): a wrong one in a
    /// consumer-protocol group is STALE_MEMBER_EPOCH, else ILLEGAL_GENERATION.
    pub member_epochs: bool,
}

#[derive(Debug)]
pub struct Group {
    pub id: String,
    pub state: GroupState,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    pub members: BTreeMap<String, Member>,
    /// group.instance.id → member id of static members.
    pub static_members: HashMap<String, String>,
    /// Member ids given out with MEMBER_ID_REQUIRED (KIP-394) → when they
    /// lapse unless their member joins with them. Not members: a rebalance
    /// never waits for them.
    pending_members: HashMap<String, Instant>,
    /// Members of the current generation that have not sent SyncGroup yet,
    /// and when they are removed if they still have not (Kafka's pending sync).
    pending_sync: BTreeSet<String>,
    sync_deadline: Option<Instant>,
    pub offsets: BTreeMap<(String, i32), Committed>,
    /// Offsets committed in transactions not ended yet (TxnOffsetCommit),
    /// by producer id: they become committed offsets when the producer's
    /// commit marker reaches this group's partition, and go on an abort.
    pub pending_txn_offsets: HashMap<i64, BTreeMap<(String, i32), Committed>>,
    /// When the group entered its current state (ms since the epoch).
    pub state_since_ms: i64,
    /// The join phase ends by this time whatever happens.
    rebalance_deadline: Option<Instant>,
    /// The first rebalance of an empty group waits at least until this time for more members.
    initial_delay_until: Option<Instant>,
    /// The group metadata must be written (generation it is for).
    persist: Option<GroupValue>,
    /// A leader's assignment waiting to be stored, for this generation.
    pub awaiting_store: Option<i32>,
    next_member: u64,
    /// The group under the consumer protocol (KIP-848), if it is one: its
    /// members, epochs and assignments. The classic fields then stay empty,
    /// and `state` is Empty or Stable as it has members or not.
    pub consumer: Option<ConsumerGroup>,
    /// The group was one of the consumer protocol and no longer is: its
    /// stored state needs a tombstone.
    pub consumer_dropped: bool,
}

fn new_member_id(prefix: &str, n: u64) -> String {
    format!("{prefix}-{:016x}{n:x}", rand::random::<u64>())
}

impl Group {
    pub fn new(id: &str, now_ms: i64) -> Self {
        Group {
            id: id.to_string(),
            state: GroupState::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
            static_members: HashMap::new(),
            pending_members: HashMap::new(),
            pending_sync: BTreeSet::new(),
            sync_deadline: None,
            offsets: BTreeMap::new(),
            pending_txn_offsets: HashMap::new(),
            state_since_ms: now_ms,
            rebalance_deadline: None,
            initial_delay_until: None,
            persist: None,
            awaiting_store: None,
            next_member: 0,
            consumer: None,
            consumer_dropped: false,
        }
    }

    /// `classic` or `consumer` (KIP-848), as ListGroups v5 names them.
    pub fn group_type(&self) -> &'static str {
        if self.consumer.is_some() {
            "consumer"
        } else {
            "classic"
        }
    }

    /// The state's name for listings: Kafka's names of either protocol.
    pub fn state_name(&self) -> &'static str {
        match &self.consumer {
            Some(c) if self.state != GroupState::Dead => c.state_name(),
            _ => self.state.name(),
        }
    }

    /// Brings the classic state in line with the consumer group's: Empty
    /// without members, Stable with, so offset expiry and deletion treat it
    /// as they treat a classic group.
    pub fn sync_consumer_state(&mut self, now_ms: i64) {
        let Some(c) = &self.consumer else { return };
        if self.state == GroupState::Dead {
            return;
        }
        let state = if c.members.is_empty() { GroupState::Empty } else { GroupState::Stable };
        self.set_state(state, now_ms);
    }

    /// Rebuilds a group from its stored metadata: a group with members comes
    /// back Stable, and its members get a fresh session from `now`.
    pub fn from_stored(id: &str, value: &GroupValue, now: Instant, now_ms: i64) -> Self {
        let mut g =
            Group::new(id, if value.current_state_timestamp > 0 { value.current_state_timestamp } else { now_ms });
        g.generation = value.generation;
        g.protocol_type = (!value.protocol_type.is_empty()).then(|| value.protocol_type.clone());
        g.protocol = value.protocol.clone();
        g.leader = value.leader.clone();
        for m in &value.members {
            let protocols = match &value.protocol {
                Some(p) => vec![(p.clone(), m.subscription.clone())],
                None => Vec::new(),
            };
            if let Some(instance) = &m.instance_id {
                g.static_members.insert(instance.clone(), m.member_id.clone());
            }
            g.members.insert(
                m.member_id.clone(),
                Member {
                    id: m.member_id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    session_timeout: Duration::from_millis(m.session_timeout_ms.max(0) as u64),
                    rebalance_timeout: Duration::from_millis(m.rebalance_timeout_ms.max(0) as u64),
                    protocol_type: value.protocol_type.clone(),
                    protocols,
                    assignment: m.assignment.clone(),
                    last_seen: now,
                    join_reply: None,
                    sync_reply: None,
                },
            );
        }
        g.state = if g.members.is_empty() { GroupState::Empty } else { GroupState::Stable };
        g
    }

    /// The group metadata as stored.
    pub fn stored_value(&self) -> GroupValue {
        GroupValue {
            protocol_type: self.protocol_type.clone().unwrap_or_default(),
            generation: self.generation,
            protocol: self.protocol.clone(),
            leader: self.leader.clone(),
            current_state_timestamp: self.state_since_ms,
            members: self
                .members
                .values()
                .map(|m| MemberValue {
                    member_id: m.id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    rebalance_timeout_ms: m.rebalance_timeout.as_millis().min(i32::MAX as u128) as i32,
                    session_timeout_ms: m.session_timeout.as_millis().min(i32::MAX as u128) as i32,
                    subscription: self.protocol.as_deref().map(|p| m.metadata_for(p)).unwrap_or_default(),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        }
    }

    /// Nothing ever happened in it (a refused first join, say): not worth keeping.
    pub fn is_unused(&self) -> bool {
        self.state == GroupState::Empty
            && self.generation == 0
            && self.offsets.is_empty()
            && self.pending_txn_offsets.is_empty()
            && self.members.is_empty()
            && self.pending_members.is_empty()
            && self.consumer.as_ref().is_none_or(|c| c.group_epoch == 0)
            && !self.consumer_dropped
    }

    /// Group metadata to be written, if a transition asked for it.
    pub fn take_persist(&mut self) -> Option<GroupValue> {
        self.persist.take()
    }

    fn set_state(&mut self, state: GroupState, now_ms: i64) {
        if self.state != state {
            self.state = state;
            self.state_since_ms = now_ms;
        }
    }

    /// Drops every parked request: its handler answers NOT_COORDINATOR.
    pub fn abandon(&mut self) {
        for m in self.members.values_mut() {
            m.join_reply = None;
            m.sync_reply = None;
        }
    }
}

#[cfg(test)]
mod testing {
    //! What the transition tests of every concern share.
    use super::*;

    pub(super) const LIMITS: GroupLimits = GroupLimits {
        min_session_timeout: Duration::from_millis(100),
        max_session_timeout: Duration::from_secs(600),
        max_size: 10,
        initial_rebalance_delay: Duration::ZERO,
    };

    pub(super) fn join_req(member_id: &str, instance: Option<&str>) -> JoinRequest {
        JoinRequest {
            member_id: member_id.into(),
            instance_id: instance.map(Into::into),
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 30_000,
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), Bytes::from_static(b"meta"))],
            require_known_member_id: false,
        }
    }

    pub(super) fn join(g: &mut Group, req: JoinRequest, now: Instant) -> oneshot::Receiver<JoinResult> {
        let (tx, rx) = oneshot::channel();
        g.join(req, tx, &LIMITS, now, 0);
        rx
    }

    pub(super) fn sync(
        g: &mut Group,
        member: &str,
        gen: i32,
        assign: Vec<(String, Bytes)>,
    ) -> oneshot::Receiver<SyncResult> {
        let (tx, rx) = oneshot::channel();
        let req = SyncRequest { member_id: member, generation: gen, assignments: assign, ..Default::default() };
        g.sync(req, tx, Instant::now());
        rx
    }

    /// A JoinGroup v4+ of a dynamic member: KIP-394's round trip applies.
    pub(super) fn join_req_v4(member_id: &str) -> JoinRequest {
        JoinRequest { require_known_member_id: true, ..join_req(member_id, None) }
    }

    pub(super) fn got<T>(rx: &mut oneshot::Receiver<T>) -> Option<T> {
        rx.try_recv().ok()
    }

    /// Two members joined and synced: the group is Stable at generation 1.
    pub(super) fn stable_pair(now: Instant) -> (Group, String, String) {
        let mut g = Group::new("g", 0);
        let mut a = join(&mut g, join_req("", None), now);
        let a = got(&mut a).expect("a single member completes the join at once");
        assert_eq!((a.generation, a.leader == a.member_id), (1, true));
        // A second member: the group rebalances and waits for the first to rejoin.
        let mut b = join(&mut g, join_req("", None), now);
        assert_eq!(g.state, GroupState::PreparingRebalance);
        assert!(got(&mut b).is_none());
        let mut a2 = join(&mut g, join_req(&a.member_id, None), now);
        let (a2, b) = (got(&mut a2).expect("joined"), got(&mut b).expect("joined"));
        assert_eq!((a2.generation, b.generation), (2, 2));
        assert_eq!(a2.members.len(), 2, "the leader learns every member");
        assert!(b.members.is_empty());
        assert_eq!(g.state, GroupState::CompletingRebalance);
        let mut fs = sync(&mut g, &b.member_id, 2, vec![]);
        assert!(got(&mut fs).is_none(), "a follower waits for the leader");
        let assignments =
            vec![(a2.member_id.clone(), Bytes::from_static(b"A")), (b.member_id.clone(), Bytes::from_static(b"B"))];
        let mut ls = sync(&mut g, &a2.member_id, 2, assignments);
        assert!(got(&mut ls).is_none(), "the assignment is stored first");
        let value = g.take_persist().expect("group metadata to store");
        assert_eq!(value.members.len(), 2);
        g.stored(2, Ok(()), now, 1);
        assert_eq!(g.state, GroupState::Stable);
        assert_eq!(got(&mut ls).expect("synced").assignment, Bytes::from_static(b"A"));
        assert_eq!(got(&mut fs).expect("synced").assignment, Bytes::from_static(b"B"));
        (g, a2.member_id, b.member_id)
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    #[test]
    fn stored_groups_come_back_stable_with_their_assignments() {
        let now = Instant::now();
        let (g, a, b) = stable_pair(now);
        let value = g.stored_value();
        let mut back = Group::from_stored("g", &value, now, 0);
        assert_eq!((back.state, back.generation), (GroupState::Stable, 2));
        assert_eq!(back.heartbeat(&a, None, 2, now), Ok(()));
        let (tx, mut rx) = oneshot::channel();
        back.sync(SyncRequest { member_id: &b, generation: 2, ..Default::default() }, tx, now);
        assert_eq!(got(&mut rx).expect("synced").assignment, Bytes::from_static(b"B"));
    }
}
