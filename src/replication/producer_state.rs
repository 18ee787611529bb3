//! Idempotent and transactional producer state of one partition: for each
//! producer id, its epoch, the last few batches' sequence ranges and
//! offsets, and its open transaction here (KIP-98).
//!
//! Pure logic: the partition asks [`ProducerStateMap::check`] before an
//! append and calls [`ProducerStateMap::record`] after it. A retried batch is
//! answered with its original offsets; a gap is OUT_OF_ORDER_SEQUENCE_NUMBER.
//! A transactional batch opens the producer's transaction in this partition
//! (if none is open) at its base offset; an end-transaction marker
//! ([`ProducerStateMap::end_txn`]) closes it. The first offset of the oldest
//! transaction still undecided, or decided by a marker the high watermark
//! has not passed yet, bounds the last stable offset (what `read_committed`
//! consumers may read). Rebuilt from batch headers (and markers) when the
//! log is opened.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::log::batch::{split_record_set, BatchError, BatchHeader};
use crate::log::txn::{decode_marker, EndTxnMarker};

/// Kafka keeps this many recent batches per producer for duplicate checks.
pub const BATCHES_KEPT: usize = 5;
/// More producer ids than this in one partition are forgotten oldest-first
/// (never one with a transaction open here).
pub const PRODUCERS_MAX: usize = 10_000;
/// Transactions ended lately, kept per producer so that a truncation that
/// cuts their markers opens them again.
const ENDED_KEPT: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BatchMeta {
    pub first_seq: i32,
    pub last_seq: i32,
    pub base_offset: i64,
    pub last_offset: i64,
    /// The batch's max timestamp (the append time on a LogAppendTime topic).
    pub max_timestamp: i64,
}

/// One producer as DescribeProducers answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActiveProducer {
    pub producer_id: i64,
    pub epoch: i16,
    pub last_sequence: i32,
    pub last_timestamp: i64,
    /// The coordinator epoch of its last marker here (-1: none).
    pub coordinator_epoch: i32,
    /// The first offset of its open transaction here (-1: none).
    pub current_txn_start_offset: i64,
}

/// A transaction a marker ended in this partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompletedTxn {
    pub producer_id: i64,
    /// Its first batch's offset here.
    pub first_offset: i64,
    /// The marker's offset.
    pub last_offset: i64,
    pub aborted: bool,
    /// The first offset of the oldest transaction still open here once
    /// this one ended (the marker's next offset if none).
    pub last_stable_offset: i64,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct ProducerEntry {
    epoch: i16,
    batches: VecDeque<BatchMeta>,
    last_offset: i64,
    coordinator_epoch: i32,
    /// The first offset of this producer's open transaction here.
    txn_first_offset: Option<i64>,
    /// Transactions ended lately: (first offset, marker offset), oldest first.
    ended: VecDeque<(i64, i64)>,
    /// The sequence expected next when a truncation cut every batch
    /// remembered: the first one cut (its predecessor, too old to be kept,
    /// ended just before it). Cleared by the next batch.
    resume_seq: Option<i32>,
}

impl Default for ProducerEntry {
    fn default() -> Self {
        Self {
            epoch: 0,
            batches: VecDeque::new(),
            last_offset: -1,
            coordinator_epoch: -1,
            txn_first_offset: None,
            ended: VecDeque::new(),
            resume_seq: None,
        }
    }
}

impl ProducerEntry {
    /// A new producer epoch starts its sequences over.
    fn set_epoch(&mut self, epoch: i16) {
        if epoch != self.epoch {
            self.batches.clear();
            self.resume_seq = None;
            self.epoch = epoch;
        }
    }
}

/// What to do with an incoming batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqCheck {
    Append,
    /// Already in the log: answer with these offsets, append nothing.
    Duplicate(BatchMeta),
    OutOfOrder {
        expected: i32,
        got: i32,
    },
    /// The producer's epoch is older than one already seen.
    FencedEpoch {
        current: i16,
    },
}

/// Why a marker may not be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerCheck {
    Append,
    /// The producer's epoch here is newer than the marker's.
    FencedEpoch {
        current: i16,
    },
    /// A newer transaction coordinator wrote a marker here already.
    FencedCoordinator {
        current: i32,
    },
}

#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct ProducerStateMap {
    producers: HashMap<i64, ProducerEntry>,
    /// Open transactions: first offset → producer id.
    open: BTreeMap<i64, i64>,
    /// Ended transactions whose marker the high watermark had not passed
    /// when last asked: marker offset → first offset.
    unreplicated: BTreeMap<i64, i64>,
}

fn next_seq(seq: i32) -> i32 {
    if seq == i32::MAX {
        0
    } else {
        seq + 1
    }
}

impl ProducerStateMap {
    pub fn check(&self, producer_id: i64, epoch: i16, first_seq: i32, last_seq: i32) -> SeqCheck {
        if producer_id < 0 {
            return SeqCheck::Append;
        }
        let Some(entry) = self.producers.get(&producer_id) else {
            // A producer we have never seen starts at sequence 0.
            return if first_seq == 0 {
                SeqCheck::Append
            } else {
                SeqCheck::OutOfOrder { expected: 0, got: first_seq }
            };
        };
        if epoch < entry.epoch {
            return SeqCheck::FencedEpoch { current: entry.epoch };
        }
        if epoch > entry.epoch {
            return if first_seq == 0 {
                SeqCheck::Append
            } else {
                SeqCheck::OutOfOrder { expected: 0, got: first_seq }
            };
        }
        if let Some(b) = entry.batches.iter().find(|b| b.first_seq == first_seq && b.last_seq == last_seq) {
            return SeqCheck::Duplicate(*b);
        }
        let expected = entry.batches.back().map_or(entry.resume_seq.unwrap_or(0), |b| next_seq(b.last_seq));
        if first_seq == expected {
            SeqCheck::Append
        } else {
            SeqCheck::OutOfOrder { expected, got: first_seq }
        }
    }

    /// Whether a marker of `producer_id` at `epoch` from a coordinator at
    /// `coordinator_epoch` may be written (Kafka fences older ones of both).
    pub fn check_marker(&self, producer_id: i64, epoch: i16, coordinator_epoch: i32) -> MarkerCheck {
        match self.producers.get(&producer_id) {
            Some(e) if epoch < e.epoch => MarkerCheck::FencedEpoch { current: e.epoch },
            Some(e) if coordinator_epoch < e.coordinator_epoch => {
                MarkerCheck::FencedCoordinator { current: e.coordinator_epoch }
            }
            _ => MarkerCheck::Append,
        }
    }

    /// The entry of `producer_id`, made room for when new: the producer
    /// with the oldest last write and no open transaction is forgotten.
    fn entry(&mut self, producer_id: i64) -> &mut ProducerEntry {
        if !self.producers.contains_key(&producer_id) && self.producers.len() >= PRODUCERS_MAX {
            let oldest = self
                .producers
                .iter()
                .filter(|(_, e)| e.txn_first_offset.is_none())
                .min_by_key(|(_, e)| e.last_offset)
                .map(|(id, _)| *id);
            if let Some(oldest) = oldest {
                self.producers.remove(&oldest);
            }
        }
        self.producers.entry(producer_id).or_default()
    }

    /// Records an appended batch; a transactional one opens its producer's
    /// transaction here if none is open.
    pub fn record(&mut self, producer_id: i64, epoch: i16, batch: BatchMeta, transactional: bool) {
        if producer_id < 0 {
            return;
        }
        let entry = self.entry(producer_id);
        entry.set_epoch(epoch);
        entry.batches.push_back(batch);
        entry.resume_seq = None;
        while entry.batches.len() > BATCHES_KEPT {
            entry.batches.pop_front();
        }
        entry.last_offset = batch.last_offset;
        if transactional && entry.txn_first_offset.is_none() {
            entry.txn_first_offset = Some(batch.base_offset);
            self.open.insert(batch.base_offset, producer_id);
        }
    }

    /// Records a marker appended at `offset`: the producer's transaction
    /// here (if it wrote anything) ends; its epoch and coordinator epoch
    /// become the marker's.
    pub fn end_txn(&mut self, producer_id: i64, epoch: i16, marker: EndTxnMarker, offset: i64) -> Option<CompletedTxn> {
        let entry = self.entry(producer_id);
        entry.set_epoch(epoch);
        entry.coordinator_epoch = marker.coordinator_epoch;
        entry.last_offset = offset;
        let first_offset = entry.txn_first_offset.take()?;
        entry.ended.push_back((first_offset, offset));
        while entry.ended.len() > ENDED_KEPT {
            entry.ended.pop_front();
        }
        self.open.remove(&first_offset);
        self.unreplicated.insert(offset, first_offset);
        let last_stable_offset = self.open.keys().next().map_or(offset + 1, |first| (*first).min(offset + 1));
        Some(CompletedTxn {
            producer_id,
            first_offset,
            last_offset: offset,
            aborted: !marker.commit,
            last_stable_offset,
        })
    }

    /// Records every producer batch and marker in `records` (batches
    /// already in the log: rebuilt on open, or replicated from the leader);
    /// returns the transactions the markers ended.
    pub fn record_batches(&mut self, records: &[u8]) -> Result<Vec<CompletedTxn>, BatchError> {
        let mut ended = Vec::new();
        for range in split_record_set(records)? {
            let bytes = &records[range];
            let h = BatchHeader::parse(bytes)?;
            if h.producer_id() < 0 {
                continue;
            }
            if h.is_control() {
                match decode_marker(bytes) {
                    Some(marker) => {
                        ended.extend(self.end_txn(h.producer_id(), h.producer_epoch(), marker, h.base_offset()))
                    }
                    None => tracing::warn!(
                        offset = h.base_offset(),
                        producer_id = h.producer_id(),
                        "a control batch that is no end-transaction marker; ignored"
                    ),
                }
            } else if h.base_sequence() >= 0 {
                let meta = BatchMeta {
                    first_seq: h.base_sequence(),
                    last_seq: h.base_sequence().wrapping_add(h.last_offset_delta()),
                    base_offset: h.base_offset(),
                    last_offset: h.last_offset(),
                    max_timestamp: h.max_timestamp(),
                };
                self.record(h.producer_id(), h.producer_epoch(), meta, h.is_transactional());
            }
        }
        Ok(ended)
    }

    /// The first offset a `read_committed` reader may not pass below a
    /// high watermark of `high_watermark`: that of the oldest transaction
    /// open here, or ended by a marker at or past the high watermark (a
    /// marker not yet replicated may still be cut). `None`: nothing holds
    /// readers back. Forgets ended transactions the high watermark passed.
    pub fn first_unstable_offset(&mut self, high_watermark: i64) -> Option<i64> {
        while let Some(entry) = self.unreplicated.first_entry() {
            if *entry.key() >= high_watermark {
                break;
            }
            entry.remove();
        }
        let open = self.open.keys().next().copied();
        let ended = self.unreplicated.values().min().copied();
        open.into_iter().chain(ended).min()
    }

    /// Forgets batches at or above `offset` (the log was truncated there):
    /// transactions begun there are gone, and those whose marker was cut
    /// are open again.
    pub fn truncate_to(&mut self, offset: i64) {
        for entry in self.producers.values_mut() {
            // Sequences of one epoch follow on: when every batch remembered
            // is cut, the producer goes on from the first one cut, not from 0
            // (a librdkafka producer told OUT_OF_ORDER_SEQUENCE_NUMBER fails
            // for good; found by the fault harness, seed 1).
            let first_cut = entry.batches.iter().find(|b| b.last_offset >= offset).map(|b| b.first_seq);
            entry.batches.retain(|b| b.last_offset < offset);
            if entry.batches.is_empty() {
                // (A producer's first batches cut: it starts over at 0 anyway.)
                entry.resume_seq = first_cut.filter(|seq| *seq > 0).or(entry.resume_seq);
            }
            if entry.txn_first_offset.is_some_and(|first| first >= offset) {
                entry.txn_first_offset = None;
            }
            while entry.ended.back().is_some_and(|&(_, marker)| marker >= offset) {
                if let Some((first, _)) = entry.ended.pop_back().filter(|&(first, _)| first < offset) {
                    entry.txn_first_offset = Some(first);
                }
            }
        }
        self.producers.retain(|_, e| !e.batches.is_empty() || e.txn_first_offset.is_some() || e.resume_seq.is_some());
        self.open = self.producers.iter().filter_map(|(id, e)| e.txn_first_offset.map(|first| (first, *id))).collect();
        self.unreplicated.retain(|&marker, _| marker < offset);
    }

    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }

    /// Whether `producer_id` has a transaction open here at `epoch`.
    pub fn has_open_txn(&self, producer_id: i64, epoch: i16) -> bool {
        self.producers.get(&producer_id).is_some_and(|e| e.epoch == epoch && e.txn_first_offset.is_some())
    }

    /// Every producer with a batch remembered, by producer id: its epoch and
    /// its last batch's last sequence and max timestamp.
    pub fn active(&self) -> Vec<ActiveProducer> {
        let mut out: Vec<ActiveProducer> = self
            .producers
            .iter()
            .filter_map(|(&producer_id, e)| {
                let last = e.batches.back()?;
                Some(ActiveProducer {
                    producer_id,
                    epoch: e.epoch,
                    last_sequence: last.last_seq,
                    last_timestamp: last.max_timestamp,
                    coordinator_epoch: e.coordinator_epoch,
                    current_txn_start_offset: e.txn_first_offset.unwrap_or(-1),
                })
            })
            .collect();
        out.sort_unstable_by_key(|p| p.producer_id);
        out
    }
}

/// Why a partition refused a producer's batch without appending it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    NotLeader,
    NotEnoughReplicas,
    Storage,
}

/// A refusal explains a later gap for this long.
pub const REFUSAL_MEMORY_MS: i64 = 10_000;
/// Producers remembered at once; more and the oldest refusal is forgotten.
const REFUSALS_MAX: usize = 10_000;

#[derive(Debug, Clone, Copy)]
struct Refused {
    epoch: i16,
    first_seq: i32,
    why: Refusal,
    at_ms: i64,
}

/// The batches this partition refused with a retriable error, per producer:
/// the first one of each producer's run of refusals.
///
/// A client that pipelines sends R1 and R2 back to back. When R1 is refused
/// (this broker was not yet the leader, or too few replicas were in sync)
/// and the reason is gone by the time R2 arrives, R2 leaves a gap where R1
/// belongs. Kafka answers OUT_OF_ORDER_SEQUENCE_NUMBER, and librdkafka
/// answers that by bumping its producer epoch and renumbering every
/// unacknowledged message, in every partition, including messages another
/// leader appended and lost the answer of: those are then stored twice. The
/// gap is not a lost batch but R1 on its way back, so R2 gets R1's retriable
/// error instead, and the client retries both in order.
#[derive(Debug, Clone, Default)]
pub struct Refusals {
    by_producer: HashMap<i64, Refused>,
}

impl Refusals {
    /// Notes that the batch of `producer_id` starting at `first_seq` was refused.
    pub fn note(&mut self, producer_id: i64, epoch: i16, first_seq: i32, why: Refusal, now_ms: i64) {
        if producer_id < 0 || first_seq < 0 {
            return;
        }
        if let Some(r) = self.by_producer.get_mut(&producer_id) {
            // The run of refusals is explained from its first batch on.
            let fresh = now_ms.saturating_sub(r.at_ms) < REFUSAL_MEMORY_MS;
            if fresh && r.epoch == epoch && r.first_seq <= first_seq {
                r.at_ms = now_ms;
                return;
            }
        } else if self.by_producer.len() >= REFUSALS_MAX {
            if let Some(oldest) = self.by_producer.iter().min_by_key(|(_, r)| r.at_ms).map(|(id, _)| *id) {
                self.by_producer.remove(&oldest);
            }
        }
        self.by_producer.insert(producer_id, Refused { epoch, first_seq, why, at_ms: now_ms });
    }

    /// Why the batch expected next, at `expected`, is missing, when this
    /// partition refused it lately.
    pub fn explains(&self, producer_id: i64, epoch: i16, expected: i32, now_ms: i64) -> Option<Refusal> {
        let r = self.by_producer.get(&producer_id)?;
        let fresh = now_ms.saturating_sub(r.at_ms) < REFUSAL_MEMORY_MS;
        (fresh && r.epoch == epoch && r.first_seq == expected).then_some(r.why)
    }

    /// The producer's batches are appended again.
    pub fn forget(&mut self, producer_id: i64) {
        if !self.by_producer.is_empty() {
            self.by_producer.remove(&producer_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn active_producers_show_their_last_batch() {
        let mut m = ProducerStateMap::default();
        m.record(7, 2, meta(0, 4, 10), false);
        m.record(7, 2, meta(5, 9, 15), false);
        m.record(3, 0, meta(0, 0, 20), false);
        assert_eq!(m.active(), vec![active(3, 0, 0, 1_020), active(7, 2, 9, 1_015),]);
        // Truncated batches are forgotten, and so is a producer left with none.
        m.truncate_to(15);
        assert_eq!(m.active(), vec![active(7, 2, 4, 1_010)]);
    }

    #[test]
    fn a_gap_where_a_refused_batch_belongs_is_explained_for_a_while() {
        let mut r = Refusals::default();
        r.note(7, 0, 10, Refusal::NotLeader, 1_000);
        // R2 and R3 refused too: the run is explained from R1 on.
        r.note(7, 0, 15, Refusal::NotEnoughReplicas, 1_001);
        assert_eq!(r.explains(7, 0, 10, 1_002), Some(Refusal::NotLeader));
        assert_eq!(r.explains(7, 0, 15, 1_002), None, "the gap starts at R1, not R2");
        assert_eq!(r.explains(7, 1, 10, 1_002), None, "another producer epoch");
        assert_eq!(r.explains(8, 0, 10, 1_002), None, "another producer");
        assert_eq!(r.explains(7, 0, 10, 1_001 + REFUSAL_MEMORY_MS), None, "forgotten after a while");
        r.forget(7);
        assert_eq!(r.explains(7, 0, 10, 1_002), None, "appended since");
        r.note(-1, -1, -1, Refusal::Storage, 0);
        assert_eq!(r.explains(-1, -1, -1, 0), None, "non-idempotent batches are not remembered");
        // A stale refusal is replaced by a new run's first batch.
        r.note(7, 0, 20, Refusal::Storage, 1_000);
        r.note(7, 0, 30, Refusal::NotLeader, 1_000 + REFUSAL_MEMORY_MS);
        assert_eq!(r.explains(7, 0, 30, 1_001 + REFUSAL_MEMORY_MS), Some(Refusal::NotLeader));
    }

    fn active(producer_id: i64, epoch: i16, last_sequence: i32, last_timestamp: i64) -> ActiveProducer {
        ActiveProducer {
            producer_id,
            epoch,
            last_sequence,
            last_timestamp,
            coordinator_epoch: -1,
            current_txn_start_offset: -1,
        }
    }

    fn meta(first: i32, last: i32, base: i64) -> BatchMeta {
        BatchMeta {
            first_seq: first,
            last_seq: last,
            base_offset: base,
            last_offset: base + (last - first) as i64,
            max_timestamp: 1_000 + base,
        }
    }

    #[test]
    fn sequences_duplicates_and_gaps() {
        let mut s = ProducerStateMap::default();
        assert_eq!(s.check(7, 0, 0, 4), SeqCheck::Append);
        s.record(7, 0, meta(0, 4, 100), false);
        assert_eq!(s.check(7, 0, 5, 9), SeqCheck::Append);
        s.record(7, 0, meta(5, 9, 105), false);
        assert_eq!(s.check(7, 0, 0, 4), SeqCheck::Duplicate(meta(0, 4, 100)), "a retry gets its offsets");
        assert_eq!(s.check(7, 0, 12, 13), SeqCheck::OutOfOrder { expected: 10, got: 12 });
        assert_eq!(s.check(8, 0, 3, 3), SeqCheck::OutOfOrder { expected: 0, got: 3 });
        assert_eq!(s.check(-1, -1, -1, -1), SeqCheck::Append, "non-idempotent producers are not checked");
    }

    #[test]
    fn epochs_fence_and_reset() {
        let mut s = ProducerStateMap::default();
        s.record(7, 2, meta(0, 0, 0), false);
        assert_eq!(s.check(7, 1, 1, 1), SeqCheck::FencedEpoch { current: 2 });
        assert_eq!(s.check(7, 3, 0, 0), SeqCheck::Append);
        assert_eq!(s.check(7, 3, 5, 5), SeqCheck::OutOfOrder { expected: 0, got: 5 });
    }

    #[test]
    fn only_recent_batches_are_kept_and_truncation_forgets() {
        let mut s = ProducerStateMap::default();
        for i in 0..10 {
            s.record(1, 0, meta(i, i, i as i64), false);
        }
        assert_eq!(s.check(1, 0, 0, 0), SeqCheck::OutOfOrder { expected: 10, got: 0 });
        assert!(matches!(s.check(1, 0, 9, 9), SeqCheck::Duplicate(_)));
        s.truncate_to(8);
        assert_eq!(s.check(1, 0, 8, 8), SeqCheck::Append);
        s.truncate_to(0);
        assert_eq!(s.check(1, 0, 5, 5), SeqCheck::Append, "it goes on from the first batch it remembered");
        let mut fresh = ProducerStateMap::default();
        fresh.record(2, 0, meta(0, 0, 0), false);
        fresh.truncate_to(0);
        assert!(fresh.is_empty(), "a producer whose first batch is cut is forgotten");
    }

    const COMMIT: EndTxnMarker = EndTxnMarker { commit: true, coordinator_epoch: 0 };
    const ABORT: EndTxnMarker = EndTxnMarker { commit: false, coordinator_epoch: 0 };

    #[test]
    fn open_transactions_hold_the_last_stable_offset_until_their_marker_is_replicated() {
        let mut s = ProducerStateMap::default();
        s.record(1, 0, meta(0, 1, 10), true);
        s.record(2, 0, meta(0, 0, 12), false);
        s.record(3, 0, meta(0, 0, 13), true);
        s.record(1, 0, meta(2, 2, 14), true);
        assert_eq!(s.first_unstable_offset(15), Some(10), "producer 1's transaction began at 10");
        assert_eq!(s.active()[0].current_txn_start_offset, 10);
        let ended = s.end_txn(1, 0, ABORT, 15);
        let txn =
            CompletedTxn { producer_id: 1, first_offset: 10, last_offset: 15, aborted: true, last_stable_offset: 13 };
        assert_eq!(ended, Some(txn), "producer 3's transaction is still open");
        assert_eq!(s.first_unstable_offset(15), Some(10), "the marker at 15 is not replicated yet");
        assert_eq!(s.first_unstable_offset(16), Some(13), "now producer 3's transaction holds it");
        assert_eq!(s.end_txn(3, 0, COMMIT, 16).map(|t| t.aborted), Some(false));
        assert_eq!(s.first_unstable_offset(17), None);
        assert_eq!(s.end_txn(2, 0, COMMIT, 17), None, "a marker for a producer with no records here ends nothing");
    }

    #[test]
    fn markers_fence_older_epochs_and_coordinators() {
        let mut s = ProducerStateMap::default();
        s.record(1, 0, meta(0, 0, 0), true);
        assert_eq!(s.check_marker(1, 0, 3), MarkerCheck::Append);
        s.end_txn(1, 1, EndTxnMarker { commit: false, coordinator_epoch: 3 }, 1);
        assert_eq!(s.check_marker(1, 0, 3), MarkerCheck::FencedEpoch { current: 1 });
        assert_eq!(s.check_marker(1, 1, 2), MarkerCheck::FencedCoordinator { current: 3 });
        assert_eq!(s.check(1, 0, 1, 1), SeqCheck::FencedEpoch { current: 1 }, "the abort bumped the epoch");
        assert_eq!(s.check(1, 1, 0, 0), SeqCheck::Append, "the new epoch starts at sequence 0");
        assert_eq!(s.check_marker(9, 0, 0), MarkerCheck::Append, "an unknown producer");
    }

    #[test]
    fn a_truncation_that_cuts_a_marker_opens_its_transaction_again() {
        let mut s = ProducerStateMap::default();
        s.record(1, 0, meta(0, 0, 0), true);
        s.end_txn(1, 0, COMMIT, 1);
        s.record(1, 0, meta(1, 1, 2), true);
        s.end_txn(1, 0, COMMIT, 3);
        s.record(1, 0, meta(2, 2, 4), true);
        assert_eq!(s.first_unstable_offset(5), Some(4));
        s.truncate_to(3);
        assert_eq!(s.first_unstable_offset(3), Some(2), "the marker at 3 is gone, the transaction at 2 is open");
        assert_eq!(s.check(1, 0, 2, 2), SeqCheck::Append, "the batch at 4 is forgotten");
        s.truncate_to(2);
        assert_eq!(s.first_unstable_offset(2), None, "the transaction began at the cut");
        s.truncate_to(1);
        assert_eq!(s.first_unstable_offset(1), Some(0));
    }

    #[test]
    fn record_batches_reads_markers() {
        use crate::log::batch::test_batches::build_idempotent_batch;
        let mut batch = build_idempotent_batch(2, 5, 0, 0);
        crate::log::batch::set_transactional_for_tests(&mut batch);
        let mut marker = crate::log::txn::encode_marker(5, 0, ABORT, 1_000).expect("encodes");
        crate::log::batch::set_base_offset(&mut marker, 2);
        let mut s = ProducerStateMap::default();
        assert_eq!(s.record_batches(&batch).expect("valid"), vec![]);
        assert_eq!(s.first_unstable_offset(2), Some(0));
        let ended = s.record_batches(&marker).expect("valid");
        let txn =
            CompletedTxn { producer_id: 5, first_offset: 0, last_offset: 2, aborted: true, last_stable_offset: 3 };
        assert_eq!(ended, vec![txn]);
        assert_eq!(s.first_unstable_offset(3), None);
    }

    #[test]
    fn a_producer_whose_remembered_batches_are_all_cut_goes_on_from_the_first_cut() {
        let mut s = ProducerStateMap::default();
        for i in 0..10 {
            s.record(1, 0, meta(i, i, 100 + i as i64), false);
        }
        // Only seq 5..9 (offsets 105..109) are remembered; the leader loses them all.
        s.truncate_to(105);
        assert_eq!(s.check(1, 0, 5, 5), SeqCheck::Append, "the retry of the first cut batch");
        assert_eq!(s.check(1, 0, 7, 7), SeqCheck::OutOfOrder { expected: 5, got: 7 });
        assert_eq!(s.check(1, 1, 0, 0), SeqCheck::Append, "a new epoch starts at 0");
        s.record(1, 0, meta(5, 5, 105), false);
        assert_eq!(s.check(1, 0, 6, 6), SeqCheck::Append);
        // Cut again, below where the batches began: still from the first cut.
        s.truncate_to(90);
        assert_eq!(s.check(1, 0, 5, 5), SeqCheck::Append);
    }

    #[test]
    fn sequence_wraps() {
        let mut s = ProducerStateMap::default();
        s.record(1, 0, meta(i32::MAX - 1, i32::MAX, 0), false);
        assert_eq!(s.check(1, 0, 0, 3), SeqCheck::Append);
    }
}
