//! The broker side of membership: register with the controller, heartbeat
//! every `broker.heartbeat.interval.ms`, re-register when the controller no
//! longer knows this incarnation, and leave through a controlled shutdown.
//!
//! Readiness (`/ready`) is derived from the applied image: this broker is
//! registered with its current incarnation and unfenced.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use strom_raft::{BrokerState, Quorum};
use tokio::sync::watch;

use crate::controller::client::ControllerClient;
use crate::controller::protocol::{ControllerRequest, ControllerResponse};

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
    heartbeat_interval: Duration,
    quorum: Arc<Quorum>,
    client: Arc<ControllerClient>,
    registered: AtomicBool,
}

impl BrokerLifecycle {
    pub fn new(
        broker_id: i32,
        addrs: (String, String, String),
        heartbeat_interval: Duration,
        quorum: Arc<Quorum>,
        client: Arc<ControllerClient>,
    ) -> Self {
        let (kafka, admin, raft) = addrs;
        Self {
            broker_id,
            incarnation_id: rand::random(),
            kafka,
            admin,
            raft,
            heartbeat_interval,
            quorum,
            client,
            registered: AtomicBool::new(false),
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
        };
        match self.client.send(request, CALL_TIMEOUT).await {
            Ok(ControllerResponse::Done { .. }) => {
                tracing::info!(broker_id = self.broker_id, "registered with the controller");
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
        };
        match self.client.send(request, CALL_TIMEOUT).await {
            Ok(ControllerResponse::UnknownBroker) => self.registered.store(false, Ordering::Release),
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "heartbeat failed"),
        }
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
