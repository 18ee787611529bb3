//! ElectLeaders (KIP-183, KIP-460): preferred and unclean leader elections,
//! forwarded to the controller like the admin API's
//! `POST /v1/topics/{name}/partitions/{p}/elect`, so `kafka-leader-election`
//! works.

use kafka_protocol::messages::elect_leaders_response::{PartitionResult, ReplicaElectionResult};
use kafka_protocol::messages::{ElectLeadersRequest, ElectLeadersResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::api_error;
use crate::admin::controller_write;
use crate::controller::protocol::{ControllerRequest, ElectionType};
use crate::error::ErrorCode;
use crate::node::NodeContext;

/// Kafka's election types: 0 preferred, 1 unclean.
fn election_type(code: i8) -> Option<ElectionType> {
    match code {
        0 => Some(ElectionType::Preferred),
        1 => Some(ElectionType::Unclean),
        _ => None,
    }
}

/// The partitions an election of every partition (a null list) attempts:
/// those not led by their preferred replica, or without a leader.
fn every_partition(ctx: &NodeContext, election: ElectionType) -> Vec<(String, Vec<i32>)> {
    let image = ctx.quorum.image();
    image
        .topics
        .values()
        .map(|t| {
            let partitions = t
                .partitions
                .iter()
                .filter(|(_, p)| match election {
                    ElectionType::Preferred => p.leader != p.replicas.first().copied(),
                    ElectionType::Unclean => p.leader.is_none(),
                })
                .map(|(&i, _)| i)
                .collect::<Vec<_>>();
            (t.name.clone(), partitions)
        })
        .filter(|(_, ps)| !ps.is_empty())
        .collect()
}

pub async fn handle(ctx: &NodeContext, request: ElectLeadersRequest, version: i16) -> ElectLeadersResponse {
    let mut response = ElectLeadersResponse::default();
    // v0 has no election type: it is a preferred election.
    let code = if version >= 1 { request.election_type } else { 0 };
    let Some(election) = election_type(code) else {
        // Kafka answers an unknown type with INVALID_REQUEST for every partition.
        let message = format!("election type {code} is neither 0 (preferred) nor 1 (unclean)");
        response.error_code = ResponseError::InvalidRequest.code();
        response.replica_election_results = request
            .topic_partitions
            .unwrap_or_default()
            .into_iter()
            .map(|t| {
                ReplicaElectionResult::default().with_topic(t.topic).with_partition_result(
                    t.partitions
                        .into_iter()
                        .map(|p| {
                            PartitionResult::default()
                                .with_partition_id(p)
                                .with_error_code(ResponseError::InvalidRequest.code())
                                .with_error_message(Some(StrBytes::from_string(message.clone())))
                        })
                        .collect(),
                )
            })
            .collect();
        return response;
    };
    // A null list: every partition that needs it; those that do not are left
    // out of the answer (KIP-460).
    let (wanted, every) = match request.topic_partitions {
        Some(list) => (list.into_iter().map(|t| (t.topic.0.to_string(), t.partitions)).collect::<Vec<_>>(), false),
        None => (every_partition(ctx, election), true),
    };
    for (topic, partitions) in wanted {
        let mut results = Vec::with_capacity(partitions.len());
        for partition in partitions {
            let outcome =
                controller_write(ctx, ControllerRequest::ElectLeader { topic: topic.clone(), partition, election })
                    .await;
            let mut result = PartitionResult::default().with_partition_id(partition).with_error_message(None);
            if let Err(e) = outcome {
                if every && e.code == ErrorCode::ElectionNotNeeded {
                    continue;
                }
                (result.error_code, result.error_message) = api_error(&e);
            }
            results.push(result);
        }
        if !results.is_empty() {
            response.replica_election_results.push(
                ReplicaElectionResult::default()
                    .with_topic(TopicName(StrBytes::from_string(topic)))
                    .with_partition_result(results),
            );
        }
    }
    response
}
