//! Who may connect and as whom: Kafka listeners with their security
//! protocols ([`listeners`]), TLS from PEM files ([`tls`]), SASL PLAIN and
//! SCRAM ([`sasl`], [`scram`]), SCRAM credentials kept in the metadata
//! quorum ([`users`]), and the certificate authority of `strom cluster
//! --secure` and the tests ([`certs`]).
//!
//! Security is a layer around the handlers: a connection authenticates,
//! and carries its principal into every request it sends.

pub mod acl;
pub mod certs;
pub mod listeners;
pub mod quotas;
pub mod sasl;
pub mod scram;
pub mod tls;
pub mod users;

pub use listeners::{Listener, SecurityProtocol};
