//! Changing a broker's role: drain it for retirement (decommission), put it
//! in maintenance (it keeps its replicas and leads nothing), unregister it
//! when it is dead or drained and empty. The controller decides
//! (`controller/drain.rs`); these answer once this node has applied it.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde_json::Value;

use super::cluster::broker_json;
use super::{controller_write, ApiResult, Ctx};
use crate::controller::drain;
use crate::controller::protocol::ControllerRequest;
use crate::error::{ApiError, ErrorCode};
use crate::node::NodeContext;

fn parse_id(id: &str) -> Result<i32, ApiError> {
    id.parse().map_err(|_| ApiError::new(ErrorCode::InvalidRequest, format!("broker id `{id}` is not a number")))
}

fn broker_now(ctx: &NodeContext, id: i32) -> ApiResult<Json<Value>> {
    let image = ctx.quorum.image();
    let b = drain::require_registered(&image, id)?;
    Ok(Json(broker_json(ctx, &image, b)))
}

pub async fn describe(State(ctx): Ctx, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    broker_now(&ctx, parse_id(&id)?)
}

/// Starts draining: 202 with the broker and its `decommission` progress.
pub async fn decommission(State(ctx): Ctx, Path(id): Path<String>) -> ApiResult<(StatusCode, Json<Value>)> {
    let broker_id = parse_id(&id)?;
    controller_write(&ctx, ControllerRequest::Decommission { broker_id, on: true }).await?;
    // A broker that held nothing is unregistered at once.
    match broker_now(&ctx, broker_id) {
        Ok(b) => Ok((StatusCode::ACCEPTED, b)),
        Err(_) => Ok((
            StatusCode::ACCEPTED,
            Json(serde_json::json!({"id": broker_id, "decommission": {"state": "done", "replicas_left": 0}})),
        )),
    }
}

/// Stops a drain: 200 with the broker.
pub async fn stop_decommission(State(ctx): Ctx, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    let broker_id = parse_id(&id)?;
    controller_write(&ctx, ControllerRequest::Decommission { broker_id, on: false }).await?;
    broker_now(&ctx, broker_id)
}

pub async fn enter_maintenance(State(ctx): Ctx, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    let broker_id = parse_id(&id)?;
    controller_write(&ctx, ControllerRequest::SetMaintenance { broker_id, on: true }).await?;
    broker_now(&ctx, broker_id)
}

pub async fn leave_maintenance(State(ctx): Ctx, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    let broker_id = parse_id(&id)?;
    controller_write(&ctx, ControllerRequest::SetMaintenance { broker_id, on: false }).await?;
    broker_now(&ctx, broker_id)
}

/// Unregisters a fenced or drained broker that holds no replica: 204.
pub async fn unregister(State(ctx): Ctx, Path(id): Path<String>) -> ApiResult<StatusCode> {
    let broker_id = parse_id(&id)?;
    controller_write(&ctx, ControllerRequest::Unregister { broker_id }).await?;
    Ok(StatusCode::NO_CONTENT)
}
