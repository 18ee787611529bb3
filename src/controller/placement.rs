//! Replica placement for new topics and added partitions.
//!
//! Kafka's rack-unaware round robin: brokers in id order, a start index
//! chosen by the caller (at random, so leaders of many small topics spread),
//! partition `p`'s replicas are the `rf` brokers starting at `start + p`.
//! Pure: the caller supplies the randomness.

/// Replica lists for partitions `first..first + count`.
///
/// `brokers` are the active brokers ascending; `rf <= brokers.len()`.
pub fn place_replicas(brokers: &[i32], first: i32, count: i32, rf: usize, start: usize) -> Vec<Vec<i32>> {
    assert!(rf >= 1 && rf <= brokers.len(), "replication factor {rf} over {} brokers", brokers.len());
    let n = brokers.len();
    (first..first + count)
        .map(|p| {
            let base = start + p as usize;
            (0..rf).map(|j| brokers[(base + j) % n]).collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn leaders_and_replicas_spread_evenly() {
        let brokers = [1, 2, 3];
        let placed = place_replicas(&brokers, 0, 6, 3, 1);
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
    }

    #[test]
    fn added_partitions_continue_the_round_robin() {
        let brokers = [1, 2, 3, 4];
        let all = place_replicas(&brokers, 0, 8, 2, 0);
        let tail = place_replicas(&brokers, 4, 4, 2, 0);
        assert_eq!(&all[4..], &tail[..]);
    }

    #[test]
    #[should_panic(expected = "replication factor")]
    fn rf_above_brokers_is_a_caller_bug() {
        place_replicas(&[1], 0, 1, 2, 0);
    }
}
