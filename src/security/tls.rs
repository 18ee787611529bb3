//! TLS for the Kafka listeners: rustls (with ring) configured from PEM files
//! by Kafka's setting names, reloaded when the files change.
//!
//! - `ssl.keystore.location`: one PEM file with the private key (PKCS#8,
//!   PKCS#1 or SEC1, unencrypted) and the certificate chain, leaf first, as
//!   Kafka's PEM keystore (`ssl.keystore.type=PEM`).
//! - `ssl.truststore.location`: PEM certificates of the CAs that client
//!   certificates must chain to.
//! - `ssl.client.auth`: `none`, `requested` (a certificate is checked when
//!   sent) or `required`.
//!
//! Every accepted connection checks the files' modification times (two
//! `stat`s). A renewed certificate is picked up by the next connection; a
//! file that does not load keeps the configuration that did, with a warning.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use crate::config::Settings;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    None,
    Requested,
    Required,
}

/// The TLS settings of the Kafka listeners, and the acceptor built from them.
pub struct TlsSource {
    keystore: PathBuf,
    truststore: Option<PathBuf>,
    client_auth: ClientAuth,
    loaded: Mutex<Loaded>,
}

struct Loaded {
    stamps: Vec<FileStamp>,
    acceptor: TlsAcceptor,
}

impl TlsSource {
    /// Loads the files named by the settings; an error names the file and
    /// what is wrong with it.
    pub fn from_settings(settings: &Settings) -> Result<Self, String> {
        let keystore = settings
            .get("ssl.keystore.location")
            .map(PathBuf::from)
            .ok_or("a TLS listener (SSL or SASL_SSL) needs ssl.keystore.location: a PEM file with the key and certificate chain")?;
        let truststore = settings.get("ssl.truststore.location").map(PathBuf::from);
        let client_auth = match settings.get("ssl.client.auth").as_deref() {
            Some("required") => ClientAuth::Required,
            Some("requested") => ClientAuth::Requested,
            _ => ClientAuth::None,
        };
        if client_auth != ClientAuth::None && truststore.is_none() {
            return Err(
                "ssl.client.auth checks client certificates against ssl.truststore.location, which is not set".into()
            );
        }
        let stamps = stamps(&keystore, truststore.as_deref());
        let config = server_config(&keystore, truststore.as_deref(), client_auth)?;
        let loaded = Loaded { stamps, acceptor: TlsAcceptor::from(Arc::new(config)) };
        Ok(Self { keystore, truststore, client_auth, loaded: Mutex::new(loaded) })
    }

    /// The acceptor for a new connection: reloaded first if a file changed.
    pub fn acceptor(&self) -> TlsAcceptor {
        let now = stamps(&self.keystore, self.truststore.as_deref());
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        if now != loaded.stamps {
            loaded.stamps = now;
            match server_config(&self.keystore, self.truststore.as_deref(), self.client_auth) {
                Ok(config) => {
                    loaded.acceptor = TlsAcceptor::from(Arc::new(config));
                    tracing::info!(keystore = %self.keystore.display(), "TLS certificates reloaded");
                }
                Err(e) => tracing::warn!(error = %e, "TLS files changed but do not load; keeping the previous ones"),
            }
        }
        loaded.acceptor.clone()
    }
}

fn stamps(keystore: &Path, truststore: Option<&Path>) -> Vec<FileStamp> {
    std::iter::once(keystore)
        .chain(truststore)
        .map(|p| std::fs::metadata(p).ok().and_then(|m| Some((m.modified().ok()?, m.len()))))
        .collect()
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates of a PEM file, in order.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no PEM certificate in it", path.display()));
    }
    Ok(certs)
}

pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| format!("{}: no usable private key ({e})", path.display()))
}

pub fn load_roots(path: &Path) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path)? {
        roots.add(cert).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(roots)
}

fn server_config(keystore: &Path, truststore: Option<&Path>, client_auth: ClientAuth) -> Result<ServerConfig, String> {
    let chain = load_certs(keystore)?;
    let key = load_key(keystore)?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match (client_auth, truststore) {
        (ClientAuth::None, _) | (_, None) => builder.with_no_client_auth(),
        (auth, Some(truststore)) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(load_roots(truststore)?), provider());
            let verifier = if auth == ClientAuth::Requested { verifier.allow_unauthenticated() } else { verifier };
            builder.with_client_cert_verifier(verifier.build().map_err(|e| format!("{}: {e}", truststore.display()))?)
        }
    };
    builder.with_single_cert(chain, key).map_err(|e| format!("{}: {e}", keystore.display()))
}

/// Mutual TLS between nodes (`quorum.security.protocol=SSL`, or an SSL
/// inter-broker listener): each node shows the certificate of
/// `ssl.keystore.location` and accepts only peers whose certificate chains
/// to `ssl.truststore.location`'s CAs. Like the listeners' TLS, the files
/// are checked at each new connection and reloaded when they change.
pub fn node_tls(settings: &Settings) -> Result<strom_raft::tls::NodeTls, String> {
    let keystore = settings
        .get("ssl.keystore.location")
        .map(PathBuf::from)
        .ok_or("TLS between nodes needs ssl.keystore.location: this node's key and certificate chain")?;
    let truststore = settings
        .get("ssl.truststore.location")
        .map(PathBuf::from)
        .ok_or("TLS between nodes needs ssl.truststore.location: the CA that signed every node's certificate")?;
    let stamps = stamps(&keystore, Some(&truststore));
    let configs = node_configs(&keystore, &truststore)?;
    let source = NodeTlsSource { keystore, truststore, loaded: Mutex::new((stamps, configs)) };
    Ok(strom_raft::tls::NodeTls(Arc::new(source)))
}

type NodeConfigs = (Arc<rustls::ClientConfig>, Arc<ServerConfig>);
/// A file's modification time and length (`None`: it could not be read).
type FileStamp = Option<(SystemTime, u64)>;

/// The node TLS configurations, reloaded when their files change.
struct NodeTlsSource {
    keystore: PathBuf,
    truststore: PathBuf,
    /// The files' stamps when last loaded, and what they gave.
    loaded: Mutex<(Vec<FileStamp>, NodeConfigs)>,
}

impl NodeTlsSource {
    fn current(&self) -> NodeConfigs {
        let now = stamps(&self.keystore, Some(&self.truststore));
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        if now != loaded.0 {
            loaded.0 = now;
            match node_configs(&self.keystore, &self.truststore) {
                Ok(configs) => {
                    loaded.1 = configs;
                    tracing::info!(keystore = %self.keystore.display(), "node TLS certificates reloaded");
                }
                Err(e) => {
                    tracing::warn!(error = %e, "node TLS files changed but do not load; keeping the previous ones")
                }
            }
        }
        loaded.1.clone()
    }
}

impl strom_raft::tls::TlsConfigs for NodeTlsSource {
    fn client(&self) -> Arc<rustls::ClientConfig> {
        self.current().0
    }

    fn server(&self) -> Arc<ServerConfig> {
        self.current().1
    }
}

fn node_configs(keystore: &Path, truststore: &Path) -> Result<NodeConfigs, String> {
    let roots = Arc::new(load_roots(truststore)?);
    let (chain, key) = (load_certs(keystore)?, load_key(keystore)?);
    let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
        .build()
        .map_err(|e| format!("{}: {e}", truststore.display()))?;
    let server = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain.clone(), key.clone_key())
        .map_err(|e| format!("{}: {e}", keystore.display()))?;
    let client = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| format!("{}: {e}", keystore.display()))?;
    Ok((Arc::new(client), Arc::new(server)))
}

/// A client certificate's subject as Kafka's default principal builder
/// names it: the distinguished name in RFC 2253 form (`CN=alice,O=Acme`).
pub fn certificate_subject(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let mut parts = Vec::new();
    // RFC 2253 writes the most specific name first: the reverse of the encoding.
    for rdn in parsed.subject().iter().collect::<Vec<_>>().into_iter().rev() {
        let attrs: Vec<String> = rdn
            .iter()
            .map(|attr| {
                let oid = attr.attr_type();
                let key = x509_parser::objects::oid2abbrev(oid, x509_parser::objects::oid_registry())
                    .map_or_else(|_| oid.to_id_string(), str::to_string);
                let value = attr.as_str().map_or_else(|_| hex(attr.as_slice()), escape_rfc2253);
                format!("{key}={value}")
            })
            .collect();
        parts.push(attrs.join("+"));
    }
    Some(parts.join(","))
}

fn escape_rfc2253(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for (i, c) in value.chars().enumerate() {
        let edge = (i == 0 && (c == ' ' || c == '#')) || (i + 1 == value.chars().count() && c == ' ');
        if edge || matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';' | '=') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    std::iter::once("#".to_string()).chain(bytes.iter().map(|b| format!("{b:02x}"))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::security::certs;

    #[test]
    fn a_certificate_subject_is_named_as_kafka_names_it() {
        let ca = certs::Authority::generate("Strom test CA").expect("ca");
        let leaf = ca.issue_client("alice, the admin").expect("leaf");
        let der = load_certs_from_pem(&leaf.cert_pem);
        assert_eq!(certificate_subject(&der[0]).as_deref(), Some("CN=alice\\, the admin,O=Strom"));
    }

    fn load_certs_from_pem(pem: &str) -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_slice_iter(pem.as_bytes()).collect::<Result<Vec<_>, _>>().expect("pem")
    }

    #[test]
    fn files_are_reloaded_when_they_change_and_kept_when_the_new_ones_are_bad() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = certs::Authority::generate("Strom test CA").expect("ca");
        let keystore = dir.path().join("node.pem");
        let first = ca.issue_server(&["localhost", "127.0.0.1"]).expect("leaf");
        std::fs::write(&keystore, first.keystore_pem()).expect("write");
        let mut settings = Settings::default();
        settings.set("ssl.keystore.location", &keystore.display().to_string()).expect("set");
        let source = TlsSource::from_settings(&settings).expect("loads");
        let before = source.acceptor();
        assert!(Arc::ptr_eq(before.config(), source.acceptor().config()), "unchanged files are not reloaded");
        std::fs::write(&keystore, "not a pem file at all, and longer than the first one was ........").expect("write");
        assert!(Arc::ptr_eq(before.config(), source.acceptor().config()), "a bad file keeps the old config");
        let second = ca.issue_server(&["localhost"]).expect("leaf");
        std::fs::write(&keystore, second.keystore_pem()).expect("write");
        assert!(!Arc::ptr_eq(before.config(), source.acceptor().config()), "a renewed file is picked up");
        settings.set("ssl.client.auth", "required").expect("set");
        assert!(TlsSource::from_settings(&settings).err().is_some_and(|e| e.contains("ssl.truststore.location")));
    }

    #[test]
    fn node_certificates_are_reloaded_for_new_connections() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = certs::Authority::generate("Strom test CA").expect("ca");
        let (keystore, truststore) = (dir.path().join("node.pem"), dir.path().join("ca.pem"));
        std::fs::write(&keystore, ca.issue_node("n", &["127.0.0.1"]).expect("leaf").keystore_pem()).expect("write");
        std::fs::write(&truststore, ca.cert_pem()).expect("write");
        let mut settings = Settings::default();
        assert!(node_tls(&settings).err().is_some_and(|e| e.contains("ssl.keystore.location")));
        settings.set("ssl.keystore.location", &keystore.display().to_string()).expect("set");
        settings.set("ssl.truststore.location", &truststore.display().to_string()).expect("set");
        let tls = node_tls(&settings).expect("loads");
        let (client, server) = (tls.client(), tls.server());
        assert!(Arc::ptr_eq(&client, &tls.client()) && Arc::ptr_eq(&server, &tls.server()), "unchanged: kept");
        std::fs::write(&keystore, ca.issue_node("renewed", &["127.0.0.1", "localhost"]).expect("leaf").keystore_pem())
            .expect("write");
        let renewed = tls.client();
        assert!(!Arc::ptr_eq(&client, &renewed), "a renewed certificate is used by the next connection");
        std::fs::write(&keystore, "garbage, and longer than any certificate file written above ........")
            .expect("write");
        assert!(Arc::ptr_eq(&renewed, &tls.client()), "a file that does not load keeps the last good one");
    }
}
