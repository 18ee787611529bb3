//! A minimal Kafka client for broker-to-broker requests (follower Fetch and
//! OffsetsForLeaderEpoch): one connection, one request at a time, every call
//! bounded by a timeout, response frames bounded in size.

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, Request, StrBytes};
use strom_raft::tls::ClientStream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The largest response frame accepted from a leader.
pub const MAX_RESPONSE_BYTES: usize = 128 * 1024 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("timed out")]
    Timeout,
    #[error("bad response: {0}")]
    Protocol(String),
}

pub struct KafkaConnection {
    stream: ClientStream,
    correlation_id: i32,
    client_id: StrBytes,
}

impl KafkaConnection {
    /// Connects to `addr`, with mutual TLS when `tls` is given (an SSL
    /// inter-broker listener).
    pub async fn connect(
        addr: &str,
        client_id: &str,
        tls: Option<&std::sync::Arc<rustls::ClientConfig>>,
    ) -> Result<Self, ClientError> {
        let stream = match strom_raft::tls::connect(addr, tls, CONNECT_TIMEOUT).await {
            Ok(stream) => stream,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return Err(ClientError::Timeout),
            Err(e) => return Err(e.into()),
        };
        Ok(Self { stream, correlation_id: 0, client_id: StrBytes::from_string(client_id.to_string()) })
    }

    /// Sends `request` at `version` and decodes its response.
    pub async fn send<R: Request>(
        &mut self,
        request: &R,
        version: i16,
        timeout: Duration,
    ) -> Result<R::Response, ClientError> {
        self.correlation_id = self.correlation_id.wrapping_add(1);
        let api = ApiKey::try_from(R::KEY).map_err(|_| ClientError::Protocol(format!("unknown api {}", R::KEY)))?;
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation_id)
            .with_client_id(Some(self.client_id.clone()));
        let mut buf = BytesMut::with_capacity(256);
        buf.put_i32(0);
        header
            .encode(&mut buf, api.request_header_version(version))
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        request.encode(&mut buf, version).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let len = (buf.len() - 4) as i32;
        buf[0..4].copy_from_slice(&len.to_be_bytes());
        let expected = self.correlation_id;
        let exchange = async {
            self.stream.write_all(&buf).await?;
            // Under TLS the request's end may still be buffered.
            self.stream.flush().await?;
            let mut len = [0u8; 4];
            self.stream.read_exact(&mut len).await?;
            let len = i32::from_be_bytes(len);
            if len < 0 || len as usize > MAX_RESPONSE_BYTES {
                return Err(ClientError::Protocol(format!("response frame of {len} bytes")));
            }
            let len = len as usize;
            let mut body = BytesMut::with_capacity(len);
            while body.len() < len {
                let mut limited = (&mut self.stream).take((len - body.len()) as u64);
                if limited.read_buf(&mut body).await? == 0 {
                    return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
                }
            }
            Ok::<Bytes, ClientError>(body.freeze())
        };
        let mut body = tokio::time::timeout(timeout, exchange).await.map_err(|_| ClientError::Timeout)??;
        let header = ResponseHeader::decode(&mut body, api.response_header_version(version))
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        if header.correlation_id != expected {
            return Err(ClientError::Protocol(format!("correlation id {} != {expected}", header.correlation_id)));
        }
        let response = R::Response::decode(&mut body, version).map_err(|e| ClientError::Protocol(e.to_string()))?;
        if body.has_remaining() {
            tracing::debug!(bytes = body.remaining(), "trailing bytes after a response");
        }
        Ok(response)
    }
}
