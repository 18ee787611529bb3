//! Partition replicas on this broker and how they follow the metadata image.
//!
//! - [`partition`]: one replica: log, role, high watermark, producer state.
//! - [`producer_state`]: idempotent-producer sequence checks (pure).
//! - [`manager`]: opens, re-roles and deletes replicas as the applied
//!   metadata image changes; flush, retention and checkpoint timers.
//!
//! Follower fetching ([`fetcher`], with an incremental fetch session per
//! leader: [`fetch_session`]) and ISR changes build on these.

pub mod client;
pub mod disk;
pub mod fetch_session;
pub mod fetcher;
pub mod isr;
pub mod isr_sync;
pub mod manager;
pub mod partition;
pub mod producer_snapshot;
pub mod producer_state;
pub mod throttle;

pub use manager::ReplicaManager;

/// Appends of at least this many bytes of records (a produce request's, a
/// follower's Fetch answer's) are made on a blocking thread: their write can
/// take long enough to hold up every connection an async thread serves.
/// Smaller ones are made where they arrive: handing them to another thread
/// and back costs more than their write (with 16 producers of 16 KiB
/// requests and `flush.messages=1`, 37% of the throughput).
pub const APPEND_OFF_THREAD_BYTES: usize = 256 << 10;
pub use partition::{Partition, PartitionError};
