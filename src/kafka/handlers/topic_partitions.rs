//! DescribeTopicPartitions (KIP-966): topics and their partitions in name
//! order, at most `response_partition_limit` partitions per answer with a
//! cursor to go on from, as `kafka-topics --describe` (Kafka 3.8+) pages
//! through a large cluster. Kafka's rules: the limit is capped by
//! `max.request.partition.size.limit`; asked for every topic, the client sees
//! those it may describe; asked by name, a topic it may not describe answers
//! TOPIC_AUTHORIZATION_FAILED and a missing one UNKNOWN_TOPIC_OR_PARTITION; a
//! cursor must name one of the topics asked for.

use kafka_protocol::messages::describe_topic_partitions_response::{
    Cursor, DescribeTopicPartitionsResponsePartition, DescribeTopicPartitionsResponseTopic,
};
use kafka_protocol::messages::{BrokerId, DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse, TopicName};
use kafka_protocol::ResponseError;
use strom_raft::{MetadataImage, TopicImage};

use super::{str_bytes, topic_uuid};
use crate::controller::topics::validate_topic_name;
use crate::kafka::authorized_operations::{authorized_operations, Resource};
use crate::kafka::registry::Client;
use crate::node::NodeContext;
use crate::security::acl::{Operation, ResourceType};

/// Kafka's default `max.request.partition.size.limit`.
const DEFAULT_PARTITION_LIMIT: i64 = 2000;

fn topic_error(name: &str, error: ResponseError) -> DescribeTopicPartitionsResponseTopic {
    DescribeTopicPartitionsResponseTopic::default()
        .with_name(Some(TopicName(str_bytes(name))))
        .with_error_code(error.code())
}

fn partition_entry(image: &MetadataImage, index: i32, topic: &TopicImage) -> DescribeTopicPartitionsResponsePartition {
    let ids = |v: &[i32]| v.iter().map(|b| BrokerId(*b)).collect::<Vec<_>>();
    let Some(p) = topic.partitions.get(&index) else {
        return DescribeTopicPartitionsResponsePartition::default()
            .with_partition_index(index)
            .with_error_code(ResponseError::UnknownTopicOrPartition.code());
    };
    let leader = p.leader.filter(|l| image.is_active(*l));
    let offline: Vec<i32> = p.replicas.iter().copied().filter(|b| !image.is_active(*b)).collect();
    DescribeTopicPartitionsResponsePartition::default()
        .with_partition_index(index)
        .with_error_code(if leader.is_some() { 0 } else { ResponseError::LeaderNotAvailable.code() })
        .with_leader_id(BrokerId(leader.unwrap_or(-1)))
        .with_leader_epoch(p.leader_epoch)
        .with_replica_nodes(ids(&p.replicas))
        .with_isr_nodes(ids(&p.isr))
        // Strom has no eligible leader replicas (KIP-966's ELR): empty, as
        // Kafka answers with ELR disabled.
        .with_eligible_leader_replicas(Some(Vec::new()))
        .with_last_known_elr(Some(Vec::new()))
        .with_offline_replicas(ids(&offline))
}

pub fn handle(
    ctx: &NodeContext,
    request: DescribeTopicPartitionsRequest,
    client: &Client,
) -> DescribeTopicPartitionsResponse {
    let image = ctx.quorum.image();
    let describable = |name: &str| ctx.authorize(client, &image, Operation::Describe, ResourceType::Topic, name);
    let all_topics = request.topics.is_empty();
    let cursor = request.cursor.as_ref().map(|c| (c.topic_name.0.to_string(), c.partition_index));
    let mut names: Vec<String> = if all_topics {
        image.topics.keys().cloned().collect()
    } else {
        request.topics.iter().map(|t| t.name.0.to_string()).collect()
    };
    names.sort();
    names.dedup();
    let mut response = DescribeTopicPartitionsResponse::default();
    if let Some((cursor_topic, index)) = &cursor {
        if (!all_topics && !names.contains(cursor_topic)) || *index < 0 {
            // Kafka refuses the whole request: every topic asked for carries the error.
            response.topics = names.iter().map(|n| topic_error(n, ResponseError::InvalidRequest)).collect();
            return response;
        }
    }
    let limit = ctx
        .settings
        .int("max.request.partition.size.limit")
        .unwrap_or(DEFAULT_PARTITION_LIMIT)
        .min(i64::from(request.response_partition_limit))
        .max(1);
    let mut remaining = usize::try_from(limit).unwrap_or(1);
    let start_topic = cursor.as_ref().map_or("", |(t, _)| t.as_str());
    for name in names.iter().filter(|n| n.as_str() >= start_topic) {
        let topic = image.topics.get(name);
        if all_topics && !topic.is_some_and(|_| describable(name)) {
            continue;
        }
        if !describable(name) {
            response.topics.push(topic_error(name, ResponseError::TopicAuthorizationFailed));
            continue;
        }
        let Some(topic) = topic else {
            let error = if validate_topic_name(name).is_ok() {
                ResponseError::UnknownTopicOrPartition
            } else {
                ResponseError::InvalidTopicException
            };
            response.topics.push(topic_error(name, error));
            continue;
        };
        if remaining == 0 {
            response.next_cursor =
                Some(Cursor::default().with_topic_name(TopicName(str_bytes(name))).with_partition_index(0));
            break;
        }
        let first = match &cursor {
            Some((t, index)) if t == name => *index,
            _ => 0,
        };
        let indexes: Vec<i32> = topic.partitions.keys().copied().filter(|i| *i >= first).collect();
        let shown = indexes.len().min(remaining);
        remaining -= shown;
        let operations = authorized_operations(Resource::Topic, true, |op| {
            ctx.authorize(client, &image, op, ResourceType::Topic, name)
        });
        response.topics.push(
            DescribeTopicPartitionsResponseTopic::default()
                .with_name(Some(TopicName(str_bytes(name))))
                .with_topic_id(topic_uuid(topic.topic_id))
                .with_is_internal(name.starts_with("__"))
                .with_topic_authorized_operations(operations)
                .with_partitions(indexes[..shown].iter().map(|i| partition_entry(&image, *i, topic)).collect()),
        );
        if shown < indexes.len() {
            response.next_cursor = Some(
                Cursor::default().with_topic_name(TopicName(str_bytes(name))).with_partition_index(indexes[shown]),
            );
            break;
        }
    }
    response
}
