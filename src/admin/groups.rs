//! The consumer-group endpoints. Each broker knows only the groups it
//! coordinates (`/v1/internal/groups`); the public endpoints ask every live
//! broker and merge, then add log end offsets and lag from the partitions'
//! leaders. A classic group's assignments are decoded from the consumer
//! protocol's bytes, so the view shows what the clients' assignor (range,
//! round robin, …) decided; a consumer-protocol group (KIP-848) shows the
//! broker's assignor, each member's epoch, what it owns and its target.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::Json;
use serde_json::{json, Value};

use super::topics::leader_offsets;
use super::{ApiResult, Ctx, HttpError};
use crate::error::{ApiError, ErrorCode};
use crate::group::assignment::decode_assignment;
use crate::group::consumer::{Assignment, ConsumerGroup};
use crate::node::NodeContext;

/// The groups this broker coordinates, with members, decoded assignments
/// and committed offsets (`[topic, partition, offset]`).
fn local_groups(ctx: &NodeContext) -> Vec<Value> {
    let Ok(listing) = ctx.groups.list() else { return Vec::new() };
    let image = ctx.quorum.image();
    listing
        .into_iter()
        .filter_map(|g| ctx.groups.describe(ctx.groups.partition_of(&image, &g.group_id), &g.group_id).ok().flatten())
        .map(|d| {
            let members: Vec<Value> = d
                .members
                .iter()
                .map(|m| {
                    let assignment: Vec<Value> = decode_assignment(&m.assignment)
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(topic, partitions)| json!({"topic": topic, "partitions": partitions}))
                        .collect();
                    json!({
                        "member_id": m.member_id,
                        "instance_id": m.instance_id,
                        "client_id": m.client_id,
                        "host": m.client_host,
                        "assignment": assignment,
                    })
                })
                .collect();
            let committed: Vec<(String, i32, i64)> = d.offsets.iter().map(|((t, p), o)| (t.clone(), *p, *o)).collect();
            if let Some(c) = &d.consumer {
                return consumer_group(&image, &d.group_id, d.state_name, c, committed);
            }
            json!({
                "group_id": d.group_id,
                "group_protocol": "classic",
                "state": d.state_name,
                "generation": d.generation,
                "protocol_type": d.protocol_type,
                "protocol": if d.protocol.is_empty() { Value::Null } else { json!(d.protocol) },
                "members": members,
                "committed": committed,
            })
        })
        .collect()
}

/// `[{topic, partitions}]` of an assignment by topic id.
fn named(image: &strom_raft::MetadataImage, a: Option<&Assignment>) -> Vec<Value> {
    let names: BTreeMap<strom_raft::TopicId, &String> = image.topics.iter().map(|(n, t)| (t.topic_id, n)).collect();
    a.into_iter()
        .flatten()
        .map(|(id, ps)| {
            let topic = names.get(id).map_or_else(|| id.to_string(), |n| n.to_string());
            json!({"topic": topic, "partitions": ps})
        })
        .collect()
}

/// A group of the consumer protocol (KIP-848): the broker's assignor, the
/// group and assignment epochs, and per member its epoch, what it owns and
/// its target. `generation` is the group epoch.
fn consumer_group(
    image: &strom_raft::MetadataImage,
    id: &str,
    state: &str,
    c: &ConsumerGroup,
    committed: Vec<(String, i32, i64)>,
) -> Value {
    let members: Vec<Value> = c
        .members
        .values()
        .map(|m| {
            json!({
                "member_id": m.id,
                "instance_id": m.instance_id,
                "client_id": m.client_id,
                "host": m.client_host,
                "member_type": if m.is_classic() { "classic" } else { "consumer" },
                "member_epoch": m.epoch,
                "member_state": m.state.name(),
                "subscribed_topics": m.topics,
                "subscribed_regex": m.regex,
                "assignment": named(image, Some(&m.assigned)),
                "revoking": named(image, Some(&m.revoking)),
                "target_assignment": named(image, c.target.get(&m.id)),
            })
        })
        .collect();
    json!({
        "group_id": id,
        "group_protocol": "consumer",
        "state": state,
        "generation": c.group_epoch,
        "assignment_epoch": c.assignment_epoch,
        "protocol_type": "consumer",
        "protocol": c.assignor,
        "assignor": c.assignor,
        "members": members,
        "committed": committed,
    })
}

pub async fn internal_groups(State(ctx): Ctx) -> Json<Vec<Value>> {
    Json(local_groups(&ctx))
}

/// Every group in the cluster, from each live broker; a broker that does not
/// answer within a second is left out.
async fn all_groups(ctx: &NodeContext) -> Vec<Value> {
    let image = ctx.quorum.image();
    let mut groups = local_groups(ctx);
    let http = ctx.admin_security.peer_client(Duration::from_secs(1));
    let asks =
        image.brokers.values().filter(|b| b.broker_id != ctx.broker_id && image.is_active(b.broker_id)).map(|b| {
            let request = http.get(&b.admin, "/v1/internal/groups");
            async move { request.send().await.ok()?.json::<Vec<Value>>().await.ok() }
        });
    for answer in futures_util::future::join_all(asks).await.into_iter().flatten() {
        groups.extend(answer);
    }
    // During a coordinator move two brokers may both answer: keep the higher generation.
    let mut by_id: BTreeMap<String, Value> = BTreeMap::new();
    for g in groups {
        let id = g["group_id"].as_str().unwrap_or_default().to_string();
        let newer = by_id.get(&id).is_none_or(|old| g["generation"].as_i64() > old["generation"].as_i64());
        if newer {
            by_id.insert(id, g);
        }
    }
    by_id.into_values().collect()
}

pub async fn list(State(ctx): Ctx) -> Json<Vec<Value>> {
    let groups = all_groups(&ctx).await;
    Json(
        groups
            .into_iter()
            .map(|g| {
                json!({
                    "group_id": g["group_id"],
                    "group_protocol": g["group_protocol"],
                    "state": g["state"],
                    "members": g["members"].as_array().map_or(0, Vec::len),
                    "protocol": g["protocol"],
                })
            })
            .collect(),
    )
}

/// Committed offsets as the admin API stores them: (topic, partition, offset).
type CommittedRows = Vec<(String, i32, i64)>;
/// High watermarks by topic and partition.
type Ends = BTreeMap<String, BTreeMap<i32, i64>>;

/// The high watermark of every partition of `topics`, each topic asked of its leaders once.
async fn high_watermarks(ctx: &NodeContext, committed: &[&CommittedRows]) -> Ends {
    let topics: std::collections::BTreeSet<String> =
        committed.iter().flat_map(|rows| rows.iter().map(|(t, _, _)| t.clone())).collect();
    let image = ctx.quorum.image();
    let mut ends = Ends::new();
    for topic in topics {
        if let Some(t) = image.topics.get(&topic) {
            let offsets = leader_offsets(ctx, &image, t).await;
            ends.insert(topic, offsets.into_iter().map(|(p, o)| (p, o.high_watermark)).collect());
        }
    }
    ends
}

/// `[{topic, partition, committed, log_end_offset, lag}]` for a group's
/// committed offsets; the log end is the high watermark (what a consumer can
/// reach), null when the partition's leader does not answer.
fn lag_rows(committed: &CommittedRows, ends: &Ends) -> Vec<Value> {
    committed
        .iter()
        .map(|(topic, partition, offset)| {
            let end = ends.get(topic).and_then(|e| e.get(partition)).copied();
            json!({
                "topic": topic,
                "partition": partition,
                "committed": offset,
                "log_end_offset": end,
                "lag": end.map(|e| (e - offset).max(0)),
            })
        })
        .collect()
}

pub async fn describe(State(ctx): Ctx, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    let groups = all_groups(&ctx).await;
    let Some(g) = groups.into_iter().find(|g| g["group_id"] == id.as_str()) else {
        return Err(HttpError(ApiError::new(ErrorCode::GroupIdNotFound, format!("no consumer group `{id}`"))));
    };
    let committed: CommittedRows = serde_json::from_value(g["committed"].clone()).unwrap_or_default();
    let ends = high_watermarks(&ctx, &[&committed]).await;
    let offsets = lag_rows(&committed, &ends);
    let mut out = json!({
        "group_id": g["group_id"],
        "group_protocol": g["group_protocol"],
        "state": g["state"],
        "generation": g["generation"],
        "protocol_type": g["protocol_type"],
        "protocol": g["protocol"],
        "members": g["members"],
        "offsets": offsets,
    });
    if g["group_protocol"] == "consumer" {
        out["assignor"] = g["assignor"].clone();
        out["assignment_epoch"] = g["assignment_epoch"].clone();
    }
    Ok(Json(out))
}

/// Prometheus lines for the lag of every group this broker coordinates.
pub async fn lag_metrics(ctx: &NodeContext) -> String {
    let mut out = String::from(
        "# HELP strom_consumer_group_lag Records between a group's committed offset and the high watermark.\n\
         # TYPE strom_consumer_group_lag gauge\n",
    );
    let groups: Vec<(String, CommittedRows)> = local_groups(ctx)
        .into_iter()
        .map(|g| {
            let id = g["group_id"].as_str().unwrap_or_default().replace(['\\', '"', '\n'], "_");
            (id, serde_json::from_value(g["committed"].clone()).unwrap_or_default())
        })
        .collect();
    let all: Vec<&CommittedRows> = groups.iter().map(|(_, c)| c).collect();
    let ends = high_watermarks(ctx, &all).await;
    for (group, committed) in &groups {
        for row in lag_rows(committed, &ends) {
            if let Some(lag) = row["lag"].as_i64() {
                out.push_str(&format!(
                    "strom_consumer_group_lag{{group=\"{group}\",topic=\"{}\",partition=\"{}\"}} {lag}\n",
                    row["topic"].as_str().unwrap_or_default(),
                    row["partition"]
                ));
            }
        }
    }
    out
}
