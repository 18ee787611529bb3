//! Incremental fetch sessions (KIP-227), the broker's side.
//!
//! A client (a consumer, or a follower broker) that fetches the same
//! partitions over and over opens a session with a full fetch (session id 0,
//! epoch 0). The broker remembers the partitions and their fetch positions
//! and answers with a session id. Each later request (that id, the next
//! epoch) carries only the partitions whose position changed, added ones, and
//! the ones to forget. Its answer carries only the partitions with something
//! new: records, an error, or a changed high watermark, last stable offset or
//! log start offset. An idle consumer of a thousand partitions then sends and
//! receives a few bytes per poll.
//!
//! As in Kafka:
//! - session id 0 with epoch -1 is a sessionless full fetch (older clients,
//!   librdkafka);
//! - epoch -1 with a session id closes that session, and the request is
//!   answered as a sessionless full fetch;
//! - an unknown session gets FETCH_SESSION_ID_NOT_FOUND and a wrong epoch
//!   INVALID_FETCH_SESSION_EPOCH, after which the client starts over;
//! - partitions that returned records move to the end of the session's order,
//!   so a response's byte limit does not always favour the same ones;
//! - the cache holds at most `max.incremental.fetch.session.cache.slots`
//!   sessions (0 turns sessions off). When it is full, a new session takes the
//!   slot of one unused for two minutes or, for a follower, of the least
//!   recently used consumer session; otherwise the client is answered without
//!   a session.
//!
//! A session belongs to the principal and replica id that opened it: any
//! other client using its id gets FETCH_SESSION_ID_NOT_FOUND, and cannot
//! close it.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{FetchRequest, TopicName};
use kafka_protocol::ResponseError;
use rand::Rng;

/// A session unused this long may be evicted for a new one.
const EVICTION_MS: u64 = 120_000;
/// The epoch that opens a session, and the one that asks for none (or closes one).
const INITIAL_EPOCH: i32 = 0;
const FINAL_EPOCH: i32 = -1;

/// One partition as a fetch asks for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wanted {
    pub partition: i32,
    pub fetch_offset: i64,
    pub partition_max_bytes: i32,
    pub current_leader_epoch: i32,
}

/// The partitions one fetch reads, in answer order, grouped in runs of one topic.
pub type Plan = Vec<(TopicName, Vec<Wanted>)>;

/// Who opened a session: only the same principal and replica may use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub principal: Arc<str>,
    pub replica: Option<i32>,
}

/// What kind of answer a fetch gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Every requested partition, and session id 0.
    Sessionless,
    /// Every partition of the session just opened.
    Full { session_id: i32 },
    /// Only what changed among the session's partitions.
    Incremental { session_id: i32 },
}

impl Kind {
    pub fn session_id(self) -> i32 {
        match self {
            Kind::Sessionless => 0,
            Kind::Full { session_id } | Kind::Incremental { session_id } => session_id,
        }
    }
}

/// What a session remembers of one partition: the position asked for, and
/// what the last answer that carried it said.
#[derive(Debug, Clone)]
struct Cached {
    topic: TopicName,
    want: Wanted,
    high_watermark: i64,
    last_stable_offset: i64,
    log_start_offset: i64,
}

impl Cached {
    fn new(topic: TopicName, want: Wanted) -> Self {
        // -1: the first answer after the partition joins always carries it.
        Self { topic, want, high_watermark: -1, last_stable_offset: -1, log_start_offset: -1 }
    }

    /// Whether an incremental answer must carry `data`; remembers what it says.
    fn must_respond(&mut self, data: &PartitionData) -> bool {
        let mut must = has_records(data);
        for (cached, now) in [
            (&mut self.high_watermark, data.high_watermark),
            (&mut self.last_stable_offset, data.last_stable_offset),
            (&mut self.log_start_offset, data.log_start_offset),
        ] {
            if *cached != now {
                *cached = now;
                must = true;
            }
        }
        if data.error_code != 0 {
            // Sent again once the error is gone.
            self.high_watermark = -1;
            must = true;
        }
        must
    }
}

fn has_records(data: &PartitionData) -> bool {
    data.records.as_ref().is_some_and(|r| !r.is_empty())
}

#[derive(Debug)]
struct Session {
    owner: Owner,
    /// The epoch the next request must carry.
    epoch: i32,
    last_used_ms: u64,
    /// In answer order.
    partitions: Vec<Cached>,
    /// Where each (topic, partition) is in `partitions`.
    index: HashMap<(TopicName, i32), usize>,
}

impl Session {
    fn new(owner: Owner, now_ms: u64) -> Self {
        Self { owner, epoch: 1, last_used_ms: now_ms, partitions: Vec::new(), index: HashMap::new() }
    }

    fn upsert(&mut self, topic: &TopicName, want: Wanted) {
        match self.index.get(&(topic.clone(), want.partition)) {
            Some(&i) => self.partitions[i].want = want,
            None => {
                self.index.insert((topic.clone(), want.partition), self.partitions.len());
                self.partitions.push(Cached::new(topic.clone(), want));
            }
        }
    }

    /// Drops `gone` (topic, partition) pairs, in one pass however many.
    fn forget(&mut self, gone: &HashSet<(TopicName, i32)>) {
        if gone.iter().any(|k| self.index.contains_key(k)) {
            self.partitions.retain(|c| !gone.contains(&(c.topic.clone(), c.want.partition)));
            self.reindex();
        }
    }

    fn reindex(&mut self) {
        self.index =
            self.partitions.iter().enumerate().map(|(i, c)| ((c.topic.clone(), c.want.partition), i)).collect();
    }

    fn plan(&self) -> Plan {
        let mut plan: Plan = Vec::new();
        for c in &self.partitions {
            match plan.last_mut() {
                Some((topic, wants)) if *topic == c.topic => wants.push(c.want),
                _ => plan.push((c.topic.clone(), vec![c.want])),
            }
        }
        plan
    }
}

/// The broker's fetch sessions.
#[derive(Debug)]
pub struct FetchSessionCache {
    max_sessions: usize,
    sessions: Mutex<HashMap<i32, Session>>,
    /// Sessions opened since start: of consumers, of followers.
    opened: [AtomicU64; 2],
}

fn wanted(request: &FetchRequest) -> Plan {
    request
        .topics
        .iter()
        .map(|t| {
            let wants = t
                .partitions
                .iter()
                .map(|p| Wanted {
                    partition: p.partition,
                    fetch_offset: p.fetch_offset,
                    partition_max_bytes: p.partition_max_bytes,
                    current_leader_epoch: p.current_leader_epoch,
                })
                .collect();
            (t.topic.clone(), wants)
        })
        .collect()
}

impl FetchSessionCache {
    /// `max_sessions`: `max.incremental.fetch.session.cache.slots`; 0 keeps none.
    pub fn new(max_sessions: usize) -> Self {
        Self { max_sessions, sessions: Mutex::new(HashMap::new()), opened: Default::default() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i32, Session>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sessions held now and the partitions they hold together, of
    /// consumers (`followers` false) or of follower brokers.
    pub fn stats(&self, followers: bool) -> (usize, usize) {
        let sessions = self.lock();
        sessions
            .values()
            .filter(|s| s.owner.replica.is_some() == followers)
            .fold((0, 0), |(n, parts), s| (n + 1, parts + s.partitions.len()))
    }

    /// Sessions opened since start, of consumers or of follower brokers.
    pub fn opened(&self, followers: bool) -> u64 {
        self.opened[usize::from(followers)].load(Ordering::Relaxed)
    }

    /// Reads a request's session fields: the kind of answer, and which
    /// partitions to read in which order. An incremental request's epoch is
    /// used up here, so a request sent twice gets INVALID_FETCH_SESSION_EPOCH.
    pub fn begin(&self, request: &FetchRequest, owner: &Owner, now_ms: u64) -> Result<(Kind, Plan), ResponseError> {
        let (id, epoch) = (request.session_id, request.session_epoch);
        if id == 0 && epoch == FINAL_EPOCH {
            // No session asked for (librdkafka, fetches before v7): no lock taken.
            return Ok((Kind::Sessionless, wanted(request)));
        }
        let mut sessions = self.lock();
        if epoch == FINAL_EPOCH || epoch == INITIAL_EPOCH {
            // A full fetch: it closes the session it names, if that is the caller's.
            if id != 0 && sessions.get(&id).is_some_and(|s| s.owner == *owner) {
                sessions.remove(&id);
            }
            let plan = wanted(request);
            if epoch == FINAL_EPOCH {
                return Ok((Kind::Sessionless, plan));
            }
            let Some(session_id) = self.make_room(&mut sessions, owner, now_ms) else {
                return Ok((Kind::Sessionless, plan));
            };
            let mut session = Session::new(owner.clone(), now_ms);
            for (topic, wants) in &plan {
                wants.iter().for_each(|w| session.upsert(topic, *w));
            }
            // The answer follows the session's order (a partition asked for
            // twice comes once).
            let plan = session.plan();
            sessions.insert(session_id, session);
            self.opened[usize::from(owner.replica.is_some())].fetch_add(1, Ordering::Relaxed);
            return Ok((Kind::Full { session_id }, plan));
        }
        let session =
            sessions.get_mut(&id).filter(|s| s.owner == *owner).ok_or(ResponseError::FetchSessionIdNotFound)?;
        if session.epoch != epoch {
            return Err(ResponseError::InvalidFetchSessionEpoch);
        }
        session.epoch = if epoch == i32::MAX { 1 } else { epoch + 1 };
        session.last_used_ms = now_ms;
        for (topic, wants) in wanted(request) {
            wants.into_iter().for_each(|w| session.upsert(&topic, w));
        }
        let gone: HashSet<(TopicName, i32)> = request
            .forgotten_topics_data
            .iter()
            .flat_map(|f| f.partitions.iter().map(|p| (f.topic.clone(), *p)))
            .collect();
        session.forget(&gone);
        Ok((Kind::Incremental { session_id: id }, session.plan()))
    }

    /// A free session id, evicting a session if the cache is full; None if
    /// no session can be kept for `owner`.
    fn make_room(&self, sessions: &mut HashMap<i32, Session>, owner: &Owner, now_ms: u64) -> Option<i32> {
        if self.max_sessions == 0 {
            return None;
        }
        if sessions.len() >= self.max_sessions {
            sessions.retain(|_, s| now_ms.saturating_sub(s.last_used_ms) < EVICTION_MS);
        }
        if sessions.len() >= self.max_sessions {
            // A follower's session is worth more than a consumer's: it
            // carries every partition the two brokers share.
            let victim = owner
                .replica
                .and_then(|_| {
                    sessions.iter().filter(|(_, s)| s.owner.replica.is_none()).min_by_key(|(_, s)| s.last_used_ms)
                })
                .map(|(id, _)| *id)?;
            sessions.remove(&victim);
        }
        let mut rng = rand::thread_rng();
        loop {
            let id = rng.gen_range(1..=i32::MAX);
            if !sessions.contains_key(&id) {
                return Some(id);
            }
        }
    }

    /// Shapes the answer for `kind`, and records what it carries: a full
    /// answer keeps every partition, an incremental one only those
    /// [`Cached::must_respond`] picks. Partitions that returned records move
    /// to the end of the session's order.
    pub fn finish(&self, kind: Kind, topics: &mut Vec<FetchableTopicResponse>) {
        let session_id = match kind {
            Kind::Sessionless => return,
            Kind::Full { session_id } | Kind::Incremental { session_id } => session_id,
        };
        let mut sessions = self.lock();
        let Some(session) = sessions.get_mut(&session_id) else { return };
        let incremental = matches!(kind, Kind::Incremental { .. });
        // Which of the session's partitions returned records, by position.
        let mut sent_records = vec![false; session.partitions.len()];
        for topic in topics.iter_mut() {
            topic.partitions.retain(|data| {
                let Some(&i) = session.index.get(&(topic.topic.clone(), data.partition_index)) else {
                    return !incremental;
                };
                sent_records[i] = has_records(data);
                session.partitions[i].must_respond(data) || !incremental
            });
        }
        topics.retain(|t| !t.partitions.is_empty());
        if sent_records.contains(&true) {
            let (mut stay, to_end): (Vec<_>, Vec<_>) =
                std::mem::take(&mut session.partitions).into_iter().zip(sent_records).partition(|(_, sent)| !sent);
            stay.extend(to_end);
            session.partitions = stay.into_iter().map(|(c, _)| c).collect();
            session.reindex();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic};
    use kafka_protocol::protocol::StrBytes;

    fn name(t: &str) -> TopicName {
        TopicName(StrBytes::from_string(t.to_string()))
    }

    fn request(id: i32, epoch: i32, parts: &[(&str, i32, i64)], forget: &[(&str, i32)]) -> FetchRequest {
        let mut topics: Vec<FetchTopic> = Vec::new();
        for (t, p, offset) in parts {
            let part =
                FetchPartition::default().with_partition(*p).with_fetch_offset(*offset).with_partition_max_bytes(1000);
            match topics.last_mut() {
                Some(last) if last.topic == name(t) => last.partitions.push(part),
                _ => topics.push(FetchTopic::default().with_topic(name(t)).with_partitions(vec![part])),
            }
        }
        let forgotten = forget
            .iter()
            .map(|(t, p)| ForgottenTopic::default().with_topic(name(t)).with_partitions(vec![*p]))
            .collect();
        FetchRequest::default()
            .with_session_id(id)
            .with_session_epoch(epoch)
            .with_topics(topics)
            .with_forgotten_topics_data(forgotten)
    }

    fn owner(principal: &str, replica: Option<i32>) -> Owner {
        Owner { principal: principal.into(), replica }
    }

    /// An answer for `plan` where `with_records` partitions carry records and all have `hw`.
    fn answer(plan: &Plan, hw: i64, with_records: &[(&str, i32)]) -> Vec<FetchableTopicResponse> {
        plan.iter()
            .map(|(topic, wants)| {
                let partitions = wants
                    .iter()
                    .map(|w| {
                        let records = if with_records.contains(&(topic.0.as_str(), w.partition)) {
                            Bytes::from_static(b"batch")
                        } else {
                            Bytes::new()
                        };
                        PartitionData::default()
                            .with_partition_index(w.partition)
                            .with_high_watermark(hw)
                            .with_last_stable_offset(hw)
                            .with_records(Some(records))
                    })
                    .collect();
                FetchableTopicResponse::default().with_topic(topic.clone()).with_partitions(partitions)
            })
            .collect()
    }

    fn keys(plan: &Plan) -> Vec<(String, i32, i64)> {
        plan.iter().flat_map(|(t, ws)| ws.iter().map(move |w| (t.0.to_string(), w.partition, w.fetch_offset))).collect()
    }

    fn carried(topics: &[FetchableTopicResponse]) -> Vec<(String, i32)> {
        topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(move |p| (t.topic.0.to_string(), p.partition_index)))
            .collect()
    }

    #[test]
    fn epoch_minus_one_without_id_is_sessionless() {
        let cache = FetchSessionCache::new(10);
        let (kind, plan) = cache.begin(&request(0, -1, &[("a", 0, 5)], &[]), &owner("u", None), 0).expect("begin");
        assert_eq!(kind, Kind::Sessionless);
        assert_eq!(keys(&plan), vec![("a".into(), 0, 5)]);
        assert_eq!(cache.stats(false), (0, 0));
    }

    #[test]
    fn a_session_answers_only_what_changed_and_follows_the_positions_sent() {
        let cache = FetchSessionCache::new(10);
        let me = owner("u", None);
        let (kind, plan) =
            cache.begin(&request(0, 0, &[("a", 0, 0), ("a", 1, 0), ("b", 0, 0)], &[]), &me, 0).expect("full");
        let Kind::Full { session_id: id } = kind else { panic!("no session: {kind:?}") };
        let mut full = answer(&plan, 10, &[("a", 0)]);
        cache.finish(kind, &mut full);
        assert_eq!(carried(&full).len(), 3, "a full answer carries every partition");
        assert_eq!(cache.stats(false), (1, 3));
        assert_eq!((cache.opened(false), cache.opened(true)), (1, 0));

        // Epoch 1: a/0 moved on (sent), nothing else changed.
        let (kind, plan) = cache.begin(&request(id, 1, &[("a", 0, 10)], &[]), &me, 1).expect("incremental");
        assert_eq!(kind, Kind::Incremental { session_id: id });
        // a/0 returned records last time, so it moved to the end of the order.
        assert_eq!(keys(&plan), vec![("a".into(), 1, 0), ("b".into(), 0, 0), ("a".into(), 0, 10)]);
        let mut inc = answer(&plan, 10, &[]);
        cache.finish(kind, &mut inc);
        assert!(carried(&inc).is_empty(), "nothing changed: {inc:?}");

        // Epoch 2: b/0's high watermark moved; a/1 has records.
        let (kind, plan) = cache.begin(&request(id, 2, &[], &[]), &me, 2).expect("incremental");
        let mut inc = answer(&plan, 10, &[("a", 1)]);
        inc[1].partitions[0].high_watermark = 11;
        cache.finish(kind, &mut inc);
        assert_eq!(carried(&inc), vec![("a".into(), 1), ("b".into(), 0)]);

        // An error is carried, and carried again once it clears.
        let (kind, plan) = cache.begin(&request(id, 3, &[], &[]), &me, 3).expect("incremental");
        assert_eq!(keys(&plan)[0], ("b".into(), 0, 0), "a/1 went to the end");
        let mut inc = answer(&plan, 10, &[]);
        inc[0].partitions[0].error_code = ResponseError::NotLeaderOrFollower.code();
        cache.finish(kind, &mut inc);
        assert_eq!(carried(&inc), vec![("b".into(), 0)], "b/0 errs, the others are unchanged");
        let (kind, plan) = cache.begin(&request(id, 4, &[], &[]), &me, 4).expect("incremental");
        let mut inc = answer(&plan, 10, &[]);
        cache.finish(kind, &mut inc);
        assert_eq!(carried(&inc), vec![("b".into(), 0)], "b/0 healed");
    }

    #[test]
    fn forgotten_partitions_leave_and_new_ones_join() {
        let cache = FetchSessionCache::new(10);
        let me = owner("u", Some(2));
        let (kind, plan) = cache.begin(&request(0, 0, &[("a", 0, 0), ("a", 1, 0)], &[]), &me, 0).expect("full");
        cache.finish(kind, &mut answer(&plan, 0, &[]));
        let id = kind.session_id();
        let (kind, plan) = cache.begin(&request(id, 1, &[("c", 3, 7)], &[("a", 0)]), &me, 1).expect("incremental");
        assert_eq!(keys(&plan), vec![("a".into(), 1, 0), ("c".into(), 3, 7)]);
        let mut inc = answer(&plan, 0, &[]);
        cache.finish(kind, &mut inc);
        assert_eq!(carried(&inc), vec![("c".into(), 3)], "a joining partition is always carried once");
        assert_eq!(cache.stats(true), (1, 2));
    }

    #[test]
    fn wrong_epoch_unknown_id_and_other_owners_are_refused() {
        let cache = FetchSessionCache::new(10);
        let me = owner("alice", None);
        let (kind, _) = cache.begin(&request(0, 0, &[("a", 0, 0)], &[]), &me, 0).expect("full");
        let id = kind.session_id();
        let err = |r: Result<(Kind, Plan), ResponseError>| r.err();
        assert_eq!(err(cache.begin(&request(id, 2, &[], &[]), &me, 1)), Some(ResponseError::InvalidFetchSessionEpoch));
        assert_eq!(
            err(cache.begin(&request(id + 1, 1, &[], &[]), &me, 1)),
            Some(ResponseError::FetchSessionIdNotFound)
        );
        assert_eq!(
            err(cache.begin(&request(id, 1, &[], &[]), &owner("mallory", None), 1)),
            Some(ResponseError::FetchSessionIdNotFound)
        );
        // Nor can another principal close it.
        let (kind, _) = cache.begin(&request(id, -1, &[], &[]), &owner("mallory", None), 1).expect("sessionless");
        assert_eq!(kind, Kind::Sessionless);
        assert!(cache.begin(&request(id, 1, &[], &[]), &me, 1).is_ok(), "still open for its owner");
        // A request sent twice: the epoch was used up by the first.
        assert_eq!(err(cache.begin(&request(id, 1, &[], &[]), &me, 1)), Some(ResponseError::InvalidFetchSessionEpoch));
    }

    #[test]
    fn epoch_minus_one_closes_and_epoch_zero_replaces() {
        let cache = FetchSessionCache::new(10);
        let me = owner("u", None);
        let (kind, _) = cache.begin(&request(0, 0, &[("a", 0, 0)], &[]), &me, 0).expect("full");
        let first = kind.session_id();
        let (kind, _) = cache.begin(&request(first, 0, &[("a", 0, 0)], &[]), &me, 0).expect("full");
        assert_ne!(kind.session_id(), first);
        assert_eq!(cache.stats(false).0, 1, "the named session was replaced");
        let (kind, plan) = cache.begin(&request(kind.session_id(), -1, &[("b", 1, 4)], &[]), &me, 0).expect("close");
        assert_eq!((kind, keys(&plan)), (Kind::Sessionless, vec![("b".into(), 1, 4)]));
        assert_eq!(cache.stats(false), (0, 0));
    }

    #[test]
    fn a_full_cache_evicts_idle_sessions_and_consumers_for_followers() {
        let cache = FetchSessionCache::new(2);
        let consumer = owner("u", None);
        let full = |o: &Owner, now| cache.begin(&request(0, 0, &[("a", 0, 0)], &[]), o, now).expect("full").0;
        let c1 = full(&consumer, 0);
        let c2 = full(&consumer, 10);
        assert!(matches!(c1, Kind::Full { .. }) && matches!(c2, Kind::Full { .. }));
        assert_eq!(full(&consumer, 20), Kind::Sessionless, "full, nothing idle: no session");
        // A follower takes the least recently used consumer's slot.
        let f = full(&owner("broker", Some(3)), 30);
        assert!(matches!(f, Kind::Full { .. }));
        assert!(cache.begin(&request(c1.session_id(), 1, &[], &[]), &consumer, 31).is_err(), "c1 evicted");
        assert!(cache.begin(&request(c2.session_id(), 1, &[], &[]), &consumer, 31).is_ok());
        // Two minutes unused: any newcomer may take the slot.
        assert!(matches!(full(&consumer, 31 + EVICTION_MS), Kind::Full { .. }));
        assert_eq!((cache.stats(false).0, cache.stats(true).0), (1, 0), "both idle sessions went");
    }

    #[test]
    fn no_slots_means_no_sessions() {
        let cache = FetchSessionCache::new(0);
        let (kind, _) = cache.begin(&request(0, 0, &[("a", 0, 0)], &[]), &owner("u", None), 0).expect("begin");
        assert_eq!(kind, Kind::Sessionless);
    }
}
