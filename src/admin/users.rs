//! `/v1/users`: SCRAM users, kept as credentials in the metadata quorum
//! (never a password). The same store as Kafka's AlterUserScramCredentials.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{controller_write, ApiResult, Ctx, HttpError, JsonBody};
use crate::controller::protocol::ControllerRequest;
use crate::error::{ApiError, ErrorCode};
use crate::node::NodeContext;
use crate::security::scram::{self, ScramMechanism};
use crate::security::users;

fn view(ctx: &NodeContext, only: Option<&str>) -> Vec<Value> {
    users::list(&ctx.quorum.image())
        .into_iter()
        .filter(|(name, _)| only.is_none_or(|o| o == name))
        .map(|(name, mechanisms)| {
            let names: Vec<&str> = mechanisms.iter().map(|(m, _)| m.name()).collect();
            json!({"name": name, "mechanisms": names})
        })
        .collect()
}

pub async fn list(State(ctx): Ctx) -> Json<Vec<Value>> {
    Json(view(&ctx, None))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewUser {
    name: String,
    password: String,
    /// One mechanism; both when absent.
    mechanism: Option<String>,
    iterations: Option<i64>,
}

/// Creates a user, or sets a new password for one: 201 with the user.
pub async fn create(State(ctx): Ctx, JsonBody(body): JsonBody<NewUser>) -> ApiResult<(StatusCode, Json<Value>)> {
    users::check_name(&body.name)?;
    if body.password.is_empty() {
        return Err(ApiError::new(ErrorCode::UnacceptableCredential, "the password must not be empty").into());
    }
    let mechanisms = match body.mechanism.as_deref() {
        None => ScramMechanism::ALL.to_vec(),
        Some(m) => vec![ScramMechanism::from_name(m).ok_or_else(|| {
            ApiError::new(
                ErrorCode::UnsupportedSaslMechanism,
                format!("mechanism `{m}` is not SCRAM-SHA-256 or SCRAM-SHA-512"),
            )
        })?],
    };
    let iterations = users::check_iterations(body.iterations.unwrap_or(scram::DEFAULT_ITERATIONS as i64))?;
    let password = body.password.clone();
    let changes = tokio::task::spawn_blocking(move || {
        mechanisms
            .into_iter()
            .map(|m| {
                let credential = scram::credential_from_password(m, password.as_bytes(), iterations);
                (body.name.clone(), m.kafka_code(), Some(users::to_record(credential)))
            })
            .collect::<Vec<_>>()
    })
    .await
    .map_err(|e| ApiError::new(ErrorCode::UnknownServerError, e.to_string()))?;
    let name = changes[0].0.clone();
    controller_write(&ctx, ControllerRequest::AlterScramCredentials { changes }).await?;
    let user = view(&ctx, Some(&name)).pop().unwrap_or(Value::Null);
    Ok((StatusCode::CREATED, Json(user)))
}

/// Removes every credential of a user: 204, or 404 RESOURCE_NOT_FOUND.
pub async fn delete(State(ctx): Ctx, Path(name): Path<String>) -> ApiResult<StatusCode> {
    let image = ctx.quorum.image();
    let Some(creds) = image.scram_credentials.get(&name) else {
        return Err(HttpError(ApiError::new(ErrorCode::ResourceNotFound, format!("no user {name}"))));
    };
    let changes = creds.keys().map(|m| (name.clone(), *m, None)).collect();
    controller_write(&ctx, ControllerRequest::AlterScramCredentials { changes }).await?;
    Ok(StatusCode::NO_CONTENT)
}
