//! Classic members in a group of the consumer protocol: KIP-848's online
//! migration. A classic group converts when a member of the new protocol
//! joins it; its members stay, still speaking JoinGroup, SyncGroup and
//! Heartbeat, and the broker's assignor assigns them too. It converts back
//! when the last member of the new protocol leaves.
//!
//! A classic member learns of a new assignment only by rejoining, so its
//! heartbeats answer REBALANCE_IN_PROGRESS until it is at the assignment
//! epoch with its whole target. Its JoinGroup metadata says what it owns
//! (an eager consumer gives everything up before it rejoins, a cooperative
//! one keeps its partitions and lists them), which is what lets it move on
//! from revoking; SyncGroup hands it the partitions it may own at its epoch,
//! which is its JoinGroup generation.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::ResponseError;
use serde::{Deserialize, Serialize};
use strom_raft::TopicId;

use super::{intersect, normalized, Assignment, ConsumerGroup, ConsumerLimits, ConsumerMember, MemberState, Topics};
use crate::group::assignment::{decode_assignment, decode_subscription_full, encode_assignment};

/// What a classic member brings that a member of the new protocol does not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassicProtocol {
    pub session_timeout_ms: i32,
    /// Its protocols (assignor names) in its order of preference, with their metadata.
    pub protocols: Vec<(String, Vec<u8>)>,
}

/// A classic member as JoinGroup states it, or as a classic group hands it over.
#[derive(Debug, Clone)]
pub struct ClassicJoin {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocols: Vec<(String, Bytes)>,
}

/// The answer to a classic member's JoinGroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassicJoined {
    pub member_id: String,
    /// The member's epoch, which is its generation.
    pub generation: i32,
    /// The member's first protocol: the broker assigns, but the name tells
    /// the client whether it rebalances eagerly or cooperatively.
    pub protocol: String,
}

/// Partitions by topic name, as the classic protocol's assignment bytes carry them.
pub type NamedAssignment = Vec<(String, Vec<i32>)>;

/// A member handed back to a classic group: its protocols and what it owns.
#[derive(Debug, Clone)]
pub struct ClassicHandover {
    pub join: ClassicJoin,
    /// Assignment bytes of what it owns.
    pub assignment: Bytes,
}

fn resolve(named: &[(String, Vec<i32>)], topics: &Topics) -> Assignment {
    let mut out = Assignment::new();
    for (name, ps) in named {
        if let Some(t) = topics.get(name) {
            out.entry(t.id).or_default().extend(ps.iter().copied().filter(|p| (0..t.partitions).contains(p)));
        }
    }
    normalized(out)
}

fn union(a: &Assignment, b: &Assignment) -> Assignment {
    let mut out = a.clone();
    for (t, ps) in b {
        out.entry(*t).or_default().extend(ps);
    }
    normalized(out)
}

impl ConsumerMember {
    pub fn is_classic(&self) -> bool {
        self.classic.is_some()
    }

    /// How long it may stay silent: a classic member's own session timeout.
    pub(super) fn session_timeout(&self, limits: &ConsumerLimits) -> Duration {
        match &self.classic {
            Some(c) => Duration::from_millis(c.session_timeout_ms.max(0) as u64),
            None => limits.session_timeout,
        }
    }
}

impl ConsumerGroup {
    /// A classic group's members taken over at `generation` (which becomes
    /// their epoch and the group's): each keeps what it owns, both what its
    /// last assignment gave it and what its metadata says it still holds
    /// (mid-rebalance a cooperative member owns partitions its cleared
    /// assignment no longer shows).
    pub fn from_classic(members: Vec<ClassicHandover>, generation: i32, topics: &Topics, now: Instant) -> Self {
        let epoch = generation.max(0);
        let mut group =
            ConsumerGroup { group_epoch: epoch, assignment_epoch: epoch, dirty: true, ..Default::default() };
        for ClassicHandover { join, assignment } in members {
            let sub = join.protocols.first().and_then(|(_, m)| decode_subscription_full(m)).unwrap_or_default();
            let given = decode_assignment(&assignment).unwrap_or_default();
            let owned = union(&resolve(&given, topics), &resolve(&sub.owned, topics));
            let mut m = new_classic_member(&join, sub.rack.clone(), now);
            m.topics = sorted(sub.topics);
            m.epoch = epoch;
            m.assigned = owned.clone();
            group.target.insert(m.id.clone(), owned);
            group.members.insert(m.id.clone(), m);
        }
        let wanted = group.subscribed_topics(topics);
        group.topics_seen = topics.iter().filter(|(n, _)| wanted.contains(*n)).map(|(n, t)| (n.clone(), *t)).collect();
        group
    }

    /// Whether the group has members and every one of them is classic: it
    /// goes back to being a classic group.
    pub fn all_classic(&self) -> bool {
        !self.members.is_empty() && self.members.values().all(|m| m.is_classic())
    }

    /// The members as a classic group takes them back, each with what it owns.
    pub fn into_classic(self) -> Vec<ClassicHandover> {
        let names: BTreeMap<TopicId, &String> = self.topics_seen.iter().map(|(n, t)| (t.id, n)).collect();
        self.members
            .values()
            .filter_map(|m| {
                let c = m.classic.as_ref()?;
                let owned: Vec<(String, Vec<i32>)> = union(&m.assigned, &m.revoking)
                    .iter()
                    .filter_map(|(t, ps)| Some((names.get(t)?.to_string(), ps.iter().copied().collect())))
                    .collect();
                Some(ClassicHandover {
                    join: ClassicJoin {
                        member_id: m.id.clone(),
                        instance_id: m.instance_id.clone(),
                        client_id: m.client_id.clone(),
                        client_host: m.client_host.clone(),
                        session_timeout_ms: c.session_timeout_ms,
                        rebalance_timeout_ms: m.rebalance_timeout_ms,
                        protocols: c.protocols.iter().map(|(n, meta)| (n.clone(), Bytes::from(meta.clone()))).collect(),
                    },
                    assignment: encode_assignment(&owned),
                })
            })
            .collect()
    }

    /// Whether a classic member with `protocols` can join: it must share a
    /// protocol with every classic member already in (other than itself),
    /// so that the group can go back to being a classic one.
    fn classic_protocols_fit(&self, member_id: &str, protocols: &[(String, Bytes)]) -> bool {
        self.members
            .values()
            .filter(|m| m.id != member_id)
            .filter_map(|m| m.classic.as_ref())
            .all(|c| protocols.iter().any(|(name, _)| c.protocols.iter().any(|(theirs, _)| theirs == name)))
    }

    fn classic_member(&self, member_id: &str, instance_id: Option<&str>) -> Result<&ConsumerMember, ResponseError> {
        let m = self.members.get(member_id).filter(|m| m.is_classic()).ok_or(ResponseError::UnknownMemberId)?;
        if instance_id.is_some() && m.instance_id.as_deref() != instance_id {
            return Err(ResponseError::FencedInstanceId);
        }
        Ok(m)
    }

    /// A classic member's JoinGroup. A new member (no member id) is given
    /// one; a member id the group does not know is UNKNOWN_MEMBER_ID, so a
    /// member that was removed gives its partitions up before it comes back.
    /// A static member coming back under a new id takes its old place.
    pub fn classic_join(
        &mut self,
        req: ClassicJoin,
        topics: &Topics,
        limits: &ConsumerLimits,
        now: Instant,
        new_member_id: impl FnOnce() -> String,
    ) -> Result<ClassicJoined, ResponseError> {
        let Some((protocol, metadata)) = req.protocols.first() else {
            return Err(ResponseError::InconsistentGroupProtocol);
        };
        let sub = decode_subscription_full(metadata).ok_or(ResponseError::InconsistentGroupProtocol)?;
        let protocol = protocol.clone();
        let static_previous = req.instance_id.as_deref().and_then(|i| self.static_member(i));
        let member_id = match (&static_previous, req.member_id.is_empty()) {
            (Some(previous), _) if *previous == req.member_id => req.member_id.clone(),
            (Some(_), false) => return Err(ResponseError::FencedInstanceId),
            (Some(_), true) | (None, true) => new_member_id(),
            (None, false) if self.members.get(&req.member_id).is_some_and(|m| m.is_classic()) => req.member_id.clone(),
            (None, false) => return Err(ResponseError::UnknownMemberId),
        };
        if !self.classic_protocols_fit(static_previous.as_deref().unwrap_or(&member_id), &req.protocols) {
            return Err(ResponseError::InconsistentGroupProtocol);
        }
        match static_previous {
            Some(previous) if previous != member_id => {
                // The old instance is fenced: its id is gone.
                if let Some(mut m) = self.members.remove(&previous) {
                    m.id = member_id.clone();
                    if let Some(t) = self.target.remove(&previous) {
                        self.target.insert(member_id.clone(), t);
                    }
                    self.members.insert(member_id.clone(), m);
                }
            }
            _ => {}
        }
        if !self.members.contains_key(&member_id) {
            if self.members.len() >= limits.max_size {
                return Err(ResponseError::GroupMaxSizeReached);
            }
            let mut m = new_classic_member(&req, sub.rack.clone(), now);
            m.id = member_id.clone();
            self.members.insert(member_id.clone(), m);
            self.bump();
        }
        let owned = resolve(&sub.owned, topics);
        let mut resubscribed = false;
        if let Some(m) = self.members.get_mut(&member_id) {
            let stated = (m.rack_id.clone(), m.rebalance_timeout_ms, m.classic.clone(), m.client_id.clone());
            let topics = sorted(sub.topics);
            resubscribed = topics != m.topics;
            m.topics = topics;
            m.rack_id = sub.rack;
            m.rebalance_timeout_ms = req.rebalance_timeout_ms;
            m.classic = Some(ClassicProtocol {
                session_timeout_ms: req.session_timeout_ms,
                protocols: req.protocols.iter().map(|(n, meta)| (n.clone(), meta.to_vec())).collect(),
            });
            m.client_id = req.client_id;
            m.client_host = req.client_host;
            m.last_seen = now;
            // What it no longer lists it has given up (an eager member gives
            // up everything to rejoin); if that was part of its target, it
            // gets it back below.
            let had = m.assigned.clone();
            m.assigned = intersect(&m.assigned, &owned);
            m.revoking = intersect(&m.revoking, &owned);
            if m.assigned != had && m.state == MemberState::Stable {
                m.state = MemberState::UnreleasedPartitions;
            }
            if stated != (m.rack_id.clone(), m.rebalance_timeout_ms, m.classic.clone(), m.client_id.clone()) {
                self.dirty = true;
            }
        }
        if resubscribed {
            self.bump();
        }
        self.refresh_target(topics, limits, now);
        self.reconcile(&member_id, Some(&owned), now);
        let m = self.members.get(&member_id).ok_or(ResponseError::UnknownMemberId)?;
        Ok(ClassicJoined { member_id, generation: m.epoch, protocol })
    }

    /// A classic member's SyncGroup: the partitions it may own at its epoch,
    /// by topic name, and the protocol it joined with.
    pub fn classic_sync(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
        protocol_type: Option<&str>,
        protocol: Option<&str>,
        now: Instant,
    ) -> Result<(String, NamedAssignment), ResponseError> {
        let m = self.classic_member(member_id, instance_id)?;
        if generation != m.epoch {
            return Err(ResponseError::IllegalGeneration);
        }
        let joined_with =
            m.classic.as_ref().and_then(|c| c.protocols.first()).map(|(n, _)| n.clone()).unwrap_or_default();
        if protocol_type.is_some_and(|t| t != "consumer") || protocol.is_some_and(|p| p != joined_with) {
            return Err(ResponseError::InconsistentGroupProtocol);
        }
        let names: BTreeMap<TopicId, &String> = self.topics_seen.iter().map(|(n, t)| (t.id, n)).collect();
        let assigned = m
            .assigned
            .iter()
            .filter_map(|(t, ps)| Some((names.get(t)?.to_string(), ps.iter().copied().collect())))
            .collect();
        if let Some(m) = self.members.get_mut(member_id) {
            m.last_seen = now;
        }
        Ok((joined_with, assigned))
    }

    /// A classic member's Heartbeat: REBALANCE_IN_PROGRESS while it has
    /// partitions to give up or to receive, which it learns by rejoining.
    pub fn classic_heartbeat(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
        topics: &Topics,
        limits: &ConsumerLimits,
        now: Instant,
    ) -> Result<(), ResponseError> {
        self.classic_member(member_id, instance_id)?;
        if let Some(m) = self.members.get_mut(member_id) {
            m.last_seen = now;
        }
        self.refresh_target(topics, limits, now);
        let m = self.classic_member(member_id, instance_id)?;
        if generation != m.epoch {
            return Err(ResponseError::IllegalGeneration);
        }
        let settled = m.epoch == self.assignment_epoch
            && m.state == MemberState::Stable
            && self.target.get(member_id).is_none_or(|t| *t == m.assigned);
        if settled {
            Ok(())
        } else {
            Err(ResponseError::RebalanceInProgress)
        }
    }

    /// A classic member's LeaveGroup (by member id, or by instance id for a
    /// static member); the id of the member that left.
    pub fn classic_leave(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        topics: &Topics,
        limits: &ConsumerLimits,
        now: Instant,
    ) -> Result<String, ResponseError> {
        let id = match instance_id {
            Some(instance) => {
                let id = self.static_member(instance).ok_or(ResponseError::UnknownMemberId)?;
                if !member_id.is_empty() && member_id != id {
                    return Err(ResponseError::FencedInstanceId);
                }
                id
            }
            None => member_id.to_string(),
        };
        self.classic_member(&id, None)?;
        self.remove(&id);
        self.refresh_target(topics, limits, now);
        Ok(id)
    }
}

fn sorted(mut topics: Vec<String>) -> Vec<String> {
    topics.sort();
    topics.dedup();
    topics
}

fn new_classic_member(join: &ClassicJoin, rack: Option<String>, now: Instant) -> ConsumerMember {
    ConsumerMember {
        rack_id: rack,
        client_id: join.client_id.clone(),
        client_host: join.client_host.clone(),
        rebalance_timeout_ms: join.rebalance_timeout_ms,
        classic: Some(ClassicProtocol {
            session_timeout_ms: join.session_timeout_ms,
            protocols: join.protocols.iter().map(|(n, m)| (n.clone(), m.to_vec())).collect(),
        }),
        ..ConsumerMember::new(&join.member_id, join.instance_id.clone(), now)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use bytes::{BufMut, BytesMut};
    use kafka_protocol::messages::consumer_protocol_subscription::TopicPartition as Owned;
    use kafka_protocol::messages::{ConsumerProtocolSubscription, TopicName};
    use kafka_protocol::protocol::{Encodable, StrBytes};

    use super::super::{Heartbeat, TopicInfo};
    use super::*;

    const T: TopicId = TopicId(7);

    fn limits() -> ConsumerLimits {
        ConsumerLimits {
            session_timeout: Duration::from_secs(45),
            heartbeat_interval: Duration::from_secs(5),
            assignors: vec!["uniform".to_string(), "range".to_string()],
            max_size: 100,
        }
    }

    fn topics() -> Topics {
        [("t".to_string(), TopicInfo { id: T, partitions: 6 })].into_iter().collect()
    }

    /// Subscription metadata (v1) to topic `t`, owning `owned`.
    fn metadata(owned: &[i32]) -> Bytes {
        let sub = ConsumerProtocolSubscription::default()
            .with_topics(vec![StrBytes::from_static_str("t")])
            .with_owned_partitions(vec![Owned::default()
                .with_topic(TopicName(StrBytes::from_static_str("t")))
                .with_partitions(owned.to_vec())]);
        let mut buf = BytesMut::new();
        buf.put_i16(1);
        sub.encode(&mut buf, 1).expect("encodes");
        buf.freeze()
    }

    fn join(id: &str, instance: Option<&str>, protocol: &str, owned: &[i32]) -> ClassicJoin {
        ClassicJoin {
            member_id: id.to_string(),
            instance_id: instance.map(str::to_string),
            client_id: "c".to_string(),
            client_host: "/127.0.0.1".to_string(),
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 30_000,
            protocols: vec![(protocol.to_string(), metadata(owned))],
        }
    }

    fn parts(a: &Assignment) -> BTreeSet<i32> {
        a.values().flatten().copied().collect()
    }

    /// Every partition is held (assigned or being revoked) by one member at most.
    fn exclusive(g: &ConsumerGroup) {
        let mut seen = BTreeSet::new();
        for m in g.members.values() {
            for (t, p) in m.owns() {
                assert!(seen.insert((t, p)), "partition {p} held by two members");
            }
        }
    }

    /// A classic group of a (0-2) and b (3-5) at generation 5, taken over.
    fn converted(now: Instant) -> ConsumerGroup {
        let handed = vec![
            ClassicHandover {
                join: join("a", None, "cooperative-sticky", &[]),
                assignment: encode_assignment(&[("t".to_string(), vec![0, 1, 2])]),
            },
            // Mid-rebalance: its assignment is cleared, but its metadata says what it keeps.
            ClassicHandover { join: join("b", None, "cooperative-sticky", &[3, 4, 5]), assignment: Bytes::new() },
        ];
        let g = ConsumerGroup::from_classic(handed, 5, &topics(), now);
        assert_eq!((g.group_epoch, g.assignment_epoch), (5, 5));
        assert_eq!(parts(&g.members["a"].assigned), BTreeSet::from([0, 1, 2]));
        assert_eq!(parts(&g.members["b"].assigned), BTreeSet::from([3, 4, 5]));
        assert!(g.all_classic());
        exclusive(&g);
        g
    }

    #[test]
    fn classic_members_make_room_for_a_new_member_by_rejoining_and_the_group_goes_back_when_it_leaves() {
        let (t, l, now) = (topics(), limits(), Instant::now());
        let mut g = converted(now);
        // A member of the new protocol joins: a new target, nothing it may take yet.
        let hb = Heartbeat {
            member_id: "n".into(),
            member_epoch: 0,
            rebalance_timeout_ms: 30_000,
            topics: Some(vec!["t".into()]),
            owned: Some(Assignment::new()),
            ..Default::default()
        };
        let n = g.heartbeat(hb, &t, &l, now, || unreachable!()).expect("joined");
        assert_eq!(n.member_epoch, 6);
        assert_eq!(n.assignment, Some(Assignment::new()));
        assert!(!g.all_classic());
        // Each classic member is told to rejoin; rejoining, it is told to give up one partition.
        for (id, had) in [("a", vec![0, 1, 2]), ("b", vec![3, 4, 5])] {
            assert_eq!(g.classic_heartbeat(id, None, 5, &t, &l, now), Err(ResponseError::RebalanceInProgress));
            let j = g.classic_join(join(id, None, "cooperative-sticky", &had), &t, &l, now, || unreachable!());
            let j = j.expect("rejoined");
            assert_eq!((j.member_id.as_str(), j.generation, j.protocol.as_str()), (id, 5, "cooperative-sticky"));
            let (_, kept) = g.classic_sync(id, None, 5, Some("consumer"), None, now).expect("synced");
            assert_eq!(kept[0].1.len(), 2, "{id} keeps two of three");
            exclusive(&g);
            // It revokes the third and rejoins owning two: the new epoch.
            let j = g.classic_join(join(id, None, "cooperative-sticky", &kept[0].1), &t, &l, now, || unreachable!());
            assert_eq!(j.expect("rejoined").generation, 6);
            assert_eq!(g.classic_sync(id, None, 5, None, None, now), Err(ResponseError::IllegalGeneration));
            assert_eq!(g.classic_heartbeat(id, None, 6, &t, &l, now), Ok(()));
            exclusive(&g);
        }
        // Now the new member gets what the others gave up.
        let hb = Heartbeat { member_id: "n".into(), member_epoch: 6, rebalance_timeout_ms: -1, ..Default::default() };
        let n = g.heartbeat(hb, &t, &l, now, || unreachable!()).expect("heartbeat");
        assert_eq!(n.assignment.as_ref().map(parts).map(|p| p.len()), Some(2));
        exclusive(&g);
        assert_eq!(g.state_name(), "Stable");
        // It leaves: only classic members are left, and they go back with what they own.
        let hb = Heartbeat { member_id: "n".into(), member_epoch: -1, ..Default::default() };
        g.heartbeat(hb, &t, &l, now, || unreachable!()).expect("left");
        assert!(g.all_classic());
        let back = g.into_classic();
        let owned: Vec<usize> =
            back.iter().map(|h| decode_assignment(&h.assignment).expect("an assignment")[0].1.len()).collect();
        assert_eq!(owned, vec![2, 2]);
        assert_eq!(back[0].join.protocols[0].0, "cooperative-sticky");
    }

    #[test]
    fn an_eager_member_rejoining_of_its_own_accord_gets_its_partitions_back() {
        let (t, l, now) = (topics(), limits(), Instant::now());
        let mut g = converted(now);
        // It gave everything up to rejoin, as an eager member does; nothing else changed.
        let j = g.classic_join(join("a", None, "cooperative-sticky", &[]), &t, &l, now, || unreachable!());
        let j = j.expect("rejoined");
        assert_eq!(j.generation, 5);
        let (_, got) = g.classic_sync("a", None, 5, None, None, now).expect("synced");
        assert_eq!(got, vec![("t".to_string(), vec![0, 1, 2])]);
        assert_eq!(g.classic_heartbeat("a", None, 5, &t, &l, now), Ok(()));
    }

    #[test]
    fn classic_requests_are_checked_like_kafkas() {
        let (t, l, now) = (topics(), limits(), Instant::now());
        let mut g = converted(now);
        let unknown = g.classic_join(join("zz", None, "range", &[]), &t, &l, now, || unreachable!());
        assert_eq!(unknown, Err(ResponseError::UnknownMemberId), "a removed member gives up its partitions first");
        let foreign = g.classic_join(join("", None, "roundrobin", &[]), &t, &l, now, || "x".into());
        assert_eq!(foreign, Err(ResponseError::InconsistentGroupProtocol), "it could not go back to classic");
        assert_eq!(g.classic_sync("a", None, 4, None, None, now), Err(ResponseError::IllegalGeneration));
        assert_eq!(
            g.classic_sync("a", None, 5, Some("connect"), None, now),
            Err(ResponseError::InconsistentGroupProtocol)
        );
        assert_eq!(
            g.classic_sync("a", None, 5, None, Some("range"), now),
            Err(ResponseError::InconsistentGroupProtocol)
        );
        assert_eq!(g.classic_heartbeat("a", Some("other"), 5, &t, &l, now), Err(ResponseError::FencedInstanceId));
        assert_eq!(g.classic_heartbeat("a", None, 5, &t, &l, now), Ok(()));
        // A classic member's id is not one of the new protocol.
        let hb = Heartbeat { member_id: "a".into(), member_epoch: 5, ..Default::default() };
        assert_eq!(g.heartbeat(hb, &t, &l, now, || unreachable!()), Err(ResponseError::UnknownMemberId));
        // A new dynamic member is given an id and waits for partitions.
        let j = g.classic_join(join("", None, "cooperative-sticky", &[]), &t, &l, now, || "c".into()).expect("joined");
        assert_eq!((j.member_id.as_str(), j.generation), ("c", 6));
        assert_eq!(g.members["c"].state, MemberState::UnreleasedPartitions);
        assert_eq!(g.classic_heartbeat("c", None, 6, &t, &l, now), Err(ResponseError::RebalanceInProgress));
        assert_eq!(g.classic_leave("c", None, &t, &l, now), Ok("c".to_string()));
        assert_eq!(g.classic_leave("c", None, &t, &l, now), Err(ResponseError::UnknownMemberId));
    }

    #[test]
    fn classic_sessions_are_their_own_and_a_static_member_comes_back_under_a_new_id() {
        let (t, l, now) = (topics(), limits(), Instant::now());
        let mut g = ConsumerGroup::default();
        let j = g.classic_join(join("", Some("i-1"), "range", &[]), &t, &l, now, || "s1".into()).expect("joined");
        assert_eq!(j.member_id, "s1");
        assert_eq!(parts(&g.members["s1"].assigned).len(), 6);
        // Restarted, it joins with no member id: it takes its old place, the old id is fenced.
        let j = g.classic_join(join("", Some("i-1"), "range", &[]), &t, &l, now, || "s2".into()).expect("joined");
        assert_eq!(j.member_id, "s2");
        assert_eq!(g.classic_heartbeat("s1", None, j.generation, &t, &l, now), Err(ResponseError::UnknownMemberId));
        assert_eq!(
            g.classic_join(join("s1", Some("i-1"), "range", &[]), &t, &l, now, || unreachable!()),
            Err(ResponseError::FencedInstanceId)
        );
        // Its own session timeout (10 s), not the group's (45 s).
        assert!(g.expire(&l, now + Duration::from_secs(9)).is_empty());
        assert_eq!(g.expire(&l, now + Duration::from_secs(11)), vec!["s2".to_string()]);
    }
}
