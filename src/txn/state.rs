//! The state machine of one transactional id, after Kafka's
//! `TransactionMetadata`: pure functions from the stored metadata and a
//! request to the error or the metadata to write. The coordinator writes
//! what they return and applies it once committed.
//!
//! ```text
//! Empty / Complete* --AddPartitions--> Ongoing --EndTxn--> Prepare* --markers--> Complete*
//!                       Ongoing --InitProducerId or timeout (epoch bump)--> PrepareAbort
//! ```

use std::collections::BTreeSet;

use kafka_protocol::ResponseError;

/// A transaction's status, with Kafka's meaning (and status byte, see
/// `records`). Kafka's Dead and PrepareEpochFence are never stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnState {
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
}

impl TxnState {
    /// Kafka's name, as DescribeTransactions and ListTransactions show it.
    pub fn name(self) -> &'static str {
        match self {
            TxnState::Empty => "Empty",
            TxnState::Ongoing => "Ongoing",
            TxnState::PrepareCommit => "PrepareCommit",
            TxnState::PrepareAbort => "PrepareAbort",
            TxnState::CompleteCommit => "CompleteCommit",
            TxnState::CompleteAbort => "CompleteAbort",
        }
    }

    /// Markers are being written: nothing else may happen meanwhile.
    pub fn is_preparing(self) -> bool {
        matches!(self, TxnState::PrepareCommit | TxnState::PrepareAbort)
    }
}

/// A topic name and partition index.
pub type TopicPartition = (String, i32);

/// What the coordinator stores for one transactional id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnMeta {
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub timeout_ms: i32,
    pub state: TxnState,
    /// The partitions of the current transaction.
    pub partitions: BTreeSet<TopicPartition>,
    /// When the current transaction began (-1 when none has).
    pub start_ms: i64,
    pub update_ms: i64,
}

/// The largest epoch given out before a producer gets a new id (Kafka
/// keeps `Short.MaxValue` for fencing).
const EPOCH_MAX: i16 = i16::MAX - 1;

/// Whether `m` is forgotten (`transactional.id.expiration.ms`): no
/// transaction open or ending, and no change for `expiration_ms`.
pub fn expired(m: &TxnMeta, now_ms: i64, expiration_ms: i64) -> bool {
    matches!(m.state, TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort)
        && now_ms.saturating_sub(m.update_ms) >= expiration_ms
}

/// Whether InitProducerId for `existing` needs a fresh producer id.
pub fn needs_producer_id(existing: Option<&TxnMeta>) -> bool {
    existing.is_none_or(|m| m.producer_epoch >= EPOCH_MAX)
}

/// What InitProducerId does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Init {
    /// Store this (Empty, a new epoch) and answer with its producer once committed.
    Write(TxnMeta),
    /// The transaction the last producer left open is aborted first, at a
    /// bumped epoch that fences that producer: store this PrepareAbort and
    /// write its markers; the client is told to retry
    /// (CONCURRENT_TRANSACTIONS).
    FenceAndAbort(TxnMeta),
}

/// InitProducerId with a transactional id. `new_producer_id` is a fresh id,
/// used when [`needs_producer_id`] says so. `current` is the producer id and
/// epoch the client says it has (KIP-360, v3+: a producer recovering from an
/// error bumps its own epoch); one that is not the id's current producer is
/// a zombie, fenced (PRODUCER_FENCED).
pub fn init(
    id: &str,
    existing: Option<&TxnMeta>,
    new_producer_id: Option<i64>,
    current: Option<(i64, i16)>,
    timeout_ms: i32,
    now_ms: i64,
) -> Result<Init, ResponseError> {
    let fresh = |producer_id: i64| TxnMeta {
        transactional_id: id.to_string(),
        producer_id,
        producer_epoch: 0,
        timeout_ms,
        state: TxnState::Empty,
        partitions: BTreeSet::new(),
        start_ms: -1,
        update_ms: now_ms,
    };
    let Some(m) = existing else {
        if current.is_some() {
            return Err(ResponseError::InvalidProducerIdMapping);
        }
        return new_producer_id.map(|p| Init::Write(fresh(p))).ok_or(ResponseError::CoordinatorNotAvailable);
    };
    if current.is_some_and(|c| c != (m.producer_id, m.producer_epoch)) {
        return Err(ResponseError::ProducerFenced);
    }
    match m.state {
        TxnState::PrepareCommit | TxnState::PrepareAbort => Err(ResponseError::ConcurrentTransactions),
        TxnState::Ongoing => Ok(Init::FenceAndAbort(abort_with_bumped_epoch(m, now_ms))),
        TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort => {
            if m.producer_epoch >= EPOCH_MAX {
                return new_producer_id.map(|p| Init::Write(fresh(p))).ok_or(ResponseError::CoordinatorNotAvailable);
            }
            Ok(Init::Write(TxnMeta {
                producer_epoch: m.producer_epoch + 1,
                timeout_ms,
                state: TxnState::Empty,
                partitions: BTreeSet::new(),
                start_ms: -1,
                update_ms: now_ms,
                ..m.clone()
            }))
        }
    }
}

/// The open transaction of `m` aborted at the next epoch (a new producer
/// for the id, or the transaction timed out): the old producer is fenced.
pub fn abort_with_bumped_epoch(m: &TxnMeta, now_ms: i64) -> TxnMeta {
    TxnMeta {
        producer_epoch: m.producer_epoch.saturating_add(1),
        state: TxnState::PrepareAbort,
        update_ms: now_ms,
        ..m.clone()
    }
}

/// The producer of a request must be the id's current one.
fn check_producer(m: &TxnMeta, producer_id: i64, producer_epoch: i16) -> Result<(), ResponseError> {
    if producer_id != m.producer_id {
        Err(ResponseError::InvalidProducerIdMapping)
    } else if producer_epoch != m.producer_epoch {
        Err(ResponseError::ProducerFenced)
    } else {
        Ok(())
    }
}

/// AddPartitionsToTxn (and AddOffsetsToTxn, whose partition is the group's
/// `__consumer_offsets` one): the metadata to store, or `None` when every
/// partition is in the transaction already.
pub fn add_partitions(
    m: Option<&TxnMeta>,
    producer_id: i64,
    producer_epoch: i16,
    partitions: &[TopicPartition],
    now_ms: i64,
) -> Result<Option<TxnMeta>, ResponseError> {
    let m = m.ok_or(ResponseError::InvalidProducerIdMapping)?;
    check_producer(m, producer_id, producer_epoch)?;
    if m.state.is_preparing() {
        return Err(ResponseError::ConcurrentTransactions);
    }
    if m.state == TxnState::Ongoing && partitions.iter().all(|p| m.partitions.contains(p)) {
        return Ok(None);
    }
    let mut next = m.clone();
    if m.state != TxnState::Ongoing {
        next.partitions.clear();
        next.start_ms = now_ms;
        next.state = TxnState::Ongoing;
    }
    next.partitions.extend(partitions.iter().cloned());
    next.update_ms = now_ms;
    Ok(Some(next))
}

/// KIP-890 verification, asked by a partition leader before it appends a
/// producer's first transactional batch to `partition`: the producer is the
/// id's current one and its open transaction includes the partition.
pub fn verify(
    m: Option<&TxnMeta>,
    producer_id: i64,
    producer_epoch: i16,
    partition: &TopicPartition,
) -> Result<(), ResponseError> {
    let m = m.ok_or(ResponseError::InvalidProducerIdMapping)?;
    check_producer(m, producer_id, producer_epoch)?;
    match m.state == TxnState::Ongoing && m.partitions.contains(partition) {
        true => Ok(()),
        false => Err(ResponseError::InvalidTxnState),
    }
}

/// EndTxn: the Prepare state to store (markers follow), or `None` when the
/// same end was completed already (a retry).
pub fn end(
    m: Option<&TxnMeta>,
    producer_id: i64,
    producer_epoch: i16,
    commit: bool,
    now_ms: i64,
) -> Result<Option<TxnMeta>, ResponseError> {
    let m = m.ok_or(ResponseError::InvalidProducerIdMapping)?;
    check_producer(m, producer_id, producer_epoch)?;
    match (m.state, commit) {
        (TxnState::Ongoing, _) => Ok(Some(TxnMeta {
            state: if commit { TxnState::PrepareCommit } else { TxnState::PrepareAbort },
            update_ms: now_ms,
            ..m.clone()
        })),
        (TxnState::CompleteCommit, true) | (TxnState::CompleteAbort, false) => Ok(None),
        (TxnState::PrepareCommit, true) | (TxnState::PrepareAbort, false) => Err(ResponseError::ConcurrentTransactions),
        _ => Err(ResponseError::InvalidTxnState),
    }
}

/// After the markers of a Prepare state are written: the Complete state,
/// with no partitions.
pub fn complete(m: &TxnMeta, now_ms: i64) -> TxnMeta {
    TxnMeta {
        state: if m.state == TxnState::PrepareCommit { TxnState::CompleteCommit } else { TxnState::CompleteAbort },
        partitions: BTreeSet::new(),
        update_ms: now_ms,
        ..m.clone()
    }
}

/// Whether `m`'s open transaction has outlived its timeout.
pub fn timed_out(m: &TxnMeta, now_ms: i64) -> bool {
    m.state == TxnState::Ongoing && m.start_ms >= 0 && now_ms.saturating_sub(m.start_ms) > i64::from(m.timeout_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(t: &str, p: i32) -> TopicPartition {
        (t.to_string(), p)
    }

    fn initialized() -> TxnMeta {
        match init("tx", None, Some(7), None, 60_000, 1) {
            Ok(Init::Write(m)) => m,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_transaction_goes_round() {
        let m = initialized();
        assert_eq!((m.producer_id, m.producer_epoch, m.state), (7, 0, TxnState::Empty));
        assert_eq!(end(Some(&m), 7, 0, true, 2), Err(ResponseError::InvalidTxnState), "nothing to end");
        let m = add_partitions(Some(&m), 7, 0, &[tp("a", 0)], 5).expect("adds").expect("writes");
        assert_eq!((m.state, m.start_ms), (TxnState::Ongoing, 5));
        assert_eq!(add_partitions(Some(&m), 7, 0, &[tp("a", 0)], 6), Ok(None), "nothing new to store");
        let m = add_partitions(Some(&m), 7, 0, &[tp("b", 1)], 6).expect("adds").expect("writes");
        assert_eq!(m.partitions.len(), 2);
        assert_eq!(m.start_ms, 5, "the transaction began with its first partition");
        let prepared = end(Some(&m), 7, 0, true, 8).expect("ends").expect("writes");
        assert_eq!(prepared.state, TxnState::PrepareCommit);
        assert_eq!(add_partitions(Some(&prepared), 7, 0, &[tp("c", 0)], 9), Err(ResponseError::ConcurrentTransactions));
        assert_eq!(end(Some(&prepared), 7, 0, true, 9), Err(ResponseError::ConcurrentTransactions));
        let done = complete(&prepared, 10);
        assert_eq!((done.state, done.partitions.len()), (TxnState::CompleteCommit, 0));
        assert_eq!(end(Some(&done), 7, 0, true, 11), Ok(None), "a retried commit is answered again");
        assert_eq!(end(Some(&done), 7, 0, false, 11), Err(ResponseError::InvalidTxnState));
        let next = add_partitions(Some(&done), 7, 0, &[tp("c", 0)], 12).expect("adds").expect("writes");
        assert_eq!((next.state, next.start_ms, next.partitions.len()), (TxnState::Ongoing, 12, 1));
    }

    #[test]
    fn producers_are_checked_and_fenced() {
        let m = initialized();
        let m = add_partitions(Some(&m), 7, 0, &[tp("a", 0)], 5).expect("adds").expect("writes");
        assert_eq!(add_partitions(Some(&m), 8, 0, &[], 6), Err(ResponseError::InvalidProducerIdMapping));
        assert_eq!(end(None, 7, 0, true, 6), Err(ResponseError::InvalidProducerIdMapping), "unknown id");
        // A new producer for the id: the open transaction is aborted at epoch 1.
        assert_eq!(init("tx", Some(&m), None, Some((7, 1)), 30_000, 7), Err(ResponseError::ProducerFenced), "a zombie");
        let fenced = match init("tx", Some(&m), None, Some((7, 0)), 30_000, 7) {
            Ok(Init::FenceAndAbort(f)) => f,
            other => panic!("{other:?}"),
        };
        assert_eq!((fenced.state, fenced.producer_epoch, fenced.partitions.len()), (TxnState::PrepareAbort, 1, 1));
        assert_eq!(init("tx", Some(&fenced), None, None, 30_000, 8), Err(ResponseError::ConcurrentTransactions));
        let aborted = complete(&fenced, 9);
        assert_eq!(end(Some(&aborted), 7, 0, true, 9), Err(ResponseError::ProducerFenced), "the zombie");
        match init("tx", Some(&aborted), None, None, 30_000, 10) {
            Ok(Init::Write(m)) => assert_eq!((m.producer_id, m.producer_epoch, m.timeout_ms), (7, 2, 30_000)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn exhausted_epochs_get_a_new_producer_id_and_timeouts_are_seen() {
        let mut m = initialized();
        m.producer_epoch = EPOCH_MAX;
        assert!(needs_producer_id(Some(&m)) && needs_producer_id(None));
        match init("tx", Some(&m), Some(99), None, 1_000, 2) {
            Ok(Init::Write(m)) => assert_eq!((m.producer_id, m.producer_epoch), (99, 0)),
            other => panic!("{other:?}"),
        }
        let m = add_partitions(Some(&initialized()), 7, 0, &[tp("a", 0)], 100).expect("adds").expect("writes");
        assert!(!timed_out(&m, 100 + 60_000));
        assert!(timed_out(&m, 101 + 60_000));
        let aborted = abort_with_bumped_epoch(&m, 200_000);
        assert_eq!((aborted.state, aborted.producer_epoch), (TxnState::PrepareAbort, 1));
    }

    #[test]
    fn only_an_idle_id_expires() {
        let m = initialized();
        assert!(!expired(&m, m.update_ms + 999, 1_000));
        assert!(expired(&m, m.update_ms + 1_000, 1_000), "Empty and untouched");
        let open = add_partitions(Some(&m), 7, 0, &[tp("a", 0)], 5).expect("adds").expect("writes");
        assert!(!expired(&open, i64::MAX, 1_000), "a transaction is open");
        let prepared = end(Some(&open), 7, 0, false, 6).expect("ends").expect("writes");
        assert!(!expired(&prepared, i64::MAX, 1_000), "markers are being written");
        let done = complete(&prepared, 7);
        assert!(expired(&done, 1_007, 1_000) && !expired(&done, 1_006, 1_000));
    }
}
