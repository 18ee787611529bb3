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
pub mod producer_state;
pub mod throttle;

pub use manager::ReplicaManager;
pub use partition::{Partition, PartitionError};
