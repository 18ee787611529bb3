//! The consumer group protocol of KIP-848 (ConsumerGroupHeartbeat), kept
//! pure like the classic state machine: time and the topics come in as
//! arguments, and what must be stored is flagged for the coordinator.
//!
//! The broker assigns. A change to the membership or to what the members
//! subscribe to bumps the *group epoch*; the assignor then computes a
//! *target assignment* for that epoch (the *assignment epoch*). Each member
//! moves to the target on its own heartbeats: first it gives up the
//! partitions it must lose (UnrevokedPartitions, at its old epoch), then it
//! takes the new epoch with the partitions of its target that nobody else
//! still holds (UnreleasedPartitions until the others let go of the rest).
//! A partition is never given to one member while another still owns it.
//! A member that does not revoke in its rebalance timeout, or misses its
//! session, is removed.

pub mod assignor;
pub mod classic;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use kafka_protocol::ResponseError;
use serde::{Deserialize, Serialize};
use strom_raft::TopicId;

use crate::pattern::whole_names;

/// A topic as an assignment needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicInfo {
    pub id: TopicId,
    pub partitions: i32,
}

/// The topics that exist, by name.
pub type Topics = BTreeMap<String, TopicInfo>;

/// Partitions by topic id.
pub type Assignment = BTreeMap<TopicId, BTreeSet<i32>>;

/// The member epoch a member sends to join, to leave, and to leave for a
/// while as a static member (its assignment is kept for its return).
pub const JOIN_EPOCH: i32 = 0;
pub const LEAVE_EPOCH: i32 = -1;
pub const STATIC_LEAVE_EPOCH: i32 = -2;

/// How often members are asked to heartbeat while the group settles (its
/// assignment changed lately), so that partitions move in a fraction of a
/// second instead of one heartbeat interval per step.
const SETTLING_INTERVAL: Duration = Duration::from_millis(200);
/// How long after its last assignment change a group counts as settling.
const SETTLING_FOR: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberState {
    /// At the assignment epoch with its whole target.
    Stable,
    /// Must give up partitions before it can move to the new epoch.
    UnrevokedPartitions,
    /// At the new epoch, waiting for others to release part of its target.
    UnreleasedPartitions,
}

impl MemberState {
    pub fn name(self) -> &'static str {
        match self {
            MemberState::Stable => "Stable",
            MemberState::UnrevokedPartitions => "UnrevokedPartitions",
            MemberState::UnreleasedPartitions => "UnreleasedPartitions",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConsumerMember {
    pub id: String,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    /// Subscribed topic names, sorted.
    pub topics: Vec<String>,
    /// A subscription by regular expression (RE2 syntax, the whole name must match).
    pub regex: Option<String>,
    pub server_assignor: Option<String>,
    pub rebalance_timeout_ms: i32,
    pub epoch: i32,
    pub previous_epoch: i32,
    pub state: MemberState,
    /// What it owns and may use.
    pub assigned: Assignment,
    /// What it owns and has been told to give up.
    pub revoking: Assignment,
    /// A static member gone for a while (epoch -2): it keeps its assignment
    /// until its session ends or it comes back.
    #[serde(default)]
    pub away: bool,
    #[serde(skip, default = "Instant::now")]
    pub last_seen: Instant,
    #[serde(skip)]
    pub revoke_deadline: Option<Instant>,
    /// A member of the classic protocol, in the group since it converted
    /// (KIP-848's online migration): what JoinGroup told of it.
    #[serde(default)]
    pub classic: Option<classic::ClassicProtocol>,
}

impl ConsumerMember {
    /// A member that just joined: epoch 0, owning nothing.
    fn new(id: &str, instance_id: Option<String>, now: Instant) -> Self {
        ConsumerMember {
            id: id.to_string(),
            instance_id,
            rack_id: None,
            client_id: String::new(),
            client_host: String::new(),
            topics: Vec::new(),
            regex: None,
            server_assignor: None,
            rebalance_timeout_ms: 0,
            epoch: 0,
            previous_epoch: -1,
            state: MemberState::Stable,
            assigned: Assignment::new(),
            revoking: Assignment::new(),
            away: false,
            last_seen: now,
            revoke_deadline: None,
            classic: None,
        }
    }

    fn owns(&self) -> impl Iterator<Item = (TopicId, i32)> + '_ {
        self.assigned.iter().chain(&self.revoking).flat_map(|(t, ps)| ps.iter().map(move |p| (*t, *p)))
    }
}

/// A ConsumerGroupHeartbeat as the state machine takes it.
#[derive(Debug, Clone, Default)]
pub struct Heartbeat {
    pub member_id: String,
    pub member_epoch: i32,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    /// -1: unchanged.
    pub rebalance_timeout_ms: i32,
    /// `None`: unchanged.
    pub topics: Option<Vec<String>>,
    /// `None`: unchanged; `Some("")`: no regular expression any more.
    pub regex: Option<String>,
    pub server_assignor: Option<String>,
    /// The partitions the member owns, when it says (`None`: unchanged).
    pub owned: Option<Assignment>,
    pub client_id: String,
    pub client_host: String,
}

/// The answer to a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatAnswer {
    pub member_id: String,
    pub member_epoch: i32,
    pub heartbeat_interval_ms: i32,
    /// The partitions the member may own now, when it must be told.
    pub assignment: Option<Assignment>,
}

/// Settings of the consumer protocol.
#[derive(Debug, Clone)]
pub struct ConsumerLimits {
    pub session_timeout: Duration,
    pub heartbeat_interval: Duration,
    /// `group.consumer.assignors`; the first is the default.
    pub assignors: Vec<String>,
    pub max_size: usize,
}

/// A consumer group's state under the consumer protocol. Stored whole in
/// one record of `__consumer_offsets` whenever it changes.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ConsumerGroup {
    pub group_epoch: i32,
    pub assignment_epoch: i32,
    pub members: BTreeMap<String, ConsumerMember>,
    /// The target assignment of the assignment epoch, by member id.
    pub target: BTreeMap<String, Assignment>,
    /// The subscribed topics the target was computed from.
    pub topics_seen: BTreeMap<String, TopicInfo>,
    /// The assignor of the last target.
    pub assignor: Option<String>,
    /// Changed since it was last stored.
    #[serde(skip)]
    pub dirty: bool,
    /// When the target last changed.
    #[serde(skip)]
    pub settling_since: Option<Instant>,
}

fn contains(a: &Assignment, t: TopicId, p: i32) -> bool {
    a.get(&t).is_some_and(|ps| ps.contains(&p))
}

fn minus(a: &Assignment, b: &Assignment) -> Assignment {
    let mut out = Assignment::new();
    for (t, ps) in a {
        let left: BTreeSet<i32> = ps.iter().copied().filter(|p| !contains(b, *t, *p)).collect();
        if !left.is_empty() {
            out.insert(*t, left);
        }
    }
    out
}

fn intersect(a: &Assignment, b: &Assignment) -> Assignment {
    let mut out = Assignment::new();
    for (t, ps) in a {
        let both: BTreeSet<i32> = ps.iter().copied().filter(|p| contains(b, *t, *p)).collect();
        if !both.is_empty() {
            out.insert(*t, both);
        }
    }
    out
}

fn is_subset(a: &Assignment, b: &Assignment) -> bool {
    a.iter().all(|(t, ps)| ps.iter().all(|p| contains(b, *t, *p)))
}

fn normalized(a: Assignment) -> Assignment {
    a.into_iter().filter(|(_, ps)| !ps.is_empty()).collect()
}

/// A member id for a member that joins without one (v0): 22 characters
/// from a random UUID, as Kafka's `Uuid.toString`.
pub fn new_member_id() -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let bits: u128 = rand::random();
    (0..22).map(|i| ALPHABET[((bits >> (i * 6)) & 63) as usize] as char).collect()
}

/// Whether `regex` is a valid subscription pattern.
pub fn valid_regex(regex: &str) -> bool {
    whole_names(regex).is_some()
}

impl ConsumerGroup {
    /// Kafka's names for the group's state, as ListGroups and describe show them.
    pub fn state_name(&self) -> &'static str {
        if self.members.is_empty() {
            "Empty"
        } else if self.group_epoch > self.assignment_epoch {
            "Assigning"
        } else if self.members.values().any(|m| m.epoch != self.assignment_epoch || m.state != MemberState::Stable) {
            "Reconciling"
        } else {
            "Stable"
        }
    }

    /// The topics every member subscribes to, resolved against `topics`. A
    /// regular expression must match a whole name; like Kafka's, it can
    /// match internal topics too.
    fn subscribed(&self, topics: &Topics) -> BTreeMap<String, BTreeSet<String>> {
        self.members
            .values()
            .map(|m| {
                let mut names: BTreeSet<String> =
                    m.topics.iter().filter(|t| topics.contains_key(*t)).cloned().collect();
                if let Some(re) = m.regex.as_deref().and_then(whole_names) {
                    names.extend(topics.keys().filter(|t| re.is_match(t)).cloned());
                }
                (m.id.clone(), names)
            })
            .collect()
    }

    /// Every topic some member subscribes to.
    pub fn subscribed_topics(&self, topics: &Topics) -> BTreeSet<String> {
        self.subscribed(topics).into_values().flatten().collect()
    }

    /// The membership or the subscriptions changed: a new group epoch,
    /// unless one is already waiting for its target (it will be computed
    /// from everything as it is then).
    fn bump(&mut self) {
        if self.group_epoch <= self.assignment_epoch {
            self.group_epoch += 1;
        }
        self.dirty = true;
    }

    /// Computes the target when the group epoch moved past it, or when the
    /// subscribed topics changed (a topic created, deleted or grown).
    pub fn refresh_target(&mut self, topics: &Topics, limits: &ConsumerLimits, now: Instant) {
        let subscriptions = self.subscribed(topics);
        let wanted: BTreeSet<&String> = subscriptions.values().flatten().collect();
        let seen: Topics = topics.iter().filter(|(n, _)| wanted.contains(n)).map(|(n, t)| (n.clone(), *t)).collect();
        if seen != self.topics_seen {
            self.topics_seen = seen;
            self.bump();
        }
        if self.group_epoch <= self.assignment_epoch {
            return;
        }
        // An empty group keeps the assignor it last used, to show.
        let name = match (&self.assignor, self.members.is_empty()) {
            (Some(last), true) => last.clone(),
            _ => self.choose_assignor(limits),
        };
        let members: Vec<assignor::AssignorMember<'_>> = self
            .members
            .values()
            .map(|m| assignor::AssignorMember {
                id: &m.id,
                topics: subscriptions.get(&m.id).cloned().unwrap_or_default(),
                previous: self.target.get(&m.id),
            })
            .collect();
        let target = assignor::assign(&name, &members, &self.topics_seen);
        self.target = target;
        self.assignor = Some(name);
        self.assignment_epoch = self.group_epoch;
        self.settling_since = Some(now);
        self.dirty = true;
    }

    /// The assignor the members ask for (the most asked, ties by name), or the default.
    fn choose_assignor(&self, limits: &ConsumerLimits) -> String {
        let mut asked: BTreeMap<&str, usize> = BTreeMap::new();
        for m in self.members.values() {
            if let Some(a) = m.server_assignor.as_deref() {
                *asked.entry(a).or_default() += 1;
            }
        }
        asked
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(a.0)))
            .map(|(a, _)| a.to_string())
            .or_else(|| limits.assignors.first().cloned())
            .unwrap_or_else(|| "uniform".to_string())
    }

    /// Partitions owned by members other than `except`.
    fn owned_by_others(&self, except: &str) -> BTreeSet<(TopicId, i32)> {
        self.members.values().filter(|m| m.id != except).flat_map(|m| m.owns()).collect()
    }

    /// Moves a member towards its target, as far as it can go now.
    /// `owned`: what the member says it owns, if it says.
    fn reconcile(&mut self, member_id: &str, owned: Option<&Assignment>, now: Instant) {
        let others = self.owned_by_others(member_id);
        let target = self.target.get(member_id).cloned().unwrap_or_default();
        let epoch = self.assignment_epoch;
        let Some(m) = self.members.get_mut(member_id) else { return };
        let before = (m.epoch, m.state, m.assigned.clone(), m.revoking.clone());
        if m.state == MemberState::UnrevokedPartitions {
            // It moves on once it no longer owns what it was told to give up.
            let released = owned.is_some_and(|o| intersect(o, &m.revoking).is_empty());
            if !released {
                return;
            }
            m.revoking.clear();
            m.revoke_deadline = None;
            m.state = MemberState::Stable;
        }
        if m.epoch == epoch && m.state == MemberState::Stable {
            return;
        }
        let revoke = minus(&m.assigned, &target);
        if !revoke.is_empty() {
            m.assigned = intersect(&m.assigned, &target);
            m.revoking = revoke;
            m.state = MemberState::UnrevokedPartitions;
            m.revoke_deadline = Some(now + Duration::from_millis(m.rebalance_timeout_ms.max(0) as u64));
        } else {
            let mut assigned = m.assigned.clone();
            let mut waiting = false;
            for (t, ps) in &target {
                for p in ps {
                    if others.contains(&(*t, *p)) {
                        waiting = true;
                    } else {
                        assigned.entry(*t).or_default().insert(*p);
                    }
                }
            }
            if m.epoch != epoch {
                m.previous_epoch = m.epoch;
                m.epoch = epoch;
            }
            m.assigned = normalized(assigned);
            m.state = if waiting { MemberState::UnreleasedPartitions } else { MemberState::Stable };
        }
        if before != (m.epoch, m.state, m.assigned.clone(), m.revoking.clone()) {
            self.dirty = true;
        }
    }

    /// How often a member should heartbeat now.
    fn interval(&self, limits: &ConsumerLimits, now: Instant) -> Duration {
        let settling = self.settling_since.is_some_and(|since| now.saturating_duration_since(since) < SETTLING_FOR)
            || self.state_name() != "Stable";
        if settling {
            limits.heartbeat_interval.min(SETTLING_INTERVAL)
        } else {
            limits.heartbeat_interval
        }
    }

    fn answer(
        &self,
        member_id: &str,
        assignment: Option<Assignment>,
        limits: &ConsumerLimits,
        now: Instant,
    ) -> HeartbeatAnswer {
        HeartbeatAnswer {
            member_id: member_id.to_string(),
            member_epoch: self.members.get(member_id).map_or(LEAVE_EPOCH, |m| m.epoch),
            heartbeat_interval_ms: self.interval(limits, now).as_millis().min(i32::MAX as u128) as i32,
            assignment,
        }
    }

    /// A ConsumerGroupHeartbeat. `new_member_id` names a member that joins
    /// without an id (v0; from v1 the client picks its own).
    pub fn heartbeat(
        &mut self,
        hb: Heartbeat,
        topics: &Topics,
        limits: &ConsumerLimits,
        now: Instant,
        new_member_id: impl FnOnce() -> String,
    ) -> Result<HeartbeatAnswer, ResponseError> {
        if let Some(a) = hb.server_assignor.as_deref() {
            if !limits.assignors.iter().any(|known| known == a) {
                return Err(ResponseError::UnsupportedAssignor);
            }
        }
        if hb.regex.as_deref().is_some_and(|r| !r.is_empty() && !valid_regex(r)) {
            return Err(ResponseError::InvalidRegularExpression);
        }
        match hb.member_epoch {
            LEAVE_EPOCH => return Ok(self.leave(&hb.member_id, hb.instance_id.as_deref(), topics, limits, now)),
            STATIC_LEAVE_EPOCH => {
                let instance = hb.instance_id.as_deref().ok_or(ResponseError::InvalidRequest)?;
                let m = self.static_member(instance).ok_or(ResponseError::UnknownMemberId)?;
                if m != hb.member_id {
                    return Err(ResponseError::FencedInstanceId);
                }
                if let Some(m) = self.members.get_mut(&m) {
                    m.away = true;
                    m.last_seen = now;
                }
                self.dirty = true;
                return Ok(HeartbeatAnswer {
                    member_id: hb.member_id,
                    member_epoch: STATIC_LEAVE_EPOCH,
                    heartbeat_interval_ms: 0,
                    assignment: None,
                });
            }
            JOIN_EPOCH => {}
            e if e < 0 => return Err(ResponseError::InvalidRequest),
            _ => {}
        }
        let member_id = if hb.member_epoch == JOIN_EPOCH {
            self.join(&hb, limits, now, new_member_id)?
        } else {
            let m =
                self.members.get(&hb.member_id).filter(|m| !m.is_classic()).ok_or(ResponseError::UnknownMemberId)?;
            if let (Some(instance), Some(mine)) = (hb.instance_id.as_deref(), m.instance_id.as_deref()) {
                if instance != mine {
                    return Err(ResponseError::FencedInstanceId);
                }
            }
            let owned_ok = hb.owned.as_ref().is_none_or(|o| is_subset(o, &m.assigned));
            if hb.member_epoch > m.epoch
                || (hb.member_epoch < m.epoch && !(hb.member_epoch == m.previous_epoch && owned_ok))
            {
                return Err(ResponseError::FencedMemberEpoch);
            }
            hb.member_id.clone()
        };
        let full_request = hb.member_epoch == JOIN_EPOCH || hb.owned.is_some();
        self.update_member(&member_id, &hb, now);
        self.refresh_target(topics, limits, now);
        let before = self.members.get(&member_id).map(|m| (m.epoch, m.assigned.clone()));
        self.reconcile(&member_id, hb.owned.as_ref(), now);
        let m = self.members.get(&member_id).ok_or(ResponseError::UnknownMemberId)?;
        let changed = before.as_ref() != Some(&(m.epoch, m.assigned.clone()));
        let out_of_step = hb.owned.as_ref().is_some_and(|o| o != &m.assigned) || hb.member_epoch != m.epoch;
        let tell = changed || (full_request && out_of_step) || hb.member_epoch == JOIN_EPOCH;
        let assignment = tell.then(|| m.assigned.clone());
        Ok(self.answer(&member_id, assignment, limits, now))
    }

    fn static_member(&self, instance: &str) -> Option<String> {
        self.members.values().find(|m| m.instance_id.as_deref() == Some(instance)).map(|m| m.id.clone())
    }

    /// A member joining (epoch 0): new, the same member again after it lost
    /// its partitions, or a static member coming back under a new id.
    fn join(
        &mut self,
        hb: &Heartbeat,
        limits: &ConsumerLimits,
        now: Instant,
        new_member_id: impl FnOnce() -> String,
    ) -> Result<String, ResponseError> {
        if hb.topics.is_none() && hb.regex.is_none() {
            return Err(ResponseError::InvalidRequest);
        }
        let member_id = if hb.member_id.is_empty() { new_member_id() } else { hb.member_id.clone() };
        if let Some(instance) = hb.instance_id.as_deref() {
            if let Some(previous) = self.static_member(instance) {
                if previous == member_id {
                    // The same member again: it has dropped what it owned.
                    self.reset(&member_id);
                    return Ok(member_id);
                }
                // A classic static member upgrading to this protocol takes
                // its place the same way.
                let away = self.members.get(&previous).is_some_and(|m| m.away || m.is_classic());
                if !away {
                    return Err(ResponseError::UnreleasedInstanceId);
                }
                // Back under a new id: it takes over the old member's place,
                // epoch and partitions, and nothing rebalances.
                if let Some(mut m) = self.members.remove(&previous) {
                    m.id = member_id.clone();
                    m.away = false;
                    m.classic = None;
                    m.last_seen = now;
                    if let Some(t) = self.target.remove(&previous) {
                        self.target.insert(member_id.clone(), t);
                    }
                    self.members.insert(member_id.clone(), m);
                    self.dirty = true;
                }
                return Ok(member_id);
            }
        }
        if self.members.contains_key(&member_id) {
            self.reset(&member_id);
            return Ok(member_id);
        }
        if self.members.len() >= limits.max_size {
            return Err(ResponseError::GroupMaxSizeReached);
        }
        self.members.insert(member_id.clone(), ConsumerMember::new(&member_id, hb.instance_id.clone(), now));
        self.bump();
        Ok(member_id)
    }

    /// A known member joins again: it owns nothing now, and starts over at epoch 0.
    fn reset(&mut self, member_id: &str) {
        if let Some(m) = self.members.get_mut(member_id) {
            m.assigned.clear();
            m.revoking.clear();
            m.previous_epoch = -1;
            m.epoch = 0;
            m.state = MemberState::Stable;
            m.away = false;
            m.revoke_deadline = None;
            m.classic = None;
            self.dirty = true;
        }
    }

    /// Takes what a heartbeat says about the member; a new subscription
    /// bumps the group epoch.
    fn update_member(&mut self, member_id: &str, hb: &Heartbeat, now: Instant) {
        let Some(m) = self.members.get_mut(member_id) else { return };
        let mut changed = false;
        let mut resubscribed = false;
        if let Some(topics) = &hb.topics {
            let mut topics = topics.clone();
            topics.sort();
            topics.dedup();
            if topics != m.topics {
                m.topics = topics;
                resubscribed = true;
            }
        }
        if let Some(regex) = &hb.regex {
            let regex = (!regex.is_empty()).then(|| regex.clone());
            if regex != m.regex {
                m.regex = regex;
                resubscribed = true;
            }
        }
        if hb.server_assignor.is_some() && hb.server_assignor != m.server_assignor {
            m.server_assignor = hb.server_assignor.clone();
            resubscribed = true;
        }
        if hb.rebalance_timeout_ms >= 0 && hb.rebalance_timeout_ms != m.rebalance_timeout_ms {
            m.rebalance_timeout_ms = hb.rebalance_timeout_ms;
            changed = true;
        }
        if hb.rack_id.is_some() && hb.rack_id != m.rack_id {
            m.rack_id = hb.rack_id.clone();
            changed = true;
        }
        if m.client_id != hb.client_id || m.client_host != hb.client_host {
            m.client_id = hb.client_id.clone();
            m.client_host = hb.client_host.clone();
            changed = true;
        }
        m.last_seen = now;
        if resubscribed {
            self.bump();
        } else if changed {
            self.dirty = true;
        }
    }

    /// A member leaves (epoch -1): its partitions go to the others.
    fn leave(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        topics: &Topics,
        limits: &ConsumerLimits,
        now: Instant,
    ) -> HeartbeatAnswer {
        let id = match instance_id.and_then(|i| self.static_member(i)) {
            Some(id) => id,
            None => member_id.to_string(),
        };
        if self.remove(&id) {
            self.refresh_target(topics, limits, now);
        }
        HeartbeatAnswer {
            member_id: member_id.to_string(),
            member_epoch: LEAVE_EPOCH,
            heartbeat_interval_ms: 0,
            assignment: None,
        }
    }

    /// Removes a member; whether it was one.
    pub fn remove(&mut self, member_id: &str) -> bool {
        if self.members.remove(member_id).is_none() {
            return false;
        }
        self.target.remove(member_id);
        self.bump();
        true
    }

    /// Removes members whose session ended, or that did not give up their
    /// partitions within their rebalance timeout; the ids removed. The new
    /// target is computed at the next heartbeat, which brings the topics.
    pub fn expire(&mut self, limits: &ConsumerLimits, now: Instant) -> Vec<String> {
        let gone: Vec<String> = self
            .members
            .values()
            .filter(|m| {
                now.saturating_duration_since(m.last_seen) > m.session_timeout(limits)
                    || m.revoke_deadline.is_some_and(|d| now > d)
            })
            .map(|m| m.id.clone())
            .collect();
        for id in &gone {
            self.remove(id);
        }
        gone
    }

    /// Members come back from storage with a fresh session from `now`.
    pub fn restored(mut self, now: Instant) -> Self {
        for m in self.members.values_mut() {
            m.last_seen = now;
            if m.state == MemberState::UnrevokedPartitions {
                m.revoke_deadline = Some(now + Duration::from_millis(m.rebalance_timeout_ms.max(0) as u64));
            }
        }
        self.dirty = false;
        self
    }

    /// May a commit (or an OffsetFetch naming a member) from this member
    /// at this epoch go ahead? A commit with no member and epoch -1 (an admin
    /// client, or offsets-only use) only while the group has no member.
    pub fn check_member_epoch(&self, member_id: &str, epoch: i32, stale: ResponseError) -> Result<(), ResponseError> {
        if member_id.is_empty() && epoch < 0 {
            return if self.members.is_empty() { Ok(()) } else { Err(ResponseError::UnknownMemberId) };
        }
        let m = self.members.get(member_id).ok_or(ResponseError::UnknownMemberId)?;
        if epoch != m.epoch {
            return Err(stale);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(assignor: &str) -> ConsumerLimits {
        ConsumerLimits {
            session_timeout: Duration::from_secs(45),
            heartbeat_interval: Duration::from_secs(5),
            assignors: vec![assignor.to_string(), "uniform".to_string()],
            max_size: 100,
        }
    }

    fn topics(n: i32) -> Topics {
        [("t".to_string(), TopicInfo { id: TopicId(7), partitions: n })].into_iter().collect()
    }

    fn join(id: &str) -> Heartbeat {
        Heartbeat {
            member_id: id.into(),
            member_epoch: 0,
            rebalance_timeout_ms: 30_000,
            topics: Some(vec!["t".into()]),
            owned: Some(Assignment::new()),
            ..Default::default()
        }
    }

    fn beat(id: &str, epoch: i32, owned: Option<&Assignment>) -> Heartbeat {
        Heartbeat {
            member_id: id.into(),
            member_epoch: epoch,
            rebalance_timeout_ms: -1,
            owned: owned.cloned(),
            ..Default::default()
        }
    }

    fn parts(a: &Assignment) -> BTreeSet<i32> {
        a.values().flatten().copied().collect()
    }

    /// A client that owns exactly what it is told and gives up what it must at once.
    struct Client {
        id: String,
        epoch: i32,
        owned: Assignment,
    }

    impl Client {
        fn beat(&mut self, g: &mut ConsumerGroup, t: &Topics, l: &ConsumerLimits, now: Instant) -> HeartbeatAnswer {
            let hb = if self.epoch == 0 { join(&self.id) } else { beat(&self.id, self.epoch, Some(&self.owned)) };
            let a = g.heartbeat(hb, t, l, now, || unreachable!()).expect("heartbeat");
            self.epoch = a.member_epoch;
            if let Some(assigned) = &a.assignment {
                self.owned = assigned.clone();
            }
            a
        }
    }

    /// No partition owned by two clients at once.
    fn exclusive(clients: &[Client]) {
        let mut seen = BTreeSet::new();
        for c in clients {
            for (t, ps) in &c.owned {
                for p in ps {
                    assert!(seen.insert((*t, *p)), "partition {p} owned twice");
                }
            }
        }
    }

    #[test]
    fn three_members_with_range_settle_at_three_three_two_without_double_ownership() {
        let (t, l, now) = (topics(8), limits("range"), Instant::now());
        let mut g = ConsumerGroup::default();
        let mut clients: Vec<Client> = ["a", "b", "c"]
            .iter()
            .map(|id| Client { id: id.to_string(), epoch: 0, owned: Assignment::new() })
            .collect();
        // a joins alone and takes everything.
        let first = clients[0].beat(&mut g, &t, &l, now);
        assert_eq!((first.member_epoch, parts(first.assignment.as_ref().expect("assigned")).len()), (1, 8));
        assert_eq!(first.heartbeat_interval_ms, 200, "the group is settling");
        for _ in 0..5 {
            for i in 0..3 {
                clients[i].beat(&mut g, &t, &l, now);
                exclusive(&clients);
            }
        }
        let sizes: Vec<usize> = clients.iter().map(|c| parts(&c.owned).len()).collect();
        assert_eq!(sizes, vec![3, 3, 2]);
        assert_eq!(g.state_name(), "Stable");
        assert_eq!(g.assignor.as_deref(), Some("range"));
        assert!(clients.iter().all(|c| c.epoch == g.assignment_epoch));
        // c leaves: a and b share its partitions, again without overlap.
        let gone = g.heartbeat(beat("c", LEAVE_EPOCH, None), &t, &l, now, || unreachable!()).expect("left");
        assert_eq!(gone.member_epoch, LEAVE_EPOCH);
        clients.pop();
        for _ in 0..3 {
            for i in 0..2 {
                clients[i].beat(&mut g, &t, &l, now);
                exclusive(&clients);
            }
        }
        assert_eq!(clients.iter().map(|c| parts(&c.owned).len()).collect::<Vec<_>>(), vec![4, 4]);
        for id in ["a", "b"] {
            g.heartbeat(beat(id, LEAVE_EPOCH, None), &t, &l, now, || unreachable!()).expect("left");
        }
        assert_eq!((g.state_name(), g.assignor.as_deref()), ("Empty", Some("range")), "it shows what it used");
    }

    #[test]
    fn a_partition_waits_until_its_old_owner_revokes_it() {
        let (t, l, now) = (topics(2), limits("uniform"), Instant::now());
        let mut g = ConsumerGroup::default();
        let mut a = Client { id: "a".into(), epoch: 0, owned: Assignment::new() };
        let mut b = Client { id: "b".into(), epoch: 0, owned: Assignment::new() };
        a.beat(&mut g, &t, &l, now);
        assert_eq!(parts(&a.owned).len(), 2);
        let joined = b.beat(&mut g, &t, &l, now);
        assert_eq!(joined.assignment.as_ref().map(parts), Some(BTreeSet::new()), "a still owns both");
        assert_eq!(g.members["b"].state, MemberState::UnreleasedPartitions);
        // a is told to give one up, at its old epoch; it has not yet.
        let told = g.heartbeat(beat("a", a.epoch, Some(&a.owned)), &t, &l, now, || unreachable!()).expect("ok");
        assert_eq!(told.member_epoch, 1);
        assert_eq!(told.assignment.as_ref().map(parts).map(|p| p.len()), Some(1));
        assert_eq!(b.beat(&mut g, &t, &l, now).assignment, None, "nothing freed yet");
        a.owned = told.assignment.unwrap_or_default();
        a.beat(&mut g, &t, &l, now);
        assert_eq!(a.epoch, 2, "revoked: a moves to the new epoch");
        b.beat(&mut g, &t, &l, now);
        assert_eq!(parts(&b.owned).len(), 1);
        assert_eq!(g.state_name(), "Stable");
    }

    #[test]
    fn epochs_are_fenced_and_errors_are_kafkas() {
        let (t, l, now) = (topics(2), limits("uniform"), Instant::now());
        let mut g = ConsumerGroup::default();
        let mut a = Client { id: "a".into(), epoch: 0, owned: Assignment::new() };
        a.beat(&mut g, &t, &l, now);
        let hb = |e| beat("a", e, None);
        assert_eq!(g.heartbeat(hb(5), &t, &l, now, String::new), Err(ResponseError::FencedMemberEpoch));
        assert_eq!(g.heartbeat(beat("zz", 1, None), &t, &l, now, String::new), Err(ResponseError::UnknownMemberId));
        let bad = Heartbeat { server_assignor: Some("sticky".into()), ..join("b") };
        assert_eq!(g.heartbeat(bad, &t, &l, now, String::new), Err(ResponseError::UnsupportedAssignor));
        let bad = Heartbeat { regex: Some("(".into()), topics: None, ..join("b") };
        assert_eq!(g.heartbeat(bad, &t, &l, now, String::new), Err(ResponseError::InvalidRegularExpression));
        assert_eq!(g.check_member_epoch("a", 1, ResponseError::StaleMemberEpoch), Ok(()));
        assert_eq!(g.check_member_epoch("a", 0, ResponseError::StaleMemberEpoch), Err(ResponseError::StaleMemberEpoch));
        assert_eq!(g.check_member_epoch("", -1, ResponseError::StaleMemberEpoch), Err(ResponseError::UnknownMemberId));
        // A lost response: the previous epoch with nothing beyond what it was given is fine.
        let mut b = Client { id: "b".into(), epoch: 0, owned: Assignment::new() };
        b.beat(&mut g, &t, &l, now);
        a.beat(&mut g, &t, &l, now);
        a.beat(&mut g, &t, &l, now);
        assert_eq!(a.epoch, 2);
        assert!(g.heartbeat(beat("a", 1, Some(&a.owned)), &t, &l, now, String::new).is_ok());
    }

    #[test]
    fn sessions_and_revocations_expire_and_a_static_member_comes_back_to_its_partitions() {
        let (t, l, now) = (topics(4), limits("range"), Instant::now());
        let mut g = ConsumerGroup::default();
        let s = Heartbeat { instance_id: Some("i1".into()), ..join("s1") };
        let first = g.heartbeat(s, &t, &l, now, String::new).expect("joined");
        let mut b = Client { id: "b".into(), epoch: 0, owned: Assignment::new() };
        b.beat(&mut g, &t, &l, now);
        let owned = first.assignment.unwrap_or_default();
        let told = g.heartbeat(beat("s1", 1, Some(&owned)), &t, &l, now, String::new).expect("ok");
        let kept = told.assignment.unwrap_or_default();
        g.heartbeat(beat("s1", 1, Some(&kept)), &t, &l, now, String::new).expect("ok");
        let epoch = g.members["s1"].epoch;
        // The static member goes away for a while and comes back as s2.
        let away = Heartbeat { instance_id: Some("i1".into()), ..beat("s1", STATIC_LEAVE_EPOCH, None) };
        assert_eq!(g.heartbeat(away, &t, &l, now, String::new).map(|a| a.member_epoch), Ok(STATIC_LEAVE_EPOCH));
        let group_epoch = g.group_epoch;
        let back = Heartbeat { instance_id: Some("i1".into()), ..join("s2") };
        let back = g.heartbeat(back, &t, &l, now, String::new).expect("back");
        assert_eq!((back.member_epoch, g.group_epoch), (epoch, group_epoch), "no rebalance");
        assert_eq!(back.assignment, Some(kept));
        let twin = Heartbeat { instance_id: Some("i1".into()), ..join("s3") };
        assert_eq!(g.heartbeat(twin, &t, &l, now, String::new), Err(ResponseError::UnreleasedInstanceId));
        // b stops heartbeating: its session ends.
        let later = now + Duration::from_secs(46);
        g.members.get_mut("s2").expect("member").last_seen = later;
        assert_eq!(g.expire(&l, later), vec!["b".to_string()]);
        assert_eq!(g.state_name(), "Assigning");
        g.heartbeat(beat("s2", epoch, None), &t, &l, later, String::new).expect("ok");
        assert_eq!(g.target["s2"].values().flatten().count(), 4);
    }

    #[test]
    fn subscription_patterns_must_be_valid_and_match_whole_names() {
        assert!(valid_regex("orders-.*"));
        assert!(!valid_regex("a)|(b"), "it would escape the anchors");
        let re = whole_names("orders-.*").expect("valid");
        assert!(re.is_match("orders-eu") && !re.is_match("old-orders-eu"));
    }

    #[test]
    fn regex_subscriptions_follow_new_topics() {
        let l = limits("range");
        let now = Instant::now();
        let mut t = topics(2);
        let mut g = ConsumerGroup::default();
        let hb = Heartbeat { topics: None, regex: Some("t|orders-.*".into()), ..join("a") };
        let a = g.heartbeat(hb, &t, &l, now, String::new).expect("joined");
        assert_eq!(a.assignment.as_ref().map(|a| a.len()), Some(1));
        t.insert("orders-eu".into(), TopicInfo { id: TopicId(9), partitions: 3 });
        t.insert("xorders-eu".into(), TopicInfo { id: TopicId(11), partitions: 3 });
        let next = g.heartbeat(beat("a", 1, a.assignment.as_ref()), &t, &l, now, String::new).expect("ok");
        assert_eq!(next.member_epoch, 2);
        assert_eq!(next.assignment.map(|a| a.keys().copied().collect::<Vec<_>>()), Some(vec![TopicId(7), TopicId(9)]));
    }

    #[test]
    fn stored_state_round_trips() {
        let (t, l, now) = (topics(3), limits("range"), Instant::now());
        let mut g = ConsumerGroup::default();
        g.heartbeat(join("a"), &t, &l, now, String::new).expect("joined");
        let json = serde_json::to_vec(&g).expect("encodes");
        let back: ConsumerGroup = serde_json::from_slice::<ConsumerGroup>(&json).expect("decodes").restored(now);
        assert_eq!((back.group_epoch, back.assignment_epoch), (1, 1));
        assert_eq!(back.members["a"].assigned, g.members["a"].assigned);
    }
}
