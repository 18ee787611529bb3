//! Membership: who is in a group. JoinGroup's entry (new, pending, static
//! and known members), Heartbeat, LeaveGroup, and removing members.
//!
//! A dynamic member joining with JoinGroup v4+ and no member id takes a round
//! trip first (KIP-394): it is given an id, answered MEMBER_ID_REQUIRED, and
//! counts only once it joins again with that id. A join its client abandons
//! (a subscription change, a timeout) then leaves at most a pending id that
//! lapses after the session timeout, never a member a rebalance waits for.
//! Static members skip the round trip, as in Kafka.

use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::ResponseError;

use super::*;

/// Pending member ids a group keeps at most; past it the one closest to
/// lapsing goes (its client, if any, is told UNKNOWN_MEMBER_ID and starts over).
pub(super) const MAX_PENDING_MEMBERS: usize = 1024;

impl Group {
    /// Checks a member id and instance id against the group: the error to answer, if any.
    pub(super) fn check_member(&self, member_id: &str, instance_id: Option<&str>) -> Result<(), ResponseError> {
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
    pub(super) fn supports(&self, protocol_type: &str, protocols: &[(String, Bytes)]) -> bool {
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
        tracing::debug!(group = %self.id, member = %req.member_id, client = %req.client_id,
            state = self.state.name(), generation = self.generation, "JoinGroup");
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
            if req.require_known_member_id && req.instance_id.is_none() {
                self.add_pending_member(&id, session, now);
                let _ = reply.send(JoinResult::error(ResponseError::MemberIdRequired, &id));
                return;
            }
            self.add_member(id, req, reply, limits, now, now_ms);
            return;
        }
        if req.instance_id.is_none() && self.pending_members.remove(&req.member_id).is_some() {
            // KIP-394's second JoinGroup: the member now knows its id.
            if self.members.len() >= limits.max_size {
                let _ = reply.send(JoinResult::error(ResponseError::GroupMaxSizeReached, &req.member_id));
                return;
            }
            let id = req.member_id.clone();
            self.add_member(id, req, reply, limits, now, now_ms);
            return;
        }
        if let Err(e) = self.check_member(&req.member_id, req.instance_id.as_deref()) {
            let _ = reply.send(JoinResult::error(e, &req.member_id));
            return;
        }
        self.rejoin(req, reply, limits, now, now_ms);
    }

    /// Remembers a member id handed out with MEMBER_ID_REQUIRED until `session` from now.
    fn add_pending_member(&mut self, id: &str, session: Duration, now: Instant) {
        if self.pending_members.len() >= MAX_PENDING_MEMBERS {
            let oldest = self.pending_members.iter().min_by_key(|(_, until)| **until).map(|(id, _)| id.clone());
            if let Some(oldest) = oldest {
                self.pending_members.remove(&oldest);
            }
        }
        self.pending_members.insert(id.to_string(), now + session);
        debug_assert!(self.pending_members.len() <= MAX_PENDING_MEMBERS);
    }

    /// Drops pending member ids whose member did not join in time.
    pub(super) fn expire_pending_members(&mut self, now: Instant) {
        let before = self.pending_members.len();
        self.pending_members.retain(|_, until| now < *until);
        let lapsed = before - self.pending_members.len();
        if lapsed > 0 {
            tracing::debug!(group = %self.id, lapsed, "pending member ids lapsed (KIP-394)");
        }
    }

    /// Whether `member_id` was handed out with MEMBER_ID_REQUIRED and not used yet.
    pub fn is_pending_member(&self, member_id: &str) -> bool {
        self.pending_members.contains_key(member_id)
    }

    pub(super) fn add_member(
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
    pub(super) fn replace_static_member(
        &mut self,
        old_id: &str,
        req: JoinRequest,
        reply: JoinReply,
        now: Instant,
        now_ms: i64,
    ) {
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
        if self.pending_sync.remove(old_id) {
            self.pending_sync.insert(new_id.clone());
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

    pub(super) fn rejoin(
        &mut self,
        req: JoinRequest,
        reply: JoinReply,
        limits: &GroupLimits,
        now: Instant,
        now_ms: i64,
    ) {
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

    pub(super) fn remove_member(&mut self, id: &str) -> Option<Member> {
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
        self.pending_sync.remove(id);
        Some(m)
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
        tracing::debug!(group = %self.id, member = %member_id, state = self.state.name(), "LeaveGroup");
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
        if instance_id.is_none() && self.pending_members.remove(&id).is_some() {
            // Not a member yet: nothing to rebalance (Kafka answers it without error).
            return Ok(id);
        }
        if !self.members.contains_key(&id) {
            return Err(ResponseError::UnknownMemberId);
        }
        self.remove_member(&id);
        self.after_member_left(now, now_ms);
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::*;
    use super::MAX_PENDING_MEMBERS;

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
        let auth = CommitAuth { member_id: &a, instance_id: None, generation: 2, member_epochs: false };
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
    fn a_new_dynamic_member_learns_its_id_before_it_joins() {
        let now = Instant::now();
        let mut g = Group::new("g", 0);
        let mut first = join(&mut g, join_req_v4(""), now);
        let first = got(&mut first).expect("answered at once");
        assert_eq!(first.error, Some(ResponseError::MemberIdRequired));
        assert!(!first.member_id.is_empty(), "the answer carries the id to join with");
        assert_eq!((g.state, g.members.len()), (GroupState::Empty, 0), "not a member yet");
        assert!(g.is_pending_member(&first.member_id));
        assert!(!g.is_unused(), "a pending id keeps the group");
        let mut second = join(&mut g, join_req_v4(&first.member_id), now);
        let second = got(&mut second).expect("alone, the join completes");
        assert_eq!((second.error, second.generation), (None, 1));
        assert_eq!(second.member_id, first.member_id);
        assert!(!g.is_pending_member(&first.member_id));
    }

    #[test]
    fn a_pending_member_holds_up_no_rebalance_and_lapses_after_its_session() {
        let now = Instant::now();
        let (mut g, a, b) = stable_pair(now);
        let short = JoinRequest { session_timeout_ms: 1000, ..join_req_v4("") };
        let mut pending = join(&mut g, short, now);
        let pending = got(&mut pending).expect("answered at once").member_id;
        assert_eq!(g.state, GroupState::Stable, "a pending member triggers no rebalance");
        // Its client abandons the join. The others rebalance without waiting for it.
        assert_eq!(g.leave(&b, None, now, 0), Ok(b.clone()));
        let mut ra = join(&mut g, join_req(&a, None), now);
        let ra = got(&mut ra).expect("the only member rejoined: the join phase ends");
        assert_eq!((ra.generation, ra.members.len()), (3, 1));
        g.tick(now + Duration::from_secs(2), 0);
        assert!(!g.is_pending_member(&pending), "lapsed after its session timeout");
        let mut late = join(&mut g, join_req_v4(&pending), now + Duration::from_secs(2));
        assert_eq!(got(&mut late).and_then(|r| r.error), Some(ResponseError::UnknownMemberId));
    }

    #[test]
    fn leaving_with_a_pending_id_is_answered_and_changes_nothing() {
        let now = Instant::now();
        let (mut g, _, _) = stable_pair(now);
        let mut pending = join(&mut g, join_req_v4(""), now);
        let pending = got(&mut pending).expect("answered").member_id;
        assert_eq!(g.leave(&pending, None, now, 0), Ok(pending.clone()));
        assert_eq!((g.state, g.members.len()), (GroupState::Stable, 2));
        assert!(!g.is_pending_member(&pending));
        assert_eq!(g.leave("nobody", None, now, 0), Err(ResponseError::UnknownMemberId));
    }

    #[test]
    fn static_members_and_old_versions_skip_the_round_trip() {
        let now = Instant::now();
        let mut g = Group::new("g", 0);
        let mut s = join(&mut g, JoinRequest { instance_id: Some("i1".into()), ..join_req_v4("") }, now);
        let s = got(&mut s).expect("joined at once");
        assert_eq!((s.error, s.generation), (None, 1));
        let mut old = join(&mut g, join_req("", None), now);
        assert!(got(&mut old).is_none(), "a v3 join is a member at once, parked for the rebalance");
        assert_eq!(g.members.len(), 2);
    }

    #[test]
    fn pending_member_ids_are_bounded() {
        let now = Instant::now();
        let mut g = Group::new("g", 0);
        let mut first = None;
        for i in 0..=MAX_PENDING_MEMBERS {
            let mut r = join(&mut g, join_req_v4(""), now + Duration::from_millis(i as u64));
            first.get_or_insert(got(&mut r).expect("answered").member_id);
        }
        assert_eq!(g.pending_members.len(), MAX_PENDING_MEMBERS);
        assert!(!g.is_pending_member(&first.unwrap_or_default()), "the one closest to lapsing went");
    }

    #[test]
    fn a_changed_subscription_rebalances_a_stable_or_completing_group() {
        let now = Instant::now();
        let (mut g, a, b) = stable_pair(now);
        let changed = |id: &str| JoinRequest {
            protocols: vec![("range".into(), Bytes::from_static(b"other topics"))],
            ..join_req(id, None)
        };
        let mut rb = join(&mut g, changed(&b), now);
        assert_eq!(g.state, GroupState::PreparingRebalance);
        assert!(got(&mut rb).is_none(), "parked until the leader rejoins");
        let mut ra = join(&mut g, join_req(&a, None), now);
        let (ra, rb) = (got(&mut ra).expect("joined"), got(&mut rb).expect("joined"));
        assert_eq!((ra.generation, rb.generation, g.state), (3, 3, GroupState::CompletingRebalance));
        // While completing: a follower's pending SyncGroup is told to rejoin.
        let mut sb = sync(&mut g, &b, 3, vec![]);
        let mut rb = join(&mut g, join_req(&b, None), now);
        assert_eq!(got(&mut sb).and_then(|r| r.error), Some(ResponseError::RebalanceInProgress));
        assert_eq!(g.state, GroupState::PreparingRebalance);
        assert!(got(&mut rb).is_none());
    }
}
