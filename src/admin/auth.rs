//! Who may use the admin API: HTTPS, HTTP Basic with a SCRAM user's
//! password or a client certificate, and the ACLs.
//!
//! - `admin.tls.enabled`: serve HTTPS with the Kafka listeners' keystore
//!   (`ssl.keystore.location`); with `ssl.client.auth` a client certificate
//!   from `ssl.truststore.location`'s CAs names the principal.
//! - `admin.authentication.enabled`: every path but `/health` and `/ready`
//!   (and `/metrics` when `admin.metrics.public`) needs a principal: a
//!   client certificate, or HTTP Basic checked against the user's stored
//!   SCRAM credential. Without one: 401 SASL_AUTHENTICATION_FAILED.
//! - With the authorizer on, the principal's ACLs decide (403 otherwise):
//!   DESCRIBE for reads, CREATE / DELETE / ALTER / ALTER_CONFIGS for writes,
//!   on the topic or group a path names, else on the cluster.
//!
//! Nodes call each other's admin API for their internal views; they present
//! the credentials of `admin.client.credentials` (CONTRACT's
//! `credentials.json`) and trust its `ca`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::connect_info::{ConnectInfo, Connected};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::serve::{IncomingStream, Listener};
use base64::Engine as _;
use futures_util::stream::{FuturesUnordered, StreamExt};
use serde::Deserialize;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;

use super::HttpError;
use crate::config::Settings;
use crate::error::{ApiError, ErrorCode};
use crate::node::NodeContext;
use crate::security::acl::{Operation, ResourceType, CLUSTER_NAME};
use crate::security::tls::{certificate_subject, TlsSource};

/// Longest an admin client may take over its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The admin API's security settings.
#[derive(Debug, Clone, Default)]
pub struct AdminSecurity {
    pub tls: bool,
    pub authentication: bool,
    pub metrics_public: bool,
    /// What this node presents to other nodes' admin APIs.
    pub client: Option<ClientCredentials>,
}

/// CONTRACT's `credentials.json`: `{"user", "password", "mechanism", "ca"}`.
#[derive(Clone, Deserialize)]
pub struct ClientCredentials {
    pub user: String,
    pub password: String,
    /// The CA that signed the nodes' certificates (PEM file).
    pub ca: Option<String>,
}

impl std::fmt::Debug for ClientCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCredentials").field("user", &self.user).finish_non_exhaustive()
    }
}

/// Reads a credentials file; the error names the file.
pub fn read_credentials(path: &str) -> Result<ClientCredentials, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    serde_json::from_str(&text).map_err(|e| format!("{path}: not {{\"user\", \"password\", \"ca\"}}: {e}"))
}

impl AdminSecurity {
    pub fn from_settings(settings: &Settings) -> Result<Self, String> {
        let client = match settings.get("admin.client.credentials") {
            Some(path) => Some(read_credentials(&path)?),
            None => None,
        };
        Ok(Self {
            tls: settings.bool("admin.tls.enabled"),
            authentication: settings.bool("admin.authentication.enabled"),
            metrics_public: settings.bool("admin.metrics.public"),
            client,
        })
    }

    /// The client and URL scheme for calls to other nodes' admin APIs.
    pub fn peer_client(&self, timeout: Duration) -> PeerClient {
        let mut builder = reqwest::Client::builder().timeout(timeout);
        if let Some(ca) = self.client.as_ref().and_then(|c| c.ca.as_ref()) {
            match std::fs::read(ca)
                .map_err(|e| e.to_string())
                .and_then(|pem| reqwest::Certificate::from_pem(&pem).map_err(|e| e.to_string()))
            {
                Ok(cert) => builder = builder.add_root_certificate(cert),
                Err(e) => tracing::warn!(ca = %ca, error = %e, "cannot read the CA of admin.client.credentials"),
            }
        }
        PeerClient {
            http: builder.build().unwrap_or_default(),
            scheme: if self.tls { "https" } else { "http" },
            auth: self.client.as_ref().map(|c| (c.user.clone(), c.password.clone())),
        }
    }
}

/// An HTTP client for other nodes' admin APIs.
#[derive(Clone)]
pub struct PeerClient {
    http: reqwest::Client,
    scheme: &'static str,
    auth: Option<(String, String)>,
}

impl PeerClient {
    /// A GET of `path` on the admin API at `addr` (`host:port`).
    pub fn get(&self, addr: &str, path: &str) -> reqwest::RequestBuilder {
        let request = self.http.get(format!("{}://{addr}{path}", self.scheme));
        match &self.auth {
            Some((user, password)) => request.basic_auth(user, Some(password)),
            None => request,
        }
    }
}

/// Makes the user of `admin.client.credentials` exist (both SCRAM
/// mechanisms) if it does not: the credentials file is how the first user
/// of a cluster with admin authentication on comes to be. A user that exists
/// is left as it is.
pub async fn ensure_user(
    ctx: &NodeContext,
    credentials: &ClientCredentials,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    use crate::controller::protocol::ControllerRequest;
    use crate::security::{scram, users};
    let mut wait = Duration::from_millis(200);
    loop {
        if ctx.quorum.image().scram_credentials.contains_key(&credentials.user) {
            return;
        }
        let (user, password) = (credentials.user.clone(), credentials.password.clone());
        let changes = tokio::task::spawn_blocking(move || {
            scram::ScramMechanism::ALL
                .iter()
                .map(|m| {
                    let c = scram::credential_from_password(*m, password.as_bytes(), scram::DEFAULT_ITERATIONS);
                    (user.clone(), m.kafka_code(), Some(users::to_record(c)))
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        match super::controller_write(ctx, ControllerRequest::AlterScramCredentials { changes }).await {
            Ok(()) => {
                tracing::info!(user = %credentials.user, "created the user of admin.client.credentials");
                return;
            }
            Err(e) => tracing::debug!(error = %e, "creating the user of admin.client.credentials; will retry"),
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
        wait = (wait * 2).min(Duration::from_secs(5));
    }
}

/// Who is on the other end of an admin connection.
#[derive(Debug, Clone)]
pub struct AdminPeer {
    pub addr: SocketAddr,
    /// `User:<certificate subject>` when the client sent a certificate.
    pub principal: Option<Arc<str>>,
}

impl Connected<IncomingStream<'_, TcpListener>> for AdminPeer {
    fn connect_info(stream: IncomingStream<'_, TcpListener>) -> Self {
        Self { addr: *stream.remote_addr(), principal: None }
    }
}

impl Connected<IncomingStream<'_, TlsListener>> for AdminPeer {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Self {
        stream.remote_addr().clone()
    }
}

type Handshake = std::pin::Pin<Box<dyn std::future::Future<Output = Option<(TlsStream<TcpStream>, AdminPeer)>> + Send>>;

/// The admin API's HTTPS listener. Handshakes run side by side, so a client
/// that stalls in one holds up no other.
pub struct TlsListener {
    tcp: TcpListener,
    tls: Arc<TlsSource>,
    handshakes: FuturesUnordered<Handshake>,
}

impl TlsListener {
    pub fn new(tcp: TcpListener, tls: Arc<TlsSource>) -> Self {
        Self { tcp, tls, handshakes: FuturesUnordered::new() }
    }
}

impl Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = AdminPeer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            tokio::select! {
                accepted = self.tcp.accept() => match accepted {
                    Ok((stream, addr)) => {
                        let acceptor = self.tls.acceptor();
                        self.handshakes.push(Box::pin(async move {
                            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                                Ok(Ok(stream)) => stream,
                                Ok(Err(e)) => {
                                    tracing::info!(peer = %addr, error = %e, "admin TLS handshake failed");
                                    return None;
                                }
                                Err(_) => return None,
                            };
                            let principal = stream
                                .get_ref()
                                .1
                                .peer_certificates()
                                .and_then(|c| c.first())
                                .and_then(certificate_subject)
                                .map(|s| Arc::from(format!("User:{s}")));
                            Some((stream, AdminPeer { addr, principal }))
                        }));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "admin accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                },
                Some(done) = self.handshakes.next(), if !self.handshakes.is_empty() => {
                    if let Some(connection) = done {
                        return connection;
                    }
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(AdminPeer { addr: self.tcp.local_addr()?, principal: None })
    }
}

fn unauthenticated(message: &str) -> Response {
    let mut response = HttpError(ApiError::new(ErrorCode::SaslAuthenticationFailed, message)).into_response();
    response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Basic realm=\"strom\""));
    response
}

/// The user and password of an `Authorization: Basic` header.
fn basic_credentials(request: &Request) -> Option<(String, String)> {
    let value = request.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(encoded.trim()).ok()?;
    let (user, password) = std::str::from_utf8(&decoded).ok()?.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

/// What a request needs: an operation on a resource, from its route
/// template (`/v1/topics/{name}`) and path.
pub fn required_access(method: &Method, template: &str, path: &str) -> (Operation, ResourceType, String) {
    let segment = |name: &str| {
        let at = template.split('/').position(|s| s == name)?;
        path.split('/').nth(at).map(percent_decode)
    };
    let read = *method == Method::GET || *method == Method::HEAD;
    let cluster = |op| (op, ResourceType::Cluster, CLUSTER_NAME.to_string());
    if let Some(topic) = segment("{name}").filter(|_| template.starts_with("/v1/topics/")) {
        let op = match (read, template.ends_with("/configs"), method) {
            (true, true, _) => Operation::DescribeConfigs,
            (true, false, _) => Operation::Describe,
            (false, true, _) => Operation::AlterConfigs,
            (false, false, &Method::DELETE) => Operation::Delete,
            (false, false, _) => Operation::Alter,
        };
        return (op, ResourceType::Topic, topic);
    }
    if let Some(group) = segment("{id}").filter(|_| template.starts_with("/v1/groups/")) {
        return (Operation::Describe, ResourceType::Group, group);
    }
    match (template, read) {
        ("/v1/topics", false) => cluster(Operation::Create),
        ("/v1/brokers/configs", true) => cluster(Operation::DescribeConfigs),
        ("/v1/brokers/configs", false) => cluster(Operation::AlterConfigs),
        (_, true) => cluster(Operation::Describe),
        (_, false) => cluster(Operation::Alter),
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The admin API's authentication and authorization, around every route.
pub async fn guard(State(ctx): State<Arc<NodeContext>>, request: Request, next: Next) -> Response {
    let security = &ctx.admin_security;
    let path = request.uri().path().to_string();
    let open = path == "/health" || path == "/ready" || (path == "/metrics" && security.metrics_public);
    if !security.authentication || open {
        return next.run(request).await;
    }
    let from_certificate = request.extensions().get::<ConnectInfo<AdminPeer>>().and_then(|c| c.0.principal.clone());
    let principal: Arc<str> = match (from_certificate, basic_credentials(&request)) {
        (Some(p), _) => p,
        (None, Some((user, password))) => {
            let image = ctx.quorum.image();
            let checked = {
                let user = user.clone();
                tokio::task::spawn_blocking(move || {
                    crate::security::sasl::check_password(&image, &user, password.as_bytes())
                })
                .await
            };
            if !matches!(checked, Ok(true)) {
                tracing::info!(%user, %path, "admin API authentication failed");
                let ms = ctx.settings.u64("connection.failed.authentication.delay.ms");
                tokio::time::sleep(Duration::from_millis(ms)).await;
                return unauthenticated("the user name or password is wrong");
            }
            Arc::from(format!("User:{user}"))
        }
        (None, None) => return unauthenticated("authentication is required: HTTP Basic with a SCRAM user"),
    };
    let template = request.extensions().get::<MatchedPath>().map_or(path.clone(), |m| m.as_str().to_string());
    let (op, resource, name) = required_access(request.method(), &template, &path);
    let host = request
        .extensions()
        .get::<ConnectInfo<AdminPeer>>()
        .map_or(std::net::IpAddr::from([0, 0, 0, 0]), |c| c.0.addr.ip());
    if !ctx.authorizer.authorize(&ctx.quorum.image(), &principal, host, op, resource, &name) {
        tracing::info!(%principal, %path, ?op, ?resource, "admin API authorization failed");
        let code = match resource {
            ResourceType::Topic => ErrorCode::TopicAuthorizationFailed,
            ResourceType::Group => ErrorCode::GroupAuthorizationFailed,
            _ => ErrorCode::ClusterAuthorizationFailed,
        };
        let message = format!("{principal} may not {} {} {name}", op.name().to_uppercase(), resource.name());
        return HttpError(ApiError::new(code, message)).into_response();
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_map_to_kafkas_operations() {
        let access = |m: Method, t: &str, p: &str| {
            let (op, rt, name) = required_access(&m, t, p);
            (op, rt, name)
        };
        let cluster = CLUSTER_NAME.to_string();
        assert_eq!(
            access(Method::GET, "/v1/topics/{name}", "/v1/topics/orders"),
            (Operation::Describe, ResourceType::Topic, "orders".into())
        );
        assert_eq!(
            access(Method::DELETE, "/v1/topics/{name}", "/v1/topics/a%2Eb"),
            (Operation::Delete, ResourceType::Topic, "a.b".into())
        );
        assert_eq!(
            access(Method::PATCH, "/v1/topics/{name}/configs", "/v1/topics/t/configs"),
            (Operation::AlterConfigs, ResourceType::Topic, "t".into())
        );
        assert_eq!(
            access(Method::POST, "/v1/topics/{name}/partitions", "/v1/topics/t/partitions"),
            (Operation::Alter, ResourceType::Topic, "t".into())
        );
        assert_eq!(
            access(Method::POST, "/v1/topics", "/v1/topics"),
            (Operation::Create, ResourceType::Cluster, cluster.clone())
        );
        assert_eq!(
            access(Method::GET, "/v1/topics", "/v1/topics"),
            (Operation::Describe, ResourceType::Cluster, cluster.clone())
        );
        assert_eq!(
            access(Method::GET, "/v1/groups/{id}", "/v1/groups/g1"),
            (Operation::Describe, ResourceType::Group, "g1".into())
        );
        assert_eq!(
            access(Method::POST, "/v1/acls", "/v1/acls"),
            (Operation::Alter, ResourceType::Cluster, cluster.clone())
        );
        assert_eq!(
            access(Method::PATCH, "/v1/brokers/configs", "/v1/brokers/configs"),
            (Operation::AlterConfigs, ResourceType::Cluster, cluster)
        );
    }

    #[test]
    fn basic_headers_are_read_and_bad_ones_ignored() {
        let with = |v: &str| {
            Request::builder().header(header::AUTHORIZATION, v).body(axum::body::Body::empty()).expect("request")
        };
        let encoded = base64::engine::general_purpose::STANDARD.encode("alice:pw:with:colons");
        assert_eq!(
            basic_credentials(&with(&format!("Basic {encoded}"))),
            Some(("alice".into(), "pw:with:colons".into()))
        );
        assert_eq!(basic_credentials(&with("Bearer x")), None);
        assert_eq!(basic_credentials(&with("Basic !!!")), None);
    }
}
