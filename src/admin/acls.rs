//! `/v1/acls`: ACLs in Kafka's model, the same records CreateAcls,
//! DescribeAcls and DeleteAcls read and write.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use strom_raft::records::AclBinding;

use super::{controller_write, ApiResult, Ctx, JsonBody};
use crate::controller::protocol::ControllerRequest;
use crate::error::{ApiError, ErrorCode};
use crate::security::acl::{self, AclFilter, Operation, PatternType, Permission, ResourceType};

/// An ACL as the API shows it (CONTRACT §6's acl object).
pub fn view(b: &AclBinding) -> Value {
    let name = |code: i8, f: fn(i8) -> Option<&'static str>| f(code).unwrap_or("unknown");
    json!({
        "principal": b.principal,
        "host": b.host,
        "resource_type": name(b.resource_type, |c| ResourceType::from_code(c).map(ResourceType::name)),
        "resource_name": b.resource_name,
        "pattern_type": name(b.pattern_type, |c| PatternType::from_code(c).map(PatternType::name)),
        "operation": name(b.operation, |c| Operation::from_code(c).map(Operation::name)),
        "permission": name(b.permission, |c| Permission::from_code(c).map(Permission::name)),
    })
}

/// The acl object, every field optional (a filter when deleting).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AclBody {
    principal: Option<String>,
    host: Option<String>,
    resource_type: Option<String>,
    resource_name: Option<String>,
    pattern_type: Option<String>,
    operation: Option<String>,
    permission: Option<String>,
}

fn bad(message: String) -> ApiError {
    ApiError::new(ErrorCode::InvalidRequest, message)
}

fn code<T: Copy>(
    field: &str,
    value: &Option<String>,
    parse: fn(&str) -> Option<T>,
    to: fn(T) -> i8,
) -> Result<Option<i8>, ApiError> {
    match value {
        None => Ok(None),
        Some(v) => parse(v).map(|x| Some(to(x))).ok_or_else(|| bad(format!("{field} `{v}` is not one of Kafka's"))),
    }
}

impl AclBody {
    fn filter(&self) -> Result<AclFilter, ApiError> {
        Ok(AclFilter {
            resource_type: code("resource_type", &self.resource_type, ResourceType::from_name, ResourceType::code)?,
            resource_name: self.resource_name.clone(),
            pattern_type: code("pattern_type", &self.pattern_type, PatternType::from_name, PatternType::code)?,
            principal: self.principal.clone(),
            host: self.host.clone(),
            operation: code("operation", &self.operation, Operation::from_name, Operation::code)?,
            permission: code("permission", &self.permission, Permission::from_name, Permission::code)?,
        })
    }

    /// A whole ACL: `host` defaults to `*`, `pattern_type` to literal, and
    /// the cluster resource's name to `kafka-cluster`.
    fn binding(&self) -> Result<AclBinding, ApiError> {
        let f = self.filter()?;
        let missing = |field: &str| bad(format!("`{field}` is required"));
        let resource_type = f.resource_type.ok_or_else(|| missing("resource_type"))?;
        let resource_name = match (f.resource_name, resource_type == ResourceType::Cluster.code()) {
            (Some(name), _) => name,
            (None, true) => acl::CLUSTER_NAME.to_string(),
            (None, false) => return Err(missing("resource_name")),
        };
        let binding = AclBinding {
            resource_type,
            resource_name,
            pattern_type: f.pattern_type.unwrap_or(PatternType::Literal.code()),
            principal: f.principal.ok_or_else(|| missing("principal"))?,
            host: f.host.unwrap_or_else(|| "*".into()),
            operation: f.operation.ok_or_else(|| missing("operation"))?,
            permission: f.permission.ok_or_else(|| missing("permission"))?,
        };
        acl::check_binding(&binding).map_err(bad)?;
        Ok(binding)
    }
}

pub async fn list(State(ctx): Ctx) -> Json<Vec<Value>> {
    Json(ctx.quorum.image().acls.iter().map(view).collect())
}

/// Adds an ACL: 201 with it (adding one that exists changes nothing).
pub async fn create(State(ctx): Ctx, JsonBody(body): JsonBody<AclBody>) -> ApiResult<(StatusCode, Json<Value>)> {
    let binding = body.binding()?;
    let shown = view(&binding);
    controller_write(&ctx, ControllerRequest::AlterAcls { add: vec![binding], remove: vec![] }).await?;
    Ok((StatusCode::CREATED, Json(shown)))
}

/// Removes every ACL the filter matches (a missing field matches any): 200 with them.
pub async fn delete(State(ctx): Ctx, body: axum::body::Bytes) -> ApiResult<Json<Vec<Value>>> {
    let body: AclBody = match body.iter().all(u8::is_ascii_whitespace) {
        true => AclBody::default(),
        false => serde_json::from_slice(&body).map_err(|e| bad(format!("malformed JSON body: {e}")))?,
    };
    let filter = body.filter()?;
    let remove: Vec<AclBinding> = ctx.quorum.image().acls.iter().filter(|b| filter.matches(b)).cloned().collect();
    let shown = remove.iter().map(view).collect();
    if !remove.is_empty() {
        controller_write(&ctx, ControllerRequest::AlterAcls { add: vec![], remove }).await?;
    }
    Ok(Json(shown))
}
