//! The metadata quorum's membership (KIP-853 through the admin API): describe
//! it, promote a caught-up observer to voter, turn a voter into an observer.
//! The controller decides (`controller/voters.rs`); openraft changes the
//! voters by joint consensus, and the change is in the log, so it survives
//! restarts of every node.
//!
//! Match indexes and lags are the leader's to know: another node asks the
//! leader, and shows them as null when the leader does not answer.

use std::time::Duration;

use axum::extract::{Path, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{controller_write, ApiResult, Ctx, JsonBody};
use crate::controller::protocol::ControllerRequest;
use crate::error::{ApiError, ErrorCode};
use crate::node::NodeContext;

/// The quorum as this node sees it; match indexes only if it leads.
fn local_view(ctx: &NodeContext) -> Value {
    let m = ctx.quorum.metrics();
    let membership = m.membership_config.membership();
    let leads = ctx.quorum.is_leader();
    let matched = ctx.quorum.match_indexes();
    let last = ctx.quorum.last_log_index();
    let member = |id: u64| {
        let match_index = if !leads {
            None
        } else if id == ctx.quorum.node_id() {
            Some(last)
        } else {
            matched.get(&id).copied()
        };
        json!({
            "id": id,
            "raft": membership.get_node(&id).map(|n| n.addr.clone()),
            "match_index": match_index,
            "lag": match_index.map(|i| last.saturating_sub(i)),
        })
    };
    json!({
        "leader_id": m.current_leader,
        "term": m.current_term,
        "commit_index": m.last_applied.map_or(0, |l| l.index),
        "voters": membership.voter_ids().map(member).collect::<Vec<_>>(),
        "observers": membership.learner_ids().map(member).collect::<Vec<_>>(),
    })
}

/// The leader's view when it answers within a second, else this node's.
pub async fn view(ctx: &NodeContext) -> Value {
    if ctx.quorum.is_leader() {
        return local_view(ctx);
    }
    let image = ctx.quorum.image();
    let leader_admin = ctx
        .quorum
        .leader()
        .and_then(|l| i32::try_from(l).ok())
        .and_then(|l| image.brokers.get(&l))
        .map(|b| b.admin.clone());
    if let Some(admin) = leader_admin {
        let http = ctx.admin_security.peer_client(Duration::from_secs(1));
        if let Ok(resp) = http.get(&admin, "/v1/internal/quorum").send().await {
            if let Ok(v) = resp.json::<Value>().await {
                return v;
            }
        }
    }
    local_view(ctx)
}

pub async fn describe(State(ctx): Ctx) -> Json<Value> {
    Json(view(&ctx).await)
}

pub async fn internal(State(ctx): Ctx) -> Json<Value> {
    Json(local_view(&ctx))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddVoter {
    id: u64,
}

/// Promotes a caught-up observer: 200 with the quorum.
pub async fn add_voter(State(ctx): Ctx, JsonBody(body): JsonBody<AddVoter>) -> ApiResult<Json<Value>> {
    controller_write(&ctx, ControllerRequest::AddVoter { node_id: body.id }).await?;
    Ok(Json(view(&ctx).await))
}

/// Turns a voter into an observer: 200 with the quorum.
pub async fn remove_voter(State(ctx): Ctx, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    let node_id: u64 =
        id.parse().map_err(|_| ApiError::new(ErrorCode::InvalidRequest, format!("node id `{id}` is not a number")))?;
    controller_write(&ctx, ControllerRequest::RemoveVoter { node_id }).await?;
    Ok(Json(view(&ctx).await))
}
