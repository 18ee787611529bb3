//! Response frames that carry record data by reference, and their writer.
//!
//! A Fetch answer is mostly record bytes that already sit in the page cache.
//! Encoding them into the frame would copy every byte into a fresh
//! multi-megabyte buffer (which the kernel must first zero and fault in), and
//! writing that buffer would copy it again. Instead the handler puts a short
//! marker where each partition's records go ([`RecordSlices::add`]), the
//! response is encoded by kafka-protocol as usual, and [`ResponseFrame::splice`]
//! cuts the encoded bytes at the markers and puts the file ranges there,
//! with the length prefixes the real records need. The writer sends the
//! pieces with `sendfile`, so record bytes go from the page cache to the
//! socket without passing through the broker's memory.
//!
//! A marker is a per-process random 12-byte key and a 4-byte sequence
//! number: 16 bytes that nothing else in a response can hold by chance. The
//! splice checks each marker's length prefix before it trusts the match, and
//! fails the response (never sends it) if a marker is missing.

use std::sync::OnceLock;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncWriteExt, Interest, WriteHalf};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use crate::log::FileSlice;

const MARKER_BYTES: usize = 16;
/// Bytes `sendfile` is asked for at once: one call never holds the thread long.
const SENDFILE_CHUNK_BYTES: usize = 1 << 20;

/// One piece of a frame.
#[derive(Debug, Clone)]
pub enum Chunk {
    Bytes(Bytes),
    File(FileSlice),
}

impl Chunk {
    fn len(&self) -> usize {
        match self {
            Chunk::Bytes(b) => b.len(),
            Chunk::File(f) => f.len(),
        }
    }
}

/// A whole response frame (length prefix included), in pieces.
#[derive(Debug, Clone)]
pub struct ResponseFrame {
    chunks: Vec<Chunk>,
}

/// The file ranges a response's records come from, in encoding order.
#[derive(Debug, Default)]
pub struct RecordSlices {
    slices: Vec<FileSlice>,
}

impl RecordSlices {
    /// What to put in a `records` field for `slice`: the empty record set,
    /// or a marker the frame's splice replaces with the slice.
    pub fn add(&mut self, slice: FileSlice) -> Bytes {
        if slice.is_empty() {
            return Bytes::new();
        }
        let marker = marker(self.slices.len() as u32);
        self.slices.push(slice);
        marker
    }

    pub fn is_empty(&self) -> bool {
        self.slices.is_empty()
    }

    /// The bytes of every range.
    pub fn len(&self) -> usize {
        self.slices.iter().map(FileSlice::len).sum()
    }
}

fn marker(sequence: u32) -> Bytes {
    static KEY: OnceLock<[u8; MARKER_BYTES - 4]> = OnceLock::new();
    let key = KEY.get_or_init(rand::random);
    let mut marker = BytesMut::with_capacity(MARKER_BYTES);
    marker.extend_from_slice(key);
    marker.extend_from_slice(&sequence.to_be_bytes());
    marker.freeze()
}

/// Kafka's BYTES length prefix (INT32) or, in flexible versions,
/// COMPACT_BYTES (unsigned varint of length + 1).
fn length_prefix(len: usize, compact: bool) -> Vec<u8> {
    if !compact {
        return (len as i32).to_be_bytes().to_vec();
    }
    let mut value = len as u64 + 1;
    let mut out = Vec::with_capacity(5);
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
    out
}

impl ResponseFrame {
    pub fn from_bytes(frame: Bytes) -> Self {
        Self { chunks: vec![Chunk::Bytes(frame)] }
    }

    /// The frame's bytes on the wire, length prefix included.
    pub fn len(&self) -> usize {
        self.chunks.iter().map(Chunk::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `encoded` (a frame whose records fields hold the markers of
    /// `records`) with every marker replaced by its file range. `compact`:
    /// the records fields are COMPACT_BYTES (flexible versions).
    pub fn splice(encoded: Bytes, records: RecordSlices, compact: bool) -> Result<Self, String> {
        if records.is_empty() {
            return Ok(Self::from_bytes(encoded));
        }
        let marker_prefix = length_prefix(MARKER_BYTES, compact);
        let body_len = records.slices.iter().fold(encoded.len() - 4, |len, slice| {
            len + length_prefix(slice.len(), compact).len() + slice.len() - marker_prefix.len() - MARKER_BYTES
        });
        let body_len = i32::try_from(body_len).map_err(|_| "response over 2 GiB".to_string())?;
        let mut chunks = Vec::with_capacity(2 * records.slices.len() + 1);
        let mut head = BytesMut::with_capacity(256);
        head.extend_from_slice(&body_len.to_be_bytes());
        let mut cursor = 4;
        for (sequence, slice) in records.slices.into_iter().enumerate() {
            let marker = marker(sequence as u32);
            let at = find(&encoded[cursor..], &marker)
                .map(|i| cursor + i)
                .ok_or_else(|| format!("records marker {sequence} not found in the encoded response"))?;
            let prefix_at = at
                .checked_sub(marker_prefix.len())
                .filter(|&p| p >= cursor && encoded[p..at] == marker_prefix[..])
                .ok_or_else(|| format!("records marker {sequence} is not a records field"))?;
            head.extend_from_slice(&encoded[cursor..prefix_at]);
            head.extend_from_slice(&length_prefix(slice.len(), compact));
            chunks.push(Chunk::Bytes(head.split().freeze()));
            chunks.push(Chunk::File(slice));
            cursor = at + MARKER_BYTES;
        }
        chunks.push(Chunk::Bytes(encoded.slice(cursor..)));
        let frame = Self { chunks };
        debug_assert_eq!(frame.len(), body_len as usize + 4, "the spliced frame's length prefix is its length");
        Ok(frame)
    }

    /// The frame as one buffer (copies the records; for tests and transports
    /// that cannot send from a file).
    pub fn to_vec(&self) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(self.len());
        for chunk in &self.chunks {
            match chunk {
                Chunk::Bytes(b) => out.extend_from_slice(b),
                Chunk::File(f) => f.read_to(&mut out)?,
            }
        }
        Ok(out)
    }

    /// The frame's record bytes held in memory (not counting its file ranges).
    pub fn bytes_in_memory(&self) -> usize {
        self.chunks.iter().filter_map(|c| if let Chunk::Bytes(b) = c { Some(b.len()) } else { None }).sum()
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A connection's sending side: a plain TCP socket, whose file ranges go
/// out with `sendfile`, or a TLS stream, through which they are copied (the
/// kernel cannot encrypt them on the way).
pub enum WriteSide {
    Plain(OwnedWriteHalf),
    Tls(WriteHalf<TlsStream<BufferedTcp>>),
}

/// What TLS runs over: the socket behind a read buffer. rustls reads at
/// most 4 KiB at a time; from this buffer, not in a system call each
/// (the buffer passes writes straight through).
pub type BufferedTcp = tokio::io::BufReader<TcpStream>;

/// The read buffer under TLS: a few TLS records per system call.
pub const TLS_READ_BUFFER_BYTES: usize = 64 << 10;

impl WriteSide {
    async fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Self::Plain(w) => w.write_all(bytes).await,
            Self::Tls(w) => w.write_all(bytes).await,
        }
    }
}

/// Writes frames to one connection's socket.
pub struct FrameWriter {
    writer: WriteSide,
    /// False once `sendfile` refused this connection's files (a file system
    /// without splice support): file ranges are then read and written.
    sendfile: bool,
    /// Reused for file ranges that must be copied.
    scratch: Vec<u8>,
}

impl FrameWriter {
    pub fn new(writer: WriteSide) -> Self {
        let sendfile = matches!(writer, WriteSide::Plain(_));
        Self { writer, sendfile, scratch: Vec::new() }
    }

    /// Writes the frame's pieces in order. (Corking the socket around them,
    /// to send the small header pieces in full packets, halved consume
    /// throughput in `bench/kafka_bench.py`: not done.)
    pub async fn write(&mut self, frame: &ResponseFrame) -> std::io::Result<()> {
        self.write_chunks(&frame.chunks).await?;
        // A TLS stream may keep the end of the frame in its buffer after
        // the last write returns, when the socket was full: flushed here,
        // or the client would wait for it until the next answer (a Fetch
        // long-poll timed out after 60 s in bench/security_bench.py).
        match &mut self.writer {
            WriteSide::Plain(_) => Ok(()),
            WriteSide::Tls(w) => w.flush().await,
        }
    }

    async fn write_chunks(&mut self, chunks: &[Chunk]) -> std::io::Result<()> {
        for chunk in chunks {
            match chunk {
                Chunk::Bytes(b) => self.writer.write_all(b).await?,
                Chunk::File(f) => {
                    if let (true, WriteSide::Plain(plain)) = (self.sendfile, &self.writer) {
                        match send_file(plain.as_ref(), f).await {
                            Ok(()) => continue,
                            Err(SendFileError::Unsupported(e)) => {
                                tracing::debug!(error = %e, "sendfile refused; copying file ranges instead");
                                self.sendfile = false;
                            }
                            Err(SendFileError::Io(e)) => return Err(e),
                        }
                    }
                    self.scratch.clear();
                    f.read_to(&mut self.scratch)?;
                    self.writer.write_all(&self.scratch).await?;
                }
            }
        }
        Ok(())
    }

    pub async fn shutdown(&mut self) -> std::io::Result<()> {
        match &mut self.writer {
            WriteSide::Plain(w) => w.shutdown().await,
            WriteSide::Tls(w) => w.shutdown().await,
        }
    }
}

enum SendFileError {
    /// Nothing was sent: the file cannot be spliced (copy it instead).
    Unsupported(std::io::Error),
    Io(std::io::Error),
}

/// Sends `slice` from the page cache to `stream`, waiting whenever the
/// socket's buffer is full. A file cut short since the read (a truncated
/// segment) fails the connection rather than send a short frame.
async fn send_file(stream: &TcpStream, slice: &FileSlice) -> Result<(), SendFileError> {
    let mut offset = slice.position();
    let end = offset + slice.len() as u64;
    while offset < end {
        stream.writable().await.map_err(SendFileError::Io)?;
        let count = ((end - offset) as usize).min(SENDFILE_CHUNK_BYTES);
        let sent = stream.try_io(Interest::WRITABLE, || {
            rustix::fs::sendfile(stream, slice.file(), Some(&mut offset), count).map_err(std::io::Error::from)
        });
        match sent {
            Ok(0) => {
                return Err(SendFileError::Io(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "segment file shorter than the range read from it",
                )))
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if offset == slice.position() && is_unsupported(&e) => return Err(SendFileError::Unsupported(e)),
            Err(e) => return Err(SendFileError::Io(e)),
        }
    }
    Ok(())
}

fn is_unsupported(e: &std::io::Error) -> bool {
    matches!(
        rustix::io::Errno::from_io_error(e),
        Some(rustix::io::Errno::INVAL | rustix::io::Errno::NOSYS | rustix::io::Errno::OPNOTSUPP)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::Arc;

    use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
    use kafka_protocol::messages::{ApiKey, FetchResponse, ResponseKind, TopicName};

    use crate::kafka::connection::encode_response;
    use crate::kafka::handlers::str_bytes;

    fn file_with(bytes: &[u8]) -> Arc<std::fs::File> {
        let mut file = tempfile::tempfile().expect("tempfile");
        file.write_all(bytes).expect("write");
        Arc::new(file)
    }

    fn response(records: Vec<Bytes>) -> ResponseKind {
        let partitions = records
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                PartitionData::default().with_partition_index(i as i32).with_high_watermark(7).with_records(Some(r))
            })
            .collect();
        ResponseKind::Fetch(FetchResponse::default().with_responses(vec![
            FetchableTopicResponse::default().with_topic(TopicName(str_bytes("t"))).with_partitions(partitions),
        ]))
    }

    #[test]
    fn a_spliced_frame_is_byte_for_byte_the_copied_one() {
        // Sizes whose compact length prefixes take 1, 2 and 3 bytes, and an empty partition.
        let data: Vec<u8> = (0..40_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let file = file_with(&data);
        let ranges = [(0u64, 100usize), (300, 0), (1_000, 5_000), (5_000, 30_000)];
        for version in 4..=12 {
            let copied: Vec<Bytes> =
                ranges.iter().map(|&(at, len)| Bytes::copy_from_slice(&data[at as usize..at as usize + len])).collect();
            let expected = encode_response(ApiKey::Fetch, version, 9, &response(copied)).expect("encode");
            let mut slices = RecordSlices::default();
            let markers =
                ranges.iter().map(|&(at, len)| slices.add(FileSlice::new(file.clone(), at, len as u64))).collect();
            let encoded = encode_response(ApiKey::Fetch, version, 9, &response(markers)).expect("encode");
            let frame = ResponseFrame::splice(encoded, slices, version >= 12).expect("splice");
            assert_eq!(frame.len(), expected.len(), "v{version}");
            assert_eq!(frame.to_vec().expect("read"), expected, "v{version}");
            assert!(frame.bytes_in_memory() < 300, "v{version}: records were copied into the frame");
        }
    }

    #[test]
    fn a_response_without_its_marker_is_refused() {
        let file = file_with(&[1; 64]);
        let mut slices = RecordSlices::default();
        slices.add(FileSlice::new(file, 0, 64));
        let encoded = encode_response(ApiKey::Fetch, 12, 1, &response(vec![Bytes::from_static(b"x")])).expect("encode");
        assert!(ResponseFrame::splice(encoded, slices, true).is_err());
    }

    #[tokio::test]
    async fn the_writer_sends_file_ranges_and_bytes_in_order() {
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
        let file = file_with(&data);
        let frame = ResponseFrame {
            chunks: vec![
                Chunk::Bytes(Bytes::from_static(b"head")),
                Chunk::File(FileSlice::new(file.clone(), 10, 2_500_000)),
                Chunk::Bytes(Bytes::from_static(b"tail")),
            ],
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let reader = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            let mut got = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut got).await.expect("read");
            got
        });
        let (_, write_half) = TcpStream::connect(addr).await.expect("connect").into_split();
        let mut writer = FrameWriter::new(WriteSide::Plain(write_half));
        writer.write(&frame).await.expect("write");
        writer.shutdown().await.expect("shutdown");
        let got = reader.await.expect("reader");
        assert_eq!(got, frame.to_vec().expect("frame bytes"));
        assert_eq!(&got[4..2_500_004], &data[10..2_500_010]);
    }

    #[tokio::test]
    async fn a_segment_cut_short_fails_the_write_instead_of_sending_a_short_frame() {
        let file = file_with(&[5; 1_000]);
        let frame = ResponseFrame { chunks: vec![Chunk::File(FileSlice::new(file.clone(), 0, 1_000))] };
        file.set_len(400).expect("truncate");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let accept = tokio::spawn(async move { listener.accept().await.map(|(s, _)| s) });
        let (_, write_half) = TcpStream::connect(addr).await.expect("connect").into_split();
        let _peer = accept.await.expect("accept task").expect("accept");
        let mut writer = FrameWriter::new(WriteSide::Plain(write_half));
        assert!(writer.write(&frame).await.is_err());
    }
}
