//! Wires one node together: the metadata quorum, the controller role, the
//! broker lifecycle and the admin API; startup checks and controlled shutdown.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use strom_raft::server::AppHandler;
use strom_raft::{codec, MetadataImage, Quorum, QuorumConfig};
use tokio::sync::watch;

use crate::admin::auth::AdminSecurity;
use crate::admin::metrics::Metrics;
use crate::config::Settings;
use crate::controller::client::ControllerClient;
use crate::controller::protocol::{ControllerRequest, ControllerResponse};
use crate::controller::Controller;
use crate::error::{ApiError, ErrorCode};
use crate::group::GroupCoordinator;
use crate::kafka::connection::ListenerSpec;
use crate::kafka::producer_ids::ProducerIdAllocator;
use crate::kafka::registry::Client;
use crate::lifecycle::{BrokerIdentity, BrokerLifecycle};
use crate::replication::fetcher::FetcherManager;
use crate::replication::ReplicaManager;
use crate::security::acl::{Authorizer, Operation, ResourceType, CLUSTER_NAME};
use crate::security::sasl::Mechanism;
use crate::security::tls::TlsSource;
use crate::security::Listener;

/// Everything `strom serve` was told.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub node_id: u64,
    pub data_dir: PathBuf,
    /// The Kafka listeners, the inter-broker one first.
    pub listeners: Vec<Listener>,
    pub admin: String,
    pub raft: String,
    /// Voter ids and `--raft` addresses; a node alone when `--quorum` is absent.
    pub voters: BTreeMap<u64, String>,
    pub settings: Settings,
}

/// What a node's services share.
pub struct NodeContext {
    pub broker_id: i32,
    pub settings: Arc<Settings>,
    pub quorum: Arc<Quorum>,
    pub controller: Arc<Controller>,
    pub client: Arc<ControllerClient>,
    pub lifecycle: Arc<BrokerLifecycle>,
    pub metrics: Arc<Metrics>,
    pub replicas: Arc<ReplicaManager>,
    pub producer_ids: ProducerIdAllocator,
    pub groups: Arc<GroupCoordinator>,
    pub txns: Arc<crate::txn::TransactionCoordinator>,
    /// The ACL authorizer (off unless `authorizer.class.name` is set).
    pub authorizer: Authorizer,
    /// HTTPS, authentication and peer credentials of the admin API.
    pub admin_security: AdminSecurity,
    /// Client quota rates.
    pub quotas: crate::security::quotas::QuotaManager,
    /// Incremental fetch sessions (KIP-227).
    pub fetch_sessions: crate::kafka::fetch_session::FetchSessionCache,
}

/// Longest a request waits for the data plane to enact metadata this node has already applied.
const DATA_PLANE_LAG_MAX: Duration = Duration::from_secs(2);

impl NodeContext {
    /// Whether `client` may do `op` on a resource, by the ACLs in `image`.
    pub fn authorize(
        &self,
        client: &Client,
        image: &MetadataImage,
        op: Operation,
        resource: ResourceType,
        name: &str,
    ) -> bool {
        self.authorizer.authorize(image, &client.principal, client.host, op, resource, name)
    }

    /// Records `bytes` of a produce or fetch against `client`'s quota; the
    /// throttle time in ms, which also mutes the client's connection.
    pub fn throttle(&self, client: &Client, kind: crate::security::quotas::QuotaKind, bytes: usize) -> i32 {
        let image = self.quorum.image();
        if image.client_quotas.is_empty() {
            return 0;
        }
        let client_id = client.id.as_deref().unwrap_or("");
        let now = crate::clock::mono_ms() as u64;
        let ms = self.quotas.record(&image, kind, &client.principal, client_id, bytes, now);
        if ms > 0 {
            client.mute.mute_for(ms);
        }
        ms.min(i32::MAX as u64) as i32
    }

    /// A Fetch answer of `bytes` for `client` under its consumer quota:
    /// whether to send it (else an empty answer goes instead), and the
    /// throttle time in ms, which also mutes the client's connection.
    pub fn admit_fetch(&self, client: &Client, bytes: usize) -> (bool, i32) {
        use crate::security::quotas::{Admission, QuotaKind};
        let image = self.quorum.image();
        if image.client_quotas.is_empty() {
            return (true, 0);
        }
        let client_id = client.id.as_deref().unwrap_or("");
        let now = crate::clock::mono_ms() as u64;
        let (send, ms) = match self.quotas.admit(&image, QuotaKind::Fetch, &client.principal, client_id, bytes, now) {
            Admission::Send { throttle_ms } => (true, throttle_ms),
            Admission::Withhold { throttle_ms } => (false, throttle_ms),
        };
        if ms > 0 {
            client.mute.mute_for(ms);
        }
        (send, ms.min(i32::MAX as u64) as i32)
    }

    /// Whether `client` may do `op` on the cluster.
    pub fn authorize_cluster(&self, client: &Client, image: &MetadataImage, op: Operation) -> bool {
        self.authorize(client, image, op, ResourceType::Cluster, CLUSTER_NAME)
    }

    /// Waits (bounded) until the replicas follow every metadata record this
    /// node had applied when called, so a client that has just seen a
    /// leadership in Metadata or the admin API finds it enacted here.
    pub async fn data_plane_current(&self) {
        let index = self.quorum.applied_index();
        if !self.replicas.wait_applied(index, DATA_PLANE_LAG_MAX).await {
            tracing::debug!(index, "replicas still behind the applied metadata; answering from them as they are");
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("data directory {path}: {reason}")]
    DataDir { path: PathBuf, reason: String },
    #[error(transparent)]
    Quorum(#[from] strom_raft::QuorumError),
    #[error("cannot listen on the admin address {addr}: {source}")]
    AdminBind { addr: String, source: std::io::Error },
    #[error("cannot listen on the Kafka address {addr}: {source}")]
    KafkaBind { addr: String, source: std::io::Error },
    #[error("listener {listener}: {reason}")]
    Listener { listener: String, reason: String },
    #[error("partition logs under {path}: {source}")]
    Logs { path: PathBuf, source: std::io::Error },
}

const META_PROPERTIES: &str = "meta.properties";

/// Checks (or, on first start, writes) `data-dir/meta.properties`, so a data
/// directory is never silently used by another node id or without its store.
fn check_data_dir(data_dir: &Path, node_id: u64) -> Result<(), NodeError> {
    let err = |reason: String| NodeError::DataDir { path: data_dir.to_path_buf(), reason };
    std::fs::create_dir_all(data_dir).map_err(|e| err(format!("cannot create: {e}")))?;
    let props = data_dir.join(META_PROPERTIES);
    match std::fs::read_to_string(&props) {
        Ok(text) => {
            let stored = text
                .lines()
                .find_map(|l| l.strip_prefix("node.id="))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| err(format!("{META_PROPERTIES} has no valid node.id line")))?;
            if stored != node_id {
                return Err(err(format!("belongs to node {stored}, not node {node_id}")));
            }
            if !data_dir.join("meta").is_dir() {
                return Err(err(
                    "the metadata store `meta/` is missing; restore it or start with an empty directory".into()
                ));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // fsynced, renamed and the directory fsynced: a power loss right after
            // the first start must not leave an empty meta.properties that no
            // restart accepts.
            crate::log::checkpoint::write_atomic(&props, format!("version=1\nnode.id={node_id}\n").as_bytes())
                .map_err(|e| err(format!("cannot write {META_PROPERTIES}: {e}")))
        }
        Err(e) => Err(err(format!("cannot read {META_PROPERTIES}: {e}"))),
    }
}

/// Answers quorum `App` frames with the local controller.
struct ControllerRpc(Arc<Controller>);

impl AppHandler for ControllerRpc {
    fn handle(&self, request: Vec<u8>) -> Pin<Box<dyn Future<Output = Vec<u8>> + Send + '_>> {
        Box::pin(async move {
            let response = match codec::decode::<ControllerRequest>(&request) {
                Ok(request) => self.0.handle(request).await,
                Err(e) => {
                    ControllerResponse::Error(ApiError::new(ErrorCode::InvalidRequest, format!("bad request: {e}")))
                }
            };
            codec::encode(&response).unwrap_or_default()
        })
    }
}

/// Counts quorum leader changes for `/metrics`, and logs them once. A
/// quorum core that stopped (openraft's fatal errors, a panic in its task)
/// ends the process: a node that stays up without it still answers as
/// controller and broker from a frozen image and blocks the cluster, while a
/// node that exits is replaced by the others and can be restarted clean.
async fn watch_leader(quorum: Arc<Quorum>, metrics: Arc<Metrics>, mut shutdown: watch::Receiver<bool>) {
    let mut rx = quorum.raft().metrics();
    let mut leader = rx.borrow().current_leader;
    loop {
        tokio::select! {
            changed = rx.changed() => if changed.is_err() {
                if !*shutdown.borrow() {
                    quorum_stopped("its task ended");
                }
                return;
            },
            _ = shutdown.changed() => return,
        }
        if let Err(fatal) = &rx.borrow().running_state {
            quorum_stopped(&fatal.to_string());
        }
        let now = rx.borrow().current_leader;
        if now != leader {
            leader = now;
            metrics.leader_changes.fetch_add(1, Ordering::Relaxed);
            tracing::info!(leader = ?now, term = rx.borrow().current_term, "metadata quorum leader changed");
        }
    }
}

fn quorum_stopped(why: &str) -> ! {
    tracing::error!(why, "the metadata quorum stopped on this node; exiting so that it can be restarted clean");
    std::process::exit(70);
}

/// How a listener's connections are secured, from the settings: TLS files
/// are loaded now, so a bad one stops the start with its reason.
fn listener_spec(l: &Listener, settings: &Settings) -> Result<ListenerSpec, NodeError> {
    let error = |reason: String| NodeError::Listener { listener: l.name.clone(), reason };
    let tls = match l.protocol.uses_tls() {
        true => Some(Arc::new(TlsSource::from_settings(settings).map_err(error)?)),
        false => None,
    };
    let sasl = settings
        .get("sasl.enabled.mechanisms")
        .unwrap_or_default()
        .split(',')
        .filter_map(|m| Mechanism::parse(m.trim()))
        .collect();
    Ok(ListenerSpec { name: Arc::from(l.name.as_str()), protocol: l.protocol, tls, sasl })
}

/// Runs a node until SIGTERM/SIGINT, then shuts down in a controlled way.
pub async fn run(config: NodeConfig) -> Result<(), NodeError> {
    let settings = Arc::new(config.settings.clone());
    // Before the data directory is touched: a listener that cannot start
    // (a TLS file that does not load) leaves it as it was.
    let specs = config.listeners.iter().map(|l| listener_spec(l, &settings)).collect::<Result<Vec<_>, _>>()?;
    // Mutual TLS between nodes: the quorum port, and the inter-broker listener.
    let quorum_tls = settings.get("quorum.security.protocol").as_deref() == Some("SSL");
    let node_tls = match quorum_tls || config.listeners[0].protocol.uses_tls() {
        true => Some(
            crate::security::tls::node_tls(&settings)
                .map_err(|reason| NodeError::Listener { listener: "between nodes".into(), reason })?,
        ),
        false => None,
    };
    let admin_security = AdminSecurity::from_settings(&settings)
        .map_err(|reason| NodeError::Listener { listener: "admin".into(), reason })?;
    if admin_security.tls {
        TlsSource::from_settings(&settings)
            .map_err(|reason| NodeError::Listener { listener: "admin".into(), reason })?;
    }
    check_data_dir(&config.data_dir, config.node_id)?;
    let broker_id = i32::try_from(config.node_id).map_err(|_| NodeError::DataDir {
        path: config.data_dir.clone(),
        reason: "node id does not fit a Kafka broker id".into(),
    })?;
    let controller = Arc::new(Controller::new(broker_id, settings.clone()));
    let election_ms = settings.u64("controller.quorum.election.timeout.ms");
    let quorum_config = QuorumConfig {
        node_id: config.node_id,
        raft_addr: config.raft.clone(),
        voters: config.voters.clone(),
        meta_dir: config.data_dir.join("meta"),
        election_timeout_ms: election_ms,
        heartbeat_interval_ms: (election_ms / 5).max(10),
        snapshot_entries: settings.u64("metadata.snapshot.interval.entries"),
        snapshot_keep_entries: settings.u64("metadata.snapshot.keep.entries"),
        tls: node_tls.clone().filter(|_| quorum_tls),
    };
    let backlog = settings.u64("socket.listen.backlog.size").min(u32::MAX as u64) as u32;
    let admin_listener = listen(&config.admin, backlog)
        .await
        .map_err(|source| NodeError::AdminBind { addr: config.admin.clone(), source })?;
    let mut kafka_listeners = Vec::with_capacity(config.listeners.len());
    for (l, spec) in config.listeners.iter().zip(specs) {
        let socket =
            listen(&l.bind, backlog).await.map_err(|source| NodeError::KafkaBind { addr: l.bind.clone(), source })?;
        kafka_listeners.push((socket, Arc::new(spec)));
    }
    let replicas = Arc::new(
        ReplicaManager::new(broker_id, &config.data_dir, settings.clone())
            .map_err(|source| NodeError::Logs { path: config.data_dir.join("logs"), source })?,
    );
    let quorum = Arc::new(Quorum::start(quorum_config, Arc::new(ControllerRpc(controller.clone()))).await?);
    controller.attach(quorum.clone());
    let client = Arc::new(ControllerClient::new(quorum.clone(), controller.clone()));
    let identity = BrokerIdentity {
        broker_id,
        kafka: config.listeners[0].advertised.clone(),
        admin: config.admin.clone(),
        raft: config.raft.clone(),
        rack: settings.get("broker.rack"),
        listeners: config.listeners.iter().map(|l| (l.name.clone(), l.advertised.clone())).collect(),
    };
    let lifecycle = Arc::new(BrokerLifecycle::new(
        identity,
        (
            Duration::from_millis(settings.u64("broker.heartbeat.interval.ms")),
            Duration::from_millis(settings.u64("broker.session.timeout.ms")),
        ),
        quorum.clone(),
        client.clone(),
        replicas.clone(),
    ));
    let metrics = Arc::new(Metrics::default());
    let groups = Arc::new(GroupCoordinator::new(settings.clone(), replicas.clone()));
    let ctx = Arc::new(NodeContext {
        broker_id,
        settings: settings.clone(),
        quorum: quorum.clone(),
        controller: controller.clone(),
        client,
        lifecycle: lifecycle.clone(),
        metrics: metrics.clone(),
        replicas: replicas.clone(),
        producer_ids: ProducerIdAllocator::default(),
        groups: groups.clone(),
        txns: Arc::new(crate::txn::TransactionCoordinator::new(
            broker_id,
            settings.clone(),
            replicas.clone(),
            quorum.clone(),
            node_tls.clone().filter(|_| config.listeners[0].protocol.uses_tls()),
            groups,
        )),
        authorizer: Authorizer::from_settings(&settings),
        admin_security,
        quotas: crate::security::quotas::QuotaManager::from_settings(&settings),
        fetch_sessions: crate::kafka::fetch_session::FetchSessionCache::new(
            settings.int("max.incremental.fetch.session.cache.slots").unwrap_or(1000).max(0) as usize,
        ),
    });

    let (stop_tx, stop_rx) = watch::channel(false);
    let (stop_admin_tx, stop_admin_rx) = watch::channel(false);
    let controller_task = tokio::spawn(controller.clone().run(stop_rx.clone()));
    let leader_task = tokio::spawn(watch_leader(quorum.clone(), metrics, stop_rx.clone()));
    let (stop_kafka_tx, stop_kafka_rx) = watch::channel(false);
    let replicas_task = {
        let (replicas, lifecycle, quorum, stop) =
            (replicas.clone(), lifecycle.clone(), quorum.clone(), stop_admin_rx.clone());
        tokio::spawn(async move {
            if lifecycle.wait_caught_up(stop.clone()).await {
                tracing::info!("caught up with the metadata log; serving partitions");
                replicas.run(quorum.subscribe(), stop).await;
            }
        })
    };
    let groups_task = {
        let (groups, lifecycle, stop) = (ctx.groups.clone(), lifecycle.clone(), stop_admin_rx.clone());
        tokio::spawn(async move {
            if lifecycle.wait_caught_up(stop.clone()).await {
                groups.run(stop).await;
            }
        })
    };
    let txns_task = {
        let (txns, lifecycle, stop) = (ctx.txns.clone(), lifecycle.clone(), stop_admin_rx.clone());
        tokio::spawn(async move {
            if lifecycle.wait_caught_up(stop.clone()).await {
                txns.run(stop).await;
            }
        })
    };
    let kafka_task = {
        let (ctx, lifecycle, stop) = (ctx.clone(), lifecycle.clone(), stop_kafka_rx.clone());
        tokio::spawn(async move {
            if lifecycle.wait_caught_up(stop.clone()).await {
                let serving = kafka_listeners
                    .into_iter()
                    .map(|(socket, spec)| tokio::spawn(crate::kafka::serve(socket, spec, ctx.clone(), stop.clone())));
                futures_util::future::join_all(serving).await;
            }
        })
    };
    let fetchers = Arc::new(FetcherManager::new(
        broker_id,
        replicas.clone(),
        quorum.clone(),
        settings.int("replica.fetch.wait.max.ms").unwrap_or(500) as i32,
        (
            settings.int("replica.fetch.max.bytes").unwrap_or(1 << 20) as i32,
            settings.int("replica.fetch.response.max.bytes").unwrap_or(10 << 20) as i32,
        ),
        node_tls.clone().filter(|_| config.listeners[0].protocol.uses_tls()),
    ));
    let fetcher_task = tokio::spawn(fetchers.run(stop_rx.clone()));
    let isr_task = tokio::spawn(crate::replication::isr_sync::run(
        broker_id,
        replicas.clone(),
        ctx.client.clone(),
        quorum.clone(),
        settings.int("replica.lag.time.max.ms").unwrap_or(10_000),
        stop_rx.clone(),
    ));
    // The admin API runs on a thread and runtime of its own, so health checks
    // and the operator's view answer while the Kafka data plane saturates the
    // main runtime (500 connections producing as fast as they can).
    let admin_task = spawn_admin(admin_listener, ctx.clone(), stop_admin_rx)
        .map_err(|source| NodeError::AdminBind { addr: config.admin.clone(), source })?;
    // The logs this node's copy of the metadata says it hosts are opened
    // (recovered after a crash) before the broker registers: it is unfenced,
    // and answers /ready, only with them open. The quorum, the controller and
    // the admin API (/health; /ready says 503) already run meanwhile.
    {
        let (replicas, image) = (replicas.clone(), quorum.image());
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).max(2);
        let started = std::time::Instant::now();
        match tokio::task::spawn_blocking(move || replicas.recover_logs(&image, threads)).await {
            Ok(opened) => tracing::info!(
                partitions = opened,
                threads,
                ms = started.elapsed().as_millis() as u64,
                "partition logs opened before registering"
            ),
            Err(e) => {
                tracing::error!(error = %e, "opening the partition logs failed; they open as the metadata applies")
            }
        }
    }
    let lifecycle_task = tokio::spawn(lifecycle.clone().run(stop_rx.clone()));
    if let Some(credentials) = ctx.admin_security.client.clone() {
        let (ctx, stop) = (ctx.clone(), stop_rx.clone());
        tokio::spawn(async move {
            if ctx.lifecycle.wait_caught_up(stop.clone()).await {
                crate::admin::auth::ensure_user(&ctx, &credentials, stop).await;
            }
        });
    }
    tracing::info!(
        node_id = config.node_id,
        kafka = %config.listeners.iter().map(|l| format!("{}://{}", l.name, l.bind)).collect::<Vec<_>>().join(","),
        admin = %config.admin,
        raft = %config.raft,
        voter = config.voters.contains_key(&config.node_id),
        "node started"
    );
    if settings.bool("unsafe.ack.before.commit") {
        tracing::warn!("unsafe.ack.before.commit is set: acks=all answers before replication and LOSES acknowledged records on failover; it exists only as a negative control for the fault harness");
    }

    wait_for_signal().await;
    tracing::info!(node_id = config.node_id, "shutting down: controlled shutdown first");
    let _ = stop_tx.send(true);
    let _ = lifecycle_task.await;
    lifecycle.controlled_shutdown().await;
    let _ = stop_kafka_tx.send(true);
    let _ = kafka_task.await;
    let _ = controller_task.await;
    let _ = fetcher_task.await;
    let _ = isr_task.await;
    let _ = leader_task.await;
    let _ = stop_admin_tx.send(true);
    if let Ok(Err(e)) = admin_task.await {
        tracing::warn!(error = %e, "admin server stopped with an error");
    }
    let _ = replicas_task.await;
    let _ = groups_task.await;
    let _ = txns_task.await;
    quorum.shutdown().await;
    tracing::info!(node_id = config.node_id, "stopped");
    Ok(())
}

/// Binds a listener with room for `backlog` connections the kernel has
/// completed and the node has not accepted yet (`socket.listen.backlog.size`).
/// Tokio's `bind` asks for 128. 500 clients connecting at once overflowed
/// it: the kernel answered the surplus with SYN cookies, dropped their last
/// handshake packet while the queue stayed full, and reset those whose
/// cookie no longer checked at their first request.
async fn listen(addr: &str, backlog: u32) -> std::io::Result<tokio::net::TcpListener> {
    let mut last = None;
    for a in tokio::net::lookup_host(addr).await? {
        let socket = if a.is_ipv4() { tokio::net::TcpSocket::new_v4() } else { tokio::net::TcpSocket::new_v6() }?;
        socket.set_reuseaddr(true)?;
        match socket.bind(a).and_then(|()| socket.listen(backlog)) {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{addr} resolves to no address"))
    }))
}

/// Serves the admin API on a thread running its own single-threaded runtime;
/// the receiver gets its result when it stops.
fn spawn_admin(
    listener: tokio::net::TcpListener,
    ctx: Arc<NodeContext>,
    stop: watch::Receiver<bool>,
) -> std::io::Result<tokio::sync::oneshot::Receiver<std::io::Result<()>>> {
    // Registered again with the admin runtime's own I/O driver, so its
    // accepts never wait for the main runtime's.
    let listener = listener.into_std()?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new().name("admin".into()).spawn(move || {
        let result = tokio::runtime::Builder::new_current_thread().enable_all().build().and_then(|runtime| {
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener)?;
                crate::admin::serve(listener, ctx, stop).await
            })
        });
        let _ = tx.send(result);
    })?;
    Ok(rx)
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_dir_is_bound_to_its_node_and_store() {
        let dir = tempfile::tempdir().expect("tempdir");
        check_data_dir(dir.path(), 3).expect("first start writes meta.properties");
        std::fs::create_dir(dir.path().join("meta")).expect("mkdir");
        check_data_dir(dir.path(), 3).expect("same node restarts");
        let e = check_data_dir(dir.path(), 4).expect_err("other node");
        assert!(e.to_string().contains("belongs to node 3"), "{e}");
        std::fs::remove_dir(dir.path().join("meta")).expect("rmdir");
        let e = check_data_dir(dir.path(), 3).expect_err("store missing");
        assert!(e.to_string().contains("missing"), "{e}");
    }
}
