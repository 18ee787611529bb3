//! `strom-raft`: the metadata quorum of a Strom cluster.
//!
//! This crate owns everything the cluster agrees on through Raft and nothing
//! else: it knows no Kafka sockets and no partition segments.
//!
//! - [`records`]: the metadata records (KRaft's names) that make up the log.
//! - [`image`]: the metadata image, a pure, deterministic fold of the records.
//! - [`codec`]: the one place that turns stored and sent values into bytes.
//! - [`log_store`] and [`state_machine`]: openraft's storage traits over sled,
//!   under `data-dir/meta`; [`durable`] fsyncs what sled's flush leaves unsynced.
//! - [`rpc`], [`network`] and [`server`]: the quorum RPC transport on the
//!   `--raft` address (framed, size-bounded, time-bounded).
//! - [`quorum`]: starts a node's share of the quorum and is the handle the
//!   rest of Strom uses to propose records and read the applied image.

// openraft's `StorageError` is large by its design; the storage traits return it.
#![allow(clippy::result_large_err)]

pub mod codec;
pub mod durable;
pub mod image;
pub mod log_store;
pub mod network;
pub mod quorum;
pub mod records;
pub mod rpc;
pub mod server;
pub mod state_machine;
pub mod tls;
pub mod types;

pub use image::{BrokerRegistration, MetadataImage, PartitionRegistration, TopicImage};
pub use quorum::{Quorum, QuorumConfig, QuorumError};
pub use records::{BrokerState, ConfigResource, LeaderChange, MetadataRecord, TopicId};
pub use types::{MetaCommand, NodeId, TypeConfig};
