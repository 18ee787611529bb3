//! DescribeConfigs, AlterConfigs and IncrementalAlterConfigs for topics
//! (writes go to the controller) and broker settings (read-only here).

use std::collections::BTreeMap;

use kafka_protocol::messages::describe_configs_response::{DescribeConfigsResourceResult, DescribeConfigsResult};
use kafka_protocol::messages::{
    alter_configs_response, incremental_alter_configs_response, AlterConfigsRequest, AlterConfigsResponse,
    DescribeConfigsRequest, DescribeConfigsResponse, IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::{api_error, str_bytes};
use crate::admin::controller_write;
use crate::controller::protocol::ControllerRequest;
use crate::error::{ApiError, ErrorCode};
use crate::node::NodeContext;

const TOPIC: i8 = 2;
const BROKER: i8 = 4;
/// Kafka's config sources.
const DYNAMIC_TOPIC_CONFIG: i8 = 1;
const STATIC_BROKER_CONFIG: i8 = 4;
const DEFAULT_CONFIG: i8 = 5;

fn entry(name: &str, value: Option<String>, source: i8) -> DescribeConfigsResourceResult {
    DescribeConfigsResourceResult::default()
        .with_name(str_bytes(name))
        .with_value(value.map(str_bytes))
        .with_config_source(source)
}

fn describe_one(
    ctx: &NodeContext,
    resource_type: i8,
    name: &str,
) -> Result<Vec<DescribeConfigsResourceResult>, ApiError> {
    match resource_type {
        TOPIC => {
            let image = ctx.quorum.image();
            let topic = image.topics.get(name).ok_or_else(|| {
                ApiError::new(ErrorCode::UnknownTopicOrPartition, format!("topic `{name}` does not exist"))
            })?;
            Ok(ctx
                .settings
                .topic_effective(&topic.configs)
                .into_iter()
                .map(|(k, v)| {
                    let source = if topic.configs.contains_key(&k) { DYNAMIC_TOPIC_CONFIG } else { DEFAULT_CONFIG };
                    entry(&k, Some(v), source)
                })
                .collect())
        }
        BROKER => {
            let defaults = crate::config::Settings::default();
            Ok(ctx
                .settings
                .all()
                .into_iter()
                .map(|(k, v)| {
                    let source =
                        if defaults.get(&k).as_ref() == Some(&v) { DEFAULT_CONFIG } else { STATIC_BROKER_CONFIG };
                    entry(&k, Some(v), source)
                })
                .collect())
        }
        other => {
            Err(ApiError::new(ErrorCode::InvalidRequest, format!("config resource type {other} is not supported")))
        }
    }
}

pub fn describe(ctx: &NodeContext, request: DescribeConfigsRequest) -> DescribeConfigsResponse {
    let results = request
        .resources
        .into_iter()
        .map(|r| {
            let mut out = DescribeConfigsResult::default()
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone());
            match describe_one(ctx, r.resource_type, r.resource_name.as_str()) {
                Ok(mut configs) => {
                    if let Some(keys) = &r.configuration_keys {
                        configs.retain(|c| keys.iter().any(|k| k == &c.name));
                    }
                    out.configs = configs;
                }
                Err(e) => (out.error_code, out.error_message) = api_error(&e),
            }
            out
        })
        .collect();
    DescribeConfigsResponse::default().with_results(results)
}

async fn alter_topic(
    ctx: &NodeContext,
    resource_type: i8,
    name: &StrBytes,
    changes: Result<BTreeMap<String, Option<String>>, ApiError>,
    validate_only: bool,
) -> Result<(), ApiError> {
    if resource_type != TOPIC {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            "only topic configs can be altered; broker settings are static",
        ));
    }
    let changes = changes?;
    let name = name.to_string();
    if validate_only {
        return crate::controller::topics::alter_configs(&ctx.quorum.image(), &name, &changes).map(|_| ());
    }
    controller_write(ctx, ControllerRequest::AlterConfigs { name, changes }).await
}

pub async fn alter(ctx: &NodeContext, request: AlterConfigsRequest) -> AlterConfigsResponse {
    let mut responses = Vec::new();
    for r in request.resources {
        // AlterConfigs replaces the whole set: keys not given are reset.
        let image = ctx.quorum.image();
        let mut changes: BTreeMap<String, Option<String>> = image
            .topics
            .get(r.resource_name.as_str())
            .map(|t| t.configs.keys().map(|k| (k.clone(), None)).collect())
            .unwrap_or_default();
        for c in &r.configs {
            changes.insert(c.name.to_string(), c.value.as_ref().map(|v| v.to_string()));
        }
        let outcome = alter_topic(ctx, r.resource_type, &r.resource_name, Ok(changes), request.validate_only).await;
        let mut out = alter_configs_response::AlterConfigsResourceResponse::default()
            .with_resource_type(r.resource_type)
            .with_resource_name(r.resource_name);
        if let Err(e) = outcome {
            (out.error_code, out.error_message) = api_error(&e);
        }
        responses.push(out);
    }
    AlterConfigsResponse::default().with_responses(responses)
}

pub async fn incremental_alter(
    ctx: &NodeContext,
    request: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let mut responses = Vec::new();
    for r in request.resources {
        let changes: Result<BTreeMap<String, Option<String>>, ApiError> = r
            .configs
            .iter()
            .map(|c| match c.config_operation {
                0 => Ok((c.name.to_string(), c.value.as_ref().map(|v| v.to_string()))),
                1 => Ok((c.name.to_string(), None)),
                op => Err(ApiError::new(
                    ErrorCode::InvalidConfig,
                    format!("config operation {op} (APPEND/SUBTRACT) is not supported"),
                )),
            })
            .collect();
        let outcome = alter_topic(ctx, r.resource_type, &r.resource_name, changes, request.validate_only).await;
        let mut out = incremental_alter_configs_response::AlterConfigsResourceResponse::default()
            .with_resource_type(r.resource_type)
            .with_resource_name(r.resource_name);
        if let Err(e) = outcome {
            (out.error_code, out.error_message) = api_error(&e);
        }
        responses.push(out);
    }
    IncrementalAlterConfigsResponse::default().with_responses(responses)
}
