//! Replica placement for new topics and added partitions, and the racks
//! (`broker.rack`) every placement decision respects.
//!
//! Kafka's round robin, rack-aware: the brokers are arranged so racks
//! alternate (rack a's first broker, rack b's first, …, rack a's second, …),
//! a start index is chosen by the caller (at random, so leaders of many
//! small topics spread), and partition `p`'s leader is the broker at
//! `start + p`; its followers are the next brokers in that order whose racks
//! hold no replica of it yet, then (once every rack holds one) the next
//! brokers. A broker without a rack counts as a rack of its own, so without
//! racks this is the plain round robin: the `rf` brokers from `start + p` in
//! id order. Pure: the caller supplies the randomness.

use std::collections::{BTreeMap, BTreeSet};

use strom_raft::MetadataImage;

/// Each registered broker's rack; a broker without `broker.rack` is a rack
/// of its own.
#[derive(Debug, Clone, Default)]
pub struct Racks(BTreeMap<i32, String>);

impl Racks {
    pub fn of_image(image: &MetadataImage) -> Racks {
        Racks(image.brokers.values().filter_map(|b| Some((b.broker_id, b.rack.clone()?))).collect())
    }

    #[cfg(test)]
    pub fn from_pairs(pairs: &[(i32, &str)]) -> Racks {
        Racks(pairs.iter().map(|(b, r)| (*b, r.to_string())).collect())
    }

    /// The rack `broker` counts in: its `broker.rack`, or itself.
    pub fn of(&self, broker: i32) -> String {
        self.0.get(&broker).cloned().unwrap_or_else(|| format!("\u{0}broker-{broker}"))
    }

    /// Distinct racks among `brokers`.
    pub fn count(&self, brokers: &[i32]) -> usize {
        brokers.iter().map(|b| self.of(*b)).collect::<BTreeSet<_>>().len()
    }

    /// Whether replacing `from` by `to` in `replicas` keeps at least as many
    /// distinct racks: a move never concentrates a partition in fewer racks.
    pub fn keeps_spread(&self, replicas: &[i32], from: i32, to: i32) -> bool {
        let after: Vec<i32> = replicas.iter().map(|r| if *r == from { to } else { *r }).collect();
        self.count(&after) >= self.count(replicas)
    }

    /// `brokers` (ascending ids) arranged so that racks alternate.
    fn alternated(&self, brokers: &[i32]) -> Vec<i32> {
        let mut by_rack: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        for b in brokers {
            by_rack.entry(self.of(*b)).or_default().push(*b);
        }
        if by_rack.len() == brokers.len() {
            return brokers.to_vec();
        }
        let deepest = by_rack.values().map(Vec::len).max().unwrap_or(0);
        (0..deepest).flat_map(|i| by_rack.values().filter_map(move |rack| rack.get(i).copied())).collect()
    }
}

/// Replica lists for partitions `first..first + count`.
///
/// `brokers` are the active brokers ascending; `rf <= brokers.len()`.
pub fn place_replicas(
    brokers: &[i32],
    racks: &Racks,
    first: i32,
    count: i32,
    rf: usize,
    start: usize,
) -> Vec<Vec<i32>> {
    assert!(rf >= 1 && rf <= brokers.len(), "replication factor {rf} over {} brokers", brokers.len());
    let arranged = racks.alternated(brokers);
    let n = arranged.len();
    let all_racks = racks.count(brokers);
    (first..first + count)
        .map(|p| {
            let base = start + p as usize;
            let mut replicas = vec![arranged[base % n]];
            let mut used: BTreeSet<String> = [racks.of(replicas[0])].into();
            for pass in 0..2 {
                for j in 1..n {
                    if replicas.len() == rf {
                        break;
                    }
                    let b = arranged[(base + j) % n];
                    let rack = racks.of(b);
                    // First pass: new racks only, while some rack holds no replica.
                    if replicas.contains(&b) || (pass == 0 && used.contains(&rack) && used.len() < all_racks) {
                        continue;
                    }
                    used.insert(rack);
                    replicas.push(b);
                }
            }
            replicas
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn no_racks() -> Racks {
        Racks::default()
    }

    #[test]
    fn leaders_and_replicas_spread_evenly() {
        let brokers = [1, 2, 3];
        let placed = place_replicas(&brokers, &no_racks(), 0, 6, 3, 1);
        let mut leaders = BTreeMap::new();
        for replicas in &placed {
            assert_eq!(replicas.len(), 3);
            let mut sorted = replicas.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), 3, "no broker twice in {replicas:?}");
            *leaders.entry(replicas[0]).or_insert(0) += 1;
        }
        assert_eq!(leaders.values().copied().collect::<Vec<_>>(), vec![2, 2, 2]);
        assert_eq!(placed[0][0], 2, "start index picks the first leader");
        assert_eq!(placed[0], vec![2, 3, 1], "without racks: the plain round robin");
    }

    #[test]
    fn added_partitions_continue_the_round_robin() {
        let brokers = [1, 2, 3, 4];
        let all = place_replicas(&brokers, &no_racks(), 0, 8, 2, 0);
        let tail = place_replicas(&brokers, &no_racks(), 4, 4, 2, 0);
        assert_eq!(&all[4..], &tail[..]);
    }

    #[test]
    fn replicas_of_a_partition_go_to_different_racks() {
        // Racks a: 1, 2, 3; b: 4, 5, 6 — ids alone would put 1, 2 together.
        let racks = Racks::from_pairs(&[(1, "a"), (2, "a"), (3, "a"), (4, "b"), (5, "b"), (6, "b")]);
        let brokers = [1, 2, 3, 4, 5, 6];
        for start in 0..6 {
            let placed = place_replicas(&brokers, &racks, 0, 12, 2, start);
            let mut leaders = BTreeMap::new();
            let mut replicas_per = BTreeMap::new();
            for r in &placed {
                assert_eq!(racks.count(r), 2, "{r:?} spans both racks");
                *leaders.entry(r[0]).or_insert(0) += 1;
                for b in r {
                    *replicas_per.entry(*b).or_insert(0) += 1;
                }
            }
            assert!(leaders.values().all(|n| *n == 2), "{leaders:?}");
            assert!(replicas_per.values().all(|n| *n == 4), "{replicas_per:?}");
        }
    }

    #[test]
    fn more_replicas_than_racks_fill_up_after_every_rack_holds_one() {
        let racks = Racks::from_pairs(&[(1, "a"), (2, "a"), (3, "b"), (4, "b")]);
        for r in place_replicas(&[1, 2, 3, 4], &racks, 0, 8, 3, 0) {
            assert_eq!(r.len(), 3);
            assert_eq!(racks.count(&r), 2, "{r:?}");
            let mut d = r.clone();
            d.sort_unstable();
            d.dedup();
            assert_eq!(d.len(), 3, "{r:?}");
        }
    }

    #[test]
    fn a_move_may_not_narrow_the_racks() {
        let racks = Racks::from_pairs(&[(1, "a"), (2, "a"), (3, "b"), (4, "b")]);
        assert!(!racks.keeps_spread(&[1, 3], 3, 2), "both in a");
        assert!(racks.keeps_spread(&[1, 3], 3, 4));
        assert!(racks.keeps_spread(&[1, 2], 2, 3), "widens");
    }

    #[test]
    #[should_panic(expected = "replication factor")]
    fn rf_above_brokers_is_a_caller_bug() {
        place_replicas(&[1], &no_racks(), 0, 1, 2, 0);
    }
}
