//! ListOffsets (earliest, latest, by timestamp) and OffsetsForLeaderEpoch,
//! answered by partition leaders. With isolation level 1 (`read_committed`,
//! v2+) latest is the last stable offset and lookups stay below it.

use kafka_protocol::messages::list_offsets_response::{ListOffsetsPartitionResponse, ListOffsetsTopicResponse};
use kafka_protocol::messages::offset_for_leader_epoch_response::{EpochEndOffset, OffsetForLeaderTopicResult};
use kafka_protocol::messages::{
    ListOffsetsRequest, ListOffsetsResponse, OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse,
};

use kafka_protocol::ResponseError;

use super::{missing_partition_code, partition_error_code};
use crate::kafka::registry::Client;
use crate::node::NodeContext;
use crate::security::acl::{Operation, ResourceType};

pub fn handle(ctx: &NodeContext, request: ListOffsetsRequest, version: i16, client: &Client) -> ListOffsetsResponse {
    let image = ctx.quorum.image();
    let read_committed = request.isolation_level == 1;
    let topics = request
        .topics
        .into_iter()
        .map(|topic| {
            let name = topic.name.0.to_string();
            let describable = ctx.authorize(client, &image, Operation::Describe, ResourceType::Topic, &name);
            let partitions = topic
                .partitions
                .iter()
                .map(|p| {
                    let base = ListOffsetsPartitionResponse::default()
                        .with_partition_index(p.partition_index)
                        .with_timestamp(-1)
                        .with_offset(-1)
                        .with_leader_epoch(-1);
                    if !describable {
                        return base.with_error_code(ResponseError::TopicAuthorizationFailed.code());
                    }
                    let Some(partition) = ctx.replicas.get(&name, p.partition_index) else {
                        return base.with_error_code(missing_partition_code(
                            &ctx.quorum.image(),
                            &name,
                            p.partition_index,
                        ));
                    };
                    match partition.offset_for(p.timestamp, p.current_leader_epoch, read_committed) {
                        Ok((timestamp, offset)) => {
                            let epoch = if version >= 4 { partition.leader_epoch() } else { -1 };
                            base.with_timestamp(timestamp).with_offset(offset).with_leader_epoch(epoch)
                        }
                        Err(e) => base.with_error_code(partition_error_code(&e)),
                    }
                })
                .collect();
            ListOffsetsTopicResponse::default().with_name(topic.name).with_partitions(partitions)
        })
        .collect();
    ListOffsetsResponse::default().with_topics(topics)
}

pub fn leader_epoch(
    ctx: &NodeContext,
    request: OffsetForLeaderEpochRequest,
    client: &Client,
) -> OffsetForLeaderEpochResponse {
    let image = ctx.quorum.image();
    // A follower needs CLUSTER_ACTION; a consumer (replica id -1) DESCRIBE on the topic.
    let follower = request.replica_id.0 >= 0;
    let cluster_action = follower && ctx.authorize_cluster(client, &image, Operation::ClusterAction);
    let topics = request
        .topics
        .into_iter()
        .map(|topic| {
            let name = topic.topic.0.to_string();
            let allowed = match follower {
                true => cluster_action,
                false => ctx.authorize(client, &image, Operation::Describe, ResourceType::Topic, &name),
            };
            let partitions = topic
                .partitions
                .iter()
                .map(|p| {
                    let base =
                        EpochEndOffset::default().with_partition(p.partition).with_leader_epoch(-1).with_end_offset(-1);
                    if !allowed {
                        let code = match follower {
                            true => ResponseError::ClusterAuthorizationFailed.code(),
                            false => ResponseError::TopicAuthorizationFailed.code(),
                        };
                        return base.with_error_code(code);
                    }
                    let Some(partition) = ctx.replicas.get(&name, p.partition) else {
                        return base.with_error_code(missing_partition_code(&ctx.quorum.image(), &name, p.partition));
                    };
                    match partition.end_offset_for_epoch(p.leader_epoch, p.current_leader_epoch) {
                        Ok((epoch, end)) => base.with_leader_epoch(epoch).with_end_offset(end),
                        Err(e) => base.with_error_code(partition_error_code(&e)),
                    }
                })
                .collect();
            OffsetForLeaderTopicResult::default().with_topic(topic.topic).with_partitions(partitions)
        })
        .collect();
    OffsetForLeaderEpochResponse::default().with_topics(topics)
}
