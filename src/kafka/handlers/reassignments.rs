//! AlterPartitionReassignments and ListPartitionReassignments (KIP-455):
//! forwarded to the controller like the admin API's reassignment endpoints,
//! so Kafka's own tooling (`kafka-reassign-partitions`) works.

use kafka_protocol::messages::alter_partition_reassignments_response::{
    ReassignablePartitionResponse, ReassignableTopicResponse,
};
use kafka_protocol::messages::list_partition_reassignments_response::{
    OngoingPartitionReassignment, OngoingTopicReassignment,
};
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, BrokerId,
    ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse,
};

use super::api_error;
use crate::admin::controller_write;
use crate::controller::protocol::ControllerRequest;
use crate::error::{ApiError, ErrorCode};
use crate::node::NodeContext;

fn ids(brokers: &[i32]) -> Vec<BrokerId> {
    brokers.iter().map(|b| BrokerId(*b)).collect()
}

/// KIP-860 (v1): with `allow_replication_factor_change` false, a target of
/// another size than the original replicas is refused.
fn check_replication_factor(ctx: &NodeContext, topic: &str, partition: i32, target: &[i32]) -> Result<(), ApiError> {
    let image = ctx.quorum.image();
    let Some(p) = image.topics.get(topic).and_then(|t| t.partitions.get(&partition)) else { return Ok(()) };
    let original = p.original_replicas().len();
    if original == target.len() {
        return Ok(());
    }
    Err(ApiError::new(
        ErrorCode::InvalidReplicationFactor,
        format!(
            "the target has {} replicas, the partition {original}; replication factor changes are not allowed",
            target.len()
        ),
    ))
}

pub async fn alter(
    ctx: &NodeContext,
    request: AlterPartitionReassignmentsRequest,
    version: i16,
) -> AlterPartitionReassignmentsResponse {
    let allow_rf_change = version < 1 || request.allow_replication_factor_change;
    let mut responses = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        let name = topic.name.0.to_string();
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for p in topic.partitions {
            let target: Option<Vec<i32>> = p.replicas.map(|r| r.iter().map(|b| b.0).collect());
            let checked = match &target {
                Some(t) if !allow_rf_change => check_replication_factor(ctx, &name, p.partition_index, t),
                _ => Ok(()),
            };
            let outcome = match checked {
                Ok(()) => {
                    let request =
                        ControllerRequest::Reassign { topic: name.clone(), partition: p.partition_index, target };
                    controller_write(ctx, request).await
                }
                Err(e) => Err(e),
            };
            let mut response = ReassignablePartitionResponse::default()
                .with_partition_index(p.partition_index)
                .with_error_message(None);
            if let Err(e) = outcome {
                (response.error_code, response.error_message) = api_error(&e);
            }
            partitions.push(response);
        }
        responses.push(ReassignableTopicResponse::default().with_name(topic.name).with_partitions(partitions));
    }
    AlterPartitionReassignmentsResponse::default()
        .with_error_message(None)
        .with_allow_replication_factor_change(allow_rf_change)
        .with_responses(responses)
}

pub fn list(ctx: &NodeContext, request: ListPartitionReassignmentsRequest) -> ListPartitionReassignmentsResponse {
    let image = ctx.quorum.image();
    // Every topic, or those asked for; only partitions being reassigned are listed.
    let asked: Vec<(String, Option<Vec<i32>>)> = match request.topics {
        Some(topics) => topics.into_iter().map(|t| (t.name.0.to_string(), Some(t.partition_indexes))).collect(),
        None => image.topics.keys().map(|n| (n.clone(), None)).collect(),
    };
    let mut topics = Vec::new();
    for (name, indexes) in asked {
        let Some(t) = image.topics.get(&name) else { continue };
        let partitions: Vec<OngoingPartitionReassignment> = t
            .partitions
            .iter()
            .filter(|(i, p)| p.is_reassigning() && indexes.as_ref().is_none_or(|x| x.contains(i)))
            .map(|(i, p)| {
                OngoingPartitionReassignment::default()
                    .with_partition_index(*i)
                    .with_replicas(ids(&p.replicas))
                    .with_adding_replicas(ids(&p.adding_replicas))
                    .with_removing_replicas(ids(&p.removing_replicas))
            })
            .collect();
        if !partitions.is_empty() {
            topics.push(
                OngoingTopicReassignment::default()
                    .with_name(kafka_protocol::messages::TopicName(super::str_bytes(name)))
                    .with_partitions(partitions),
            );
        }
    }
    ListPartitionReassignmentsResponse::default().with_error_message(None).with_topics(topics)
}
