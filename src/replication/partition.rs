//! One partition replica on this broker: its log, its role (leader or
//! follower, with the leader epoch), the high watermark, and the
//! idempotent-producer state.
//!
//! The leader's high watermark is the minimum log end offset over the ISR
//! and never moves backwards; consumers read only below it. Waiters for
//! acks=all and long-poll fetches are woken through watch channels; the
//! partition never holds its lock across an await.
//!
//! Group commit: appends never fsync. When `flush.messages` records are
//! waiting, the appender asks for a flush, which runs on a blocking thread
//! without the partition lock and covers everything appended until it
//! starts; appends that arrive meanwhile are covered by the next one. With
//! `flush.messages=1` the leader counts its own log toward the high
//! watermark only as far as it is fsynced, and a follower fetches again only
//! once what it appended is fsynced, so acks=all means written and fsynced on
//! every in-sync replica.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;

use super::isr::{desired_isr, join_offset, FollowerProgress, LeaderView};
use super::producer_snapshot::{self, ProducerSnapshot};
use super::producer_state::{
    ActiveProducer, BatchMeta, CompletedTxn, MarkerCheck, ProducerStateMap, Refusal, Refusals, SeqCheck,
};
use crate::clock::{mono_ms, wall_ms};
use crate::log::batch::{split_record_set, BatchHeader};
use crate::log::compaction::CompactionResult;
use crate::log::partition_log::PreparedAppend;
use crate::log::txn::{encode_marker, AbortedTxn, EndTxnMarker};
use crate::log::validator::{RecordValidationError, Violation};
use crate::log::{FileSlice, LogConfig, LogError, PartitionLog, TimestampType};

/// ListOffsets' timestamp for "the record with the largest timestamp"
/// (KIP-734, ListOffsets v7+).
const MAX_TIMESTAMP: i64 = -3;

/// Why a partition operation failed; mapped to Kafka codes in `crate::error`.
#[derive(Debug, thiserror::Error)]
pub enum PartitionError {
    #[error("this broker is not the leader")]
    NotLeader,
    #[error("the leader epoch {got} is stale (current {current})")]
    FencedLeaderEpoch { got: i32, current: i32 },
    #[error("the leader epoch {got} is newer than this broker knows ({current})")]
    UnknownLeaderEpoch { got: i32, current: i32 },
    #[error("only {isr} in-sync replicas, min.insync.replicas is {min}")]
    NotEnoughReplicas { isr: usize, min: usize },
    #[error("out of order sequence: expected {expected}, got {got}")]
    OutOfOrderSequence { expected: i32, got: i32 },
    /// A gap where a batch this partition refused lately belongs: answered
    /// with that batch's retriable error, so the client sends both again.
    #[error("the batch at sequence {expected} was refused ({why:?}) and is not appended yet; this one follows it")]
    EarlierBatchRefused { why: Refusal, expected: i32 },
    #[error("producer epoch is older than {current}")]
    InvalidProducerEpoch { current: i16 },
    #[error("a transaction coordinator with a newer epoch ({current}) wrote a marker here")]
    TransactionCoordinatorFenced { current: i32 },
    #[error("the high watermark {high_watermark} has not reached this leader epoch's start {epoch_start} yet")]
    OffsetNotAvailable { high_watermark: i64, epoch_start: i64 },
    #[error("fetched at offset {fetch_offset}, but the log ends at {log_end_offset}")]
    FollowerOutOfStep { fetch_offset: i64, log_end_offset: i64 },
    #[error(transparent)]
    Log(#[from] LogError),
}

/// What a produce appended (or found already appended).
#[derive(Debug, Clone, Copy)]
pub struct AppendResult {
    pub base_offset: i64,
    pub last_offset: i64,
    pub log_start_offset: i64,
    /// The leader epoch the batch was appended in.
    pub leader_epoch: i32,
    /// The broker time stamped on the batches of a LogAppendTime topic, else -1.
    pub log_append_time_ms: i64,
    /// Set when the answer waits for a flush (`flush.messages` reached): the
    /// offset the log must be durable to (`wait_durable`).
    pub durable_end: Option<i64>,
}

/// How a `wait_durable` ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DurableWait {
    Durable,
    TimedOut,
    /// The leader epoch changed first: the records may be truncated away.
    NotLeader,
    /// The fsync failed (the records are written but not known durable).
    Failed,
}

/// The group commit's bookkeeping (see the module comment).
#[derive(Debug, Default)]
struct GroupCommit {
    /// A flush is running on a blocking thread.
    running: bool,
    /// An append asked for a flush while one ran: run another after it.
    again: bool,
    /// Flushes that failed so far; `wait_durable` reports a change.
    failures: u64,
    /// Flushes made so far (each one fdatasync).
    flushes: u64,
}

/// Why an acks=all wait ended without the batch being committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitWait {
    Committed,
    TimedOut,
    /// Leadership moved (or the epoch changed) before the high watermark passed the batch:
    /// the batch may be truncated away, so it must not be acknowledged.
    NotLeader,
}

/// What a fetch read.
#[derive(Debug, Clone)]
pub struct ReadResult {
    /// Where the records are in the log: sent from there, not copied.
    pub records: FileSlice,
    pub high_watermark: i64,
    pub log_start_offset: i64,
    pub log_end_offset: i64,
    /// The fetching follower is outside the ISR and has reached the high
    /// watermark: it may join the ISR now.
    pub joins_isr: bool,
    /// How far `read_committed` consumers may read (KIP-98).
    pub last_stable_offset: i64,
    /// For a `read_committed` read: the aborted transactions with records
    /// in what it returns, in marker order.
    pub aborted: Vec<AbortedTxn>,
}

/// A follower replica's fetch: its broker id, and when the leader received
/// the request (a [`crate::replication::isr::stamp`], taken before its first read).
#[derive(Debug, Clone, Copy)]
pub struct ReplicaFetch {
    pub id: i32,
    pub received: u64,
}

impl ReplicaFetch {
    /// A request from `id` received now.
    pub fn now(id: i32) -> Self {
        Self { id, received: super::isr::stamp() }
    }
}

/// A follower's fetch position.
#[derive(Debug, Clone, Copy)]
pub struct FollowerPosition {
    pub log_end_offset: i64,
    pub leader_epoch: i32,
    pub needs_truncation: bool,
    pub latest_local_epoch: Option<i32>,
}

/// Offsets as the admin API shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionOffsets {
    pub log_start_offset: i64,
    pub log_end_offset: i64,
    pub high_watermark: i64,
}

#[derive(Debug)]
struct State {
    log: PartitionLog,
    /// No longer a replica here ([`Partition::stop_serving`]): its files are
    /// about to go, and a compaction pass must not put any back.
    removed: bool,
    is_leader: bool,
    leader_epoch: i32,
    isr: Vec<i32>,
    high_watermark: i64,
    partition_epoch: i32,
    replicas: Vec<i32>,
    /// What the leader knows of each follower, from its fetches.
    followers: HashMap<i32, FollowerProgress>,
    /// The leader epoch this follower last truncated its log for.
    truncated_for_epoch: Option<i32>,
    /// As leader, the log end offset when this leader epoch began: until the
    /// high watermark reaches it, the high watermark may be behind one the
    /// previous leader already gave out (KIP-207).
    epoch_start_offset: i64,
    producers: ProducerStateMap,
    /// Producers' batches refused lately with a retriable error.
    refusals: Refusals,
    /// `min.insync.replicas` in force for this topic.
    min_insync: usize,
    /// Replicas this leader asked the controller to add to the ISR, in the
    /// partition epoch it asked in. Until that epoch's answer is applied
    /// they count toward the high watermark as if already in (Kafka's
    /// "maximal ISR"): the controller may have committed them, and a
    /// replica in the committed ISR may be elected, so the high watermark
    /// must not pass what it holds.
    pending_isr_adds: (i32, Vec<i32>),
}

#[derive(Debug)]
pub struct Partition {
    pub topic: String,
    pub index: i32,
    broker_id: i32,
    state: Mutex<State>,
    high_watermark_tx: watch::Sender<i64>,
    /// Changes on every append: follower fetches long-poll on it.
    log_end_tx: watch::Sender<i64>,
    commit: Mutex<GroupCommit>,
    /// Held by appends, from before they are placed until they are
    /// recorded, and by truncations (which cut the active segment an append
    /// writes to). Taken before `state`. The state lock is not held while
    /// an append writes (a system call that can block for long under
    /// writeback pressure), so reads, fetches, retention and leadership
    /// changes go on meanwhile; retention and compaction never touch the
    /// active segment.
    writer: Mutex<()>,
    /// Tests stop an append between its placing and its write here: it
    /// sends on the first and waits on the second.
    #[cfg(test)]
    write_gate: Mutex<Option<(std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>)>>,
    /// Sent after every group-commit flush: the count of failed ones.
    flushed_tx: watch::Sender<u64>,
    /// Whether the log has a flush policy (`flush.ms` or `flush.messages`),
    /// read without the lock: the flush timer passes over the others (the
    /// default, with thousands of partitions) without taking theirs.
    flush_policy: AtomicBool,
    /// This partition, for the flushes it starts on a blocking thread.
    me: Weak<Partition>,
}

fn has_flush_policy(config: &LogConfig) -> bool {
    config.flush_ms.is_some() || config.flush_messages.is_some()
}

/// The exact (timestamp, offset) of the first record at or after `ts` in
/// `batch` (decompressing it); `None` if the batch cannot be decoded.
fn first_record_at_or_after(mut batch: Bytes, ts: i64) -> Option<(i64, i64)> {
    let set = match kafka_protocol::records::RecordBatchDecoder::decode(&mut batch) {
        Ok(set) => set,
        Err(e) => {
            tracing::warn!(error = %e, "cannot decode a batch for a timestamp lookup; answering with its base offset");
            return None;
        }
    };
    set.records.iter().find(|r| r.timestamp >= ts).map(|r| (r.timestamp, r.offset))
}

/// The record with the largest timestamp in the first batch of `batch`
/// (the first such record on a tie), as (timestamp, offset).
fn record_with_max_timestamp(mut batch: Bytes) -> Option<(i64, i64)> {
    let set = match kafka_protocol::records::RecordBatchDecoder::decode(&mut batch) {
        Ok(set) => set,
        Err(e) => {
            tracing::warn!(error = %e, "cannot decode a batch for a timestamp lookup; answering with its base offset");
            return None;
        }
    };
    let mut best: Option<(i64, i64)> = None;
    for record in &set.records {
        if best.is_none_or(|(timestamp, _)| record.timestamp > timestamp) {
            best = Some((record.timestamp, record.offset));
        }
    }
    best
}

/// Rebuilds producer state, and the aborted transactions, from the newest
/// producer snapshot and the batch headers and markers after it (the whole
/// log when there is no snapshot).
fn rebuild_producers(log: &mut PartitionLog) -> Result<ProducerStateMap, LogError> {
    /// Bytes read per step while scanning.
    const SCAN_BYTES: usize = 1 << 20;
    let (mut producers, mut offset) = match producer_snapshot::load_latest(log.dir(), log.log_end_offset()) {
        Some((at, snapshot)) => {
            let aborted = snapshot.aborted.into_iter().filter(|t| marker_in_log(log, t)).collect();
            log.restore_aborted(aborted);
            (snapshot.producers, at.max(log.log_start_offset()))
        }
        None => (ProducerStateMap::default(), log.log_start_offset()),
    };
    if offset > log.log_start_offset() {
        tracing::debug!(
            topic = log.topic(),
            partition = log.partition(),
            from = offset,
            "producer state from a snapshot; reading the batches after it"
        );
    }
    let end = log.log_end_offset();
    while offset < end {
        let chunk = log.read(offset, SCAN_BYTES, end)?;
        if chunk.is_empty() {
            break;
        }
        let ended = producers.record_batches(&chunk)?;
        record_aborted(log, &ended);
        let mut next = offset;
        for range in split_record_set(&chunk)? {
            next = BatchHeader::parse(&chunk[range])?.last_offset() + 1;
        }
        if next <= offset {
            break;
        }
        offset = next;
    }
    Ok(producers)
}

/// Whether the abort marker of `t`, an aborted transaction a snapshot
/// names, is still in the log. A compaction pass swaps in a segment without
/// a marker (whose transaction has no record left by then) and rewrites the
/// snapshots only at its end: killed in between, it leaves snapshots naming
/// a transaction whose marker is gone. Brought back, that transaction would
/// make read_committed readers skip its producer's later batches for ever,
/// waiting for the marker. One that cannot be checked is kept, as before.
fn marker_in_log(log: &PartitionLog, t: &AbortedTxn) -> bool {
    if t.last_offset < log.log_start_offset() {
        return true; // left out by `restore_aborted`
    }
    match log.read(t.last_offset, 1, t.last_offset + 1) {
        Ok(batch) if batch.is_empty() => false,
        Ok(batch) => BatchHeader::parse(&batch)
            .map_or(true, |h| h.base_offset() == t.last_offset && h.is_control() && h.producer_id() == t.producer_id),
        Err(_) => true,
    }
}

/// A producer snapshot taken at a roll: the partition's directory, the
/// offset it stands at, the encoded snapshot.
type RollSnapshot = (std::path::PathBuf, i64, Vec<u8>);

/// Notes in the log the aborted ones among transactions markers ended.
fn record_aborted(log: &mut PartitionLog, ended: &[CompletedTxn]) {
    for t in ended.iter().filter(|t| t.aborted) {
        log.record_aborted(AbortedTxn {
            producer_id: t.producer_id,
            first_offset: t.first_offset,
            last_offset: t.last_offset,
            last_stable_offset: t.last_stable_offset,
        });
    }
}

/// Refuses, in a client's Produce, what only a partition leader may write
/// or what is no transaction's: control batches, and transactional batches
/// without a producer id and sequence (Kafka's INVALID_RECORD). The
/// coordinators' own writes are not checked: the group coordinator writes
/// a transaction's offsets without a sequence, as Kafka's does.
pub fn refuse_client_control_batches(records: &[u8]) -> Result<(), PartitionError> {
    let invalid = |message: &str| {
        PartitionError::Log(LogError::InvalidRecords(RecordValidationError {
            violation: Violation::InvalidRecord,
            message: message.to_string(),
            record_errors: Vec::new(),
        }))
    };
    let mut position = 0;
    while position < records.len() {
        // Malformed batches are the log's to refuse, with their own error.
        let Ok(h) = BatchHeader::parse(&records[position..]) else { return Ok(()) };
        if h.is_control() {
            return Err(invalid("clients may not write control records"));
        }
        if h.is_transactional() && (h.producer_id() < 0 || h.base_sequence() < 0) {
            return Err(invalid("a transactional batch needs a producer id and a sequence"));
        }
        position += h.total_size();
    }
    Ok(())
}

impl Partition {
    pub fn open(topic: &str, index: i32, broker_id: i32, mut log: PartitionLog) -> Result<Arc<Self>, LogError> {
        let producers = rebuild_producers(&mut log)?;
        let state = State {
            high_watermark: log.log_start_offset(),
            log,
            removed: false,
            is_leader: false,
            leader_epoch: -1,
            isr: Vec::new(),
            partition_epoch: -1,
            replicas: Vec::new(),
            followers: HashMap::new(),
            truncated_for_epoch: None,
            epoch_start_offset: 0,
            producers,
            refusals: Refusals::default(),
            min_insync: 1,
            pending_isr_adds: (-1, Vec::new()),
        };
        let (high_watermark_tx, _) = watch::channel(state.high_watermark);
        let (log_end_tx, _) = watch::channel(state.log.log_end_offset());
        let (flushed_tx, _) = watch::channel(0);
        let flush_policy = AtomicBool::new(has_flush_policy(state.log.config()));
        Ok(Arc::new_cyclic(|me| Self {
            topic: topic.to_string(),
            index,
            broker_id,
            state: Mutex::new(state),
            high_watermark_tx,
            log_end_tx,
            commit: Mutex::new(GroupCommit::default()),
            writer: Mutex::new(()),
            #[cfg(test)]
            write_gate: Mutex::new(None),
            flushed_tx,
            flush_policy,
            me: me.clone(),
        }))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock would be a bug; the state itself
        // stays consistent (every mutation is a single log call or field set).
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The test hook of `write_gate`, once.
    #[cfg(test)]
    fn before_write(&self) {
        let gate = self.write_gate.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some((reached, release)) = gate {
            let _ = reached.send(());
            let _ = release.recv();
        }
    }

    /// Writes a placed append, holding the writer lock but not the state
    /// lock; a failed write is cut back from the file.
    fn write_unlocked(&self, prepared: &PreparedAppend, records: &[u8]) -> Result<(), PartitionError> {
        #[cfg(test)]
        self.before_write();
        prepared.write(records).map_err(|e| {
            let _ = prepared.abandon();
            e.into()
        })
    }

    /// The producer state as it stands when a segment rolls (before the
    /// append that rolled it), encoded under the state lock, with its offset
    /// and the log's directory.
    fn snapshot_at_roll(st: &State) -> Option<RollSnapshot> {
        let snapshot = ProducerSnapshot { producers: st.producers.clone(), aborted: st.log.aborted_txns().to_vec() };
        let encoded = producer_snapshot::encode(&snapshot)?;
        Some((st.log.dir().to_path_buf(), st.log.log_end_offset(), encoded))
    }

    /// Writes a snapshot taken at a roll, holding the writer lock (so no
    /// truncation runs meanwhile) but not the state lock. A failure costs
    /// only a longer scan at the next start.
    fn write_snapshot(&self, snapshot: Option<RollSnapshot>) {
        let Some((dir, offset, encoded)) = snapshot else { return };
        if let Err(e) = producer_snapshot::write(&dir, offset, &encoded) {
            tracing::warn!(topic = %self.topic, partition = self.index, offset, error = %e,
                "writing a producer snapshot failed; the next start reads more of the log");
        }
    }

    /// The writer lock (see `writer`); take it before the state lock.
    fn writer(&self) -> MutexGuard<'_, ()> {
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Moves the high watermark to the minimum log end offset over the ISR,
    /// never backwards, never past the local log end.
    fn maybe_advance_high_watermark(&self, st: &mut State) {
        if !st.is_leader {
            return;
        }
        let local = Self::local_end(st);
        let mut hw = local;
        let (pending_epoch, pending) = &st.pending_isr_adds;
        let pending = pending.iter().filter(|_| *pending_epoch == st.partition_epoch);
        for id in st.isr.iter().chain(pending) {
            if *id != self.broker_id {
                let end = st.followers.get(id).map_or(-1, |f| f.log_end_offset);
                hw = hw.min(if end >= 0 { end } else { st.high_watermark });
            }
        }
        if hw > st.high_watermark {
            assert!(hw <= local, "high watermark {hw} past log end {local}");
            st.high_watermark = hw;
            self.high_watermark_tx.send_replace(hw);
        }
    }

    /// How far the leader's own log counts toward the high watermark: its
    /// log end, or with `flush.messages=1` as far as it is fsynced.
    fn local_end(st: &State) -> i64 {
        if Self::fsync_each(st) {
            st.log.recovery_point().min(st.log.log_end_offset())
        } else {
            st.log.log_end_offset()
        }
    }

    fn fsync_each(st: &State) -> bool {
        st.log.config().flush_messages == Some(1)
    }

    /// With fsync on every message, records this log holds unflushed keep
    /// the high watermark back until a flush covers them.
    fn high_watermark_waits_for_flush(st: &State) -> bool {
        Self::fsync_each(st) && st.log.recovery_point() < st.log.log_end_offset()
    }

    /// After a flush made under the state lock: the high watermark may move,
    /// and `wait_durable` waiters look again.
    fn flushed_under_lock(&self, mut st: MutexGuard<'_, State>) {
        self.maybe_advance_high_watermark(&mut st);
        drop(st);
        self.flushed_tx.send_modify(|_| {});
    }

    /// Asks for a flush of everything appended so far (group commit: one
    /// fdatasync on a blocking thread covers every append before it starts).
    /// Never call it holding the state lock.
    fn request_flush(&self) {
        {
            let mut gc = self.commit.lock().unwrap_or_else(|e| e.into_inner());
            if gc.running {
                gc.again = true;
                return;
            }
            gc.running = true;
        }
        let Some(me) = self.me.upgrade() else {
            self.commit.lock().unwrap_or_else(|e| e.into_inner()).running = false;
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(move || me.run_flushes())),
            Err(_) => me.run_flushes(),
        }
    }

    /// The flush loop: runs until no append asked for another meanwhile.
    fn run_flushes(&self) {
        loop {
            self.commit.lock().unwrap_or_else(|e| e.into_inner()).again = false;
            let ticket = self.state().log.flush_ticket();
            let synced = ticket.and_then(|ticket| ticket.sync().map(|()| ticket).map_err(LogError::from));
            {
                let mut st = self.state();
                match &synced {
                    Ok(ticket) => {
                        st.log.flushed(ticket);
                        self.maybe_advance_high_watermark(&mut st);
                    }
                    Err(e) => tracing::error!(topic = %self.topic, partition = self.index, error = %e,
                        "fsync of the partition log failed; the records it covers are not acknowledged as durable"),
                }
            }
            let (again, failures) = {
                let mut gc = self.commit.lock().unwrap_or_else(|e| e.into_inner());
                if synced.is_err() {
                    gc.failures += 1;
                } else {
                    gc.flushes += 1;
                }
                if !gc.again {
                    gc.running = false;
                }
                (gc.again, gc.failures)
            };
            self.flushed_tx.send_replace(failures);
            if !again {
                return;
            }
        }
    }

    /// Group-commit flushes made so far.
    pub fn group_commit_flushes(&self) -> u64 {
        self.commit.lock().unwrap_or_else(|e| e.into_inner()).flushes
    }

    /// Waits until the log is fsynced up to `end` while the leader epoch is
    /// still `leader_epoch` (the epoch the records were appended in), up to
    /// `timeout`. The flush was asked for by the append that set `end`.
    pub async fn wait_durable(&self, end: i64, leader_epoch: i32, timeout: Duration) -> DurableWait {
        let mut rx = self.flushed_tx.subscribe();
        let failures = *rx.borrow();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Marked seen before the log is looked at, never after: a flush
            // that ends in between would be taken as seen, and its end missed
            // until the deadline.
            let failed = *rx.borrow_and_update() != failures;
            {
                let st = self.state();
                if st.leader_epoch != leader_epoch {
                    return DurableWait::NotLeader;
                }
                if st.log.recovery_point() >= end {
                    return DurableWait::Durable;
                }
            }
            if failed {
                return DurableWait::Failed;
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return DurableWait::NotLeader,
                Err(_) => return DurableWait::TimedOut,
            }
        }
    }

    /// Applies a leadership change from the metadata image.
    pub fn become_leader(&self, leader_epoch: i32, partition_epoch: i32, isr: &[i32], replicas: &[i32]) {
        let mut st = self.state();
        if !st.is_leader || st.leader_epoch != leader_epoch {
            st.epoch_start_offset = st.log.log_end_offset();
            st.pending_isr_adds = (-1, Vec::new());
            // Every follower gets a full lag period to show up.
            let now = mono_ms();
            st.followers =
                replicas.iter().filter(|r| **r != self.broker_id).map(|r| (*r, FollowerProgress::new(now))).collect();
            tracing::info!(topic = %self.topic, partition = self.index, leader_epoch,
                high_watermark = st.high_watermark, log_end_offset = st.log.log_end_offset(), "became leader");
        }
        if st.replicas != replicas {
            // A reassignment added or removed replicas: follow exactly the new set.
            let now = mono_ms();
            st.followers.retain(|b, _| replicas.contains(b));
            for r in replicas.iter().filter(|r| **r != self.broker_id) {
                st.followers.entry(*r).or_insert_with(|| FollowerProgress::new(now));
            }
        }
        if st.partition_epoch != partition_epoch {
            // A replica outside the ISR proves its position again by fetching:
            // the images this leader saw may skip its removal and return (a
            // move away and straight back), after which what it fetched
            // before says nothing about the log it holds now.
            let now = mono_ms();
            for r in replicas.iter().filter(|r| **r != self.broker_id && !isr.contains(r)) {
                st.followers.insert(*r, FollowerProgress::new(now));
            }
        }
        st.is_leader = true;
        st.leader_epoch = leader_epoch;
        st.partition_epoch = partition_epoch;
        st.isr = isr.to_vec();
        st.replicas = replicas.to_vec();
        self.maybe_advance_high_watermark(&mut st);
        // With fsync on every message the high watermark waits for this log
        // to be durable: what a follower appended unflushed is flushed now.
        let unflushed = Self::high_watermark_waits_for_flush(&st);
        drop(st);
        if unflushed {
            self.request_flush();
        }
    }

    /// This broker no longer hosts the partition (a reassignment removed it,
    /// or the topic was deleted): it leads nothing, and waiters — an acks=all
    /// produce, a long-polling fetch — wake to answer NOT_LEADER_OR_FOLLOWER
    /// at once instead of at their timeout.
    pub fn stop_serving(&self) {
        let mut st = self.state();
        if st.is_leader {
            tracing::info!(topic = %self.topic, partition = self.index, "no longer a replica: stopped leading");
        }
        st.is_leader = false;
        st.removed = true;
        st.followers.clear();
        drop(st);
        self.wake_waiters();
    }

    /// Waiters on the high watermark and the log end re-check their role.
    fn wake_waiters(&self) {
        self.high_watermark_tx.send_modify(|_| {});
        self.log_end_tx.send_modify(|_| {});
    }

    pub fn become_follower(&self, leader_epoch: i32, partition_epoch: i32) {
        let mut st = self.state();
        if st.is_leader || st.leader_epoch != leader_epoch {
            tracing::info!(topic = %self.topic, partition = self.index, leader_epoch, "following");
            st.truncated_for_epoch = None;
            st.followers.clear();
        }
        st.is_leader = false;
        st.leader_epoch = leader_epoch;
        st.partition_epoch = partition_epoch;
        self.wake_waiters();
    }

    /// Where a follower fetches from, or `None` on the leader.
    pub fn follower_position(&self) -> Option<FollowerPosition> {
        let st = self.state();
        (!st.is_leader).then(|| FollowerPosition {
            log_end_offset: st.log.log_end_offset(),
            leader_epoch: st.leader_epoch,
            needs_truncation: st.truncated_for_epoch != Some(st.leader_epoch),
            latest_local_epoch: st.log.latest_epoch(),
        })
    }

    /// Truncates a follower's log where it diverges from the leader of
    /// `leader_epoch` (the end offset the leader reported for our latest
    /// epoch; -1 when it knows none, then the high watermark is kept).
    pub fn truncate_for_epoch(&self, leader_epoch: i32, end_offset: i64) -> Result<(), PartitionError> {
        let _writer = self.writer();
        let mut st = self.state();
        if st.is_leader || st.leader_epoch != leader_epoch {
            return Err(PartitionError::NotLeader);
        }
        let target = if end_offset >= 0 { end_offset } else { st.high_watermark };
        let end = st.log.log_end_offset();
        if target < end {
            st.log.truncate_to(target)?;
            st.producers.truncate_to(target);
            producer_snapshot::delete_after(st.log.dir(), st.log.log_end_offset());
            st.high_watermark = st.high_watermark.min(st.log.log_end_offset());
            tracing::info!(topic = %self.topic, partition = self.index, from = end, to = st.log.log_end_offset(),
                leader_epoch, "truncated a divergent suffix");
        }
        st.truncated_for_epoch = Some(leader_epoch);
        Ok(())
    }

    /// Truncates after the leader's OffsetForLeaderEpoch answer: its log
    /// holds epoch `answer_epoch` (the largest it has at or below the one
    /// asked for) up to `answer_end`. When that epoch is older than the one
    /// asked for, this log's own records after its end of `answer_epoch` were
    /// written in epochs the leader never had, and go too (KIP-279): keeping
    /// them because the leader's next epoch starts later would leave two
    /// replicas with different records at one offset. A negative epoch (the
    /// leader knows none) falls back to the high watermark.
    pub fn truncate_to_leader_answer(
        &self,
        leader_epoch: i32,
        answer_epoch: i32,
        answer_end: i64,
    ) -> Result<(), PartitionError> {
        if answer_epoch < 0 {
            return self.truncate_for_epoch(leader_epoch, -1);
        }
        let local_end = {
            let st = self.state();
            let end = st.log.log_end_offset();
            st.log.end_offset_for_epoch(answer_epoch).map_or(end, |e| e.end_offset.min(end))
        };
        self.truncate_for_epoch(leader_epoch, answer_end.min(local_end))
    }

    /// DeleteRecords on the leader: the log start offset moves up to
    /// `offset` (-1: the high watermark), which must not pass the high
    /// watermark. Followers learn it from their next Fetch. Returns the new
    /// log start offset (Kafka's low watermark).
    pub fn delete_records(&self, offset: i64) -> Result<i64, PartitionError> {
        let mut st = self.state();
        if !st.is_leader {
            return Err(PartitionError::NotLeader);
        }
        let target = if offset == -1 { st.high_watermark } else { offset };
        if target < 0 || target > st.high_watermark {
            return Err(PartitionError::Log(LogError::OffsetOutOfRange {
                offset,
                log_start_offset: st.log.log_start_offset(),
                log_end_offset: st.high_watermark,
            }));
        }
        st.log.advance_start(target)?;
        Ok(st.log.log_start_offset())
    }

    /// A follower whose fetch offset is outside the leader's log starts over at `offset`.
    pub fn reset_to(&self, leader_epoch: i32, offset: i64) -> Result<(), PartitionError> {
        let _writer = self.writer();
        let mut st = self.state();
        if st.is_leader || st.leader_epoch != leader_epoch {
            return Err(PartitionError::NotLeader);
        }
        st.log.truncate_fully_and_start_at(offset)?;
        st.producers = ProducerStateMap::default();
        producer_snapshot::delete_after(st.log.dir(), -1);
        st.high_watermark = offset;
        tracing::warn!(topic = %self.topic, partition = self.index, offset, "follower log reset to the leader's range");
        Ok(())
    }

    /// Appends what the leader sent; the follower's high watermark follows the
    /// leader's. Returns the offset to wait for with `wait_durable` before
    /// fetching again, when `flush.messages` was reached. `fetch_offset` is
    /// the offset the fetch asked for: records are appended only while the
    /// log still ends there (else `FollowerOutOfStep`, and nothing changes).
    pub fn append_as_follower(
        &self,
        leader_epoch: i32,
        fetch_offset: i64,
        records: &[u8],
        leader_high_watermark: i64,
        leader_log_start: i64,
    ) -> Result<Option<i64>, PartitionError> {
        // An empty answer (a long poll's) only moves the high watermark.
        let _writer = (!records.is_empty()).then(|| self.writer());
        let mut st = self.state();
        if st.is_leader || st.leader_epoch != leader_epoch {
            return Err(PartitionError::NotLeader);
        }
        if !records.is_empty() && st.log.log_end_offset() != fetch_offset {
            // Fetched for a log end this log does not have: an earlier answer,
            // appended ahead of this fetch, was refused. What came back may
            // not follow on from what is here.
            return Err(PartitionError::FollowerOutOfStep { fetch_offset, log_end_offset: st.log.log_end_offset() });
        }
        let mut rolled = false;
        if !records.is_empty() {
            let prepared = st.log.prepare_append_as_follower(records, wall_ms())?;
            let snapshot = if prepared.rolled() { Self::snapshot_at_roll(&st) } else { None };
            drop(st);
            self.write_snapshot(snapshot);
            self.write_unlocked(&prepared, records)?;
            rolled = prepared.rolled();
            st = self.state();
            if st.is_leader || st.leader_epoch != leader_epoch {
                // Elected, or following another epoch, meanwhile: what the
                // old leader sent is not recorded (this log's epoch began at
                // its end as it was), and its bytes go from the file.
                drop(st);
                if let Err(e) = prepared.abandon() {
                    tracing::warn!(topic = %self.topic, partition = self.index, error = %e,
                        "cutting back an abandoned follower append failed; recovery cuts it if needed");
                }
                if rolled {
                    self.request_flush();
                }
                return Err(PartitionError::NotLeader);
            }
            st.log.finish_append(prepared)?;
            let ended = st.producers.record_batches(records).map_err(LogError::from)?;
            record_aborted(&mut st.log, &ended);
        }
        let hw = leader_high_watermark.min(st.log.log_end_offset());
        if hw > st.high_watermark {
            st.high_watermark = hw;
            self.high_watermark_tx.send_replace(hw);
        }
        // The leader's log start (moved by DeleteRecords), up to what this
        // replica holds of the committed log.
        let start = leader_log_start.min(st.high_watermark);
        if start > st.log.log_start_offset() {
            st.log.advance_start(start)?;
        }
        let durable_end = st.log.flush_due_by_count().then(|| st.log.log_end_offset());
        drop(st);
        if durable_end.is_some() || rolled {
            self.request_flush();
        }
        Ok(durable_end)
    }

    /// The ISR change this leader should ask the controller for, with the
    /// leader and partition epochs it is based on.
    /// Replicas it adds count toward the high watermark from now on, until
    /// the answer is applied or refused (`isr_change_refused`).
    pub fn isr_proposal(&self, lag_max_ms: i64, is_active: impl Fn(i32) -> bool) -> Option<(i32, i32, Vec<i32>)> {
        let mut st = self.state();
        if !st.is_leader {
            return None;
        }
        let view = LeaderView {
            leader: self.broker_id,
            isr: &st.isr,
            replicas: &st.replicas,
            high_watermark: st.high_watermark,
            epoch_start_offset: st.epoch_start_offset,
        };
        let isr = desired_isr(view, &st.followers, mono_ms(), lag_max_ms, is_active)?;
        let partition_epoch = st.partition_epoch;
        let State { pending_isr_adds, isr: current, .. } = &mut *st;
        if pending_isr_adds.0 != partition_epoch {
            *pending_isr_adds = (partition_epoch, Vec::new());
        }
        for b in isr.iter().filter(|b| !current.contains(b)) {
            if !pending_isr_adds.1.contains(b) {
                pending_isr_adds.1.push(*b);
            }
        }
        Some((st.leader_epoch, partition_epoch, isr))
    }

    /// The controller refused the ISR change asked in `partition_epoch`
    /// (a stale epoch, or a replica it would not let in): the replicas it
    /// would have added stop counting toward the high watermark.
    pub fn isr_change_refused(&self, partition_epoch: i32) {
        let mut st = self.state();
        if st.pending_isr_adds.0 == partition_epoch {
            st.pending_isr_adds = (-1, Vec::new());
            self.maybe_advance_high_watermark(&mut st);
        }
    }

    pub fn set_config(&self, config: LogConfig, min_insync: usize) -> Result<(), LogError> {
        let mut st = self.state();
        st.min_insync = min_insync;
        if *st.log.config() != config {
            let policy = has_flush_policy(&config);
            st.log.set_config(config)?;
            self.flush_policy.store(policy, Ordering::Release);
        }
        // Into fsync-on-every-message with records unflushed: the high
        // watermark now waits for them.
        let unflushed = Self::high_watermark_waits_for_flush(&st);
        self.maybe_advance_high_watermark(&mut st);
        drop(st);
        if unflushed {
            self.request_flush();
        }
        Ok(())
    }

    pub fn is_leader(&self) -> bool {
        self.state().is_leader
    }

    /// Bytes of this replica's log.
    pub fn size_bytes(&self) -> u64 {
        self.state().log.size_bytes()
    }

    pub fn leader_epoch(&self) -> i32 {
        self.state().leader_epoch
    }

    /// Whether `producer_id` has a transaction open in this partition at
    /// `epoch` (its later batches in the transaction need no verification).
    pub fn has_open_txn(&self, producer_id: i64, epoch: i16) -> bool {
        self.state().producers.has_open_txn(producer_id, epoch)
    }

    /// The producers whose batches this replica remembers (DescribeProducers):
    /// a follower knows them too, from what it replicated, as in Kafka.
    pub fn active_producers(&self) -> Vec<ActiveProducer> {
        self.state().producers.active()
    }

    pub fn offsets(&self) -> PartitionOffsets {
        let st = self.state();
        PartitionOffsets {
            log_start_offset: st.log.log_start_offset(),
            log_end_offset: st.log.log_end_offset(),
            high_watermark: st.high_watermark,
        }
    }

    /// On the leader: the bytes the given replicas (a reassignment's adding
    /// ones) still have to copy, from where each last fetched; a replica that
    /// has not fetched yet has the whole log to copy.
    pub fn bytes_behind(&self, replicas: &[i32]) -> Result<u64, PartitionError> {
        let st = self.state();
        if !st.is_leader {
            return Err(PartitionError::NotLeader);
        }
        let mut total = 0;
        for r in replicas {
            let offset = st.followers.get(r).map_or(-1, |f| f.log_end_offset);
            total += st.log.size_bytes_from(offset)?;
        }
        Ok(total)
    }

    /// Checks a client's view of the leader epoch (-1: not given).
    fn check_epoch(st: &State, current_leader_epoch: i32) -> Result<(), PartitionError> {
        if current_leader_epoch < 0 || current_leader_epoch == st.leader_epoch {
            Ok(())
        } else if current_leader_epoch < st.leader_epoch {
            Err(PartitionError::FencedLeaderEpoch { got: current_leader_epoch, current: st.leader_epoch })
        } else {
            Err(PartitionError::UnknownLeaderEpoch { got: current_leader_epoch, current: st.leader_epoch })
        }
    }

    /// Appends a produce request's record set as leader. Batches are checked
    /// (CRC, size, producer sequence) before anything is written.
    pub fn append_as_leader(&self, records: &[u8], acks_all: bool) -> Result<AppendResult, PartitionError> {
        let _writer = self.writer();
        let mut st = self.state();
        if !st.is_leader {
            Self::note_refusal(&mut st, records, Refusal::NotLeader);
            return Err(PartitionError::NotLeader);
        }
        if acks_all && st.isr.len() < st.min_insync {
            Self::note_refusal(&mut st, records, Refusal::NotEnoughReplicas);
            return Err(PartitionError::NotEnoughReplicas { isr: st.isr.len(), min: st.min_insync });
        }
        // Idempotence: one producer batch per request is what clients send.
        // Only the first batch's header is read here; the log splits and
        // validates the whole record set (CRC included) when it appends.
        let mut sequenced = None;
        if !records.is_empty() {
            let h = BatchHeader::parse(records).map_err(LogError::from)?;
            if h.producer_id() >= 0 && h.base_sequence() >= 0 {
                let first_seq = h.base_sequence();
                let last_seq = first_seq.wrapping_add(h.last_offset_delta());
                match st.producers.check(h.producer_id(), h.producer_epoch(), first_seq, last_seq) {
                    SeqCheck::Append => {
                        sequenced = Some((
                            h.producer_id(),
                            h.producer_epoch(),
                            first_seq,
                            last_seq,
                            h.max_timestamp(),
                            h.is_transactional(),
                        ))
                    }
                    SeqCheck::Duplicate(b) => {
                        // Answered as the first was: after its flush, if it waited for one.
                        let unflushed =
                            st.log.config().flush_messages.is_some() && st.log.recovery_point() <= b.last_offset;
                        let result = AppendResult {
                            base_offset: b.base_offset,
                            last_offset: b.last_offset,
                            log_start_offset: st.log.log_start_offset(),
                            leader_epoch: st.leader_epoch,
                            log_append_time_ms: -1,
                            durable_end: unflushed.then_some(b.last_offset + 1),
                        };
                        drop(st);
                        if unflushed {
                            self.request_flush();
                        }
                        return Ok(result);
                    }
                    SeqCheck::OutOfOrder { expected, got } => {
                        return Err(
                            match st.refusals.explains(h.producer_id(), h.producer_epoch(), expected, mono_ms()) {
                                Some(why) => PartitionError::EarlierBatchRefused { why, expected },
                                None => PartitionError::OutOfOrderSequence { expected, got },
                            },
                        );
                    }
                    SeqCheck::FencedEpoch { current } => return Err(PartitionError::InvalidProducerEpoch { current }),
                }
            }
        }
        self.write_as_leader(st, records, |st, info, log_append_time_ms| {
            if let Some((pid, pepoch, first_seq, last_seq, max_timestamp, transactional)) = sequenced {
                let max_timestamp = if log_append_time_ms >= 0 { log_append_time_ms } else { max_timestamp };
                let meta = BatchMeta {
                    first_seq,
                    last_seq,
                    base_offset: info.base_offset,
                    last_offset: info.last_offset,
                    max_timestamp,
                };
                st.producers.record(pid, pepoch, meta, transactional);
                st.refusals.forget(pid);
            }
        })
    }

    /// Writes a checked append as leader (the writer lock held, `st` the
    /// state lock, released while the records are written), and records it
    /// with `recorded` under the state lock again: its info and the append
    /// time stamped on a LogAppendTime topic (else -1).
    fn write_as_leader(
        &self,
        mut st: MutexGuard<'_, State>,
        records: &[u8],
        recorded: impl FnOnce(&mut State, &crate::log::AppendInfo, i64),
    ) -> Result<AppendResult, PartitionError> {
        let epoch = st.leader_epoch;
        let now = wall_ms();
        let prepared = st.log.prepare_append_as_leader(records, epoch, now)?;
        let snapshot = if prepared.rolled() { Self::snapshot_at_roll(&st) } else { None };
        drop(st);
        self.write_snapshot(snapshot);
        self.write_unlocked(&prepared, records)?;
        let rolled = prepared.rolled();
        let mut st = self.state();
        let info = st.log.finish_append(prepared)?;
        let log_append_time_ms = if st.log.config().timestamp_type == TimestampType::LogAppendTime { now } else { -1 };
        recorded(&mut st, &info, log_append_time_ms);
        self.maybe_advance_high_watermark(&mut st);
        self.log_end_tx.send_replace(st.log.log_end_offset());
        let deposed = !st.is_leader || st.leader_epoch != epoch;
        let durable_end = st.log.flush_due_by_count().then(|| st.log.log_end_offset());
        let result = AppendResult {
            base_offset: info.base_offset,
            last_offset: info.last_offset,
            log_start_offset: st.log.log_start_offset(),
            leader_epoch: epoch,
            log_append_time_ms,
            durable_end,
        };
        drop(st);
        // A roll sealed a segment: a flush covers it in the background.
        if durable_end.is_some() || rolled {
            self.request_flush();
        }
        if deposed {
            // Deposed while writing: the records stay in the log, as a
            // deposed leader's unreplicated suffix does, for the truncation
            // that follows to judge; the producer retries elsewhere (a
            // retry here is recognized as a duplicate).
            return Err(PartitionError::NotLeader);
        }
        Ok(result)
    }

    /// Writes an end-transaction marker of `producer_id` as leader
    /// (WriteTxnMarkers): its transaction here ends, committed or aborted.
    /// Refused for a producer epoch or coordinator epoch older than one
    /// already seen here, and, as any acks=all write, with fewer in-sync
    /// replicas than `min.insync.replicas`.
    pub fn append_marker(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        marker: EndTxnMarker,
    ) -> Result<AppendResult, PartitionError> {
        let _writer = self.writer();
        let st = self.state();
        if !st.is_leader {
            return Err(PartitionError::NotLeader);
        }
        if st.isr.len() < st.min_insync {
            return Err(PartitionError::NotEnoughReplicas { isr: st.isr.len(), min: st.min_insync });
        }
        match st.producers.check_marker(producer_id, producer_epoch, marker.coordinator_epoch) {
            MarkerCheck::Append => {}
            MarkerCheck::FencedEpoch { current } => return Err(PartitionError::InvalidProducerEpoch { current }),
            MarkerCheck::FencedCoordinator { current } => {
                return Err(PartitionError::TransactionCoordinatorFenced { current })
            }
        }
        let batch = encode_marker(producer_id, producer_epoch, marker, wall_ms()).ok_or_else(|| {
            PartitionError::Log(LogError::InvalidRecords(RecordValidationError {
                violation: Violation::InvalidRecord,
                message: "the marker batch could not be encoded".to_string(),
                record_errors: Vec::new(),
            }))
        })?;
        self.write_as_leader(st, &batch, |st, info, _| {
            let ended = st.producers.end_txn(producer_id, producer_epoch, marker, info.base_offset);
            record_aborted(&mut st.log, ended.as_slice());
        })
    }

    /// How far `read_committed` consumers may read: the high watermark, or
    /// the first offset of the oldest transaction not yet decided below it.
    fn last_stable_offset(st: &mut State) -> i64 {
        let hw = st.high_watermark;
        st.producers.first_unstable_offset(hw).map_or(hw, |first| first.min(hw))
    }

    /// Notes a produce's batch refused before it reached the partition (the
    /// broker is cut off from the controller, or its disk is full).
    pub fn note_refused(&self, records: &[u8], why: Refusal) {
        Self::note_refusal(&mut self.state(), records, why);
    }

    fn note_refusal(st: &mut State, records: &[u8], why: Refusal) {
        if let Ok(h) = BatchHeader::parse(records) {
            st.refusals.note(h.producer_id(), h.producer_epoch(), h.base_sequence(), why, mono_ms());
        }
    }

    /// Reads for a consumer (below the high watermark, or with
    /// `read_committed` below the last stable offset, with the aborted
    /// transactions it must skip) or a follower (`replica`, up to the log
    /// end, recording its progress). A first batch larger than `max_bytes`
    /// is returned whole only with `min_one_batch` (KIP-74), else nothing is.
    pub fn read(
        &self,
        fetch_offset: i64,
        max_bytes: usize,
        min_one_batch: bool,
        current_leader_epoch: i32,
        replica: Option<ReplicaFetch>,
        read_committed: bool,
    ) -> Result<ReadResult, PartitionError> {
        let mut st = self.state();
        if !st.is_leader {
            return Err(PartitionError::NotLeader);
        }
        Self::check_epoch(&st, current_leader_epoch)?;
        let mut joins_isr = false;
        let max_offset = match replica {
            Some(f) => {
                let (end, now) = (st.log.log_end_offset(), mono_ms());
                let join_at = join_offset(st.high_watermark, st.epoch_start_offset);
                // Only a replica's fetch counts, and only one received after
                // its progress record began: a long-poll that was waiting
                // when the replica was removed and added back (its log
                // deleted and started again empty) carries the old position.
                let counted = st.replicas.contains(&f.id)
                    && st.followers.get_mut(&f.id).is_some_and(|p| {
                        let counted = p.since < f.received;
                        if counted {
                            p.on_fetch(fetch_offset, end, now);
                        }
                        counted
                    });
                if counted {
                    joins_isr = !st.isr.contains(&f.id) && fetch_offset >= join_at;
                    self.maybe_advance_high_watermark(&mut st);
                }
                end
            }
            None if read_committed => Self::last_stable_offset(&mut st),
            None => st.high_watermark,
        };
        let (records, bound) = if fetch_offset >= max_offset && fetch_offset <= st.log.log_end_offset() {
            (FileSlice::empty(), fetch_offset)
        } else {
            st.log.slice_with_bound(fetch_offset, max_bytes, max_offset, min_one_batch)?
        };
        let aborted = match read_committed && replica.is_none() && !records.is_empty() {
            true => st.log.aborted_overlapping(fetch_offset, bound),
            false => Vec::new(),
        };
        Ok(ReadResult {
            records,
            high_watermark: st.high_watermark,
            log_start_offset: st.log.log_start_offset(),
            log_end_offset: st.log.log_end_offset(),
            joins_isr,
            // (Only consumers are told; a follower's read needs no LSO.)
            last_stable_offset: if replica.is_none() { Self::last_stable_offset(&mut st) } else { st.high_watermark },
            aborted,
        })
    }

    /// The file range a read from `offset` of up to `max_bytes` would make,
    /// when it lies far behind the log end (see
    /// `PartitionLog::prefetch_range`); in memory, no I/O.
    pub fn prefetch_range(&self, offset: i64, max_bytes: u64) -> Option<FileSlice> {
        self.state().log.prefetch_range(offset, max_bytes)
    }

    /// Whole batches from `offset` up to the log end, for the leader's own
    /// use (rebuilding state from the log), with the log end offset; no
    /// follower bookkeeping. `offset` below the log start reads from the start.
    pub fn read_local(&self, offset: i64, max_bytes: usize, leader_epoch: i32) -> Result<(Bytes, i64), PartitionError> {
        let st = self.state();
        if !st.is_leader || st.leader_epoch != leader_epoch {
            return Err(PartitionError::NotLeader);
        }
        let end = st.log.log_end_offset();
        let offset = offset.max(st.log.log_start_offset());
        if offset >= end {
            return Ok((Bytes::new(), end));
        }
        Ok((st.log.read(offset, max_bytes, end)?, end))
    }

    /// ListOffsets: -2 earliest, -1 latest (the high watermark, or the last
    /// stable offset for `read_committed`), -3 the
    /// record with the largest timestamp (KIP-734), else the first record
    /// whose timestamp is at or after `timestamp`. Latest is refused with
    /// OFFSET_NOT_AVAILABLE (retriable) while a new leader's high watermark is
    /// behind the start of its epoch: it may be lower than the one the
    /// previous leader answered, and latest offsets must never go back.
    pub fn offset_for(
        &self,
        timestamp: i64,
        current_leader_epoch: i32,
        read_committed: bool,
    ) -> Result<(i64, i64), PartitionError> {
        let mut st = self.state();
        if !st.is_leader {
            return Err(PartitionError::NotLeader);
        }
        Self::check_epoch(&st, current_leader_epoch)?;
        // What the asker may read: below the last stable offset for
        // `read_committed` (Kafka's isolation level 1), else the high watermark.
        let readable = if read_committed { Self::last_stable_offset(&mut st) } else { st.high_watermark };
        match timestamp {
            -2 => Ok((-1, st.log.log_start_offset())),
            -1 if st.high_watermark < st.epoch_start_offset => Err(PartitionError::OffsetNotAvailable {
                high_watermark: st.high_watermark,
                epoch_start: st.epoch_start_offset,
            }),
            -1 => Ok((-1, readable)),
            MAX_TIMESTAMP => match st.log.max_timestamp_batch(readable)? {
                Some(found) => {
                    let from = found.offset.max(st.log.log_start_offset());
                    let batch = st.log.read(from, 1, readable)?;
                    Ok(record_with_max_timestamp(batch).unwrap_or((found.timestamp, found.offset)))
                }
                None => Ok((-1, -1)),
            },
            ts => match st.log.offset_for_timestamp(ts)? {
                Some(found) if found.offset < readable => {
                    // (A batch DeleteRecords cut into is read from the log start.)
                    let from = found.offset.max(st.log.log_start_offset());
                    let batch = st.log.read(from, 1, readable)?;
                    Ok(first_record_at_or_after(batch, ts).unwrap_or((found.timestamp, found.offset)))
                }
                _ => Ok((-1, -1)),
            },
        }
    }

    /// OffsetsForLeaderEpoch: (epoch, end offset) or (-1, -1) when unknown.
    pub fn end_offset_for_epoch(
        &self,
        leader_epoch: i32,
        current_leader_epoch: i32,
    ) -> Result<(i32, i64), PartitionError> {
        let st = self.state();
        if !st.is_leader {
            return Err(PartitionError::NotLeader);
        }
        Self::check_epoch(&st, current_leader_epoch)?;
        Ok(st.log.end_offset_for_epoch(leader_epoch).map_or((-1, -1), |e| (e.leader_epoch, e.end_offset)))
    }

    /// Waits until the high watermark passes `offset`, up to `timeout`.
    /// Waits until the high watermark passes `offset` while this broker still
    /// leads at `leader_epoch` (Kafka fails delayed produces on a leadership
    /// change the same way), up to `timeout`.
    pub async fn wait_for_commit(&self, offset: i64, leader_epoch: i32, timeout: Duration) -> CommitWait {
        // Subscribe first, so a change between the check and the wait still
        // wakes us. The state lock is never taken while the watch is borrowed:
        // appends hold the state lock while they publish on the watch.
        let mut rx = self.high_watermark_tx.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            {
                let st = self.state();
                // Committed in the epoch it was appended in, even if this
                // broker stopped leading since (a move took it out): an answer
                // of NOT_LEADER_OR_FOLLOWER would tell the client the records
                // were not written, and librdkafka believes it.
                if st.leader_epoch == leader_epoch && st.high_watermark > offset {
                    return CommitWait::Committed;
                }
                if !st.is_leader || st.leader_epoch != leader_epoch {
                    return CommitWait::NotLeader;
                }
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return CommitWait::NotLeader,
                Err(_) => return CommitWait::TimedOut,
            }
        }
    }

    /// A receiver that changes whenever the high watermark moves.
    pub fn subscribe(&self) -> watch::Receiver<i64> {
        self.high_watermark_tx.subscribe()
    }

    /// A receiver that changes on every append (and role change).
    pub fn subscribe_log_end(&self) -> watch::Receiver<i64> {
        self.log_end_tx.subscribe()
    }

    /// The periodic flush (`flush.ms`, and `flush.messages` where no
    /// appender asked for one).
    pub fn maybe_flush(&self) -> Result<bool, LogError> {
        if !self.flush_policy.load(Ordering::Acquire) {
            return Ok(false);
        }
        let ticket = {
            let mut st = self.state();
            if !st.log.flush_due(wall_ms()) {
                return Ok(false);
            }
            st.log.flush_ticket()?
        };
        // The fsync is made without the lock, as the group commit's is.
        ticket.sync()?;
        let mut st = self.state();
        st.log.flushed(&ticket);
        self.flushed_under_lock(st);
        Ok(true)
    }

    pub fn flush(&self) -> Result<(), LogError> {
        let mut st = self.state();
        st.log.flush()?;
        self.flushed_under_lock(st);
        Ok(())
    }

    /// Swaps in what a compaction pass wrote, one segment per hold of the
    /// locks, so appends and reads wait for at most one segment's renames.
    /// The writer lock is held too: a producer snapshot taken at a roll
    /// meanwhile must not keep an aborted transaction whose marker went.
    fn install_compacted(&self, result: CompactionResult) -> Result<(), LogError> {
        let aborted_before = self.state().log.aborted_txns().len();
        for i in 0..result.rewritten_len() {
            let _writer = self.writer();
            let mut st = self.state();
            if st.removed {
                return Ok(());
            }
            st.log.install_compacted_segment(&result, i, wall_ms())?;
        }
        let _writer = self.writer();
        let mut st = self.state();
        if st.removed {
            return Ok(());
        }
        st.log.finish_compaction(result)?;
        if st.log.aborted_txns().len() != aborted_before {
            let current: std::collections::HashSet<_> = st.log.aborted_txns().iter().copied().collect();
            let dir = st.log.dir().to_path_buf();
            if let Err(e) = producer_snapshot::retain_aborted(&dir, |t| current.contains(t)) {
                tracing::warn!(topic = %self.topic, partition = self.index, error = %e,
                    "rewriting producer snapshots after compaction failed");
            }
        }
        Ok(())
    }

    /// Compaction (where `cleanup.policy` has it), then retention. Blocks
    /// on disk: call it off the async threads. Compaction reads and writes
    /// segments without the partition's lock (see [`crate::log::compaction`]).
    pub fn apply_retention(&self, stopping: &dyn Fn() -> bool) -> Result<(), LogError> {
        let plan = {
            let mut st = self.state();
            let stable = Self::last_stable_offset(&mut st);
            st.log.plan_compaction(stable, wall_ms())?
        };
        if let Some(plan) = plan {
            match crate::log::compaction::clean(&plan, std::time::SystemTime::now(), stopping) {
                Ok(result) => self.install_compacted(result)?,
                Err(e) => {
                    tracing::warn!(topic = %self.topic, partition = self.index, error = %e, "compaction failed");
                }
            }
        }
        let mut st = self.state();
        if st.removed {
            return Ok(());
        }
        let hw = st.high_watermark;
        let out = st.log.apply_retention(wall_ms(), hw)?;
        if out.deleted_segments > 0 {
            producer_snapshot::delete_before(st.log.dir(), st.log.log_start_offset());
            tracing::info!(topic = %self.topic, partition = self.index, segments = out.deleted_segments,
                bytes = out.deleted_bytes, log_start_offset = st.log.log_start_offset(), "retention deleted segments");
        }
        Ok(())
    }

    pub fn recovery_point(&self) -> i64 {
        self.state().log.recovery_point()
    }

    /// Takes the log out for closing or deleting.
    pub fn into_log(self) -> PartitionLog {
        self.state.into_inner().unwrap_or_else(|e| e.into_inner()).log
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::batch::test_batches::{build_batch, build_idempotent_batch};

    fn code_of(r: Result<AppendResult, PartitionError>) -> Result<i64, String> {
        r.map(|a| a.base_offset).map_err(|e| format!("{e:?}"))
    }

    #[test]
    fn a_batch_behind_one_refused_before_this_broker_led_is_refused_alike() {
        // librdkafka pipelines R1 and R2. R1 reaches this broker before it
        // learns it leads, R2 just after: R2's gap is R1 on its way back.
        let dir = tempfile::tempdir().expect("tempdir");
        let log = PartitionLog::open(dir.path(), "t", 0, LogConfig::default(), 0, 0).expect("open");
        let p = Partition::open("t", 0, 1, log).expect("partition");
        p.become_leader(1, 1, &[1], &[1]);
        let (r0, r1, r2) = (
            build_idempotent_batch(5, 9, 0, 0),
            build_idempotent_batch(5, 9, 0, 5),
            build_idempotent_batch(5, 9, 0, 10),
        );
        assert_eq!(code_of(p.append_as_leader(&r0, true)), Ok(0));
        p.become_follower(2, 2);
        assert!(matches!(p.append_as_leader(&r1, true), Err(PartitionError::NotLeader)));
        p.become_leader(3, 3, &[1], &[1]);
        let e = p.append_as_leader(&r2, true).expect_err("a gap");
        assert!(
            matches!(e, PartitionError::EarlierBatchRefused { why: Refusal::NotLeader, expected: 5 }),
            "retriable, not OUT_OF_ORDER_SEQUENCE_NUMBER: {e:?}"
        );
        // The client sends both again, in order.
        assert_eq!(code_of(p.append_as_leader(&r1, true)), Ok(5));
        assert_eq!(code_of(p.append_as_leader(&r2, true)), Ok(10));
        // A gap nothing explains is out of order, as in Kafka.
        let e = p.append_as_leader(&build_idempotent_batch(1, 9, 0, 40), true).expect_err("a gap");
        assert!(matches!(e, PartitionError::OutOfOrderSequence { expected: 15, got: 40 }), "{e:?}");
        // Too few in-sync replicas for R4, enough again for R5.
        p.set_config(LogConfig::default(), 2).expect("config");
        let e = p.append_as_leader(&build_idempotent_batch(1, 9, 0, 15), true).expect_err("refused");
        assert!(matches!(e, PartitionError::NotEnoughReplicas { .. }), "{e:?}");
        p.set_config(LogConfig::default(), 1).expect("config");
        let e = p.append_as_leader(&build_idempotent_batch(1, 9, 0, 16), true).expect_err("a gap");
        assert!(matches!(e, PartitionError::EarlierBatchRefused { why: Refusal::NotEnoughReplicas, expected: 15 }));
    }

    #[test]
    fn the_flush_timer_passes_over_a_log_without_a_flush_policy_until_it_gets_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Opened now: a segment created at time 0 would roll (and flush) at the next append.
        let log = PartitionLog::open(dir.path(), "t", 0, LogConfig::default(), 0, wall_ms()).expect("open");
        let p = Partition::open("t", 0, 1, log).expect("partition");
        p.become_leader(1, 1, &[1], &[1]);
        assert_eq!(code_of(p.append_as_leader(&build_batch(3, 1_000, &[7u8; 40]), true)), Ok(0));
        assert!(!p.maybe_flush().expect("flush"), "no flush.ms nor flush.messages: nothing to do");
        assert_eq!(p.recovery_point(), 0);
        // flush.messages=2 with 3 records unflushed: the next pass flushes them.
        p.set_config(LogConfig { flush_messages: Some(2), ..LogConfig::default() }, 1).expect("config");
        assert!(p.maybe_flush().expect("flush"));
        assert_eq!(p.recovery_point(), 3);
        // And back to no policy.
        p.set_config(LogConfig::default(), 1).expect("config");
        assert_eq!(code_of(p.append_as_leader(&build_batch(3, 2_000, &[7u8; 40]), true)), Ok(3));
        assert!(!p.maybe_flush().expect("flush"));
        assert_eq!(p.recovery_point(), 3);
    }

    #[test]
    fn a_replica_back_outside_the_isr_fetches_again_before_it_joins() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut log = PartitionLog::open(dir.path(), "t", 0, LogConfig::default(), 0, 0).expect("open");
        for i in 0..3 {
            let batch = build_batch(3, 1_000 * (i + 1), &[7u8; 40]);
            log.append_as_leader(&batch, 1, 0).expect("append");
        }
        let end = log.log_end_offset();
        let p = Partition::open("t", 0, 1, log).expect("partition");
        p.become_leader(1, 1, &[1, 2, 3], &[1, 2, 3]);
        for follower in [2, 3] {
            p.read(end, 1 << 20, true, 1, Some(ReplicaFetch::now(follower)), false).expect("fetch");
        }
        assert_eq!(p.isr_proposal(10_000, |_| true), None);
        // The images this leader saw skip 3's removal: 3 is back, outside the ISR.
        p.become_leader(1, 3, &[1, 2], &[1, 2, 3]);
        assert_eq!(p.isr_proposal(10_000, |_| true), None, "3's position from before does not count");
        let r = p.read(0, 1 << 20, true, 1, Some(ReplicaFetch::now(3)), false).expect("fetch");
        assert!(!r.joins_isr);
        assert_eq!(p.isr_proposal(10_000, |_| true), None, "3 holds nothing yet");
        let r = p.read(end, 1 << 20, true, 1, Some(ReplicaFetch::now(3)), false).expect("fetch");
        assert!(r.joins_isr);
        assert_eq!(p.isr_proposal(10_000, |_| true).map(|(_, _, isr)| isr), Some(vec![1, 2, 3]));
    }

    #[test]
    fn a_fetch_waiting_while_its_replica_left_and_came_back_does_not_count() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut log = PartitionLog::open(dir.path(), "t", 0, LogConfig::default(), 0, 0).expect("open");
        log.append_as_leader(&build_batch(3, 1_000, &[7u8; 40]), 1, 0).expect("append");
        let end = log.log_end_offset();
        let p = Partition::open("t", 0, 1, log).expect("partition");
        p.become_leader(1, 1, &[1, 2, 3], &[1, 2, 3]);
        // 3 long-polls at the log end, caught up...
        let waiting = ReplicaFetch::now(3);
        p.read(end, 1 << 20, true, 1, Some(waiting), false).expect("fetch");
        // ...while it is moved away (it deletes its log) and straight back.
        p.become_leader(1, 2, &[1, 2], &[1, 2]);
        let r = p.read(end, 1 << 20, true, 1, Some(waiting), false).expect("fetch");
        assert!(!r.joins_isr, "not a replica");
        p.become_leader(1, 3, &[1, 2], &[1, 2, 3]);
        // The long-poll wakes and reads again with the position 3 had before.
        let r = p.read(end, 1 << 20, true, 1, Some(waiting), false).expect("fetch");
        assert!(!r.joins_isr, "3's log is empty now");
        assert_eq!(p.isr_proposal(10_000, |_| true), None);
        // 3's own fetches count again.
        p.read(0, 1 << 20, true, 1, Some(ReplicaFetch::now(3)), false).expect("fetch");
        assert_eq!(p.isr_proposal(10_000, |_| true), None, "3 holds nothing yet");
        let r = p.read(end, 1 << 20, true, 1, Some(ReplicaFetch::now(3)), false).expect("fetch");
        assert!(r.joins_isr);
        assert_eq!(p.isr_proposal(10_000, |_| true).map(|(_, _, isr)| isr), Some(vec![1, 2, 3]));
    }

    #[test]
    fn a_replica_asked_into_the_isr_holds_the_high_watermark_until_the_answer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut log = PartitionLog::open(dir.path(), "t", 0, LogConfig::default(), 0, 0).expect("open");
        log.append_as_leader(&build_batch(3, 1_000, &[7u8; 40]), 1, 0).expect("append");
        let p = Partition::open("t", 0, 1, log).expect("partition");
        p.become_leader(1, 1, &[1, 2], &[1, 2, 3]);
        p.read(3, 1 << 20, true, 1, Some(ReplicaFetch::now(2)), false).expect("fetch");
        assert_eq!(p.offsets().high_watermark, 3);
        p.read(3, 1 << 20, true, 1, Some(ReplicaFetch::now(3)), false).expect("fetch");
        assert_eq!(p.isr_proposal(10_000, |_| true).map(|(_, _, isr)| isr), Some(vec![1, 2, 3]));
        // The controller may commit 3 into the ISR before this leader hears of
        // it: an acknowledgement 3 does not hold could then be lost with it.
        p.append_as_leader(&build_batch(2, 2_000, &[8u8; 40]), true).expect("append");
        p.read(5, 1 << 20, true, 1, Some(ReplicaFetch::now(2)), false).expect("fetch");
        assert_eq!(p.offsets().high_watermark, 3, "3 is asked in and holds only 3 records");
        p.read(4, 1 << 20, true, 1, Some(ReplicaFetch::now(3)), false).expect("fetch");
        assert_eq!(p.offsets().high_watermark, 4);
        // Refused: 3 stops counting.
        p.isr_change_refused(1);
        assert_eq!(p.offsets().high_watermark, 5);
        assert_eq!(p.isr_proposal(10_000, |_| true), None, "3 is behind the high watermark now");
        // Caught up, asked again and applied: 3 counts as a member.
        p.read(5, 1 << 20, true, 1, Some(ReplicaFetch::now(3)), false).expect("fetch");
        p.isr_proposal(10_000, |_| true).expect("asks again");
        p.become_leader(1, 2, &[1, 2, 3], &[1, 2, 3]);
        p.append_as_leader(&build_batch(1, 3_000, &[9u8; 40]), true).expect("append");
        p.read(6, 1 << 20, true, 1, Some(ReplicaFetch::now(2)), false).expect("fetch");
        assert_eq!(p.offsets().high_watermark, 5);
        p.read(6, 1 << 20, true, 1, Some(ReplicaFetch::now(3)), false).expect("fetch");
        assert_eq!(p.offsets().high_watermark, 6);
    }

    #[test]
    fn a_follower_drops_records_of_an_epoch_the_leader_never_had() {
        // Seed 210: this replica led epoch 50 and wrote offset 20 in it; the new
        // leader had written its own offset 20 in epoch 49 and led next in epoch 53.
        let dir = tempfile::tempdir().expect("tempdir");
        let mut log = PartitionLog::open(dir.path(), "t", 0, LogConfig::default(), 0, 0).expect("open");
        for _ in 0..4 {
            log.append_as_leader(&build_batch(5, 1_000, &[1u8; 20]), 49, 0).expect("append");
        }
        log.append_as_leader(&build_batch(1, 1_000, &[2u8; 20]), 50, 0).expect("append");
        let p = Partition::open("t", 0, 4, log).expect("partition");
        p.become_follower(53, 1);
        // Asked for epoch 50, the leader answers epoch 49, ending at 21 (where its epoch 53 starts).
        p.truncate_to_leader_answer(53, 49, 21).expect("truncate");
        assert_eq!(p.offsets().log_end_offset, 20, "the epoch-50 record at 20 diverges and goes");
        // An answer for the epoch it asked about cuts at the smaller end only.
        p.become_follower(54, 2);
        p.truncate_to_leader_answer(54, 49, 25).expect("truncate");
        assert_eq!(p.offsets().log_end_offset, 20);
    }

    #[test]
    fn a_new_leader_refuses_latest_offsets_until_its_high_watermark_reaches_its_epoch() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut log = PartitionLog::open(dir.path(), "t", 0, LogConfig::default(), 0, 0).expect("open");
        let batch = build_batch(3, 1_000, &[7u8; 40]);
        log.append_as_leader(&batch, 1, 0).expect("append");
        let end = log.log_end_offset();
        let p = Partition::open("t", 0, 1, log).expect("partition");
        // Elected with records its old high watermark does not cover yet.
        p.become_leader(2, 1, &[1, 2], &[1, 2]);
        match p.offset_for(-1, -1, false) {
            Err(PartitionError::OffsetNotAvailable { epoch_start, .. }) => assert_eq!(epoch_start, end),
            other => panic!("expected OFFSET_NOT_AVAILABLE, got {other:?}"),
        }
        assert_eq!(partition_code(&p.offset_for(-2, -1, false)), 0, "earliest is answered");
        p.read(end, 1 << 20, true, 2, Some(ReplicaFetch::now(2)), false).expect("follower fetch");
        assert_eq!(p.offset_for(-1, -1, false).expect("latest"), (-1, end));
    }

    /// A leader of its own (ISR of one), holding one batch of 5 records.
    fn lone_leader(dir: &std::path::Path) -> Arc<Partition> {
        let log = PartitionLog::open(dir, "t", 0, LogConfig::default(), 0, wall_ms()).expect("open");
        let p = Partition::open("t", 0, 1, log).expect("partition");
        p.become_leader(1, 1, &[1], &[1]);
        assert_eq!(code_of(p.append_as_leader(&opaque_batch(5), true)), Ok(0));
        p
    }

    fn txn_batch(records: i32, producer_id: i64, base_sequence: i32) -> Vec<u8> {
        let mut batch = build_idempotent_batch(records, producer_id, 0, base_sequence);
        crate::log::batch::set_transactional_for_tests(&mut batch);
        batch
    }

    const ABORT: EndTxnMarker = EndTxnMarker { commit: false, coordinator_epoch: 1 };
    const COMMIT: EndTxnMarker = EndTxnMarker { commit: true, coordinator_epoch: 1 };

    #[test]
    fn read_committed_stops_at_open_transactions_and_learns_the_aborted_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = lone_leader(dir.path()); // offsets 0..5, no producer
        assert_eq!(code_of(p.append_as_leader(&txn_batch(2, 7, 0), true)), Ok(5));
        assert_eq!(code_of(p.append_as_leader(&txn_batch(3, 8, 0), true)), Ok(7));
        assert_eq!(code_of(p.append_as_leader(&txn_batch(1, 7, 2), true)), Ok(10));
        let read = |offset, committed| p.read(offset, 1 << 20, true, -1, None, committed).expect("read");
        let r = read(0, true);
        assert_eq!((r.high_watermark, r.last_stable_offset), (11, 5));
        assert_eq!(r.records.to_vec().expect("bytes").len(), opaque_batch(5).len(), "only the records before 5");
        assert_eq!(read(0, false).last_stable_offset, 5, "every answer says where the stable part ends");
        assert_eq!(p.offset_for(-1, -1, true).expect("latest"), (-1, 5));
        assert_eq!(p.offset_for(-1, -1, false).expect("latest"), (-1, 11));

        // Producer 7 aborts: its batches at 5 and 10 are aborted; 8 still holds the LSO.
        let marker = p.append_marker(7, 0, ABORT).expect("marker");
        assert_eq!(marker.base_offset, 11);
        let r = read(0, true);
        assert_eq!(r.last_stable_offset, 7, "producer 8's transaction from 7 is still open");
        let aborted = |r: &ReadResult| r.aborted.iter().map(|t| (t.producer_id, t.first_offset)).collect::<Vec<_>>();
        assert_eq!(aborted(&r), vec![(7, 5)]);
        assert_eq!(aborted(&read(0, false)), vec![], "read_uncommitted readers are told nothing");
        // A marker from a coordinator older than the one that wrote the abort is fenced.
        let stale = EndTxnMarker { commit: true, coordinator_epoch: 0 };
        assert!(matches!(
            p.append_marker(7, 0, stale),
            Err(PartitionError::TransactionCoordinatorFenced { current: 1 })
        ));
        p.append_marker(8, 0, COMMIT).expect("commit");
        let r = read(7, true);
        assert_eq!((r.last_stable_offset, r.high_watermark), (13, 13));
        assert_eq!(aborted(&r), vec![(7, 5)], "the read from 7 still holds producer 7's batch at 10");
        assert_eq!(aborted(&read(12, true)), vec![], "nothing aborted at or after 12");
        assert!(
            matches!(
                refuse_client_control_batches(&crate::log::txn::encode_marker(7, 0, COMMIT, 1).expect("encodes")),
                Err(PartitionError::Log(LogError::InvalidRecords(_)))
            ),
            "clients may not write markers"
        );
        drop(p);

        // Opened again (a restart): the aborted transaction and the LSO are rebuilt from the log.
        let log = PartitionLog::open(dir.path(), "t", 0, LogConfig::default(), 0, wall_ms()).expect("open");
        let p = Partition::open("t", 0, 1, log).expect("partition");
        p.become_leader(2, 2, &[1], &[1]);
        let r = p.read(0, 1 << 20, true, -1, None, true).expect("read");
        assert_eq!((r.last_stable_offset, aborted(&r)), (13, vec![(7, 5)]));
    }

    #[test]
    fn producer_state_comes_back_from_snapshots_taken_at_rolls() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Every batch rolls the segment (and so writes a snapshot).
        let config = LogConfig { segment_bytes: 100, ..LogConfig::default() };
        let open = |config: &LogConfig| {
            let log = PartitionLog::open(dir.path(), "t", 0, config.clone(), 0, wall_ms()).expect("open");
            let p = Partition::open("t", 0, 1, log).expect("partition");
            p.become_leader(1, 1, &[1], &[1]);
            p
        };
        let p = open(&config);
        p.append_as_leader(&txn_batch(2, 7, 0), true).expect("append"); // 0..1, open
        p.append_as_leader(&txn_batch(1, 8, 0), true).expect("append"); // 2
        p.append_marker(8, 0, ABORT).expect("abort"); // 3
        p.append_as_leader(&build_idempotent_batch(1, 9, 0, 0), true).expect("append"); // 4
        p.append_as_leader(&opaque_batch(1), true).expect("append"); // 5
        let snapshots = |d: &std::path::Path| {
            std::fs::read_dir(d)
                .expect("lists")
                .filter(|e| e.as_ref().is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".snapshot")))
                .count()
        };
        assert!(snapshots(&dir.path().join("t-0")) >= 3, "a snapshot at each roll");
        let before = p.read(0, 1 << 20, true, -1, None, true).expect("read");
        let producers = p.active_producers();
        drop(p);
        let p = open(&config);
        let after = p.read(0, 1 << 20, true, -1, None, true).expect("read");
        assert_eq!(
            (after.last_stable_offset, after.aborted.clone()),
            (before.last_stable_offset, before.aborted.clone())
        );
        assert_eq!(after.last_stable_offset, 0, "producer 7's transaction is still open");
        assert_eq!(p.active_producers(), producers);
        assert_eq!(
            code_of(p.append_as_leader(&build_idempotent_batch(1, 9, 0, 0), true)),
            Ok(4),
            "a retried batch is still known as a duplicate"
        );
        drop(p);
        // A truncation drops the snapshots past the new end.
        let p = open(&config);
        p.become_follower(2, 2);
        p.truncate_for_epoch(2, 3).expect("truncate");
        assert!(std::fs::read_dir(dir.path().join("t-0")).expect("lists").all(|e| {
            let name = e.expect("entry").file_name().to_string_lossy().into_owned();
            !name.ends_with(".snapshot") || name.trim_end_matches(".snapshot").parse::<i64>().is_ok_and(|o| o <= 3)
        }));
    }

    #[test]
    fn a_snapshots_aborted_transaction_whose_marker_left_the_log_is_not_brought_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Every batch rolls the segment (and so writes a snapshot).
        let config = LogConfig { segment_bytes: 100, ..LogConfig::default() };
        let open = || {
            let log = PartitionLog::open(dir.path(), "t", 0, config.clone(), 0, wall_ms()).expect("open");
            let p = Partition::open("t", 0, 1, log).expect("partition");
            p.become_leader(1, 1, &[1], &[1]);
            p
        };
        let p = open();
        p.append_as_leader(&txn_batch(2, 7, 0), true).expect("append"); // 0..1
        p.append_marker(7, 0, ABORT).expect("abort"); // 2
        p.append_as_leader(&opaque_batch(1), true).expect("append"); // 3
        p.append_as_leader(&opaque_batch(1), true).expect("append"); // 4, after a snapshot at 4
        drop(p);
        // As a compaction pass killed after it swapped in a segment without a
        // marker and before it rewrote the snapshots: the newest one also names
        // producer 9's transaction aborted at 3, where the log holds no marker.
        let part = dir.path().join("t-0");
        let (at, mut snapshot) = producer_snapshot::load_latest(&part, i64::MAX).expect("a snapshot");
        assert_eq!(at, 4);
        snapshot.aborted.push(AbortedTxn { producer_id: 9, first_offset: 3, last_offset: 3, last_stable_offset: 4 });
        producer_snapshot::write(&part, at, &producer_snapshot::encode(&snapshot).expect("encodes")).expect("writes");
        let p = open();
        let aborted = |from: i64| -> Vec<(i64, i64)> {
            let r = p.read(from, 1 << 20, true, -1, None, true).expect("read");
            r.aborted.iter().map(|t| (t.producer_id, t.first_offset)).collect()
        };
        assert_eq!(aborted(0), vec![(7, 0)], "producer 7's marker is in the log");
        assert_eq!(aborted(3), vec![], "producer 9's is not");
    }

    #[test]
    fn a_follower_learns_transactions_from_what_it_replicates_and_forgets_cut_markers() {
        let dir = tempfile::tempdir().expect("tempdir");
        let leader = lone_leader(dir.path());
        leader.append_as_leader(&txn_batch(2, 7, 0), true).expect("append");
        leader.append_marker(7, 0, ABORT).expect("marker");
        let (all, _) = leader.read_local(0, 1 << 20, 1).expect("read");
        let follower_dir = tempfile::tempdir().expect("tempdir");
        let log = PartitionLog::open(follower_dir.path(), "t", 0, LogConfig::default(), 0, wall_ms()).expect("open");
        let f = Partition::open("t", 0, 2, log).expect("partition");
        f.become_follower(1, 1);
        f.append_as_follower(1, 0, &all, 8, 0).expect("replicate");
        // The leader dies; the follower's marker at 7 is cut, then it leads.
        f.truncate_for_epoch(1, 7).expect("truncate");
        f.become_leader(2, 2, &[2], &[2]);
        let r = f.read(0, 1 << 20, true, -1, None, true).expect("read");
        assert_eq!(r.last_stable_offset, 5, "producer 7's transaction is open again");
        assert!(r.aborted.is_empty());
        f.append_marker(7, 0, ABORT).expect("the coordinator writes the marker again");
        let r = f.read(0, 1 << 20, true, -1, None, true).expect("read");
        assert_eq!(r.last_stable_offset, 8);
        assert_eq!(
            r.aborted.iter().map(|t| (t.producer_id, t.first_offset, t.last_offset)).collect::<Vec<_>>(),
            vec![(7, 5, 7)]
        );
    }

    fn opaque_batch(records: i32) -> Vec<u8> {
        build_batch(records, 1_000, &[7u8; 40])
    }

    /// An opaque batch as a leader of `leader_epoch` sends it, at `base_offset`.
    fn leaders_batch(records: i32, base_offset: i64, leader_epoch: i32) -> Vec<u8> {
        let mut batch = opaque_batch(records);
        crate::log::batch::set_base_offset(&mut batch, base_offset);
        crate::log::batch::set_partition_leader_epoch(&mut batch, leader_epoch);
        batch
    }

    /// Starts an append of `records` on another thread and returns once it
    /// is placed and about to write, with the sender that lets it write.
    fn append_stopped_before_its_write(
        p: &Arc<Partition>,
        records: Vec<u8>,
    ) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<Result<AppendResult, PartitionError>>) {
        let (reached_tx, reached) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel();
        *p.write_gate.lock().expect("gate") = Some((reached_tx, release_rx));
        let appender = p.clone();
        let writing = std::thread::spawn(move || appender.append_as_leader(&records, true));
        reached.recv().expect("the append reached its write");
        (release, writing)
    }

    #[test]
    fn a_segment_a_roll_sealed_is_flushed_behind_the_append() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = LogConfig { segment_bytes: 1024, ..LogConfig::default() };
        let log = PartitionLog::open(dir.path(), "t", 0, config, 0, wall_ms()).expect("open");
        let p = Partition::open("t", 0, 1, log).expect("partition");
        p.become_leader(1, 1, &[1], &[1]);
        let big = build_batch(1, 1_000, &[7u8; 600]);
        p.append_as_leader(&big, true).expect("append");
        assert_eq!(p.recovery_point(), 0, "no flush asked for");
        p.append_as_leader(&big, true).expect("append that rolls");
        // Without a runtime the flush the roll asked for runs at once; with
        // one it runs on a blocking thread.
        assert_eq!(p.recovery_point(), 2, "the sealed segment and the new one are fsynced");
        assert_eq!(p.group_commit_flushes(), 1);
    }

    #[test]
    fn a_follower_append_fetched_for_another_log_end_is_refused_and_changes_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = lone_leader(dir.path());
        p.become_follower(2, 2);
        // Fetched at 8 on the word of an append made ahead that never landed:
        // the log still ends at 5.
        let fetched = leaders_batch(3, 8, 2);
        let answered = p.append_as_follower(2, 8, &fetched, 11, 0);
        assert!(
            matches!(answered, Err(PartitionError::FollowerOutOfStep { fetch_offset: 8, log_end_offset: 5 })),
            "{answered:?}"
        );
        assert_eq!(p.offsets().log_end_offset, 5);
        assert_eq!(p.offsets().high_watermark, 5, "a refused answer does not move the high watermark either");
        // Fetched at the log end, the same batch (past a gap, as a compacted
        // leader may send it) is appended.
        assert_eq!(p.append_as_follower(2, 5, &fetched, 11, 0).expect("append"), None);
        assert_eq!(p.offsets().log_end_offset, 11);
    }

    #[test]
    fn a_follower_elected_while_writing_leaves_the_old_leaders_records_out_of_its_log_and_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = lone_leader(dir.path());
        p.become_follower(2, 2);
        let fetched = leaders_batch(3, 5, 2);
        let (reached_tx, reached) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel();
        *p.write_gate.lock().expect("gate") = Some((reached_tx, release_rx));
        let appending = {
            let p = p.clone();
            std::thread::spawn(move || p.append_as_follower(2, 5, &fetched, 8, 0))
        };
        reached.recv().expect("the append reached its write");
        p.become_leader(3, 3, &[1], &[1]);
        release.send(()).expect("release");
        let answered = appending.join().expect("no panic");
        assert!(matches!(answered, Err(PartitionError::NotLeader)), "{answered:?}");
        assert_eq!(p.offsets().log_end_offset, 5, "its epoch began at 5: nothing after it from the old leader");
        let segment = dir.path().join("t-0").join(crate::log::segment::segment_file_name(0, ".log"));
        let file_len = std::fs::metadata(segment).expect("segment").len();
        assert_eq!(file_len, opaque_batch(5).len() as u64, "the written bytes were cut back");
        assert_eq!(code_of(p.append_as_leader(&opaque_batch(1), true)), Ok(5));
    }

    #[test]
    fn reads_and_leadership_go_on_while_an_append_writes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = lone_leader(dir.path());
        let (release, writing) = append_stopped_before_its_write(&p, opaque_batch(3));
        // The append holds no lock these need while it writes: each returns
        // (a held lock would hang this test), and none sees the records yet.
        let offsets = p.offsets();
        assert_eq!((offsets.log_end_offset, offsets.high_watermark), (5, 5));
        let read = p.read(0, 1 << 20, true, -1, None, false).expect("read");
        assert_eq!(read.high_watermark, 5);
        assert_eq!(read.records.len(), opaque_batch(5).len(), "only the first batch");
        assert!(p.is_leader());
        release.send(()).expect("release");
        let appended = writing.join().expect("no panic").expect("appended");
        assert_eq!((appended.base_offset, appended.last_offset), (5, 7));
        let offsets = p.offsets();
        assert_eq!((offsets.log_end_offset, offsets.high_watermark), (8, 8));
        let read = p.read(5, 1 << 20, true, -1, None, false).expect("read");
        assert_eq!(read.records.len(), opaque_batch(3).len(), "the second batch, once written");
    }

    #[test]
    fn a_leader_deposed_while_writing_answers_not_leader_and_truncation_waits_for_the_write() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = lone_leader(dir.path());
        let (release, writing) = append_stopped_before_its_write(&p, opaque_batch(3));
        p.become_follower(2, 2);
        // The new leader's answer comes while the write is still going:
        // the truncation waits for it, then cuts the records it wrote.
        let truncating = {
            let p = p.clone();
            std::thread::spawn(move || p.truncate_for_epoch(2, 5))
        };
        release.send(()).expect("release");
        let answered = writing.join().expect("no panic");
        assert!(matches!(answered, Err(PartitionError::NotLeader)), "{answered:?}");
        truncating.join().expect("no panic").expect("truncated");
        assert_eq!(p.offsets().log_end_offset, 5, "the deposed leader's suffix is gone");
        let leader_records = leaders_batch(2, 5, 2);
        assert_eq!(p.append_as_follower(2, 5, &leader_records, 7, 0).expect("follower append"), None);
        assert_eq!(p.offsets().log_end_offset, 7);
    }

    fn fsync_each_leader(dir: &std::path::Path, isr: &[i32]) -> Arc<Partition> {
        let config = LogConfig { flush_messages: Some(1), ..LogConfig::default() };
        // Opened now: a segment created at time 0 would roll (and fsync) at once.
        let log = PartitionLog::open(dir, "t", 0, config, 0, wall_ms()).expect("open");
        let p = Partition::open("t", 0, 1, log).expect("partition");
        p.become_leader(1, 1, isr, isr);
        p
    }

    #[test]
    fn appends_that_arrive_during_a_flush_share_the_next_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = fsync_each_leader(dir.path(), &[1]);
        // A flush is running: the ten appends only ask for another.
        p.commit.lock().expect("lock").running = true;
        let mut ends = Vec::new();
        for _ in 0..10 {
            let r = p.append_as_leader(&build_batch(2, 1_000, b"r"), true).expect("append");
            ends.push(r.durable_end.expect("flush.messages=1 waits for the flush"));
        }
        assert_eq!(ends.last(), Some(&20));
        assert_eq!((p.recovery_point(), p.offsets().high_watermark), (0, 0), "nothing counts before its fsync");
        // The running flush ends; the one asked for covers all ten.
        p.run_flushes();
        assert_eq!(p.group_commit_flushes(), 1);
        assert_eq!((p.recovery_point(), p.offsets().high_watermark), (20, 20));
        assert!(!p.commit.lock().expect("lock").running);
    }

    /// One synchronous appender per partition, its waits racing the flushes
    /// that end them. A stress guard: the race bench/loadgen.rs found (a
    /// flush that ended between a waiter's look at the log and its look at
    /// the flush count was taken as seen, and the waiter slept to its
    /// deadline) needs a narrower window than this test hits reliably.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_wait_for_a_flush_misses_its_end() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut tasks = Vec::new();
        for i in 0..8 {
            let p = fsync_each_leader(&dir.path().join(format!("p{i}")), &[1]);
            tasks.push(tokio::spawn(async move {
                let batch = build_batch(1, 1_000, b"r");
                for n in 0..1000 {
                    let r = p.append_as_leader(&batch, true).expect("append");
                    let end = r.durable_end.expect("flush.messages=1 waits for the flush");
                    let waited = std::time::Instant::now();
                    let outcome = p.wait_durable(end, r.leader_epoch, Duration::from_secs(5)).await;
                    assert_eq!(outcome, DurableWait::Durable, "append {n}: waited {:?}", waited.elapsed());
                }
            }));
        }
        for t in tasks {
            t.await.expect("appender");
        }
    }

    #[tokio::test]
    async fn an_acknowledgement_waits_for_the_leaders_fsync_and_the_followers() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = fsync_each_leader(dir.path(), &[1, 2]);
        let r = p.append_as_leader(&build_batch(3, 1_000, b"r"), true).expect("append");
        let wait = Duration::from_secs(5);
        assert_eq!(p.wait_durable(3, r.leader_epoch, wait).await, DurableWait::Durable);
        assert_eq!(p.offsets().high_watermark, 0, "the follower has not fetched past it");
        p.read(3, 1 << 20, true, 1, Some(ReplicaFetch::now(2)), false).expect("follower fetch");
        assert_eq!(p.wait_for_commit(r.last_offset, r.leader_epoch, wait).await, CommitWait::Committed);
        // Another epoch: the wait ends without the records counted durable.
        p.commit.lock().expect("lock").running = true;
        let r = p.append_as_leader(&build_batch(1, 1_000, b"r"), false).expect("append");
        p.become_follower(2, 2);
        assert_eq!(p.wait_durable(4, r.leader_epoch, wait).await, DurableWait::NotLeader);
    }

    #[test]
    fn a_follower_fetches_again_only_after_its_flush() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = LogConfig { flush_messages: Some(1), ..LogConfig::default() };
        let log = PartitionLog::open(dir.path(), "t", 0, config, 0, 0).expect("open");
        let p = Partition::open("t", 0, 2, log).expect("partition");
        p.become_follower(1, 1);
        let mut batch = build_batch(3, 1_000, b"r");
        crate::log::batch::set_partition_leader_epoch(&mut batch, 1);
        // No runtime here: the flush runs inline.
        assert_eq!(p.append_as_follower(1, 0, &batch, 0, 0).expect("append"), Some(3));
        assert_eq!(p.recovery_point(), 3);
        let without = Partition::open(
            "u",
            0,
            2,
            PartitionLog::open(dir.path(), "u", 0, LogConfig::default(), 0, 0).expect("open"),
        )
        .expect("partition");
        without.become_follower(1, 1);
        assert_eq!(without.append_as_follower(1, 0, &batch, 0, 0).expect("append"), None);
    }

    fn partition_code(r: &Result<(i64, i64), PartitionError>) -> i16 {
        r.as_ref().map_or_else(crate::kafka::handlers::partition_error_code, |_| 0)
    }
}
