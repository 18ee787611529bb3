//! DescribeProducers (KIP-664, `kafka-transactions describe-producers`,
//! `find-hanging`): the idempotent and transactional producers a replica of
//! a partition remembers, with each one's epoch, its last batch's sequence
//! and timestamp, the coordinator epoch of its last marker and the first
//! offset of its open transaction (-1: none).

use kafka_protocol::messages::describe_producers_response::{PartitionResponse, ProducerState, TopicResponse};
use kafka_protocol::messages::{DescribeProducersRequest, DescribeProducersResponse, ProducerId};
use kafka_protocol::ResponseError;

use super::missing_partition_code;
use crate::kafka::registry::Client;
use crate::node::NodeContext;
use crate::security::acl::{Operation, ResourceType};

/// Answered by any broker holding a replica of the partition (a follower
/// from what it replicated, as in Kafka); elsewhere NOT_LEADER_OR_FOLLOWER.
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
                    base.with_active_producers(
                        partition
                            .active_producers()
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
                    )
                })
                .collect();
            TopicResponse::default().with_name(topic.name).with_partitions(partitions)
        })
        .collect();
    DescribeProducersResponse::default().with_topics(topics)
}
