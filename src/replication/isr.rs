//! ISR decisions on the partition leader (pure).
//!
//! A follower is caught up when it has fetched up to the leader's log end
//! offset; if it last was more than `replica.lag.time.max.ms` ago, it leaves
//! the ISR. A replica outside the ISR rejoins once its log end offset reaches
//! the high watermark and the start of the leader's epoch (Kafka's rules; the change itself is committed by the
//! controller, checked against leader and partition epochs).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// A number that grows with every call, process-wide: orders a follower's
/// fetch requests against the starts of its progress records.
pub fn stamp() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// What the leader knows of one follower, from its fetches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowerProgress {
    pub log_end_offset: i64,
    pub last_caught_up_ms: i64,
    pub last_fetch_ms: i64,
    /// The leader's log end offset when this follower last fetched.
    pub leader_end_at_last_fetch: i64,
    /// When this record began (a [`stamp`]). A fetch request received before
    /// it was sent for a replica since removed (and its log deleted): its
    /// position says nothing about the log the replica holds now.
    pub since: u64,
}

impl FollowerProgress {
    /// A follower the leader has not heard from yet, given a grace period from `now_ms`.
    pub fn new(now_ms: i64) -> Self {
        Self {
            log_end_offset: -1,
            last_caught_up_ms: now_ms,
            last_fetch_ms: now_ms,
            leader_end_at_last_fetch: -1,
            since: stamp(),
        }
    }

    /// Records a fetch at `fetch_offset` while the leader's log ends at `leader_end`.
    pub fn on_fetch(&mut self, fetch_offset: i64, leader_end: i64, now_ms: i64) {
        if fetch_offset >= leader_end {
            self.last_caught_up_ms = now_ms;
        } else if fetch_offset >= self.leader_end_at_last_fetch && self.leader_end_at_last_fetch >= 0 {
            // It has everything the leader had at its previous fetch.
            self.last_caught_up_ms = self.last_caught_up_ms.max(self.last_fetch_ms);
        }
        self.log_end_offset = fetch_offset;
        self.last_fetch_ms = now_ms;
        self.leader_end_at_last_fetch = leader_end;
    }
}

/// The leader's view of one partition.
#[derive(Debug, Clone, Copy)]
pub struct LeaderView<'a> {
    pub leader: i32,
    pub isr: &'a [i32],
    pub replicas: &'a [i32],
    pub high_watermark: i64,
    /// The leader's log end offset when its leader epoch began.
    pub epoch_start_offset: i64,
}

/// The log end offset a replica outside the ISR must reach to join it: the
/// high watermark, and the start of the leader's epoch. A new leader's high
/// watermark can be behind the one the previous leader acknowledged up to;
/// a replica let in below the epoch start could lack acknowledged records
/// and then be elected (Kafka's `isFollowerInSync` has the same rule).
pub fn join_offset(high_watermark: i64, epoch_start_offset: i64) -> i64 {
    high_watermark.max(epoch_start_offset)
}

/// The ISR the leader should ask for, or `None` when it is right as it is.
pub fn desired_isr(
    view: LeaderView<'_>,
    progress: &HashMap<i32, FollowerProgress>,
    now_ms: i64,
    lag_max_ms: i64,
    is_active: impl Fn(i32) -> bool,
) -> Option<Vec<i32>> {
    let LeaderView { leader, isr, replicas, high_watermark, epoch_start_offset } = view;
    let join_at = join_offset(high_watermark, epoch_start_offset);
    let lagging = |b: i32| progress.get(&b).is_none_or(|p| now_ms - p.last_caught_up_ms > lag_max_ms);
    let mut next: Vec<i32> = isr.iter().copied().filter(|&b| b == leader || !lagging(b)).collect();
    for &r in replicas {
        if next.contains(&r) || r == leader || !is_active(r) {
            continue;
        }
        if progress.get(&r).is_some_and(|p| p.log_end_offset >= join_at && !lagging(r)) {
            next.push(r);
        }
    }
    if !next.contains(&leader) {
        next.insert(0, leader);
    }
    (next != isr).then_some(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(entries: &[(i32, i64, i64)]) -> HashMap<i32, FollowerProgress> {
        entries
            .iter()
            .map(|&(b, end, caught_up)| {
                (
                    b,
                    FollowerProgress {
                        log_end_offset: end,
                        last_caught_up_ms: caught_up,
                        last_fetch_ms: caught_up,
                        leader_end_at_last_fetch: end,
                        since: 0,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn a_lagging_follower_leaves_and_a_caught_up_one_joins() {
        let all = |_: i32| true;
        let p = progress(&[(2, 100, 1_000), (3, 50, 9_500)]);
        assert_eq!(
            desired_isr(
                LeaderView {
                    leader: 1,
                    isr: &[1, 2, 3],
                    replicas: &[1, 2, 3],
                    high_watermark: 100,
                    epoch_start_offset: 0
                },
                &p,
                10_000,
                5_000,
                all
            ),
            Some(vec![1, 3])
        );
        let p = progress(&[(2, 100, 9_900), (3, 100, 9_900)]);
        assert_eq!(
            desired_isr(
                LeaderView {
                    leader: 1,
                    isr: &[1, 3],
                    replicas: &[1, 2, 3],
                    high_watermark: 100,
                    epoch_start_offset: 0
                },
                &p,
                10_000,
                5_000,
                all
            ),
            Some(vec![1, 3, 2])
        );
        assert_eq!(
            desired_isr(
                LeaderView {
                    leader: 1,
                    isr: &[1, 2, 3],
                    replicas: &[1, 2, 3],
                    high_watermark: 100,
                    epoch_start_offset: 0
                },
                &p,
                10_000,
                5_000,
                all
            ),
            None
        );
    }

    #[test]
    fn behind_the_high_watermark_or_fenced_stays_out() {
        let p = progress(&[(2, 90, 9_900)]);
        assert_eq!(
            desired_isr(
                LeaderView { leader: 1, isr: &[1], replicas: &[1, 2], high_watermark: 100, epoch_start_offset: 0 },
                &p,
                10_000,
                5_000,
                |_| true
            ),
            None
        );
        let p = progress(&[(2, 100, 9_900)]);
        assert_eq!(
            desired_isr(
                LeaderView { leader: 1, isr: &[1], replicas: &[1, 2], high_watermark: 100, epoch_start_offset: 0 },
                &p,
                10_000,
                5_000,
                |b| b != 2
            ),
            None
        );
    }

    #[test]
    fn a_new_leader_lets_in_no_replica_behind_the_start_of_its_epoch() {
        // The previous leader acknowledged up to 120; this leader's high
        // watermark is still 100 and its epoch starts at 120.
        let view = LeaderView { leader: 1, isr: &[1], replicas: &[1, 2], high_watermark: 100, epoch_start_offset: 120 };
        let p = progress(&[(2, 110, 9_900)]);
        assert_eq!(desired_isr(view, &p, 10_000, 5_000, |_| true), None, "110 may lack acknowledged records");
        let p = progress(&[(2, 120, 9_900)]);
        assert_eq!(desired_isr(view, &p, 10_000, 5_000, |_| true), Some(vec![1, 2]));
    }

    #[test]
    fn caught_up_tracking() {
        let mut f = FollowerProgress::new(0);
        f.on_fetch(10, 20, 100);
        assert_eq!(f.last_caught_up_ms, 0);
        f.on_fetch(20, 30, 200);
        assert_eq!(f.last_caught_up_ms, 100, "had all the leader had at its previous fetch");
        f.on_fetch(30, 30, 300);
        assert_eq!(f.last_caught_up_ms, 300);
    }
}
