//! Partition reassignment (KIP-455), decided as pure functions of the image.
//!
//! A reassignment gives a partition target replicas. While it runs, the
//! replica set is the target followed by the originals that are leaving,
//! with `adding_replicas` and `removing_replicas` recorded beside it: adding
//! replicas fetch from the leader like any follower and count toward the
//! high watermark only once they join the ISR. It completes in one record,
//! once every target replica is in the ISR: the replicas become the target,
//! the ISR keeps only target members, and a leader that is being removed
//! hands over to the first in-sync target replica. Cancelling reverts to the
//! original replicas; a new reassignment replaces a running one, measured
//! from the same originals.
//!
//! Everything about a move is in the image, so a new controller completes or
//! cancels what an old one started; [`completions`] runs on every tick.

use strom_raft::{LeaderChange, MetadataImage, MetadataRecord, PartitionRegistration, TopicImage};

use crate::error::{ApiError, ErrorCode};

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::InvalidReplicaAssignment, message)
}

fn lookup<'a>(
    image: &'a MetadataImage,
    topic: &str,
    partition: i32,
) -> Result<(&'a TopicImage, &'a PartitionRegistration), ApiError> {
    let unknown = || ApiError::new(ErrorCode::UnknownTopicOrPartition, format!("no partition {topic}-{partition}"));
    let t = image.topics.get(topic).ok_or_else(unknown)?;
    let p = t.partitions.get(&partition).ok_or_else(unknown)?;
    Ok((t, p))
}

/// Checks a target: not empty, no broker twice, every broker registered.
pub fn validate_target(image: &MetadataImage, target: &[i32]) -> Result<(), ApiError> {
    if target.is_empty() {
        return Err(invalid("the target replica list is empty"));
    }
    for (i, b) in target.iter().enumerate() {
        if target[..i].contains(b) {
            return Err(invalid(format!("broker {b} appears twice in the target replicas")));
        }
        if !image.brokers.contains_key(b) {
            return Err(invalid(format!("broker {b} is not registered")));
        }
    }
    Ok(())
}

/// The leader after the replicas become `replicas` with ISR `isr`: the
/// current one if it stays, else the first active in-sync replica in
/// replica order; `None` when the current one goes and no one can follow.
fn next_leader(
    image: &MetadataImage,
    p: &PartitionRegistration,
    replicas: &[i32],
    isr: &[i32],
) -> Option<LeaderChange> {
    match p.leader {
        Some(l) if replicas.contains(&l) => Some(LeaderChange::Unchanged),
        _ => replicas.iter().copied().find(|b| isr.contains(b) && image.is_active(*b)).map(LeaderChange::Elect),
    }
}

/// The record that moves `topic`-`partition` towards `target`, replacing a
/// running reassignment; `None` when there is nothing to do (the target is
/// the current replica set and nothing runs).
pub fn reassign(
    image: &MetadataImage,
    topic: &str,
    partition: i32,
    target: &[i32],
) -> Result<Option<MetadataRecord>, ApiError> {
    let (t, p) = lookup(image, topic, partition)?;
    validate_target(image, target)?;
    let original = p.original_replicas();
    if target == original.as_slice() {
        // Back to where it started: a cancellation, or nothing at all.
        return if p.is_reassigning() { cancel(image, topic, partition).map(Some) } else { Ok(None) };
    }
    let adding: Vec<i32> = target.iter().copied().filter(|b| !original.contains(b)).collect();
    let removing: Vec<i32> = original.iter().copied().filter(|b| !target.contains(b)).collect();
    let replicas: Vec<i32> = target.iter().chain(&removing).copied().collect();
    // Replicas an earlier target added and this one drops leave the ISR now.
    let isr: Vec<i32> = p.isr.iter().copied().filter(|b| replicas.contains(b)).collect();
    let leader = next_leader(image, p, &replicas, &isr).ok_or_else(|| {
        ApiError::new(ErrorCode::EligibleLeadersNotAvailable, "no in-sync replica would be left to lead")
    })?;
    if isr.is_empty() {
        return Err(ApiError::new(ErrorCode::EligibleLeadersNotAvailable, "no in-sync replica would be left"));
    }
    Ok(Some(MetadataRecord::PartitionReassignment {
        topic_id: t.topic_id,
        partition,
        replicas,
        adding,
        removing,
        isr,
        leader,
    }))
}

/// The record that cancels the running reassignment of `topic`-`partition`:
/// the original replicas return; the adding ones leave the ISR.
pub fn cancel(image: &MetadataImage, topic: &str, partition: i32) -> Result<MetadataRecord, ApiError> {
    let (t, p) = lookup(image, topic, partition)?;
    if !p.is_reassigning() {
        return Err(ApiError::new(
            ErrorCode::NoReassignmentInProgress,
            format!("no reassignment of {topic}-{partition} is running"),
        ));
    }
    let replicas = p.original_replicas();
    let isr: Vec<i32> = p.isr.iter().copied().filter(|b| replicas.contains(b)).collect();
    let leader = next_leader(image, p, &replicas, &isr).filter(|_| !isr.is_empty()).ok_or_else(|| {
        ApiError::new(ErrorCode::EligibleLeadersNotAvailable, "no original replica is in sync to lead")
    })?;
    Ok(settled(t, partition, replicas, isr, leader))
}

/// The completion record of one partition's reassignment, if every target
/// replica is in the ISR and a target replica can lead. As in Kafka, the
/// leader stays when the target keeps it: a replica that has only just joined
/// the ISR may hold less than the leader appended, and electing it would
/// truncate that (unacknowledged) tail and turn every waiting produce into a
/// retry. A removed leader is replaced by the first target replica that can
/// lead. The target's first replica becomes the leader later, by a preferred
/// election (the balancer's in `continuous` mode, or
/// `auto.leader.rebalance.enable`).
pub fn completion(
    image: &MetadataImage,
    t: &TopicImage,
    partition: i32,
    p: &PartitionRegistration,
) -> Option<MetadataRecord> {
    if !p.is_reassigning() {
        return None;
    }
    let target = p.target_replicas();
    if target.is_empty() || !target.iter().all(|b| p.isr.contains(b)) {
        return None;
    }
    let isr: Vec<i32> = p.isr.iter().copied().filter(|b| target.contains(b)).collect();
    let leader = match p.leader {
        Some(l) if target.contains(&l) && image.can_lead(l) => LeaderChange::Unchanged,
        _ => match target.iter().copied().find(|b| isr.contains(b) && image.can_lead(*b)) {
            Some(first) => LeaderChange::Elect(first),
            // None can lead (maintenance): as the move started, the leader stays if kept.
            None => next_leader(image, p, &target, &isr)?,
        },
    };
    Some(settled(t, partition, target, isr, leader))
}

/// The record that ends a move (completed or cancelled) on `replicas`.
fn settled(t: &TopicImage, partition: i32, replicas: Vec<i32>, isr: Vec<i32>, leader: LeaderChange) -> MetadataRecord {
    MetadataRecord::PartitionReassignment {
        topic_id: t.topic_id,
        partition,
        replicas,
        adding: vec![],
        removing: vec![],
        isr,
        leader,
    }
}

/// Completion records of every reassignment that can complete now.
pub fn completions(image: &MetadataImage) -> Vec<MetadataRecord> {
    image
        .topics
        .values()
        .flat_map(|t| t.partitions.iter().filter_map(move |(&i, p)| completion(image, t, i, p)))
        .collect()
}

#[cfg(test)]
mod tests {
    use strom_raft::{BrokerState, TopicId};

    use super::*;
    use crate::controller::test_support::image_with_brokers;

    fn apply(image: &mut MetadataImage, record: &MetadataRecord) {
        image.apply(record).expect("the record applies");
    }

    fn partition(image: &MetadataImage) -> PartitionRegistration {
        image.topics["t"].partitions[&0].clone()
    }

    /// Brokers 1-5 active; t-0 on [1, 2, 3], led by 1, all in sync.
    fn five_brokers() -> MetadataImage {
        let mut image = image_with_brokers(1..=5, &[1, 2, 3, 4, 5]);
        apply(&mut image, &MetadataRecord::Topic { name: "t".into(), topic_id: TopicId(7) });
        apply(
            &mut image,
            &MetadataRecord::Partition {
                topic_id: TopicId(7),
                partition: 0,
                replicas: vec![1, 2, 3],
                isr: vec![1, 2, 3],
                leader: Some(1),
            },
        );
        image
    }

    #[test]
    fn a_move_adds_then_completes_once_the_target_is_in_sync() {
        let mut image = five_brokers();
        let start = reassign(&image, "t", 0, &[3, 4, 5]).expect("valid").expect("a change");
        apply(&mut image, &start);
        let p = partition(&image);
        assert_eq!(p.replicas, vec![3, 4, 5, 1, 2]);
        assert_eq!((p.adding_replicas.clone(), p.removing_replicas.clone()), (vec![4, 5], vec![1, 2]));
        assert_eq!(p.isr, vec![1, 2, 3], "adding replicas join the ISR by catching up");
        assert_eq!(p.leader, Some(1));
        assert!(completions(&image).is_empty(), "4 and 5 are not in sync yet");

        let caught_up = MetadataRecord::PartitionChange {
            topic_id: image.topics["t"].topic_id,
            partition: 0,
            leader: LeaderChange::Unchanged,
            isr: Some(vec![1, 2, 3, 4, 5]),
            replicas: None,
        };
        apply(&mut image, &caught_up);
        let done = completions(&image);
        assert_eq!(done.len(), 1);
        let epoch = partition(&image).leader_epoch;
        apply(&mut image, &done[0]);
        let p = partition(&image);
        assert_eq!(p.replicas, vec![3, 4, 5]);
        assert_eq!(p.isr, vec![3, 4, 5]);
        assert!(!p.is_reassigning());
        assert_eq!(p.leader, Some(3), "the removed leader hands over to the first in-sync target replica");
        assert_eq!(p.leader_epoch, epoch + 1);
        assert!(completions(&image).is_empty());
    }

    #[test]
    fn a_completed_move_keeps_its_leader_until_a_preferred_election() {
        // 1 stays and leads on, though the target puts 4 first: 4 has only
        // just caught up, and may hold less than 1 appended since.
        let mut image = five_brokers();
        let record = reassign(&image, "t", 0, &[4, 1, 2]).expect("valid").expect("a change");
        apply(&mut image, &record);
        let topic_id = image.topics["t"].topic_id;
        let caught_up = MetadataRecord::PartitionChange {
            topic_id,
            partition: 0,
            leader: LeaderChange::Unchanged,
            isr: Some(vec![1, 2, 3, 4]),
            replicas: None,
        };
        apply(&mut image, &caught_up);
        let done = completions(&image);
        apply(&mut image, &done[0]);
        assert_eq!(partition(&image).leader, Some(1));
        // A preferred election (the balancer's, or the periodic one) then moves it.
        let elections = crate::controller::election::preferred_elections(&image);
        assert_eq!(elections.len(), 1);
        apply(&mut image, &elections[0]);
        assert_eq!(partition(&image).leader, Some(4));
    }

    #[test]
    fn a_completed_move_replaces_a_leader_in_maintenance() {
        let mut image = five_brokers();
        let record = reassign(&image, "t", 0, &[1, 2, 4]).expect("valid").expect("a change");
        apply(&mut image, &record);
        let topic_id = image.topics["t"].topic_id;
        let caught_up = MetadataRecord::PartitionChange {
            topic_id,
            partition: 0,
            leader: LeaderChange::Unchanged,
            isr: Some(vec![1, 2, 3, 4]),
            replicas: None,
        };
        apply(&mut image, &caught_up);
        apply(&mut image, &MetadataRecord::BrokerMaintenance { broker_id: 1, on: true });
        let done = completions(&image);
        apply(&mut image, &done[0]);
        assert_eq!(partition(&image).leader, Some(2), "1 leads nothing in maintenance");
    }

    #[test]
    fn shrinking_completes_at_once_and_keeps_the_leader() {
        let mut image = five_brokers();
        let record = reassign(&image, "t", 0, &[1, 2]).expect("valid").expect("a change");
        apply(&mut image, &record);
        let done = completions(&image);
        assert_eq!(done.len(), 1, "every target replica is already in sync");
        apply(&mut image, &done[0]);
        let p = partition(&image);
        assert_eq!((p.replicas.clone(), p.isr.clone(), p.leader), (vec![1, 2], vec![1, 2], Some(1)));
    }

    #[test]
    fn cancel_returns_the_original_replicas() {
        let mut image = five_brokers();
        let record = reassign(&image, "t", 0, &[4, 5, 1]).expect("valid").expect("a change");
        apply(&mut image, &record);
        let record = cancel(&image, "t", 0).expect("something runs");
        apply(&mut image, &record);
        let p = partition(&image);
        assert_eq!((p.replicas.clone(), p.isr.clone(), p.leader), (vec![1, 2, 3], vec![1, 2, 3], Some(1)));
        assert!(!p.is_reassigning());
        let again = cancel(&image, "t", 0).expect_err("nothing runs");
        assert_eq!(again.code, ErrorCode::NoReassignmentInProgress);
    }

    #[test]
    fn a_new_target_replaces_a_running_one_from_the_same_originals() {
        let mut image = five_brokers();
        let record = reassign(&image, "t", 0, &[1, 2, 4]).expect("valid").expect("a change");
        apply(&mut image, &record);
        let record = reassign(&image, "t", 0, &[1, 2, 5]).expect("valid").expect("a change");
        apply(&mut image, &record);
        let p = partition(&image);
        assert_eq!(p.replicas, vec![1, 2, 5, 3]);
        assert_eq!((p.adding_replicas.clone(), p.removing_replicas.clone()), (vec![5], vec![3]));
        // Back to the originals: the same as a cancellation.
        let back = reassign(&image, "t", 0, &[1, 2, 3]).expect("valid").expect("a change");
        assert_eq!(back, cancel(&image, "t", 0).expect("something runs"));
    }

    #[test]
    fn the_same_replicas_need_nothing() {
        assert_eq!(reassign(&five_brokers(), "t", 0, &[1, 2, 3]).expect("valid"), None);
    }

    #[test]
    fn bad_targets_are_refused() {
        let image = five_brokers();
        for (target, code) in [
            (vec![], ErrorCode::InvalidReplicaAssignment),
            (vec![1, 1, 2], ErrorCode::InvalidReplicaAssignment),
            (vec![1, 2, 9], ErrorCode::InvalidReplicaAssignment),
        ] {
            assert_eq!(reassign(&image, "t", 0, &target).expect_err("refused").code, code, "{target:?}");
        }
        assert_eq!(reassign(&image, "t", 7, &[1]).expect_err("refused").code, ErrorCode::UnknownTopicOrPartition);
        assert_eq!(reassign(&image, "u", 0, &[1]).expect_err("refused").code, ErrorCode::UnknownTopicOrPartition);
    }

    #[test]
    fn completion_waits_for_a_live_target_leader() {
        let mut image = five_brokers();
        let record = reassign(&image, "t", 0, &[2, 3]).expect("valid").expect("a change");
        apply(&mut image, &record);
        apply(&mut image, &MetadataRecord::BrokerRegistrationChange { broker_id: 2, state: BrokerState::Fenced });
        apply(&mut image, &MetadataRecord::BrokerRegistrationChange { broker_id: 3, state: BrokerState::Fenced });
        assert!(completions(&image).is_empty(), "no target replica can take over from 1");
    }
}
