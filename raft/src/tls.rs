//! Connections between nodes that may be TLS: the quorum RPC, and the
//! replication client (in the broker crate). One client and one server
//! stream type, each a plain TCP stream or a TLS one, with the TCP socket
//! underneath still at hand (for the idle-connection probe).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// Where the TLS configurations of a node's connections come from: asked
/// at each new connection, so renewed certificates are picked up.
pub trait TlsConfigs: Send + Sync + 'static {
    fn client(&self) -> Arc<rustls::ClientConfig>;
    fn server(&self) -> Arc<rustls::ServerConfig>;
}

/// The TLS configurations of a node's connections to and from other nodes:
/// each side shows its certificate and checks the other's (mutual TLS).
#[derive(Clone)]
pub struct NodeTls(pub Arc<dyn TlsConfigs>);

impl NodeTls {
    /// Fixed configurations (tests, and sources that never change).
    pub fn fixed(client: Arc<rustls::ClientConfig>, server: Arc<rustls::ServerConfig>) -> Self {
        struct Fixed(Arc<rustls::ClientConfig>, Arc<rustls::ServerConfig>);
        impl TlsConfigs for Fixed {
            fn client(&self) -> Arc<rustls::ClientConfig> {
                self.0.clone()
            }
            fn server(&self) -> Arc<rustls::ServerConfig> {
                self.1.clone()
            }
        }
        Self(Arc::new(Fixed(client, server)))
    }

    pub fn client(&self) -> Arc<rustls::ClientConfig> {
        self.0.client()
    }

    pub fn server(&self) -> Arc<rustls::ServerConfig> {
        self.0.server()
    }
}

impl std::fmt::Debug for NodeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeTls")
    }
}

macro_rules! either_stream {
    ($name:ident, $tls:ty) => {
        /// A plain or TLS stream.
        pub enum $name {
            Plain(TcpStream),
            Tls(Box<$tls>),
        }

        impl $name {
            /// The TCP socket underneath.
            pub fn tcp(&self) -> &TcpStream {
                match self {
                    Self::Plain(s) => s,
                    Self::Tls(s) => s.get_ref().0,
                }
            }
        }

        impl AsyncRead for $name {
            fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
                    Self::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
                }
            }
        }

        impl AsyncWrite for $name {
            fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    Self::Plain(s) => Pin::new(s).poll_write(cx, buf),
                    Self::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
                }
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::Plain(s) => Pin::new(s).poll_flush(cx),
                    Self::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
                }
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
                    Self::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
                }
            }
        }
    };
}

either_stream!(ClientStream, tokio_rustls::client::TlsStream<TcpStream>);
either_stream!(ServerStream, tokio_rustls::server::TlsStream<TcpStream>);

/// Connects to `addr` (`host:port`), with TLS when `tls` is given (the
/// server's certificate must name the host), all within `timeout`.
pub async fn connect(
    addr: &str,
    tls: Option<&Arc<rustls::ClientConfig>>,
    timeout: Duration,
) -> io::Result<ClientStream> {
    let work = async {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let Some(config) = tls else { return Ok(ClientStream::Plain(tcp)) };
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h).trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{host}: {e}")))?;
        let stream = TlsConnector::from(config.clone()).connect(name, tcp).await?;
        Ok(ClientStream::Tls(Box::new(stream)))
    };
    tokio::time::timeout(timeout, work)
        .await
        .unwrap_or_else(|_| Err(io::Error::new(io::ErrorKind::TimedOut, format!("connecting to {addr} timed out"))))
}

/// Completes an accepted connection: the TLS handshake when `tls` is given.
pub async fn accept(
    tcp: TcpStream,
    tls: Option<&Arc<rustls::ServerConfig>>,
    timeout: Duration,
) -> io::Result<ServerStream> {
    tcp.set_nodelay(true)?;
    let Some(config) = tls else { return Ok(ServerStream::Plain(tcp)) };
    let handshake = TlsAcceptor::from(config.clone()).accept(tcp);
    match tokio::time::timeout(timeout, handshake).await {
        Ok(Ok(stream)) => Ok(ServerStream::Tls(Box::new(stream))),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out")),
    }
}
