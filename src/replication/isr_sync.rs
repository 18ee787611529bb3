//! Sends each led partition's ISR changes to the controller (AlterPartition).
//! The change takes effect when the committed record is applied; until then
//! the leader keeps computing the high watermark over the ISR it has.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strom_raft::Quorum;
use tokio::sync::watch;

use super::ReplicaManager;
use crate::controller::client::ControllerClient;
use crate::controller::protocol::{ControllerRequest, ControllerResponse};
use crate::error::ErrorCode;

/// A proposal that got no answer is sent again after this long.
const RESEND_AFTER: Duration = Duration::from_secs(2);
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

pub async fn run(
    broker_id: i32,
    replicas: Arc<ReplicaManager>,
    client: Arc<ControllerClient>,
    quorum: Arc<Quorum>,
    lag_max_ms: i64,
    mut shutdown: watch::Receiver<bool>,
) {
    let period = Duration::from_millis((lag_max_ms / 4).clamp(50, 1000) as u64);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sent: HashMap<(String, i32), (i32, Vec<i32>, Instant)> = HashMap::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = replicas.isr_woken() => {}
            _ = shutdown.changed() => return,
        }
        let image = quorum.image();
        for p in replicas.all() {
            let Some((leader_epoch, partition_epoch, isr)) = p.isr_proposal(lag_max_ms, |b| image.is_active(b)) else {
                continue;
            };
            let key = (p.topic.clone(), p.index);
            if sent
                .get(&key)
                .is_some_and(|(pe, i, at)| *pe == partition_epoch && *i == isr && at.elapsed() < RESEND_AFTER)
            {
                continue;
            }
            sent.insert(key.clone(), (partition_epoch, isr.clone(), Instant::now()));
            let request = ControllerRequest::AlterPartition {
                broker_id,
                topic: key.0.clone(),
                partition: key.1,
                leader_epoch,
                partition_epoch,
                isr: isr.clone(),
            };
            match client.send(request, CALL_TIMEOUT).await {
                Ok(ControllerResponse::Done { .. }) => {
                    tracing::info!(topic = %key.0, partition = key.1, ?isr, "ISR change committed")
                }
                Ok(ControllerResponse::Error(e)) => {
                    tracing::debug!(topic = %key.0, partition = key.1, error = %e, "ISR change refused");
                    // Only a refusal made before proposing anything is final: a
                    // failed proposal may still be committed by the next controller.
                    if matches!(
                        e.code,
                        ErrorCode::FencedLeaderEpoch
                            | ErrorCode::InvalidUpdateVersion
                            | ErrorCode::InvalidRequest
                            | ErrorCode::IneligibleReplica
                            | ErrorCode::UnknownTopicOrPartition
                    ) {
                        p.isr_change_refused(partition_epoch);
                    }
                }
                Ok(other) => tracing::debug!(?other, "unexpected answer to an ISR change"),
                Err(e) => tracing::debug!(error = %e, "ISR change not sent"),
            }
        }
        sent.retain(|k, _| replicas.get(&k.0, k.1).is_some());
    }
}
