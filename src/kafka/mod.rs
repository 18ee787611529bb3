//! The Kafka wire front end.
//!
//! - [`connection`]: accept loop and per-connection task: 4-byte length
//!   framing bounded by `socket.request.max.bytes`, pipelined requests with a
//!   bounded number in flight, responses in request order, idle timeout.
//! - [`frame`]: response frames in pieces, so a Fetch's records go from the
//!   segment file to the socket (`sendfile`) without being copied.
//! - [`fetch_session`]: incremental fetch sessions (KIP-227): a client that
//!   fetches the same partitions sends and receives only what changed.
//! - [`registry`]: the one table of supported APIs and versions; it both
//!   dispatches and answers ApiVersions.
//! - [`authorized_operations`]: what Metadata, DescribeCluster and
//!   DescribeGroups report a caller may do with a resource.
//! - [`handlers`]: one file per API (or small family); handlers take decoded
//!   values and return responses, and never touch the socket.
//!
//! A malformed frame, an unknown API or an unsupported version closes that
//! connection with a log line (ApiVersions answers UNSUPPORTED_VERSION, as
//! KIP-511 prescribes); other connections are unaffected.

pub mod authorized_operations;
pub mod connection;
pub mod fetch_session;
pub mod frame;
pub mod handlers;
pub mod producer_ids;
pub mod registry;

pub use connection::serve;
