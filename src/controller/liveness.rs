//! Broker liveness on the controller: heartbeats are kept in memory, never
//! logged (KIP-631). A broker whose heartbeats stop for
//! `broker.session.timeout.ms` is due to be fenced; a new controller gives
//! every registered broker a fresh session when it takes over.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use strom_raft::{BrokerState, MetadataImage};

#[derive(Debug)]
pub struct Liveness {
    session_timeout: Duration,
    last_seen: HashMap<i32, Instant>,
    /// The metadata log index of each broker's latest registration: it is
    /// unfenced once it has applied that far.
    registered_at: HashMap<i32, u64>,
}

impl Liveness {
    pub fn new(session_timeout: Duration) -> Self {
        Self { session_timeout, last_seen: HashMap::new(), registered_at: HashMap::new() }
    }

    /// A new controller: every broker gets `grace` from now to heartbeat
    /// (its session may already be partly used up by the failover; live
    /// brokers heartbeat to the new controller within an interval or two).
    /// The previous controller is the exception: its AppendEntries were its
    /// heartbeats, so its session runs on from the last one this node heard
    /// (`predecessor`), and a dead controller is fenced as soon as its session
    /// is over instead of a grace after the election that replaced it. A
    /// heartbeat this node took itself, when it was the controller before,
    /// counts too: re-elected, it does not fence a broker that heartbeated to
    /// it all along because that broker led the quorum long ago.
    pub fn reset(&mut self, image: &MetadataImage, now: Instant, grace: Duration, predecessor: Option<(i32, Instant)>) {
        let seen = now.checked_sub(self.session_timeout.saturating_sub(grace)).unwrap_or(now);
        let before = std::mem::take(&mut self.last_seen);
        self.last_seen = image.brokers.keys().map(|&b| (b, seen)).collect();
        if let Some((broker, heard)) = predecessor {
            let heard = before.get(&broker).map_or(heard, |&hb| hb.max(heard));
            if let Some(last) = self.last_seen.get_mut(&broker) {
                *last = (*last).min(heard);
            }
        }
        self.registered_at.clear();
    }

    /// Records a heartbeat; whether the broker's session had expired before
    /// it (a fence may be under way).
    pub fn heartbeat(&mut self, broker_id: i32, now: Instant) -> bool {
        let before = self.last_seen.insert(broker_id, now);
        before.is_none_or(|seen| now.saturating_duration_since(seen) > self.session_timeout)
    }

    /// Whether the broker's session has expired at `now`.
    pub fn is_expired(&self, broker_id: i32, now: Instant) -> bool {
        self.last_seen.get(&broker_id).is_none_or(|&seen| now.saturating_duration_since(seen) > self.session_timeout)
    }

    pub fn registered(&mut self, broker_id: i32, index: u64, now: Instant) {
        self.registered_at.insert(broker_id, index);
        self.last_seen.insert(broker_id, now);
    }

    /// Whether a fenced broker that has applied up to `applied_index` may be unfenced.
    pub fn caught_up(&self, broker_id: i32, applied_index: u64) -> bool {
        applied_index >= self.registered_at.get(&broker_id).copied().unwrap_or(0)
    }

    /// Unfenced brokers (active or shutting down) whose session expired.
    pub fn expired(&self, image: &MetadataImage, now: Instant) -> Vec<i32> {
        image
            .brokers
            .values()
            .filter(|b| b.state != BrokerState::Fenced)
            .filter(|b| self.is_expired(b.broker_id, now))
            .map(|b| b.broker_id)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::test_support::image_with_brokers;

    fn image() -> MetadataImage {
        image_with_brokers(1..=3, &[1, 2])
    }

    #[test]
    fn silent_unfenced_brokers_expire() {
        let img = image();
        let t0 = Instant::now();
        let mut l = Liveness::new(Duration::from_millis(100));
        l.reset(&img, t0, Duration::from_millis(100), None);
        assert!(l.expired(&img, t0 + Duration::from_millis(50)).is_empty());
        l.heartbeat(2, t0 + Duration::from_millis(90));
        assert_eq!(l.expired(&img, t0 + Duration::from_millis(150)), vec![1], "3 is already fenced");
    }

    #[test]
    fn the_previous_controllers_session_runs_from_its_last_append_entries() {
        let img = image();
        let t0 = Instant::now();
        let mut l = Liveness::new(Duration::from_millis(1000));
        // Broker 2 led the quorum until 800 ms before this node took over.
        l.reset(&img, t0 + Duration::from_millis(800), Duration::from_millis(500), Some((2, t0)));
        assert!(l.expired(&img, t0 + Duration::from_millis(900)).is_empty());
        assert_eq!(l.expired(&img, t0 + Duration::from_millis(1100)), vec![2], "its session ended at 1000 ms");
        // Every other broker keeps the grace from the takeover: 800 + 500 ms.
        assert_eq!(l.expired(&img, t0 + Duration::from_millis(1301)), vec![1, 2]);
        // A predecessor heard after the grace's start keeps the grace.
        l.reset(&img, t0, Duration::from_millis(500), Some((2, t0 + Duration::from_millis(100))));
        assert!(l.expired(&img, t0 + Duration::from_millis(400)).is_empty());
    }

    #[test]
    fn a_re_elected_controller_counts_the_heartbeats_it_took_before() {
        let img = image();
        let t0 = Instant::now();
        let mut l = Liveness::new(Duration::from_millis(1000));
        // Broker 2 led the quorum at t0, then this node did and took 2's heartbeats.
        l.reset(&img, t0, Duration::from_millis(500), Some((2, t0)));
        l.heartbeat(2, t0 + Duration::from_millis(5000));
        l.heartbeat(1, t0 + Duration::from_millis(5000));
        // Re-elected at 5100 ms: 2 is still the last other leader heard, at t0.
        l.reset(&img, t0 + Duration::from_millis(5100), Duration::from_millis(500), Some((2, t0)));
        assert!(l.expired(&img, t0 + Duration::from_millis(5500)).is_empty());
    }

    #[test]
    fn caught_up_compares_with_registration_index() {
        let mut l = Liveness::new(Duration::from_millis(100));
        l.registered(3, 40, Instant::now());
        assert!(!l.caught_up(3, 39));
        assert!(l.caught_up(3, 40));
        assert!(l.caught_up(7, 0), "unknown registration: nothing to wait for");
    }
}
