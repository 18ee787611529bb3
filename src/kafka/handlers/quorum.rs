//! DescribeQuorum (KIP-595/KIP-853), AddRaftVoter and RemoveRaftVoter
//! (KIP-853) and UnregisterBroker (KIP-500): the metadata quorum as the
//! admin API's `/v1/quorum` shows and changes it, and the admin API's
//! unregistration, for Kafka's own tooling.
//!
//! A voter is named by its node id. Strom's nodes have no directory ids, so
//! the one a request carries is not checked; a node is promoted at the
//! `--raft` address it joined with, so the listeners an AddRaftVoter lists
//! are not used either.

use kafka_protocol::messages::describe_quorum_response::{PartitionData, ReplicaState, TopicData};
use kafka_protocol::messages::{
    AddRaftVoterRequest, AddRaftVoterResponse, BrokerId, DescribeQuorumRequest, DescribeQuorumResponse,
    RemoveRaftVoterRequest, RemoveRaftVoterResponse, TopicName, UnregisterBrokerRequest, UnregisterBrokerResponse,
};
use kafka_protocol::protocol::StrBytes;
use serde_json::Value;

use super::{api_error, str_bytes};
use crate::admin::controller_write;
use crate::controller::protocol::ControllerRequest;
use crate::error::{ApiError, ErrorCode};
use crate::node::NodeContext;

/// Kafka's name of the metadata log's topic.
const METADATA_TOPIC: &str = "__cluster_metadata";

fn replicas(members: &Value) -> Vec<ReplicaState> {
    members
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            ReplicaState::default()
                .with_replica_id(BrokerId(m["id"].as_i64().unwrap_or(-1) as i32))
                .with_log_end_offset(m["match_index"].as_i64().unwrap_or(-1))
                .with_last_fetch_timestamp(-1)
                .with_last_caught_up_timestamp(-1)
        })
        .collect()
}

pub async fn describe(ctx: &NodeContext, _request: DescribeQuorumRequest) -> DescribeQuorumResponse {
    let view = crate::admin::quorum_view(ctx).await;
    let partition = PartitionData::default()
        .with_partition_index(0)
        .with_error_message(None)
        .with_leader_id(BrokerId(view["leader_id"].as_i64().unwrap_or(-1) as i32))
        .with_leader_epoch(view["term"].as_i64().unwrap_or(-1) as i32)
        .with_high_watermark(view["commit_index"].as_i64().unwrap_or(-1))
        .with_current_voters(replicas(&view["voters"]))
        .with_observers(replicas(&view["observers"]));
    DescribeQuorumResponse::default().with_error_message(None).with_topics(vec![TopicData::default()
        .with_topic_name(TopicName(str_bytes(METADATA_TOPIC)))
        .with_partitions(vec![partition])])
}

pub async fn unregister(ctx: &NodeContext, request: UnregisterBrokerRequest) -> UnregisterBrokerResponse {
    let mut response = UnregisterBrokerResponse::default().with_error_message(None);
    let write = ControllerRequest::Unregister { broker_id: request.broker_id.0 };
    if let Err(e) = controller_write(ctx, write).await {
        (response.error_code, response.error_message) = api_error(&e);
    }
    response
}

/// A request naming another cluster is refused, as Kafka refuses it.
fn check_cluster_id(ctx: &NodeContext, cluster_id: Option<&StrBytes>) -> Result<(), ApiError> {
    let ours = ctx.quorum.image().cluster_id.clone();
    match cluster_id {
        Some(theirs) if ours.as_deref() != Some(theirs.as_str()) => Err(ApiError::new(
            ErrorCode::InconsistentClusterId,
            format!("the request names cluster {theirs}; this is cluster {}", ours.unwrap_or_default()),
        )),
        _ => Ok(()),
    }
}

/// Promotes a caught-up observer to voter (the admin API's `POST /v1/quorum/voters`).
pub async fn add_voter(ctx: &NodeContext, request: AddRaftVoterRequest) -> AddRaftVoterResponse {
    let mut response = AddRaftVoterResponse::default().with_error_message(None);
    let result = match (check_cluster_id(ctx, request.cluster_id.as_ref()), u64::try_from(request.voter_id)) {
        (Err(e), _) => Err(e),
        (Ok(()), Err(_)) => Err(ApiError::new(ErrorCode::InvalidRequest, "a voter id is not negative")),
        (Ok(()), Ok(node_id)) => controller_write(ctx, ControllerRequest::AddVoter { node_id }).await,
    };
    if let Err(e) = result {
        (response.error_code, response.error_message) = api_error(&e);
    }
    response
}

/// Turns a voter into an observer (the admin API's `DELETE /v1/quorum/voters/{id}`).
pub async fn remove_voter(ctx: &NodeContext, request: RemoveRaftVoterRequest) -> RemoveRaftVoterResponse {
    let mut response = RemoveRaftVoterResponse::default().with_error_message(None);
    let result = match (check_cluster_id(ctx, request.cluster_id.as_ref()), u64::try_from(request.voter_id)) {
        (Err(e), _) => Err(e),
        (Ok(()), Err(_)) => Err(ApiError::new(ErrorCode::VoterNotFound, "a voter id is not negative")),
        (Ok(()), Ok(node_id)) => controller_write(ctx, ControllerRequest::RemoveVoter { node_id }).await,
    };
    if let Err(e) = result {
        (response.error_code, response.error_message) = api_error(&e);
    }
    response
}
