//! Produce: validate and append each partition's batches as leader; answer
//! after the local append (acks=1), after the high watermark passes the
//! batch (acks=all, bounded by the request's timeout), or not at all (acks=0).

use std::time::{Duration, Instant};

use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::{missing_partition_code, partition_error_code};
use crate::kafka::registry::Client;
use crate::node::NodeContext;
use crate::security::acl::{Operation, ResourceType};
use std::sync::Arc;

use crate::log::{BatchHeader, LogError};
use crate::replication::partition::{CommitWait, DurableWait};
use crate::replication::producer_state::Refusal;
use crate::replication::{Partition, PartitionError};

/// First Produce version with `record_errors` and `error_message` (KIP-467).
const RECORD_ERRORS_VERSION: i16 = 8;

/// Longest acks=all wait, whatever the client asks.
const ACKS_ALL_WAIT_MAX: Duration = Duration::from_secs(60);

fn error_response(index: i32, code: i16) -> PartitionProduceResponse {
    PartitionProduceResponse::default().with_index(index).with_error_code(code).with_base_offset(-1)
}

/// The answer for a partition whose append was refused. From v8 on, records
/// the topic's checks refused are named one by one (KIP-467's
/// `record_errors`) and the reason is given in `error_message`.
fn refused(index: i32, e: &PartitionError, version: i16) -> PartitionProduceResponse {
    let response = error_response(index, partition_error_code(e));
    match e {
        PartitionError::Log(LogError::InvalidRecords(invalid)) if version >= RECORD_ERRORS_VERSION => {
            response.with_error_message(Some(StrBytes::from_string(invalid.message.clone()))).with_record_errors(
                invalid
                    .record_errors
                    .iter()
                    .map(|r| {
                        BatchIndexAndErrorMessage::default()
                            .with_batch_index(r.batch_index)
                            .with_batch_index_error_message(Some(StrBytes::from_string(r.message.clone())))
                    })
                    .collect(),
            )
        }
        _ => response,
    }
}

/// A produce request after its appends, waiting to be answered.
pub struct ProduceInFlight {
    acks: i16,
    started: Instant,
    wait: Duration,
    /// (topic index, partition index, partition, last offset, leader epoch) for acks=all.
    pending: Vec<(usize, usize, Arc<Partition>, i64, i32)>,
    /// (topic index, partition index, partition, durable end, leader epoch)
    /// for appends that wait for their fsync (`flush.messages` reached).
    durable: Vec<(usize, usize, Arc<Partition>, i64, i32)>,
    responses: Vec<TopicProduceResponse>,
}

/// Validates and appends every partition's batches. Called in request order
/// on the connection's reader, so pipelined produce requests are appended in
/// the order they were sent; only the acks=all wait runs concurrently.
/// `unverified` partitions (a transaction's first batches there, which its
/// coordinator did not confirm: `txn::verify_produce`) get their error code.
pub fn append(
    ctx: &NodeContext,
    request: ProduceRequest,
    version: i16,
    client: &Client,
    unverified: &std::collections::HashMap<(String, i32), i16>,
) -> ProduceInFlight {
    let acks = request.acks;
    let acks_all = acks == -1;
    // `unsafe.ack.before.commit` (a negative control for the fault harness,
    // never for use) answers acks=all without waiting for the high watermark.
    let wait_commit = acks_all && !ctx.settings.bool("unsafe.ack.before.commit");
    let started = Instant::now();
    let wait = Duration::from_millis(request.timeout_ms.max(0) as u64).min(ACKS_ALL_WAIT_MAX);
    let image = ctx.quorum.image();
    // Transactional batches come with the producer's transactional id in
    // the request, on which it needs WRITE (Kafka's check).
    let transactional_allowed = request.transactional_id.as_ref().filter(|t| !t.0.is_empty()).is_some_and(|id| {
        ctx.authorize(client, &image, Operation::Write, ResourceType::TransactionalId, id.0.as_str())
    });
    // Cut off from the controller: fenced, most likely, with its partitions led
    // elsewhere; nothing appended here could commit.
    let out_of_touch = ctx.lifecycle.out_of_touch();
    // Below `storage.min.free.bytes`: the logs do not grow (reads go on).
    let disk_full = !ctx.replicas.disk.has_room();
    let mut pending = Vec::new();
    let mut durable = Vec::new();
    let mut responses = Vec::with_capacity(request.topic_data.len());
    for (t, topic) in request.topic_data.into_iter().enumerate() {
        let name = topic.name.0.to_string();
        let writable = ctx.authorize(client, &image, Operation::Write, ResourceType::Topic, &name);
        let mut partitions = Vec::with_capacity(topic.partition_data.len());
        for (p, data) in topic.partition_data.into_iter().enumerate() {
            let index = data.index;
            if !writable {
                partitions.push(error_response(index, ResponseError::TopicAuthorizationFailed.code()));
                continue;
            }
            let transactional =
                data.records.as_deref().is_some_and(|r| BatchHeader::parse(r).is_ok_and(|h| h.is_transactional()));
            if transactional && !transactional_allowed {
                partitions.push(error_response(index, ResponseError::TransactionalIdAuthorizationFailed.code()));
                continue;
            }
            if out_of_touch || disk_full {
                // Remembered by the partition: a later batch that leaves a gap
                // where this one belongs gets the same answer.
                let why = if out_of_touch { Refusal::NotLeader } else { Refusal::Storage };
                if let (Some(partition), Some(records)) = (ctx.replicas.get(&name, index), data.records.as_ref()) {
                    partition.note_refused(records, why);
                }
            }
            if out_of_touch {
                partitions.push(error_response(index, ResponseError::NotLeaderOrFollower.code()));
                continue;
            }
            if disk_full {
                let message = "the broker's data directory is below storage.min.free.bytes of free space";
                partitions.push(
                    error_response(index, ResponseError::KafkaStorageError.code())
                        .with_error_message(Some(StrBytes::from_static_str(message))),
                );
                continue;
            }
            let Some(partition) = ctx.replicas.get(&name, index) else {
                partitions.push(error_response(index, missing_partition_code(&image, &name, index)));
                continue;
            };
            let unverified = if unverified.is_empty() { None } else { unverified.get(&(name.clone(), index)) };
            if let Some(&code) = unverified {
                partitions.push(error_response(index, code));
                continue;
            }
            let Some(records) = data.records else {
                partitions.push(error_response(index, ResponseError::CorruptMessage.code()));
                continue;
            };
            let appended = crate::replication::partition::refuse_client_control_batches(&records)
                .and_then(|()| partition.append_as_leader(&records, acks_all));
            match appended {
                Ok(r) => {
                    if let Some(end) = r.durable_end {
                        durable.push((t, p, partition.clone(), end, r.leader_epoch));
                    }
                    if wait_commit {
                        pending.push((t, p, partition.clone(), r.last_offset, r.leader_epoch));
                    }
                    partitions.push(
                        PartitionProduceResponse::default()
                            .with_index(index)
                            .with_base_offset(r.base_offset)
                            .with_log_append_time_ms(r.log_append_time_ms)
                            .with_log_start_offset(if version >= 5 { r.log_start_offset } else { -1 }),
                    );
                }
                Err(e) => {
                    tracing::debug!(topic = %name, partition = index, error = %e, "produce refused");
                    partitions.push(refused(index, &e, version));
                }
            }
        }
        responses.push(TopicProduceResponse::default().with_name(topic.name).with_partition_responses(partitions));
    }
    ProduceInFlight { acks, started, wait, pending, durable, responses }
}

impl ProduceInFlight {
    /// Waits (acks=all) until the high watermark passes each batch, or the
    /// request's timeout; `None` for acks=0.
    pub async fn finish(mut self) -> Option<ProduceResponse> {
        if self.acks == 0 {
            return None;
        }
        for (t, p, partition, end, leader_epoch) in std::mem::take(&mut self.durable) {
            let left = self.wait.saturating_sub(self.started.elapsed());
            let code = match partition.wait_durable(end, leader_epoch, left).await {
                DurableWait::Durable => continue,
                DurableWait::TimedOut => ResponseError::RequestTimedOut,
                DurableWait::NotLeader => ResponseError::NotLeaderOrFollower,
                DurableWait::Failed => ResponseError::KafkaStorageError,
            };
            self.responses[t].partition_responses[p].error_code = code.code();
        }
        for (t, p, partition, last_offset, leader_epoch) in std::mem::take(&mut self.pending) {
            if self.responses[t].partition_responses[p].error_code != 0 {
                continue;
            }
            let left = self.wait.saturating_sub(self.started.elapsed());
            let code = match partition.wait_for_commit(last_offset, leader_epoch, left).await {
                CommitWait::Committed => continue,
                CommitWait::TimedOut => ResponseError::RequestTimedOut,
                CommitWait::NotLeader => ResponseError::NotLeaderOrFollower,
            };
            self.responses[t].partition_responses[p].error_code = code.code();
        }
        Some(ProduceResponse::default().with_responses(self.responses))
    }
}
