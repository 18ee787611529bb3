//! Produce: validate and append each partition's batches as leader; answer
//! after the local append (acks=1), after the high watermark passes the
//! batch (acks=all, bounded by the request's timeout), or not at all (acks=0).

use std::time::{Duration, Instant};

use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
use kafka_protocol::ResponseError;

use super::partition_error_code;
use crate::node::NodeContext;
use crate::replication::Partition;

/// Longest acks=all wait, whatever the client asks.
const ACKS_ALL_WAIT_MAX: Duration = Duration::from_secs(60);

fn error_response(index: i32, code: i16) -> PartitionProduceResponse {
    PartitionProduceResponse::default().with_index(index).with_error_code(code).with_base_offset(-1)
}

pub async fn handle(ctx: &NodeContext, request: ProduceRequest, version: i16) -> Option<ProduceResponse> {
    let acks = request.acks;
    let acks_all = acks == -1;
    let started = Instant::now();
    let wait = Duration::from_millis(request.timeout_ms.max(0) as u64).min(ACKS_ALL_WAIT_MAX);
    let transactional = request.transactional_id.as_ref().is_some_and(|t| !t.0.is_empty());
    let image = ctx.quorum.image();
    // Append everything first, then wait: the waits overlap in time.
    let mut pending: Vec<(usize, usize, std::sync::Arc<Partition>, i64)> = Vec::new();
    let mut responses = Vec::with_capacity(request.topic_data.len());
    for (t, topic) in request.topic_data.into_iter().enumerate() {
        let name = topic.name.0.to_string();
        let mut partitions = Vec::with_capacity(topic.partition_data.len());
        for (p, data) in topic.partition_data.into_iter().enumerate() {
            let index = data.index;
            if transactional {
                partitions.push(error_response(index, ResponseError::TransactionalIdAuthorizationFailed.code()));
                continue;
            }
            let Some(partition) = ctx.replicas.get(&name, index) else {
                let known = image.topics.get(&name).is_some_and(|t| t.partitions.contains_key(&index));
                let code =
                    if known { ResponseError::NotLeaderOrFollower } else { ResponseError::UnknownTopicOrPartition };
                partitions.push(error_response(index, code.code()));
                continue;
            };
            let Some(records) = data.records else {
                partitions.push(error_response(index, ResponseError::CorruptMessage.code()));
                continue;
            };
            let mut buf = records.to_vec();
            match partition.append_as_leader(&mut buf, acks_all) {
                Ok(r) => {
                    if acks_all {
                        pending.push((t, p, partition.clone(), r.last_offset));
                    }
                    partitions.push(
                        PartitionProduceResponse::default()
                            .with_index(index)
                            .with_base_offset(r.base_offset)
                            .with_log_append_time_ms(-1)
                            .with_log_start_offset(if version >= 5 { r.log_start_offset } else { -1 }),
                    );
                }
                Err(e) => {
                    tracing::debug!(topic = %name, partition = index, error = %e, "produce refused");
                    partitions.push(error_response(index, partition_error_code(&e)));
                }
            }
        }
        responses.push(TopicProduceResponse::default().with_name(topic.name).with_partition_responses(partitions));
    }
    if acks == 0 {
        return None;
    }
    for (t, p, partition, last_offset) in pending {
        let left = wait.saturating_sub(started.elapsed());
        if !partition.wait_for_high_watermark(last_offset, left).await {
            let r = &mut responses[t].partition_responses[p];
            r.error_code = ResponseError::RequestTimedOut.code();
        }
    }
    Some(ProduceResponse::default().with_responses(responses))
}
