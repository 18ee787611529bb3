//! `/v1/quotas`: client quotas, the same records as Kafka's
//! AlterClientQuotas and DescribeClientQuotas.

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use strom_raft::records::{EntityName, QuotaEntity};

use super::{controller_write, ApiResult, Ctx, JsonBody};
use crate::controller::protocol::ControllerRequest;
use crate::error::{ApiError, ErrorCode};
use crate::security::quotas;

fn name_json(n: &EntityName) -> Value {
    match n {
        EntityName::Unset => Value::Null,
        EntityName::Default => json!("<default>"),
        EntityName::Named(s) => json!(s),
    }
}

/// Every entity with quotas: `[{"user", "client_id", "quotas": {key: value}}]`;
/// `user` / `client_id` are a name, `"<default>"`, or null when not part of it.
pub async fn list(State(ctx): Ctx) -> Json<Vec<Value>> {
    let image = ctx.quorum.image();
    Json(
        image
            .client_quotas
            .iter()
            .map(|(e, values)| json!({"user": name_json(&e.user), "client_id": name_json(&e.client_id), "quotas": values}))
            .collect(),
    )
}

/// One entity's quota changes.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaChanges {
    /// A user name, `"<default>"`, or absent.
    user: Option<String>,
    /// A client id, `"<default>"`, or absent.
    client_id: Option<String>,
    /// `{key: value}` sets, `{key: null}` removes.
    quotas: std::collections::BTreeMap<String, Option<f64>>,
}

fn entity_name(n: Option<String>) -> EntityName {
    match n.as_deref() {
        None => EntityName::Unset,
        Some("<default>") => EntityName::Default,
        Some(_) => EntityName::Named(n.unwrap_or_default()),
    }
}

/// Sets or removes one entity's quotas, all or nothing: 200 with every entity's quotas.
pub async fn patch(State(ctx): Ctx, JsonBody(body): JsonBody<QuotaChanges>) -> ApiResult<Json<Vec<Value>>> {
    let entity = QuotaEntity { user: entity_name(body.user), client_id: entity_name(body.client_id) };
    if body.quotas.is_empty() {
        return Err(ApiError::new(ErrorCode::InvalidRequest, "`quotas` names no quota to set or remove").into());
    }
    let mut changes = Vec::new();
    for (key, value) in body.quotas {
        quotas::check(&entity, &key, value)?;
        changes.push((entity.clone(), key, value));
    }
    controller_write(&ctx, ControllerRequest::AlterClientQuotas { changes }).await?;
    Ok(list(State(ctx)).await)
}
