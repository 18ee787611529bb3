//! Accepts Kafka connections and serves each one.
//!
//! One task reads frames and starts a handler task per request; a second
//! task writes the answers in request order. At most [`MAX_IN_FLIGHT`]
//! requests of one connection are pending, so a client that pipelines (as
//! librdkafka does) keeps the broker busy while acks=all answers wait.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};

use super::frame::{BufferedTcp, FrameWriter, ResponseFrame, WriteSide, TLS_READ_BUFFER_BYTES};
use super::registry::{self, PendingResponse, Session};
use crate::node::NodeContext;
use crate::security::sasl::{Mechanism, Outcome, SaslExchange};
use crate::security::tls::{certificate_subject, TlsSource};
use crate::security::SecurityProtocol;

/// Requests of one connection handled at once.
pub const MAX_IN_FLIGHT: usize = 64;
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 4096;
/// Requests that change a consumer group before their handler first waits.
/// The reader runs each of them up to that first wait itself, before it
/// reads the next frame, so they reach the group coordinator in the order
/// they arrived, as Kafka handles a connection's requests in order. Started
/// in separate tasks instead, two pipelined OffsetCommits could be appended
/// to `__consumer_offsets` in either order, and the last record written wins
/// (an async commit confirmed, then an older offset fetched).
const STARTED_IN_ORDER: &[ApiKey] = &[
    ApiKey::OffsetCommit,
    ApiKey::OffsetDelete,
    ApiKey::JoinGroup,
    ApiKey::SyncGroup,
    ApiKey::Heartbeat,
    ApiKey::LeaveGroup,
];
/// A connection's read buffer is kept between frames up to this size.
const RETAINED_READ_BUFFER_BYTES: usize = 2 << 20;
/// A connection that sends nothing for this long gives its read buffer back.
const IDLE_BUFFER_RELEASE: Duration = Duration::from_millis(200);
/// The smallest well-formed request: api key, version, correlation id, client id length.
const MIN_FRAME_BYTES: usize = 10;
/// Longest a client may take over its TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// What a connection may send before it has authenticated on a SASL listener.
const BEFORE_AUTHENTICATION: &[ApiKey] = &[ApiKey::ApiVersions, ApiKey::SaslHandshake, ApiKey::SaslAuthenticate];
/// The principal of a client that did not authenticate (Kafka's name).
pub const ANONYMOUS: &str = "User:ANONYMOUS";

/// One Kafka listener, as its connections are served.
pub struct ListenerSpec {
    pub name: Arc<str>,
    pub protocol: SecurityProtocol,
    /// The listener's TLS configuration (SSL and SASL_SSL).
    pub tls: Option<Arc<TlsSource>>,
    /// `sasl.enabled.mechanisms` (SASL_PLAINTEXT and SASL_SSL).
    pub sasl: Vec<Mechanism>,
}

/// Why a connection was closed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error(
        "frame of {size} bytes is over the limit of {max} (socket.request.max.bytes; \
         sasl.server.max.receive.size before SASL authentication)"
    )]
    FrameTooLarge { size: usize, max: usize },
    #[error("frame of {0} bytes is too short for a request header")]
    FrameTooShort(usize),
    #[error("unknown API key {0}")]
    UnknownApi(i16),
    #[error("unsupported version {version} of {api:?}")]
    UnsupportedVersion { api: ApiKey, version: i16 },
    #[error("malformed {api:?} v{version} request: {reason}")]
    Malformed { api: ApiKey, version: i16, reason: String },
    #[error("idle for longer than connections.max.idle.ms")]
    Idle,
    #[error("TLS handshake failed: {0}")]
    Tls(std::io::Error),
    #[error("{0:?} before SASL authentication")]
    Unauthenticated(ApiKey),
    #[error("SASL authentication failed")]
    AuthenticationFailed,
}

/// Serves Kafka on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    spec: Arc<ListenerSpec>,
    ctx: Arc<NodeContext>,
    mut shutdown: watch::Receiver<bool>,
) {
    let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let memory = RequestMemory::new(ctx.settings.int("queued.max.request.bytes").unwrap_or(-1));
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.changed() => return,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "kafka accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            tracing::warn!(%peer, "too many kafka connections; refusing one");
            continue;
        };
        let (ctx, memory, spec) = (ctx.clone(), memory.clone(), spec.clone());
        tokio::spawn(async move {
            let listener = spec.name.clone();
            match accept_connection(stream, peer, spec, ctx, memory).await {
                Ok(()) | Err(ConnectionError::Idle) => tracing::debug!(%peer, "kafka connection closed"),
                Err(ConnectionError::Io(e)) => tracing::debug!(%peer, error = %e, "kafka connection closed"),
                Err(e @ (ConnectionError::Tls(_) | ConnectionError::AuthenticationFailed)) => {
                    tracing::info!(%peer, %listener, error = %e, "kafka connection refused")
                }
                Err(e) => tracing::warn!(%peer, %listener, error = %e, "kafka connection closed after a bad request"),
            }
            drop(permit);
        });
    }
}

/// The bound on the memory of request frames, shared by every connection
/// (`queued.max.request.bytes`). A frame's bytes are reserved once its
/// length is read, before its body is. A connection's kept read buffer stays
/// reserved while it is kept, and is given back (with its memory) when the
/// connection has been quiet for [`IDLE_BUFFER_RELEASE`], when it must wait
/// for a reservation, or after a frame while other connections wait. A
/// connection that waits stops reading its socket, so TCP pushes back on
/// the client; waiters are served in order.
#[derive(Clone)]
pub struct RequestMemory(Option<Arc<Bound>>);

struct Bound {
    semaphore: Arc<Semaphore>,
    bytes: u32,
    /// Connections waiting for a reservation.
    waiting: AtomicUsize,
}

/// A connection's kept read buffer and the reservation that covers it.
#[derive(Default)]
struct ReadBuffer {
    buf: BytesMut,
    held: Option<OwnedSemaphorePermit>,
    /// A frame was read into `buf` since the last release: it may own
    /// memory even when its capacity reads 0 (a frame that filled it was
    /// split off, and the allocation is reclaimed by the next reserve).
    used: bool,
}

impl ReadBuffer {
    fn held(&self) -> usize {
        self.held.as_ref().map_or(0, |p| p.num_permits())
    }

    /// Holds neither memory nor a reservation.
    fn released(&self) -> bool {
        !self.used && self.held.is_none()
    }

    /// Gives the buffer's memory and its reservation back.
    fn release(&mut self) {
        self.buf = BytesMut::new();
        self.held = None;
        self.used = false;
    }
}

impl RequestMemory {
    /// `bytes` < 0: no bound.
    pub fn new(bytes: i64) -> Self {
        let bytes = u32::try_from(bytes).ok().map(|b| b.max(1));
        Self(bytes.map(|bytes| {
            Arc::new(Bound { semaphore: Arc::new(Semaphore::new(bytes as usize)), bytes, waiting: AtomicUsize::new(0) })
        }))
    }

    /// Reserves room for a frame of `size` bytes (at most the whole bound):
    /// into `read`'s reservation when the frame goes into its kept buffer
    /// (`kept`), else as a reservation of its own, returned. Gives `read`
    /// back first if it has to wait.
    async fn reserve(&self, size: usize, read: &mut ReadBuffer, kept: bool) -> Option<OwnedSemaphorePermit> {
        let bound = self.0.as_ref()?;
        let need = size.min(bound.bytes as usize);
        let missing = if kept { need.saturating_sub(read.held()) } else { need };
        if missing == 0 {
            return None;
        }
        let permit = match bound.semaphore.clone().try_acquire_many_owned(missing as u32) {
            Ok(permit) => permit,
            Err(_) => {
                read.release();
                let missing = need as u32;
                bound.waiting.fetch_add(1, Ordering::AcqRel);
                let permit = bound.semaphore.clone().acquire_many_owned(missing).await;
                bound.waiting.fetch_sub(1, Ordering::AcqRel);
                permit.ok()?
            }
        };
        if !kept {
            return Some(permit);
        }
        match &mut read.held {
            Some(held) => held.merge(permit),
            None => read.held = Some(permit),
        }
        None
    }

    /// After a frame: the kept buffer goes back if other connections wait.
    fn after_frame(&self, read: &mut ReadBuffer) {
        if self.0.as_ref().is_some_and(|b| b.waiting.load(Ordering::Acquire) > 0) {
            read.release();
        }
    }

    /// Bytes free to reserve now (the whole bound when idle), for tests.
    pub fn available(&self) -> Option<usize> {
        self.0.as_ref().map(|b| b.semaphore.available_permits())
    }
}

/// A connection's receiving side, for [`read_frame`].
pub trait FrameSource: AsyncRead + Unpin + Send {
    /// Resolves once a byte can be read (or the peer closed), consuming
    /// nothing; cancel-safe.
    fn ready(&mut self) -> impl Future<Output = std::io::Result<()>> + Send;
}

impl FrameSource for OwnedReadHalf {
    async fn ready(&mut self) -> std::io::Result<()> {
        // `peek` consumes nothing, so a frame that starts meanwhile is read
        // whole. (`readable` would not do: readiness stays set after a read
        // that took exactly what it asked for.)
        self.peek(&mut [0u8; 1]).await.map(|_| ())
    }
}

impl<S: AsyncRead + Unpin + Send> FrameSource for BufReader<S> {
    async fn ready(&mut self) -> std::io::Result<()> {
        self.fill_buf().await.map(|_| ())
    }
}

/// Reads one frame body; `Ok(None)` on a clean close between frames. The
/// body is read into `buf`, which is kept from frame to frame: once the last
/// frame is dropped (a produce's records are appended before the next frame
/// is read), its memory is reused instead of a fresh, kernel-zeroed
/// allocation per request.
async fn read_frame<R: FrameSource>(
    stream: &mut R,
    read: &mut ReadBuffer,
    max: usize,
    idle: Duration,
    memory: &RequestMemory,
) -> Result<Option<(Bytes, Option<OwnedSemaphorePermit>)>, ConnectionError> {
    if !read.released() && tokio::time::timeout(IDLE_BUFFER_RELEASE, stream.ready()).await.is_err() {
        // Quiet for a while: an idle connection keeps no buffer.
        read.release();
    }
    let mut len = [0u8; 4];
    match tokio::time::timeout(idle, stream.read_exact(&mut len)).await {
        Err(_) => return Err(ConnectionError::Idle),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Ok(Err(e)) => return Err(e.into()),
        Ok(Ok(_)) => {}
    }
    let size = i32::from_be_bytes(len);
    if size < 0 || size as usize > max {
        return Err(ConnectionError::FrameTooLarge { size: size as u32 as usize, max });
    }
    let size = size as usize;
    // A frame larger than what a connection keeps gets a buffer of its own:
    // kept, it would make every idle connection hold the largest frame it sent.
    let kept = size <= RETAINED_READ_BUFFER_BYTES;
    let own_reservation = memory.reserve(size, read, kept).await;
    let mut own = BytesMut::new();
    read.used |= kept;
    let buf = if kept { &mut read.buf } else { &mut own };
    // Read into spare capacity: no zeroing of a buffer that is about to be overwritten.
    buf.clear();
    buf.reserve(size);
    while buf.len() < size {
        let mut limited = (&mut *stream).take((size - buf.len()) as u64);
        if limited.read_buf(buf).await? == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
        }
    }
    Ok(Some((buf.split().freeze(), own_reservation)))
}

/// A decoded request, ready for its handler.
pub struct Request {
    pub header: RequestHeader,
    pub api: ApiKey,
    pub body: RequestKind,
}

/// What the reader found in a frame.
enum Frame {
    Request(Box<Request>),
    /// An ApiVersions request of a version we do not know: answer v0 with
    /// UNSUPPORTED_VERSION and our ranges (KIP-511).
    ApiVersionsTooNew {
        correlation_id: i32,
    },
}

fn decode_frame(mut frame: Bytes) -> Result<Frame, ConnectionError> {
    if frame.len() < 4 {
        return Err(ConnectionError::FrameTooShort(frame.len()));
    }
    // Peeked, not consumed: the header decoder reads them again, and the
    // frame is decoded where it lies (its records are not copied).
    let api_key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let api = ApiKey::try_from(api_key).map_err(|_| ConnectionError::UnknownApi(api_key))?;
    let Some(range) = registry::supported(api) else {
        return Err(ConnectionError::UnknownApi(api_key));
    };
    if version < range.min || version > range.max {
        if api == ApiKey::ApiVersions && version > range.max && frame.len() >= 8 {
            return Ok(Frame::ApiVersionsTooNew {
                correlation_id: i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]),
            });
        }
        return Err(ConnectionError::UnsupportedVersion { api, version });
    }
    let malformed = |reason: String| ConnectionError::Malformed { api, version, reason };
    let header =
        RequestHeader::decode(&mut frame, api.request_header_version(version)).map_err(|e| malformed(e.to_string()))?;
    let body = RequestKind::decode(api, &mut frame, version).map_err(|e| malformed(e.to_string()))?;
    Ok(Frame::Request(Box::new(Request { header, api, body })))
}

/// Encodes a response frame (length, header, body).
pub fn encode_response(api: ApiKey, version: i16, correlation_id: i32, body: &ResponseKind) -> Result<Bytes, String> {
    let mut buf = BytesMut::with_capacity(256);
    buf.put_i32(0);
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    header.encode(&mut buf, api.response_header_version(version)).map_err(|e| e.to_string())?;
    body.encode(&mut buf, version).map_err(|e| e.to_string())?;
    let len = (buf.len() - 4) as i32;
    buf[0..4].copy_from_slice(&len.to_be_bytes());
    Ok(buf.freeze())
}

/// Runs a request's handler in the calling task up to its first wait: the
/// answer if it needed none, else the rest of the work, to be finished
/// elsewhere (the next poll registers that task's waker).
async fn start_here(mut pending: PendingResponse) -> Result<Option<ResponseFrame>, PendingResponse> {
    match std::future::poll_fn(|cx| Poll::Ready(pending.as_mut().poll(cx))).await {
        Poll::Ready(answer) => Ok(answer),
        Poll::Pending => Err(pending),
    }
}

/// Sets a new connection up (TLS handshake, client certificate) and serves it.
async fn accept_connection(
    stream: TcpStream,
    peer: SocketAddr,
    spec: Arc<ListenerSpec>,
    ctx: Arc<NodeContext>,
    memory: RequestMemory,
) -> Result<(), ConnectionError> {
    stream.set_nodelay(true)?;
    let mut session =
        Session { host: peer.ip(), listener: spec.name.clone(), principal: Arc::from(ANONYMOUS), mute: Arc::default() };
    let sasl = spec.protocol.uses_sasl().then(|| SaslExchange::new(spec.sasl.clone(), sasl_fake_key()));
    let Some(tls) = &spec.tls else {
        let (reader, writer) = stream.into_split();
        return serve_connection(reader, WriteSide::Plain(writer), session, sasl, ctx, memory).await;
    };
    let stream = BufferedTcp::with_capacity(TLS_READ_BUFFER_BYTES, stream);
    let accepted = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, tls.acceptor().accept(stream)).await;
    let stream = match accepted {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return Err(ConnectionError::Tls(e)),
        Err(_) => return Err(ConnectionError::Tls(std::io::Error::other("no handshake within 10 s"))),
    };
    if let Some(subject) = stream.get_ref().1.peer_certificates().and_then(|c| c.first()).and_then(certificate_subject)
    {
        session.principal = Arc::from(format!("User:{subject}"));
    }
    let (reader, writer) = tokio::io::split(stream);
    serve_connection(BufReader::new(reader), WriteSide::Tls(writer), session, sasl, ctx, memory).await
}

/// The per-process key that makes a SCRAM exchange for an unknown user look
/// like one for a known user.
fn sasl_fake_key() -> [u8; 32] {
    static KEY: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
    *KEY.get_or_init(rand::random)
}

/// Where a connection's SASL exchange stands, as the reader sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SaslFraming {
    /// Kafka frames (SaslAuthenticate carries the tokens, or no exchange).
    Requests,
    /// After a v0 SaslHandshake: the next frames are bare SASL tokens,
    /// answered with bare tokens, until the exchange is done.
    BareTokens,
}

/// Handles a bare SASL token (after a v0 handshake): the server's token as a
/// frame of its own, or `Err` to close the connection unanswered, as Kafka
/// does when a v0 exchange fails.
async fn sasl_bare_token(
    ctx: &NodeContext,
    token: &[u8],
    sasl: &mut SaslExchange,
    session: &mut Session,
) -> Result<(ResponseFrame, bool), ConnectionError> {
    let (response, outcome) = sasl.authenticate(token, &ctx.quorum.image());
    let done = match outcome {
        Outcome::Continue => false,
        Outcome::Authenticated(user) => {
            session.principal = Arc::from(format!("User:{user}"));
            true
        }
        Outcome::Close { delay } => {
            if delay {
                let ms = ctx.settings.u64("connection.failed.authentication.delay.ms");
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            return Err(ConnectionError::AuthenticationFailed);
        }
    };
    let mut frame = BytesMut::with_capacity(4 + response.auth_bytes.len());
    frame.put_i32(response.auth_bytes.len() as i32);
    frame.extend_from_slice(&response.auth_bytes);
    Ok((ResponseFrame::from_bytes(frame.freeze()), done))
}

/// Answers a SaslHandshake or SaslAuthenticate request of `sasl`'s exchange
/// (ILLEGAL_SASL_STATE on a listener without SASL, as Kafka answers).
/// `Err` once the connection is to be closed after the answer.
async fn sasl_step(
    ctx: &NodeContext,
    request: Request,
    sasl: Option<&mut SaslExchange>,
    session: &mut Session,
) -> (Option<ResponseFrame>, Result<(), ConnectionError>) {
    use kafka_protocol::messages::{SaslAuthenticateResponse, SaslHandshakeResponse};
    use kafka_protocol::ResponseError;
    let (api, version, correlation_id) =
        (request.api, request.header.request_api_version, request.header.correlation_id);
    let (response, outcome) = match (request.body, sasl) {
        (RequestKind::SaslHandshake(r), Some(sasl)) => {
            let (response, outcome) = sasl.handshake(r.mechanism.as_str());
            (ResponseKind::SaslHandshake(response), outcome)
        }
        (RequestKind::SaslAuthenticate(r), Some(sasl)) => {
            let (response, outcome) = sasl.authenticate(&r.auth_bytes, &ctx.quorum.image());
            (ResponseKind::SaslAuthenticate(response), outcome)
        }
        (RequestKind::SaslHandshake(_), None) => (
            ResponseKind::SaslHandshake(
                SaslHandshakeResponse::default().with_error_code(ResponseError::IllegalSaslState.code()),
            ),
            Outcome::Close { delay: false },
        ),
        (_, _) => (
            ResponseKind::SaslAuthenticate(
                SaslAuthenticateResponse::default().with_error_code(ResponseError::IllegalSaslState.code()),
            ),
            Outcome::Close { delay: false },
        ),
    };
    let result = match outcome {
        Outcome::Continue => Ok(()),
        Outcome::Authenticated(user) => {
            tracing::debug!(%user, listener = %session.listener, "SASL authenticated");
            session.principal = Arc::from(format!("User:{user}"));
            Ok(())
        }
        Outcome::Close { delay } => {
            if delay {
                // Kafka's connection.failed.authentication.delay.ms: a client
                // guessing passwords gets one guess per delay per connection.
                let ms = ctx.settings.u64("connection.failed.authentication.delay.ms");
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            Err(ConnectionError::AuthenticationFailed)
        }
    };
    let frame = encode_response(api, version, correlation_id, &response).ok().map(ResponseFrame::from_bytes);
    (frame, result)
}

async fn serve_connection<R: FrameSource>(
    mut reader: R,
    writer: WriteSide,
    mut session: Session,
    mut sasl: Option<SaslExchange>,
    ctx: Arc<NodeContext>,
    memory: RequestMemory,
) -> Result<(), ConnectionError> {
    let max = ctx.settings.u64("socket.request.max.bytes") as usize;
    // Until a SASL client has authenticated, its frames are bounded by
    // `sasl.server.max.receive.size` (Kafka's 512 KiB), not by the request
    // limit: a stranger cannot make the broker hold 100 MB per connection.
    let before_auth_max = max.min(ctx.settings.u64("sasl.server.max.receive.size") as usize);
    let idle = Duration::from_millis(ctx.settings.u64("connections.max.idle.ms"));
    let mut writer = FrameWriter::new(writer);
    let (tx, mut rx) = mpsc::channel::<oneshot::Receiver<Option<ResponseFrame>>>(MAX_IN_FLIGHT);
    let write_task = tokio::spawn(async move {
        while let Some(pending) = rx.recv().await {
            match pending.await {
                Ok(Some(frame)) => writer.write(&frame).await?,
                Ok(None) => {}
                Err(_) => return Err(std::io::Error::other("a request handler failed")),
            }
        }
        writer.shutdown().await
    });
    let mut read_buf = ReadBuffer::default();
    let mut framing = SaslFraming::Requests;
    let result = loop {
        // A client over its quota is muted: nothing more is read until its throttle time is over.
        session.mute.wait().await;
        let limit = if sasl.as_ref().is_some_and(|s| !s.is_authenticated()) { before_auth_max } else { max };
        let (frame, reserved) = match read_frame(&mut reader, &mut read_buf, limit, idle, &memory).await {
            Ok(Some(f)) => f,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        // A throttle decided while this frame was being read (a Fetch's is
        // known only once its answer is) holds it too.
        session.mute.wait().await;
        let (done_tx, done_rx) = oneshot::channel();
        let mut closing = Ok(());
        if let (SaslFraming::BareTokens, Some(exchange)) = (framing, sasl.as_mut()) {
            match sasl_bare_token(&ctx, &frame, exchange, &mut session).await {
                Ok((answer, done)) => {
                    let _ = done_tx.send(Some(answer));
                    if done {
                        framing = SaslFraming::Requests;
                    }
                }
                Err(e) => break Err(e),
            }
            if tx.send(done_rx).await.is_err() {
                break Ok(());
            }
            continue;
        }
        if frame.len() < MIN_FRAME_BYTES {
            break Err(ConnectionError::FrameTooShort(frame.len()));
        }
        match decode_frame(frame) {
            Ok(Frame::Request(request)) if matches!(request.api, ApiKey::SaslHandshake | ApiKey::SaslAuthenticate) => {
                // In the reader: the exchange changes what the next request may do.
                let bare = request.api == ApiKey::SaslHandshake && request.header.request_api_version == 0;
                let (answer, result) = sasl_step(&ctx, *request, sasl.as_mut(), &mut session).await;
                let _ = done_tx.send(answer);
                if bare && result.is_ok() && sasl.is_some() {
                    framing = SaslFraming::BareTokens;
                }
                closing = result;
            }
            Ok(Frame::Request(request))
                if sasl.as_ref().is_some_and(|s| !s.is_authenticated())
                    && !BEFORE_AUTHENTICATION.contains(&request.api) =>
            {
                // Kafka closes such a connection without an answer.
                break Err(ConnectionError::Unauthenticated(request.api));
            }
            Ok(Frame::Request(request)) => {
                // In the reader, so requests still reach their handlers in order.
                ctx.data_plane_current().await;
                let in_order = STARTED_IN_ORDER.contains(&request.api);
                let pending = registry::dispatch(ctx.clone(), *request, &session).await;
                // The frame's bytes are handled: a produce's records are
                // appended, and other requests are small.
                drop(reserved);
                memory.after_frame(&mut read_buf);
                let pending = if in_order { start_here(pending).await } else { Err(pending) };
                match pending {
                    Ok(answer) => {
                        let _ = done_tx.send(answer);
                    }
                    Err(pending) => {
                        tokio::spawn(async move {
                            let _ = done_tx.send(pending.await);
                        });
                    }
                }
            }
            Ok(Frame::ApiVersionsTooNew { correlation_id }) => {
                let _ = done_tx.send(registry::api_versions_unsupported(correlation_id));
            }
            Err(e) => break Err(e),
        }
        if tx.send(done_rx).await.is_err() {
            break Ok(());
        }
        if let Err(e) = closing {
            break Err(e);
        }
    };
    drop(tx);
    match write_task.await {
        Ok(Err(e)) if result.is_ok() => Err(e.into()),
        _ => result,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::ApiVersionsRequest;

    fn frame(api: i16, version: i16, body: &[u8]) -> Bytes {
        let mut b = BytesMut::new();
        b.put_i16(api);
        b.put_i16(version);
        b.extend_from_slice(body);
        b.freeze()
    }

    #[test]
    fn unknown_api_and_version_are_errors_not_panics() {
        assert!(matches!(decode_frame(frame(9999, 0, &[0; 8])), Err(ConnectionError::UnknownApi(9999))));
        assert!(matches!(
            decode_frame(frame(0, 99, &[0; 8])),
            Err(ConnectionError::UnsupportedVersion { api: ApiKey::Produce, version: 99 })
        ));
        assert!(matches!(
            decode_frame(frame(18, 99, &[0, 0, 0, 7])),
            Ok(Frame::ApiVersionsTooNew { correlation_id: 7 })
        ));
        assert!(matches!(decode_frame(frame(3, 12, &[0xff; 6])), Err(ConnectionError::Malformed { .. })));
    }

    #[test]
    fn api_versions_round_trip() {
        let mut body = BytesMut::new();
        let header =
            RequestHeader::default().with_request_api_key(18).with_request_api_version(3).with_correlation_id(5);
        header.encode(&mut body, 2).expect("header");
        ApiVersionsRequest::default().encode(&mut body, 3).expect("body");
        let Ok(Frame::Request(r)) = decode_frame(body.freeze()) else { panic!("decodes") };
        assert_eq!((r.api, r.header.correlation_id), (ApiKey::ApiVersions, 5));
    }

    #[tokio::test]
    async fn group_requests_are_started_by_the_reader_up_to_their_first_wait() {
        let steps = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (release, wait) = oneshot::channel::<()>();
        let seen = steps.clone();
        let handler: PendingResponse = Box::pin(async move {
            seen.lock().expect("steps").push("appended");
            let _ = wait.await;
            seen.lock().expect("steps").push("answered");
            Some(ResponseFrame::from_bytes(Bytes::from_static(b"answer")))
        });
        let Err(rest) = start_here(handler).await else { panic!("the handler waits") };
        assert_eq!(*steps.lock().expect("steps"), vec!["appended"], "ran up to its first wait, no further");
        let _ = release.send(());
        let answer = rest.await.expect("an answer").to_vec().expect("in memory");
        assert_eq!(answer, b"answer");
        let at_once: PendingResponse = Box::pin(async { None });
        assert!(matches!(start_here(at_once).await, Ok(None)), "a handler that never waits is done");
        assert!(STARTED_IN_ORDER.contains(&ApiKey::OffsetCommit));
    }

    #[test]
    fn a_large_produce_is_decoded_and_appended_without_copying_its_records() {
        use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
        use kafka_protocol::messages::{ProduceRequest, TopicName};

        use crate::log::batch::test_batches::build_batch;
        use crate::log::{LogConfig, PartitionLog};
        use crate::replication::partition::Partition;

        let dir = tempfile::tempdir().expect("tempdir");
        let config = LogConfig { segment_bytes: 64 << 20, max_message_bytes: 8 << 20, ..LogConfig::default() };
        let log = PartitionLog::open(dir.path(), "t", 0, config, 0, 0).expect("open");
        let partition = Partition::open("t", 0, 1, log).expect("partition");
        partition.become_leader(1, 1, &[1], &[1]);
        partition.append_as_leader(&build_batch(1, 1_000, b"warm"), false).expect("warm-up append");

        let records = Bytes::from(build_batch(1_000, 1_000, &vec![7u8; 4 << 20]));
        let request = ProduceRequest::default().with_acks(1).with_timeout_ms(1_000).with_topic_data(vec![
            TopicProduceData::default()
                .with_name(TopicName(crate::kafka::handlers::str_bytes("t")))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(0)
                    .with_records(Some(records.clone()))]),
        ]);
        let mut frame = BytesMut::new();
        let header =
            RequestHeader::default().with_request_api_key(0).with_request_api_version(9).with_correlation_id(1);
        header.encode(&mut frame, ApiKey::Produce.request_header_version(9)).expect("header");
        request.encode(&mut frame, 9).expect("body");
        let frame = frame.freeze();

        let allocated = allocation_counter::measure(|| {
            let Ok(Frame::Request(decoded)) = decode_frame(frame.clone()) else { panic!("decodes") };
            let RequestKind::Produce(produce) = decoded.body else { panic!("a produce") };
            let data = produce.topic_data[0].partition_data[0].records.clone().expect("records");
            partition.append_as_leader(&data, false).expect("append");
        });
        assert!(
            allocated.bytes_total < 64 * 1024,
            "a {} byte produce allocated {} bytes between the frame and the log: its records were copied",
            records.len(),
            allocated.bytes_total
        );
    }

    #[tokio::test]
    async fn a_connection_reads_each_frame_into_the_memory_of_the_last() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut client = TcpStream::connect(addr).await.expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        let (mut reader, _writer) = server.into_split();
        let sender = tokio::spawn(async move {
            for size in [600_000usize, 500_000, 3 << 20] {
                let mut frame = (size as i32).to_be_bytes().to_vec();
                frame.resize(4 + size, 7);
                tokio::io::AsyncWriteExt::write_all(&mut client, &frame).await.expect("send");
            }
            client
        });
        let mut buf = ReadBuffer::default();
        let idle = Duration::from_secs(5);
        let unbounded = RequestMemory::new(-1);
        let (first, _) =
            read_frame(&mut reader, &mut buf, 8 << 20, idle, &unbounded).await.expect("read").expect("a frame");
        let at = first.as_ptr();
        assert_eq!(first.len(), 600_000);
        drop(first);
        let (second, _) =
            read_frame(&mut reader, &mut buf, 8 << 20, idle, &unbounded).await.expect("read").expect("a frame");
        assert_eq!(second.len(), 500_000);
        assert_eq!(second.as_ptr(), at, "the second frame did not reuse the first one's memory");
        drop(second);
        let (large, _) =
            read_frame(&mut reader, &mut buf, 8 << 20, idle, &unbounded).await.expect("read").expect("a frame");
        assert_eq!(large.len(), 3 << 20);
        assert!(large.iter().all(|&b| b == 7));
        drop(large);
        let mut client = sender.await.expect("sender");
        // The large frame had a buffer of its own: the kept one did not grow.
        tokio::io::AsyncWriteExt::write_all(&mut client, &[0, 0, 0, 12, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
            .await
            .expect("send");
        let (small, _) =
            read_frame(&mut reader, &mut buf, 8 << 20, idle, &unbounded).await.expect("read").expect("a frame");
        assert_eq!(&small[..], &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
        assert!(buf.buf.capacity() <= RETAINED_READ_BUFFER_BYTES);
    }

    #[tokio::test]
    async fn request_bytes_past_the_bound_wait_and_give_their_buffer_back() {
        use futures_util::FutureExt;
        let memory = RequestMemory::new(1_000_000);
        let mut a = ReadBuffer::default();
        assert!(memory.reserve(600_000, &mut a, true).await.is_none(), "a kept buffer's room is held with it");
        a.buf.reserve(600_000);
        assert_eq!((a.held(), memory.available()), (600_000, Some(400_000)));
        // A smaller frame fits in what the buffer holds already.
        memory.reserve(500_000, &mut a, true).await;
        assert_eq!((a.held(), memory.available()), (600_000, Some(400_000)));
        // Past the bound while `a` holds its room: `b` waits, without its buffer.
        let mut b = ReadBuffer { buf: BytesMut::with_capacity(100), held: None, used: true };
        let mut waiting = Box::pin(memory.reserve(600_000, &mut b, true));
        assert!((&mut waiting).now_or_never().is_none(), "reserved past the bound");
        // `a` finishes a frame while `b` waits: it gives its buffer back.
        memory.after_frame(&mut a);
        assert_eq!((a.held(), a.buf.capacity()), (0, 0));
        assert!(waiting.await.is_none());
        assert_eq!((b.held(), b.buf.capacity(), memory.available()), (600_000, 0, Some(400_000)));
        memory.after_frame(&mut b);
        assert_eq!(b.held(), 600_000, "nobody waits: the buffer is kept");
        b.release();
        // A frame too large to keep takes a reservation of its own, at most the bound.
        let whole = memory.reserve(5_000_000, &mut b, false).await.expect("a reservation of its own");
        assert_eq!((b.held(), memory.available()), (0, Some(0)));
        drop(whole);
        assert_eq!(memory.available(), Some(1_000_000));
        let unbounded = RequestMemory::new(-1);
        assert_eq!(unbounded.available(), None, "-1: no bound");
        assert!(unbounded.reserve(5_000_000, &mut b, false).await.is_none());
    }

    /// A connection that read a frame filling its buffer exactly, and then
    /// goes quiet, gives the buffer and its reservation back.
    #[tokio::test]
    async fn a_quiet_connection_gives_its_reservation_back() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let mut client = TcpStream::connect(listener.local_addr().expect("addr")).await.expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        let (mut reader, _writer) = server.into_split();
        let mut frame = 500_000i32.to_be_bytes().to_vec();
        frame.resize(4 + 500_000, 7);
        tokio::io::AsyncWriteExt::write_all(&mut client, &frame).await.expect("send");
        let memory = RequestMemory::new(1_000_000);
        let mut read = ReadBuffer::default();
        let idle = Duration::from_secs(30);
        let (got, _) =
            read_frame(&mut reader, &mut read, 8 << 20, idle, &memory).await.expect("read").expect("a frame");
        assert_eq!(got.len(), 500_000);
        drop(got);
        assert_eq!(memory.available(), Some(500_000), "the kept buffer's room is held");
        // Nothing more comes: the next read gives the room back after
        // IDLE_BUFFER_RELEASE, while it still waits for a frame.
        let next = read_frame(&mut reader, &mut read, 8 << 20, idle, &memory);
        assert!(tokio::time::timeout(IDLE_BUFFER_RELEASE * 3, next).await.is_err(), "no frame was sent");
        assert!(read.released());
        assert_eq!(memory.available(), Some(1_000_000));
        drop(client);
    }

    proptest::proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 4..512)) {
            let _ = decode_frame(Bytes::from(bytes));
        }
    }
}
