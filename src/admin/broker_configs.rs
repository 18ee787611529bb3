//! `GET/PATCH /v1/brokers/configs`: the cluster-wide dynamic broker settings
//! (KIP-226's default broker resource), such as the replication throttles.
//! A change is a metadata Config record, so every broker applies it at
//! runtime; the same store AlterConfigs on the broker resource `""` writes.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use super::topics::config_value;
use super::{controller_write, ApiResult, Ctx, JsonBody};
use crate::config::BROKER_SETTINGS;
use crate::controller::protocol::ControllerRequest;
use crate::node::NodeContext;

/// Every dynamic setting with its cluster-wide value in force: a dynamic
/// override, else this node's static value (null when unset).
fn dynamic_settings(ctx: &NodeContext) -> Value {
    let image = ctx.quorum.image();
    let cluster = ctx.settings.layered(&image.broker_configs);
    let values: BTreeMap<&str, Option<String>> =
        BROKER_SETTINGS.iter().filter(|d| d.dynamic).map(|d| (d.name, cluster.get(d.name))).collect();
    json!(values)
}

pub async fn get(State(ctx): Ctx) -> Json<Value> {
    Json(dynamic_settings(&ctx))
}

/// `{key: value}` sets, `{key: null}` returns to the static value; all or
/// nothing. 400 INVALID_CONFIG for an unknown key, INVALID_REQUEST for a
/// setting that cannot change at runtime or a bad value.
pub async fn patch(State(ctx): Ctx, JsonBody(body): JsonBody<BTreeMap<String, Value>>) -> ApiResult<Json<Value>> {
    let mut changes = BTreeMap::new();
    for (k, v) in &body {
        changes.insert(k.clone(), config_value(k, v)?);
    }
    controller_write(&ctx, ControllerRequest::AlterBrokerConfigs { broker_id: None, changes }).await?;
    Ok(Json(dynamic_settings(&ctx)))
}
