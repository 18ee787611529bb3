//! The balancer: a pure function from the metadata image to a bounded list
//! of moves that spread replicas, then preferred leaders, evenly over the
//! brokers that can host them (active, not drained, not in maintenance).
//!
//! Replicas: while the most loaded broker holds more than one replica above
//! the least loaded, one of its replicas (of a partition the least loaded
//! does not hold) moves there, keeping its place in the replica order.
//! Leaders: while one broker is the preferred leader (first replica) of more
//! than one partition above another that holds a replica of one of them in
//! sync, the two swap places in that partition's order (the controller then
//! elects the new preferred leader). The tolerance of one is what keeps a
//! balanced cluster quiet: a plan for a balanced image is empty. Moves run
//! as reassignments, at most `max_moves` at once with those already running.
//! Replica sizes and racks are not weighed yet.

use std::collections::BTreeMap;

use strom_raft::{MetadataImage, PartitionRegistration};

/// One planned change of a partition's replica list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    pub topic: String,
    pub partition: i32,
    pub from: Vec<i32>,
    pub to: Vec<i32>,
    pub reason: &'static str,
}

/// What the balancer may do (`balancer.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Off,
    /// Replicas only, onto brokers that hold fewer than the others (a new broker).
    NodeAdd,
    /// Replicas and preferred leaders, all the time.
    Continuous,
}

impl Mode {
    pub fn parse(value: Option<&str>) -> Mode {
        match value {
            Some("off") => Mode::Off,
            Some("node_add") => Mode::NodeAdd,
            _ => Mode::Continuous,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::NodeAdd => "node_add",
            Mode::Continuous => "continuous",
        }
    }
}

/// Brokers that may receive replicas and leaderships.
fn hosts(image: &MetadataImage) -> Vec<i32> {
    image.brokers.values().filter(|b| b.can_lead()).map(|b| b.broker_id).collect()
}

/// Replicas per host, counting a running move by its target.
pub fn replica_load(image: &MetadataImage) -> BTreeMap<i32, usize> {
    let mut load: BTreeMap<i32, usize> = hosts(image).into_iter().map(|b| (b, 0)).collect();
    for p in image.topics.values().flat_map(|t| t.partitions.values()) {
        for r in p.target_replicas() {
            if let Some(n) = load.get_mut(&r) {
                *n += 1;
            }
        }
    }
    load
}

/// Preferred leaderships (first target replica) per host.
pub fn leader_load(image: &MetadataImage) -> BTreeMap<i32, usize> {
    let mut load: BTreeMap<i32, usize> = hosts(image).into_iter().map(|b| (b, 0)).collect();
    for p in image.topics.values().flat_map(|t| t.partitions.values()) {
        if let Some(n) = p.target_replicas().first().and_then(|r| load.get_mut(r)) {
            *n += 1;
        }
    }
    load
}

fn extremes(load: &BTreeMap<i32, usize>) -> Option<((i32, usize), (i32, usize))> {
    let max = load.iter().max_by_key(|(b, n)| (**n, -**b)).map(|(b, n)| (*b, *n))?;
    let min = load.iter().min_by_key(|(b, n)| (**n, **b)).map(|(b, n)| (*b, *n))?;
    Some((max, min))
}

/// Partitions a plan may touch: not moving already, every replica on a host
/// (a partition with a replica on a dead or drained broker is healing's).
fn movable<'a>(
    image: &'a MetadataImage,
    hosts: &'a [i32],
) -> impl Iterator<Item = (&'a str, i32, &'a PartitionRegistration)> + 'a {
    image.topics.values().flat_map(move |t| {
        t.partitions
            .iter()
            .filter(move |(_, p)| !p.is_reassigning() && p.replicas.iter().all(|r| hosts.contains(r)))
            .map(move |(i, p)| (t.name.as_str(), *i, p))
    })
}

/// The next moves, at most `max_moves` minus the reassignments running.
pub fn plan(image: &MetadataImage, mode: Mode, max_moves: usize) -> Vec<Move> {
    if mode == Mode::Off {
        return Vec::new();
    }
    let running = image.topics.values().flat_map(|t| t.partitions.values()).filter(|p| p.is_reassigning()).count();
    let budget = max_moves.saturating_sub(running);
    let hosts = hosts(image);
    let mut moves: Vec<Move> = Vec::new();
    let planned = |topic: &str, partition: i32, moves: &Vec<Move>| {
        moves.iter().any(|m| m.topic == topic && m.partition == partition)
    };
    // Replica counts.
    let mut load = replica_load(image);
    while moves.len() < budget {
        let Some(((from, most), (to, least))) = extremes(&load) else { break };
        if most <= least + 1 {
            break;
        }
        let candidate = movable(image, &hosts)
            .find(|(t, i, p)| p.replicas.contains(&from) && !p.replicas.contains(&to) && !planned(t, *i, &moves));
        let Some((topic, partition, p)) = candidate else { break };
        let target: Vec<i32> = p.replicas.iter().map(|r| if *r == from { to } else { *r }).collect();
        moves.push(Move {
            topic: topic.to_string(),
            partition,
            from: p.replicas.clone(),
            to: target,
            reason: "replica count",
        });
        *load.entry(from).or_default() -= 1;
        *load.entry(to).or_default() += 1;
    }
    if mode != Mode::Continuous {
        return moves;
    }
    // Preferred leaders, among partitions the replica moves left alone.
    let mut leaders = leader_load(image);
    while moves.len() < budget {
        let Some(((from, most), (to, least))) = extremes(&leaders) else { break };
        if most <= least + 1 {
            break;
        }
        let candidate = movable(image, &hosts).find(|(t, i, p)| {
            p.replicas.first() == Some(&from)
                && p.replicas.contains(&to)
                && p.isr.contains(&to)
                && !planned(t, *i, &moves)
        });
        let Some((topic, partition, p)) = candidate else { break };
        let target: Vec<i32> = p
            .replicas
            .iter()
            .map(|r| match *r {
                r if r == from => to,
                r if r == to => from,
                r => r,
            })
            .collect();
        moves.push(Move {
            topic: topic.to_string(),
            partition,
            from: p.replicas.clone(),
            to: target,
            reason: "leader count",
        });
        *leaders.entry(from).or_default() -= 1;
        *leaders.entry(to).or_default() += 1;
    }
    moves
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use strom_raft::{BrokerState, MetadataRecord, TopicId};

    use super::*;
    use crate::controller::reassignment;
    use crate::controller::test_support::image_with_brokers;

    fn apply(image: &mut MetadataImage, record: &MetadataRecord) {
        image.apply(record).expect("the record applies");
    }

    fn image(brokers: i32, partitions: &[Vec<i32>]) -> MetadataImage {
        let all: Vec<i32> = (1..=brokers).collect();
        let mut img = image_with_brokers(1..=brokers, &all);
        apply(&mut img, &MetadataRecord::Topic { name: "t".into(), topic_id: TopicId(5) });
        for (i, r) in partitions.iter().enumerate() {
            apply(
                &mut img,
                &MetadataRecord::Partition {
                    topic_id: TopicId(5),
                    partition: i as i32,
                    replicas: r.clone(),
                    isr: r.clone(),
                    leader: r.first().copied(),
                },
            );
        }
        img
    }

    /// Runs plans to completion as the controller would, each move completing
    /// at once; returns how many moves were made.
    fn converge(img: &mut MetadataImage, mode: Mode, max_moves: usize) -> usize {
        let mut made = 0;
        for _ in 0..1_000 {
            let moves = plan(img, mode, max_moves);
            assert!(moves.len() <= max_moves, "bounded");
            if moves.is_empty() {
                return made;
            }
            made += moves.len();
            for m in moves {
                let record =
                    reassignment::reassign(img, &m.topic, m.partition, &m.to).expect("valid").expect("a change");
                apply(img, &record);
                let topic_id = img.topics["t"].topic_id;
                let target = img.topics["t"].partitions[&m.partition].replicas.clone();
                apply(
                    img,
                    &MetadataRecord::PartitionChange {
                        topic_id,
                        partition: m.partition,
                        leader: strom_raft::LeaderChange::Unchanged,
                        isr: Some(target),
                        replicas: None,
                    },
                );
                for done in reassignment::completions(img) {
                    apply(img, &done);
                }
            }
        }
        panic!("no convergence");
    }

    fn spread(load: &BTreeMap<i32, usize>) -> usize {
        load.values().max().copied().unwrap_or(0) - load.values().min().copied().unwrap_or(0)
    }

    #[test]
    fn a_new_broker_gets_its_share_and_then_nothing_moves() {
        // 6 partitions of RF 3 on brokers 1-3; broker 4 joins.
        let mut img = image(4, &vec![vec![1, 2, 3]; 6]);
        let made = converge(&mut img, Mode::Continuous, 2);
        let load = replica_load(&img);
        assert!(spread(&load) <= 1, "{load:?}");
        assert!(load[&4] >= 4, "{load:?}");
        assert!(spread(&leader_load(&img)) <= 1);
        assert!(made <= 10, "{made} moves");
        assert!(plan(&img, Mode::Continuous, 2).is_empty(), "quiet once balanced");
    }

    #[test]
    fn off_plans_nothing_and_node_add_leaves_leaders() {
        let img = image(4, &vec![vec![1, 2, 3]; 6]);
        assert!(plan(&img, Mode::Off, 4).is_empty());
        assert!(plan(&img, Mode::NodeAdd, 4).iter().all(|m| m.reason == "replica count"));
    }

    #[test]
    fn a_dead_or_drained_broker_is_neither_source_nor_target() {
        // Balanced over 1-3; 4 is down, so it gets nothing.
        let mut img = image(4, &[vec![1, 2, 3], vec![2, 3, 1], vec![3, 1, 2]]);
        apply(&mut img, &MetadataRecord::BrokerRegistrationChange { broker_id: 4, state: BrokerState::Fenced });
        assert!(plan(&img, Mode::Continuous, 4).is_empty());
        let mut img = image(4, &[vec![1, 2, 3], vec![1, 2, 4]]);
        apply(&mut img, &MetadataRecord::BrokerDecommission { broker_id: 4, on: true });
        assert!(plan(&img, Mode::Continuous, 4).iter().all(|m| !m.to.contains(&4)));
    }

    proptest! {
        #[test]
        fn plans_keep_replication_factors_and_converge(
            brokers in 3i32..7,
            layout in proptest::collection::vec((0i32..100, 1usize..4), 1..20),
            max_moves in 1usize..5,
        ) {
            let partitions: Vec<Vec<i32>> = layout
                .iter()
                .map(|(seed, rf)| (0..(*rf as i32).min(brokers)).map(|k| (seed + k) % brokers + 1).collect())
                .collect();
            let mut img = image(brokers, &partitions);
            converge(&mut img, Mode::Continuous, max_moves);
            for (i, p) in &img.topics["t"].partitions {
                prop_assert_eq!(p.replicas.len(), partitions[*i as usize].len(), "RF kept");
                let mut distinct = p.replicas.clone();
                distinct.sort_unstable();
                distinct.dedup();
                prop_assert_eq!(distinct.len(), p.replicas.len());
            }
            prop_assert!(spread(&replica_load(&img)) <= 1, "no broker overfull: {:?}", replica_load(&img));
            prop_assert!(plan(&img, Mode::Continuous, max_moves).is_empty(), "idempotent when balanced");
        }
    }
}
