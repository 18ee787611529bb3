//! Cluster-wide reads: health, readiness, cluster and brokers, metrics.

use std::fmt::Write;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde_json::{json, Value};

use strom_raft::{BrokerRegistration, MetadataImage};

use super::Ctx;
use crate::controller::drain;
use crate::node::NodeContext;

pub async fn health() -> impl IntoResponse {
    Json(json!({"status": "ok"}))
}

pub async fn ready(State(ctx): Ctx) -> impl IntoResponse {
    let state = ctx.lifecycle.state();
    let ready = ctx.lifecycle.is_ready();
    let body = json!({
        "ready": ready,
        "broker_state": state.map(|s| s.as_str()),
        "controller_id": ctx.quorum.leader(),
        "applied_index": ctx.quorum.applied_index(),
    });
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(body))
}

pub async fn metrics(State(ctx): Ctx) -> impl IntoResponse {
    let mut body = ctx.metrics.render(&ctx.quorum);
    body.push_str(&super::groups::lag_metrics(&ctx).await);
    let _ = write!(
        body,
        "# HELP strom_fetch_sessions Incremental fetch sessions (KIP-227) held by this broker.\n\
         # TYPE strom_fetch_sessions gauge\n"
    );
    let mut partitions = String::from(
        "# HELP strom_fetch_session_partitions Partitions in those sessions.\n\
         # TYPE strom_fetch_session_partitions gauge\n",
    );
    for (kind, followers) in [("consumer", false), ("follower", true)] {
        let (n, parts) = ctx.fetch_sessions.stats(followers);
        let _ = writeln!(body, "strom_fetch_sessions{{kind=\"{kind}\"}} {n}");
        let _ = writeln!(partitions, "strom_fetch_session_partitions{{kind=\"{kind}\"}} {parts}");
    }
    body.push_str(&partitions);
    let _ = writeln!(
        body,
        "# HELP strom_fetch_sessions_opened_total Fetch sessions opened since start.\n\
         # TYPE strom_fetch_sessions_opened_total counter\n\
         strom_fetch_sessions_opened_total{{kind=\"consumer\"}} {}\n\
         strom_fetch_sessions_opened_total{{kind=\"follower\"}} {}",
        ctx.fetch_sessions.opened(false),
        ctx.fetch_sessions.opened(true)
    );
    ([("content-type", "text/plain; version=0.0.4")], body)
}

/// One broker as the API shows it: addresses, state, replica and leader
/// counts, maintenance, and the drain's progress while it is decommissioned.
pub(super) fn broker_json(ctx: &NodeContext, image: &MetadataImage, b: &BrokerRegistration) -> Value {
    let replicas = drain::replica_counts(image).get(&b.broker_id).copied().unwrap_or(0);
    let leaders = drain::leader_counts(image).get(&b.broker_id).copied().unwrap_or(0);
    json!({
        "id": b.broker_id,
        "kafka": b.kafka,
        // Every Kafka listener's advertised address by name (`kafka` is the
        // inter-broker one).
        "listeners": b.listeners.iter().cloned().collect::<std::collections::BTreeMap<String, String>>(),
        "admin": b.admin,
        "state": b.state.as_str(),
        "is_controller": ctx.quorum.leader() == Some(b.broker_id as u64),
        "rack": b.rack,
        "replicas": replicas,
        "leaders": leaders,
        "maintenance": b.maintenance,
        "decommission": b.decommissioning.then(|| json!({
            "state": if replicas == 0 { "done" } else { "draining" },
            "replicas_left": replicas,
        })),
    })
}

fn brokers_json(ctx: &NodeContext) -> Vec<Value> {
    let image = ctx.quorum.image();
    image.brokers.values().map(|b| broker_json(ctx, &image, b)).collect()
}

pub async fn brokers(State(ctx): Ctx) -> Json<Vec<Value>> {
    Json(brokers_json(&ctx))
}

pub async fn cluster(State(ctx): Ctx) -> Json<Value> {
    let m = ctx.quorum.metrics();
    let image = ctx.quorum.image();
    let voters: Vec<u64> = m.membership_config.membership().voter_ids().collect();
    let observers: Vec<u64> = m.membership_config.membership().learner_ids().collect();
    Json(json!({
        "cluster_id": image.cluster_id,
        "controller_id": m.current_leader,
        "quorum": {
            "leader_id": m.current_leader,
            "term": m.current_term,
            "commit_index": m.last_applied.map_or(0, |l| l.index),
            "voters": voters,
            "observers": observers,
        },
        "brokers": brokers_json(&ctx),
    }))
}
