//! The consumer group protocol of KIP-848: ConsumerGroupHeartbeat and
//! ConsumerGroupDescribe. Each translates between the wire (topics by id)
//! and `crate::group::consumer` (the state machine).

use std::collections::{BTreeMap, BTreeSet};

use kafka_protocol::messages::consumer_group_describe_response::{
    Assignment as DescribedAssignment, DescribedGroup, Member, TopicPartitions as DescribedPartitions,
};
use kafka_protocol::messages::consumer_group_heartbeat_response::{Assignment, TopicPartitions};
use kafka_protocol::messages::*;
use kafka_protocol::ResponseError;

use super::groups::coordinating;
use super::{str_bytes, topic_uuid};
use crate::group::consumer::{self, Heartbeat, TopicInfo, Topics};
use crate::kafka::authorized_operations::{authorized_operations, Resource};
use crate::kafka::registry::Client;
use crate::node::NodeContext;
use crate::security::acl::{Operation, ResourceType};
use strom_raft::TopicId;

/// Every topic with its id and partition count.
pub fn topics_of(image: &strom_raft::MetadataImage) -> Topics {
    image
        .topics
        .iter()
        .map(|(name, t)| (name.clone(), TopicInfo { id: t.topic_id, partitions: t.partitions.len() as i32 }))
        .collect()
}

fn topic_id(uuid: uuid::Uuid) -> TopicId {
    TopicId(uuid.as_u128())
}

/// A request's first-heartbeat checks, Kafka's: a group id, a member id
/// from v1, a rebalance timeout, a subscription and the owned partitions.
fn check_request(r: &ConsumerGroupHeartbeatRequest, version: i16) -> Result<(), &'static str> {
    if r.group_id.is_empty() {
        return Err("GroupId can't be empty.");
    }
    if version >= 1 && r.member_id.is_empty() {
        return Err("MemberId can't be empty.");
    }
    if r.member_epoch > 0 && r.member_id.is_empty() {
        return Err("MemberId can't be empty.");
    }
    if r.member_epoch == consumer::JOIN_EPOCH {
        if r.rebalance_timeout_ms <= 0 {
            return Err("RebalanceTimeoutMs must be provided in first request.");
        }
        if r.topic_partitions.as_ref().is_none_or(|tp| !tp.is_empty()) {
            return Err("TopicPartitions must be empty when (re-)joining.");
        }
        if r.subscribed_topic_names.is_none() && r.subscribed_topic_regex.is_none() {
            return Err("SubscribedTopicNames or SubscribedTopicRegex must be set in first request.");
        }
    }
    if r.member_epoch < consumer::STATIC_LEAVE_EPOCH {
        return Err("MemberEpoch is invalid.");
    }
    if r.member_epoch == consumer::STATIC_LEAVE_EPOCH && r.instance_id.is_none() {
        return Err("InstanceId can't be null when leaving as a static member.");
    }
    Ok(())
}

pub async fn heartbeat(
    ctx: &NodeContext,
    r: ConsumerGroupHeartbeatRequest,
    version: i16,
    client: &Client,
) -> ConsumerGroupHeartbeatResponse {
    let fail = |e: ResponseError, message: Option<&str>| {
        ConsumerGroupHeartbeatResponse::default()
            .with_error_code(e.code())
            .with_error_message(message.map(|m| str_bytes(m.to_string())))
            .with_member_id(Some(r.member_id.clone()))
            .with_member_epoch(r.member_epoch)
    };
    if let Err(message) = check_request(&r, version) {
        return fail(ResponseError::InvalidRequest, Some(message));
    }
    let group = r.group_id.0.to_string();
    let image = ctx.quorum.image();
    if !ctx.authorize(client, &image, Operation::Read, ResourceType::Group, &group) {
        return fail(ResponseError::GroupAuthorizationFailed, None);
    }
    let names = r.subscribed_topic_names.as_ref().map(|ts| ts.iter().map(|t| t.0.to_string()).collect::<Vec<_>>());
    if names.iter().flatten().any(|t| !ctx.authorize(client, &image, Operation::Describe, ResourceType::Topic, t)) {
        return fail(ResponseError::TopicAuthorizationFailed, None);
    }
    if let Err(e) = coordinating(ctx) {
        return fail(e, None);
    }
    let owned = r.topic_partitions.as_ref().map(|tps| {
        tps.iter()
            .map(|tp| (topic_id(tp.topic_id), tp.partitions.iter().copied().collect::<BTreeSet<i32>>()))
            .filter(|(_, ps)| !ps.is_empty())
            .collect()
    });
    let hb = Heartbeat {
        member_id: r.member_id.to_string(),
        member_epoch: r.member_epoch,
        instance_id: r.instance_id.as_ref().map(|s| s.to_string()),
        rack_id: r.rack_id.as_ref().map(|s| s.to_string()),
        rebalance_timeout_ms: r.rebalance_timeout_ms,
        topics: names,
        regex: if version >= 1 { r.subscribed_topic_regex.as_ref().map(|s| s.to_string()) } else { None },
        server_assignor: r.server_assignor.as_ref().map(|s| s.to_string()),
        owned,
        client_id: client.id.as_ref().map(|s| s.to_string()).unwrap_or_default(),
        client_host: format!("/{}", client.host),
    };
    let topics = topics_of(&image);
    drop(image);
    let partition = ctx.groups.partition_of(&ctx.quorum.image(), &group);
    match ctx.groups.consumer_heartbeat(partition, &group, hb, &topics).await {
        Err(e) => fail(e, None),
        Ok(answer) => {
            let assignment = answer.assignment.map(|a| {
                Assignment::default().with_topic_partitions(
                    a.into_iter()
                        .map(|(t, ps)| {
                            TopicPartitions::default()
                                .with_topic_id(topic_uuid(t))
                                .with_partitions(ps.into_iter().collect())
                        })
                        .collect(),
                )
            });
            ConsumerGroupHeartbeatResponse::default()
                .with_member_id(Some(str_bytes(answer.member_id)))
                .with_member_epoch(answer.member_epoch)
                .with_heartbeat_interval_ms(answer.heartbeat_interval_ms)
                .with_assignment(assignment)
        }
    }
}

/// An assignment as ConsumerGroupDescribe shows it: topic ids with names.
fn described(a: Option<&consumer::Assignment>, names: &BTreeMap<TopicId, String>) -> DescribedAssignment {
    DescribedAssignment::default().with_topic_partitions(
        a.into_iter()
            .flatten()
            .map(|(t, ps)| {
                DescribedPartitions::default()
                    .with_topic_id(topic_uuid(*t))
                    .with_topic_name(TopicName(str_bytes(names.get(t).cloned().unwrap_or_default())))
                    .with_partitions(ps.iter().copied().collect())
            })
            .collect(),
    )
}

pub fn describe(
    ctx: &NodeContext,
    r: ConsumerGroupDescribeRequest,
    version: i16,
    client: &Client,
) -> ConsumerGroupDescribeResponse {
    let image = ctx.quorum.image();
    let names: BTreeMap<TopicId, String> = image.topics.iter().map(|(n, t)| (t.topic_id, n.clone())).collect();
    let groups = r
        .group_ids
        .into_iter()
        .map(|id| {
            let operations = authorized_operations(Resource::Group, r.include_authorized_operations, |op| {
                ctx.authorize(client, &image, op, ResourceType::Group, id.as_str())
            });
            let mut out = DescribedGroup::default().with_group_id(id.clone()).with_authorized_operations(operations);
            let error = |out: DescribedGroup, e: ResponseError, message: Option<String>| {
                out.with_error_code(e.code()).with_error_message(message.map(str_bytes))
            };
            if !ctx.authorize(client, &image, Operation::Describe, ResourceType::Group, id.as_str()) {
                return error(out, ResponseError::GroupAuthorizationFailed, None);
            }
            if let Err(e) = coordinating(ctx) {
                return error(out, e, None);
            }
            let partition = ctx.groups.partition_of(&image, id.as_str());
            let d = match ctx.groups.describe(partition, id.as_str()) {
                Err(e) => return error(out, e, None),
                Ok(None) => {
                    return error(
                        out,
                        ResponseError::GroupIdNotFound,
                        Some(format!("Group {} not found.", id.as_str())),
                    )
                }
                Ok(Some(d)) => d,
            };
            let Some(c) = d.consumer else {
                let message = format!("Group {} is not a consumer group.", id.as_str());
                return error(out, ResponseError::GroupIdNotFound, Some(message));
            };
            out.group_state = str_bytes(d.state_name);
            out.group_epoch = c.group_epoch;
            out.assignment_epoch = c.assignment_epoch;
            out.assignor_name = str_bytes(c.assignor.clone().unwrap_or_default());
            out.members = c
                .members
                .values()
                .map(|m| {
                    Member::default()
                        .with_member_id(str_bytes(m.id.clone()))
                        .with_instance_id(m.instance_id.clone().map(str_bytes))
                        .with_rack_id(m.rack_id.clone().map(str_bytes))
                        .with_member_epoch(m.epoch)
                        .with_client_id(str_bytes(m.client_id.clone()))
                        .with_client_host(str_bytes(m.client_host.clone()))
                        .with_subscribed_topic_names(m.topics.iter().map(|t| TopicName(str_bytes(t.clone()))).collect())
                        .with_subscribed_topic_regex(m.regex.clone().map(str_bytes))
                        .with_assignment(described(Some(&m.assigned), &names))
                        .with_target_assignment(described(c.target.get(&m.id), &names))
                        // v1: 0 = a classic member (online migration), 1 = one of the consumer protocol.
                        .with_member_type(match (version >= 1, m.is_classic()) {
                            (false, _) => -1,
                            (true, true) => 0,
                            (true, false) => 1,
                        })
                })
                .collect();
            out
        })
        .collect();
    ConsumerGroupDescribeResponse::default().with_groups(groups)
}
