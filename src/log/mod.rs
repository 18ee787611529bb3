//! Partition log storage: Kafka's on-disk log for one topic partition, and
//! the settings and errors shared by its parts. Knows nothing of the network
//! protocol or of replication; the partition layer above calls it, decides
//! who may append and how far consumers may read (the high watermark), and
//! serialises access (reads take `&self`, everything else `&mut self`).
//!
//! On-disk contract, per partition directory `<logs dir>/<topic>-<partition>/`:
//! `<base offset, 20 digits>.log` holds v2 record batches exactly as received
//! (only baseOffset and partitionLeaderEpoch rewritten); `.index` and
//! `.timeindex` beside it are sparse indexes rebuilt whenever they are in
//! doubt; `leader-epoch-checkpoint` holds epoch → start offset in Kafka's text
//! format. The per-data-dir recovery-point and high-watermark checkpoints use
//! [`checkpoint::OffsetCheckpointFile`].
//!
//! Map: [`batch`] (header view), [`offset_index`], [`time_index`],
//! [`segment`] (one `.log` plus its indexes, recovery scan), [`leader_epoch`],
//! [`checkpoint`] (atomic writes), [`partition_log`] (the log itself),
//! [`slice`] (a file range a Fetch sends without copying),
//! [`validator`] (per-record checks a leader makes before appending),
//! [`txn`] (transaction markers and the aborted transactions).

pub mod batch;
pub mod checkpoint;
pub mod compaction;
mod index_file;
pub mod leader_epoch;
pub mod offset_index;
pub mod partition_log;
pub mod segment;
pub mod slice;
pub mod time_index;
pub mod txn;
pub mod validator;

use std::path::PathBuf;

use thiserror::Error;

pub use batch::{BatchError, BatchHeader};
pub use leader_epoch::{EpochEndOffset, EpochEntry};
pub use partition_log::{AppendInfo, FlushTicket, PartitionLog, RetentionOutcome, TimestampOffset};
pub use slice::FileSlice;
pub use validator::{RecordError, RecordValidationError, TimestampType};

/// Largest segment Strom accepts: index positions are 32-bit and Kafka caps
/// `segment.bytes` at `Int.MaxValue` too.
pub const SEGMENT_BYTES_MAX: u64 = i32::MAX as u64;

/// Per-log settings, named after Kafka's topic configs (`segment.bytes`,
/// `segment.ms`, `retention.ms`, ...). `None` means "unset / unlimited",
/// where Kafka would use -1 or leave the setting out.
#[derive(Debug, Clone, PartialEq)]
pub struct LogConfig {
    /// Roll to a new segment once the active one would exceed this size.
    pub segment_bytes: u64,
    /// Roll once the active segment is this old (and not empty).
    pub segment_ms: u64,
    /// Delete sealed segments whose largest timestamp is older than this.
    pub retention_ms: Option<u64>,
    /// Delete the oldest sealed segments while the log is larger than this.
    pub retention_bytes: Option<u64>,
    /// fsync after this many records since the last flush.
    pub flush_messages: Option<u64>,
    /// fsync once this long has passed since the last flush.
    pub flush_ms: Option<u64>,
    /// Bytes of batches between two sparse index entries.
    pub index_interval_bytes: u64,
    /// Largest offset or time index file; a full index rolls the segment.
    pub segment_index_bytes: u64,
    /// Largest batch accepted (`max.message.bytes`, whole batch size).
    pub max_message_bytes: u64,
    /// Compact sealed segments (see [`compaction`]): `cleanup.policy`
    /// includes compact.
    pub compact: bool,
    /// `min.cleanable.dirty.ratio`: compact once the uncleaned part of the
    /// cleanable log is at least this share of it.
    pub min_cleanable_dirty_ratio: f64,
    /// `min.compaction.lag.ms`: a segment whose newest record is younger
    /// is not cleaned yet (0: no lag).
    pub min_compaction_lag_ms: u64,
    /// `max.compaction.lag.ms`: an uncleaned segment older than this is
    /// cleaned whatever the dirty ratio (`None`: no bound).
    pub max_compaction_lag_ms: Option<u64>,
    /// `delete.retention.ms`: a key's latest tombstone stays this long
    /// after its segment was last written.
    pub delete_retention_ms: u64,
    /// `log.cleaner.io.max.bytes.per.second` (a broker setting): the pace
    /// of the cleaner's reads and writes (`None`: no bound).
    pub cleaner_io_max_bytes_per_second: Option<f64>,
    /// Refuse records without a key (`cleanup.policy` includes compact).
    pub keys_required: bool,
    /// `message.timestamp.type`: LogAppendTime stamps batches with the
    /// broker's clock on the leader.
    pub timestamp_type: TimestampType,
    /// CreateTime records older than now minus this are refused
    /// (`message.timestamp.before.max.ms`); `None`: no bound.
    pub timestamp_before_max_ms: Option<u64>,
    /// CreateTime records newer than now plus this are refused
    /// (`message.timestamp.after.max.ms`); `None`: no bound.
    pub timestamp_after_max_ms: Option<u64>,
}

impl Default for LogConfig {
    /// Kafka's broker defaults.
    fn default() -> Self {
        Self {
            segment_bytes: 1_073_741_824,
            segment_ms: 604_800_000,
            retention_ms: Some(604_800_000),
            retention_bytes: None,
            flush_messages: None,
            flush_ms: None,
            index_interval_bytes: 4096,
            segment_index_bytes: 10_485_760,
            max_message_bytes: 1_048_588,
            compact: false,
            min_cleanable_dirty_ratio: 0.5,
            min_compaction_lag_ms: 0,
            max_compaction_lag_ms: None,
            delete_retention_ms: 86_400_000,
            cleaner_io_max_bytes_per_second: None,
            keys_required: false,
            timestamp_type: TimestampType::CreateTime,
            timestamp_before_max_ms: None,
            timestamp_after_max_ms: None,
        }
    }
}

impl LogConfig {
    /// Rejects settings the log cannot honour.
    pub fn validate(&self) -> Result<(), LogError> {
        let invalid = |reason: &'static str| Err(LogError::InvalidConfig(reason));
        if self.segment_bytes < batch::HEADER_BYTES as u64 || self.segment_bytes > SEGMENT_BYTES_MAX {
            return invalid("segment_bytes must be between 61 and 2147483647");
        }
        if self.max_message_bytes > SEGMENT_BYTES_MAX {
            return invalid("max_message_bytes must be at most 2147483647");
        }
        if self.index_interval_bytes == 0 {
            return invalid("index_interval_bytes must be positive");
        }
        if self.segment_index_bytes < 12 {
            return invalid("segment_index_bytes must hold at least one entry");
        }
        if self.flush_messages == Some(0) {
            return invalid("flush_messages must be positive when set");
        }
        Ok(())
    }
}

/// Everything the log can fail with. The partition layer maps these to
/// Kafka error codes (CORRUPT_MESSAGE, MESSAGE_TOO_LARGE,
/// OFFSET_OUT_OF_RANGE, KAFKA_STORAGE_ERROR) in one place.
#[derive(Debug, Error)]
pub enum LogError {
    #[error("log i/o error: {0}")]
    Io(#[from] std::io::Error),
    #[error("corrupt record batch: {0}")]
    CorruptBatch(#[from] BatchError),
    #[error("batch of {size} bytes exceeds max message bytes {max}")]
    MessageTooLarge { size: u64, max: u64 },
    #[error("offset {offset} is outside the log [{log_start_offset}, {log_end_offset}]")]
    OffsetOutOfRange { offset: i64, log_start_offset: i64, log_end_offset: i64 },
    #[error("batch base offset {base_offset} is below the log end offset {log_end_offset}")]
    NonMonotonicAppend { base_offset: i64, log_end_offset: i64 },
    #[error("leader epoch {epoch} is older than the latest epoch {latest_epoch} in the log")]
    StaleLeaderEpoch { epoch: i32, latest_epoch: i32 },
    #[error("index append rejected: {0}")]
    InvalidIndexAppend(String),
    #[error("corrupt checkpoint file {path}: {reason}")]
    CorruptCheckpoint { path: PathBuf, reason: String },
    #[error("invalid log config: {0}")]
    InvalidConfig(&'static str),
    /// A batch the cleaner could not decode or re-encode: it leaves the
    /// segment as it is.
    #[error("compaction: {0}")]
    Compaction(String),
    /// Records the topic's configs refuse (KIP-467: answered per record).
    #[error(transparent)]
    InvalidRecords(#[from] RecordValidationError),
}

pub type Result<T, E = LogError> = std::result::Result<T, E>;
