//! Moving replicas off brokers, decided as pure functions of the image:
//! draining a broker for retirement (decommission), and self-healing, which
//! re-creates the replicas of a broker gone longer than
//! `balancer.node.unavailable.timeout.ms` on live brokers.
//!
//! Both replace the broker in each partition's replicas by the live broker
//! holding the fewest replicas (lowest id on a tie), in a rack none of the
//! partition's other replicas is in when there is one and run that as a
//! reassignment ([`super::reassignment`]), at most
//! `balancer.max.concurrent.moves` at once. Leaderships leave a drained
//! broker first. A drained broker that holds nothing is unregistered.

use std::collections::{BTreeMap, BTreeSet};

use strom_raft::{BrokerRegistration, MetadataImage, MetadataRecord};

use super::placement::Racks;
use super::reassignment;
use crate::error::{ApiError, ErrorCode};

/// Replicas per registered broker (a running move counts on both sides).
pub fn replica_counts(image: &MetadataImage) -> BTreeMap<i32, usize> {
    let mut counts: BTreeMap<i32, usize> = image.brokers.keys().map(|b| (*b, 0)).collect();
    for p in image.topics.values().flat_map(|t| t.partitions.values()) {
        for r in &p.replicas {
            *counts.entry(*r).or_default() += 1;
        }
    }
    counts
}

/// Leaderships per registered broker.
pub fn leader_counts(image: &MetadataImage) -> BTreeMap<i32, usize> {
    let mut counts: BTreeMap<i32, usize> = image.brokers.keys().map(|b| (*b, 0)).collect();
    for leader in image.topics.values().flat_map(|t| t.partitions.values()).filter_map(|p| p.leader) {
        *counts.entry(leader).or_default() += 1;
    }
    counts
}

/// Brokers that may receive replicas: active and not being drained.
fn hosts(image: &MetadataImage) -> Vec<i32> {
    image.brokers.values().filter(|b| b.is_active() && !b.decommissioning).map(|b| b.broker_id).collect()
}

/// `broker`'s registration, or BROKER_ID_NOT_REGISTERED.
pub fn require_registered(image: &MetadataImage, broker: i32) -> Result<&BrokerRegistration, ApiError> {
    image
        .brokers
        .get(&broker)
        .ok_or_else(|| ApiError::new(ErrorCode::BrokerIdNotRegistered, format!("broker {broker} is not registered")))
}

/// Checks that `broker` can be drained: it is registered, and the brokers
/// left can hold the replication factor of each of its partitions.
pub fn check_decommission(image: &MetadataImage, broker: i32) -> Result<(), ApiError> {
    require_registered(image, broker)?;
    let left = hosts(image).into_iter().filter(|b| *b != broker).count();
    let needed = image
        .topics
        .values()
        .flat_map(|t| t.partitions.values())
        .filter(|p| p.replicas.contains(&broker))
        .map(|p| p.target_replicas().len())
        .max()
        .unwrap_or(0);
    if needed > left {
        return Err(ApiError::new(
            ErrorCode::NotEnoughBrokers,
            format!("broker {broker} holds a partition of replication factor {needed}; only {left} other active brokers could hold it"),
        ));
    }
    Ok(())
}

/// Moves replicas off `brokers`: one reassignment per partition that holds
/// one of them and is not moving already, while fewer than `max_moves`
/// reassignments run in all. A partition with no live broker to take the
/// replica, or no in-sync replica to lead, waits.
pub fn moves_off(image: &MetadataImage, brokers: &BTreeSet<i32>, max_moves: usize) -> Vec<MetadataRecord> {
    let running = image.topics.values().flat_map(|t| t.partitions.values()).filter(|p| p.is_reassigning()).count();
    let mut budget = max_moves.saturating_sub(running);
    let mut counts = replica_counts(image);
    let hosts: Vec<i32> = hosts(image).into_iter().filter(|b| !brokers.contains(b)).collect();
    let racks = Racks::of_image(image);
    let mut records = Vec::new();
    for topic in image.topics.values() {
        for (&partition, p) in &topic.partitions {
            // A running move that adds one of the brokers gets a new target
            // (it would never complete); other running moves are left alone.
            let redirect = p.adding_replicas.iter().any(|r| brokers.contains(r));
            let blocked = !redirect && (budget == 0 || p.is_reassigning());
            if blocked || !p.replicas.iter().any(|r| brokers.contains(r)) {
                continue;
            }
            let mut target = if redirect { p.target_replicas() } else { p.replicas.clone() };
            let mut complete = true;
            for i in 0..target.len() {
                if !brokers.contains(&target[i]) {
                    continue;
                }
                // A rack none of the other replicas is in, when there is one.
                let others: Vec<String> =
                    target.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, r)| racks.of(*r)).collect();
                let pick = hosts
                    .iter()
                    .copied()
                    .filter(|h| !target.contains(h))
                    .min_by_key(|h| (others.contains(&racks.of(*h)), counts.get(h).copied().unwrap_or(0), *h));
                match pick {
                    Some(h) => {
                        *counts.entry(h).or_default() += 1;
                        target[i] = h;
                    }
                    None => complete = false,
                }
            }
            if !complete {
                continue;
            }
            if let Ok(Some(record)) = reassignment::reassign(image, &topic.name, partition, &target) {
                records.push(record);
                if !redirect {
                    budget -= 1;
                }
            }
        }
    }
    records
}

/// Unregistration records of drained brokers that hold no replica any more.
pub fn finished_drains(image: &MetadataImage) -> Vec<MetadataRecord> {
    let counts = replica_counts(image);
    image
        .brokers
        .values()
        .filter(|b| b.decommissioning && counts.get(&b.broker_id).copied().unwrap_or(0) == 0)
        .map(|b| MetadataRecord::UnregisterBroker { broker_id: b.broker_id })
        .collect()
}

/// Checks that `broker` may be unregistered: it holds no replica, and it is
/// fenced (dead) or drained.
pub fn check_unregister(image: &MetadataImage, broker: i32) -> Result<(), ApiError> {
    let b = require_registered(image, broker)?;
    let held = replica_counts(image).get(&broker).copied().unwrap_or(0);
    if held > 0 {
        return Err(ApiError::new(
            ErrorCode::BrokerNotEmpty,
            format!("broker {broker} still holds {held} replicas; decommission it first"),
        ));
    }
    if b.is_active() && !b.decommissioning {
        return Err(ApiError::new(
            ErrorCode::BrokerNotEmpty,
            format!("broker {broker} is alive; decommission it (or stop it) first"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use strom_raft::{BrokerState, TopicId};

    use super::*;
    use crate::controller::test_support::{add_topic, image_with_brokers};

    fn apply(image: &mut MetadataImage, records: &[MetadataRecord]) {
        for r in records {
            image.apply(r).expect("the record applies");
        }
    }

    /// Brokers 1-4 active; topic t with `partitions` replica lists, led by
    /// the first replica, all in sync.
    fn image(partitions: &[Vec<i32>]) -> MetadataImage {
        let mut image = image_with_brokers(1..=4, &[1, 2, 3, 4]);
        add_topic(&mut image, "t", TopicId(3), partitions);
        image
    }

    /// Completes every move as if the adding replicas had caught up.
    fn finish_moves(image: &mut MetadataImage) {
        let ids: Vec<(TopicId, i32, Vec<i32>)> = image
            .topics
            .values()
            .flat_map(|t| t.partitions.iter().map(move |(i, p)| (t.topic_id, *i, p.replicas.clone())))
            .collect();
        for (topic_id, partition, replicas) in ids {
            apply(
                image,
                &[MetadataRecord::PartitionChange {
                    topic_id,
                    partition,
                    leader: strom_raft::LeaderChange::Unchanged,
                    isr: Some(replicas),
                    replicas: None,
                }],
            );
        }
        let done = reassignment::completions(image);
        apply(image, &done);
    }

    #[test]
    fn a_drain_moves_every_replica_to_the_least_loaded_brokers() {
        let mut img = image(&[vec![1, 2, 3], vec![2, 3, 1], vec![3, 1, 2], vec![1, 2, 4]]);
        let off = BTreeSet::from([1]);
        let moves = moves_off(&img, &off, 2);
        assert_eq!(moves.len(), 2, "bounded by the concurrent moves");
        apply(&mut img, &moves);
        assert!(moves_off(&img, &off, 2).is_empty(), "two run already");
        finish_moves(&mut img);
        for _ in 0..4 {
            let more = moves_off(&img, &off, 2);
            apply(&mut img, &more);
            finish_moves(&mut img);
        }
        let counts = replica_counts(&img);
        assert_eq!(counts[&1], 0);
        assert_eq!(counts.values().sum::<usize>(), 12, "replication factors kept");
        for p in img.topics["t"].partitions.values() {
            assert_eq!(p.replicas.len(), 3);
            assert!(p.leader.is_some_and(|l| l != 1));
        }
        assert_eq!((counts[&2], counts[&3], counts[&4]), (4, 4, 4), "spread evenly");
    }

    #[test]
    fn a_replica_leaving_goes_to_a_rack_the_partition_is_not_in() {
        // Racks a: 1, 2; b: 3, 4; c: 5. Broker 5 holds the fewest replicas,
        // but a replica of rack b must stay in rack b.
        let racks = [(1, Some("a")), (2, Some("a")), (3, Some("b")), (4, Some("b")), (5, Some("c"))];
        let mut img = crate::controller::test_support::image_with_racks(&racks, &[1, 2, 3, 4, 5]);
        add_topic(&mut img, "t", TopicId(3), &[vec![1, 3, 5], vec![2, 4, 1]]);
        let moves = moves_off(&img, &BTreeSet::from([3]), 4);
        apply(&mut img, &moves);
        assert_eq!(img.topics["t"].partitions[&0].target_replicas(), vec![1, 4, 5], "3's rack b goes to 4");
    }

    #[test]
    fn decommission_needs_room_for_every_replication_factor() {
        let mut img = image(&[vec![1, 2, 3, 4]]);
        assert_eq!(check_decommission(&img, 4).expect_err("RF 4 on 3 brokers").code, ErrorCode::NotEnoughBrokers);
        img = image(&[vec![1, 2, 3]]);
        assert!(check_decommission(&img, 1).is_ok());
        assert_eq!(check_decommission(&img, 9).expect_err("unknown").code, ErrorCode::BrokerIdNotRegistered);
        apply(&mut img, &[MetadataRecord::BrokerRegistrationChange { broker_id: 4, state: BrokerState::Fenced }]);
        assert_eq!(check_decommission(&img, 1).expect_err("4 is down").code, ErrorCode::NotEnoughBrokers);
    }

    #[test]
    fn a_drained_broker_is_unregistered_and_an_empty_dead_one_may_be() {
        let mut img = image(&[vec![1, 2, 3]]);
        assert!(finished_drains(&img).is_empty());
        apply(&mut img, &[MetadataRecord::BrokerDecommission { broker_id: 4, on: true }]);
        assert_eq!(finished_drains(&img), vec![MetadataRecord::UnregisterBroker { broker_id: 4 }]);
        assert_eq!(check_unregister(&img, 1).expect_err("holds replicas").code, ErrorCode::BrokerNotEmpty);
        apply(&mut img, &[MetadataRecord::BrokerDecommission { broker_id: 4, on: false }]);
        assert_eq!(check_unregister(&img, 4).expect_err("alive").code, ErrorCode::BrokerNotEmpty);
        apply(&mut img, &[MetadataRecord::BrokerRegistrationChange { broker_id: 4, state: BrokerState::Fenced }]);
        assert!(check_unregister(&img, 4).is_ok());
        apply(&mut img, &[MetadataRecord::UnregisterBroker { broker_id: 4 }]);
        assert!(!img.brokers.contains_key(&4));
        assert_eq!(img.retired_brokers.get(&4), Some(&1));
    }

    #[test]
    fn a_move_to_a_dead_broker_gets_a_new_target() {
        let mut img = image(&[vec![1, 2, 3]]);
        let start = reassignment::reassign(&img, "t", 0, &[1, 2, 4]).expect("valid").expect("a move");
        apply(&mut img, &[start]);
        apply(&mut img, &[MetadataRecord::BrokerRegistrationChange { broker_id: 4, state: BrokerState::Fenced }]);
        // With 4 gone only 3, which the move is removing, is left to take its place.
        let moves = moves_off(&img, &BTreeSet::from([4]), 1);
        assert_eq!(moves.len(), 1, "redirected even with the move budget spent");
        apply(&mut img, &moves);
        let p = &img.topics["t"].partitions[&0];
        assert!(!p.is_reassigning(), "back to the originals: {p:?}");
        assert_eq!(p.replicas, vec![1, 2, 3]);
    }

    #[test]
    fn healing_waits_when_no_live_broker_can_take_the_replica() {
        let mut img = image(&[vec![1, 2, 3]]);
        for b in [3, 4] {
            apply(&mut img, &[MetadataRecord::BrokerRegistrationChange { broker_id: b, state: BrokerState::Fenced }]);
        }
        assert!(moves_off(&img, &BTreeSet::from([3]), 4).is_empty(), "1 and 2 hold it already; 4 is down");
    }
}
