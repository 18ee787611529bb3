//! Idempotent-producer state of one partition: for each producer id, its
//! epoch and the last few batches' sequence ranges and offsets (KIP-98).
//!
//! Pure logic: the partition asks [`ProducerStateMap::check`] before an
//! append and calls [`ProducerStateMap::record`] after it. A retried batch is
//! answered with its original offsets; a gap is OUT_OF_ORDER_SEQUENCE_NUMBER.
//! Rebuilt from batch headers when the log is opened.

use std::collections::{HashMap, VecDeque};

use crate::log::batch::{split_record_set, BatchError, BatchHeader};

/// Kafka keeps this many recent batches per producer for duplicate checks.
pub const BATCHES_KEPT: usize = 5;
/// More producer ids than this in one partition are forgotten oldest-first.
pub const PRODUCERS_MAX: usize = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
}

#[derive(Debug, Clone, Default)]
struct ProducerEntry {
    epoch: i16,
    batches: VecDeque<BatchMeta>,
    last_offset: i64,
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

#[derive(Debug, Clone, Default)]
pub struct ProducerStateMap {
    producers: HashMap<i64, ProducerEntry>,
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
        let expected = entry.batches.back().map_or(0, |b| next_seq(b.last_seq));
        if first_seq == expected {
            SeqCheck::Append
        } else {
            SeqCheck::OutOfOrder { expected, got: first_seq }
        }
    }

    pub fn record(&mut self, producer_id: i64, epoch: i16, batch: BatchMeta) {
        if producer_id < 0 {
            return;
        }
        if !self.producers.contains_key(&producer_id) && self.producers.len() >= PRODUCERS_MAX {
            if let Some(oldest) = self.producers.iter().min_by_key(|(_, e)| e.last_offset).map(|(id, _)| *id) {
                self.producers.remove(&oldest);
            }
        }
        let entry = self.producers.entry(producer_id).or_default();
        if epoch != entry.epoch {
            entry.batches.clear();
            entry.epoch = epoch;
        }
        entry.batches.push_back(batch);
        while entry.batches.len() > BATCHES_KEPT {
            entry.batches.pop_front();
        }
        entry.last_offset = batch.last_offset;
    }

    /// Records every idempotent batch in `records` (batches already in the
    /// log: rebuilt on open, or replicated from the leader).
    pub fn record_batches(&mut self, records: &[u8]) -> Result<(), BatchError> {
        for range in split_record_set(records)? {
            let h = BatchHeader::parse(&records[range])?;
            if h.producer_id() >= 0 && h.base_sequence() >= 0 {
                let meta = BatchMeta {
                    first_seq: h.base_sequence(),
                    last_seq: h.base_sequence().wrapping_add(h.last_offset_delta()),
                    base_offset: h.base_offset(),
                    last_offset: h.last_offset(),
                    max_timestamp: h.max_timestamp(),
                };
                self.record(h.producer_id(), h.producer_epoch(), meta);
            }
        }
        Ok(())
    }

    /// Forgets batches at or above `offset` (the log was truncated there).
    pub fn truncate_to(&mut self, offset: i64) {
        for entry in self.producers.values_mut() {
            entry.batches.retain(|b| b.last_offset < offset);
        }
        self.producers.retain(|_, e| !e.batches.is_empty());
    }

    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
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
        m.record(7, 2, meta(0, 4, 10));
        m.record(7, 2, meta(5, 9, 15));
        m.record(3, 0, meta(0, 0, 20));
        assert_eq!(
            m.active(),
            vec![
                ActiveProducer { producer_id: 3, epoch: 0, last_sequence: 0, last_timestamp: 1_020 },
                ActiveProducer { producer_id: 7, epoch: 2, last_sequence: 9, last_timestamp: 1_015 },
            ]
        );
        // Truncated batches are forgotten, and so is a producer left with none.
        m.truncate_to(15);
        assert_eq!(
            m.active(),
            vec![ActiveProducer { producer_id: 7, epoch: 2, last_sequence: 4, last_timestamp: 1_010 }]
        );
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
        s.record(7, 0, meta(0, 4, 100));
        assert_eq!(s.check(7, 0, 5, 9), SeqCheck::Append);
        s.record(7, 0, meta(5, 9, 105));
        assert_eq!(s.check(7, 0, 0, 4), SeqCheck::Duplicate(meta(0, 4, 100)), "a retry gets its offsets");
        assert_eq!(s.check(7, 0, 12, 13), SeqCheck::OutOfOrder { expected: 10, got: 12 });
        assert_eq!(s.check(8, 0, 3, 3), SeqCheck::OutOfOrder { expected: 0, got: 3 });
        assert_eq!(s.check(-1, -1, -1, -1), SeqCheck::Append, "non-idempotent producers are not checked");
    }

    #[test]
    fn epochs_fence_and_reset() {
        let mut s = ProducerStateMap::default();
        s.record(7, 2, meta(0, 0, 0));
        assert_eq!(s.check(7, 1, 1, 1), SeqCheck::FencedEpoch { current: 2 });
        assert_eq!(s.check(7, 3, 0, 0), SeqCheck::Append);
        assert_eq!(s.check(7, 3, 5, 5), SeqCheck::OutOfOrder { expected: 0, got: 5 });
    }

    #[test]
    fn only_recent_batches_are_kept_and_truncation_forgets() {
        let mut s = ProducerStateMap::default();
        for i in 0..10 {
            s.record(1, 0, meta(i, i, i as i64));
        }
        assert_eq!(s.check(1, 0, 0, 0), SeqCheck::OutOfOrder { expected: 10, got: 0 });
        assert!(matches!(s.check(1, 0, 9, 9), SeqCheck::Duplicate(_)));
        s.truncate_to(8);
        assert_eq!(s.check(1, 0, 8, 8), SeqCheck::Append);
        s.truncate_to(0);
        assert!(s.is_empty());
    }

    #[test]
    fn sequence_wraps() {
        let mut s = ProducerStateMap::default();
        s.record(1, 0, meta(i32::MAX - 1, i32::MAX, 0));
        assert_eq!(s.check(1, 0, 0, 3), SeqCheck::Append);
    }
}
