//! Sends the led partitions' ISR changes to the controller (AlterPartition,
//! batched).
//! The change takes effect when the committed record is applied; until then
//! the leader keeps computing the high watermark over the ISR it has.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strom_raft::Quorum;
use tokio::sync::watch;

use super::partition::Partition;
use super::ReplicaManager;
use crate::controller::client::ControllerClient;
use crate::controller::protocol::{ControllerRequest, ControllerResponse, IsrChange};

/// A proposal that got no answer is sent again after this long.
const RESEND_AFTER: Duration = Duration::from_secs(2);
const CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// ISR changes per request: one metadata write each.
const BATCH: usize = 1000;

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
        let mut pending: Vec<(Arc<Partition>, IsrChange)> = Vec::new();
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
            let change = IsrChange { topic: key.0, partition: key.1, leader_epoch, partition_epoch, isr };
            pending.push((p, change));
        }
        drop(image);
        while !pending.is_empty() {
            let rest = pending.split_off(pending.len().min(BATCH));
            let batch = std::mem::replace(&mut pending, rest);
            let changes: Vec<IsrChange> = batch.iter().map(|(_, c)| c.clone()).collect();
            match client.send(ControllerRequest::AlterPartition { broker_id, changes }, CALL_TIMEOUT).await {
                Ok(ControllerResponse::Partitions { refused, .. }) => {
                    for ((p, c), refusal) in batch.iter().zip(refused) {
                        match refusal {
                            None => tracing::info!(topic = %c.topic, partition = c.partition, isr = ?c.isr,
                                "ISR change committed"),
                            // Refused before anything was proposed: final.
                            Some(e) => {
                                tracing::debug!(topic = %c.topic, partition = c.partition, error = %e,
                                    "ISR change refused");
                                p.isr_change_refused(c.partition_epoch);
                            }
                        }
                    }
                }
                // The proposal itself failed: the next controller may still
                // commit it, so what it adds keeps counting until an answer.
                Ok(ControllerResponse::Error(e)) => {
                    tracing::debug!(changes = batch.len(), error = %e, "ISR changes not committed")
                }
                Ok(other) => tracing::debug!(?other, "unexpected answer to ISR changes"),
                Err(e) => tracing::debug!(error = %e, "ISR changes not sent"),
            }
        }
        sent.retain(|k, _| replicas.get(&k.0, k.1).is_some());
    }
}
