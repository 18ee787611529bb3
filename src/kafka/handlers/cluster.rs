//! DescribeCluster and InitProducerId.

use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::{
    BrokerId, DescribeClusterRequest, DescribeClusterResponse, InitProducerIdRequest, InitProducerIdResponse,
    ProducerId,
};
use kafka_protocol::ResponseError;
use strom_raft::BrokerState;

use super::{split_addr, str_bytes};
use crate::kafka::authorized_operations::{authorized_operations, Resource};
use crate::node::NodeContext;

pub fn describe(ctx: &NodeContext, request: DescribeClusterRequest, version: i16) -> DescribeClusterResponse {
    let image = ctx.quorum.image();
    let brokers = image
        .brokers
        .values()
        .map(|b| {
            let (host, port) = split_addr(&b.kafka);
            DescribeClusterBroker::default()
                .with_broker_id(BrokerId(b.broker_id))
                .with_host(host)
                .with_port(port)
                .with_rack(b.rack.clone().map(str_bytes))
                .with_is_fenced(version >= 1 && b.state == BrokerState::Fenced)
        })
        .collect();
    DescribeClusterResponse::default()
        .with_cluster_id(str_bytes(image.cluster_id.clone().unwrap_or_default()))
        .with_controller_id(BrokerId(ctx.quorum.leader().map_or(-1, |l| l as i32)))
        .with_brokers(brokers)
        .with_cluster_authorized_operations(authorized_operations(
            Resource::Cluster,
            request.include_cluster_authorized_operations,
        ))
}

pub async fn init_producer_id(ctx: &NodeContext, request: InitProducerIdRequest) -> InitProducerIdResponse {
    let base = InitProducerIdResponse::default().with_producer_id(ProducerId(-1)).with_producer_epoch(-1);
    if request.transactional_id.as_ref().is_some_and(|t| !t.0.is_empty()) {
        // Transactions are not implemented; idempotence is.
        return base.with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code());
    }
    match ctx.producer_ids.next(ctx).await {
        Ok(id) => base.with_producer_id(ProducerId(id)).with_producer_epoch(0),
        Err(e) => {
            tracing::warn!(error = %e, "no producer id block");
            base.with_error_code(ResponseError::CoordinatorNotAvailable.code())
        }
    }
}
