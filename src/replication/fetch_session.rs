//! A follower's half of an incremental fetch session (KIP-227) with one
//! leader, as Kafka's `FetchSessionHandler`: the first request is full and
//! opens the session; each later one names only the partitions whose fetch
//! position changed or that joined, and the ones to forget. The leader's
//! answers then carry only partitions with news, so an idle follower of
//! thousands of partitions sends and reads a few bytes per poll.
//!
//! Any failure (an error answer, a lost connection, a timeout) starts over
//! with a full request that also closes the old session on the leader.

use std::collections::{BTreeMap, HashMap};

use kafka_protocol::messages::fetch_request::FetchPartition;

type Key = (String, i32);

/// The partitions one request stands for, by topic.
pub type Partitions = BTreeMap<String, Vec<FetchPartition>>;

/// What the next request carries.
#[derive(Debug, PartialEq)]
pub struct Next {
    pub session_id: i32,
    pub epoch: i32,
    pub send: Partitions,
    pub forget: BTreeMap<String, Vec<i32>>,
}

#[derive(Debug, Default)]
pub struct SessionHandler {
    /// The open session; 0: the next request is full.
    id: i32,
    /// The epoch the next incremental request carries.
    epoch: i32,
    /// A session to close with the next full request.
    close: i32,
    /// What the leader's session holds: each partition as last sent.
    sent: HashMap<Key, FetchPartition>,
    /// The whole set the request in flight stands for, and whether it was full.
    pending: Option<(HashMap<Key, FetchPartition>, bool)>,
}

impl SessionHandler {
    /// The request for `wanted`, the partitions to fetch now.
    pub fn build(&mut self, wanted: &Partitions) -> Next {
        let all: HashMap<Key, FetchPartition> =
            wanted.iter().flat_map(|(t, ps)| ps.iter().map(move |p| ((t.clone(), p.partition), p.clone()))).collect();
        if self.id == 0 {
            self.pending = Some((all, true));
            // Epoch 0 opens a session, closing the one named.
            return Next { session_id: self.close, epoch: 0, send: wanted.clone(), forget: BTreeMap::new() };
        }
        let mut send = Partitions::new();
        for (topic, ps) in wanted {
            for p in ps {
                if self.sent.get(&(topic.clone(), p.partition)) != Some(p) {
                    send.entry(topic.clone()).or_default().push(p.clone());
                }
            }
        }
        let mut forget: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        for (topic, partition) in self.sent.keys().filter(|k| !all.contains_key(*k)) {
            forget.entry(topic.clone()).or_default().push(*partition);
        }
        forget.values_mut().for_each(|ps| ps.sort_unstable());
        self.pending = Some((all, false));
        Next { session_id: self.id, epoch: self.epoch, send, forget }
    }

    /// The leader's answer to the last request built: its top-level error and session id.
    pub fn answered(&mut self, error_code: i16, session_id: i32) {
        let Some((all, full)) = self.pending.take() else { return };
        if error_code != 0 {
            self.reset();
            return;
        }
        self.close = 0;
        if session_id == 0 {
            // No session (the leader keeps none, or closed it): the next request is full.
            self.id = 0;
            self.sent.clear();
            return;
        }
        if full {
            (self.id, self.epoch) = (session_id, 1);
        } else {
            self.epoch = if self.epoch == i32::MAX { 1 } else { self.epoch + 1 };
        }
        self.sent = all;
    }

    /// After a failed request: the next one is full and closes this session.
    pub fn reset(&mut self) {
        if self.id != 0 {
            self.close = self.id;
        }
        self.id = 0;
        self.sent.clear();
        self.pending = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted(parts: &[(&str, i32, i64)]) -> Partitions {
        let mut out = Partitions::new();
        for (t, p, offset) in parts {
            out.entry(t.to_string())
                .or_default()
                .push(FetchPartition::default().with_partition(*p).with_fetch_offset(*offset));
        }
        out
    }

    fn sent(next: &Next) -> Vec<(String, i32, i64)> {
        next.send.iter().flat_map(|(t, ps)| ps.iter().map(move |p| (t.clone(), p.partition, p.fetch_offset))).collect()
    }

    #[test]
    fn opens_with_a_full_request_then_sends_only_changes() {
        let mut h = SessionHandler::default();
        let next = h.build(&wanted(&[("a", 0, 0), ("a", 1, 0), ("b", 0, 5)]));
        assert_eq!((next.session_id, next.epoch, sent(&next).len()), (0, 0, 3));
        h.answered(0, 42);

        let next = h.build(&wanted(&[("a", 0, 10), ("a", 1, 0), ("b", 0, 5)]));
        assert_eq!((next.session_id, next.epoch), (42, 1));
        assert_eq!(sent(&next), vec![("a".into(), 0, 10)]);
        assert!(next.forget.is_empty());
        h.answered(0, 42);

        // b/0 leaves (it leads now, or needs truncation), c/2 joins.
        let next = h.build(&wanted(&[("a", 0, 10), ("a", 1, 0), ("c", 2, 0)]));
        assert_eq!(next.epoch, 2);
        assert_eq!(sent(&next), vec![("c".into(), 2, 0)]);
        assert_eq!(next.forget, BTreeMap::from([("b".to_string(), vec![0])]));
        h.answered(0, 42);
        let next = h.build(&wanted(&[("a", 0, 10), ("a", 1, 0), ("c", 2, 0)]));
        assert_eq!((next.epoch, sent(&next).len(), next.forget.len()), (3, 0, 0), "idle: an empty request");
    }

    #[test]
    fn an_error_or_a_lost_answer_starts_over_and_closes_the_old_session() {
        let mut h = SessionHandler::default();
        let all = wanted(&[("a", 0, 0), ("a", 1, 0)]);
        h.build(&all);
        h.answered(0, 7);
        h.build(&all);
        h.answered(71, 0); // INVALID_FETCH_SESSION_EPOCH
        let next = h.build(&all);
        assert_eq!((next.session_id, next.epoch, sent(&next).len()), (7, 0, 2), "full, closing session 7");
        h.answered(0, 8);
        h.build(&all);
        h.reset(); // the connection broke mid-request
        let next = h.build(&all);
        assert_eq!((next.session_id, next.epoch, sent(&next).len()), (8, 0, 2));
    }

    #[test]
    fn a_sessionless_answer_means_full_requests() {
        let mut h = SessionHandler::default();
        let all = wanted(&[("a", 0, 0)]);
        h.build(&all);
        h.answered(0, 0); // the leader keeps no sessions
        let next = h.build(&all);
        assert_eq!((next.session_id, next.epoch, sent(&next).len()), (0, 0, 1));
    }
}
