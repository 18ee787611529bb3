//! Offsets: who may commit to a group, and the committed offsets in memory,
//! which follow the order of their records in `__consumer_offsets`.

use std::time::Instant;

use kafka_protocol::ResponseError;

use super::*;

impl Group {
    /// May a commit from this member and generation go ahead? (Kafka: commits
    /// are taken while Stable or PreparingRebalance, so a member can commit
    /// what it processed before it rejoins.)
    pub fn check_commit(&mut self, auth: &CommitAuth<'_>, now: Instant) -> Result<(), ResponseError> {
        if self.state == GroupState::Dead {
            return Err(ResponseError::CoordinatorNotAvailable);
        }
        if let Some(c) = &mut self.consumer {
            let stale =
                if auth.member_epochs { ResponseError::StaleMemberEpoch } else { ResponseError::IllegalGeneration };
            c.check_member_epoch(auth.member_id, auth.generation, stale)?;
            if let Some(m) = c.members.get_mut(auth.member_id) {
                m.last_seen = now;
            }
            return Ok(());
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

    /// Records a transactional commit stored for `producer_id`, to be
    /// applied when its transaction commits.
    pub fn add_pending_txn_offset(&mut self, producer_id: i64, topic: &str, partition: i32, committed: Committed) {
        self.pending_txn_offsets.entry(producer_id).or_default().insert((topic.to_string(), partition), committed);
    }

    /// The transaction of `producer_id` ended: its offsets become committed
    /// (`commit`) or go.
    pub fn end_txn(&mut self, producer_id: i64, commit: bool) {
        let Some(pending) = self.pending_txn_offsets.remove(&producer_id) else { return };
        if commit {
            for ((topic, partition), c) in pending {
                self.apply_offset(&topic, partition, c);
            }
        }
    }

    /// Whether a transaction not ended yet holds an offset for the partition
    /// (OffsetFetch with `require_stable` answers UNSTABLE_OFFSET_COMMIT).
    pub fn has_pending_txn_offset(&self, topic: &str, partition: i32) -> bool {
        let key = (topic.to_string(), partition);
        self.pending_txn_offsets.values().any(|p| p.contains_key(&key))
    }

    /// Records a stored tombstone at `record_offset`: the commit goes unless a
    /// newer record (a commit appended after the tombstone) replaced it.
    pub fn remove_offset(&mut self, topic: &str, partition: i32, record_offset: i64) {
        let key = (topic.to_string(), partition);
        if self.offsets.get(&key).is_some_and(|c| c.record_offset < record_offset) {
            self.offsets.remove(&key);
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
        if let Some(c) = &self.consumer {
            return Some(c.topics_seen.keys().cloned().collect());
        }
        if self.protocol_type.as_deref() != Some("consumer") {
            return None;
        }
        let protocol = self.protocol.as_deref()?;
        let mut topics = std::collections::BTreeSet::new();
        for m in self.members.values() {
            if let Some(sub) = crate::group::assignment::decode_subscription(&m.metadata_for(protocol)) {
                topics.extend(sub);
            }
        }
        Some(topics)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::*;

    /// A commit of `offset` stored at `record_offset` in `__consumer_offsets`.
    fn committed(offset: i64, record_offset: i64) -> Committed {
        Committed { offset, leader_epoch: -1, metadata: String::new(), commit_timestamp: 0, record_offset }
    }

    #[test]
    fn commits_are_checked_and_older_records_never_win() {
        let now = Instant::now();
        let mut g = Group::new("g", 0);
        let simple = CommitAuth { member_id: "", instance_id: None, generation: -1, member_epochs: false };
        assert_eq!(g.check_commit(&simple, now), Ok(()), "offsets-only use of an empty group");
        let c = committed;
        g.apply_offset("t", 0, c(10, 5));
        g.apply_offset("t", 0, c(7, 4));
        assert_eq!(g.offsets[&("t".to_string(), 0)].offset, 10);
        assert_eq!(g.expired_offsets(1000, 2000), Vec::<(String, i32)>::new());
        assert_eq!(g.expired_offsets(2000, 2000), vec![("t".to_string(), 0)]);
        let _a = join(&mut g, join_req("", None), now);
        assert_eq!(g.check_commit(&simple, now), Err(ResponseError::UnknownMemberId));
    }

    #[test]
    fn a_tombstone_removes_only_older_commits() {
        let mut g = Group::new("g", 0);
        let c = committed;
        g.apply_offset("t", 0, c(10, 5));
        g.remove_offset("t", 0, 4);
        assert_eq!(g.offsets[&("t".to_string(), 0)].offset, 10, "a commit appended after the tombstone stays");
        g.remove_offset("t", 0, 6);
        assert!(g.offsets.is_empty());
    }
}
