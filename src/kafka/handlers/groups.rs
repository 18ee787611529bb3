//! The consumer-group APIs: FindCoordinator, JoinGroup, SyncGroup,
//! Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch, ListGroups,
//! DescribeGroups, DeleteGroups and OffsetDelete. Each translates between the
//! wire versions and `crate::group`, which holds the groups.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};

use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::offset_commit_response::{OffsetCommitResponsePartition, OffsetCommitResponseTopic};
use kafka_protocol::messages::offset_delete_response::{OffsetDeleteResponsePartition, OffsetDeleteResponseTopic};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions, OffsetFetchResponseTopic,
    OffsetFetchResponseTopics,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::{split_addr, str_bytes};
use crate::controller::protocol::ControllerRequest;
use crate::error::ErrorCode;
use crate::group::{CommitAuth, JoinRequest, OffsetCommit, SyncRequest, OFFSETS_TOPIC};
use crate::kafka::authorized_operations::{authorized_operations, Resource};
use crate::kafka::registry::Client;
use crate::node::NodeContext;
use crate::security::acl::{Operation, ResourceType};
use crate::txn::TRANSACTION_TOPIC;

fn code(e: Option<ResponseError>) -> i16 {
    e.map_or(0, |e| e.code())
}

fn opt_str(s: &Option<StrBytes>) -> Option<&str> {
    s.as_ref().map(|s| s.as_str()).filter(|s| !s.is_empty())
}

/// The settings an internal topic is created with: `__consumer_offsets`
/// (`offsets.topic.*`) or `__transaction_state` (`transaction.state.log.*`).
struct InternalTopic {
    name: &'static str,
    partitions: &'static str,
    replication_factor: &'static str,
    segment_bytes: &'static str,
    /// The setting of its `min.insync.replicas`, if it has one.
    min_isr: Option<&'static str>,
}

const OFFSETS: InternalTopic = InternalTopic {
    name: OFFSETS_TOPIC,
    partitions: "offsets.topic.num.partitions",
    replication_factor: "offsets.topic.replication.factor",
    segment_bytes: "offsets.topic.segment.bytes",
    min_isr: None,
};

const TRANSACTIONS: InternalTopic = InternalTopic {
    name: TRANSACTION_TOPIC,
    partitions: "transaction.state.log.num.partitions",
    replication_factor: "transaction.state.log.replication.factor",
    segment_bytes: "transaction.state.log.segment.bytes",
    min_isr: Some("transaction.state.log.min.isr"),
};

/// Creates an internal topic if it does not exist yet; at most one attempt
/// every few seconds per broker and topic, however many clients ask.
async fn ensure_internal_topic(ctx: &NodeContext, topic: &InternalTopic, last_attempt_ms: &AtomicU64) {
    let now = crate::clock::wall_ms().max(0) as u64;
    let last = last_attempt_ms.load(Ordering::Relaxed);
    if now.saturating_sub(last) < 2000
        || last_attempt_ms.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_err()
    {
        return;
    }
    // min(3, brokers) counts registered brokers, not just the live ones: a
    // group that starts while a broker is down must not get a less
    // replicated topic for good (the creation is retried until it fits).
    let image = ctx.quorum.image();
    let brokers = image.brokers.len().max(1) as i64;
    let replication_factor = ctx.settings.int(topic.replication_factor).unwrap_or_else(|| brokers.min(3));
    let segment_bytes = ctx.settings.u64(topic.segment_bytes).to_string();
    let mut configs: BTreeMap<String, String> =
        [("cleanup.policy", "compact"), ("retention.ms", "-1"), ("segment.bytes", segment_bytes.as_str())]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    if let Some(min_isr) = topic.min_isr.and_then(|k| ctx.settings.int(k)) {
        configs.insert("min.insync.replicas".to_string(), min_isr.min(replication_factor).to_string());
    }
    let request = ControllerRequest::CreateTopic {
        name: topic.name.to_string(),
        partitions: ctx.settings.int(topic.partitions).unwrap_or(50),
        replication_factor,
        configs,
    };
    match crate::admin::controller_write(ctx, request).await {
        Ok(()) => tracing::info!(replication_factor, "created {}", topic.name),
        Err(e) if e.code == ErrorCode::TopicAlreadyExists => {}
        Err(e) => tracing::warn!(error = %e, "creating {} failed; clients will retry", topic.name),
    }
}

/// (node id, host, port) of the coordinator of `key`, or the error.
/// as advertised on `listener`.
async fn coordinator_of(
    ctx: &NodeContext,
    key: &str,
    key_type: i8,
    listener: &str,
) -> Result<(i32, StrBytes, i32), ResponseError> {
    static OFFSETS_ATTEMPT_MS: AtomicU64 = AtomicU64::new(0);
    static TRANSACTIONS_ATTEMPT_MS: AtomicU64 = AtomicU64::new(0);
    let (internal, last_attempt) = match key_type {
        0 if key.is_empty() => return Err(ResponseError::InvalidGroupId),
        0 => (&OFFSETS, &OFFSETS_ATTEMPT_MS),
        1 if key.is_empty() => return Err(ResponseError::InvalidRequest),
        1 => (&TRANSACTIONS, &TRANSACTIONS_ATTEMPT_MS),
        _ => return Err(ResponseError::InvalidRequest),
    };
    let mut image = ctx.quorum.image();
    if !image.topics.contains_key(internal.name) {
        ensure_internal_topic(ctx, internal, last_attempt).await;
        image = ctx.quorum.image();
    }
    let topic = image.topics.get(internal.name).ok_or(ResponseError::CoordinatorNotAvailable)?;
    let partition = match key_type {
        0 => ctx.groups.partition_of(&image, key),
        _ => ctx.txns.partition_of(&image, key),
    };
    let leader =
        topic.partitions.get(&partition).and_then(|p| p.leader).ok_or(ResponseError::CoordinatorNotAvailable)?;
    let broker = image.brokers.get(&leader).ok_or(ResponseError::CoordinatorNotAvailable)?;
    let (host, port) = split_addr(broker.advertised(listener).ok_or(ResponseError::CoordinatorNotAvailable)?);
    Ok((leader, host, port))
}

/// FindCoordinator needs DESCRIBE on the group (key type 0) or the
/// transactional id (key type 1).
fn described(ctx: &NodeContext, client: &Client, key_type: i8, key: &str) -> Result<(), ResponseError> {
    if key_type == 1 {
        let allowed =
            ctx.authorize(client, &ctx.quorum.image(), Operation::Describe, ResourceType::TransactionalId, key);
        return if allowed { Ok(()) } else { Err(ResponseError::TransactionalIdAuthorizationFailed) };
    }
    match key_type == 0 && !group_allowed(ctx, client, Operation::Describe, key) {
        true => Err(ResponseError::GroupAuthorizationFailed),
        false => Ok(()),
    }
}

pub async fn find(
    ctx: &NodeContext,
    request: FindCoordinatorRequest,
    version: i16,
    client: &Client,
) -> FindCoordinatorResponse {
    let mut r = FindCoordinatorResponse::default();
    if version >= 4 {
        for key in request.coordinator_keys {
            let c = Coordinator::default().with_key(key.clone());
            let found = match described(ctx, client, request.key_type, key.as_str()) {
                Ok(()) => coordinator_of(ctx, key.as_str(), request.key_type, &client.listener).await,
                Err(e) => Err(e),
            };
            r.coordinators.push(match found {
                Ok((node, host, port)) => c.with_node_id(BrokerId(node)).with_host(host).with_port(port),
                Err(e) => c.with_node_id(BrokerId(-1)).with_port(-1).with_error_code(e.code()),
            });
        }
        return r;
    }
    let found = match described(ctx, client, request.key_type, request.key.as_str()) {
        Ok(()) => coordinator_of(ctx, request.key.as_str(), request.key_type, &client.listener).await,
        Err(e) => Err(e),
    };
    match found {
        Ok((node, host, port)) => {
            r.node_id = BrokerId(node);
            r.host = host;
            r.port = port;
        }
        Err(e) => {
            r.error_code = e.code();
            r.node_id = BrokerId(-1);
            r.port = -1;
            if version >= 1 {
                r.error_message = Some(str_bytes(format!("{e:?}")));
            }
        }
    }
    r
}

/// A broker that has not heard from the controller for the session timeout
/// may no longer lead the group's `__consumer_offsets` partition: another
/// coordinator may have taken its groups over and taken commits this one
/// never saw. It answers NOT_COORDINATOR rather than from what it holds, so
/// members look the coordinator up again (as produce answers
/// NOT_LEADER_OR_FOLLOWER there).
pub(super) fn coordinating(ctx: &NodeContext) -> Result<(), ResponseError> {
    if ctx.lifecycle.out_of_touch() {
        return Err(ResponseError::NotCoordinator);
    }
    Ok(())
}

/// Whether `client` may do `op` on group `group`.
fn group_allowed(ctx: &NodeContext, client: &Client, op: Operation, group: &str) -> bool {
    ctx.authorize(client, &ctx.quorum.image(), op, ResourceType::Group, group)
}

/// Whether `client` may do `op` on topic `topic`.
fn topic_allowed(ctx: &NodeContext, client: &Client, op: Operation, topic: &str) -> bool {
    ctx.authorize(client, &ctx.quorum.image(), op, ResourceType::Topic, topic)
}

fn partition_of(ctx: &NodeContext, group: &str) -> i32 {
    ctx.groups.partition_of(&ctx.quorum.image(), group)
}

pub async fn join(ctx: &NodeContext, r: JoinGroupRequest, version: i16, client: &Client) -> JoinGroupResponse {
    let group = r.group_id.0.to_string();
    let mut response = JoinGroupResponse::default().with_member_id(r.member_id.clone()).with_generation_id(-1);
    if version < 7 {
        response.protocol_name = Some(StrBytes::default());
    }
    if group.is_empty() {
        return response.with_error_code(ResponseError::InvalidGroupId.code());
    }
    if !group_allowed(ctx, client, Operation::Read, &group) {
        return response.with_error_code(ResponseError::GroupAuthorizationFailed.code());
    }
    // Every member's metadata is stored in one record of __consumer_offsets:
    // a member whose metadata alone could never fit is refused here.
    let metadata_bytes: usize = r.protocols.iter().map(|p| p.metadata.len() + p.name.len()).sum();
    let limit = ctx.settings.int("message.max.bytes").unwrap_or(1_048_588).max(0) as usize;
    if metadata_bytes > limit / 2 {
        tracing::warn!(group = %group, bytes = metadata_bytes, limit, "JoinGroup refused: protocol metadata too large");
        return response.with_error_code(ResponseError::InvalidRequest.code());
    }
    let req = JoinRequest {
        member_id: r.member_id.to_string(),
        instance_id: if version >= 5 { opt_str(&r.group_instance_id).map(str::to_string) } else { None },
        client_id: client.id.as_ref().map(|s| s.to_string()).unwrap_or_default(),
        client_host: format!("/{}", client.host),
        session_timeout_ms: r.session_timeout_ms,
        rebalance_timeout_ms: if version >= 1 { r.rebalance_timeout_ms } else { r.session_timeout_ms },
        protocol_type: r.protocol_type.to_string(),
        protocols: r.protocols.into_iter().map(|p| (p.name.to_string(), p.metadata)).collect(),
        require_known_member_id: version >= 4,
    };
    let partition = partition_of(ctx, &group);
    let image = ctx.quorum.image();
    let result = ctx.groups.join(partition, &group, req, || super::consumer_groups::topics_of(&image)).await;
    response.error_code = code(result.error);
    response.generation_id = result.generation;
    response.member_id = str_bytes(result.member_id);
    response.leader = str_bytes(result.leader);
    if version >= 9 {
        response.skip_assignment = result.skip_assignment;
    }
    if version >= 7 {
        response.protocol_type = result.protocol_type.map(str_bytes);
        response.protocol_name = result.protocol.map(str_bytes);
    } else {
        response.protocol_name = Some(str_bytes(result.protocol.unwrap_or_default()));
    }
    response.members = result
        .members
        .into_iter()
        .map(|m| {
            let mut member =
                JoinGroupResponseMember::default().with_member_id(str_bytes(m.member_id)).with_metadata(m.metadata);
            if version >= 5 {
                member.group_instance_id = m.instance_id.map(str_bytes);
            }
            member
        })
        .collect();
    response
}

pub async fn sync(ctx: &NodeContext, r: SyncGroupRequest, version: i16, client: &Client) -> SyncGroupResponse {
    let group = r.group_id.0.to_string();
    if group.is_empty() {
        return SyncGroupResponse::default().with_error_code(ResponseError::InvalidGroupId.code());
    }
    if !group_allowed(ctx, client, Operation::Read, &group) {
        return SyncGroupResponse::default().with_error_code(ResponseError::GroupAuthorizationFailed.code());
    }
    let instance = if version >= 3 { opt_str(&r.group_instance_id) } else { None };
    let (ptype, pname) =
        if version >= 5 { (opt_str(&r.protocol_type), opt_str(&r.protocol_name)) } else { (None, None) };
    let assignments = r.assignments.into_iter().map(|a| (a.member_id.to_string(), a.assignment)).collect();
    let partition = partition_of(ctx, &group);
    let result = ctx
        .groups
        .sync(
            partition,
            &group,
            SyncRequest {
                member_id: r.member_id.as_str(),
                instance_id: instance,
                generation: r.generation_id,
                protocol_type: ptype,
                protocol: pname,
                assignments,
            },
        )
        .await;
    let mut response =
        SyncGroupResponse::default().with_error_code(code(result.error)).with_assignment(result.assignment);
    if version >= 5 && result.error.is_none() {
        response.protocol_type = result.protocol_type.map(str_bytes);
        response.protocol_name = result.protocol.map(str_bytes);
    }
    response
}

pub fn heartbeat(ctx: &NodeContext, r: HeartbeatRequest, version: i16, client: &Client) -> HeartbeatResponse {
    let group = r.group_id.0.to_string();
    let instance = if version >= 3 { opt_str(&r.group_instance_id) } else { None };
    let result = if group.is_empty() {
        Err(ResponseError::InvalidGroupId)
    } else if !group_allowed(ctx, client, Operation::Read, &group) {
        Err(ResponseError::GroupAuthorizationFailed)
    } else {
        coordinating(ctx).and_then(|()| {
            let image = ctx.quorum.image();
            let topics = || super::consumer_groups::topics_of(&image);
            ctx.groups.heartbeat(
                partition_of(ctx, &group),
                &group,
                r.member_id.as_str(),
                instance,
                r.generation_id,
                topics,
            )
        })
    };
    HeartbeatResponse::default().with_error_code(code(result.err()))
}

pub fn leave(ctx: &NodeContext, r: LeaveGroupRequest, version: i16, client: &Client) -> LeaveGroupResponse {
    let group = r.group_id.0.to_string();
    if !group_allowed(ctx, client, Operation::Read, &group) {
        return LeaveGroupResponse::default().with_error_code(ResponseError::GroupAuthorizationFailed.code());
    }
    let members: Vec<(String, Option<String>)> = if version >= 3 {
        r.members.iter().map(|m| (m.member_id.to_string(), opt_str(&m.group_instance_id).map(str::to_string))).collect()
    } else {
        vec![(r.member_id.to_string(), None)]
    };
    let mut response = LeaveGroupResponse::default();
    let image = ctx.quorum.image();
    match ctx.groups.leave(partition_of(ctx, &group), &group, &members, || super::consumer_groups::topics_of(&image)) {
        Err(e) => response.error_code = e.code(),
        Ok(results) if version >= 3 => {
            response.members = members
                .iter()
                .zip(results)
                .map(|((member, instance), result)| {
                    MemberResponse::default()
                        .with_member_id(str_bytes(result.as_ref().map_or(member.clone(), Clone::clone)))
                        .with_group_instance_id(instance.clone().map(str_bytes))
                        .with_error_code(code(result.err()))
                })
                .collect();
        }
        Ok(results) => response.error_code = code(results.into_iter().next().and_then(Result::err)),
    }
    response
}

pub async fn commit(ctx: &NodeContext, r: OffsetCommitRequest, version: i16, client: &Client) -> OffsetCommitResponse {
    let group = r.group_id.0.to_string();
    let image = ctx.quorum.image();
    // READ on the group, then on each topic (Kafka's checks and codes).
    let group_denied = !group.is_empty() && !group_allowed(ctx, client, Operation::Read, &group);
    // Commits for partitions that do not exist are refused one by one.
    let mut commits = Vec::new();
    let mut slots = Vec::new();
    let mut topics: Vec<OffsetCommitResponseTopic> = Vec::with_capacity(r.topics.len());
    for (t, topic) in r.topics.iter().enumerate() {
        let name = topic.name.0.to_string();
        let known = image.topics.get(&name);
        let readable = topic_allowed(ctx, client, Operation::Read, &name);
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for (p, part) in topic.partitions.iter().enumerate() {
            let mut response = OffsetCommitResponsePartition::default().with_partition_index(part.partition_index);
            if group_denied {
                response.error_code = ResponseError::GroupAuthorizationFailed.code();
            } else if !readable {
                response.error_code = ResponseError::TopicAuthorizationFailed.code();
            } else if !known.is_some_and(|k| k.partitions.contains_key(&part.partition_index)) {
                response.error_code = ResponseError::UnknownTopicOrPartition.code();
            } else {
                slots.push((t, p));
                commits.push(OffsetCommit {
                    topic: name.clone(),
                    partition: part.partition_index,
                    offset: part.committed_offset,
                    leader_epoch: if version >= 6 { part.committed_leader_epoch } else { -1 },
                    metadata: part.committed_metadata.as_ref().map(|m| m.to_string()).unwrap_or_default(),
                });
            }
            partitions.push(response);
        }
        topics.push(OffsetCommitResponseTopic::default().with_name(topic.name.clone()).with_partitions(partitions));
    }
    let result = if group.is_empty() {
        Err(ResponseError::InvalidGroupId)
    } else if commits.is_empty() {
        Ok(Vec::new())
    } else {
        let auth = CommitAuth {
            member_id: r.member_id.as_str(),
            instance_id: if version >= 7 { opt_str(&r.group_instance_id) } else { None },
            generation: r.generation_id_or_member_epoch,
            member_epochs: version >= 9,
        };
        ctx.groups.commit(partition_of(ctx, &group), &group, auth, commits).await
    };
    match result {
        Ok(errors) => {
            for ((t, p), e) in slots.into_iter().zip(errors) {
                topics[t].partitions[p].error_code = code(e);
            }
        }
        Err(e) => {
            for (t, p) in slots {
                topics[t].partitions[p].error_code = e.code();
            }
            if group.is_empty() {
                for t in &mut topics {
                    for p in &mut t.partitions {
                        p.error_code = e.code();
                    }
                }
            }
        }
    }
    OffsetCommitResponse::default().with_topics(topics)
}

/// One partition's committed offset: (partition, offset, leader epoch,
/// metadata, error code); -1 offsets when nothing is committed (no error:
/// Kafka's answer), or for a topic the client may not describe
/// (TOPIC_AUTHORIZATION_FAILED).
type FetchedPartition = (i32, i64, i32, String, i16);
/// One group's committed offsets by topic.
type FetchedTopics = Vec<(StrBytes, Vec<FetchedPartition>)>;

/// `require_stable` (v7+): a partition whose offset a transaction not
/// ended yet has committed answers UNSTABLE_OFFSET_COMMIT (retriable).
fn fetch_group(
    ctx: &NodeContext,
    client: &Client,
    group: &str,
    topics: Option<Vec<(StrBytes, Vec<i32>)>>,
    require_stable: bool,
    member: Option<(&str, i32)>,
) -> Result<FetchedTopics, ResponseError> {
    coordinating(ctx)?;
    if !group_allowed(ctx, client, Operation::Describe, group) {
        return Err(ResponseError::GroupAuthorizationFailed);
    }
    if let Some((member_id, epoch)) = member.filter(|(m, e)| !m.is_empty() || *e >= 0) {
        ctx.groups.check_member_epoch(partition_of(ctx, group), group, member_id, epoch)?;
    }
    let describable = |t: &str| topic_allowed(ctx, client, Operation::Describe, t);
    let wanted: Option<Vec<(String, i32)>> = topics.as_ref().map(|ts| {
        ts.iter()
            .filter(|(t, _)| describable(t))
            .flat_map(|(t, ps)| ps.iter().map(move |p| (t.to_string(), *p)))
            .collect()
    });
    let found = ctx.groups.fetch_offsets(partition_of(ctx, group), group, wanted.as_deref())?;
    let mut by_topic: BTreeMap<String, Vec<FetchedPartition>> = BTreeMap::new();
    for ((t, p), c, unstable) in found {
        if topics.is_none() && !describable(&t) {
            continue;
        }
        let row = match c {
            _ if unstable && require_stable => (p, -1, -1, String::new(), ResponseError::UnstableOffsetCommit.code()),
            Some(c) => (p, c.offset, c.leader_epoch, c.metadata, 0),
            None => (p, -1, -1, String::new(), 0),
        };
        by_topic.entry(t).or_default().push(row);
    }
    for (t, ps) in topics.iter().flatten().filter(|(t, _)| !describable(t)) {
        let denied = ResponseError::TopicAuthorizationFailed.code();
        by_topic.insert(t.to_string(), ps.iter().map(|p| (*p, -1, -1, String::new(), denied)).collect());
    }
    // Keep the request's topic order when it named topics.
    let order: Vec<String> = match &topics {
        Some(ts) => ts.iter().map(|(t, _)| t.to_string()).collect(),
        None => by_topic.keys().cloned().collect(),
    };
    let mut seen = BTreeSet::new();
    Ok(order
        .into_iter()
        .filter(|t| seen.insert(t.clone()))
        .map(|t| {
            let rows = by_topic.remove(&t).unwrap_or_default();
            (str_bytes(t), rows)
        })
        .collect())
}

pub fn fetch_offsets(ctx: &NodeContext, r: OffsetFetchRequest, version: i16, client: &Client) -> OffsetFetchResponse {
    let mut response = OffsetFetchResponse::default();
    if version >= 8 {
        for g in r.groups {
            let topics = g.topics.map(|ts| ts.into_iter().map(|t| (t.name.0, t.partition_indexes)).collect());
            let mut out = OffsetFetchResponseGroup::default().with_group_id(g.group_id.clone());
            let member = (version >= 9).then(|| (g.member_id.as_ref().map_or("", |m| m.as_str()), g.member_epoch));
            match fetch_group(ctx, client, g.group_id.as_str(), topics, r.require_stable, member) {
                Ok(rows) => {
                    out.topics = rows
                        .into_iter()
                        .map(|(name, parts)| {
                            OffsetFetchResponseTopics::default().with_name(TopicName(name)).with_partitions(
                                parts
                                    .into_iter()
                                    .map(|(p, o, e, m, error)| {
                                        OffsetFetchResponsePartitions::default()
                                            .with_partition_index(p)
                                            .with_committed_offset(o)
                                            .with_committed_leader_epoch(e)
                                            .with_metadata(Some(str_bytes(m)))
                                            .with_error_code(error)
                                    })
                                    .collect(),
                            )
                        })
                        .collect()
                }
                Err(e) => out.error_code = e.code(),
            }
            response.groups.push(out);
        }
        return response;
    }
    let topics = r.topics.map(|ts| ts.into_iter().map(|t| (t.name.0, t.partition_indexes)).collect::<Vec<_>>());
    let requested = topics.clone();
    match fetch_group(ctx, client, r.group_id.as_str(), topics, version >= 7 && r.require_stable, None) {
        Ok(rows) => {
            response.topics = rows
                .into_iter()
                .map(|(name, parts)| {
                    OffsetFetchResponseTopic::default().with_name(TopicName(name)).with_partitions(
                        parts
                            .into_iter()
                            .map(|(p, o, e, m, error)| {
                                let mut part = OffsetFetchResponsePartition::default()
                                    .with_partition_index(p)
                                    .with_committed_offset(o)
                                    .with_metadata(Some(str_bytes(m)))
                                    .with_error_code(error);
                                if version >= 5 {
                                    part.committed_leader_epoch = e;
                                }
                                part
                            })
                            .collect(),
                    )
                })
                .collect()
        }
        Err(e) if version >= 2 => response.error_code = e.code(),
        Err(e) => {
            // v1 has no top-level error: every requested partition carries it.
            response.topics = requested
                .unwrap_or_default()
                .into_iter()
                .map(|(name, ps)| {
                    OffsetFetchResponseTopic::default().with_name(TopicName(name)).with_partitions(
                        ps.into_iter()
                            .map(|p| {
                                OffsetFetchResponsePartition::default()
                                    .with_partition_index(p)
                                    .with_committed_offset(-1)
                                    .with_metadata(Some(StrBytes::default()))
                                    .with_error_code(e.code())
                            })
                            .collect(),
                    )
                })
                .collect();
        }
    }
    response
}

pub fn list(ctx: &NodeContext, r: ListGroupsRequest, version: i16, client: &Client) -> ListGroupsResponse {
    let mut response = ListGroupsResponse::default();
    // DESCRIBE on the cluster lists every group; else the groups one may describe.
    let all = ctx.authorize_cluster(client, &ctx.quorum.image(), Operation::Describe);
    match ctx.groups.list() {
        Err(e) => response.error_code = e.code(),
        Ok(groups) => {
            let states: Vec<String> = r.states_filter.iter().map(|s| s.to_lowercase()).collect();
            let types: Vec<String> = r.types_filter.iter().map(|s| s.to_lowercase()).collect();
            response.groups = groups
                .into_iter()
                .filter(|g| version < 4 || states.is_empty() || states.contains(&g.state.to_lowercase()))
                .filter(|g| version < 5 || types.is_empty() || types.iter().any(|t| t == g.group_type))
                .filter(|g| all || group_allowed(ctx, client, Operation::Describe, &g.group_id))
                .map(|g| {
                    let mut listed = ListedGroup::default()
                        .with_group_id(GroupId(str_bytes(g.group_id)))
                        .with_protocol_type(str_bytes(g.protocol_type));
                    if version >= 4 {
                        listed.group_state = str_bytes(g.state);
                    }
                    if version >= 5 {
                        listed.group_type = str_bytes(g.group_type);
                    }
                    listed
                })
                .collect();
        }
    }
    response
}

pub fn describe(ctx: &NodeContext, r: DescribeGroupsRequest, version: i16, client: &Client) -> DescribeGroupsResponse {
    let image = ctx.quorum.image();
    let groups = r
        .groups
        .into_iter()
        .map(|id| {
            let operations =
                authorized_operations(Resource::Group, version >= 3 && r.include_authorized_operations, |op| {
                    ctx.authorize(client, &image, op, ResourceType::Group, id.as_str())
                });
            let mut out = DescribedGroup::default().with_group_id(id.clone()).with_authorized_operations(operations);
            if !group_allowed(ctx, client, Operation::Describe, id.as_str()) {
                out.error_code = ResponseError::GroupAuthorizationFailed.code();
                return out;
            }
            match ctx.groups.describe(partition_of(ctx, id.as_str()), id.as_str()) {
                Err(e) => out.error_code = e.code(),
                // Kafka describes an unknown group as Dead, without an error,
                // and a group of the consumer protocol as one it does not know
                // (ConsumerGroupDescribe describes it).
                Ok(None) => out.group_state = str_bytes("Dead"),
                Ok(Some(d)) if d.consumer.is_some() => out.group_state = str_bytes("Dead"),
                Ok(Some(d)) => {
                    out.group_state = str_bytes(d.state.name());
                    out.protocol_type = str_bytes(d.protocol_type);
                    out.protocol_data = str_bytes(d.protocol);
                    out.members = d
                        .members
                        .into_iter()
                        .map(|m| {
                            let mut member = DescribedGroupMember::default()
                                .with_member_id(str_bytes(m.member_id))
                                .with_client_id(str_bytes(m.client_id))
                                .with_client_host(str_bytes(m.client_host))
                                .with_member_metadata(m.metadata)
                                .with_member_assignment(m.assignment);
                            if version >= 4 {
                                member.group_instance_id = m.instance_id.map(str_bytes);
                            }
                            member
                        })
                        .collect();
                }
            }
            out
        })
        .collect();
    DescribeGroupsResponse::default().with_groups(groups)
}

pub async fn delete(ctx: &NodeContext, r: DeleteGroupsRequest, client: &Client) -> DeleteGroupsResponse {
    let mut results = Vec::with_capacity(r.groups_names.len());
    for id in r.groups_names {
        let result = match group_allowed(ctx, client, Operation::Delete, id.as_str()) {
            true => ctx.groups.delete_group(partition_of(ctx, id.as_str()), id.as_str()).await,
            false => Err(ResponseError::GroupAuthorizationFailed),
        };
        results.push(DeletableGroupResult::default().with_group_id(id).with_error_code(code(result.err())));
    }
    DeleteGroupsResponse::default().with_results(results)
}

pub async fn delete_offsets(ctx: &NodeContext, r: OffsetDeleteRequest, client: &Client) -> OffsetDeleteResponse {
    let group = r.group_id.0.to_string();
    let mut response = OffsetDeleteResponse::default();
    if !group_allowed(ctx, client, Operation::Delete, &group) {
        return response.with_error_code(ResponseError::GroupAuthorizationFailed.code());
    }
    // Offsets of topics the client may not read are not deleted.
    let readable: Vec<bool> = r.topics.iter().map(|t| topic_allowed(ctx, client, Operation::Read, &t.name.0)).collect();
    let partitions: Vec<(String, i32)> = r
        .topics
        .iter()
        .zip(&readable)
        .filter(|(_, readable)| **readable)
        .flat_map(|(t, _)| t.partitions.iter().map(move |p| (t.name.0.to_string(), p.partition_index)))
        .collect();
    match ctx.groups.delete_offsets(partition_of(ctx, &group), &group, &partitions).await {
        Err(e) => response.error_code = e.code(),
        Ok(errors) => {
            let mut errors = errors.into_iter();
            response.topics = r
                .topics
                .into_iter()
                .zip(readable)
                .map(|(t, readable)| {
                    let parts = t
                        .partitions
                        .into_iter()
                        .map(|p| {
                            let error = match readable {
                                true => code(errors.next().flatten()),
                                false => ResponseError::TopicAuthorizationFailed.code(),
                            };
                            OffsetDeleteResponsePartition::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(error)
                        })
                        .collect();
                    OffsetDeleteResponseTopic::default().with_name(t.name).with_partitions(parts)
                })
                .collect();
        }
    }
    response
}
