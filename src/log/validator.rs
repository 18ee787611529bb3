//! Per-record checks a leader makes before appending a produce request,
//! Kafka's `LogValidator`: records of a compacted topic must have keys, and
//! CreateTime timestamps must lie within `message.timestamp.before.max.ms`
//! and `message.timestamp.after.max.ms` of the broker's clock (KIP-937).
//! Failures name each bad record (KIP-467's `record_errors`), and nothing of
//! the record set is appended.
//!
//! Called by [`super::PartitionLog::append_as_leader`] only. Records are
//! decoded (and decompressed) only when a check applies, so the default
//! append path never looks past batch headers. Never used for follower
//! appends: the leader already checked.

use std::ops::Range;

use bytes::Bytes;
use kafka_protocol::records::RecordBatchDecoder;
use thiserror::Error;

use super::batch::BatchHeader;
use super::LogConfig;

/// `message.timestamp.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TimestampType {
    #[default]
    CreateTime,
    LogAppendTime,
}

/// Which Kafka error a refused record set gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// INVALID_RECORD.
    InvalidRecord,
    /// INVALID_TIMESTAMP.
    InvalidTimestamp,
}

/// One refused record: its index in its batch and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordError {
    pub batch_index: i32,
    pub message: String,
}

/// A record set refused by the checks, with Kafka's messages.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{message}")]
pub struct RecordValidationError {
    pub violation: Violation,
    pub message: String,
    pub record_errors: Vec<RecordError>,
}

/// The timestamp window `[now - before, now + after]`, when bounded.
fn timestamp_window(config: &LogConfig, now_ms: i64) -> Option<(i64, i64)> {
    if config.timestamp_type != TimestampType::CreateTime {
        return None;
    }
    if config.timestamp_before_max_ms.is_none() && config.timestamp_after_max_ms.is_none() {
        return None;
    }
    let as_i64 = |ms: Option<u64>| ms.map_or(i64::MAX, |v| i64::try_from(v).unwrap_or(i64::MAX));
    let low = now_ms.saturating_sub(as_i64(config.timestamp_before_max_ms));
    let high = now_ms.saturating_add(as_i64(config.timestamp_after_max_ms));
    Some((low, high))
}

/// Whether any per-record check applies; when not, nothing is decoded.
pub fn needs_record_checks(config: &LogConfig) -> bool {
    config.keys_required || timestamp_window(config, 0).is_some()
}

/// Checks every record of the (already split and CRC-checked) record set.
/// `topic_partition` names the partition in messages, as Kafka does.
pub fn validate_records(
    records: &[u8],
    ranges: &[Range<usize>],
    config: &LogConfig,
    now_ms: i64,
    topic_partition: &str,
) -> Result<(), RecordValidationError> {
    if !needs_record_checks(config) {
        return Ok(());
    }
    let window = timestamp_window(config, now_ms);
    let mut errors = Vec::new();
    let mut timestamp_refused = false;
    for range in ranges {
        let bytes = &records[range.clone()];
        if BatchHeader::parse(bytes).is_ok_and(|h| h.is_control()) {
            continue;
        }
        let set =
            RecordBatchDecoder::decode(&mut Bytes::copy_from_slice(bytes)).map_err(|e| RecordValidationError {
                violation: Violation::InvalidRecord,
                message: format!("cannot decode a record batch for validation: {e}"),
                record_errors: Vec::new(),
            })?;
        for (index, record) in set.records.iter().enumerate() {
            let batch_index = i32::try_from(index).unwrap_or(i32::MAX);
            if config.keys_required && record.key.is_none() {
                let message =
                    format!("Compacted topic cannot accept message without key in topic partition {topic_partition}.");
                errors.push(RecordError { batch_index, message });
            } else if let Some((low, high)) = window.filter(|(l, h)| record.timestamp < *l || record.timestamp > *h) {
                timestamp_refused = true;
                let message = format!(
                    "Timestamp {} of message with offset {} is out of range. The timestamp should be within [{low}, {high}]",
                    record.timestamp, record.offset
                );
                errors.push(RecordError { batch_index, message });
            }
        }
    }
    if errors.is_empty() {
        return Ok(());
    }
    // Kafka's LogValidator.processRecordErrors: any timestamp error makes
    // the whole set INVALID_TIMESTAMP, else INVALID_RECORD.
    Err(if timestamp_refused {
        RecordValidationError {
            violation: Violation::InvalidTimestamp,
            message: "One or more records have been rejected due to invalid timestamp".to_string(),
            record_errors: errors,
        }
    } else {
        let shown: Vec<String> = errors
            .iter()
            .take(3)
            .map(|e| format!("RecordError(batchIndex={}, message='{}')", e.batch_index, e.message))
            .collect();
        RecordValidationError {
            violation: Violation::InvalidRecord,
            message: format!(
                "One or more records have been rejected due to {} record errors in total, and only showing the first three errors at most: [{}]",
                errors.len(),
                shown.join(", ")
            ),
            record_errors: errors,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::batch::split_record_set;
    use crate::log::compaction::plain_record;
    use kafka_protocol::records::{Compression, RecordBatchEncoder, RecordEncodeOptions};

    fn encode(records: &[(Option<&str>, i64)], compression: Compression) -> Vec<u8> {
        let records: Vec<_> = records
            .iter()
            .enumerate()
            .map(|(i, (k, ts))| {
                let key = k.map(|k| Bytes::from(k.to_string()));
                let mut record = plain_record(i as i64, key, Some(Bytes::from_static(b"v")), *ts);
                // Consecutive sequences keep the encoder to one batch.
                record.sequence = i as i32;
                record
            })
            .collect();
        let mut buf = bytes::BytesMut::new();
        let options = RecordEncodeOptions { version: 2, compression };
        RecordBatchEncoder::encode(&mut buf, &records, &options).expect("encode");
        buf.to_vec()
    }

    fn check(bytes: &[u8], config: &LogConfig, now_ms: i64) -> Result<(), RecordValidationError> {
        let ranges = split_record_set(bytes).expect("valid");
        validate_records(bytes, &ranges, config, now_ms, "t-0")
    }

    #[test]
    fn nothing_is_checked_by_default() {
        assert!(!needs_record_checks(&LogConfig::default()));
        let bytes = encode(&[(None, 5)], Compression::None);
        assert!(check(&bytes, &LogConfig::default(), 1_000).is_ok());
    }

    #[test]
    fn compacted_topics_need_keys() {
        let config = LogConfig { keys_required: true, ..LogConfig::default() };
        for compression in [Compression::None, Compression::Gzip] {
            let ok = encode(&[(Some("k"), 5), (Some(""), 6)], compression);
            assert!(check(&ok, &config, 1_000).is_ok());
            let bad = encode(&[(Some("k"), 5), (None, 6), (None, 7)], compression);
            let e = check(&bad, &config, 1_000).expect_err("keyless");
            assert_eq!(e.violation, Violation::InvalidRecord);
            assert_eq!(e.record_errors.iter().map(|r| r.batch_index).collect::<Vec<_>>(), vec![1, 2]);
            assert!(e.record_errors[0].message.contains("without key in topic partition t-0"), "{e:?}");
            assert!(e.message.contains("2 record errors"), "{}", e.message);
        }
    }

    #[test]
    fn create_time_bounds() {
        let config =
            LogConfig { timestamp_before_max_ms: Some(100), timestamp_after_max_ms: Some(10), ..LogConfig::default() };
        let now = 10_000;
        assert!(check(&encode(&[(None, 9_900), (None, 10_010)], Compression::None), &config, now).is_ok());
        let e = check(&encode(&[(None, 10_000), (None, 10_011)], Compression::None), &config, now).expect_err("future");
        assert_eq!(e.violation, Violation::InvalidTimestamp);
        assert_eq!(e.record_errors.len(), 1);
        assert_eq!(e.record_errors[0].batch_index, 1);
        assert!(e.record_errors[0].message.contains("[9900, 10010]"), "{e:?}");
        assert!(check(&encode(&[(None, 9_899)], Compression::None), &config, now).is_err());
        let log_append = LogConfig { timestamp_type: TimestampType::LogAppendTime, ..config };
        assert!(!needs_record_checks(&log_append));
        assert!(check(&encode(&[(None, 0)], Compression::None), &log_append, now).is_ok());
    }

    #[test]
    fn the_log_refuses_whole_sets_and_stamps_log_append_time() {
        use crate::log::{LogError, PartitionLog};
        let dir = tempfile::tempdir().expect("tempdir");
        let config = LogConfig { keys_required: true, ..LogConfig::default() };
        let mut log = PartitionLog::open(dir.path(), "t", 0, config, 0, 1_000).expect("open");
        let keyless = encode(&[(Some("k"), 5), (None, 6)], Compression::None);
        let e = log.append_as_leader(&keyless, 0, 1_000).expect_err("refused");
        assert!(matches!(e, LogError::InvalidRecords(_)), "{e}");
        assert_eq!(log.log_end_offset(), 0, "nothing of a refused set is written");
        let keyed = encode(&[(Some("k"), 5)], Compression::None);
        log.append_as_leader(&keyed, 0, 1_000).expect("keyed records pass");
        assert_eq!(log.log_end_offset(), 1);

        let config = LogConfig { timestamp_type: TimestampType::LogAppendTime, ..LogConfig::default() };
        log.set_config(config).expect("config");
        let old = encode(&[(None, 5), (None, 6)], Compression::None);
        log.append_as_leader(&old, 0, 7_000).expect("append");
        let stored = log.read(1, 1 << 20, i64::MAX).expect("read back");
        let header = BatchHeader::validate(&stored).expect("still a valid batch");
        assert!(header.is_log_append_time());
        assert_eq!((header.max_timestamp(), header.base_offset()), (7_000, 1));
    }
}
