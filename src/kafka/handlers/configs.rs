//! DescribeConfigs, AlterConfigs and IncrementalAlterConfigs for topics and
//! for dynamic broker configs (KIP-226): the cluster-wide defaults (the
//! default broker resource, an empty name) and one broker's own (its id as
//! the name). Writes go to the controller, which validates them again and
//! writes Config records; `validate_only` runs the controller's pure
//! validation here and writes nothing.

use crate::kafka::registry::Client;
use crate::security::acl::{Operation, ResourceType};
use std::collections::BTreeMap;

use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::incremental_alter_configs_request::AlterableConfig;
use kafka_protocol::messages::{
    alter_configs_response, incremental_alter_configs_response, AlterConfigsRequest, AlterConfigsResponse,
    DescribeConfigsRequest, DescribeConfigsResponse, IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
};
use strom_raft::MetadataImage;

use super::{api_error, str_bytes};
use crate::admin::controller_write;
use crate::config::topic::{append_items, subtract_items};
use crate::config::{broker_def, topic_config, Effect, BROKER_SETTINGS};
use crate::controller::protocol::ControllerRequest;
use crate::error::{ApiError, ErrorCode};
use crate::node::NodeContext;

const TOPIC: i8 = 2;
const BROKER: i8 = 4;
/// Kafka's config sources (DescribeConfigs v1+).
const DYNAMIC_TOPIC_CONFIG: i8 = 1;
const DYNAMIC_BROKER_CONFIG: i8 = 2;
const DYNAMIC_DEFAULT_BROKER_CONFIG: i8 = 3;
const STATIC_BROKER_CONFIG: i8 = 4;
const DEFAULT_CONFIG: i8 = 5;
/// IncrementalAlterConfigs operations.
const SET: i8 = 0;
const DELETE: i8 = 1;
const APPEND: i8 = 2;
const SUBTRACT: i8 = 3;

/// One described config before it is put on the wire.
struct Described {
    name: String,
    value: Option<String>,
    read_only: bool,
    doc: String,
    /// Where a value for it is set, highest precedence first: (name, value,
    /// source). The first is the one in force, and gives the config's source.
    synonyms: Vec<(String, String, i8)>,
}

impl Described {
    fn into_result(self, documentation: bool, synonyms: bool) -> DescribeConfigsResourceResult {
        let source = self.synonyms.first().map_or(DEFAULT_CONFIG, |s| s.2);
        let mut result = DescribeConfigsResourceResult::default()
            .with_name(str_bytes(self.name))
            .with_value(self.value.map(str_bytes))
            .with_config_source(source)
            .with_read_only(self.read_only);
        if documentation {
            result.documentation = Some(str_bytes(self.doc));
        }
        if synonyms {
            result.synonyms = self
                .synonyms
                .into_iter()
                .map(|(name, value, source)| {
                    DescribeConfigsSynonym::default()
                        .with_name(str_bytes(name))
                        .with_value(Some(str_bytes(value)))
                        .with_source(source)
                })
                .collect();
        }
        result
    }
}

/// Every level that sets broker setting `key` for broker `broker_id`,
/// highest precedence first, as Kafka lists a config's synonyms: that
/// broker's dynamic config, the cluster-wide dynamic default, the node's
/// file or flags, the default.
fn broker_synonyms(ctx: &NodeContext, image: &MetadataImage, broker_id: i32, key: &str) -> Vec<(String, String, i8)> {
    let def = broker_def(key);
    let dynamic = def.is_some_and(|d| d.dynamic);
    let mut out = Vec::new();
    let mut add = |value: Option<String>, source: i8| {
        if let Some(v) = value {
            out.push((key.to_string(), v, source));
        }
    };
    if dynamic {
        add(image.per_broker_configs.get(&broker_id).and_then(|c| c.get(key)).cloned(), DYNAMIC_BROKER_CONFIG);
        add(image.broker_configs.get(key).cloned(), DYNAMIC_DEFAULT_BROKER_CONFIG);
    }
    add(ctx.settings.is_explicit(key).then(|| ctx.settings.get(key)).flatten(), STATIC_BROKER_CONFIG);
    add(def.and_then(|d| d.default.map(str::to_string)), DEFAULT_CONFIG);
    out
}

fn describe_topic(ctx: &NodeContext, image: &MetadataImage, name: &str) -> Result<Vec<Described>, ApiError> {
    let topic = image.topics.get(name).ok_or_else(|| unknown_topic(name))?;
    let effective = ctx.settings.for_broker(image, ctx.broker_id).topic_effective(&topic.configs);
    Ok(effective
        .into_iter()
        .map(|(key, value)| {
            let config = topic_config(&key);
            let doc = match config.map(|c| c.effect) {
                Some(Effect::Ignored(why)) => format!("Accepted and stored, not used: {why}."),
                _ => config.and_then(|c| c.setting()).map_or_else(String::new, |d| d.doc.to_string()),
            };
            let mut synonyms: Vec<(String, String, i8)> =
                topic.configs.get(&key).map(|v| (key.clone(), v.clone(), DYNAMIC_TOPIC_CONFIG)).into_iter().collect();
            match config.and_then(|c| c.synonym()) {
                Some(broker) => synonyms.extend(broker_synonyms(ctx, image, ctx.broker_id, broker)),
                None => synonyms.extend(
                    config
                        .and_then(|c| c.setting())
                        .and_then(|d| d.default)
                        .map(|v| (key.clone(), v.to_string(), DEFAULT_CONFIG)),
                ),
            }
            Described { name: key, value: Some(value), read_only: false, doc, synonyms }
        })
        .collect())
}

fn describe_broker(ctx: &NodeContext, image: &MetadataImage, name: &str) -> Result<Vec<Described>, ApiError> {
    let dynamic = &image.broker_configs;
    let described = |key: &str, value: String, synonyms: Vec<(String, String, i8)>| {
        let def = broker_def(key);
        Described {
            name: key.to_string(),
            value: Some(value),
            read_only: !def.is_some_and(|d| d.dynamic),
            doc: def.map_or_else(String::new, |d| d.doc.to_string()),
            synonyms,
        }
    };
    if name.is_empty() {
        // The default broker resource holds only the cluster-wide dynamic configs.
        return Ok(dynamic
            .iter()
            .filter(|(k, _)| broker_def(k).is_some_and(|d| d.dynamic))
            .map(|(k, v)| described(k, v.clone(), vec![(k.clone(), v.clone(), DYNAMIC_DEFAULT_BROKER_CONFIG)]))
            .collect());
    }
    let id = broker_id(name)?;
    let settings = ctx.settings.for_broker(image, id);
    Ok(BROKER_SETTINGS
        .iter()
        .filter_map(|d| settings.get(d.name).map(|v| described(d.name, v, broker_synonyms(ctx, image, id, d.name))))
        .collect())
}

fn broker_id(name: &str) -> Result<i32, ApiError> {
    name.parse()
        .map_err(|_| ApiError::new(ErrorCode::InvalidRequest, format!("broker id must be an integer, got `{name}`")))
}

fn unknown_topic(name: &str) -> ApiError {
    ApiError::new(ErrorCode::UnknownTopicOrPartition, format!("topic `{name}` does not exist"))
}

/// Kafka's checks: DESCRIBE_CONFIGS or ALTER_CONFIGS on the topic, or on the
/// cluster for broker resources.
fn config_access(
    ctx: &NodeContext,
    client: &Client,
    image: &MetadataImage,
    resource_type: i8,
    name: &str,
    op: Operation,
) -> Result<(), ApiError> {
    let (allowed, code) = match resource_type {
        TOPIC => (ctx.authorize(client, image, op, ResourceType::Topic, name), ErrorCode::TopicAuthorizationFailed),
        _ => (ctx.authorize_cluster(client, image, op), ErrorCode::ClusterAuthorizationFailed),
    };
    match allowed {
        true => Ok(()),
        false => Err(ApiError::new(code, format!("Authorization failed: {} is needed", op.name().to_uppercase()))),
    }
}

pub fn describe(ctx: &NodeContext, request: DescribeConfigsRequest, client: &Client) -> DescribeConfigsResponse {
    let image = ctx.quorum.image();
    let (documentation, synonyms) = (request.include_documentation, request.include_synonyms);
    let results = request
        .resources
        .into_iter()
        .map(|r| {
            let mut out = DescribeConfigsResult::default()
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone());
            let name = r.resource_name.as_str();
            let access = config_access(ctx, client, &image, r.resource_type, name, Operation::DescribeConfigs);
            let described = match r.resource_type {
                _ if access.is_err() => access.map(|()| Vec::new()),
                TOPIC => describe_topic(ctx, &image, name),
                BROKER => describe_broker(ctx, &image, name),
                other => Err(ApiError::new(
                    ErrorCode::InvalidRequest,
                    format!("config resource type {other} is not supported"),
                )),
            };
            match described {
                Ok(mut configs) => {
                    if let Some(keys) = &r.configuration_keys {
                        configs.retain(|c| keys.iter().any(|k| k.as_str() == c.name));
                    }
                    out.configs = configs.into_iter().map(|c| c.into_result(documentation, synonyms)).collect();
                }
                Err(e) => (out.error_code, out.error_message) = api_error(&e),
            }
            out
        })
        .collect();
    DescribeConfigsResponse::default().with_results(results)
}

/// Checks (and, unless `validate_only`, writes) a change to one resource.
async fn alter_resource(
    ctx: &NodeContext,
    resource_type: i8,
    name: &str,
    changes: BTreeMap<String, Option<String>>,
    validate_only: bool,
) -> Result<(), ApiError> {
    let request = match resource_type {
        TOPIC => {
            let name = name.to_string();
            if validate_only {
                return crate::controller::topics::alter_configs(&ctx.quorum.image(), &name, &changes).map(|_| ());
            }
            ControllerRequest::AlterConfigs { name, changes }
        }
        BROKER => {
            let broker_id = if name.is_empty() { None } else { Some(broker_id(name)?) };
            if validate_only {
                return crate::controller::broker_configs::alter(&ctx.quorum.image(), broker_id, &changes).map(|_| ());
            }
            ControllerRequest::AlterBrokerConfigs { broker_id, changes }
        }
        other => {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                format!("config resource type {other} cannot be altered"),
            ))
        }
    };
    controller_write(ctx, request).await
}

/// The configs a resource holds now: a topic's overrides, or the dynamic
/// broker configs.
fn current_configs(image: &MetadataImage, resource_type: i8, name: &str) -> BTreeMap<String, String> {
    match resource_type {
        TOPIC => image.topics.get(name).map(|t| t.configs.clone()).unwrap_or_default(),
        BROKER if name.is_empty() => image.broker_configs.clone(),
        BROKER => name.parse().ok().and_then(|id| image.per_broker_configs.get(&id)).cloned().unwrap_or_default(),
        _ => BTreeMap::new(),
    }
}

pub async fn alter(ctx: &NodeContext, request: AlterConfigsRequest, client: &Client) -> AlterConfigsResponse {
    let mut responses = Vec::new();
    for r in request.resources {
        // AlterConfigs replaces the whole set: keys not given are reset.
        let image = ctx.quorum.image();
        let mut changes: BTreeMap<String, Option<String>> =
            current_configs(&image, r.resource_type, r.resource_name.as_str()).into_keys().map(|k| (k, None)).collect();
        for c in &r.configs {
            changes.insert(c.name.to_string(), c.value.as_ref().map(|v| v.to_string()));
        }
        let name = r.resource_name.as_str();
        let outcome = match config_access(ctx, client, &image, r.resource_type, name, Operation::AlterConfigs) {
            Ok(()) => alter_resource(ctx, r.resource_type, name, changes, request.validate_only).await,
            Err(e) => Err(e),
        };
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

/// The value a list config has now, for APPEND and SUBTRACT: the resource's
/// own value, else the value it inherits.
fn list_value_now(ctx: &NodeContext, image: &MetadataImage, resource_type: i8, name: &str, key: &str) -> String {
    let cluster = ctx.settings.layered(&image.broker_configs);
    match resource_type {
        TOPIC => {
            let overrides = image.topics.get(name).map(|t| t.configs.clone()).unwrap_or_default();
            ctx.settings.for_broker(image, ctx.broker_id).topic_effective(&overrides).remove(key).unwrap_or_default()
        }
        _ => match name.parse() {
            Ok(id) => ctx.settings.for_broker(image, id).get(key).unwrap_or_default(),
            Err(_) => cluster.get(key).unwrap_or_default(),
        },
    }
}

/// Whether `key` is a list config of this resource type.
fn is_list(resource_type: i8, key: &str) -> bool {
    let def = match resource_type {
        TOPIC => topic_config(key).and_then(|c| c.setting()),
        _ => broker_def(key),
    };
    def.is_some_and(|d| d.kind.is_list())
}

/// Turns IncrementalAlterConfigs operations into set/reset changes.
fn incremental_changes(
    ctx: &NodeContext,
    image: &MetadataImage,
    resource_type: i8,
    name: &str,
    configs: &[AlterableConfig],
) -> Result<BTreeMap<String, Option<String>>, ApiError> {
    let invalid_config = |m: String| ApiError::new(ErrorCode::InvalidConfig, m);
    let mut changes = BTreeMap::new();
    for c in configs {
        let key = c.name.to_string();
        let value = c.value.as_ref().map(|v| v.to_string());
        let change = match c.config_operation {
            SET => value,
            DELETE => None,
            op @ (APPEND | SUBTRACT) => {
                let verb = if op == APPEND { "append" } else { "subtract" };
                if !is_list(resource_type, &key) {
                    return Err(invalid_config(format!("Config value {verb} is not allowed for config key: {key}")));
                }
                let now = list_value_now(ctx, image, resource_type, name, &key);
                let given = value.unwrap_or_default();
                Some(if op == APPEND { append_items(&now, &given) } else { subtract_items(&now, &given) })
            }
            op => return Err(ApiError::new(ErrorCode::InvalidRequest, format!("unknown config operation {op}"))),
        };
        if changes.insert(key.clone(), change).is_some() {
            return Err(ApiError::new(ErrorCode::InvalidRequest, format!("config key `{key}` is given twice")));
        }
    }
    Ok(changes)
}

pub async fn incremental_alter(
    ctx: &NodeContext,
    request: IncrementalAlterConfigsRequest,
    client: &Client,
) -> IncrementalAlterConfigsResponse {
    let mut responses = Vec::new();
    for r in request.resources {
        let image = ctx.quorum.image();
        let name = r.resource_name.as_str();
        let access = config_access(ctx, client, &image, r.resource_type, name, Operation::AlterConfigs);
        let outcome = match access.and_then(|()| incremental_changes(ctx, &image, r.resource_type, name, &r.configs)) {
            Ok(changes) => alter_resource(ctx, r.resource_type, name, changes, request.validate_only).await,
            Err(e) => Err(e),
        };
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
