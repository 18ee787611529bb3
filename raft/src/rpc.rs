//! The quorum RPC wire format: a 4-byte big-endian length, then one encoded
//! [`RpcRequest`] or [`RpcResponse`]. Frames above [`MAX_FRAME_BYTES`] are
//! refused before anything is allocated for them; every call is bounded by a
//! timeout. `App` carries the node's own requests to the controller (broker
//! registration, heartbeats, admin writes) as opaque bytes.

use std::time::Duration;

use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::codec::{self, CodecError};
use crate::types::{NodeId, TypeConfig};

/// The largest frame either side accepts. Snapshot chunks are sized well below.
pub const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;
/// How long a connection attempt may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug, Serialize, Deserialize)]
pub enum RpcRequest {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    App(Vec<u8>),
}

#[derive(Debug, Serialize, Deserialize)]
pub enum RpcResponse {
    AppendEntries(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    InstallSnapshot(Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    App(Vec<u8>),
}

#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    #[error("cannot connect to {addr}: {source}")]
    Connect { addr: String, source: std::io::Error },
    #[error("connecting to {0} timed out")]
    ConnectTimeout(String),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("call timed out after {0:?}")]
    Timeout(Duration),
    #[error("frame of {0} bytes is larger than the {MAX_FRAME_BYTES}-byte limit")]
    FrameTooLarge(usize),
    #[error("bad frame: {0}")]
    Codec(#[from] CodecError),
    #[error("peer answered with the wrong kind of response")]
    UnexpectedResponse,
}

/// Writes one frame.
pub async fn write_frame(stream: &mut TcpStream, payload: &[u8]) -> Result<(), RpcError> {
    if payload.len() > MAX_FRAME_BYTES {
        return Err(RpcError::FrameTooLarge(payload.len()));
    }
    let len = u32::try_from(payload.len()).map_err(|_| RpcError::FrameTooLarge(payload.len()))?;
    stream.write_all(&len.to_be_bytes()).await?;
    stream.write_all(payload).await?;
    Ok(())
}

/// Reads one frame; `Ok(None)` on a clean end of stream before a frame.
pub async fn read_frame(stream: &mut TcpStream) -> Result<Option<Vec<u8>>, RpcError> {
    let mut len = [0u8; 4];
    match stream.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(RpcError::FrameTooLarge(len));
    }
    let mut buf = vec![0u8; len];
    stream.read_exact(&mut buf).await?;
    Ok(Some(buf))
}

/// One outbound connection, opened lazily and dropped after any error so the
/// next call starts clean.
#[derive(Debug)]
pub struct Connection {
    addr: String,
    stream: Option<TcpStream>,
}

impl Connection {
    pub fn new(addr: impl Into<String>) -> Self {
        Self { addr: addr.into(), stream: None }
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    async fn connect(&mut self) -> Result<&mut TcpStream, RpcError> {
        if self.stream.is_none() {
            let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&self.addr))
                .await
                .map_err(|_| RpcError::ConnectTimeout(self.addr.clone()))?
                .map_err(|source| RpcError::Connect { addr: self.addr.clone(), source })?;
            stream.set_nodelay(true)?;
            self.stream = Some(stream);
        }
        self.stream.as_mut().ok_or(RpcError::UnexpectedResponse)
    }

    /// Sends `request` and waits for its response, all within `timeout`.
    pub async fn call(&mut self, request: &RpcRequest, timeout: Duration) -> Result<RpcResponse, RpcError> {
        let payload = codec::encode(request)?;
        let result = tokio::time::timeout(timeout, async {
            let stream = self.connect().await?;
            write_frame(stream, &payload).await?;
            match read_frame(stream).await? {
                Some(frame) => Ok(codec::decode::<RpcResponse>(&frame)?),
                None => Err(RpcError::Io(std::io::ErrorKind::UnexpectedEof.into())),
            }
        })
        .await
        .unwrap_or(Err(RpcError::Timeout(timeout)));
        if result.is_err() {
            self.stream = None;
        }
        result
    }

    /// Sends an application request and returns the application's answer.
    pub async fn call_app(&mut self, request: Vec<u8>, timeout: Duration) -> Result<Vec<u8>, RpcError> {
        match self.call(&RpcRequest::App(request), timeout).await? {
            RpcResponse::App(bytes) => Ok(bytes),
            _ => Err(RpcError::UnexpectedResponse),
        }
    }
}
