//! DescribeProducers (KIP-664, `kafka-transactions describe-producers`): the
//! idempotent producers a partition leader remembers, with each one's epoch
//! and its last batch's sequence and timestamp. Strom has no transactions
//! yet, so no producer has a coordinator epoch or an open transaction (-1).

use kafka_protocol::messages::describe_producers_response::{PartitionResponse, ProducerState, TopicResponse};
use kafka_protocol::messages::{DescribeProducersRequest, DescribeProducersResponse, ProducerId};
use kafka_protocol::ResponseError;

use super::{missing_partition_code, partition_error_code};
use crate::kafka::registry::Client;
use crate::node::NodeContext;
use crate::security::acl::{Operation, ResourceType};

/// Answered by the partition's leader; elsewhere NOT_LEADER_OR_FOLLOWER.
/// Needs READ on the topic, as in Kafka.
pub fn handle(ctx: &NodeContext, request: DescribeProducersRequest, client: &Client) -> DescribeProducersResponse {
    let image = ctx.quorum.image();
    let topics = request
        .topics
        .into_iter()
        .map(|topic| {
            let name = topic.name.0.to_string();
            let allowed = ctx.authorize(client, &image, Operation::Read, ResourceType::Topic, &name);
            let partitions = topic
                .partition_indexes
                .iter()
                .map(|&index| {
                    let base = PartitionResponse::default().with_partition_index(index);
                    if !allowed {
                        return base.with_error_code(ResponseError::TopicAuthorizationFailed.code());
                    }
                    let Some(partition) = ctx.replicas.get(&name, index) else {
                        return base.with_error_code(missing_partition_code(&image, &name, index));
                    };
                    match partition.active_producers() {
                        Ok(producers) => base.with_active_producers(
                            producers
                                .into_iter()
                                .map(|p| {
                                    ProducerState::default()
                                        .with_producer_id(ProducerId(p.producer_id))
                                        .with_producer_epoch(i32::from(p.epoch))
                                        .with_last_sequence(p.last_sequence)
                                        .with_last_timestamp(p.last_timestamp)
                                        .with_coordinator_epoch(p.coordinator_epoch)
                                        .with_current_txn_start_offset(p.current_txn_start_offset)
                                })
                                .collect(),
                        ),
                        Err(e) => base.with_error_code(partition_error_code(&e)),
                    }
                })
                .collect();
            TopicResponse::default().with_name(topic.name).with_partitions(partitions)
        })
        .collect();
    DescribeProducersResponse::default().with_topics(topics)
}
