//! Transactions in a partition log (KIP-98): the end-transaction markers
//! partition leaders write (control batches), and the aborted transactions a
//! `read_committed` Fetch reports so that consumers skip their records.
//!
//! A marker is a control batch of one record: key = version (i16, 0) and
//! type (i16: 0 abort, 1 commit); value = version (i16, 0) and the
//! transaction coordinator's epoch (i32), as Kafka writes them. The log keeps
//! every aborted transaction whose marker it holds, in marker order: the
//! producer, the first offset of its records here, the marker's offset and
//! the last stable offset after it (Kafka's `AbortedTxn`, the entry of its
//! per-segment `.txnindex`).

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::protocol::{Decodable, Encodable};
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

use super::batch::BatchHeader;

/// The control record type of an abort marker.
pub const CONTROL_TYPE_ABORT: i16 = 0;
/// The control record type of a commit marker.
pub const CONTROL_TYPE_COMMIT: i16 = 1;

/// What an end-transaction marker says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndTxnMarker {
    pub commit: bool,
    pub coordinator_epoch: i32,
}

/// The marker in a control batch, or `None` when `batch` is not a control
/// batch holding one (another control type, or an undecodable batch).
pub fn decode_marker(batch: &[u8]) -> Option<EndTxnMarker> {
    let header = BatchHeader::parse(batch).ok()?;
    if !header.is_control() {
        return None;
    }
    let set = RecordBatchDecoder::decode(&mut Bytes::copy_from_slice(batch)).ok()?;
    let record = set.records.first()?;
    let commit = marker_commits(record.key.as_ref()?)?;
    // The value: a version (i16, 0), then the EndTxnMarker message.
    let coordinator_epoch = record
        .value
        .clone()
        .filter(|v| v.len() >= 2)
        .and_then(|mut v| {
            let _version = v.get_i16();
            kafka_protocol::messages::EndTxnMarker::decode(&mut v, 0).ok()
        })
        .map_or(-1, |m| m.coordinator_epoch);
    Some(EndTxnMarker { commit, coordinator_epoch })
}

/// From a control record's key: whether it is a commit marker (`Some(true)`)
/// or an abort marker (`Some(false)`); `None` for any other control record.
pub fn marker_commits(key: &[u8]) -> Option<bool> {
    match i16::from_be_bytes([*key.get(2)?, *key.get(3)?]) {
        CONTROL_TYPE_COMMIT => Some(true),
        CONTROL_TYPE_ABORT => Some(false),
        _ => None,
    }
}

/// A marker of `producer_id` at `producer_epoch` as one control batch
/// (offset 0; the log assigns the real one), stamped `timestamp`; `None`
/// if the encoder refuses it.
pub fn encode_marker(producer_id: i64, producer_epoch: i16, marker: EndTxnMarker, timestamp: i64) -> Option<Vec<u8>> {
    let kind = if marker.commit { CONTROL_TYPE_COMMIT } else { CONTROL_TYPE_ABORT };
    let mut key = Vec::with_capacity(4);
    key.extend_from_slice(&0i16.to_be_bytes());
    key.extend_from_slice(&kind.to_be_bytes());
    let mut value = BytesMut::with_capacity(6);
    value.put_i16(0);
    kafka_protocol::messages::EndTxnMarker::default()
        .with_coordinator_epoch(marker.coordinator_epoch)
        .encode(&mut value, 0)
        .ok()?;
    let record = Record {
        transactional: true,
        control: true,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id,
        producer_epoch,
        timestamp_type: TimestampType::Creation,
        offset: 0,
        sequence: -1,
        timestamp,
        key: Some(Bytes::from(key)),
        value: Some(value.freeze()),
        headers: Default::default(),
    };
    let mut encoded = BytesMut::new();
    let options = RecordEncodeOptions { version: 2, compression: Compression::None };
    RecordBatchEncoder::encode(&mut encoded, [&record], &options).ok()?;
    Some(encoded.to_vec())
}

/// One aborted transaction of a partition (Kafka's `AbortedTxn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct AbortedTxn {
    pub producer_id: i64,
    /// The offset of the transaction's first batch in this partition.
    pub first_offset: i64,
    /// The offset of its abort marker.
    pub last_offset: i64,
    /// The last stable offset once the marker was written.
    pub last_stable_offset: i64,
}

/// The aborted transactions a log holds, in marker order.
#[derive(Debug, Clone, Default)]
pub struct AbortedTxns {
    entries: Vec<AbortedTxn>,
}

impl AbortedTxns {
    pub fn push(&mut self, txn: AbortedTxn) {
        debug_assert!(self.entries.last().is_none_or(|l| l.last_offset < txn.last_offset), "markers in order");
        self.entries.push(txn);
    }

    /// Those a read of `[from, to)` must report: every aborted transaction
    /// with records in the range (its marker at or after `from`, its first
    /// batch before `to`), in marker order.
    pub fn overlapping(&self, from: i64, to: i64) -> Vec<AbortedTxn> {
        let start = self.entries.partition_point(|t| t.last_offset < from);
        self.entries[start..].iter().filter(|t| t.first_offset < to).copied().collect()
    }

    /// The log was cut at `offset`: markers there and after are gone.
    pub fn truncate_to(&mut self, offset: i64) {
        let keep = self.entries.partition_point(|t| t.last_offset < offset);
        self.entries.truncate(keep);
    }

    /// The log now starts at `offset`: transactions wholly before it go.
    pub fn trim_before(&mut self, offset: i64) {
        let drop = self.entries.partition_point(|t| t.last_offset < offset);
        self.entries.drain(..drop);
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Compaction removed the markers at `markers`: their transactions have
    /// no records left either, and a reader told of one would skip its
    /// producer's batches until a marker that is no longer there.
    pub fn forget_markers(&mut self, markers: &std::collections::HashSet<i64>) {
        self.entries.retain(|t| !markers.contains(&t.last_offset));
    }

    pub fn entries(&self) -> &[AbortedTxn] {
        &self.entries
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_round_trip_as_kafka_writes_them() {
        for commit in [true, false] {
            let marker = EndTxnMarker { commit, coordinator_epoch: 7 };
            let batch = encode_marker(42, 3, marker, 1_000).expect("encodes");
            let header = BatchHeader::validate(&batch).expect("a valid batch");
            assert!(header.is_control() && header.is_transactional());
            assert_eq!((header.producer_id(), header.producer_epoch(), header.base_sequence()), (42, 3, -1));
            assert_eq!(header.record_count(), 1);
            assert_eq!(decode_marker(&batch), Some(marker));
        }
    }

    #[test]
    fn a_data_batch_is_no_marker() {
        let batch = super::super::batch::test_batches::build_idempotent_batch(2, 9, 0, 0);
        assert_eq!(decode_marker(&batch), None);
    }

    fn txn(first: i64, last: i64) -> AbortedTxn {
        AbortedTxn { producer_id: first, first_offset: first, last_offset: last, last_stable_offset: last + 1 }
    }

    #[test]
    fn a_read_gets_the_transactions_with_records_in_its_range() {
        let mut a = AbortedTxns::default();
        a.push(txn(0, 5));
        a.push(txn(3, 10));
        a.push(txn(12, 20));
        let firsts = |v: Vec<AbortedTxn>| v.iter().map(|t| t.first_offset).collect::<Vec<_>>();
        assert_eq!(firsts(a.overlapping(0, 100)), vec![0, 3, 12]);
        assert_eq!(firsts(a.overlapping(6, 12)), vec![3], "the first ended before 6, the last starts at 12");
        assert_eq!(firsts(a.overlapping(21, 30)), Vec::<i64>::new());
        a.truncate_to(10);
        assert_eq!(firsts(a.overlapping(0, 100)), vec![0], "the markers at 10 and 20 were cut");
        a.push(txn(11, 15));
        a.trim_before(6);
        assert_eq!(firsts(a.overlapping(0, 100)), vec![11]);
        assert_eq!(a.len(), 1);
    }
}
