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
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::codec::{self, CodecError};
use crate::tls::{self, ClientStream, NodeTls};
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
pub async fn write_frame<S: AsyncWrite + Unpin>(stream: &mut S, payload: &[u8]) -> Result<(), RpcError> {
    if payload.len() > MAX_FRAME_BYTES {
        return Err(RpcError::FrameTooLarge(payload.len()));
    }
    let len = u32::try_from(payload.len()).map_err(|_| RpcError::FrameTooLarge(payload.len()))?;
    stream.write_all(&len.to_be_bytes()).await?;
    stream.write_all(payload).await?;
    // A TLS stream may hold the frame's end in its buffer until flushed.
    stream.flush().await?;
    Ok(())
}

/// Reads one frame; `Ok(None)` on a clean end of stream before a frame.
pub async fn read_frame<S: AsyncRead + Unpin>(stream: &mut S) -> Result<Option<Vec<u8>>, RpcError> {
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
///
/// A call holds the stream only while it runs and gives it back after a whole
/// answer. A call cancelled midway (its caller's own timeout: openraft wraps
/// every RPC in one of the same length) drops the connection with it. Kept
/// instead, the stream would hold the cancelled call's answer, and the next
/// call would read that answer as its own: a stale AppendEntries success or
/// conflict credited to a later request.
#[derive(Debug)]
pub struct Connection {
    addr: String,
    stream: Option<ClientStream>,
    /// Mutual TLS to the peer (`quorum.security.protocol=SSL`).
    tls: Option<NodeTls>,
}

impl std::fmt::Debug for ClientStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if matches!(self, ClientStream::Tls(_)) { "tls" } else { "plain" })
    }
}

impl Connection {
    pub fn new(addr: impl Into<String>) -> Self {
        Self::with_tls(addr, None)
    }

    pub fn with_tls(addr: impl Into<String>, tls: Option<NodeTls>) -> Self {
        Self { addr: addr.into(), stream: None, tls }
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The idle stream, taken out of the connection, or a new one.
    ///
    /// An idle stream is kept only while the peer still holds its end. A peer
    /// that restarted closed it, and a request written to it would be lost with
    /// no way to tell whether it ran: fatal for requests that must not be sent
    /// twice. So the stream is probed first, without waiting.
    async fn take_or_connect(&mut self) -> Result<ClientStream, RpcError> {
        if let Some(stream) = self.stream.take() {
            if still_open(stream.tcp()) {
                return Ok(stream);
            }
            tracing::debug!(addr = %self.addr, "idle connection closed by the peer; reconnecting");
        }
        let config = self.tls.as_ref().map(NodeTls::client);
        match tls::connect(&self.addr, config.as_ref(), CONNECT_TIMEOUT).await {
            Ok(stream) => Ok(stream),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Err(RpcError::ConnectTimeout(self.addr.clone())),
            Err(source) => Err(RpcError::Connect { addr: self.addr.clone(), source }),
        }
    }

    /// Sends `request` and waits for its response, all within `timeout`.
    pub async fn call(&mut self, request: &RpcRequest, timeout: Duration) -> Result<RpcResponse, RpcError> {
        let payload = codec::encode(request)?;
        let exchange = async {
            let mut stream = self.take_or_connect().await?;
            write_frame(&mut stream, &payload).await?;
            match read_frame(&mut stream).await? {
                Some(frame) => Ok((stream, codec::decode::<RpcResponse>(&frame)?)),
                None => Err(RpcError::Io(std::io::ErrorKind::UnexpectedEof.into())),
            }
        };
        let (stream, response) =
            tokio::time::timeout(timeout, exchange).await.unwrap_or(Err(RpcError::Timeout(timeout)))?;
        self.stream = Some(stream);
        Ok(response)
    }

    /// Sends an application request and returns the application's answer.
    pub async fn call_app(&mut self, request: Vec<u8>, timeout: Duration) -> Result<Vec<u8>, RpcError> {
        match self.call(&RpcRequest::App(request), timeout).await? {
            RpcResponse::App(bytes) => Ok(bytes),
            _ => Err(RpcError::UnexpectedResponse),
        }
    }
}

/// Whether an idle stream's peer still holds its end: nothing to read yet.
///
/// A peek that does not wait: end of stream or a reset means the peer closed
/// it; bytes mean an answer nobody asked for (or, under TLS, the peer's
/// close_notify), so the stream is out of step.
/// Asked of the socket itself, not of the runtime's readiness, which learns of
/// a close only when its reactor next runs.
fn still_open(stream: &TcpStream) -> bool {
    let mut byte = [std::mem::MaybeUninit::<u8>::uninit()];
    match socket2::SockRef::from(stream).peek(&mut byte) {
        Err(err) => err.kind() == std::io::ErrorKind::WouldBlock,
        Ok(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A peer that answers each `App` request with its own bytes, the first one late.
    async fn slow_first_echo() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut first = true;
                    while let Ok(Some(frame)) = read_frame(&mut stream).await {
                        let RpcRequest::App(bytes) = codec::decode(&frame).expect("request") else { return };
                        if std::mem::take(&mut first) {
                            tokio::time::sleep(Duration::from_millis(300)).await;
                        }
                        let answer = codec::encode(&RpcResponse::App(bytes)).expect("encode");
                        if write_frame(&mut stream, &answer).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn a_call_cancelled_by_its_caller_leaves_no_answer_for_the_next_call() {
        let mut conn = Connection::new(slow_first_echo().await);
        // The caller gives up first, as openraft's own timeout around an RPC does.
        let cancelled =
            tokio::time::timeout(Duration::from_millis(50), conn.call_app(b"first".to_vec(), Duration::from_secs(5)))
                .await;
        assert!(cancelled.is_err(), "the slow call was not cancelled");
        let answer = conn.call_app(b"second".to_vec(), Duration::from_secs(5)).await.expect("second call");
        assert_eq!(answer, b"second", "the second call read the cancelled call's answer");
        // And the connection is reused once an answer came back whole.
        assert!(conn.stream.is_some());
        assert_eq!(conn.call_app(b"third".to_vec(), Duration::from_secs(5)).await.expect("third call"), b"third");
    }

    /// A peer that answers one `App` request per connection, then closes it.
    async fn one_answer_per_connection() -> (String, tokio::sync::mpsc::UnboundedReceiver<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let (closed_tx, closed_rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                if let Ok(Some(frame)) = read_frame(&mut stream).await {
                    let RpcRequest::App(bytes) = codec::decode(&frame).expect("request") else { return };
                    let answer = codec::encode(&RpcResponse::App(bytes)).expect("encode");
                    let _ = write_frame(&mut stream, &answer).await;
                }
                drop(stream);
                let _ = closed_tx.send(());
            }
        });
        (addr, closed_rx)
    }

    #[tokio::test]
    async fn an_idle_connection_the_peer_closed_is_replaced_before_a_call() {
        let (addr, mut closed) = one_answer_per_connection().await;
        let mut conn = Connection::new(addr);
        assert_eq!(conn.call_app(b"first".to_vec(), Duration::from_secs(5)).await.expect("first call"), b"first");
        closed.recv().await.expect("the peer closed its end");
        // The pooled stream is dead (as after a controller restart); the call
        // must go out on a new one instead of being lost on the old.
        assert!(conn.stream.is_some(), "the first stream was not pooled");
        let answer = conn.call_app(b"second".to_vec(), Duration::from_secs(5)).await;
        assert_eq!(answer.expect("second call after the peer closed"), b"second");
    }

    #[tokio::test]
    async fn an_idle_connection_the_peer_holds_is_reused() {
        let mut conn = Connection::new(slow_first_echo().await);
        conn.call_app(b"first".to_vec(), Duration::from_secs(5)).await.expect("first call");
        let before = conn.stream.as_ref().expect("pooled").tcp().local_addr().expect("local addr");
        conn.call_app(b"second".to_vec(), Duration::from_secs(5)).await.expect("second call");
        let after = conn.stream.as_ref().expect("pooled").tcp().local_addr().expect("local addr");
        assert_eq!(before, after, "a live idle stream was replaced");
    }
}
