//! DescribeClientQuotas and AlterClientQuotas (KIP-546): quotas of users and
//! client ids, and their defaults.

use kafka_protocol::messages::alter_client_quotas_response::{EntityData as AlterEntity, EntryData as AlterResult};
use kafka_protocol::messages::describe_client_quotas_response::{EntityData, EntryData, ValueData};
use kafka_protocol::messages::{
    AlterClientQuotasRequest, AlterClientQuotasResponse, DescribeClientQuotasRequest, DescribeClientQuotasResponse,
};
use kafka_protocol::protocol::StrBytes;
use strom_raft::records::{EntityName, QuotaEntity};

use super::str_bytes;
use crate::controller::protocol::ControllerRequest;
use crate::error::{ApiError, ErrorCode};
use crate::node::NodeContext;
use crate::security::quotas;

const USER: &str = "user";
const CLIENT_ID: &str = "client-id";
/// Kafka's component match types.
const MATCH_EXACT: i8 = 0;
const MATCH_DEFAULT: i8 = 1;
const MATCH_SPECIFIED: i8 = 2;

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::InvalidRequest, message)
}

/// An entity from (type, name or null for the default) pairs.
fn entity(parts: impl Iterator<Item = (String, Option<String>)>) -> Result<QuotaEntity, ApiError> {
    let mut e = QuotaEntity { user: EntityName::Unset, client_id: EntityName::Unset };
    for (kind, name) in parts {
        let slot = match kind.as_str() {
            USER => &mut e.user,
            CLIENT_ID => &mut e.client_id,
            other => return Err(bad(format!("entity type `{other}` is not supported (user, client-id)"))),
        };
        if *slot != EntityName::Unset {
            return Err(bad(format!("entity type {kind} is given twice")));
        }
        *slot = name.map_or(EntityName::Default, EntityName::Named);
    }
    Ok(e)
}

fn parts(e: &QuotaEntity) -> Vec<(&'static str, Option<String>)> {
    let mut out = Vec::new();
    for (kind, name) in [(USER, &e.user), (CLIENT_ID, &e.client_id)] {
        match name {
            EntityName::Unset => {}
            EntityName::Default => out.push((kind, None)),
            EntityName::Named(n) => out.push((kind, Some(n.clone()))),
        }
    }
    out
}

pub fn describe(ctx: &NodeContext, request: DescribeClientQuotasRequest) -> DescribeClientQuotasResponse {
    let mut filters = Vec::new();
    for c in &request.components {
        let kind = c.entity_type.to_string();
        if kind != USER && kind != CLIENT_ID {
            let e = bad(format!("entity type `{kind}` is not supported (user, client-id)"));
            return DescribeClientQuotasResponse::default()
                .with_error_code(e.code.kafka_code())
                .with_error_message(Some(str_bytes(e.message)));
        }
        filters.push((kind, c.match_type, c._match.as_ref().map(|m| m.to_string())));
    }
    let image = ctx.quorum.image();
    let entries = image
        .client_quotas
        .iter()
        .filter(|(e, _)| {
            let ps = parts(e);
            let matches = filters.iter().all(|(kind, match_type, name)| {
                let part = ps.iter().find(|(k, _)| k == kind);
                match (*match_type, part) {
                    (_, None) => false,
                    (MATCH_EXACT, Some((_, n))) => n == name,
                    (MATCH_DEFAULT, Some((_, n))) => n.is_none(),
                    (MATCH_SPECIFIED, Some(_)) => true,
                    _ => false,
                }
            });
            matches && (!request.strict || ps.len() == filters.len())
        })
        .map(|(e, values)| {
            EntryData::default()
                .with_entity(
                    parts(e)
                        .into_iter()
                        .map(|(kind, name)| {
                            EntityData::default()
                                .with_entity_type(StrBytes::from_static_str(kind))
                                .with_entity_name(name.map(str_bytes))
                        })
                        .collect(),
                )
                .with_values(
                    values.iter().map(|(k, v)| ValueData::default().with_key(str_bytes(k)).with_value(*v)).collect(),
                )
        })
        .collect();
    DescribeClientQuotasResponse::default().with_entries(Some(entries))
}

/// One quota value set (`Some`) or removed.
type QuotaChange = (QuotaEntity, String, Option<f64>);

pub async fn alter(ctx: &NodeContext, request: AlterClientQuotasRequest) -> AlterClientQuotasResponse {
    let checked: Vec<Result<Vec<QuotaChange>, ApiError>> = request
        .entries
        .iter()
        .map(|entry| {
            let e = entity(
                entry.entity.iter().map(|p| (p.entity_type.to_string(), p.entity_name.as_ref().map(|n| n.to_string()))),
            )?;
            entry
                .ops
                .iter()
                .map(|op| {
                    let value = (!op.remove).then_some(op.value);
                    quotas::check(&e, &op.key, value)?;
                    Ok((e.clone(), op.key.to_string(), value))
                })
                .collect()
        })
        .collect();
    let changes: Vec<_> = checked.iter().filter_map(|r| r.as_ref().ok()).flatten().cloned().collect();
    let written = match (changes.is_empty(), request.validate_only) {
        (false, false) => crate::admin::controller_write(ctx, ControllerRequest::AlterClientQuotas { changes }).await,
        _ => Ok(()),
    };
    let entries = request
        .entries
        .iter()
        .zip(checked)
        .map(|(entry, result)| {
            let error = result.err().or_else(|| written.clone().err());
            AlterResult::default()
                .with_error_code(error.as_ref().map_or(0, |e| e.code.kafka_code()))
                .with_error_message(error.map(|e| str_bytes(e.message)))
                .with_entity(
                    entry
                        .entity
                        .iter()
                        .map(|p| {
                            AlterEntity::default()
                                .with_entity_type(p.entity_type.clone())
                                .with_entity_name(p.entity_name.clone())
                        })
                        .collect(),
                )
        })
        .collect();
    AlterClientQuotasResponse::default().with_entries(entries)
}
