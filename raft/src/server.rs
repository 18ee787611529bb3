//! Inbound quorum RPC: accepts connections on the `--raft` address and hands
//! each frame to openraft or to the application handler.
//!
//! A connection that sends a bad frame (too large, undecodable) is closed and
//! logged; other connections are unaffected. Connections are bounded by
//! [`MAX_CONNECTIONS`].

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::net::TcpListener;

use crate::tls::ServerStream;
use tokio::sync::Semaphore;

use crate::codec;
use crate::rpc::{read_frame, write_frame, RpcError, RpcRequest, RpcResponse};
use crate::types::{NodeId, Raft};

/// The most inbound quorum connections served at once.
pub const MAX_CONNECTIONS: usize = 256;

/// The node's handler for `App` requests (opaque bytes in, bytes out).
pub trait AppHandler: Send + Sync + 'static {
    fn handle(&self, request: Vec<u8>) -> Pin<Box<dyn Future<Output = Vec<u8>> + Send + '_>>;
}

/// When this node last heard from each quorum leader: the arrival of its
/// latest AppendEntries (a leader's heartbeats are AppendEntries too). A new
/// controller reads it to know how long its predecessor has been silent.
#[derive(Debug, Clone, Default)]
pub struct LeaderContact(Arc<Mutex<HashMap<NodeId, Instant>>>);

impl LeaderContact {
    fn heard(&self, leader: NodeId) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(leader, Instant::now());
    }

    /// The leader other than `me` heard from last, with when: the previous
    /// leader, as seen from `me` when `me` has just been elected.
    pub fn latest_other_than(&self, me: NodeId) -> Option<(NodeId, Instant)> {
        let heard = self.0.lock().unwrap_or_else(|e| e.into_inner());
        heard.iter().filter(|(id, _)| **id != me).max_by_key(|(_, at)| **at).map(|(id, at)| (*id, *at))
    }
}

/// Serves quorum RPC on `listener` until the task is dropped.
pub async fn serve(
    listener: TcpListener,
    raft: Raft,
    app: Arc<dyn AppHandler>,
    contact: LeaderContact,
    tls: Option<crate::tls::NodeTls>,
) {
    let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "raft listener accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = limit.clone().acquire_owned().await else { return };
        let raft = raft.clone();
        let app = app.clone();
        let contact = contact.clone();
        let config = tls.as_ref().map(crate::tls::NodeTls::server);
        tokio::spawn(async move {
            match crate::tls::accept(stream, config.as_ref(), HANDSHAKE_TIMEOUT).await {
                Ok(stream) => {
                    if let Err(e) = serve_connection(stream, raft, app, contact).await {
                        tracing::debug!(%peer, error = %e, "raft connection closed");
                    }
                }
                // A node without a certificate of this cluster's CA.
                Err(e) => tracing::warn!(%peer, error = %e, "raft connection refused: TLS handshake failed"),
            }
            drop(permit);
        });
    }
}

/// Longest a peer may take over its TLS handshake.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

async fn serve_connection(
    mut stream: ServerStream,
    raft: Raft,
    app: Arc<dyn AppHandler>,
    contact: LeaderContact,
) -> Result<(), RpcError> {
    while let Some(frame) = read_frame(&mut stream).await? {
        let request: RpcRequest = codec::decode(&frame)?;
        let response = match request {
            RpcRequest::AppendEntries(r) => {
                if let Some(leader) = r.vote.leader_id().voted_for() {
                    contact.heard(leader);
                }
                RpcResponse::AppendEntries(raft.append_entries(r).await)
            }
            RpcRequest::InstallSnapshot(r) => RpcResponse::InstallSnapshot(raft.install_snapshot(r).await),
            RpcRequest::Vote(r) => RpcResponse::Vote(raft.vote(r).await),
            RpcRequest::App(bytes) => RpcResponse::App(app.handle(bytes).await),
        };
        write_frame(&mut stream, &codec::encode(&response)?).await?;
    }
    Ok(())
}
