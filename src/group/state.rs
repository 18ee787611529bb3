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

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::ResponseError;
use tokio::sync::oneshot;

use super::records::{GroupValue, MemberValue};

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
    pub generation: i32,
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
    pub offsets: BTreeMap<(String, i32), Committed>,
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
            offsets: BTreeMap::new(),
            state_since_ms: now_ms,
            rebalance_deadline: None,
            initial_delay_until: None,
            persist: None,
            awaiting_store: None,
            next_member: 0,
        }
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

    /// Checks a member id and instance id against the group: the error to answer, if any.
    fn check_member(&self, member_id: &str, instance_id: Option<&str>) -> Result<(), ResponseError> {
        if let Some(instance) = instance_id {
            match self.static_members.get(instance) {
                Some(current) if current != member_id => return Err(ResponseError::FencedInstanceId),
                Some(_) => {}
                None => return Err(ResponseError::UnknownMemberId),
            }
        }
        if !self.members.contains_key(member_id) {
            return Err(ResponseError::UnknownMemberId);
        }
        Ok(())
    }

    /// Whether `protocols` can share this group with its members.
    fn supports(&self, protocol_type: &str, protocols: &[(String, Bytes)]) -> bool {
        if protocols.is_empty() || protocol_type.is_empty() {
            return false;
        }
        if self.members.is_empty() {
            return true;
        }
        if self.protocol_type.as_deref() != Some(protocol_type) {
            return false;
        }
        protocols.iter().any(|(name, _)| self.members.values().all(|m| m.protocols.iter().any(|(n, _)| n == name)))
    }

    /// Handles a JoinGroup; the answer arrives on `reply`, now or when the join phase ends.
    pub fn join(&mut self, req: JoinRequest, reply: JoinReply, limits: &GroupLimits, now: Instant, now_ms: i64) {
        let session = Duration::from_millis(req.session_timeout_ms.max(0) as u64);
        if req.session_timeout_ms < 0 || session < limits.min_session_timeout || session > limits.max_session_timeout {
            let _ = reply.send(JoinResult::error(ResponseError::InvalidSessionTimeout, &req.member_id));
            return;
        }
        if self.state == GroupState::Dead {
            let _ = reply.send(JoinResult::error(ResponseError::CoordinatorNotAvailable, &req.member_id));
            return;
        }
        if !self.supports(&req.protocol_type, &req.protocols) {
            let _ = reply.send(JoinResult::error(ResponseError::InconsistentGroupProtocol, &req.member_id));
            return;
        }
        let known_static = req.instance_id.as_ref().and_then(|i| self.static_members.get(i)).cloned();
        if req.member_id.is_empty() {
            if let Some(old_id) = known_static {
                self.replace_static_member(&old_id, req, reply, now, now_ms);
                return;
            }
            if self.members.len() >= limits.max_size {
                let _ = reply.send(JoinResult::error(ResponseError::GroupMaxSizeReached, ""));
                return;
            }
            self.next_member += 1;
            let prefix = req.instance_id.clone().unwrap_or_else(|| req.client_id.clone());
            let id = new_member_id(&prefix, self.next_member);
            self.add_member(id, req, reply, limits, now, now_ms);
            return;
        }
        if let Err(e) = self.check_member(&req.member_id, req.instance_id.as_deref()) {
            let _ = reply.send(JoinResult::error(e, &req.member_id));
            return;
        }
        self.rejoin(req, reply, limits, now, now_ms);
    }

    fn add_member(
        &mut self,
        id: String,
        req: JoinRequest,
        reply: JoinReply,
        limits: &GroupLimits,
        now: Instant,
        now_ms: i64,
    ) {
        if let Some(instance) = &req.instance_id {
            self.static_members.insert(instance.clone(), id.clone());
        }
        if self.members.is_empty() {
            self.protocol_type = Some(req.protocol_type.clone());
        }
        self.members.insert(
            id.clone(),
            Member {
                id: id.clone(),
                instance_id: req.instance_id,
                client_id: req.client_id,
                client_host: req.client_host,
                session_timeout: Duration::from_millis(req.session_timeout_ms.max(0) as u64),
                rebalance_timeout: Duration::from_millis(req.rebalance_timeout_ms.max(0) as u64),
                protocol_type: req.protocol_type,
                protocols: req.protocols,
                assignment: Bytes::new(),
                last_seen: now,
                join_reply: Some(reply),
                sync_reply: None,
            },
        );
        match self.state {
            GroupState::PreparingRebalance => {
                // A new member during the initial delay pushes it back, within the rebalance timeout.
                if let (Some(until), Some(deadline)) = (self.initial_delay_until, self.rebalance_deadline) {
                    let pushed = (now + limits.initial_rebalance_delay).min(deadline);
                    self.initial_delay_until = Some(until.max(pushed));
                }
                self.maybe_complete_join(now, now_ms);
            }
            _ => self.prepare_rebalance(limits, now, now_ms),
        }
    }

    /// A static member rejoining with a new incarnation: it takes over the old
    /// member's place and assignment; the old member id is fenced.
    fn replace_static_member(&mut self, old_id: &str, req: JoinRequest, reply: JoinReply, now: Instant, now_ms: i64) {
        let Some(mut member) = self.members.remove(old_id) else {
            let _ = reply.send(JoinResult::error(ResponseError::UnknownMemberId, ""));
            return;
        };
        self.next_member += 1;
        let prefix = req.instance_id.clone().unwrap_or_default();
        let new_id = new_member_id(&prefix, self.next_member);
        if let Some(old) = member.join_reply.take() {
            let _ = old.send(JoinResult::error(ResponseError::FencedInstanceId, old_id));
        }
        if let Some(old) = member.sync_reply.take() {
            let _ = old.send(SyncResult::error(ResponseError::FencedInstanceId));
        }
        let unchanged = member.same_protocols(&req.protocols);
        member.id = new_id.clone();
        member.client_id = req.client_id;
        member.client_host = req.client_host;
        member.session_timeout = Duration::from_millis(req.session_timeout_ms.max(0) as u64);
        member.rebalance_timeout = Duration::from_millis(req.rebalance_timeout_ms.max(0) as u64);
        member.protocols = req.protocols;
        member.last_seen = now;
        if let Some(instance) = &req.instance_id {
            self.static_members.insert(instance.clone(), new_id.clone());
        }
        let was_leader = self.leader.as_deref() == Some(old_id);
        if was_leader {
            self.leader = Some(new_id.clone());
        }
        self.members.insert(new_id.clone(), member);
        match self.state {
            GroupState::Stable if unchanged => {
                // Nothing changes for the others: answer with the current
                // generation. A leader learns the members, but its SyncGroup
                // gets the stored assignment whatever it computes.
                let mut result = self.join_result_for(&new_id, was_leader);
                result.skip_assignment = was_leader;
                let _ = reply.send(result);
                self.persist = Some(self.stored_value());
            }
            GroupState::PreparingRebalance => {
                if let Some(m) = self.members.get_mut(&new_id) {
                    m.join_reply = Some(reply);
                }
                self.maybe_complete_join(now, now_ms);
            }
            _ => {
                if let Some(m) = self.members.get_mut(&new_id) {
                    m.join_reply = Some(reply);
                }
                let limits = self.limits_from_members();
                self.prepare_rebalance(&limits, now, now_ms);
            }
        }
    }

    fn limits_from_members(&self) -> GroupLimits {
        GroupLimits {
            min_session_timeout: Duration::ZERO,
            max_session_timeout: Duration::MAX,
            max_size: usize::MAX,
            initial_rebalance_delay: Duration::ZERO,
        }
    }

    fn rejoin(&mut self, req: JoinRequest, reply: JoinReply, limits: &GroupLimits, now: Instant, now_ms: i64) {
        let id = req.member_id.clone();
        let is_leader = self.leader.as_deref() == Some(id.as_str());
        let state = self.state;
        let Some(member) = self.members.get_mut(&id) else {
            let _ = reply.send(JoinResult::error(ResponseError::UnknownMemberId, &id));
            return;
        };
        member.last_seen = now;
        let unchanged = member.same_protocols(&req.protocols);
        member.session_timeout = Duration::from_millis(req.session_timeout_ms.max(0) as u64);
        member.rebalance_timeout = Duration::from_millis(req.rebalance_timeout_ms.max(0) as u64);
        member.client_id = req.client_id;
        member.protocols = req.protocols;
        match state {
            GroupState::PreparingRebalance => {
                if let Some(old) = member.join_reply.replace(reply) {
                    let _ = old.send(JoinResult::error(ResponseError::UnknownMemberId, &id));
                }
                self.maybe_complete_join(now, now_ms);
            }
            GroupState::CompletingRebalance | GroupState::Stable if unchanged && !is_leader => {
                // A follower that missed its answer, or rejoins without a change.
                let result = self.join_result_for(&id, false);
                let _ = reply.send(result);
            }
            GroupState::CompletingRebalance if unchanged => {
                let result = self.join_result_for(&id, true);
                let _ = reply.send(result);
            }
            _ => {
                member.join_reply = Some(reply);
                self.prepare_rebalance(limits, now, now_ms);
            }
        }
    }

    fn join_result_for(&self, member_id: &str, with_members: bool) -> JoinResult {
        let protocol = self.protocol.clone();
        JoinResult {
            error: None,
            generation: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol: protocol.clone(),
            leader: self.leader.clone().unwrap_or_default(),
            member_id: member_id.to_string(),
            members: if with_members {
                self.members
                    .values()
                    .map(|m| JoinedMember {
                        member_id: m.id.clone(),
                        instance_id: m.instance_id.clone(),
                        metadata: protocol.as_deref().map(|p| m.metadata_for(p)).unwrap_or_default(),
                    })
                    .collect()
            } else {
                Vec::new()
            },
            skip_assignment: false,
        }
    }

    fn prepare_rebalance(&mut self, limits: &GroupLimits, now: Instant, now_ms: i64) {
        if self.state == GroupState::CompletingRebalance {
            self.fail_pending_syncs(ResponseError::RebalanceInProgress);
        }
        let was_empty = self.state == GroupState::Empty;
        self.awaiting_store = None;
        let longest = self.members.values().map(|m| m.rebalance_timeout).max().unwrap_or_default();
        self.rebalance_deadline = Some(now + longest);
        self.initial_delay_until = (was_empty && !limits.initial_rebalance_delay.is_zero())
            .then(|| (now + limits.initial_rebalance_delay).min(now + longest));
        self.set_state(GroupState::PreparingRebalance, now_ms);
        self.maybe_complete_join(now, now_ms);
    }

    fn fail_pending_syncs(&mut self, error: ResponseError) {
        for m in self.members.values_mut() {
            if let Some(reply) = m.sync_reply.take() {
                let _ = reply.send(SyncResult::error(error));
            }
        }
    }

    /// Ends the join phase once every member has rejoined (and any initial
    /// delay is over), or when the rebalance timeout passes, dropping the
    /// members that did not rejoin.
    fn maybe_complete_join(&mut self, now: Instant, now_ms: i64) {
        if self.state != GroupState::PreparingRebalance {
            return;
        }
        let all_joined = self.members.values().all(|m| m.join_reply.is_some());
        let delay_over = self.initial_delay_until.is_none_or(|until| now >= until);
        let timed_out = self.rebalance_deadline.is_some_and(|d| now >= d);
        if !(timed_out || all_joined && delay_over) {
            return;
        }
        let missing: Vec<String> =
            self.members.values().filter(|m| m.join_reply.is_none()).map(|m| m.id.clone()).collect();
        for id in missing {
            self.remove_member(&id);
        }
        self.initial_delay_until = None;
        self.rebalance_deadline = None;
        self.generation += 1;
        if self.members.is_empty() {
            self.protocol = None;
            self.leader = None;
            self.set_state(GroupState::Empty, now_ms);
            self.persist = Some(self.stored_value());
            return;
        }
        self.protocol = self.select_protocol();
        if !self.leader.as_ref().is_some_and(|l| self.members.contains_key(l)) {
            self.leader = self.members.keys().next().cloned();
        }
        self.set_state(GroupState::CompletingRebalance, now_ms);
        let leader = self.leader.clone().unwrap_or_default();
        let ids: Vec<String> = self.members.keys().cloned().collect();
        for id in ids {
            let result = self.join_result_for(&id, id == leader);
            if let Some(m) = self.members.get_mut(&id) {
                m.last_seen = now;
                m.assignment = Bytes::new();
                if let Some(reply) = m.join_reply.take() {
                    let _ = reply.send(result);
                }
            }
        }
    }

    /// The protocol every member supports that most members prefer (ties: the first member's order).
    fn select_protocol(&self) -> Option<String> {
        let first = self.members.values().next()?;
        let candidates: Vec<&String> = first
            .protocols
            .iter()
            .map(|(n, _)| n)
            .filter(|n| self.members.values().all(|m| m.protocols.iter().any(|(p, _)| p == *n)))
            .collect();
        let mut votes: Vec<(usize, &String)> = candidates.iter().map(|c| (0, *c)).collect();
        for m in self.members.values() {
            if let Some((name, _)) = m.protocols.iter().find(|(n, _)| candidates.contains(&n)) {
                if let Some(v) = votes.iter_mut().find(|(_, c)| *c == name) {
                    v.0 += 1;
                }
            }
        }
        let best = votes.iter().map(|(n, _)| *n).max()?;
        votes.into_iter().find(|(n, _)| *n == best).map(|(_, c)| c.clone())
    }

    fn remove_member(&mut self, id: &str) -> Option<Member> {
        let mut m = self.members.remove(id)?;
        if let Some(instance) = &m.instance_id {
            if self.static_members.get(instance).map(String::as_str) == Some(id) {
                self.static_members.remove(instance);
            }
        }
        if let Some(reply) = m.join_reply.take() {
            let _ = reply.send(JoinResult::error(ResponseError::UnknownMemberId, id));
        }
        if let Some(reply) = m.sync_reply.take() {
            let _ = reply.send(SyncResult::error(ResponseError::UnknownMemberId));
        }
        if self.leader.as_deref() == Some(id) {
            self.leader = None;
        }
        Some(m)
    }

    /// Handles a SyncGroup. When the leader brings the assignment, the group
    /// waits for it to be stored ([`Group::take_persist`], then [`Group::stored`]).
    pub fn sync(&mut self, req: SyncRequest<'_>, reply: SyncReply, now: Instant) {
        let SyncRequest { member_id, instance_id, generation, protocol_type, protocol, assignments } = req;
        if let Err(e) = self.check_member(member_id, instance_id) {
            let _ = reply.send(SyncResult::error(e));
            return;
        }
        if generation != self.generation {
            let _ = reply.send(SyncResult::error(ResponseError::IllegalGeneration));
            return;
        }
        if protocol_type.is_some_and(|t| Some(t) != self.protocol_type.as_deref())
            || protocol.is_some_and(|p| Some(p) != self.protocol.as_deref())
        {
            let _ = reply.send(SyncResult::error(ResponseError::InconsistentGroupProtocol));
            return;
        }
        match self.state {
            GroupState::Empty | GroupState::Dead => {
                let _ = reply.send(SyncResult::error(ResponseError::UnknownMemberId));
            }
            GroupState::PreparingRebalance => {
                let _ = reply.send(SyncResult::error(ResponseError::RebalanceInProgress));
            }
            GroupState::Stable => {
                let result = self.sync_result_for(member_id);
                if let Some(m) = self.members.get_mut(member_id) {
                    m.last_seen = now;
                }
                let _ = reply.send(result);
            }
            GroupState::CompletingRebalance => {
                let is_leader = self.leader.as_deref() == Some(member_id);
                if let Some(m) = self.members.get_mut(member_id) {
                    m.last_seen = now;
                    if let Some(old) = m.sync_reply.replace(reply) {
                        let _ = old.send(SyncResult::error(ResponseError::RebalanceInProgress));
                    }
                }
                if is_leader && self.awaiting_store.is_none() {
                    let mut given: HashMap<String, Bytes> = assignments.into_iter().collect();
                    for m in self.members.values_mut() {
                        m.assignment = given.remove(&m.id).unwrap_or_default();
                    }
                    self.awaiting_store = Some(self.generation);
                    self.persist = Some(self.stored_value());
                }
            }
        }
    }

    fn sync_result_for(&self, member_id: &str) -> SyncResult {
        SyncResult {
            error: None,
            protocol_type: self.protocol_type.clone(),
            protocol: self.protocol.clone(),
            assignment: self.members.get(member_id).map(|m| m.assignment.clone()).unwrap_or_default(),
        }
    }

    /// The write of generation `generation`'s metadata finished: on success the
    /// group becomes Stable and every waiting SyncGroup gets its assignment; on
    /// failure they get `error` and the group rebalances.
    pub fn stored(&mut self, generation: i32, result: Result<(), ResponseError>, now: Instant, now_ms: i64) {
        if self.state != GroupState::CompletingRebalance || self.awaiting_store != Some(generation) {
            return;
        }
        self.awaiting_store = None;
        match result {
            Ok(()) => {
                self.set_state(GroupState::Stable, now_ms);
                let ids: Vec<String> = self.members.keys().cloned().collect();
                for id in ids {
                    let result = self.sync_result_for(&id);
                    if let Some(reply) = self.members.get_mut(&id).and_then(|m| m.sync_reply.take()) {
                        let _ = reply.send(result);
                    }
                }
            }
            Err(error) => {
                self.fail_pending_syncs(error);
                for m in self.members.values_mut() {
                    m.assignment = Bytes::new();
                }
                let limits = self.limits_from_members();
                self.prepare_rebalance(&limits, now, now_ms);
            }
        }
    }

    /// Handles a Heartbeat: `Ok` or the error to answer.
    pub fn heartbeat(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
        now: Instant,
    ) -> Result<(), ResponseError> {
        if matches!(self.state, GroupState::Empty | GroupState::Dead) {
            return Err(ResponseError::UnknownMemberId);
        }
        self.check_member(member_id, instance_id)?;
        if generation != self.generation {
            return Err(ResponseError::IllegalGeneration);
        }
        if let Some(m) = self.members.get_mut(member_id) {
            m.last_seen = now;
        }
        match self.state {
            GroupState::PreparingRebalance => Err(ResponseError::RebalanceInProgress),
            _ => Ok(()),
        }
    }

    /// Handles one member of a LeaveGroup: by member id, or by instance id (v3+).
    pub fn leave(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        now: Instant,
        now_ms: i64,
    ) -> Result<String, ResponseError> {
        let id = match instance_id {
            Some(instance) => {
                let current = self.static_members.get(instance).cloned().ok_or(ResponseError::UnknownMemberId)?;
                if !member_id.is_empty() && member_id != current {
                    return Err(ResponseError::FencedInstanceId);
                }
                current
            }
            None => member_id.to_string(),
        };
        if !self.members.contains_key(&id) {
            return Err(ResponseError::UnknownMemberId);
        }
        self.remove_member(&id);
        self.after_member_left(now, now_ms);
        Ok(id)
    }

    fn after_member_left(&mut self, now: Instant, now_ms: i64) {
        match self.state {
            GroupState::Stable | GroupState::CompletingRebalance => {
                let limits = self.limits_from_members();
                self.prepare_rebalance(&limits, now, now_ms);
            }
            GroupState::PreparingRebalance => self.maybe_complete_join(now, now_ms),
            GroupState::Empty | GroupState::Dead => {}
        }
    }

    /// Expires members past their session and ends join phases that are due.
    pub fn tick(&mut self, now: Instant, now_ms: i64) {
        let expired: Vec<String> = self
            .members
            .values()
            // A member parked in JoinGroup is waiting on the group, not silent.
            .filter(|m| m.join_reply.is_none() && now.saturating_duration_since(m.last_seen) > m.session_timeout)
            .map(|m| m.id.clone())
            .collect();
        for id in &expired {
            tracing::info!(group = %self.id, member = %id, "member session expired");
            self.remove_member(id);
        }
        if !expired.is_empty() {
            self.after_member_left(now, now_ms);
        }
        self.maybe_complete_join(now, now_ms);
    }

    /// May a commit from this member and generation go ahead? (Kafka: commits
    /// are taken while Stable or PreparingRebalance, so a member can commit
    /// what it processed before it rejoins.)
    pub fn check_commit(&mut self, auth: &CommitAuth<'_>, now: Instant) -> Result<(), ResponseError> {
        if self.state == GroupState::Dead {
            return Err(ResponseError::CoordinatorNotAvailable);
        }
        if auth.generation < 0 && auth.member_id.is_empty() {
            // A consumer using the group only to store offsets.
            return if self.members.is_empty() { Ok(()) } else { Err(ResponseError::UnknownMemberId) };
        }
        self.check_member(auth.member_id, auth.instance_id)?;
        if auth.generation != self.generation {
            return Err(ResponseError::IllegalGeneration);
        }
        if self.state == GroupState::CompletingRebalance {
            return Err(ResponseError::RebalanceInProgress);
        }
        if let Some(m) = self.members.get_mut(auth.member_id) {
            m.last_seen = now;
        }
        Ok(())
    }

    /// Records a stored commit; an older record never replaces a newer one.
    pub fn apply_offset(&mut self, topic: &str, partition: i32, committed: Committed) {
        let key = (topic.to_string(), partition);
        match self.offsets.get(&key) {
            Some(existing) if existing.record_offset > committed.record_offset => {}
            _ => {
                self.offsets.insert(key, committed);
            }
        }
    }

    /// Offsets of an empty group older than `retention` (counted from the
    /// later of the commit and the group becoming empty).
    pub fn expired_offsets(&self, now_ms: i64, retention_ms: i64) -> Vec<(String, i32)> {
        if self.state != GroupState::Empty {
            return Vec::new();
        }
        self.offsets
            .iter()
            .filter(|(_, c)| c.commit_timestamp.max(self.state_since_ms).saturating_add(retention_ms) <= now_ms)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Topics the members subscribe to, from the consumer protocol's metadata.
    pub fn subscribed_topics(&self) -> Option<std::collections::BTreeSet<String>> {
        if self.protocol_type.as_deref() != Some("consumer") {
            return None;
        }
        let protocol = self.protocol.as_deref()?;
        let mut topics = std::collections::BTreeSet::new();
        for m in self.members.values() {
            if let Some(sub) = super::assignment::decode_subscription(&m.metadata_for(protocol)) {
                topics.extend(sub);
            }
        }
        Some(topics)
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
mod tests {
    use super::*;

    const LIMITS: GroupLimits = GroupLimits {
        min_session_timeout: Duration::from_millis(100),
        max_session_timeout: Duration::from_secs(600),
        max_size: 10,
        initial_rebalance_delay: Duration::ZERO,
    };

    fn join_req(member_id: &str, instance: Option<&str>) -> JoinRequest {
        JoinRequest {
            member_id: member_id.into(),
            instance_id: instance.map(Into::into),
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 30_000,
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), Bytes::from_static(b"meta"))],
        }
    }

    fn join(g: &mut Group, req: JoinRequest, now: Instant) -> oneshot::Receiver<JoinResult> {
        let (tx, rx) = oneshot::channel();
        g.join(req, tx, &LIMITS, now, 0);
        rx
    }

    fn sync(g: &mut Group, member: &str, gen: i32, assign: Vec<(String, Bytes)>) -> oneshot::Receiver<SyncResult> {
        let (tx, rx) = oneshot::channel();
        let req = SyncRequest { member_id: member, generation: gen, assignments: assign, ..Default::default() };
        g.sync(req, tx, Instant::now());
        rx
    }

    fn got<T>(rx: &mut oneshot::Receiver<T>) -> Option<T> {
        rx.try_recv().ok()
    }

    /// Two members joined and synced: the group is Stable at generation 1.
    fn stable_pair(now: Instant) -> (Group, String, String) {
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

    #[test]
    fn join_sync_reaches_stable_with_assignments() {
        stable_pair(Instant::now());
    }

    #[test]
    fn heartbeat_errors_fence_unknown_members_and_stale_generations() {
        let now = Instant::now();
        let (mut g, a, _) = stable_pair(now);
        assert_eq!(g.heartbeat(&a, None, 2, now), Ok(()));
        assert_eq!(g.heartbeat("nobody", None, 2, now), Err(ResponseError::UnknownMemberId));
        assert_eq!(g.heartbeat(&a, None, 1, now), Err(ResponseError::IllegalGeneration));
        let (tx, mut rx) = oneshot::channel();
        g.sync(SyncRequest { member_id: "nobody", generation: 2, ..Default::default() }, tx, now);
        assert_eq!(got(&mut rx).and_then(|r| r.error), Some(ResponseError::UnknownMemberId));
    }

    #[test]
    fn a_leaving_member_triggers_a_rebalance_that_the_other_sees() {
        let now = Instant::now();
        let (mut g, a, b) = stable_pair(now);
        assert_eq!(g.leave(&b, None, now, 5), Ok(b.clone()));
        assert_eq!(g.state, GroupState::PreparingRebalance);
        assert_eq!(g.heartbeat(&a, None, 2, now), Err(ResponseError::RebalanceInProgress));
        // Commits of the old generation are still taken while preparing.
        let auth = CommitAuth { member_id: &a, instance_id: None, generation: 2 };
        assert_eq!(g.check_commit(&auth, now), Ok(()));
        let mut rx = join(&mut g, join_req(&a, None), now);
        let r = got(&mut rx).expect("alone, the join completes");
        assert_eq!((r.generation, r.members.len()), (3, 1));
    }

    #[test]
    fn silent_members_expire_and_the_last_one_leaves_the_group_empty() {
        let now = Instant::now();
        let (mut g, _, _) = stable_pair(now);
        g.tick(now + Duration::from_secs(11), 10);
        assert!(g.members.is_empty());
        assert_eq!(g.state, GroupState::Empty);
        assert!(g.take_persist().is_some_and(|v| v.members.is_empty()), "the empty group is stored");
    }

    #[test]
    fn members_that_do_not_rejoin_are_dropped_at_the_rebalance_timeout() {
        let now = Instant::now();
        let (mut g, _a, b) = stable_pair(now);
        let mut rb = join(&mut g, join_req(&b, Some("x")).clone(), now);
        // b is not static in this group, so the instance id is unknown: refused.
        assert_eq!(got(&mut rb).and_then(|r| r.error), Some(ResponseError::UnknownMemberId));
        let mut rb = join(
            &mut g,
            JoinRequest { protocols: vec![("range".into(), Bytes::from_static(b"new"))], ..join_req(&b, None) },
            now,
        );
        assert_eq!(g.state, GroupState::PreparingRebalance);
        assert!(got(&mut rb).is_none());
        g.tick(now + Duration::from_secs(31), 3);
        let r = got(&mut rb).expect("the join phase ended");
        assert_eq!((r.generation, r.leader.clone()), (3, b.clone()));
        assert_eq!(g.members.len(), 1);
    }

    #[test]
    fn the_initial_delay_waits_for_more_members() {
        let limits = GroupLimits { initial_rebalance_delay: Duration::from_millis(500), ..LIMITS };
        let now = Instant::now();
        let mut g = Group::new("g", 0);
        let (tx, mut a) = oneshot::channel();
        g.join(join_req("", None), tx, &limits, now, 0);
        assert!(got(&mut a).is_none());
        let (tx, mut b) = oneshot::channel();
        g.join(join_req("", None), tx, &limits, now + Duration::from_millis(300), 0);
        g.tick(now + Duration::from_millis(600), 0);
        assert!(got(&mut a).is_none(), "the second join pushed the delay back");
        g.tick(now + Duration::from_millis(801), 0);
        let (a, b) = (got(&mut a).expect("joined"), got(&mut b).expect("joined"));
        assert_eq!((a.generation, b.generation), (1, 1));
    }

    #[test]
    fn a_static_member_rejoining_keeps_its_assignment_and_fences_its_old_id() {
        let now = Instant::now();
        let mut g = Group::new("g", 0);
        let mut a = join(&mut g, join_req("", Some("i1")), now);
        let a = got(&mut a).expect("joined");
        let mut s = sync(&mut g, &a.member_id, 1, vec![(a.member_id.clone(), Bytes::from_static(b"A"))]);
        g.take_persist();
        g.stored(1, Ok(()), now, 0);
        assert!(got(&mut s).is_some());
        // A second static member makes a Stable group of two; then i2 restarts.
        let mut b = join(&mut g, join_req("", Some("i2")), now);
        let mut a2 = join(&mut g, join_req(&a.member_id, Some("i1")), now);
        let (a2, b) = (got(&mut a2).expect("joined"), got(&mut b).expect("joined"));
        let assignments =
            vec![(a2.member_id.clone(), Bytes::from_static(b"A")), (b.member_id.clone(), Bytes::from_static(b"B"))];
        let _s = sync(&mut g, &a2.member_id, 2, assignments);
        g.take_persist();
        g.stored(2, Ok(()), now, 0);
        let mut b2 = join(&mut g, join_req("", Some("i2")), now);
        let b2 = got(&mut b2).expect("answered at once, no rebalance");
        assert_eq!((b2.generation, g.state), (2, GroupState::Stable));
        assert_ne!(b2.member_id, b.member_id);
        assert_eq!(g.heartbeat(&b.member_id, Some("i2"), 2, now), Err(ResponseError::FencedInstanceId));
        let mut s = sync(&mut g, &b2.member_id, 2, vec![]);
        assert_eq!(got(&mut s).expect("synced").assignment, Bytes::from_static(b"B"));
        assert!(g.take_persist().is_some_and(|v| v.members.iter().any(|m| m.member_id == b2.member_id)));

        // The leader restarts too: still no rebalance; it learns the members but
        // is told to keep the assignment, and its SyncGroup returns the stored one.
        let mut a3 = join(&mut g, join_req("", Some("i1")), now);
        let a3 = got(&mut a3).expect("answered at once, no rebalance");
        assert_eq!((a3.generation, a3.leader.clone(), a3.skip_assignment), (2, a3.member_id.clone(), true));
        assert_eq!(a3.members.len(), 2);
        let mut s = sync(&mut g, &a3.member_id, 2, vec![(a3.member_id.clone(), Bytes::from_static(b"other"))]);
        assert_eq!(got(&mut s).expect("synced").assignment, Bytes::from_static(b"A"));
        assert_eq!(g.state, GroupState::Stable);
    }

    #[test]
    fn joins_are_validated() {
        let now = Instant::now();
        let mut g = Group::new("g", 0);
        let mut r = join(&mut g, JoinRequest { session_timeout_ms: 10, ..join_req("", None) }, now);
        assert_eq!(got(&mut r).and_then(|r| r.error), Some(ResponseError::InvalidSessionTimeout));
        let mut r = join(&mut g, JoinRequest { protocols: vec![], ..join_req("", None) }, now);
        assert_eq!(got(&mut r).and_then(|r| r.error), Some(ResponseError::InconsistentGroupProtocol));
        let mut r = join(&mut g, join_req("unknown", None), now);
        assert_eq!(got(&mut r).and_then(|r| r.error), Some(ResponseError::UnknownMemberId));
        let _a = join(&mut g, join_req("", None), now);
        let mut r = join(&mut g, JoinRequest { protocol_type: "connect".into(), ..join_req("", None) }, now);
        assert_eq!(got(&mut r).and_then(|r| r.error), Some(ResponseError::InconsistentGroupProtocol));
    }

    #[test]
    fn a_failed_store_sends_the_group_back_to_rebalancing() {
        let now = Instant::now();
        let mut g = Group::new("g", 0);
        let mut a = join(&mut g, join_req("", None), now);
        let a = got(&mut a).expect("joined");
        let mut s = sync(&mut g, &a.member_id, 1, vec![]);
        g.take_persist();
        g.stored(1, Err(ResponseError::NotCoordinator), now, 0);
        assert_eq!(got(&mut s).and_then(|r| r.error), Some(ResponseError::NotCoordinator));
        assert_ne!(g.state, GroupState::Stable);
    }

    #[test]
    fn commits_are_checked_and_older_records_never_win() {
        let now = Instant::now();
        let mut g = Group::new("g", 0);
        let simple = CommitAuth { member_id: "", instance_id: None, generation: -1 };
        assert_eq!(g.check_commit(&simple, now), Ok(()), "offsets-only use of an empty group");
        let c = |offset, record_offset| Committed {
            offset,
            leader_epoch: -1,
            metadata: String::new(),
            commit_timestamp: 0,
            record_offset,
        };
        g.apply_offset("t", 0, c(10, 5));
        g.apply_offset("t", 0, c(7, 4));
        assert_eq!(g.offsets[&("t".to_string(), 0)].offset, 10);
        assert_eq!(g.expired_offsets(1000, 2000), Vec::<(String, i32)>::new());
        assert_eq!(g.expired_offsets(2000, 2000), vec![("t".to_string(), 0)]);
        let _a = join(&mut g, join_req("", None), now);
        assert_eq!(g.check_commit(&simple, now), Err(ResponseError::UnknownMemberId));
    }

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
