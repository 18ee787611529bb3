//! Strom: a Kafka-compatible message broker cluster in one binary.
//!
//! Module map:
//! - [`config`]: settings by their Kafka names and their validation.
//! - [`error`]: Kafka error codes and the one mapping onto them.
//! - [`node`]: wires a node together (quorum, controller, lifecycle, admin).
//! - [`controller`]: the controller role on the quorum leader: liveness and
//!   fencing, replica placement, leader election, topic decisions.
//! - [`lifecycle`]: the broker's registration, heartbeats, controlled shutdown.
//! - [`log`]: partition storage: segments, indexes, recovery, retention.
//! - [`kafka`]: the Kafka wire front end: listener, registry, handlers.
//! - [`replication`]: partition replicas on this broker (role, high
//!   watermark, producer state) kept in step with the metadata image.
//! - [`group`]: the consumer-group coordinator and `__consumer_offsets`.
//! - [`txn`]: the transaction coordinator and `__transaction_state`.
//! - [`admin`]: the HTTP admin API and metrics.
//! - [`pattern`]: regular expressions matched against whole names.
//! - [`cluster`]: `strom cluster`, N nodes from one binary.
//! - [`cli`]: the admin subcommands, clients of the HTTP API.
//!
//! The metadata quorum itself (records, image, sled store, RPC) is the
//! `strom-raft` crate.

pub mod admin;
pub mod cli;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod controller;
pub mod error;
pub mod group;
pub mod kafka;
pub mod lifecycle;
pub mod log;
pub mod node;
pub mod pattern;
pub mod replication;
pub mod security;
pub mod txn;
