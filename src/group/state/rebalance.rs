//! Rebalance: the join phase (PreparingRebalance until every member rejoined
//! or the rebalance timeout passed), the sync phase (CompletingRebalance until
//! the leader's assignment is stored), and the timers that end both.
//!
//! Neither phase waits for ever on a member that went away: the join phase
//! ends at the rebalance timeout without the members that did not rejoin, and
//! members that do not send SyncGroup within the rebalance timeout after the
//! join phase are removed and the group rebalances again (Kafka's pending
//! sync), so an assignment handed to a member that never takes it does not
//! stand until that member's session runs out.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::ResponseError;

use super::*;

impl Group {
    pub(super) fn limits_from_members(&self) -> GroupLimits {
        GroupLimits {
            min_session_timeout: Duration::ZERO,
            max_session_timeout: Duration::MAX,
            max_size: usize::MAX,
            initial_rebalance_delay: Duration::ZERO,
        }
    }

    pub(super) fn join_result_for(&self, member_id: &str, with_members: bool) -> JoinResult {
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

    pub(super) fn prepare_rebalance(&mut self, limits: &GroupLimits, now: Instant, now_ms: i64) {
        if self.state == GroupState::CompletingRebalance {
            self.fail_pending_syncs(ResponseError::RebalanceInProgress);
        }
        let was_empty = self.state == GroupState::Empty;
        self.awaiting_store = None;
        self.pending_sync.clear();
        self.sync_deadline = None;
        let longest = self.rebalance_timeout();
        self.rebalance_deadline = Some(now + longest);
        self.initial_delay_until = (was_empty && !limits.initial_rebalance_delay.is_zero())
            .then(|| (now + limits.initial_rebalance_delay).min(now + longest));
        self.set_state(GroupState::PreparingRebalance, now_ms);
        self.maybe_complete_join(now, now_ms);
    }

    /// The group's rebalance timeout: its members' longest (Kafka's rule).
    fn rebalance_timeout(&self) -> Duration {
        self.members.values().map(|m| m.rebalance_timeout).max().unwrap_or_default()
    }

    pub(super) fn fail_pending_syncs(&mut self, error: ResponseError) {
        for m in self.members.values_mut() {
            if let Some(reply) = m.sync_reply.take() {
                let _ = reply.send(SyncResult::error(error));
            }
        }
    }

    /// Ends the join phase once every member has rejoined (and any initial
    /// delay is over), or when the rebalance timeout passes, dropping the
    /// members that did not rejoin.
    pub(super) fn maybe_complete_join(&mut self, now: Instant, now_ms: i64) {
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
            tracing::info!(group = %self.id, member = %id, "member did not rejoin within the rebalance timeout");
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
        self.pending_sync = self.members.keys().cloned().collect();
        self.sync_deadline = Some(now + self.rebalance_timeout());
        let leader = self.leader.clone().unwrap_or_default();
        let ids: Vec<String> = self.members.keys().cloned().collect();
        tracing::debug!(group = %self.id, generation = self.generation, %leader, members = ?ids, "join phase over");
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
    pub(super) fn select_protocol(&self) -> Option<String> {
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

    /// Handles a SyncGroup. When the leader brings the assignment, the group
    /// waits for it to be stored ([`Group::take_persist`], then [`Group::stored`]).
    pub fn sync(&mut self, req: SyncRequest<'_>, reply: SyncReply, now: Instant) {
        let SyncRequest { member_id, instance_id, generation, protocol_type, protocol, assignments } = req;
        tracing::debug!(group = %self.id, member = %member_id, generation, state = self.state.name(),
            group_generation = self.generation, "SyncGroup");
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
        if matches!(self.state, GroupState::CompletingRebalance | GroupState::Stable) {
            self.pending_sync.remove(member_id);
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

    pub(super) fn sync_result_for(&self, member_id: &str) -> SyncResult {
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

    pub(super) fn after_member_left(&mut self, now: Instant, now_ms: i64) {
        match self.state {
            GroupState::Stable | GroupState::CompletingRebalance => {
                let limits = self.limits_from_members();
                self.prepare_rebalance(&limits, now, now_ms);
            }
            GroupState::PreparingRebalance => self.maybe_complete_join(now, now_ms),
            GroupState::Empty | GroupState::Dead => {}
        }
    }

    /// Removes the members of the current generation that did not send
    /// SyncGroup within the rebalance timeout after the join phase ended.
    fn expire_pending_sync(&mut self, now: Instant, now_ms: i64) {
        if !matches!(self.state, GroupState::CompletingRebalance | GroupState::Stable) {
            return;
        }
        if self.sync_deadline.is_none_or(|d| now < d) {
            return;
        }
        self.sync_deadline = None;
        let silent: Vec<String> = std::mem::take(&mut self.pending_sync).into_iter().collect();
        if silent.is_empty() {
            return;
        }
        for id in &silent {
            tracing::info!(group = %self.id, member = %id, generation = self.generation, "member did not sync within the rebalance timeout");
            self.remove_member(id);
        }
        self.after_member_left(now, now_ms);
    }

    /// Expires members past their session, pending member ids past theirs
    /// and members that never synced, and ends join phases that are due.
    pub fn tick(&mut self, now: Instant, now_ms: i64) {
        self.expire_pending_members(now);
        self.expire_pending_sync(now, now_ms);
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
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::*;

    #[test]
    fn join_sync_reaches_stable_with_assignments() {
        stable_pair(Instant::now());
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
    fn members_that_never_sync_are_removed_at_the_rebalance_timeout() {
        let now = Instant::now();
        let mut g = Group::new("g", 0);
        // Long sessions: only the pending-sync timer can remove anyone here.
        let long = |id: &str| JoinRequest { session_timeout_ms: 120_000, ..join_req(id, None) };
        let mut a = join(&mut g, long(""), now);
        let a = got(&mut a).expect("joined").member_id;
        let mut b = join(&mut g, long(""), now);
        let mut a2 = join(&mut g, long(&a), now);
        let (a2, b) = (got(&mut a2).expect("joined"), got(&mut b).expect("joined").member_id);
        assert_eq!((a2.generation, g.state), (2, GroupState::CompletingRebalance));
        let assignments = vec![(a.clone(), Bytes::from_static(b"A")), (b.clone(), Bytes::from_static(b"B"))];
        let mut sa = sync(&mut g, &a, 2, assignments);
        g.take_persist();
        g.stored(2, Ok(()), now, 0);
        assert!(got(&mut sa).is_some_and(|r| r.error.is_none()));
        assert_eq!(g.state, GroupState::Stable);
        // b took its join answer but never syncs: at the rebalance timeout it goes.
        g.tick(now + Duration::from_secs(29), 0);
        assert_eq!((g.state, g.members.len()), (GroupState::Stable, 2));
        g.tick(now + Duration::from_secs(31), 0);
        assert!(!g.members.contains_key(&b));
        assert_eq!(g.state, GroupState::PreparingRebalance, "its partitions are handed out again");
        let mut ra = join(&mut g, long(&a), now + Duration::from_secs(31));
        assert_eq!(got(&mut ra).map(|r| (r.generation, r.members.len())), Some((3, 1)));
    }

    #[test]
    fn members_that_synced_are_not_removed_by_the_sync_timer() {
        let now = Instant::now();
        let (mut g, a, b) = stable_pair(now);
        g.heartbeat(&a, None, 2, now + Duration::from_secs(25)).expect("heartbeat");
        g.heartbeat(&b, None, 2, now + Duration::from_secs(25)).expect("heartbeat");
        g.tick(now + Duration::from_secs(31), 0);
        assert_eq!((g.state, g.members.len()), (GroupState::Stable, 2));
    }
}
