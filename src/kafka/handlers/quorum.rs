//! DescribeQuorum (KIP-595/KIP-853) and UnregisterBroker (KIP-500): the
//! metadata quorum as the admin API's `/v1/quorum` shows it, and the admin
//! API's unregistration, for Kafka's own tooling.

use kafka_protocol::messages::describe_quorum_response::{PartitionData, ReplicaState, TopicData};
use kafka_protocol::messages::{
    BrokerId, DescribeQuorumRequest, DescribeQuorumResponse, TopicName, UnregisterBrokerRequest,
    UnregisterBrokerResponse,
};
use serde_json::Value;

use super::{api_error, str_bytes};
use crate::admin::controller_write;
use crate::controller::protocol::ControllerRequest;
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
