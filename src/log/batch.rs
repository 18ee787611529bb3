//! Zero-copy views over Kafka v2 record batch headers (KIP-98 format).
//!
//! This file owns the byte layout of a batch header and nothing else: it
//! never decompresses or parses the records inside a batch. The log stores
//! batches exactly as clients send them; the bytes the broker rewrites are
//! `baseOffset` and `partitionLeaderEpoch`, which lie before the CRC-covered
//! region, so rewriting them never invalidates the CRC-32C — and, for a
//! LogAppendTime topic only, the timestamp type bit and `maxTimestamp`,
//! after which the CRC-32C is recomputed.
//!
//! Layout (big-endian): baseOffset i64 @0, batchLength i32 @8 (bytes after
//! this field), partitionLeaderEpoch i32 @12, magic i8 @16 (= 2), crc u32 @17
//! (CRC-32C of bytes 21..end), attributes i16 @21, lastOffsetDelta i32 @23,
//! baseTimestamp i64 @27, maxTimestamp i64 @35, producerId i64 @43,
//! producerEpoch i16 @51, baseSequence i32 @53, recordCount i32 @57; the
//! header is 61 bytes.

use thiserror::Error;

/// Size of the fixed v2 batch header.
pub const HEADER_BYTES: usize = 61;
/// Bytes before the length-counted part of a batch (baseOffset + batchLength).
pub const LOG_OVERHEAD: usize = 12;
/// The only record batch format this log accepts.
pub const MAGIC_V2: i8 = 2;

const BASE_OFFSET_AT: usize = 0;
const BATCH_LENGTH_AT: usize = 8;
const PARTITION_LEADER_EPOCH_AT: usize = 12;
const MAGIC_AT: usize = 16;
const CRC_AT: usize = 17;
/// First byte covered by the CRC (the attributes field).
pub const CRC_COVERED_FROM: usize = 21;
const ATTRIBUTES_AT: usize = 21;
const LAST_OFFSET_DELTA_AT: usize = 23;
const BASE_TIMESTAMP_AT: usize = 27;
const MAX_TIMESTAMP_AT: usize = 35;
const PRODUCER_ID_AT: usize = 43;
const PRODUCER_EPOCH_AT: usize = 51;
const BASE_SEQUENCE_AT: usize = 53;
const RECORD_COUNT_AT: usize = 57;

/// Why a byte range is not a valid v2 record batch.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum BatchError {
    #[error("batch is {len} bytes, shorter than the {HEADER_BYTES}-byte v2 header")]
    TooShort { len: usize },
    #[error("batchLength {batch_length} is invalid ({available} bytes follow the field)")]
    BadLength { batch_length: i32, available: usize },
    #[error("magic {0} is not supported, only v2 record batches are")]
    BadMagic(i8),
    #[error("lastOffsetDelta {0} is negative")]
    BadOffsetDelta(i32),
    #[error("CRC-32C mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch { stored: u32, computed: u32 },
}

fn be_i16(bytes: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([bytes[at], bytes[at + 1]])
}

fn be_i32(bytes: &[u8], at: usize) -> i32 {
    let mut raw = [0u8; 4];
    raw.copy_from_slice(&bytes[at..at + 4]);
    i32::from_be_bytes(raw)
}

fn be_i64(bytes: &[u8], at: usize) -> i64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&bytes[at..at + 8]);
    i64::from_be_bytes(raw)
}

/// A read-only view of a v2 batch header. Holds at least [`HEADER_BYTES`]
/// bytes; the body may or may not be present (recovery streams it).
#[derive(Debug, Clone, Copy)]
pub struct BatchHeader<'a> {
    bytes: &'a [u8],
}

impl<'a> BatchHeader<'a> {
    /// Checks the header of the batch starting at `bytes[0]`: size, magic,
    /// a batchLength that covers the header, a non-negative lastOffsetDelta.
    /// Does not require the body to be present and does not check the CRC.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, BatchError> {
        if bytes.len() < HEADER_BYTES {
            return Err(BatchError::TooShort { len: bytes.len() });
        }
        let header = Self { bytes: &bytes[..HEADER_BYTES] };
        let batch_length = header.batch_length();
        if batch_length < (HEADER_BYTES - LOG_OVERHEAD) as i32 {
            return Err(BatchError::BadLength { batch_length, available: bytes.len() - LOG_OVERHEAD });
        }
        if header.magic() != MAGIC_V2 {
            return Err(BatchError::BadMagic(header.magic()));
        }
        if header.last_offset_delta() < 0 {
            return Err(BatchError::BadOffsetDelta(header.last_offset_delta()));
        }
        Ok(header)
    }

    /// Validates the whole batch at the start of `bytes`: header checks, the
    /// body is present, and the CRC-32C matches. Returns the header view.
    pub fn validate(bytes: &'a [u8]) -> Result<Self, BatchError> {
        let header = Self::parse(bytes)?;
        let total = header.total_size();
        if bytes.len() < total {
            return Err(BatchError::BadLength {
                batch_length: header.batch_length(),
                available: bytes.len() - LOG_OVERHEAD,
            });
        }
        let computed = crc32c::crc32c(&bytes[CRC_COVERED_FROM..total]);
        if computed != header.crc() {
            return Err(BatchError::CrcMismatch { stored: header.crc(), computed });
        }
        Ok(header)
    }

    /// Base offset and partition leader epoch from the first
    /// [`ASSIGNED_HEAD_BYTES`] of a batch (no other field is needed).
    pub fn parse_assigned(head: &[u8]) -> (i64, i32) {
        assert!(head.len() >= ASSIGNED_HEAD_BYTES, "the assigned head is whole");
        (be_i64(head, BASE_OFFSET_AT), be_i32(head, PARTITION_LEADER_EPOCH_AT))
    }

    pub fn base_offset(&self) -> i64 {
        be_i64(self.bytes, BASE_OFFSET_AT)
    }
    pub fn batch_length(&self) -> i32 {
        be_i32(self.bytes, BATCH_LENGTH_AT)
    }
    /// Whole batch size in bytes, including the 12-byte log overhead.
    /// Only meaningful after [`BatchHeader::parse`] accepted the length.
    pub fn total_size(&self) -> usize {
        LOG_OVERHEAD + self.batch_length().max(0) as usize
    }
    pub fn partition_leader_epoch(&self) -> i32 {
        be_i32(self.bytes, PARTITION_LEADER_EPOCH_AT)
    }
    pub fn magic(&self) -> i8 {
        self.bytes[MAGIC_AT] as i8
    }
    pub fn crc(&self) -> u32 {
        be_i32(self.bytes, CRC_AT) as u32
    }
    pub fn attributes(&self) -> i16 {
        be_i16(self.bytes, ATTRIBUTES_AT)
    }
    /// Compression codec id (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd).
    pub fn compression_code(&self) -> u8 {
        (self.attributes() & 0x07) as u8
    }
    pub fn is_transactional(&self) -> bool {
        self.attributes() & TRANSACTIONAL_ATTRIBUTE != 0
    }
    pub fn is_control(&self) -> bool {
        self.attributes() & 0x20 != 0
    }
    pub fn is_log_append_time(&self) -> bool {
        self.attributes() & LOG_APPEND_TIME_ATTRIBUTE != 0
    }
    pub fn last_offset_delta(&self) -> i32 {
        be_i32(self.bytes, LAST_OFFSET_DELTA_AT)
    }
    /// Offset of the last record: baseOffset + lastOffsetDelta.
    pub fn last_offset(&self) -> i64 {
        self.base_offset() + i64::from(self.last_offset_delta())
    }
    pub fn base_timestamp(&self) -> i64 {
        be_i64(self.bytes, BASE_TIMESTAMP_AT)
    }
    pub fn max_timestamp(&self) -> i64 {
        be_i64(self.bytes, MAX_TIMESTAMP_AT)
    }
    pub fn producer_id(&self) -> i64 {
        be_i64(self.bytes, PRODUCER_ID_AT)
    }
    pub fn producer_epoch(&self) -> i16 {
        be_i16(self.bytes, PRODUCER_EPOCH_AT)
    }
    pub fn base_sequence(&self) -> i32 {
        be_i32(self.bytes, BASE_SEQUENCE_AT)
    }
    pub fn record_count(&self) -> i32 {
        be_i32(self.bytes, RECORD_COUNT_AT)
    }
}

/// The bytes of a batch's head that hold what the leader assigns: baseOffset
/// (0..8) and partitionLeaderEpoch (12..16), with batchLength between.
pub const ASSIGNED_HEAD_BYTES: usize = 16;

/// Rewrites baseOffset in place. The field is outside the CRC.
/// `batch` must hold at least the 12-byte log overhead.
pub fn set_base_offset(batch: &mut [u8], base_offset: i64) {
    batch[BASE_OFFSET_AT..BASE_OFFSET_AT + 8].copy_from_slice(&base_offset.to_be_bytes());
}

/// Rewrites partitionLeaderEpoch in place. The field is outside the CRC.
/// `batch` must hold at least the first 16 header bytes.
pub fn set_partition_leader_epoch(batch: &mut [u8], leader_epoch: i32) {
    batch[PARTITION_LEADER_EPOCH_AT..PARTITION_LEADER_EPOCH_AT + 4].copy_from_slice(&leader_epoch.to_be_bytes());
}

/// Attribute bit 3: the batch's timestamps are LogAppendTime.
const LOG_APPEND_TIME_ATTRIBUTE: i16 = 0x08;

/// Stamps a whole, valid batch with the broker's append time, as Kafka's
/// LogValidator does for LogAppendTime topics: sets the timestamp type
/// attribute bit and `maxTimestamp` (readers use it for every record), then
/// recomputes the CRC-32C, since both fields lie inside the CRC.
pub fn set_log_append_time(batch: &mut [u8], now_ms: i64) {
    assert!(batch.len() >= HEADER_BYTES, "a batch holds its whole header");
    let attributes = be_i16(batch, ATTRIBUTES_AT) | LOG_APPEND_TIME_ATTRIBUTE;
    batch[ATTRIBUTES_AT..ATTRIBUTES_AT + 2].copy_from_slice(&attributes.to_be_bytes());
    batch[MAX_TIMESTAMP_AT..MAX_TIMESTAMP_AT + 8].copy_from_slice(&now_ms.to_be_bytes());
    let crc = crc32c::crc32c(&batch[CRC_COVERED_FROM..]);
    batch[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
}

/// Splits a record set (concatenated batches) into validated batches,
/// returning each batch's byte range. Fails on the first invalid batch or a
/// trailing partial batch; an empty record set is rejected as too short.
pub fn split_record_set(records: &[u8]) -> Result<Vec<std::ops::Range<usize>>, BatchError> {
    if records.is_empty() {
        return Err(BatchError::TooShort { len: 0 });
    }
    let mut ranges = Vec::new();
    let mut position = 0;
    while position < records.len() {
        let header = BatchHeader::validate(&records[position..])?;
        let end = position + header.total_size();
        ranges.push(position..end);
        position = end;
    }
    Ok(ranges)
}

/// The length of `records` without a partial batch at its end. A Fetch
/// answer is a byte range of the leader's log, as in Kafka, and may end
/// inside a batch; the receiver drops that piece and fetches it whole next
/// time. Only a last batch shorter than its own length field counts as
/// partial: any other damage is left for validation to report.
pub fn whole_batches_len(records: &[u8]) -> usize {
    whole_batches(records).0
}

/// [`whole_batches_len`], and the offset after the last whole batch (from
/// its header alone, no CRC check; `None` without one, or when its header
/// does not parse).
pub fn whole_batches(records: &[u8]) -> (usize, Option<i64>) {
    let mut position = 0;
    let mut last = None;
    while position < records.len() {
        let rest = &records[position..];
        if rest.len() < LOG_OVERHEAD {
            break;
        }
        let batch_length = i32::from_be_bytes([rest[8], rest[9], rest[10], rest[11]]);
        let Ok(body) = usize::try_from(batch_length) else { return (records.len(), None) };
        if LOG_OVERHEAD + body > rest.len() {
            break;
        }
        last = Some(position);
        position += LOG_OVERHEAD + body;
    }
    let end = last.and_then(|at| BatchHeader::parse(&records[at..]).ok()).map(|h| h.last_offset() + 1);
    (position, end)
}

/// Attribute bit 4: the batch belongs to a transaction.
pub const TRANSACTIONAL_ATTRIBUTE: i16 = 0x10;

/// Marks a whole, valid batch transactional (tests build such batches by hand).
#[cfg(test)]
pub fn set_transactional_for_tests(batch: &mut [u8]) {
    let attributes = be_i16(batch, ATTRIBUTES_AT) | TRANSACTIONAL_ATTRIBUTE;
    batch[ATTRIBUTES_AT..ATTRIBUTES_AT + 2].copy_from_slice(&attributes.to_be_bytes());
    let crc = crc32c::crc32c(&batch[CRC_COVERED_FROM..]);
    batch[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
}

#[cfg(test)]
pub(crate) mod test_batches {
    //! Builds valid v2 batches by hand: header fields, opaque record bytes,
    //! and a correct CRC-32C.

    use super::*;

    /// A batch of `record_count` records whose body is `payload` (opaque).
    pub fn build_batch(record_count: i32, max_timestamp: i64, payload: &[u8]) -> Vec<u8> {
        assert!(record_count >= 1);
        let mut batch = vec![0u8; HEADER_BYTES];
        batch.extend_from_slice(payload);
        let batch_length = (batch.len() - LOG_OVERHEAD) as i32;
        batch[BATCH_LENGTH_AT..BATCH_LENGTH_AT + 4].copy_from_slice(&batch_length.to_be_bytes());
        batch[PARTITION_LEADER_EPOCH_AT..PARTITION_LEADER_EPOCH_AT + 4].copy_from_slice(&(-1i32).to_be_bytes());
        batch[MAGIC_AT] = MAGIC_V2 as u8;
        let delta = record_count - 1;
        batch[LAST_OFFSET_DELTA_AT..LAST_OFFSET_DELTA_AT + 4].copy_from_slice(&delta.to_be_bytes());
        batch[BASE_TIMESTAMP_AT..BASE_TIMESTAMP_AT + 8].copy_from_slice(&max_timestamp.to_be_bytes());
        batch[MAX_TIMESTAMP_AT..MAX_TIMESTAMP_AT + 8].copy_from_slice(&max_timestamp.to_be_bytes());
        batch[PRODUCER_ID_AT..PRODUCER_ID_AT + 8].copy_from_slice(&(-1i64).to_be_bytes());
        batch[PRODUCER_EPOCH_AT..PRODUCER_EPOCH_AT + 2].copy_from_slice(&(-1i16).to_be_bytes());
        batch[BASE_SEQUENCE_AT..BASE_SEQUENCE_AT + 4].copy_from_slice(&(-1i32).to_be_bytes());
        batch[RECORD_COUNT_AT..RECORD_COUNT_AT + 4].copy_from_slice(&record_count.to_be_bytes());
        let crc = crc32c::crc32c(&batch[CRC_COVERED_FROM..]);
        batch[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
        batch
    }

    /// A batch of an idempotent producer: `record_count` records from `base_sequence` on.
    pub fn build_idempotent_batch(record_count: i32, producer_id: i64, epoch: i16, base_sequence: i32) -> Vec<u8> {
        let mut batch = build_batch(record_count, 1_000, &[5u8; 32]);
        batch[PRODUCER_ID_AT..PRODUCER_ID_AT + 8].copy_from_slice(&producer_id.to_be_bytes());
        batch[PRODUCER_EPOCH_AT..PRODUCER_EPOCH_AT + 2].copy_from_slice(&epoch.to_be_bytes());
        batch[BASE_SEQUENCE_AT..BASE_SEQUENCE_AT + 4].copy_from_slice(&base_sequence.to_be_bytes());
        let crc = crc32c::crc32c(&batch[CRC_COVERED_FROM..]);
        batch[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
        batch
    }
}

#[cfg(test)]
mod tests {
    use super::test_batches::build_batch;
    use super::*;

    #[test]
    fn header_fields_round_trip() {
        let mut batch = build_batch(5, 1_000, b"opaque records");
        let header = BatchHeader::validate(&batch).expect("valid batch");
        assert_eq!(header.base_offset(), 0);
        assert_eq!(header.last_offset(), 4);
        assert_eq!(header.record_count(), 5);
        assert_eq!(header.max_timestamp(), 1_000);
        assert_eq!(header.total_size(), batch.len());
        assert_eq!(header.compression_code(), 0);

        set_base_offset(&mut batch, 42);
        set_partition_leader_epoch(&mut batch, 7);
        let header = BatchHeader::validate(&batch).expect("rewrites keep the CRC valid");
        assert_eq!(header.base_offset(), 42);
        assert_eq!(header.last_offset(), 46);
        assert_eq!(header.partition_leader_epoch(), 7);
    }

    #[test]
    fn log_append_time_stamps_the_batch_and_keeps_it_valid() {
        let mut batch = build_batch(3, 1_000, b"opaque records");
        assert!(!BatchHeader::validate(&batch).expect("valid").is_log_append_time());
        set_log_append_time(&mut batch, 5_000);
        let header = BatchHeader::validate(&batch).expect("the CRC is recomputed");
        assert!(header.is_log_append_time());
        assert_eq!(header.max_timestamp(), 5_000);
        assert_eq!(header.base_timestamp(), 1_000);
        assert_eq!(header.compression_code(), 0);
    }

    #[test]
    fn rejects_bad_batches() {
        let batch = build_batch(1, 0, b"x");
        assert!(matches!(BatchHeader::validate(&batch[..30]), Err(BatchError::TooShort { .. })));
        assert!(matches!(BatchHeader::validate(&batch[..batch.len() - 1]), Err(BatchError::BadLength { .. })));
        let mut bad_magic = batch.clone();
        bad_magic[MAGIC_AT] = 1;
        assert_eq!(BatchHeader::validate(&bad_magic).err(), Some(BatchError::BadMagic(1)));
        let mut flipped = batch.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 0xff;
        assert!(matches!(BatchHeader::validate(&flipped), Err(BatchError::CrcMismatch { .. })));
    }

    #[test]
    fn splits_record_sets() {
        let mut records = build_batch(2, 0, b"a");
        records.extend(build_batch(3, 0, b"bb"));
        let ranges = split_record_set(&records).expect("two batches");
        assert_eq!(ranges.len(), 2);
        assert_eq!(ranges[1].end, records.len());
        records.push(0);
        assert!(split_record_set(&records).is_err());
        assert!(split_record_set(&[]).is_err());
    }

    #[test]
    fn a_partial_last_batch_is_cut_off_and_nothing_else() {
        let mut records = build_batch(2, 0, b"a");
        let first = records.len();
        records.extend(build_batch(3, 0, b"bb"));
        assert_eq!(whole_batches_len(&records), records.len());
        for cut in [first + 1, first + LOG_OVERHEAD, first + HEADER_BYTES, records.len() - 1] {
            assert_eq!(whole_batches_len(&records[..cut]), first, "cut at {cut}");
        }
        assert_eq!(whole_batches_len(&[]), 0);
        // A negative length is damage, not a partial batch: left for validation.
        let mut bad = records.clone();
        bad[first + 8..first + 12].copy_from_slice(&(-5i32).to_be_bytes());
        assert_eq!(whole_batches_len(&bad), bad.len());
    }
}
