//! Topic and partition endpoints: list, create, describe, delete, add
//! partitions, configs, and operator leader elections.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use strom_raft::{MetadataImage, PartitionRegistration, TopicImage};

use super::reassignments::{reassignment_progress, Progress};
use super::{controller_write, ApiResult, Ctx, HttpError, JsonBody};
use crate::controller::protocol::{ControllerRequest, ElectionType};
use crate::error::{ApiError, ErrorCode};
use crate::node::NodeContext;
use crate::replication::partition::PartitionOffsets;

pub(super) fn unknown_topic(name: &str) -> HttpError {
    HttpError(ApiError::new(ErrorCode::UnknownTopicOrPartition, format!("topic `{name}` does not exist")))
}

/// Offsets of one partition as its leader reports them.
type Offsets = HashMap<i32, PartitionOffsets>;

/// Offsets of the partitions of `topic` that this broker leads.
fn local_offsets(ctx: &NodeContext, topic: &TopicImage) -> Offsets {
    topic
        .partitions
        .keys()
        .filter_map(|i| ctx.replicas.get(&topic.name, *i).filter(|p| p.is_leader()).map(|p| (*i, p.offsets())))
        .collect()
}

/// Asks each partition's leader (this node or another, over its admin API)
/// for its offsets; a leader that does not answer within a second leaves them null.
pub(super) async fn leader_offsets(ctx: &NodeContext, image: &MetadataImage, topic: &TopicImage) -> Offsets {
    ctx.data_plane_current().await;
    let mut offsets = local_offsets(ctx, topic);
    let leaders: BTreeSet<i32> = topic
        .partitions
        .iter()
        .filter(|(i, _)| !offsets.contains_key(*i))
        .filter_map(|(_, p)| p.leader)
        .filter(|l| *l != ctx.broker_id && image.is_active(*l))
        .collect();
    let http = ctx.admin_security.peer_client(Duration::from_secs(1));
    let asks = leaders.into_iter().filter_map(|l| image.brokers.get(&l)).map(|b| {
        let request = http.get(&b.admin, &format!("/v1/internal/local-offsets/{}", topic.name));
        async move {
            let resp = request.send().await.ok()?;
            resp.json::<Vec<(i32, i64, i64, i64)>>().await.ok()
        }
    });
    for answer in futures_util::future::join_all(asks).await.into_iter().flatten() {
        for (i, log_start_offset, log_end_offset, high_watermark) in answer {
            offsets.insert(i, PartitionOffsets { log_start_offset, log_end_offset, high_watermark });
        }
    }
    offsets
}

/// `[partition, log start, log end, high watermark]` for partitions led here.
pub async fn internal_offsets(State(ctx): Ctx, Path(name): Path<String>) -> ApiResult<Json<Value>> {
    ctx.data_plane_current().await;
    let image = ctx.quorum.image();
    let topic = image.topics.get(&name).ok_or_else(|| unknown_topic(&name))?;
    let rows: Vec<(i32, i64, i64, i64)> = local_offsets(&ctx, topic)
        .into_iter()
        .map(|(i, o)| (i, o.log_start_offset, o.log_end_offset, o.high_watermark))
        .collect();
    Ok(Json(json!(rows)))
}

pub(super) fn partition_json(
    image: &MetadataImage,
    index: i32,
    p: &PartitionRegistration,
    offsets: Option<&PartitionOffsets>,
    bytes_left: Option<u64>,
) -> Value {
    let replica_states: BTreeMap<String, &str> =
        p.replicas.iter().map(|b| (b.to_string(), image.replica_state(p, *b).as_str())).collect();
    json!({
        "partition": index,
        "leader": p.leader,
        "leader_epoch": p.leader_epoch,
        "partition_epoch": p.partition_epoch,
        "replicas": p.replicas,
        "isr": p.isr,
        "state": image.partition_state(p).as_str(),
        "replica_states": replica_states,
        "high_watermark": offsets.map(|o| o.high_watermark),
        "log_start_offset": offsets.map(|o| o.log_start_offset),
        "log_end_offset": offsets.map(|o| o.log_end_offset),
        "reassignment": p.is_reassigning().then(|| json!({
            "target": p.target_replicas(),
            "adding": p.adding_replicas,
            "removing": p.removing_replicas,
            "bytes_left": bytes_left,
        })),
    })
}

fn topic_json(
    ctx: &NodeContext,
    image: &MetadataImage,
    topic: &TopicImage,
    offsets: &Offsets,
    progress: &Progress,
) -> Value {
    let partitions: Vec<Value> = topic
        .partitions
        .iter()
        .map(|(i, p)| partition_json(image, *i, p, offsets.get(i), progress.get(&(topic.name.clone(), *i)).copied()))
        .collect();
    json!({
        "name": topic.name,
        "topic_id": topic.topic_id.to_string(),
        "configs": ctx.settings.for_broker(image, ctx.broker_id).topic_effective(&topic.configs),
        "partitions": partitions,
    })
}

async fn describe_now(ctx: &NodeContext, name: &str) -> ApiResult<Json<Value>> {
    let image = ctx.quorum.image();
    let topic = image.topics.get(name).ok_or_else(|| unknown_topic(name))?;
    let offsets = leader_offsets(ctx, &image, topic).await;
    let moving: Vec<(String, i32)> =
        topic.partitions.iter().filter(|(_, p)| p.is_reassigning()).map(|(i, _)| (name.to_string(), *i)).collect();
    let progress = reassignment_progress(ctx, &image, &moving).await;
    Ok(Json(topic_json(ctx, &image, topic, &offsets, &progress)))
}

pub async fn list(State(ctx): Ctx) -> Json<Vec<Value>> {
    let image = ctx.quorum.image();
    Json(
        image
            .topics
            .values()
            .map(|t| {
                let rf = t.partitions.values().next().map_or(0, |p| p.replicas.len());
                json!({"name": t.name, "partitions": t.partitions.len(), "replication_factor": rf})
            })
            .collect(),
    )
}

/// A config value as JSON sends it: a string, number or boolean (or null to reset).
pub(super) fn config_value(key: &str, v: &Value) -> Result<Option<String>, ApiError> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        Value::Number(n) => Ok(Some(n.to_string())),
        Value::Bool(b) => Ok(Some(b.to_string())),
        _ => {
            Err(ApiError::new(ErrorCode::InvalidConfig, format!("config `{key}` must be a string, number or boolean")))
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTopic {
    name: String,
    partitions: Option<i64>,
    replication_factor: Option<i64>,
    #[serde(default)]
    configs: BTreeMap<String, Value>,
}

pub async fn create(State(ctx): Ctx, JsonBody(body): JsonBody<CreateTopic>) -> ApiResult<(StatusCode, Json<Value>)> {
    let mut configs = BTreeMap::new();
    for (k, v) in &body.configs {
        match config_value(k, v)? {
            Some(v) => configs.insert(k.clone(), v),
            None => return Err(ApiError::new(ErrorCode::InvalidConfig, format!("config `{k}` is null")).into()),
        };
    }
    let request = ControllerRequest::CreateTopic {
        name: body.name.clone(),
        partitions: body.partitions.unwrap_or_else(|| ctx.settings.int("num.partitions").unwrap_or(1)),
        replication_factor: body
            .replication_factor
            .unwrap_or_else(|| ctx.settings.int("default.replication.factor").unwrap_or(1)),
        configs,
    };
    controller_write(&ctx, request).await?;
    Ok((StatusCode::CREATED, describe_now(&ctx, &body.name).await?))
}

pub async fn describe(State(ctx): Ctx, Path(name): Path<String>) -> ApiResult<Json<Value>> {
    describe_now(&ctx, &name).await
}

pub async fn delete(State(ctx): Ctx, Path(name): Path<String>) -> ApiResult<StatusCode> {
    controller_write(&ctx, ControllerRequest::DeleteTopic { name }).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddPartitions {
    count: i64,
}

pub async fn add_partitions(
    State(ctx): Ctx,
    Path(name): Path<String>,
    JsonBody(body): JsonBody<AddPartitions>,
) -> ApiResult<Json<Value>> {
    controller_write(&ctx, ControllerRequest::CreatePartitions { name: name.clone(), count: body.count }).await?;
    describe_now(&ctx, &name).await
}

pub async fn configs(State(ctx): Ctx, Path(name): Path<String>) -> ApiResult<Json<Value>> {
    let image = ctx.quorum.image();
    let topic = image.topics.get(&name).ok_or_else(|| unknown_topic(&name))?;
    Ok(Json(json!(ctx.settings.for_broker(&image, ctx.broker_id).topic_effective(&topic.configs))))
}

pub async fn alter_configs(
    State(ctx): Ctx,
    Path(name): Path<String>,
    JsonBody(body): JsonBody<BTreeMap<String, Value>>,
) -> ApiResult<Json<Value>> {
    let mut changes = BTreeMap::new();
    for (k, v) in &body {
        changes.insert(k.clone(), config_value(k, v)?);
    }
    let before = ctx.quorum.image();
    controller_write(&ctx, ControllerRequest::AlterConfigs { name: name.clone(), changes: changes.clone() }).await?;
    let image = ctx.quorum.image();
    let configs = match image.topics.get(&name) {
        Some(topic) => topic.configs.clone(),
        // A later write deleted the topic before this answer: the change was made, so
        // answer with what it made of the configs this node knew, not 404.
        None => {
            let mut configs = before.topics.get(&name).map(|t| t.configs.clone()).unwrap_or_default();
            for (key, value) in changes {
                match value {
                    Some(v) => configs.insert(key, v),
                    None => configs.remove(&key),
                };
            }
            configs
        }
    };
    Ok(Json(json!(ctx.settings.for_broker(&image, ctx.broker_id).topic_effective(&configs))))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ElectLeader {
    #[serde(rename = "type")]
    election: String,
}

pub async fn elect_leader(
    State(ctx): Ctx,
    Path((topic, partition)): Path<(String, String)>,
    JsonBody(body): JsonBody<ElectLeader>,
) -> ApiResult<Json<Value>> {
    let partition: i32 = partition
        .parse()
        .map_err(|_| ApiError::new(ErrorCode::InvalidRequest, format!("partition `{partition}` is not a number")))?;
    let election = match body.election.as_str() {
        "preferred" => ElectionType::Preferred,
        "unclean" => ElectionType::Unclean,
        other => {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                format!("election type must be \"preferred\" or \"unclean\", got {other:?}"),
            )
            .into())
        }
    };
    controller_write(&ctx, ControllerRequest::ElectLeader { topic: topic.clone(), partition, election }).await?;
    let image = ctx.quorum.image();
    let p = image.topics.get(&topic).and_then(|t| t.partitions.get(&partition)).ok_or_else(|| unknown_topic(&topic))?;
    let offsets = leader_offsets(&ctx, &image, image.topics.get(&topic).ok_or_else(|| unknown_topic(&topic))?).await;
    let progress = reassignment_progress(&ctx, &image, &[(topic.clone(), partition)]).await;
    Ok(Json(partition_json(&image, partition, p, offsets.get(&partition), progress.get(&(topic, partition)).copied())))
}
