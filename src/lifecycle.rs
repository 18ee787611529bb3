//! The broker side of membership: register with the controller, heartbeat
//! every `broker.heartbeat.interval.ms`, re-register when the controller no
//! longer knows this incarnation, and leave through a controlled shutdown.
//!
//! Readiness (`/ready`) is derived from the applied image: this broker is
//! registered with its current incarnation and unfenced.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use strom_raft::{BrokerState, Quorum};
use tokio::sync::watch;

use crate::clock::mono_ms;
use crate::controller::client::ControllerClient;
use crate::controller::protocol::{ControllerRequest, ControllerResponse};
use crate::replication::manager::ReplicaManager;

/// How often a heartbeat carries the sizes of the partitions this broker leads.
const SIZES_EVERY: Duration = Duration::from_secs(5);
/// Bound on one registration or heartbeat round trip.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// Bound on a controlled shutdown before the process exits anyway.
pub const CONTROLLED_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

pub struct BrokerLifecycle {
    pub broker_id: i32,
    pub incarnation_id: u64,
    kafka: String,
    admin: String,
    raft: String,
    rack: Option<String>,
    listeners: Vec<(String, String)>,
    heartbeat_interval: Duration,
    /// `broker.session.timeout.ms`: heard nothing from the controller this
    /// long, the broker takes no writes (it has likely been fenced).
    session_timeout: Duration,
    /// When the last registration or heartbeat the controller answered
    /// (unfenced) was sent: the controller heard from this broker after that.
    last_contact_ms: AtomicI64,
    /// The metadata log index this broker must apply before it acts as a
    /// leader or coordinator again: set when the controller unfences it,
    /// past the records that fenced it and moved its leaderships away.
    must_apply: AtomicU64,
    out_of_touch: AtomicBool,
    quorum: Arc<Quorum>,
    client: Arc<ControllerClient>,
    replicas: Arc<ReplicaManager>,
    registered: AtomicBool,
    heartbeats: AtomicU64,
}

/// What [`BrokerLifecycle`] registers and reports with.
pub struct BrokerIdentity {
    pub broker_id: i32,
    pub kafka: String,
    pub admin: String,
    pub raft: String,
    pub rack: Option<String>,
    /// Every Kafka listener's advertised address, by listener name.
    pub listeners: Vec<(String, String)>,
}

impl BrokerLifecycle {
    pub fn new(
        identity: BrokerIdentity,
        (heartbeat_interval, session_timeout): (Duration, Duration),
        quorum: Arc<Quorum>,
        client: Arc<ControllerClient>,
        replicas: Arc<ReplicaManager>,
    ) -> Self {
        let BrokerIdentity { broker_id, kafka, admin, raft, rack, listeners } = identity;
        Self {
            broker_id,
            incarnation_id: rand::random(),
            kafka,
            admin,
            raft,
            rack,
            listeners,
            heartbeat_interval,
            session_timeout,
            last_contact_ms: AtomicI64::new(mono_ms()),
            must_apply: AtomicU64::new(0),
            out_of_touch: AtomicBool::new(false),
            quorum,
            client,
            replicas,
            registered: AtomicBool::new(false),
            heartbeats: AtomicU64::new(0),
        }
    }

    /// This broker's state in the applied image, for this incarnation.
    pub fn state(&self) -> Option<BrokerState> {
        let image = self.quorum.image();
        image.brokers.get(&self.broker_id).filter(|b| b.incarnation_id == self.incarnation_id).map(|b| b.state)
    }

    pub fn is_ready(&self) -> bool {
        self.state() == Some(BrokerState::Active) && self.quorum.leader().is_some()
    }

    /// Resolves once this incarnation has been unfenced for the first time:
    /// the controller saw it caught up with the metadata log. Until then the
    /// broker acts on nothing in its (possibly stale) image: no leadership,
    /// no Kafka requests (Kafka enables request processing the same way).
    pub async fn wait_caught_up(&self, mut shutdown: watch::Receiver<bool>) -> bool {
        let mut applied = self.quorum.subscribe();
        loop {
            if self.state() == Some(BrokerState::Active) {
                return true;
            }
            tokio::select! {
                changed = applied.changed() => if changed.is_err() { return false },
                _ = shutdown.changed() => return false,
            }
        }
    }

    async fn register(&self) -> bool {
        let request = ControllerRequest::RegisterBroker {
            broker_id: self.broker_id,
            incarnation_id: self.incarnation_id,
            kafka: self.kafka.clone(),
            admin: self.admin.clone(),
            raft: self.raft.clone(),
            rack: self.rack.clone(),
            listeners: self.listeners.clone(),
        };
        let sent = mono_ms();
        match self.client.send(request, CALL_TIMEOUT).await {
            Ok(ControllerResponse::Done { index }) => {
                tracing::info!(broker_id = self.broker_id, "registered with the controller");
                self.touched(sent, index);
                true
            }
            Ok(other) => {
                tracing::debug!(?other, "registration not accepted yet");
                false
            }
            Err(e) => {
                tracing::debug!(error = %e, "registration failed; will retry");
                false
            }
        }
    }

    async fn heartbeat(&self) {
        let request = ControllerRequest::Heartbeat {
            broker_id: self.broker_id,
            incarnation_id: self.incarnation_id,
            applied_index: self.quorum.applied_index(),
            sizes: self.sizes_due(),
        };
        let sent = mono_ms();
        match self.client.send(request, CALL_TIMEOUT).await {
            Ok(ControllerResponse::UnknownBroker) => self.registered.store(false, Ordering::Release),
            // Fenced, this broker's leaderships have been (or are being)
            // moved away: that answer renews nothing.
            Ok(ControllerResponse::Heartbeat { fenced: true, .. }) => {}
            Ok(ControllerResponse::Heartbeat { fenced: false, index }) => self.touched(sent, index),
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "heartbeat failed"),
        }
    }

    /// The controller answered a request sent at `sent` (so it heard from
    /// this broker after then: the session is counted from there, never
    /// later than the controller counts it), and this broker must apply the
    /// metadata log to `index` before it acts on its image again.
    fn touched(&self, sent: i64, index: u64) {
        self.must_apply.fetch_max(index, Ordering::AcqRel);
        self.last_contact_ms.fetch_max(sent, Ordering::AcqRel);
        if self.out_of_touch.swap(false, Ordering::AcqRel) {
            tracing::info!(broker_id = self.broker_id, "the controller answers again: taking writes");
        }
    }

    /// Whether the controller has not answered for `broker.session.timeout.ms`:
    /// cut off from the quorum, this broker has most likely been fenced and
    /// its partitions led elsewhere, so it takes no writes (they could never
    /// commit) and answers NOT_LEADER_OR_FOLLOWER, which sends clients to
    /// fresh metadata.
    ///
    /// Also while this broker has not yet applied the metadata up to where
    /// the controller last unfenced it: a broker paused or cut off long
    /// enough to be fenced hears back from the controller before it has
    /// applied the records that moved its leaderships away, and until then
    /// its image (and the groups it coordinated) are stale.
    pub fn out_of_touch(&self) -> bool {
        if self.quorum.applied_index() < self.must_apply.load(Ordering::Acquire) {
            return true;
        }
        let silent =
            Duration::from_millis(mono_ms().saturating_sub(self.last_contact_ms.load(Ordering::Acquire)).max(0) as u64);
        let out = silent > self.session_timeout;
        if out && !self.out_of_touch.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                broker_id = self.broker_id,
                silent_ms = silent.as_millis() as u64,
                "no answer from the controller for the session timeout: refusing writes until it answers"
            );
        }
        out
    }

    /// Every [`SIZES_EVERY`] (the first heartbeat included): the bytes each
    /// partition this broker leads holds; else nothing.
    fn sizes_due(&self) -> Vec<(String, i32, u64)> {
        let every = (SIZES_EVERY.as_millis() / self.heartbeat_interval.as_millis().max(1)).max(1) as u64;
        if !self.heartbeats.fetch_add(1, Ordering::Relaxed).is_multiple_of(every) {
            return Vec::new();
        }
        self.replicas
            .all()
            .iter()
            .filter(|p| p.is_leader())
            .map(|p| (p.topic.clone(), p.index, p.size_bytes()))
            .collect()
    }

    /// Registers, then heartbeats until `shutdown` turns true.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut ticker = tokio::time::interval(self.heartbeat_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = shutdown.changed() => return,
            }
            if !self.registered.load(Ordering::Acquire) {
                let ok = self.register().await;
                self.registered.store(ok, Ordering::Release);
            } else {
                self.heartbeat().await;
            }
        }
    }

    /// Asks the controller to move leaderships away; bounded.
    pub async fn controlled_shutdown(&self) {
        let request =
            ControllerRequest::ControlledShutdown { broker_id: self.broker_id, incarnation_id: self.incarnation_id };
        match self.client.send(request, CONTROLLED_SHUTDOWN_TIMEOUT).await {
            Ok(ControllerResponse::Done { index }) => {
                self.quorum.wait_applied(index, Duration::from_secs(2)).await;
                tracing::info!(broker_id = self.broker_id, "controlled shutdown: leaderships moved away");
            }
            Ok(other) => tracing::warn!(?other, "controlled shutdown not confirmed"),
            Err(e) => tracing::warn!(error = %e, "controlled shutdown failed; exiting anyway"),
        }
    }
}
