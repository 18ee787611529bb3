//! KIP-848's online migration, the classic side: a classic group hands its
//! members over when a member of the consumer protocol joins, and takes them
//! back when the last such member leaves.

use std::time::{Duration, Instant};

use kafka_protocol::ResponseError;

use super::*;
use crate::group::consumer::classic::{ClassicHandover, ClassicJoin};

impl Group {
    /// Whether the group can become one of the consumer protocol with its
    /// members: only a group of consumers (protocol type `consumer`).
    pub fn can_upgrade(&self) -> bool {
        self.state != GroupState::Dead && (self.members.is_empty() || self.protocol_type.as_deref() == Some("consumer"))
    }

    /// The members as the consumer protocol takes them over, with the
    /// generation they are at. Changes nothing: see [`Self::hand_over`].
    pub fn members_to_hand_over(&self) -> (Vec<ClassicHandover>, i32) {
        let handed = self
            .members
            .values()
            .map(|m| {
                // Its metadata for the group's protocol first: what it last
                // joined with, and owns.
                let mut protocols = m.protocols.clone();
                if let Some(i) = self.protocol.as_deref().and_then(|p| protocols.iter().position(|(n, _)| n == p)) {
                    let chosen = protocols.remove(i);
                    protocols.insert(0, chosen);
                }
                ClassicHandover {
                    join: ClassicJoin {
                        member_id: m.id.clone(),
                        instance_id: m.instance_id.clone(),
                        client_id: m.client_id.clone(),
                        client_host: m.client_host.clone(),
                        session_timeout_ms: m.session_timeout.as_millis().min(i32::MAX as u128) as i32,
                        rebalance_timeout_ms: m.rebalance_timeout.as_millis().min(i32::MAX as u128) as i32,
                        protocols,
                    },
                    assignment: m.assignment.clone(),
                }
            })
            .collect();
        (handed, self.generation)
    }

    /// The members have gone over to the consumer protocol: requests they
    /// have parked are answered REBALANCE_IN_PROGRESS (they join again, into
    /// the converted group), and the classic state is emptied and stored so.
    pub fn hand_over(&mut self, now_ms: i64) {
        for (_, mut m) in std::mem::take(&mut self.members) {
            if let Some(reply) = m.join_reply.take() {
                let _ = reply.send(JoinResult::error(ResponseError::RebalanceInProgress, &m.id));
            }
            if let Some(reply) = m.sync_reply.take() {
                let _ = reply.send(SyncResult::error(ResponseError::RebalanceInProgress));
            }
        }
        self.static_members.clear();
        self.pending_members.clear();
        self.pending_sync.clear();
        self.sync_deadline = None;
        self.rebalance_deadline = None;
        self.initial_delay_until = None;
        self.awaiting_store = None;
        self.leader = None;
        self.protocol = None;
        self.set_state(GroupState::Empty, now_ms);
        self.persist = Some(self.stored_value());
    }

    /// Takes members back from the consumer protocol at `generation`: each
    /// keeps the assignment it owns until it rejoins, and the group
    /// rebalances (its members learn so from their next heartbeat).
    pub fn take_back_members(&mut self, members: Vec<ClassicHandover>, generation: i32, now: Instant, now_ms: i64) {
        for ClassicHandover { join, assignment } in members {
            if let Some(instance) = &join.instance_id {
                self.static_members.insert(instance.clone(), join.member_id.clone());
            }
            self.members.insert(
                join.member_id.clone(),
                Member {
                    id: join.member_id,
                    instance_id: join.instance_id,
                    client_id: join.client_id,
                    client_host: join.client_host,
                    session_timeout: Duration::from_millis(join.session_timeout_ms.max(0) as u64),
                    rebalance_timeout: Duration::from_millis(join.rebalance_timeout_ms.max(0) as u64),
                    protocol_type: "consumer".to_string(),
                    protocols: join.protocols,
                    assignment,
                    last_seen: now,
                    join_reply: None,
                    sync_reply: None,
                },
            );
        }
        if self.members.is_empty() {
            return;
        }
        self.generation = generation;
        self.protocol_type = Some("consumer".to_string());
        self.protocol = self.select_protocol();
        self.set_state(GroupState::Stable, now_ms);
        let limits = self.limits_from_members();
        self.prepare_rebalance(&limits, now, now_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::*;

    #[test]
    fn members_go_over_with_their_assignments_and_come_back_to_rejoin() {
        let now = Instant::now();
        let (mut g, a, b) = stable_pair(now);
        let generation = g.generation;
        assert!(g.can_upgrade());
        let (handed, at) = g.members_to_hand_over();
        assert_eq!(at, generation);
        assert_eq!(handed.len(), 2);
        assert_eq!(g.members.len(), 2, "looking changes nothing");
        g.hand_over(0);
        assert!(g.members.is_empty() && g.state == GroupState::Empty);
        let stored = g.take_persist().expect("the emptied group is stored");
        assert!(stored.members.is_empty());
        g.take_back_members(handed, generation + 3, now, 0);
        assert_eq!(g.generation, generation + 3);
        assert_eq!(g.state, GroupState::PreparingRebalance);
        // Both must rejoin; their heartbeats say so.
        assert_eq!(g.heartbeat(&a, None, generation + 3, now), Err(ResponseError::RebalanceInProgress));
        let _ja = join(&mut g, join_req(&a, None), now);
        let _jb = join(&mut g, join_req(&b, None), now);
        assert_eq!(g.state, GroupState::CompletingRebalance);
        assert_eq!(g.generation, generation + 4);
    }

    #[test]
    fn a_group_of_another_protocol_type_is_not_taken_over() {
        let mut g = Group::new("g", 0);
        let mut req = join_req("", Some("i"));
        req.protocol_type = "connect".to_string();
        let mut rx = join(&mut g, req, Instant::now());
        let joined = got(&mut rx);
        assert_eq!((g.members.len(), g.protocol_type.as_deref()), (1, Some("connect")), "{joined:?}");
        assert!(!g.can_upgrade());
    }
}
