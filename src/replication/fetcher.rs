//! Follower fetchers: one task per source broker (leader), fetching all the
//! partitions this broker follows from it in one Fetch request.
//!
//! After a leadership change a follower first asks the new leader where the
//! logs diverge (OffsetsForLeaderEpoch for its latest local epoch) and
//! truncates there; then it fetches from its log end offset with its replica
//! id, appends what comes back, and keeps its high watermark at
//! min(leader's, own log end). The leader long-polls, so an idle fetcher
//! costs one request per `replica.fetch.wait.max.ms`, and an incremental
//! fetch session (KIP-227) keeps that request and its answer small: only
//! partitions whose position moved, or with news, are in them.
//!
//! A replica far behind (one a reassignment adds, or one back from a long
//! absence) appends a large answer on a blocking thread while its next fetch
//! is already asking for what follows it ([`AppendAhead`]), so that the
//! leader's read and the network overlap this broker's write. It does so
//! only while what it reports is below the leader's high watermark: such a
//! report cannot let it into the ISR, nor count toward the high watermark.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic};
use kafka_protocol::messages::offset_for_leader_epoch_request::{OffsetForLeaderPartition, OffsetForLeaderTopic};
use kafka_protocol::messages::{BrokerId, FetchRequest, OffsetForLeaderEpochRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use strom_raft::Quorum;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::client::KafkaConnection;
use super::fetch_session::SessionHandler;
use super::partition::{DurableWait, Partition};
use super::ReplicaManager;
use crate::clock::mono_ms;
use crate::log::batch::whole_batches;

/// Pause after a failed request or an unreachable leader.
const RETRY_BACKOFF: Duration = Duration::from_millis(200);
/// How long a follower waits for its own flush before fetching again anyway.
/// After a failed or stuck fsync (logged as an error) the offset it reports
/// is its log end as written, not as synced, as without `flush.messages`.
const DURABLE_WAIT: Duration = Duration::from_secs(10);
const FETCH_VERSION: i16 = 12;
const EPOCH_VERSION: i16 = 3;

type Key = (String, i32);

/// Appends that wait for their fsync: (partition, durable end, leader epoch).
type Durable = Vec<(Arc<Partition>, i64, i32)>;

/// A fetch answer being appended on a blocking thread while the next fetch
/// is on its way.
struct AppendAhead {
    task: JoinHandle<Durable>,
    /// Where each partition's log ends once the append is made: where its
    /// next fetch starts.
    ends: HashMap<Key, i64>,
}

pub struct FetcherManager {
    broker_id: i32,
    replicas: Arc<ReplicaManager>,
    quorum: Arc<Quorum>,
    fetch_wait_ms: i32,
    /// Bytes per partition in one fetch (`replica.fetch.max.bytes`).
    partition_fetch_bytes: i32,
    /// Bytes per fetch response (`replica.fetch.response.max.bytes`).
    response_fetch_bytes: i32,
    /// Mutual TLS to the leaders (an SSL inter-broker listener).
    tls: Option<strom_raft::tls::NodeTls>,
}

struct FetcherHandle {
    partitions: watch::Sender<Vec<Key>>,
    task: JoinHandle<()>,
}

impl FetcherManager {
    /// `fetch_bytes`: (`replica.fetch.max.bytes`, `replica.fetch.response.max.bytes`).
    pub fn new(
        broker_id: i32,
        replicas: Arc<ReplicaManager>,
        quorum: Arc<Quorum>,
        fetch_wait_ms: i32,
        fetch_bytes: (i32, i32),
        tls: Option<strom_raft::tls::NodeTls>,
    ) -> Self {
        let (partition_fetch_bytes, response_fetch_bytes) = fetch_bytes;
        Self { broker_id, replicas, quorum, fetch_wait_ms, partition_fetch_bytes, response_fetch_bytes, tls }
    }

    /// Which partitions to fetch from which leader, by the applied image.
    fn assignments(&self) -> BTreeMap<i32, Vec<Key>> {
        let image = self.quorum.image();
        let mut out: BTreeMap<i32, Vec<Key>> = BTreeMap::new();
        for p in self.replicas.all() {
            if p.follower_position().is_none() {
                continue;
            }
            let leader = image.topics.get(&p.topic).and_then(|t| t.partitions.get(&p.index)).and_then(|r| r.leader);
            if let Some(l) = leader.filter(|l| *l != self.broker_id) {
                out.entry(l).or_default().push((p.topic.clone(), p.index));
            }
        }
        out
    }

    /// Keeps one fetcher per leader in step with the hosted replicas until `shutdown`.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut fetchers: HashMap<i32, FetcherHandle> = HashMap::new();
        let mut roles = self.replicas.subscribe();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            let wanted = self.assignments();
            for (leader, keys) in &wanted {
                match fetchers.get(leader) {
                    Some(f) => {
                        f.partitions.send_if_modified(|cur| {
                            let changed = cur != keys;
                            if changed {
                                cur.clone_from(keys);
                            }
                            changed
                        });
                    }
                    None => {
                        let (tx, rx) = watch::channel(keys.clone());
                        let task = tokio::spawn(self.clone().fetch_loop(*leader, rx, shutdown.clone()));
                        fetchers.insert(*leader, FetcherHandle { partitions: tx, task });
                    }
                }
            }
            fetchers.retain(|leader, f| {
                let keep = wanted.contains_key(leader);
                if !keep {
                    f.task.abort();
                }
                keep
            });
            tokio::select! {
                _ = roles.changed() => {}
                _ = tick.tick() => {}
                _ = shutdown.changed() => break,
            }
        }
        for f in fetchers.values() {
            f.task.abort();
        }
    }

    fn leader_addr(&self, leader: i32) -> Option<String> {
        self.quorum.image().brokers.get(&leader).map(|b| b.kafka.clone())
    }

    async fn fetch_loop(
        self: Arc<Self>,
        leader: i32,
        mut partitions: watch::Receiver<Vec<Key>>,
        shutdown: watch::Receiver<bool>,
    ) {
        let mut conn: Option<KafkaConnection> = None;
        let mut session = SessionHandler::default();
        let client_id = format!("strom-follower-{}", self.broker_id);
        // The partitions fetched, resolved again only when the assignment or
        // the hosted replicas change.
        let mut roles = self.replicas.subscribe();
        let mut parts: Vec<Arc<Partition>> = Vec::new();
        let mut resolved = false;
        let mut ahead: Option<AppendAhead> = None;
        while !*shutdown.borrow() {
            if !resolved || partitions.has_changed().unwrap_or(true) || roles.has_changed().unwrap_or(true) {
                roles.borrow_and_update();
                let keys = partitions.borrow_and_update();
                parts = keys.iter().filter_map(|(t, i)| self.replicas.get(t, *i)).collect();
                resolved = !keys.is_empty();
            }
            if !resolved {
                if partitions.changed().await.is_err() {
                    return;
                }
                continue;
            }
            if conn.is_none() {
                let Some(addr) = self.leader_addr(leader) else {
                    tokio::time::sleep(RETRY_BACKOFF).await;
                    continue;
                };
                let tls = self.tls.as_ref().map(strom_raft::tls::NodeTls::client);
                match KafkaConnection::connect(&addr, &client_id, tls.as_ref()).await {
                    Ok(c) => conn = Some(c),
                    Err(e) => {
                        tracing::debug!(leader, %addr, error = %e, "cannot reach the leader");
                        tokio::time::sleep(RETRY_BACKOFF).await;
                        continue;
                    }
                }
            }
            let Some(c) = conn.as_mut() else { continue };
            let result = match self.truncate(c, &parts, &mut ahead).await {
                Ok(()) => self.fetch_once(c, &parts, &mut session, &mut ahead).await,
                Err(e) => Err(e),
            };
            if let Err(e) = result {
                tracing::debug!(leader, error = %e, "follower fetch failed; reconnecting");
                conn = None;
                session.reset();
                tokio::time::sleep(RETRY_BACKOFF).await;
            }
        }
    }

    /// OffsetsForLeaderEpoch for every partition that has not truncated for its current epoch.
    async fn truncate(
        &self,
        conn: &mut KafkaConnection,
        parts: &[Arc<Partition>],
        ahead: &mut Option<AppendAhead>,
    ) -> Result<(), super::client::ClientError> {
        if ahead.is_some() && parts.iter().any(|p| p.follower_position().is_some_and(|pos| pos.needs_truncation)) {
            // The truncation point is found from the log as it will be.
            finish_ahead(ahead).await;
        }
        let mut topics: BTreeMap<String, Vec<OffsetForLeaderPartition>> = BTreeMap::new();
        let mut asked: HashMap<Key, &Arc<Partition>> = HashMap::new();
        for p in parts {
            let Some(pos) = p.follower_position().filter(|pos| pos.needs_truncation) else { continue };
            match pos.latest_local_epoch {
                // An empty log has nothing to diverge.
                None => {
                    let _ = p.truncate_for_epoch(pos.leader_epoch, pos.log_end_offset);
                }
                Some(epoch) => {
                    asked.insert((p.topic.clone(), p.index), p);
                    topics.entry(p.topic.clone()).or_default().push(
                        OffsetForLeaderPartition::default()
                            .with_partition(p.index)
                            .with_current_leader_epoch(pos.leader_epoch)
                            .with_leader_epoch(epoch),
                    )
                }
            }
        }
        if topics.is_empty() {
            return Ok(());
        }
        let request = OffsetForLeaderEpochRequest::default().with_replica_id(BrokerId(self.broker_id)).with_topics(
            topics
                .into_iter()
                .map(|(t, ps)| {
                    OffsetForLeaderTopic::default().with_topic(TopicName(StrBytes::from_string(t))).with_partitions(ps)
                })
                .collect(),
        );
        let response = conn.send(&request, EPOCH_VERSION, Duration::from_secs(5)).await?;
        // (partition, its leader epoch, the leader's answer: epoch and end offset)
        let mut answers: Vec<(Arc<Partition>, i32, i32, i64)> = Vec::new();
        for t in response.topics {
            for r in t.partitions {
                let key = (t.topic.0.to_string(), r.partition);
                let Some(p) = asked.get(&key) else { continue };
                // Removed (and perhaps added back) since the question.
                if !self.replicas.get(&key.0, key.1).is_some_and(|current| Arc::ptr_eq(&current, p)) {
                    continue;
                }
                let Some(pos) = p.follower_position() else { continue };
                if r.error_code != 0 {
                    tracing::debug!(topic = %p.topic, partition = p.index, code = r.error_code, "epoch lookup refused");
                    continue;
                }
                answers.push(((*p).clone(), pos.leader_epoch, r.leader_epoch, r.end_offset));
            }
        }
        if answers.is_empty() {
            return Ok(());
        }
        // Truncations cut and fsync files: on a blocking thread.
        let truncated = tokio::task::spawn_blocking(move || {
            for (p, leader_epoch, answer_epoch, answer_end) in answers {
                if let Err(e) = p.truncate_to_leader_answer(leader_epoch, answer_epoch, answer_end) {
                    tracing::warn!(topic = %p.topic, partition = p.index, error = %e, "truncation failed");
                }
            }
        })
        .await;
        if let Err(e) = truncated {
            if e.is_panic() {
                std::panic::resume_unwind(e.into_panic());
            }
        }
        Ok(())
    }

    async fn fetch_once(
        &self,
        conn: &mut KafkaConnection,
        parts: &[Arc<Partition>],
        session: &mut SessionHandler,
        ahead: &mut Option<AppendAhead>,
    ) -> Result<(), super::client::ClientError> {
        if !self.replicas.disk.has_room() {
            // Below `storage.min.free.bytes`: this replica falls behind (and
            // out of the ISR) rather than fill the disk.
            tokio::time::sleep(RETRY_BACKOFF).await;
            return Ok(());
        }
        let mut topics: BTreeMap<String, Vec<FetchPartition>> = BTreeMap::new();
        // The replica each partition's request was made for, its epoch and
        // the offset asked for.
        let mut asked: HashMap<Key, (Arc<Partition>, i32, i64)> = HashMap::new();
        // Partitions a reassignment adds here and that are not in sync yet
        // fetch within `follower.replication.throttled.rate`.
        let image = self.quorum.image();
        let throttle = &self.replicas.follower_throttle;
        let mut throttled: Vec<Key> = Vec::new();
        // Without a rate nothing is throttled: no partition's reassignment
        // state need be looked up (a leader may share thousands with us).
        let throttling = !throttle.is_unlimited();
        for p in parts {
            let Some(pos) = p.follower_position().filter(|pos| !pos.needs_truncation) else { continue };
            let catching_up = throttling
                && image
                    .topics
                    .get(&p.topic)
                    .and_then(|t| t.partitions.get(&p.index))
                    .is_some_and(|r| r.is_catching_up(self.broker_id));
            let mut max_bytes = self.partition_fetch_bytes;
            if catching_up {
                match throttle.allowance(mono_ms()) {
                    Some(0) => continue,
                    Some(allowed) => max_bytes = max_bytes.min(i32::try_from(allowed).unwrap_or(i32::MAX)),
                    None => {}
                }
                throttled.push((p.topic.clone(), p.index));
            }
            let key = (p.topic.clone(), p.index);
            let offset = ahead.as_ref().and_then(|a| a.ends.get(&key)).copied().unwrap_or(pos.log_end_offset);
            asked.insert(key, (p.clone(), pos.leader_epoch, offset));
            topics.entry(p.topic.clone()).or_default().push(
                FetchPartition::default()
                    .with_partition(p.index)
                    .with_current_leader_epoch(pos.leader_epoch)
                    .with_fetch_offset(offset)
                    .with_partition_max_bytes(max_bytes),
            );
        }
        if topics.is_empty() {
            finish_ahead(ahead).await;
            tokio::time::sleep(RETRY_BACKOFF).await;
            return Ok(());
        }
        let next = session.build(&topics);
        let name = |t: String| TopicName(StrBytes::from_string(t));
        let request = FetchRequest::default()
            .with_replica_id(BrokerId(self.broker_id))
            .with_max_wait_ms(self.fetch_wait_ms)
            .with_min_bytes(1)
            .with_max_bytes(self.response_fetch_bytes)
            .with_session_id(next.session_id)
            .with_session_epoch(next.epoch)
            .with_topics(
                next.send
                    .into_iter()
                    .map(|(t, ps)| FetchTopic::default().with_topic(name(t)).with_partitions(ps))
                    .collect(),
            )
            .with_forgotten_topics_data(
                next.forget
                    .into_iter()
                    .map(|(t, ps)| ForgottenTopic::default().with_topic(name(t)).with_partitions(ps))
                    .collect(),
            );
        let timeout = Duration::from_millis(self.fetch_wait_ms.max(0) as u64) + Duration::from_secs(5);
        let sent = conn.send(&request, FETCH_VERSION, timeout).await;
        // The answer before this one is appended before this one is looked at.
        let mut retry_soon = finish_ahead(ahead).await;
        let response = sent?;
        session.answered(response.error_code, response.session_id);
        if response.error_code != 0 {
            // The session is gone or out of step: the next request is full.
            tracing::debug!(code = response.error_code, "fetch session refused; starting a new one");
            return Ok(());
        }
        // What each answered partition's log does with its answer, made on
        // a blocking thread when it touches the disk.
        let mut steps: Vec<(Arc<Partition>, i32, FollowerStep)> = Vec::new();
        for t in response.responses {
            for r in t.partitions {
                let key = (t.topic.0.to_string(), r.partition_index);
                let Some((p, epoch, fetch_offset)) = asked.get(&key) else { continue };
                // Removed while the request waited, and perhaps added back
                // with a new, empty log: the answer is for the old one.
                if !self.replicas.get(&key.0, key.1).is_some_and(|current| Arc::ptr_eq(&current, p)) {
                    continue;
                }
                let step = match ResponseError::try_from_code(r.error_code) {
                    None => {
                        let mut records = r.records.unwrap_or_default();
                        let (whole, end) = whole_batches(&records);
                        records.truncate(whole);
                        if throttled.contains(&key) {
                            throttle.record(records.len(), mono_ms());
                        }
                        FollowerStep::Append {
                            fetch_offset: *fetch_offset,
                            records,
                            end,
                            high_watermark: r.high_watermark,
                            log_start: r.log_start_offset,
                        }
                    }
                    Some(ResponseError::OffsetOutOfRange) => {
                        FollowerStep::OutOfRange { high_watermark: r.high_watermark, log_start: r.log_start_offset }
                    }
                    Some(e) => {
                        tracing::debug!(topic = %key.0, partition = key.1, error = ?e, "follower fetch refused");
                        retry_soon = true;
                        continue;
                    }
                };
                steps.push((p.clone(), *epoch, step));
            }
        }
        // Large appends that end below the leader's high watermark are made
        // while the next fetch goes out (see the module's doc).
        let (later, mut steps): (Vec<_>, Vec<_>) = steps.into_iter().partition(|(_, _, step)| step.can_append_ahead());
        let later_bytes: usize = later.iter().map(|(_, _, step)| step.append_bytes()).sum();
        if later_bytes >= super::APPEND_OFF_THREAD_BYTES {
            let ends: HashMap<Key, i64> =
                later.iter().filter_map(|(p, _, step)| Some(((p.topic.clone(), p.index), step.end()?))).collect();
            tracing::trace!(ends = ?ends, bytes = later_bytes, "appending ahead of the next fetch");
            *ahead = Some(AppendAhead { task: tokio::task::spawn_blocking(move || apply_steps(later)), ends });
        } else {
            steps.extend(later);
        }
        // Appends that reached `flush.messages`: fetched again only once
        // fsynced, so the offset the next fetch reports is durable. Their
        // flushes run meanwhile, one per partition. Truncations and large
        // appends are made on a blocking thread (see APPEND_OFF_THREAD_BYTES).
        let bytes: usize = steps.iter().map(|(_, _, step)| step.append_bytes()).sum();
        let truncates = steps.iter().any(|(_, _, step)| matches!(step, FollowerStep::OutOfRange { .. }));
        let durable = if truncates || bytes >= super::APPEND_OFF_THREAD_BYTES {
            match tokio::task::spawn_blocking(move || apply_steps(steps)).await {
                Ok(durable) => durable,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => return Ok(()), // the runtime is shutting down
            }
        } else {
            apply_steps(steps)
        };
        retry_soon |= wait_durable(durable).await;
        if retry_soon {
            tokio::time::sleep(RETRY_BACKOFF).await;
        }
        Ok(())
    }
}

/// Waits for the appends that wait for their fsync; whether any did not
/// complete (then the next fetch waits a little).
async fn wait_durable(durable: Durable) -> bool {
    let mut incomplete = false;
    for (p, end, epoch) in durable {
        let outcome = p.wait_durable(end, epoch, DURABLE_WAIT).await;
        if outcome != DurableWait::Durable {
            tracing::debug!(topic = %p.topic, partition = p.index, ?outcome, "follower flush did not complete");
            incomplete = true;
        }
    }
    incomplete
}

/// Waits for the append made ahead, if any, and for its fsyncs; whether any
/// did not complete.
async fn finish_ahead(ahead: &mut Option<AppendAhead>) -> bool {
    let Some(a) = ahead.take() else { return false };
    match a.task.await {
        Ok(durable) => wait_durable(durable).await,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => false, // the runtime is shutting down
    }
}

/// What a follower's log does with its part of a Fetch answer.
enum FollowerStep {
    Append {
        /// The offset the fetch asked for: where the log must end for the
        /// records to follow on.
        fetch_offset: i64,
        records: bytes::Bytes,
        /// Where the log ends once `records` are appended.
        end: Option<i64>,
        high_watermark: i64,
        log_start: i64,
    },
    /// The fetch offset is outside the leader's log.
    OutOfRange { high_watermark: i64, log_start: i64 },
}

impl FollowerStep {
    fn append_bytes(&self) -> usize {
        match self {
            Self::Append { records, .. } => records.len(),
            Self::OutOfRange { .. } => 0,
        }
    }

    /// Where the log ends once these records are appended.
    fn end(&self) -> Option<i64> {
        match self {
            Self::Append { end, .. } => *end,
            Self::OutOfRange { .. } => None,
        }
    }

    /// Whether the next fetch may ask for what follows these records before
    /// they are appended: only while that offset is below the leader's high
    /// watermark. A replica in the ISR (or joining it) reported an offset at
    /// or past the high watermark, so this holds only for one outside it,
    /// and its report stays too low to let it in (the join takes the high
    /// watermark, which only grows within the leader's epoch).
    fn can_append_ahead(&self) -> bool {
        match self {
            Self::Append { end, high_watermark, .. } => end.is_some_and(|end| end < *high_watermark),
            Self::OutOfRange { .. } => false,
        }
    }
}

/// Applies each partition's step (appends, truncations). Returns the
/// appends that wait for their fsync.
fn apply_steps(steps: Vec<(Arc<Partition>, i32, FollowerStep)>) -> Durable {
    let mut durable = Vec::new();
    for (p, epoch, step) in steps {
        let outcome = match step {
            FollowerStep::Append { fetch_offset, records, high_watermark, log_start, .. } => {
                p.append_as_follower(epoch, fetch_offset, &records, high_watermark, log_start).map(|end| {
                    if let Some(end) = end {
                        durable.push((p.clone(), end, epoch));
                    }
                })
            }
            FollowerStep::OutOfRange { high_watermark, log_start } => match p.follower_position() {
                Some(pos) if pos.log_end_offset < log_start => p.reset_to(epoch, log_start),
                Some(_) => p.truncate_for_epoch(epoch, high_watermark),
                None => Ok(()),
            },
        };
        if let Err(e) = outcome {
            tracing::debug!(topic = %p.topic, partition = p.index, error = %e, "follower append skipped");
        }
    }
    durable
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::batch::set_base_offset;
    use crate::log::batch::test_batches::build_batch;

    fn append(first: i64, batches: &[i32], high_watermark: i64) -> FollowerStep {
        let mut records = Vec::new();
        let mut base = first;
        for &count in batches {
            let mut batch = build_batch(count, 1_000, b"r");
            set_base_offset(&mut batch, base);
            base += i64::from(count);
            records.extend_from_slice(&batch);
        }
        let end = whole_batches(&records).1;
        FollowerStep::Append { fetch_offset: first, records: records.into(), end, high_watermark, log_start: 0 }
    }

    #[test]
    fn an_answer_is_appended_ahead_only_when_it_ends_below_the_leaders_high_watermark() {
        let step = append(10, &[3, 4], 100);
        assert_eq!(step.end(), Some(17), "the last batch's last offset, plus one");
        assert!(step.can_append_ahead());
        // Up to the high watermark: the next fetch's report could let the
        // replica into the ISR, so it must hold what it reports.
        assert!(!append(10, &[3, 4], 17).can_append_ahead());
        assert!(!append(10, &[3, 4], 12).can_append_ahead());
        // Nothing to append, or a truncation, is never made ahead.
        assert_eq!(append(10, &[], 100).end(), None);
        assert!(!append(10, &[], 100).can_append_ahead());
        assert!(!FollowerStep::OutOfRange { high_watermark: 100, log_start: 0 }.can_append_ahead());
    }
}
