//! Log compaction, for Strom's internal `__consumer_offsets`: in sealed
//! segments below the high watermark, a record is dropped when a later record
//! in the log has the same key. Offsets never change: surviving records keep
//! theirs and batches are re-encoded around them, so readers and followers
//! see gaps, as in a compacted Kafka topic (followers accept them). The last
//! batch of each segment is kept whole, so every segment keeps its end
//! offset and is never empty. Tombstones are kept (the latest record of a
//! deleted key), so a replica that missed the deletion still learns of it.
//!
//! Only uncompressed batches without producer ids are rewritten: that is all
//! the group coordinator writes. Anything else is left as it is.

use std::collections::HashMap;

use bytes::Bytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

use super::batch::BatchHeader;
use super::segment::BatchInfo;

/// A record without producer or headers, as Strom writes its own records.
pub fn plain_record(offset: i64, key: Option<Bytes>, value: Option<Bytes>, timestamp: i64) -> Record {
    Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset,
        sequence: -1,
        timestamp,
        key,
        value,
        headers: Default::default(),
    }
}

/// `records` (offsets increasing, no producer) as one uncompressed v2 batch.
/// kafka-protocol starts a new batch wherever `offset - sequence` changes, so
/// sequences are renumbered to follow the offsets (base sequence -1).
pub fn encode_batch(records: Vec<Record>) -> Option<Vec<u8>> {
    let first = records.first()?.offset;
    let records: Vec<Record> =
        records.into_iter().map(|r| Record { sequence: (r.offset - first) as i32 - 1, ..r }).collect();
    let mut encoded = bytes::BytesMut::new();
    let options = RecordEncodeOptions { version: 2, compression: Compression::None };
    RecordBatchEncoder::encode(&mut encoded, &records, &options).ok()?;
    Some(encoded.to_vec())
}

/// Records in `record_set` (whole batches) below `end`: the offset of the
/// latest record of every key. Records at or past `end` (not yet committed)
/// must not supersede anything: they may still be truncated away.
pub fn note_latest(record_set: &Bytes, end: i64, latest: &mut HashMap<Bytes, i64>) {
    let mut buf = record_set.clone();
    while !buf.is_empty() {
        let Ok(set) = RecordBatchDecoder::decode(&mut buf) else { return };
        for r in set.records.into_iter().filter(|r| r.offset < end) {
            if let Some(key) = r.key {
                latest.insert(key, r.offset);
            }
        }
    }
}

/// `segment` (whole batches) with superseded records removed, as batches
/// and their header infos; `None` when nothing would be removed or a batch
/// is not one this compaction rewrites.
pub fn compact_segment(segment: &Bytes, latest: &HashMap<Bytes, i64>) -> Option<Vec<(Vec<u8>, BatchInfo)>> {
    let mut batches: Vec<Bytes> = Vec::new();
    let mut at = 0usize;
    while at < segment.len() {
        let header = BatchHeader::parse(&segment[at..]).ok()?;
        let size = header.total_size();
        if size == 0 || at + size > segment.len() {
            return None;
        }
        batches.push(segment.slice(at..at + size));
        at += size;
    }
    let last = batches.len().checked_sub(1)?;
    let mut out = Vec::with_capacity(batches.len());
    let mut dropped = 0usize;
    for (i, raw) in batches.iter().enumerate() {
        let keep_whole = |raw: &Bytes| {
            let header = BatchHeader::parse(raw).ok()?;
            Some((raw.to_vec(), BatchInfo::from_header(&header)))
        };
        if i == last {
            out.push(keep_whole(raw)?);
            continue;
        }
        let mut buf = raw.clone();
        let set = RecordBatchDecoder::decode(&mut buf).ok()?;
        if set.compression != Compression::None || set.records.iter().any(|r| r.producer_id >= 0 || r.control) {
            return None;
        }
        let total = set.records.len();
        let kept: Vec<_> = set
            .records
            .into_iter()
            .filter(|r| r.key.as_ref().is_none_or(|k| latest.get(k).is_none_or(|&l| l <= r.offset)))
            .collect();
        dropped += total - kept.len();
        if kept.is_empty() {
            continue;
        }
        if kept.len() == total {
            out.push(keep_whole(raw)?);
            continue;
        }
        let encoded = encode_batch(kept)?;
        let header = BatchHeader::parse(&encoded).ok()?;
        let info = BatchInfo::from_header(&header);
        out.push((encoded, info));
    }
    (dropped > 0).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(records: &[(i64, &'static str, Option<&'static str>)]) -> Bytes {
        let records: Vec<Record> = records
            .iter()
            .map(|(offset, key, value)| {
                let (key, value) =
                    (Bytes::from_static(key.as_bytes()), value.map(|v| Bytes::from_static(v.as_bytes())));
                Record { partition_leader_epoch: 7, ..plain_record(*offset, Some(key), value, 1000 + offset) }
            })
            .collect();
        Bytes::from(encode_batch(records).expect("encodes"))
    }

    fn decoded(batches: &[(Vec<u8>, BatchInfo)]) -> Vec<(i64, String, Option<String>)> {
        let mut out = Vec::new();
        for (raw, _) in batches {
            let mut buf = Bytes::from(raw.clone());
            for r in RecordBatchDecoder::decode(&mut buf).expect("decodes").records {
                let text = |b: Option<Bytes>| b.map(|b| String::from_utf8_lossy(&b).into_owned());
                out.push((r.offset, text(r.key).unwrap_or_default(), text(r.value)));
            }
        }
        out
    }

    #[test]
    fn superseded_records_go_and_offsets_stay() {
        let b1 = batch(&[(0, "a", Some("1")), (1, "b", Some("1")), (2, "a", Some("2"))]);
        let b2 = batch(&[(3, "c", Some("1")), (4, "b", None)]);
        let b3 = batch(&[(5, "a", Some("3"))]);
        let segment = Bytes::from([b1.to_vec(), b2.to_vec(), b3.to_vec()].concat());
        let mut latest = HashMap::new();
        note_latest(&segment, 5, &mut latest);
        assert_eq!(latest[&Bytes::from_static(b"a")], 2, "offset 5 is past the end given");
        note_latest(&segment, i64::MAX, &mut latest);
        assert_eq!(latest[&Bytes::from_static(b"a")], 5);
        let out = compact_segment(&segment, &latest).expect("something to drop");
        // Batch 1 lost everything (a and b are superseded later); the tombstone of b
        // stays; the last batch is kept whole.
        assert_eq!(
            decoded(&out),
            vec![(3, "c".into(), Some("1".into())), (4, "b".into(), None), (5, "a".into(), Some("3".into()))]
        );
        assert_eq!((out[0].1.base_offset, out[0].1.last_offset, out[0].1.partition_leader_epoch), (3, 4, 7));
        assert_eq!(out.last().map(|(_, i)| i.last_offset), Some(5));
    }

    #[test]
    fn nothing_to_drop_or_foreign_batches_are_left_alone() {
        let segment =
            Bytes::from([batch(&[(0, "a", Some("1"))]).to_vec(), batch(&[(1, "b", Some("1"))]).to_vec()].concat());
        let mut latest = HashMap::new();
        note_latest(&segment, i64::MAX, &mut latest);
        assert!(compact_segment(&segment, &latest).is_none());
        assert!(compact_segment(&Bytes::from_static(b"garbage that is no batch"), &latest).is_none());
    }
}
