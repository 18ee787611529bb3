//! Partition reassignment endpoints (KIP-455 through the admin API): start
//! or replace a move, cancel it, list what runs with the bytes left.
//!
//! The bytes left are the leader's to know (how far each adding replica has
//! fetched), so they are asked of each leader like the offsets are; a leader
//! that does not answer within a second leaves them null.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use strom_raft::MetadataImage;

use super::topics::{leader_offsets, partition_json, unknown_topic};
use super::{controller_write, ApiResult, Ctx, JsonBody};
use crate::controller::protocol::ControllerRequest;
use crate::error::{ApiError, ErrorCode};
use crate::node::NodeContext;

/// Bytes left to copy per reassigning (topic, partition), as leaders report them.
pub type Progress = HashMap<(String, i32), u64>;

/// The bytes left of the reassigning partitions this node leads.
fn local_progress(ctx: &NodeContext, image: &MetadataImage) -> Vec<(String, i32, u64)> {
    let mut rows = Vec::new();
    for topic in image.topics.values() {
        for (&i, p) in topic.partitions.iter().filter(|(_, p)| p.is_reassigning() && p.leader == Some(ctx.broker_id)) {
            let Some(partition) = ctx.replicas.get(&topic.name, i) else { continue };
            match partition.bytes_behind(&p.adding_replicas) {
                Ok(bytes) => rows.push((topic.name.clone(), i, bytes)),
                Err(e) => tracing::debug!(topic = %topic.name, partition = i, error = %e, "no reassignment progress"),
            }
        }
    }
    rows
}

/// The bytes left of each of `partitions` that is being reassigned, asked
/// of its leader.
pub async fn reassignment_progress(ctx: &NodeContext, image: &MetadataImage, partitions: &[(String, i32)]) -> Progress {
    let leaders: BTreeMap<i32, ()> = partitions
        .iter()
        .filter_map(|(t, i)| image.topics.get(t)?.partitions.get(i))
        .filter(|p| p.is_reassigning())
        .filter_map(|p| p.leader)
        .filter(|l| image.is_active(*l))
        .map(|l| (l, ()))
        .collect();
    if leaders.is_empty() {
        return Progress::new();
    }
    ctx.data_plane_current().await;
    let http = ctx.admin_security.peer_client(Duration::from_secs(1));
    let mut rows = Vec::new();
    let asks = leaders.keys().filter(|l| **l != ctx.broker_id).filter_map(|l| image.brokers.get(l)).map(|b| {
        let request = http.get(&b.admin, "/v1/internal/reassignment-progress");
        async move { request.send().await.ok()?.json::<Vec<(String, i32, u64)>>().await.ok() }
    });
    if leaders.contains_key(&ctx.broker_id) {
        rows.extend(local_progress(ctx, image));
    }
    for answer in futures_util::future::join_all(asks).await.into_iter().flatten() {
        rows.extend(answer);
    }
    rows.into_iter().map(|(t, i, bytes)| ((t, i), bytes)).collect()
}

/// `[[topic, partition, bytes left]]` for the reassigning partitions led here.
pub async fn internal_progress(State(ctx): Ctx) -> Json<Value> {
    ctx.data_plane_current().await;
    Json(json!(local_progress(&ctx, &ctx.quorum.image())))
}

fn parse_partition(partition: &str) -> Result<i32, ApiError> {
    partition
        .parse()
        .map_err(|_| ApiError::new(ErrorCode::InvalidRequest, format!("partition `{partition}` is not a number")))
}

async fn partition_now(ctx: &NodeContext, topic: &str, partition: i32) -> ApiResult<Json<Value>> {
    let image = ctx.quorum.image();
    let t = image.topics.get(topic).ok_or_else(|| unknown_topic(topic))?;
    let p = t.partitions.get(&partition).ok_or_else(|| {
        ApiError::new(ErrorCode::UnknownTopicOrPartition, format!("no partition {topic}-{partition}"))
    })?;
    let offsets = leader_offsets(ctx, &image, t).await;
    let progress = reassignment_progress(ctx, &image, &[(topic.to_string(), partition)]).await;
    let bytes_left = progress.get(&(topic.to_string(), partition)).copied();
    Ok(Json(partition_json(&image, partition, p, offsets.get(&partition), bytes_left)))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reassign {
    replicas: Vec<i32>,
}

/// Starts (or replaces) a reassignment: 202 with the partition.
pub async fn start(
    State(ctx): Ctx,
    Path((topic, partition)): Path<(String, String)>,
    JsonBody(body): JsonBody<Reassign>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let partition = parse_partition(&partition)?;
    let request = ControllerRequest::Reassign { topic: topic.clone(), partition, target: Some(body.replicas) };
    controller_write(&ctx, request).await?;
    Ok((StatusCode::ACCEPTED, partition_now(&ctx, &topic, partition).await?))
}

/// Cancels the running reassignment: 200 with the partition.
pub async fn cancel(State(ctx): Ctx, Path((topic, partition)): Path<(String, String)>) -> ApiResult<Json<Value>> {
    let partition = parse_partition(&partition)?;
    controller_write(&ctx, ControllerRequest::Reassign { topic: topic.clone(), partition, target: None }).await?;
    partition_now(&ctx, &topic, partition).await
}

/// Every running reassignment.
pub async fn list(State(ctx): Ctx) -> Json<Value> {
    let image = ctx.quorum.image();
    let moving: Vec<(String, i32)> = image
        .topics
        .values()
        .flat_map(|t| t.partitions.iter().filter(|(_, p)| p.is_reassigning()).map(|(i, _)| (t.name.clone(), *i)))
        .collect();
    let progress = reassignment_progress(&ctx, &image, &moving).await;
    let rows: Vec<Value> = moving
        .iter()
        .filter_map(|(t, i)| {
            let p = image.topics.get(t)?.partitions.get(i)?;
            Some(json!({
                "topic": t,
                "partition": i,
                "replicas": p.replicas,
                "target": p.target_replicas(),
                "adding": p.adding_replicas,
                "removing": p.removing_replicas,
                "bytes_left": progress.get(&(t.clone(), *i)),
            }))
        })
        .collect();
    Json(json!(rows))
}
