//! Inbound quorum RPC: accepts connections on the `--raft` address and hands
//! each frame to openraft or to the application handler.
//!
//! A connection that sends a bad frame (too large, undecodable) is closed and
//! logged; other connections are unaffected. Connections are bounded by
//! [`MAX_CONNECTIONS`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::codec;
use crate::rpc::{read_frame, write_frame, RpcError, RpcRequest, RpcResponse};
use crate::types::Raft;

/// The most inbound quorum connections served at once.
pub const MAX_CONNECTIONS: usize = 256;

/// The node's handler for `App` requests (opaque bytes in, bytes out).
pub trait AppHandler: Send + Sync + 'static {
    fn handle(&self, request: Vec<u8>) -> Pin<Box<dyn Future<Output = Vec<u8>> + Send + '_>>;
}

/// Serves quorum RPC on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, raft: Raft, app: Arc<dyn AppHandler>) {
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
        tokio::spawn(async move {
            if let Err(e) = serve_connection(stream, raft, app).await {
                tracing::debug!(%peer, error = %e, "raft connection closed");
            }
            drop(permit);
        });
    }
}

async fn serve_connection(mut stream: TcpStream, raft: Raft, app: Arc<dyn AppHandler>) -> Result<(), RpcError> {
    stream.set_nodelay(true)?;
    while let Some(frame) = read_frame(&mut stream).await? {
        let request: RpcRequest = codec::decode(&frame)?;
        let response = match request {
            RpcRequest::AppendEntries(r) => RpcResponse::AppendEntries(raft.append_entries(r).await),
            RpcRequest::InstallSnapshot(r) => RpcResponse::InstallSnapshot(raft.install_snapshot(r).await),
            RpcRequest::Vote(r) => RpcResponse::Vote(raft.vote(r).await),
            RpcRequest::App(bytes) => RpcResponse::App(app.handle(bytes).await),
        };
        write_frame(&mut stream, &codec::encode(&response)?).await?;
    }
    Ok(())
}
