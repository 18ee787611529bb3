//! Metadata: brokers, controller, and topics with leaders and replicas, from
//! this node's applied image; topics are created on first use when
//! `auto.create.topics.enable` allows it.

use std::collections::BTreeMap;

use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::ResponseError;
use strom_raft::{BrokerState, MetadataImage};

use super::{split_addr, str_bytes, topic_uuid};
use crate::controller::protocol::ControllerRequest;
use crate::controller::topics::validate_topic_name;
use crate::error::ErrorCode;
use crate::kafka::authorized_operations::{authorized_operations, Resource};
use crate::kafka::registry::Client;
use crate::node::NodeContext;
use crate::security::acl::{Operation, ResourceType};

/// Creates missing topics with the broker defaults (Kafka's auto-create).
pub async fn auto_create(ctx: &NodeContext, names: &[String]) {
    let image = ctx.quorum.image();
    for name in names.iter().filter(|n| !image.topics.contains_key(*n) && validate_topic_name(n).is_ok()) {
        let request = ControllerRequest::CreateTopic {
            name: name.clone(),
            partitions: ctx.settings.int("num.partitions").unwrap_or(1),
            replication_factor: ctx.settings.int("default.replication.factor").unwrap_or(1),
            configs: BTreeMap::new(),
        };
        match crate::admin::controller_write(ctx, request).await {
            Ok(()) => tracing::info!(topic = %name, "topic auto-created"),
            Err(e) if e.code == ErrorCode::TopicAlreadyExists => {}
            Err(e) => tracing::warn!(topic = %name, error = %e, "auto-create failed"),
        }
    }
}

fn topic_entry(image: &MetadataImage, name: &str, version: i16, operations: i32) -> MetadataResponseTopic {
    let mut t = MetadataResponseTopic::default();
    t.name = Some(TopicName(str_bytes(name)));
    let Some(topic) = image.topics.get(name) else {
        t.error_code = if validate_topic_name(name).is_ok() {
            ResponseError::UnknownTopicOrPartition.code()
        } else {
            ResponseError::InvalidTopicException.code()
        };
        return t;
    };
    if version >= 10 {
        t.topic_id = topic_uuid(topic.topic_id);
    }
    t.is_internal = version >= 1 && name.starts_with("__");
    t.topic_authorized_operations = operations;
    t.partitions = topic
        .partitions
        .iter()
        .map(|(&index, p)| {
            let mut mp = MetadataResponsePartition::default();
            mp.partition_index = index;
            let leader = p.leader.filter(|l| image.is_active(*l));
            mp.leader_id = BrokerId(leader.unwrap_or(-1));
            if leader.is_none() {
                mp.error_code = ResponseError::LeaderNotAvailable.code();
            }
            mp.leader_epoch = if version >= 7 { p.leader_epoch } else { -1 };
            mp.replica_nodes = p.replicas.iter().map(|b| BrokerId(*b)).collect();
            mp.isr_nodes = p.isr.iter().map(|b| BrokerId(*b)).collect();
            mp.offline_replicas = p
                .replicas
                .iter()
                .filter(|_| version >= 5)
                .filter(|b| !image.is_active(**b))
                .map(|b| BrokerId(*b))
                .collect();
            mp
        })
        .collect();
    t
}

pub async fn handle(ctx: &NodeContext, request: MetadataRequest, version: i16, client: &Client) -> MetadataResponse {
    // Topics named, or (v10+) given by id alone; unknown ids are answered
    // apart, with UNKNOWN_TOPIC_ID.
    let mut unknown_ids = Vec::new();
    let requested: Option<Vec<String>> = match request.topics {
        Some(topics) if !(version == 0 && topics.is_empty()) => {
            let image = ctx.quorum.image();
            let mut names = Vec::with_capacity(topics.len());
            for t in topics {
                match t.name {
                    Some(name) => names.push(name.0.to_string()),
                    None => match image.topics.values().find(|x| topic_uuid(x.topic_id) == t.topic_id) {
                        Some(topic) => names.push(topic.name.clone()),
                        None => unknown_ids.push(t.topic_id),
                    },
                }
            }
            Some(names)
        }
        _ => None,
    };
    let allow_auto = version < 4 || request.allow_auto_topic_creation;
    if let Some(names) = &requested {
        if allow_auto && ctx.settings.bool("auto.create.topics.enable") {
            // Kafka's rule: auto-creation needs CREATE on the cluster or the topic.
            let image = ctx.quorum.image();
            let creatable: Vec<String> = names
                .iter()
                .filter(|n| {
                    ctx.authorize_cluster(client, &image, Operation::Create)
                        || ctx.authorize(client, &image, Operation::Create, ResourceType::Topic, n)
                })
                .cloned()
                .collect();
            drop(image);
            auto_create(ctx, &creatable).await;
        }
    }
    let image = ctx.quorum.image();
    let describable = |name: &str| ctx.authorize(client, &image, Operation::Describe, ResourceType::Topic, name);
    let mut response = MetadataResponse::default();
    response.brokers = image
        .brokers
        .values()
        .filter(|b| b.state != BrokerState::Fenced)
        .filter_map(|b| {
            // A broker without the client's listener is not shown (as in Kafka).
            let (host, port) = split_addr(b.advertised(&client.listener)?);
            Some(
                MetadataResponseBroker::default()
                    .with_node_id(BrokerId(b.broker_id))
                    .with_host(host)
                    .with_port(port)
                    .with_rack(if version >= 1 { b.rack.clone().map(str_bytes) } else { None }),
            )
        })
        .collect();
    if version >= 2 {
        response.cluster_id = image.cluster_id.clone().map(str_bytes);
    }
    if version >= 1 {
        response.controller_id = BrokerId(ctx.quorum.leader().map_or(-1, |l| l as i32));
    }
    // Asked for all topics: those the client may describe. Asked by name: the
    // others answer TOPIC_AUTHORIZATION_FAILED.
    let names: Vec<String> =
        requested.unwrap_or_else(|| image.topics.keys().filter(|n| describable(n)).cloned().collect());
    // KIP-430: v8+ may ask for the operations allowed on each topic, and
    // v8-v10 on the cluster (v11 moved that to DescribeCluster).
    let topic_operations = |name: &str| {
        authorized_operations(Resource::Topic, version >= 8 && request.include_topic_authorized_operations, |op| {
            ctx.authorize(client, &image, op, ResourceType::Topic, name)
        })
    };
    response.cluster_authorized_operations = authorized_operations(
        Resource::Cluster,
        (8..=10).contains(&version) && request.include_cluster_authorized_operations,
        |op| ctx.authorize_cluster(client, &image, op),
    );
    response.topics = names
        .iter()
        .map(|n| match describable(n) {
            true => topic_entry(&image, n, version, topic_operations(n)),
            false => MetadataResponseTopic::default()
                .with_name(Some(TopicName(str_bytes(n))))
                .with_error_code(ResponseError::TopicAuthorizationFailed.code()),
        })
        .collect();
    response.topics.extend(unknown_ids.into_iter().map(|id| {
        MetadataResponseTopic::default()
            .with_name(None)
            .with_topic_id(id)
            .with_error_code(ResponseError::UnknownTopicId.code())
    }));
    response
}
