//! CreateTopics, DeleteTopics and CreatePartitions: forwarded to the
//! controller like the admin API's writes, with the same validation.

use std::collections::BTreeMap;

use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::{
    CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest,
    DeleteTopicsResponse, TopicName,
};

use super::{api_error, str_bytes, topic_uuid};
use crate::admin::controller_write;
use crate::controller::protocol::ControllerRequest;
use crate::controller::topics::{create_topic, create_topic_assigned, validate_configs, Randomness};
use crate::error::{ApiError, ErrorCode};
use crate::kafka::registry::Client;
use crate::node::NodeContext;
use crate::security::acl::{Operation, ResourceType};

fn invalid(message: &str) -> ApiError {
    ApiError::new(ErrorCode::InvalidRequest, message)
}

fn denied(what: &str) -> ApiError {
    ApiError::new(ErrorCode::TopicAuthorizationFailed, format!("Authorization failed: {what}"))
}

/// Whether `client` may do `op` on topic `name`.
fn allowed(ctx: &NodeContext, client: &Client, op: Operation, name: &str) -> bool {
    ctx.authorize(client, &ctx.quorum.image(), op, ResourceType::Topic, name)
}

pub async fn create(
    ctx: &NodeContext,
    request: CreateTopicsRequest,
    version: i16,
    client: &Client,
) -> CreateTopicsResponse {
    let may_create_any = ctx.authorize_cluster(client, &ctx.quorum.image(), Operation::Create);
    let mut results = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        let name = topic.name.0.to_string();
        let partitions = if topic.num_partitions < 0 {
            ctx.settings.int("num.partitions").unwrap_or(1)
        } else {
            topic.num_partitions as i64
        };
        let rf = if topic.replication_factor < 0 {
            ctx.settings.int("default.replication.factor").unwrap_or(1)
        } else {
            topic.replication_factor as i64
        };
        let configs: BTreeMap<String, String> = topic
            .configs
            .iter()
            .filter_map(|c| c.value.as_ref().map(|v| (c.name.to_string(), v.to_string())))
            .collect();
        // A manual assignment: the replicas of partitions 0..n, in order.
        let assignment = (!topic.assignments.is_empty()).then(|| {
            let mut given: Vec<(i32, Vec<i32>)> = topic
                .assignments
                .iter()
                .map(|a| (a.partition_index, a.broker_ids.iter().map(|b| b.0).collect()))
                .collect();
            given.sort_by_key(|(p, _)| *p);
            given
        });
        let (partitions, rf) = match &assignment {
            Some(a) => (a.len() as i64, a.first().map_or(0, |(_, r)| r.len() as i64)),
            None => (partitions, rf),
        };
        let outcome = if !may_create_any && !allowed(ctx, client, Operation::Create, &name) {
            Err(denied("CREATE on the cluster or the topic is needed"))
        } else if let Some(given) = assignment {
            if topic.num_partitions != -1 || topic.replication_factor != -1 {
                Err(invalid("both num_partitions or replication_factor and assignments were set: use one or the other"))
            } else if given.iter().enumerate().any(|(i, (p, _))| *p != i as i32) {
                Err(ApiError::new(
                    ErrorCode::InvalidReplicaAssignment,
                    "the assigned partitions must be 0, 1, 2, ... with none missing or repeated",
                ))
            } else {
                let replicas: Vec<Vec<i32>> = given.into_iter().map(|(_, r)| r).collect();
                if request.validate_only {
                    create_topic_assigned(&ctx.quorum.image(), &name, &replicas, &configs, strom_raft::TopicId(0))
                        .map(|_| ())
                } else {
                    controller_write(
                        ctx,
                        ControllerRequest::CreateTopicAssigned { name: name.clone(), assignment: replicas, configs },
                    )
                    .await
                }
            }
        } else if request.validate_only {
            let random = Randomness { topic_id: strom_raft::TopicId(0), placement_start: 0 };
            validate_configs(&configs)
                .and_then(|_| create_topic(&ctx.quorum.image(), &name, partitions, rf, &configs, random).map(|_| ()))
        } else {
            controller_write(
                ctx,
                ControllerRequest::CreateTopic { name: name.clone(), partitions, replication_factor: rf, configs },
            )
            .await
        };
        let mut result =
            CreatableTopicResult::default().with_name(topic.name).with_num_partitions(-1).with_replication_factor(-1);
        match outcome {
            Ok(()) if version >= 5 => {
                result.num_partitions = partitions as i32;
                result.replication_factor = rf as i16;
                result.configs = Some(Vec::new());
                if let Some(t) = ctx.quorum.image().topics.get(&name).filter(|_| version >= 7) {
                    result.topic_id = topic_uuid(t.topic_id);
                }
            }
            Ok(()) => {}
            Err(e) => (result.error_code, result.error_message) = api_error(&e),
        }
        results.push(result);
    }
    CreateTopicsResponse::default().with_topics(results)
}

pub async fn delete(
    ctx: &NodeContext,
    request: DeleteTopicsRequest,
    version: i16,
    client: &Client,
) -> DeleteTopicsResponse {
    let mut names: Vec<Option<TopicName>> = request.topic_names.into_iter().map(Some).collect();
    let image = ctx.quorum.image();
    for t in request.topics {
        names.push(t.name.or_else(|| {
            image
                .topics
                .values()
                .find(|x| topic_uuid(x.topic_id) == t.topic_id)
                .map(|x| TopicName(str_bytes(x.name.clone())))
        }));
    }
    let mut responses = Vec::with_capacity(names.len());
    for name in names {
        let mut r = DeletableTopicResult::default();
        match name {
            None => {
                (r.error_code, r.error_message) =
                    api_error(&ApiError::new(ErrorCode::UnknownTopicOrPartition, "unknown topic id"))
            }
            Some(n) => {
                let s = n.0.to_string();
                if let Some(t) = image.topics.get(&s).filter(|_| version >= 6) {
                    r.topic_id = topic_uuid(t.topic_id);
                }
                let outcome = match allowed(ctx, client, Operation::Delete, &s) {
                    true => controller_write(ctx, ControllerRequest::DeleteTopic { name: s }).await,
                    false => Err(denied("DELETE on the topic is needed")),
                };
                if let Err(e) = outcome {
                    (r.error_code, r.error_message) = api_error(&e);
                    if version < 5 {
                        r.error_message = None;
                    }
                }
                r.name = Some(n);
            }
        }
        responses.push(r);
    }
    DeleteTopicsResponse::default().with_responses(responses)
}

pub async fn partitions(
    ctx: &NodeContext,
    request: CreatePartitionsRequest,
    client: &Client,
) -> CreatePartitionsResponse {
    let mut results = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        let name = topic.name.0.to_string();
        let outcome = if !allowed(ctx, client, Operation::Alter, &name) {
            Err(denied("ALTER on the topic is needed"))
        } else if topic.assignments.as_ref().is_some_and(|a| !a.is_empty()) {
            Err(invalid("manual replica assignment is not supported"))
        } else if request.validate_only {
            crate::controller::topics::create_partitions(&ctx.quorum.image(), &name, topic.count as i64, 0).map(|_| ())
        } else {
            controller_write(ctx, ControllerRequest::CreatePartitions { name, count: topic.count as i64 }).await
        };
        let mut r = CreatePartitionsTopicResult::default().with_name(topic.name);
        if let Err(e) = outcome {
            (r.error_code, r.error_message) = api_error(&e);
        }
        results.push(r);
    }
    CreatePartitionsResponse::default().with_results(results)
}
