//! The balancer: a pure function from the metadata image (and the partition
//! sizes leaders report) to a bounded list of moves that spread replicas,
//! their bytes, then preferred leaders evenly over the brokers that can host
//! them (active, not drained, not in maintenance), respecting racks.
//!
//! In order, each step never undoing what an earlier one achieved:
//! 1. Racks: a partition whose replicas sit in fewer racks than they could
//!    moves a replica that shares a rack to the least loaded broker of a rack
//!    it is not in yet. No later move narrows a partition's racks.
//! 2. Replica counts: while some broker holds more than one replica above
//!    another, one of its replicas (of a partition the other does not hold)
//!    moves there, keeping its place in the replica order; of the candidates,
//!    the one that best evens the two brokers' bytes.
//! 3. Bytes: while the broker holding the most bytes holds more than
//!    [`BYTES_TOLERANCE`] of the mean (and at least [`MIN_BYTES_GAP`]) above
//!    the one holding the fewest, the two swap a larger replica for a smaller
//!    one (two moves, counts unchanged), the pair closest to halving the gap.
//! 4. Leaders (`continuous` only): while one broker is the preferred leader
//!    (first replica) of more than one partition above another that holds an
//!    in-sync replica of one of them, the two swap places in that partition's
//!    order (the controller then elects the new preferred leader).
//!
//! Every step strictly lowers its own imbalance and leaves the earlier ones
//! alone, and the tolerances keep a balanced cluster quiet: a plan for a
//! balanced image is empty. Moves run as reassignments, at most `max_moves`
//! at once with those already running.

use std::collections::{BTreeMap, HashMap};

use strom_raft::{MetadataImage, PartitionRegistration};

use super::placement::Racks;

/// Bytes held per partition (its leader's log), as leaders report them.
pub type Sizes = HashMap<(String, i32), u64>;

/// Byte imbalance below this share of the mean bytes per broker is left alone.
pub const BYTES_TOLERANCE: f64 = 0.10;
/// Byte imbalance below this is left alone (moving it costs more than it gains).
pub const MIN_BYTES_GAP: u64 = 64 << 20;

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
    /// Racks, replicas and bytes only, onto brokers that hold fewer than the
    /// others (a new broker).
    NodeAdd,
    /// Also preferred leaders, all the time.
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

/// Bytes per host (the sizes of the partitions it holds a replica of,
/// counting a running move by its target).
pub fn byte_load(image: &MetadataImage, sizes: &Sizes) -> BTreeMap<i32, u64> {
    let mut load: BTreeMap<i32, u64> = hosts(image).into_iter().map(|b| (b, 0)).collect();
    for t in image.topics.values() {
        for (i, p) in &t.partitions {
            let size = size_of(sizes, &t.name, *i);
            for r in p.target_replicas() {
                if let Some(n) = load.get_mut(&r) {
                    *n += size;
                }
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

fn size_of(sizes: &Sizes, topic: &str, partition: i32) -> u64 {
    sizes.get(&(topic.to_string(), partition)).copied().unwrap_or(0)
}

fn extremes<N: Ord + Copy>(load: &BTreeMap<i32, N>) -> Option<((i32, N), (i32, N))> {
    let max = load.iter().max_by_key(|(b, n)| (**n, -**b)).map(|(b, n)| (*b, *n))?;
    let min = load.iter().min_by_key(|(b, n)| (**n, **b)).map(|(b, n)| (*b, *n))?;
    Some((max, min))
}

/// `replicas` with `from` replaced by `to`, in the same place.
fn replaced(replicas: &[i32], from: i32, to: i32) -> Vec<i32> {
    replicas.iter().map(|r| if *r == from { to } else { *r }).collect()
}

/// The plan being built: the image as it will be once the planned moves are.
struct Planner<'a> {
    image: &'a MetadataImage,
    sizes: &'a Sizes,
    racks: Racks,
    hosts: Vec<i32>,
    budget: usize,
    moves: Vec<Move>,
    load: BTreeMap<i32, usize>,
    bytes: BTreeMap<i32, u64>,
    /// Preferred leaderships per host, as planned so far.
    leaders: BTreeMap<i32, usize>,
}

impl<'a> Planner<'a> {
    /// Partitions a plan may touch: not moving already, not planned yet,
    /// every replica on a host (a partition with a replica on a dead or
    /// drained broker is healing's).
    fn movable(&self) -> impl Iterator<Item = (&'a str, i32, &'a PartitionRegistration)> + '_ {
        self.image.topics.values().flat_map(move |t| {
            t.partitions
                .iter()
                .filter(move |(i, p)| {
                    !p.is_reassigning()
                        && p.replicas.iter().all(|r| self.hosts.contains(r))
                        && !self.moves.iter().any(|m| m.topic == t.name && m.partition == **i)
                })
                .map(move |(i, p)| (t.name.as_str(), *i, p))
        })
    }

    fn size(&self, topic: &str, partition: i32) -> u64 {
        size_of(self.sizes, topic, partition)
    }

    fn full(&self) -> bool {
        self.moves.len() >= self.budget
    }

    /// Plans `from` → `to` in the partition's replicas.
    fn push(
        &mut self,
        topic: &str,
        partition: i32,
        p: &PartitionRegistration,
        from: i32,
        to: i32,
        reason: &'static str,
    ) {
        let size = self.size(topic, partition);
        *self.load.entry(from).or_default() -= 1;
        *self.load.entry(to).or_default() += 1;
        let held = self.bytes.entry(from).or_default();
        *held = held.saturating_sub(size);
        if p.replicas.first() == Some(&from) {
            // The replica keeps its place: `to` becomes the preferred leader.
            let led = self.leaders.entry(from).or_default();
            *led = led.saturating_sub(1);
            *self.leaders.entry(to).or_default() += 1;
        }
        *self.bytes.entry(to).or_default() += size;
        self.moves.push(Move {
            topic: topic.to_string(),
            partition,
            from: p.replicas.clone(),
            to: replaced(&p.replicas, from, to),
            reason,
        });
    }

    /// Step 1: partitions in fewer racks than they could be in.
    fn spread_racks(&mut self) {
        let racks_available = self.racks.count(&self.hosts);
        let mut todo = Vec::new();
        for (topic, partition, p) in self.movable() {
            if self.racks.count(&p.replicas) >= p.replicas.len().min(racks_available) {
                continue;
            }
            // The replica to move: one sharing its rack, on the most loaded broker.
            let shared = p.replicas.iter().copied().filter(|r| {
                let rack = self.racks.of(*r);
                p.replicas.iter().filter(|o| self.racks.of(**o) == rack).count() > 1
            });
            let Some(from) = shared.max_by_key(|r| (self.load.get(r).copied().unwrap_or(0), *r)) else { continue };
            todo.push((topic, partition, p, from));
        }
        for (topic, partition, p, from) in todo {
            if self.full() {
                return;
            }
            let to = self
                .hosts
                .iter()
                .copied()
                .filter(|h| {
                    !p.replicas.contains(h)
                        && self.racks.count(&replaced(&p.replicas, from, *h)) > self.racks.count(&p.replicas)
                })
                .min_by_key(|h| (self.load.get(h).copied().unwrap_or(0), *h));
            if let Some(to) = to {
                self.push(topic, partition, p, from, to, "rack");
            }
        }
    }

    /// Step 2: replica counts within one of each other.
    fn spread_replicas(&mut self) {
        'next: while !self.full() {
            let mut by_load: Vec<(usize, i32)> = self.load.iter().map(|(b, n)| (*n, *b)).collect();
            by_load.sort_unstable();
            for &(most, from) in by_load.iter().rev() {
                for &(least, to) in &by_load {
                    if most <= least + 1 {
                        break;
                    }
                    // Bytes first (to the MiB), then leaderships: a leader
                    // replica moves when `from` leads more than `to`, so the
                    // leader step has less left to do, and stays otherwise.
                    let gap = |size: u64| {
                        let (f, t) = (self.bytes[&from].saturating_sub(size), self.bytes[&to] + size);
                        f.abs_diff(t) >> 20
                    };
                    let (led_from, led_to) = (self.leaders[&from], self.leaders[&to]);
                    let leadership = |p: &PartitionRegistration| match p.replicas.first() == Some(&from) {
                        true if led_from > led_to + 1 => 0,
                        false => 1,
                        true => 2,
                    };
                    let best = self
                        .movable()
                        .filter(|(_, _, p)| {
                            p.replicas.contains(&from)
                                && !p.replicas.contains(&to)
                                && self.racks.keeps_spread(&p.replicas, from, to)
                        })
                        .min_by_key(|(t, i, p)| (gap(self.size(t, *i)), leadership(p)));
                    if let Some((topic, partition, p)) = best {
                        self.push(topic, partition, p, from, to, "replica count");
                        continue 'next;
                    }
                }
            }
            return;
        }
    }

    /// Step 3: bytes, by swapping a larger replica for a smaller one.
    fn spread_bytes(&mut self) {
        if self.sizes.is_empty() || self.hosts.is_empty() {
            return;
        }
        while self.moves.len() + 2 <= self.budget {
            let Some(((from, most), (to, least))) = extremes(&self.bytes) else { return };
            let mean = self.bytes.values().sum::<u64>() as f64 / self.bytes.len() as f64;
            let gap = most - least;
            if gap < MIN_BYTES_GAP || (gap as f64) <= mean * BYTES_TOLERANCE {
                return;
            }
            let big: Vec<_> = self
                .movable()
                .filter(|(_, _, p)| {
                    p.replicas.contains(&from)
                        && !p.replicas.contains(&to)
                        && self.racks.keeps_spread(&p.replicas, from, to)
                })
                .collect();
            let small: Vec<_> = self
                .movable()
                .filter(|(_, _, p)| {
                    p.replicas.contains(&to)
                        && !p.replicas.contains(&from)
                        && self.racks.keeps_spread(&p.replicas, to, from)
                })
                .collect();
            // d = what `from` sheds: 0 < d < gap lowers the gap; d near gap/2 halves it.
            let mut best: Option<(u64, usize, usize)> = None;
            for (bi, (bt, bp, _)) in big.iter().enumerate() {
                let sb = self.size(bt, *bp);
                for (si, (st, sp, _)) in small.iter().enumerate() {
                    let ss = self.size(st, *sp);
                    let Some(d) = sb.checked_sub(ss).filter(|d| *d > 0 && *d < gap && *d >= gap / 8) else {
                        continue;
                    };
                    let miss = d.abs_diff(gap / 2);
                    if best.is_none_or(|(m, _, _)| miss < m) {
                        best = Some((miss, bi, si));
                    }
                }
            }
            let Some((_, bi, si)) = best else { return };
            let (bt, bp, b) = big[bi];
            let (st, sp, s) = small[si];
            self.push(bt, bp, b, from, to, "bytes");
            self.push(st, sp, s, to, from, "bytes");
        }
    }

    /// Step 4: preferred leaders, among partitions no replica move touches.
    /// A leadership passes from a broker leading too many to one leading
    /// too few along the shortest chain of partitions (a leads one where b
    /// is in sync, b one where c is, …): racks can keep the two ends from
    /// ever sharing a partition. Only the ends' counts change.
    fn spread_leaders(&mut self) {
        let mut leaders = leader_load(self.image);
        while !self.full() {
            let Some(path) = self.leader_path(&leaders) else { return };
            if self.moves.len() + path.len() > self.budget {
                return;
            }
            for (topic, partition, p, from, to) in path {
                let target: Vec<i32> = p
                    .replicas
                    .iter()
                    .map(|r| match *r {
                        r if r == from => to,
                        r if r == to => from,
                        r => r,
                    })
                    .collect();
                self.moves.push(Move {
                    topic: topic.to_string(),
                    partition,
                    from: p.replicas.clone(),
                    to: target,
                    reason: "leader count",
                });
                *leaders.entry(from).or_default() -= 1;
                *leaders.entry(to).or_default() += 1;
            }
        }
    }

    /// The shortest chain of leadership swaps from the broker leading the
    /// most (that has one) to a broker leading at least two fewer.
    #[allow(clippy::type_complexity)]
    fn leader_path(
        &self,
        leaders: &BTreeMap<i32, usize>,
    ) -> Option<Vec<(&'a str, i32, &'a PartitionRegistration, i32, i32)>> {
        // Edges a -> b: a partition a leads (preferred) with b in sync.
        let mut edges: BTreeMap<i32, BTreeMap<i32, (&'a str, i32, &'a PartitionRegistration)>> = BTreeMap::new();
        for (topic, partition, p) in self.movable() {
            let Some(&first) = p.replicas.first() else { continue };
            for b in p.replicas.iter().skip(1).filter(|b| p.isr.contains(b)) {
                edges.entry(first).or_default().entry(*b).or_insert((topic, partition, p));
            }
        }
        let mut by_load: Vec<(usize, i32)> = leaders.iter().map(|(b, n)| (*n, *b)).collect();
        by_load.sort_unstable_by(|a, b| b.cmp(a));
        for &(most, from) in &by_load {
            // Breadth first from `from`; stop at the first broker two below it.
            let mut came_from: BTreeMap<i32, i32> = BTreeMap::from([(from, from)]);
            let mut frontier = vec![from];
            let mut end = None;
            'search: while !frontier.is_empty() {
                let mut next = Vec::new();
                for a in frontier {
                    for b in edges.get(&a).map(|e| e.keys().copied().collect::<Vec<_>>()).unwrap_or_default() {
                        if came_from.contains_key(&b) || !leaders.contains_key(&b) {
                            continue;
                        }
                        came_from.insert(b, a);
                        if leaders[&b] + 1 < most {
                            end = Some(b);
                            break 'search;
                        }
                        next.push(b);
                    }
                }
                frontier = next;
            }
            let Some(mut at) = end else { continue };
            let mut path = Vec::new();
            while at != from {
                let prev = came_from[&at];
                let (topic, partition, p) = edges[&prev][&at];
                path.push((topic, partition, p, prev, at));
                at = prev;
            }
            path.reverse();
            return Some(path);
        }
        None
    }
}

/// The next moves, at most `max_moves` minus the reassignments running.
pub fn plan(image: &MetadataImage, sizes: &Sizes, mode: Mode, max_moves: usize) -> Vec<Move> {
    if mode == Mode::Off {
        return Vec::new();
    }
    let running = image.topics.values().flat_map(|t| t.partitions.values()).filter(|p| p.is_reassigning()).count();
    let mut planner = Planner {
        image,
        sizes,
        racks: Racks::of_image(image),
        hosts: hosts(image),
        budget: max_moves.saturating_sub(running),
        moves: Vec::new(),
        load: replica_load(image),
        bytes: byte_load(image, sizes),
        leaders: leader_load(image),
    };
    planner.spread_racks();
    planner.spread_replicas();
    planner.spread_bytes();
    if mode == Mode::Continuous {
        planner.spread_leaders();
    }
    planner.moves
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use strom_raft::{BrokerState, MetadataRecord, TopicId};

    use super::*;
    use crate::controller::reassignment;
    use crate::controller::test_support::{add_topic, image_with_racks};

    fn apply(image: &mut MetadataImage, record: &MetadataRecord) {
        image.apply(record).expect("the record applies");
    }

    fn image(brokers: i32, partitions: &[Vec<i32>]) -> MetadataImage {
        let racks: Vec<(i32, Option<&str>)> = (1..=brokers).map(|b| (b, None)).collect();
        racked(&racks, partitions)
    }

    /// Every broker in `racks` active, topic t with `partitions` in sync.
    fn racked(racks: &[(i32, Option<&str>)], partitions: &[Vec<i32>]) -> MetadataImage {
        let all: Vec<i32> = racks.iter().map(|(b, _)| *b).collect();
        let mut img = image_with_racks(racks, &all);
        add_topic(&mut img, "t", TopicId(5), partitions);
        img
    }

    fn sizes(mb: &[u64]) -> Sizes {
        mb.iter().enumerate().map(|(i, m)| (("t".to_string(), i as i32), m << 20)).collect()
    }

    /// Runs plans to completion as the controller would, each move completing
    /// at once; returns how many moves were made.
    fn converge(img: &mut MetadataImage, mode: Mode, max_moves: usize) -> usize {
        converge_sized(img, &Sizes::new(), mode, max_moves)
    }

    fn converge_sized(img: &mut MetadataImage, sizes: &Sizes, mode: Mode, max_moves: usize) -> usize {
        let mut made = 0;
        for _ in 0..1_000 {
            let moves = plan(img, sizes, mode, max_moves);
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
        assert!(plan(&img, &Sizes::new(), Mode::Continuous, 2).is_empty(), "quiet once balanced");
    }

    #[test]
    fn replica_moves_carry_leaderships_so_few_leader_moves_are_left() {
        // 30 partitions over 1-3, brokers 4 and 5 join: 36 replica moves at least,
        // and the 12 leaderships 4 and 5 need can ride on them.
        let layout: Vec<Vec<i32>> = (0..30).map(|i| (0..3).map(|k| (i + k) % 3 + 1).collect()).collect();
        let mut img = image(5, &layout);
        let made = converge(&mut img, Mode::Continuous, 4);
        assert!(spread(&replica_load(&img)) <= 1 && spread(&leader_load(&img)) <= 1);
        assert!(made <= 36, "{made} moves for a minimum of 36");
    }

    #[test]
    fn off_plans_nothing_and_node_add_leaves_leaders() {
        let img = image(4, &vec![vec![1, 2, 3]; 6]);
        assert!(plan(&img, &Sizes::new(), Mode::Off, 4).is_empty());
        assert!(plan(&img, &Sizes::new(), Mode::NodeAdd, 4).iter().all(|m| m.reason == "replica count"));
    }

    #[test]
    fn a_dead_or_drained_broker_is_neither_source_nor_target() {
        // Balanced over 1-3; 4 is down, so it gets nothing.
        let mut img = image(4, &[vec![1, 2, 3], vec![2, 3, 1], vec![3, 1, 2]]);
        apply(&mut img, &MetadataRecord::BrokerRegistrationChange { broker_id: 4, state: BrokerState::Fenced });
        assert!(plan(&img, &Sizes::new(), Mode::Continuous, 4).is_empty());
        let mut img = image(4, &[vec![1, 2, 3], vec![1, 2, 4]]);
        apply(&mut img, &MetadataRecord::BrokerDecommission { broker_id: 4, on: true });
        assert!(plan(&img, &Sizes::new(), Mode::Continuous, 4).iter().all(|m| !m.to.contains(&4)));
    }

    #[test]
    fn replicas_sharing_a_rack_move_apart_and_stay_apart() {
        // Racks a: 1, 2; b: 3, 4. Every partition sits in rack a only.
        let racks = [(1, Some("a")), (2, Some("a")), (3, Some("b")), (4, Some("b"))];
        let mut img = racked(&racks, &vec![vec![1, 2]; 8]);
        let first = plan(&img, &Sizes::new(), Mode::NodeAdd, 4);
        assert!(first.iter().all(|m| m.reason == "rack"), "{first:?}");
        converge(&mut img, Mode::Continuous, 4);
        let r = Racks::of_image(&img);
        for p in img.topics["t"].partitions.values() {
            assert_eq!(r.count(&p.replicas), 2, "{:?} spans both racks", p.replicas);
        }
        assert!(spread(&replica_load(&img)) <= 1, "{:?}", replica_load(&img));
        assert!(spread(&leader_load(&img)) <= 1, "{:?}", leader_load(&img));
        assert!(plan(&img, &Sizes::new(), Mode::Continuous, 4).is_empty());
    }

    #[test]
    fn equal_counts_with_unequal_bytes_swap_a_large_replica_for_a_small_one() {
        // Two replicas each; broker 1 holds 2,000 MB, broker 2 200 MB.
        let mut img = image(2, &[vec![1], vec![1], vec![2], vec![2]]);
        let sized = sizes(&[1_000, 1_000, 100, 100]);
        let moves = plan(&img, &sized, Mode::NodeAdd, 4);
        assert_eq!(moves.len(), 2, "one swap: {moves:?}");
        assert!(moves.iter().all(|m| m.reason == "bytes"));
        converge_sized(&mut img, &sized, Mode::Continuous, 4);
        let bytes = byte_load(&img, &sized);
        assert_eq!(bytes[&1], bytes[&2], "{bytes:?}");
        assert_eq!(spread(&replica_load(&img)), 0);
        // A gap under the tolerance (here under 64 MiB) is left alone.
        let img = image(2, &[vec![1], vec![2]]);
        assert!(plan(&img, &sizes(&[100, 50]), Mode::Continuous, 4).is_empty());
    }

    #[test]
    fn a_count_move_takes_the_partition_that_evens_the_bytes() {
        // Broker 1 holds 3 replicas (10, 300, 500 MB), broker 2 one of 300 MB.
        let img = image(2, &[vec![1], vec![1], vec![1], vec![2]]);
        let moves = plan(&img, &sizes(&[10, 300, 500, 300]), Mode::NodeAdd, 1);
        assert_eq!(moves.len(), 1);
        assert_eq!((moves[0].partition, moves[0].reason), (1, "replica count"), "{moves:?}");
    }

    proptest! {
        #[test]
        fn racked_and_sized_plans_converge_and_never_narrow_racks(
            brokers in 3i32..7,
            rack_count in 1i32..4,
            layout in proptest::collection::vec((0i32..100, 1usize..4, 0u64..2_000), 1..16),
            max_moves in 2usize..5,
        ) {
            let names = ["a", "b", "c"];
            let racks: Vec<(i32, Option<&str>)> =
                (1..=brokers).map(|b| (b, Some(names[(b % rack_count) as usize]))).collect();
            let partitions: Vec<Vec<i32>> = layout
                .iter()
                .map(|(seed, rf, _)| (0..(*rf as i32).min(brokers)).map(|k| (seed + k) % brokers + 1).collect())
                .collect();
            let sized = sizes(&layout.iter().map(|(_, _, mb)| *mb).collect::<Vec<_>>());
            let mut img = racked(&racks, &partitions);
            let r = Racks::of_image(&img);
            let before: Vec<usize> = img.topics["t"].partitions.values().map(|p| r.count(&p.replicas)).collect();
            converge_sized(&mut img, &sized, Mode::Continuous, max_moves);
            let available = r.count(&(1..=brokers).collect::<Vec<_>>());
            for (i, p) in &img.topics["t"].partitions {
                prop_assert_eq!(p.replicas.len(), partitions[*i as usize].len(), "RF kept");
                let spanned = r.count(&p.replicas);
                prop_assert!(spanned >= before[*i as usize], "racks narrowed: {:?}", p.replicas);
                prop_assert_eq!(spanned, p.replicas.len().min(available), "racks spread: {:?}", p.replicas);
            }
            prop_assert!(plan(&img, &sized, Mode::Continuous, max_moves).is_empty(), "quiet when balanced");
        }
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
            prop_assert!(plan(&img, &Sizes::new(), Mode::Continuous, max_moves).is_empty(), "idempotent when balanced");
        }
    }
}
