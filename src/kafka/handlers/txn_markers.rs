//! WriteTxnMarkers (v1): a transaction coordinator asks each partition
//! leader to end a producer's transaction there with a commit or abort
//! marker (a control batch, see [`crate::log::txn`]). Each marker is
//! written as an acks=all write: the partition answers once the high
//! watermark has passed it, as Kafka does. Needs CLUSTER_ACTION on the
//! cluster (the registry checks it).

use std::time::Duration;

use kafka_protocol::messages::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
};
use kafka_protocol::messages::{WriteTxnMarkersRequest, WriteTxnMarkersResponse};
use kafka_protocol::ResponseError;

use super::{missing_partition_code, partition_error_code};
use crate::log::txn::EndTxnMarker;
use crate::node::NodeContext;
use crate::replication::partition::CommitWait;

/// How long a marker waits for the in-sync replicas (Kafka's coordinator
/// uses `request.timeout.ms`, 30 s by default).
const COMMIT_WAIT: Duration = Duration::from_secs(30);

/// Every partition of `request` answered with `code`.
pub fn answer_all(request: &WriteTxnMarkersRequest, code: i16) -> WriteTxnMarkersResponse {
    let markers = request
        .markers
        .iter()
        .map(|m| {
            let topics = m
                .topics
                .iter()
                .map(|t| {
                    let partitions = t
                        .partition_indexes
                        .iter()
                        .map(|&p| {
                            WritableTxnMarkerPartitionResult::default().with_partition_index(p).with_error_code(code)
                        })
                        .collect();
                    WritableTxnMarkerTopicResult::default().with_name(t.name.clone()).with_partitions(partitions)
                })
                .collect();
            WritableTxnMarkerResult::default().with_producer_id(m.producer_id).with_topics(topics)
        })
        .collect();
    WriteTxnMarkersResponse::default().with_markers(markers)
}

pub async fn handle(ctx: &NodeContext, request: WriteTxnMarkersRequest) -> WriteTxnMarkersResponse {
    let mut response = answer_all(&request, 0);
    let image = ctx.quorum.image();
    // (marker, topic, partition) of each answer still waiting for its commit.
    let mut waits = Vec::new();
    for (m, marker) in request.markers.iter().enumerate() {
        let end = EndTxnMarker { commit: marker.transaction_result, coordinator_epoch: marker.coordinator_epoch };
        for (t, topic) in marker.topics.iter().enumerate() {
            let name = topic.name.0.as_str();
            for (p, &index) in topic.partition_indexes.iter().enumerate() {
                let answer = &mut response.markers[m].topics[t].partitions[p];
                let Some(partition) = ctx.replicas.get(name, index) else {
                    answer.error_code = missing_partition_code(&image, name, index);
                    continue;
                };
                match partition.append_marker(marker.producer_id.0, marker.producer_epoch, end) {
                    Ok(written) => waits.push((m, t, p, partition, written.last_offset, written.leader_epoch)),
                    Err(e) => {
                        tracing::debug!(topic = name, partition = index, producer_id = marker.producer_id.0,
                            error = %e, "transaction marker refused");
                        answer.error_code = partition_error_code(&e);
                    }
                }
            }
        }
    }
    drop(image);
    let deadline = tokio::time::Instant::now() + COMMIT_WAIT;
    for (m, t, p, partition, offset, leader_epoch) in waits {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let code = match partition.wait_for_commit(offset, leader_epoch, left).await {
            CommitWait::Committed => {
                let marker = &request.markers[m];
                if partition.topic == crate::group::OFFSETS_TOPIC {
                    ctx.groups.end_txn(partition.index, marker.producer_id.0, marker.transaction_result);
                }
                continue;
            }
            CommitWait::TimedOut => ResponseError::RequestTimedOut,
            CommitWait::NotLeader => ResponseError::NotLeaderOrFollower,
        };
        response.markers[m].topics[t].partitions[p].error_code = code.code();
    }
    response
}
