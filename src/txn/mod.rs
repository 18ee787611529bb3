//! The transaction coordinator (KIP-98). Transactional ids are spread over
//! the partitions of `__transaction_state` by a hash of the id (Kafka's, so
//! an id lands where it would in Kafka); the broker leading a partition
//! coordinates its ids, as the group coordinator does with groups. Every
//! change of a transaction is written to that partition as a record and
//! applied once the high watermark passes it. When this broker becomes the
//! leader of such a partition it reads it back (requests meanwhile get
//! COORDINATOR_LOAD_IN_PROGRESS) and finishes the transactions it finds
//! between their Prepare and Complete states.
//!
//! Ending a transaction: PrepareCommit (or PrepareAbort) is stored, the
//! client is answered, and the markers are written to every partition of
//! the transaction by its leader (locally, or with WriteTxnMarkers to the
//! leading broker), retried until they are in; then CompleteCommit (or
//! CompleteAbort) is stored. A transaction open longer than its timeout is
//! aborted at a bumped producer epoch, which fences its producer. While a
//! write or the markers of an id are in flight, its other requests get
//! CONCURRENT_TRANSACTIONS (retriable).
//!
//! The state machine of one id is pure and lives in [`state`]; this module
//! holds the ids, writes, loads, sends markers and runs the timeout timer.

pub mod records;
pub mod state;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::{Buf, Bytes};
use kafka_protocol::messages::write_txn_markers_request::{WritableTxnMarker, WritableTxnMarkerTopic};
use kafka_protocol::messages::{ProducerId, TopicName, WriteTxnMarkersRequest};
use kafka_protocol::records::{Record, RecordBatchDecoder};
use kafka_protocol::ResponseError;
use tokio::sync::watch;

use crate::clock::wall_ms;
use crate::config::Settings;
use crate::group::{GroupCoordinator, OFFSETS_TOPIC};
use crate::log::compaction::{encode_batch, plain_record};
use crate::log::txn::EndTxnMarker;
use crate::replication::client::{ClientError, KafkaConnection};
use crate::replication::partition::{CommitWait, PartitionError};
use crate::replication::ReplicaManager;
pub use state::{TopicPartition, TxnMeta, TxnState};
use strom_raft::Quorum;

pub const TRANSACTION_TOPIC: &str = "__transaction_state";

/// Bytes read per step while loading a partition.
const LOAD_CHUNK: usize = 1 << 20;
/// How long a write waits for the in-sync replicas.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one round of markers to a leader may take.
const MARKER_TIMEOUT: Duration = Duration::from_secs(30);
/// The pause between rounds of markers that did not all get in.
const MARKER_RETRY: Duration = Duration::from_millis(200);
/// How long a request waits for an id's write or markers in flight before
/// it is answered CONCURRENT_TRANSACTIONS (which clients retry after a
/// backoff): a producer's next transaction usually begins while the last
/// one's markers are being written.
const BUSY_WAIT: Duration = Duration::from_secs(2);
/// Connections to another broker kept for the next verification or
/// markers (one per request in flight to it, up to this many).
const KEPT_CONNECTIONS: usize = 8;

/// One transactional id: its stored metadata (`None` until the first write
/// commits) and whether a write or markers are in flight.
#[derive(Debug, Default)]
struct Entry {
    meta: Option<TxnMeta>,
    busy: bool,
}

/// The transactional ids of one `__transaction_state` partition led here.
#[derive(Debug)]
struct Shard {
    leader_epoch: i32,
    loaded: bool,
    txns: HashMap<String, Entry>,
}

/// Records appended to a partition of `__transaction_state`, not yet
/// known to be committed.
#[derive(Debug, Clone, Copy)]
struct Appended {
    partition: i32,
    last_offset: i64,
    leader_epoch: i32,
}

/// A transaction as DescribeTransactions and ListTransactions show it.
pub type TxnListing = TxnMeta;

pub struct TransactionCoordinator {
    settings: Arc<Settings>,
    replicas: Arc<ReplicaManager>,
    quorum: Arc<Quorum>,
    /// Mutual TLS for WriteTxnMarkers to other brokers (an SSL inter-broker listener).
    tls: Option<strom_raft::tls::NodeTls>,
    broker_id: i32,
    /// Told when a marker reaches a `__consumer_offsets` partition led here.
    groups: Arc<GroupCoordinator>,
    shards: Mutex<HashMap<i32, Shard>>,
    /// Woken whenever an id stops being busy (or a shard goes).
    idle: tokio::sync::Notify,
    /// Idle connections to other brokers, by address.
    connections: Mutex<HashMap<String, Vec<KafkaConnection>>>,
}

fn write_error(e: &PartitionError) -> ResponseError {
    // As for group writes: clients look the coordinator up again.
    match e {
        PartitionError::NotLeader | PartitionError::FencedLeaderEpoch { .. } => ResponseError::NotCoordinator,
        PartitionError::NotEnoughReplicas { .. } => ResponseError::CoordinatorNotAvailable,
        _ => ResponseError::UnknownServerError,
    }
}

impl TransactionCoordinator {
    pub fn new(
        broker_id: i32,
        settings: Arc<Settings>,
        replicas: Arc<ReplicaManager>,
        quorum: Arc<Quorum>,
        tls: Option<strom_raft::tls::NodeTls>,
        groups: Arc<GroupCoordinator>,
    ) -> Self {
        Self {
            settings,
            replicas,
            quorum,
            tls,
            broker_id,
            groups,
            shards: Mutex::new(HashMap::new()),
            idle: tokio::sync::Notify::new(),
            connections: Mutex::new(HashMap::new()),
        }
    }

    fn shards(&self) -> MutexGuard<'_, HashMap<i32, Shard>> {
        self.shards.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many partitions `__transaction_state` has (or will have).
    pub fn partition_count(&self, image: &strom_raft::MetadataImage) -> i32 {
        image.topics.get(TRANSACTION_TOPIC).map_or_else(
            || self.settings.int("transaction.state.log.num.partitions").unwrap_or(50) as i32,
            |t| t.partitions.len() as i32,
        )
    }

    /// The partition coordinating `transactional_id`.
    pub fn partition_of(&self, image: &strom_raft::MetadataImage, transactional_id: &str) -> i32 {
        crate::group::partition_for(transactional_id, self.partition_count(image))
    }

    /// Runs `f` on the id's entry (created empty if missing) in a loaded
    /// shard this broker leads.
    fn with_entry<R>(
        &self,
        partition: i32,
        id: &str,
        f: impl FnOnce(&mut Entry, i32) -> Result<R, ResponseError>,
    ) -> Result<R, ResponseError> {
        let mut shards = self.shards();
        let shard = shards.get_mut(&partition).ok_or(ResponseError::NotCoordinator)?;
        if !shard.loaded {
            return Err(ResponseError::CoordinatorLoadInProgress);
        }
        let epoch = shard.leader_epoch;
        let entry = shard.txns.entry(id.to_string()).or_default();
        let result = f(entry, epoch);
        if entry.meta.is_none() && !entry.busy {
            shard.txns.remove(id);
        }
        result
    }

    /// Runs `attempt` (a step on an id) again each time an id stops being
    /// busy while it answers CONCURRENT_TRANSACTIONS, for up to [`BUSY_WAIT`].
    async fn when_idle<R>(&self, mut attempt: impl FnMut() -> Result<R, ResponseError>) -> Result<R, ResponseError> {
        let deadline = tokio::time::Instant::now() + BUSY_WAIT;
        loop {
            // Registered before the attempt, so a change in between still wakes it.
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            match attempt() {
                Err(ResponseError::ConcurrentTransactions) if tokio::time::Instant::now() < deadline => {
                    if tokio::time::timeout_at(deadline, idle).await.is_err() {
                        return Err(ResponseError::ConcurrentTransactions);
                    }
                }
                other => return other,
            }
        }
    }

    /// The stored metadata of `id`, if this broker coordinates it.
    pub fn describe(&self, partition: i32, id: &str) -> Result<Option<TxnMeta>, ResponseError> {
        let shards = self.shards();
        let shard = shards.get(&partition).ok_or(ResponseError::NotCoordinator)?;
        if !shard.loaded {
            return Err(ResponseError::CoordinatorLoadInProgress);
        }
        Ok(shard.txns.get(id).and_then(|e| e.meta.clone()))
    }

    /// Every transaction this broker coordinates; an error while any
    /// partition is loading.
    pub fn list(&self) -> Result<Vec<TxnListing>, ResponseError> {
        let shards = self.shards();
        if shards.values().any(|s| !s.loaded) {
            return Err(ResponseError::CoordinatorLoadInProgress);
        }
        let mut out: Vec<TxnListing> =
            shards.values().flat_map(|s| s.txns.values()).filter_map(|e| e.meta.clone()).collect();
        out.sort_by(|a, b| a.transactional_id.cmp(&b.transactional_id));
        Ok(out)
    }

    /// KIP-890 verification of `partitions` for a producer's first
    /// transactional batches there (see [`state::verify`]): one answer each.
    pub fn verify(
        &self,
        partition: i32,
        id: &str,
        producer_id: i64,
        producer_epoch: i16,
        partitions: &[TopicPartition],
    ) -> Result<Vec<Option<ResponseError>>, ResponseError> {
        let meta = self.describe(partition, id)?;
        Ok(partitions.iter().map(|tp| state::verify(meta.as_ref(), producer_id, producer_epoch, tp).err()).collect())
    }

    /// [`Self::verify`] asked of the coordinator at `addr` (another broker),
    /// with AddPartitionsToTxn v4 `verify_only`, as Kafka's leaders ask.
    pub async fn verify_remote(
        &self,
        addr: &str,
        id: &str,
        producer_id: i64,
        producer_epoch: i16,
        partitions: &[TopicPartition],
    ) -> Vec<Option<ResponseError>> {
        use kafka_protocol::messages::add_partitions_to_txn_request::{
            AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction,
        };
        let mut topics: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
        for (t, p) in partitions {
            topics.entry(t.as_str()).or_default().push(*p);
        }
        let str_bytes = |s: &str| kafka_protocol::protocol::StrBytes::from_string(s.to_string());
        let request = kafka_protocol::messages::AddPartitionsToTxnRequest::default().with_transactions(vec![
            AddPartitionsToTxnTransaction::default()
                .with_transactional_id(kafka_protocol::messages::TransactionalId(str_bytes(id)))
                .with_producer_id(ProducerId(producer_id))
                .with_producer_epoch(producer_epoch)
                .with_verify_only(true)
                .with_topics(
                    topics
                        .into_iter()
                        .map(|(t, ps)| {
                            AddPartitionsToTxnTopic::default().with_name(TopicName(str_bytes(t))).with_partitions(ps)
                        })
                        .collect(),
                ),
        ]);
        let response = match self.send_to_broker(addr, "verify", &request, 4, WRITE_TIMEOUT).await {
            Ok(r) => r,
            Err(e) => return partitions.iter().map(|_| Some(e)).collect(),
        };
        if let Some(e) = ResponseError::try_from_code(response.error_code) {
            return partitions.iter().map(|_| Some(e)).collect();
        }
        let codes = response.results_by_transaction.iter().flat_map(|r| r.topic_results.iter()).flat_map(|t| {
            t.results_by_partition
                .iter()
                .map(move |p| ((t.name.0.to_string(), p.partition_index), p.partition_error_code))
        });
        answers_by_partition(partitions, codes.collect())
    }

    /// Sends `request` to the broker at `addr` (mutual TLS on an SSL
    /// inter-broker listener), over a connection kept from an earlier
    /// request when there is one; a failure to reach it is
    /// NETWORK_EXCEPTION. A kept connection the other end has closed
    /// meanwhile is replaced by a new one once (both requests are safe to
    /// repeat: a verification reads, and a marker already in is answered
    /// as written).
    async fn send_to_broker<R: kafka_protocol::protocol::Request>(
        &self,
        addr: &str,
        purpose: &str,
        request: &R,
        version: i16,
        timeout: Duration,
    ) -> Result<R::Response, ResponseError> {
        let kept = self.connections.lock().unwrap_or_else(|e| e.into_inner()).get_mut(addr).and_then(Vec::pop);
        let answer = match kept {
            Some(mut conn) => match conn.send(request, version, timeout).await {
                Ok(response) => Ok((conn, response)),
                Err(ClientError::Io(_)) => self.send_on_new_connection(addr, request, version, timeout).await,
                Err(e) => Err(e),
            },
            None => self.send_on_new_connection(addr, request, version, timeout).await,
        };
        match answer {
            Ok((conn, response)) => {
                let mut kept = self.connections.lock().unwrap_or_else(|e| e.into_inner());
                let conns = kept.entry(addr.to_string()).or_default();
                if conns.len() < KEPT_CONNECTIONS {
                    conns.push(conn);
                }
                Ok(response)
            }
            Err(e) => {
                tracing::debug!(addr, purpose, error = %e, "a request to another broker failed; retried");
                Err(ResponseError::NetworkException)
            }
        }
    }

    async fn send_on_new_connection<R: kafka_protocol::protocol::Request>(
        &self,
        addr: &str,
        request: &R,
        version: i16,
        timeout: Duration,
    ) -> Result<(KafkaConnection, R::Response), ClientError> {
        let tls = self.tls.as_ref().map(strom_raft::tls::NodeTls::client);
        let client_id = format!("strom-txn-{}", self.broker_id);
        let mut conn = KafkaConnection::connect(addr, &client_id, tls.as_ref()).await?;
        let response = conn.send(request, version, timeout).await?;
        Ok((conn, response))
    }

    /// Whether InitProducerId for `id` needs a fresh producer id.
    pub fn needs_producer_id(&self, partition: i32, id: &str) -> Result<bool, ResponseError> {
        Ok(state::needs_producer_id(self.describe(partition, id)?.as_ref()))
    }

    /// InitProducerId with a transactional id: the producer id and epoch
    /// to use. A transaction the id's last producer left open is aborted
    /// first (its producer fenced), and the client is told to retry.
    pub async fn init_producer_id(
        self: &Arc<Self>,
        partition: i32,
        id: &str,
        timeout_ms: i32,
        new_producer_id: Option<i64>,
        current: Option<(i64, i16)>,
    ) -> Result<(i64, i16), ResponseError> {
        // At most once: abort what the last producer left open, then begin.
        let mut fenced = false;
        loop {
            let step = self
                .when_idle(|| {
                    let now = wall_ms();
                    self.with_entry(partition, id, |entry, epoch| {
                        if entry.busy {
                            return Err(ResponseError::ConcurrentTransactions);
                        }
                        let step = state::init(id, entry.meta.as_ref(), new_producer_id, current, timeout_ms, now)?;
                        if fenced && matches!(step, state::Init::FenceAndAbort(_)) {
                            return Err(ResponseError::ConcurrentTransactions);
                        }
                        let next = match &step {
                            state::Init::Write(m) | state::Init::FenceAndAbort(m) => m,
                        };
                        let appended = self.append(partition, id, next)?;
                        entry.busy = true;
                        Ok((step, appended, epoch))
                    })
                })
                .await?;
            match step {
                (state::Init::Write(next), appended, _) => {
                    let answer = (next.producer_id, next.producer_epoch);
                    self.finish_write(partition, id, next, appended, false).await?;
                    tracing::info!(
                        transactional_id = id,
                        producer_id = answer.0,
                        producer_epoch = answer.1,
                        "initialized a transactional producer"
                    );
                    return Ok(answer);
                }
                (state::Init::FenceAndAbort(prepared), appended, epoch) => {
                    tracing::info!(
                        transactional_id = id,
                        producer_id = prepared.producer_id,
                        "a new producer for the id: aborting the transaction the last one left open"
                    );
                    self.clone().spawn_end(partition, epoch, prepared, Some(appended));
                    fenced = true;
                }
            }
        }
    }

    /// AddPartitionsToTxn and AddOffsetsToTxn: `partitions` join the
    /// producer's transaction (beginning it if none is open).
    pub async fn add_partitions(
        self: &Arc<Self>,
        partition: i32,
        id: &str,
        producer_id: i64,
        producer_epoch: i16,
        partitions: &[TopicPartition],
    ) -> Result<(), ResponseError> {
        let planned = self
            .when_idle(|| {
                let now = wall_ms();
                self.with_entry(partition, id, |entry, _| {
                    if entry.busy {
                        return Err(ResponseError::ConcurrentTransactions);
                    }
                    let next =
                        state::add_partitions(entry.meta.as_ref(), producer_id, producer_epoch, partitions, now)?;
                    let Some(next) = next else { return Ok(None) };
                    let appended = self.append(partition, id, &next)?;
                    entry.busy = true;
                    Ok(Some((next, appended)))
                })
            })
            .await?;
        match planned {
            Some((next, appended)) => self.finish_write(partition, id, next, appended, false).await,
            None => Ok(()),
        }
    }

    /// EndTxn: answered once the Prepare state is stored; the markers and
    /// the Complete state follow in the background.
    pub async fn end_txn(
        self: &Arc<Self>,
        partition: i32,
        id: &str,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
    ) -> Result<(), ResponseError> {
        let planned = self
            .when_idle(|| {
                let now = wall_ms();
                self.with_entry(partition, id, |entry, epoch| {
                    if entry.busy {
                        return Err(ResponseError::ConcurrentTransactions);
                    }
                    let prepared = state::end(entry.meta.as_ref(), producer_id, producer_epoch, commit, now)?;
                    let Some(prepared) = prepared else { return Ok(None) };
                    let appended = self.append(partition, id, &prepared)?;
                    entry.busy = true;
                    Ok(Some((prepared, appended, epoch)))
                })
            })
            .await?;
        let Some((prepared, appended, epoch)) = planned else { return Ok(()) };
        self.finish_write(partition, id, prepared.clone(), appended, true).await?;
        self.clone().spawn_end(partition, epoch, prepared, None);
        Ok(())
    }

    /// Appends `meta` for `id` to its partition as leader, without waiting.
    /// Called with the shards lock held, so an id's records reach the log
    /// in the order they were decided.
    fn append(&self, partition: i32, id: &str, meta: &TxnMeta) -> Result<Appended, ResponseError> {
        self.append_value(partition, id, Some(records::encode_value(meta)))
    }

    /// Appends `id`'s record (a tombstone when `value` is `None`).
    fn append_value(&self, partition: i32, id: &str, value: Option<Bytes>) -> Result<Appended, ResponseError> {
        let p = self.replicas.get(TRANSACTION_TOPIC, partition).ok_or(ResponseError::NotCoordinator)?;
        let record = plain_record(0, Some(records::encode_key(id)), value, wall_ms());
        let batch = encode_batch(vec![record]).ok_or(ResponseError::UnknownServerError)?;
        let appended = p.append_as_leader(&batch, true).map_err(|e| write_error(&e))?;
        Ok(Appended { partition, last_offset: appended.last_offset, leader_epoch: appended.leader_epoch })
    }

    /// Waits for an append to commit, then applies `next` (staying busy
    /// with `keep_busy`: markers follow). On failure the id is no longer
    /// busy and keeps its stored metadata.
    async fn finish_write(
        &self,
        partition: i32,
        id: &str,
        next: TxnMeta,
        appended: Appended,
        keep_busy: bool,
    ) -> Result<(), ResponseError> {
        let written = self.await_commit(appended).await;
        let mut shards = self.shards();
        let Some(shard) = shards.get_mut(&partition).filter(|s| s.leader_epoch == appended.leader_epoch) else {
            return Err(ResponseError::NotCoordinator);
        };
        let entry = shard.txns.entry(id.to_string()).or_default();
        let result = match written {
            Ok(()) => {
                entry.meta = Some(next);
                entry.busy = keep_busy;
                Ok(())
            }
            Err(e) => {
                entry.busy = false;
                if entry.meta.is_none() {
                    shard.txns.remove(id);
                }
                tracing::warn!(transactional_id = id, error = ?e, "storing transaction state failed");
                Err(e)
            }
        };
        drop(shards);
        self.idle.notify_waiters();
        result
    }

    async fn await_commit(&self, appended: Appended) -> Result<(), ResponseError> {
        let p = self.replicas.get(TRANSACTION_TOPIC, appended.partition).ok_or(ResponseError::NotCoordinator)?;
        match p.wait_for_commit(appended.last_offset, appended.leader_epoch, WRITE_TIMEOUT).await {
            CommitWait::Committed => Ok(()),
            CommitWait::TimedOut => Err(ResponseError::CoordinatorNotAvailable),
            CommitWait::NotLeader => Err(ResponseError::NotCoordinator),
        }
    }

    /// Finishes a transaction in the background: waits for its Prepare
    /// state (when `appended` is given, else it is stored already), writes
    /// its markers, stores its Complete state. Stops when this broker no
    /// longer coordinates the id at `coordinator_epoch`: the next
    /// coordinator finishes it from the stored Prepare state.
    fn spawn_end(
        self: Arc<Self>,
        partition: i32,
        coordinator_epoch: i32,
        prepared: TxnMeta,
        appended: Option<Appended>,
    ) {
        tokio::spawn(async move {
            let id = prepared.transactional_id.clone();
            if let Some(appended) = appended {
                if self.finish_write(partition, &id, prepared.clone(), appended, true).await.is_err() {
                    return;
                }
            }
            if !self.write_markers(partition, coordinator_epoch, &prepared).await {
                // Not the coordinator any more (the shard is gone), or fenced
                // by a newer epoch: the timeout check tries again later.
                self.release(partition, &id);
                return;
            }
            let completed = state::complete(&prepared, wall_ms());
            let appended = self.with_entry(partition, &id, |entry, epoch| {
                if epoch != coordinator_epoch || entry.meta.as_ref() != Some(&prepared) {
                    return Err(ResponseError::NotCoordinator);
                }
                self.append(partition, &id, &completed)
            });
            let stored = match appended {
                Ok(appended) => self.finish_write(partition, &id, completed, appended, false).await,
                Err(e) => Err(e),
            };
            match stored {
                Ok(()) => tracing::debug!(transactional_id = %id, state = prepared.state.name(), "transaction ended"),
                Err(e) => {
                    // The markers are in; a new coordinator (or this one after
                    // a reload) writes them again harmlessly and completes it.
                    tracing::warn!(transactional_id = %id, error = ?e, "storing a completed transaction failed");
                    self.release(partition, &id);
                }
            }
        });
    }

    /// `id` is no longer busy (what it was busy with gave up).
    fn release(&self, partition: i32, id: &str) {
        let _ = self.with_entry(partition, id, |entry, _| {
            entry.busy = false;
            Ok(())
        });
        self.idle.notify_waiters();
    }

    /// Whether this broker still coordinates `partition` at `epoch`.
    fn coordinates(&self, partition: i32, epoch: i32) -> bool {
        self.shards().get(&partition).is_some_and(|s| s.leader_epoch == epoch)
    }

    /// Writes the markers of a Prepare state to every partition of the
    /// transaction, retrying until each is in; false when it stopped
    /// because this broker no longer coordinates the id, or a newer
    /// coordinator or producer epoch already wrote markers there.
    async fn write_markers(&self, partition: i32, coordinator_epoch: i32, prepared: &TxnMeta) -> bool {
        let marker = EndTxnMarker { commit: prepared.state == TxnState::PrepareCommit, coordinator_epoch };
        let mut left: Vec<TopicPartition> = prepared.partitions.iter().cloned().collect();
        while !left.is_empty() {
            if !self.coordinates(partition, coordinator_epoch) {
                return false;
            }
            let image = self.quorum.image();
            let mut by_leader: BTreeMap<i32, Vec<TopicPartition>> = BTreeMap::new();
            let mut next_round = Vec::new();
            for tp in left {
                match image.topics.get(&tp.0) {
                    // The topic is gone: nothing to mark.
                    None => {}
                    Some(t) => match t.partitions.get(&tp.1).and_then(|p| p.leader) {
                        Some(leader) => by_leader.entry(leader).or_default().push(tp),
                        None => next_round.push(tp),
                    },
                }
            }
            let addrs: HashMap<i32, String> =
                by_leader.keys().filter_map(|b| Some((*b, image.brokers.get(b)?.kafka.clone()))).collect();
            drop(image);
            // Every leader at once, so a transaction ends in one round trip
            // to the slowest rather than the sum of them.
            let rounds = by_leader.into_iter().map(|(leader, partitions)| {
                let addr = addrs.get(&leader);
                async move {
                    let results = if leader == self.broker_id {
                        self.write_local_markers(prepared, marker, &partitions).await
                    } else {
                        match addr {
                            Some(addr) => self.write_remote_markers(addr, prepared, marker, &partitions).await,
                            None => partitions.iter().map(|_| Some(ResponseError::NotLeaderOrFollower)).collect(),
                        }
                    };
                    partitions.into_iter().zip(results).collect::<Vec<_>>()
                }
            });
            for (tp, result) in futures_util::future::join_all(rounds).await.into_iter().flatten() {
                match result {
                    None | Some(ResponseError::UnknownTopicOrPartition) => {}
                    Some(e @ (ResponseError::InvalidProducerEpoch | ResponseError::TransactionCoordinatorFenced)) => {
                        tracing::warn!(transactional_id = %prepared.transactional_id, topic = %tp.0,
                            partition = tp.1, error = ?e, "a newer producer or coordinator wrote markers; stopping");
                        return false;
                    }
                    Some(e) => {
                        tracing::debug!(transactional_id = %prepared.transactional_id, topic = %tp.0,
                            partition = tp.1, error = ?e, "transaction marker not written yet; retrying");
                        next_round.push(tp);
                    }
                }
            }
            left = next_round;
            if !left.is_empty() {
                tokio::time::sleep(MARKER_RETRY).await;
            }
        }
        true
    }

    /// Markers written as the leader of `partitions`: each one's error, if any.
    async fn write_local_markers(
        &self,
        prepared: &TxnMeta,
        marker: EndTxnMarker,
        partitions: &[TopicPartition],
    ) -> Vec<Option<ResponseError>> {
        // Appended to each partition first, then waited for together.
        let waits = partitions.iter().map(|(topic, index)| async move {
            let p = self.replicas.get(topic, *index).ok_or(ResponseError::NotLeaderOrFollower)?;
            let w = p.append_marker(prepared.producer_id, prepared.producer_epoch, marker).map_err(|e| {
                ResponseError::try_from_code(crate::kafka::handlers::partition_error_code(&e))
                    .unwrap_or(ResponseError::UnknownServerError)
            })?;
            match p.wait_for_commit(w.last_offset, w.leader_epoch, MARKER_TIMEOUT).await {
                CommitWait::Committed => {
                    if topic == OFFSETS_TOPIC {
                        self.groups.end_txn(*index, prepared.producer_id, marker.commit);
                    }
                    Ok(())
                }
                CommitWait::TimedOut => Err(ResponseError::RequestTimedOut),
                CommitWait::NotLeader => Err(ResponseError::NotLeaderOrFollower),
            }
        });
        futures_util::future::join_all(waits).await.into_iter().map(Result::err).collect()
    }

    /// Markers sent with WriteTxnMarkers to the broker at `addr`.
    async fn write_remote_markers(
        &self,
        addr: &str,
        prepared: &TxnMeta,
        marker: EndTxnMarker,
        partitions: &[TopicPartition],
    ) -> Vec<Option<ResponseError>> {
        let mut topics: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
        for (t, p) in partitions {
            topics.entry(t.as_str()).or_default().push(*p);
        }
        let request = WriteTxnMarkersRequest::default().with_markers(vec![WritableTxnMarker::default()
            .with_producer_id(ProducerId(prepared.producer_id))
            .with_producer_epoch(prepared.producer_epoch)
            .with_transaction_result(marker.commit)
            .with_coordinator_epoch(marker.coordinator_epoch)
            .with_topics(
                topics
                    .into_iter()
                    .map(|(t, ps)| {
                        WritableTxnMarkerTopic::default()
                            .with_name(TopicName(kafka_protocol::protocol::StrBytes::from_string(t.to_string())))
                            .with_partition_indexes(ps)
                    })
                    .collect(),
            )]);
        let response = match self.send_to_broker(addr, "markers", &request, 1, MARKER_TIMEOUT).await {
            Ok(r) => r,
            Err(e) => return partitions.iter().map(|_| Some(e)).collect(),
        };
        let codes =
            response.markers.iter().flat_map(|m| m.topics.iter()).flat_map(|t| {
                t.partitions.iter().map(move |p| ((t.name.0.to_string(), p.partition_index), p.error_code))
            });
        answers_by_partition(partitions, codes.collect())
    }

    /// Follows leadership of `__transaction_state` partitions and aborts
    /// timed-out transactions until `shutdown`.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut roles = self.replicas.subscribe();
        let every = Duration::from_millis(
            self.settings.int("transaction.abort.timed.out.transaction.cleanup.interval.ms").unwrap_or(10_000).max(10)
                as u64,
        );
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let expire_every = Duration::from_millis(
            self.settings.int("transaction.remove.expired.transaction.cleanup.interval.ms").unwrap_or(3_600_000).max(10)
                as u64,
        );
        let mut expire_tick = tokio::time::interval(expire_every);
        expire_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        self.follow_leadership();
        loop {
            tokio::select! {
                changed = roles.changed() => {
                    if changed.is_err() { break }
                    self.follow_leadership();
                }
                _ = tick.tick() => self.abort_timed_out(),
                _ = expire_tick.tick() => self.remove_expired(),
                _ = shutdown.changed() => break,
            }
        }
    }

    /// Loads the partitions newly led here and drops the ones no longer led.
    fn follow_leadership(self: &Arc<Self>) {
        let led: HashMap<i32, i32> = self
            .replicas
            .all()
            .into_iter()
            .filter(|p| p.topic == TRANSACTION_TOPIC && p.is_leader())
            .map(|p| (p.index, p.leader_epoch()))
            .collect();
        let mut to_load = Vec::new();
        {
            let mut shards = self.shards();
            shards.retain(|index, shard| {
                let keep = led.get(index) == Some(&shard.leader_epoch);
                if !keep {
                    tracing::info!(
                        partition = index,
                        transactions = shard.txns.len(),
                        "no longer coordinating the transactions of this partition"
                    );
                }
                keep
            });
            for (&index, &epoch) in &led {
                if let std::collections::hash_map::Entry::Vacant(e) = shards.entry(index) {
                    e.insert(Shard { leader_epoch: epoch, loaded: false, txns: HashMap::new() });
                    to_load.push((index, epoch));
                }
            }
        }
        // Requests waiting on a shard that went find out.
        self.idle.notify_waiters();
        for (index, epoch) in to_load {
            let this = self.clone();
            tokio::spawn(async move { this.load(index, epoch).await });
        }
    }

    /// Reads a partition of `__transaction_state` into memory, then
    /// finishes the transactions stored between Prepare and Complete.
    async fn load(self: Arc<Self>, index: i32, epoch: i32) {
        let Some(p) = self.replicas.get(TRANSACTION_TOPIC, index) else { return };
        let mut found: HashMap<String, Option<TxnMeta>> = HashMap::new();
        let mut next = 0i64;
        loop {
            let (chunk, end) = match p.read_local(next, LOAD_CHUNK, epoch) {
                Ok(r) => r,
                Err(e) => {
                    tracing::info!(partition = index, error = %e, "loading transactions abandoned");
                    return;
                }
            };
            if chunk.is_empty() {
                break;
            }
            let mut buf = chunk;
            while buf.remaining() > 0 {
                let set = match RecordBatchDecoder::decode(&mut buf) {
                    Ok(set) => set,
                    Err(e) => {
                        tracing::error!(partition = index, offset = next, error = %e,
                            "unreadable batch in __transaction_state; skipping the rest of the chunk");
                        break;
                    }
                };
                for r in set.records {
                    next = next.max(r.offset + 1);
                    if !r.control {
                        apply_loaded(&mut found, &r);
                    }
                }
            }
            if next >= end {
                break;
            }
            tokio::task::yield_now().await;
        }
        let unfinished: Vec<TxnMeta> = {
            let mut shards = self.shards();
            let Some(shard) = shards.get_mut(&index).filter(|s| s.leader_epoch == epoch && !s.loaded) else {
                return;
            };
            shard.txns = found
                .into_iter()
                .filter_map(|(id, meta)| {
                    let busy = meta.as_ref().is_some_and(|m| m.state.is_preparing());
                    meta.map(|m| (id, Entry { meta: Some(m), busy }))
                })
                .collect();
            shard.loaded = true;
            if !shard.txns.is_empty() {
                tracing::info!(
                    partition = index,
                    leader_epoch = epoch,
                    transactions = shard.txns.len(),
                    "loaded transactions"
                );
            }
            shard.txns.values().filter(|e| e.busy).filter_map(|e| e.meta.clone()).collect()
        };
        for prepared in unfinished {
            self.clone().spawn_end(index, epoch, prepared, None);
        }
    }

    /// Aborts, at a bumped epoch, every transaction open past its timeout,
    /// and finishes again any left between Prepare and Complete (its
    /// Complete state could not be stored).
    fn abort_timed_out(self: &Arc<Self>) {
        let now = wall_ms();
        let mut aborts = Vec::new();
        let mut unfinished = Vec::new();
        {
            let mut shards = self.shards();
            for (&index, shard) in shards.iter_mut().filter(|(_, s)| s.loaded) {
                for entry in shard.txns.values_mut().filter(|e| !e.busy) {
                    if let Some(prepared) = entry.meta.clone().filter(|m| m.state.is_preparing()) {
                        entry.busy = true;
                        unfinished.push((index, shard.leader_epoch, prepared));
                    }
                }
                for (id, entry) in shard.txns.iter_mut().filter(|(_, e)| !e.busy) {
                    let Some(meta) = entry.meta.as_ref().filter(|m| state::timed_out(m, now)) else { continue };
                    let prepared = state::abort_with_bumped_epoch(meta, now);
                    match self.append(index, id, &prepared) {
                        Ok(appended) => {
                            entry.busy = true;
                            tracing::info!(transactional_id = %id, producer_id = prepared.producer_id,
                                timeout_ms = prepared.timeout_ms, "aborting a transaction open past its timeout");
                            aborts.push((index, shard.leader_epoch, prepared, appended));
                        }
                        Err(e) => {
                            tracing::warn!(transactional_id = %id, error = ?e, "aborting a timed-out transaction failed")
                        }
                    }
                }
            }
        }
        for (index, epoch, prepared, appended) in aborts {
            self.clone().spawn_end(index, epoch, prepared, Some(appended));
        }
        for (index, epoch, prepared) in unfinished {
            self.clone().spawn_end(index, epoch, prepared, None);
        }
    }

    /// Forgets the transactional ids idle for `transactional.id.expiration.ms`
    /// (see [`state::expired`]): a tombstone for each is stored, and the id
    /// goes once it commits. A later InitProducerId for it starts afresh.
    fn remove_expired(self: &Arc<Self>) {
        let now = wall_ms();
        let expiration = self.settings.int("transactional.id.expiration.ms").unwrap_or(604_800_000);
        let mut removals = Vec::new();
        {
            let mut shards = self.shards();
            for (&index, shard) in shards.iter_mut().filter(|(_, s)| s.loaded) {
                for (id, entry) in shard.txns.iter_mut().filter(|(_, e)| !e.busy) {
                    let Some(meta) = entry.meta.as_ref().filter(|m| state::expired(m, now, expiration)) else {
                        continue;
                    };
                    match self.append_value(index, id, None) {
                        Ok(appended) => {
                            entry.busy = true;
                            tracing::info!(transactional_id = %id, producer_id = meta.producer_id,
                                "forgetting a transactional id idle past transactional.id.expiration.ms");
                            removals.push((id.clone(), meta.clone(), appended));
                        }
                        Err(e) => {
                            tracing::warn!(transactional_id = %id, error = ?e, "expiring a transactional id failed")
                        }
                    }
                }
            }
        }
        for (id, meta, appended) in removals {
            let this = self.clone();
            tokio::spawn(async move {
                let written = this.await_commit(appended).await;
                {
                    let mut shards = this.shards();
                    if let Some(shard) =
                        shards.get_mut(&appended.partition).filter(|s| s.leader_epoch == appended.leader_epoch)
                    {
                        match written {
                            Ok(()) if shard.txns.get(&id).is_some_and(|e| e.meta.as_ref() == Some(&meta)) => {
                                shard.txns.remove(&id);
                            }
                            _ => {
                                if let Some(entry) = shard.txns.get_mut(&id) {
                                    entry.busy = false;
                                }
                            }
                        }
                    }
                }
                this.idle.notify_waiters();
            });
        }
    }
}

/// Each partition's answer from another broker's per-partition error codes
/// (a partition it did not answer for is UNKNOWN_SERVER_ERROR).
fn answers_by_partition(
    partitions: &[TopicPartition],
    codes: HashMap<(String, i32), i16>,
) -> Vec<Option<ResponseError>> {
    partitions
        .iter()
        .map(|tp| match codes.get(tp) {
            Some(0) => None,
            Some(&code) => ResponseError::try_from_code(code).or(Some(ResponseError::UnknownServerError)),
            None => Some(ResponseError::UnknownServerError),
        })
        .collect()
}

/// Folds one record of `__transaction_state` into what a load has seen.
fn apply_loaded(found: &mut HashMap<String, Option<TxnMeta>>, r: &Record) {
    let Some(key) = r.key.clone() else { return };
    let id = match records::decode_key(key) {
        Ok(id) => id,
        Err(e) => {
            tracing::warn!(offset = r.offset, error = %e, "unreadable key in __transaction_state");
            return;
        }
    };
    match r.value.clone().map(|v: Bytes| records::decode_value(&id, v)).transpose() {
        Ok(meta) => {
            found.insert(id, meta);
        }
        Err(e) => tracing::warn!(offset = r.offset, error = %e, "unreadable transaction in __transaction_state"),
    }
}
