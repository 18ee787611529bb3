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
use crate::kafka::registry::Client;
use crate::node::NodeContext;
use crate::security::acl::Operation;

pub fn describe(
    ctx: &NodeContext,
    request: DescribeClusterRequest,
    version: i16,
    client: &Client,
) -> DescribeClusterResponse {
    let image = ctx.quorum.image();
    let brokers = image
        .brokers
        .values()
        .filter_map(|b| {
            let (host, port) = split_addr(b.advertised(&client.listener)?);
            Some(
                DescribeClusterBroker::default()
                    .with_broker_id(BrokerId(b.broker_id))
                    .with_host(host)
                    .with_port(port)
                    .with_rack(b.rack.clone().map(str_bytes))
                    .with_is_fenced(version >= 1 && b.state == BrokerState::Fenced),
            )
        })
        .collect();
    DescribeClusterResponse::default()
        .with_cluster_id(str_bytes(image.cluster_id.clone().unwrap_or_default()))
        .with_controller_id(BrokerId(ctx.quorum.leader().map_or(-1, |l| l as i32)))
        .with_brokers(brokers)
        .with_cluster_authorized_operations(authorized_operations(
            Resource::Cluster,
            request.include_cluster_authorized_operations,
            |op| ctx.authorize_cluster(client, &image, op),
        ))
}

pub async fn init_producer_id(
    ctx: &NodeContext,
    request: InitProducerIdRequest,
    version: i16,
    client: &Client,
) -> InitProducerIdResponse {
    let base = InitProducerIdResponse::default().with_producer_id(ProducerId(-1)).with_producer_epoch(-1);
    if let Some(id) = request.transactional_id.as_ref().filter(|t| !t.0.is_empty()) {
        return match super::txn::init_producer_id(ctx, &request, version, id.0.as_str(), client).await {
            Ok((producer_id, epoch)) => base.with_producer_id(ProducerId(producer_id)).with_producer_epoch(epoch),
            Err(e) => base.with_error_code(e.code()),
        };
    }
    // Kafka's rule: IDEMPOTENT_WRITE on the cluster, or WRITE on some topic.
    let image = ctx.quorum.image();
    if !ctx.authorize_cluster(client, &image, Operation::IdempotentWrite)
        && !ctx.authorizer.may_write_some_topic(&image, &client.principal, client.host)
    {
        return base.with_error_code(ResponseError::ClusterAuthorizationFailed.code());
    }
    drop(image);
    match ctx.producer_ids.next(ctx).await {
        Ok(id) => base.with_producer_id(ProducerId(id)).with_producer_epoch(0),
        Err(e) => {
            tracing::warn!(error = %e, "no producer id block");
            base.with_error_code(ResponseError::CoordinatorNotAvailable.code())
        }
    }
}
