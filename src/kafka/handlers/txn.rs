//! The transaction coordinator's APIs: InitProducerId with a transactional
//! id, AddPartitionsToTxn (v0–v3 from producers, v4 between brokers),
//! AddOffsetsToTxn, EndTxn, DescribeTransactions and ListTransactions, and
//! TxnOffsetCommit, which the group's coordinator answers; and the check a
//! partition leader makes before a transaction's first batches (KIP-890). Each
//! checks the ACLs Kafka checks (WRITE on the transactional id; WRITE on the
//! topics added; READ on the group of AddOffsetsToTxn; DESCRIBE to see a
//! transaction), finds the id's `__transaction_state` partition, which must
//! be led here (NOT_COORDINATOR otherwise), and hands over to
//! `crate::txn`.

use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::describe_transactions_response::{TopicData, TransactionState};
use kafka_protocol::messages::list_transactions_response::TransactionState as ListedTransaction;
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::*;
use kafka_protocol::ResponseError;

use super::str_bytes;
use crate::group::OFFSETS_TOPIC;
use crate::kafka::registry::Client;
use crate::node::NodeContext;
use crate::security::acl::{Operation, ResourceType};
use crate::txn::{TopicPartition, TRANSACTION_TOPIC};

/// The `__transaction_state` partition of `id`, if this broker leads it
/// (and is in touch with the controller, as for groups).
fn coordinated_here(ctx: &NodeContext, id: &str) -> Result<i32, ResponseError> {
    super::groups::coordinating(ctx)?;
    let image = ctx.quorum.image();
    if !image.topics.contains_key(TRANSACTION_TOPIC) {
        return Err(ResponseError::NotCoordinator);
    }
    let partition = ctx.txns.partition_of(&image, id);
    match ctx.replicas.get(TRANSACTION_TOPIC, partition) {
        Some(p) if p.is_leader() => Ok(partition),
        _ => Err(ResponseError::NotCoordinator),
    }
}

/// PRODUCER_FENCED as a request's version knows it: versions before
/// KIP-588 (AddPartitionsToTxn, AddOffsetsToTxn and EndTxn v0–v1) get
/// INVALID_PRODUCER_EPOCH, as Kafka answers them.
fn for_version(e: ResponseError, version: i16) -> ResponseError {
    match e {
        ResponseError::ProducerFenced if version < 2 => ResponseError::InvalidProducerEpoch,
        e => e,
    }
}

fn may_write(ctx: &NodeContext, client: &Client, id: &str) -> bool {
    ctx.authorize(client, &ctx.quorum.image(), Operation::Write, ResourceType::TransactionalId, id)
}

/// InitProducerId for a transactional producer.
pub async fn init_producer_id(
    ctx: &NodeContext,
    request: &InitProducerIdRequest,
    version: i16,
    id: &str,
    client: &Client,
) -> Result<(i64, i16), ResponseError> {
    if !may_write(ctx, client, id) {
        return Err(ResponseError::TransactionalIdAuthorizationFailed);
    }
    let max = ctx.settings.int("transaction.max.timeout.ms").unwrap_or(900_000);
    if request.transaction_timeout_ms <= 0 || i64::from(request.transaction_timeout_ms) > max {
        return Err(ResponseError::InvalidTransactionTimeout);
    }
    let partition = coordinated_here(ctx, id)?;
    let new_producer_id = match ctx.txns.needs_producer_id(partition, id)? {
        true => Some(ctx.producer_ids.next(ctx).await.map_err(|e| {
            tracing::warn!(error = %e, "no producer id block");
            ResponseError::CoordinatorNotAvailable
        })?),
        false => None,
    };
    // (v3+) The producer the client says it is, when it has one.
    let current = (request.producer_id.0 >= 0).then_some((request.producer_id.0, request.producer_epoch));
    let answer =
        ctx.txns.init_producer_id(partition, id, request.transaction_timeout_ms, new_producer_id, current).await;
    // PRODUCER_FENCED came with v4 (KIP-588).
    answer.map_err(|e| {
        if version < 4 && e == ResponseError::ProducerFenced {
            ResponseError::InvalidProducerEpoch
        } else {
            e
        }
    })
}

pub async fn add_partitions(
    ctx: &NodeContext,
    request: AddPartitionsToTxnRequest,
    version: i16,
    client: &Client,
) -> AddPartitionsToTxnResponse {
    if version >= 4 {
        return add_partitions_batched(ctx, request, client).await;
    }
    let id = request.v3_and_below_transactional_id.0.to_string();
    let image = ctx.quorum.image();
    // Each topic needs WRITE; one refused topic fails the whole request, the
    // others answering OPERATION_NOT_ATTEMPTED, as in Kafka.
    let mut topic_errors: Vec<Option<ResponseError>> = request
        .v3_and_below_topics
        .iter()
        .map(|t| {
            let name = t.name.0.as_str();
            if !ctx.authorize(client, &image, Operation::Write, ResourceType::Topic, name) {
                Some(ResponseError::TopicAuthorizationFailed)
            } else if !image
                .topics
                .get(name)
                .is_some_and(|topic| t.partitions.iter().all(|p| topic.partitions.contains_key(p)))
            {
                Some(ResponseError::UnknownTopicOrPartition)
            } else {
                None
            }
        })
        .collect();
    drop(image);
    let whole = if !may_write(ctx, client, &id) {
        Some(ResponseError::TransactionalIdAuthorizationFailed)
    } else if topic_errors.iter().any(Option::is_some) {
        topic_errors.iter_mut().filter(|e| e.is_none()).for_each(|e| *e = Some(ResponseError::OperationNotAttempted));
        None
    } else {
        let partitions: Vec<TopicPartition> = request
            .v3_and_below_topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(move |p| (t.name.0.to_string(), *p)))
            .collect();
        let added = match coordinated_here(ctx, &id) {
            Ok(partition) => {
                let (pid, epoch) = (request.v3_and_below_producer_id.0, request.v3_and_below_producer_epoch);
                ctx.txns.add_partitions(partition, &id, pid, epoch, &partitions).await
            }
            Err(e) => Err(e),
        };
        added.err().map(|e| for_version(e, version))
    };
    let codes: std::collections::HashMap<&str, i16> = request
        .v3_and_below_topics
        .iter()
        .zip(topic_errors)
        .map(|(t, topic_error)| (t.name.0.as_str(), whole.or(topic_error).map_or(0, |e| e.code())))
        .collect();
    let results = partition_results(&request.v3_and_below_topics, |t, _| codes.get(t).copied().unwrap_or(0));
    AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(results)
}

/// The answer to each partition of `topics`, grouped as AddPartitionsToTxn
/// answers them.
fn partition_results(
    topics: &[kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic],
    mut code_of: impl FnMut(&str, i32) -> i16,
) -> Vec<AddPartitionsToTxnTopicResult> {
    topics
        .iter()
        .map(|t| {
            AddPartitionsToTxnTopicResult::default().with_name(t.name.clone()).with_results_by_partition(
                t.partitions
                    .iter()
                    .map(|p| {
                        AddPartitionsToTxnPartitionResult::default()
                            .with_partition_index(*p)
                            .with_partition_error_code(code_of(t.name.0.as_str(), *p))
                    })
                    .collect(),
            )
        })
        .collect()
}

/// AddPartitionsToTxn v4+, between brokers (KIP-890): several transactions
/// at once, each either added to or, with `verify_only`, checked (a
/// partition leader asking before a producer's first transactional batch).
/// Needs CLUSTER_ACTION, as in Kafka.
async fn add_partitions_batched(
    ctx: &NodeContext,
    request: AddPartitionsToTxnRequest,
    client: &Client,
) -> AddPartitionsToTxnResponse {
    if !ctx.authorize_cluster(client, &ctx.quorum.image(), Operation::ClusterAction) {
        return AddPartitionsToTxnResponse::default().with_error_code(ResponseError::ClusterAuthorizationFailed.code());
    }
    let mut results = Vec::with_capacity(request.transactions.len());
    for txn in &request.transactions {
        let id = txn.transactional_id.0.as_str();
        let partitions: Vec<TopicPartition> =
            txn.topics.iter().flat_map(|t| t.partitions.iter().map(move |p| (t.name.0.to_string(), *p))).collect();
        let (pid, epoch) = (txn.producer_id.0, txn.producer_epoch);
        let answers: Vec<Option<ResponseError>> = match coordinated_here(ctx, id) {
            Ok(partition) if txn.verify_only => ctx
                .txns
                .verify(partition, id, pid, epoch, &partitions)
                .unwrap_or_else(|e| vec![Some(e); partitions.len()]),
            Ok(partition) => {
                let added = ctx.txns.add_partitions(partition, id, pid, epoch, &partitions).await;
                vec![added.err(); partitions.len()]
            }
            Err(e) => vec![Some(e); partitions.len()],
        };
        let codes: std::collections::HashMap<(String, i32), i16> =
            partitions.into_iter().zip(answers).map(|(tp, e)| (tp, e.map_or(0, |e| e.code()))).collect();
        let topic_results = partition_results(&txn.topics, |t, p| codes.get(&(t.to_string(), p)).copied().unwrap_or(0));
        results.push(
            kafka_protocol::messages::add_partitions_to_txn_response::AddPartitionsToTxnResult::default()
                .with_transactional_id(txn.transactional_id.clone())
                .with_topic_results(topic_results),
        );
    }
    AddPartitionsToTxnResponse::default().with_results_by_transaction(results)
}

/// KIP-890 part 1, before a Produce is appended: each partition about to
/// get a producer's first transactional batch of a transaction is checked
/// with the id's coordinator (here, or the broker leading its partition of
/// `__transaction_state`), so that a batch outside any transaction (a
/// producer that never called InitProducerId, a partition never added, a
/// transaction already ended) is refused instead of holding the partition's
/// last stable offset forever. The refused partitions with their error
/// codes; retriable trouble reaching the coordinator is NOT_ENOUGH_REPLICAS,
/// as in Kafka.
pub async fn verify_produce(
    ctx: &NodeContext,
    request: &ProduceRequest,
) -> std::collections::HashMap<TopicPartition, i16> {
    let mut refused = std::collections::HashMap::new();
    let Some(id) = request.transactional_id.as_ref().map(|t| t.0.as_str()).filter(|t| !t.is_empty()) else {
        return refused;
    };
    // The partitions to check, by producer (one producer per request in practice).
    let mut unverified: std::collections::BTreeMap<(i64, i16), Vec<TopicPartition>> = Default::default();
    for topic in &request.topic_data {
        for data in &topic.partition_data {
            let Some(h) = data.records.as_deref().and_then(|r| crate::log::BatchHeader::parse(r).ok()) else {
                continue;
            };
            // (Control batches and batches without a producer are refused as invalid.)
            if !h.is_transactional() || h.is_control() || h.producer_id() < 0 {
                continue;
            }
            let name = topic.name.0.as_str();
            let open = ctx
                .replicas
                .get(name, data.index)
                .is_none_or(|p| !p.is_leader() || p.has_open_txn(h.producer_id(), h.producer_epoch()));
            if !open {
                unverified
                    .entry((h.producer_id(), h.producer_epoch()))
                    .or_default()
                    .push((name.to_string(), data.index));
            }
        }
    }
    for ((pid, epoch), partitions) in unverified {
        let (exists, coordinator) = {
            let image = ctx.quorum.image();
            let partition = ctx.txns.partition_of(&image, id);
            let topic = image.topics.get(TRANSACTION_TOPIC);
            let leader = topic.and_then(|t| t.partitions.get(&partition)?.leader);
            (topic.is_some(), leader.map(|l| (partition, l, image.brokers.get(&l).map(|b| b.kafka.clone()))))
        };
        let answers = match coordinator {
            // No transaction was ever begun in this cluster.
            _ if !exists => vec![Some(ResponseError::InvalidProducerIdMapping); partitions.len()],
            Some((partition, leader, _)) if leader == ctx.broker_id => ctx
                .txns
                .verify(partition, id, pid, epoch, &partitions)
                .unwrap_or_else(|e| vec![Some(e); partitions.len()]),
            Some((_, _, Some(addr))) => ctx.txns.verify_remote(&addr, id, pid, epoch, &partitions).await,
            _ => vec![Some(ResponseError::CoordinatorNotAvailable); partitions.len()],
        };
        for (tp, answer) in partitions.into_iter().zip(answers) {
            let code = match answer {
                None => continue,
                Some(
                    e @ (ResponseError::InvalidProducerIdMapping
                    | ResponseError::InvalidTxnState
                    | ResponseError::InvalidProducerEpoch),
                ) => e,
                Some(ResponseError::ProducerFenced) => ResponseError::InvalidProducerEpoch,
                Some(e) => {
                    tracing::debug!(transactional_id = id, topic = %tp.0, partition = tp.1, error = ?e,
                        "transaction verification could not reach the coordinator");
                    ResponseError::NotEnoughReplicas
                }
            };
            refused.insert(tp, code.code());
        }
    }
    refused
}

pub async fn add_offsets(
    ctx: &NodeContext,
    request: AddOffsetsToTxnRequest,
    version: i16,
    client: &Client,
) -> AddOffsetsToTxnResponse {
    let id = request.transactional_id.0.as_str();
    let group = request.group_id.0.as_str();
    let image = ctx.quorum.image();
    let result = if !may_write(ctx, client, id) {
        Err(ResponseError::TransactionalIdAuthorizationFailed)
    } else if !ctx.authorize(client, &image, Operation::Read, ResourceType::Group, group) {
        Err(ResponseError::GroupAuthorizationFailed)
    } else {
        let offsets_partition = ctx.groups.partition_of(&image, group);
        drop(image);
        match coordinated_here(ctx, id) {
            Ok(partition) => {
                let partitions = [(OFFSETS_TOPIC.to_string(), offsets_partition)];
                ctx.txns.add_partitions(partition, id, request.producer_id.0, request.producer_epoch, &partitions).await
            }
            Err(e) => Err(e),
        }
    };
    AddOffsetsToTxnResponse::default().with_error_code(result.err().map_or(0, |e| for_version(e, version).code()))
}

pub async fn end(ctx: &NodeContext, request: EndTxnRequest, version: i16, client: &Client) -> EndTxnResponse {
    let id = request.transactional_id.0.as_str();
    let result = if !may_write(ctx, client, id) {
        Err(ResponseError::TransactionalIdAuthorizationFailed)
    } else {
        match coordinated_here(ctx, id) {
            Ok(partition) => {
                ctx.txns.end_txn(partition, id, request.producer_id.0, request.producer_epoch, request.committed).await
            }
            Err(e) => Err(e),
        }
    };
    EndTxnResponse::default().with_error_code(result.err().map_or(0, |e| for_version(e, version).code()))
}

pub fn describe(
    ctx: &NodeContext,
    request: DescribeTransactionsRequest,
    client: &Client,
) -> DescribeTransactionsResponse {
    let image = ctx.quorum.image();
    let states = request
        .transactional_ids
        .into_iter()
        .map(|id| {
            let base = TransactionState::default().with_transactional_id(id.clone()).with_producer_id(ProducerId(-1));
            let name = id.0.as_str();
            if !ctx.authorize(client, &image, Operation::Describe, ResourceType::TransactionalId, name) {
                return base.with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code());
            }
            let found = coordinated_here(ctx, name).and_then(|p| ctx.txns.describe(p, name));
            match found {
                Ok(Some(m)) => {
                    let mut topics: Vec<TopicData> = Vec::new();
                    for (topic, partition) in &m.partitions {
                        match topics.last_mut() {
                            Some(t) if t.topic.0.as_str() == topic => t.partitions.push(*partition),
                            _ => topics.push(
                                TopicData::default()
                                    .with_topic(TopicName(str_bytes(topic.clone())))
                                    .with_partitions(vec![*partition]),
                            ),
                        }
                    }
                    base.with_transaction_state(str_bytes(m.state.name().to_string()))
                        .with_transaction_timeout_ms(m.timeout_ms)
                        .with_transaction_start_time_ms(m.start_ms)
                        .with_producer_id(ProducerId(m.producer_id))
                        .with_producer_epoch(m.producer_epoch)
                        .with_topics(topics)
                }
                Ok(None) => base.with_error_code(ResponseError::TransactionalIdNotFound.code()),
                Err(e) => base.with_error_code(e.code()),
            }
        })
        .collect();
    DescribeTransactionsResponse::default().with_transaction_states(states)
}

pub fn list(ctx: &NodeContext, request: ListTransactionsRequest, client: &Client) -> ListTransactionsResponse {
    // v2 (KIP-1152): ids matching a regular expression, whole (RE2 syntax, as Kafka's RE2/J).
    let pattern = request.transactional_id_pattern.as_deref().filter(|p| !p.is_empty());
    let pattern = match pattern.map(|p| crate::pattern::whole_names(p).ok_or(ResponseError::InvalidRegularExpression)) {
        None => None,
        Some(Ok(compiled)) => Some(compiled),
        Some(Err(e)) => return ListTransactionsResponse::default().with_error_code(e.code()),
    };
    let listed = match ctx.txns.list() {
        Ok(listed) => listed,
        Err(e) => return ListTransactionsResponse::default().with_error_code(e.code()),
    };
    let image = ctx.quorum.image();
    let now = crate::clock::wall_ms();
    let states = listed
        .into_iter()
        .filter(|m| {
            request.state_filters.is_empty() || request.state_filters.iter().any(|s| s.as_str() == m.state.name())
        })
        .filter(|m| {
            request.producer_id_filters.is_empty() || request.producer_id_filters.iter().any(|p| p.0 == m.producer_id)
        })
        // v1: only transactions running longer than this (-1: all).
        .filter(|m| request.duration_filter < 0 || (m.start_ms >= 0 && now - m.start_ms > request.duration_filter))
        .filter(|m| pattern.as_ref().is_none_or(|p| p.is_match(&m.transactional_id)))
        .filter(|m| {
            ctx.authorize(client, &image, Operation::Describe, ResourceType::TransactionalId, &m.transactional_id)
        })
        .map(|m| {
            ListedTransaction::default()
                .with_transactional_id(TransactionalId(str_bytes(m.transactional_id)))
                .with_producer_id(ProducerId(m.producer_id))
                .with_transaction_state(str_bytes(m.state.name().to_string()))
        })
        .collect();
    ListTransactionsResponse::default().with_transaction_states(states)
}

/// TxnOffsetCommit (v0–v3), answered by the group's coordinator: the
/// offsets a transaction commits, visible once it commits.
pub async fn commit_offsets(
    ctx: &NodeContext,
    request: TxnOffsetCommitRequest,
    version: i16,
    client: &Client,
) -> TxnOffsetCommitResponse {
    let group = request.group_id.0.to_string();
    let image = ctx.quorum.image();
    let whole = if !may_write(ctx, client, request.transactional_id.0.as_str()) {
        Some(ResponseError::TransactionalIdAuthorizationFailed)
    } else if !ctx.authorize(client, &image, Operation::Read, ResourceType::Group, &group) {
        Some(ResponseError::GroupAuthorizationFailed)
    } else {
        super::groups::coordinating(ctx).err()
    };
    let mut commits = Vec::new();
    let mut slots = Vec::new();
    let mut topics: Vec<TxnOffsetCommitResponseTopic> = Vec::with_capacity(request.topics.len());
    for (t, topic) in request.topics.iter().enumerate() {
        let name = topic.name.0.to_string();
        let known = image.topics.get(&name);
        let readable = ctx.authorize(client, &image, Operation::Read, ResourceType::Topic, &name);
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for (p, part) in topic.partitions.iter().enumerate() {
            let error = if let Some(e) = whole {
                Some(e)
            } else if !readable {
                Some(ResponseError::TopicAuthorizationFailed)
            } else if !known.is_some_and(|k| k.partitions.contains_key(&part.partition_index)) {
                Some(ResponseError::UnknownTopicOrPartition)
            } else {
                slots.push((t, p));
                commits.push(crate::group::OffsetCommit {
                    topic: name.clone(),
                    partition: part.partition_index,
                    offset: part.committed_offset,
                    leader_epoch: if version >= 2 { part.committed_leader_epoch } else { -1 },
                    metadata: part.committed_metadata.as_ref().map(|m| m.to_string()).unwrap_or_default(),
                });
                None
            };
            partitions.push(
                TxnOffsetCommitResponsePartition::default()
                    .with_partition_index(part.partition_index)
                    .with_error_code(error.map_or(0, |e| e.code())),
            );
        }
        topics.push(TxnOffsetCommitResponseTopic::default().with_name(topic.name.clone()).with_partitions(partitions));
    }
    let partition = ctx.groups.partition_of(&image, &group);
    drop(image);
    if commits.is_empty() {
        return TxnOffsetCommitResponse::default().with_topics(topics);
    }
    let auth = crate::group::CommitAuth {
        member_id: request.member_id.as_str(),
        instance_id: request.group_instance_id.as_ref().map(|s| s.as_str()).filter(|s| !s.is_empty()),
        generation: request.generation_id,
        member_epochs: false,
    };
    let producer = (request.producer_id.0, request.producer_epoch);
    let result = ctx.groups.txn_commit(partition, &group, producer, auth, commits).await;
    let errors: Vec<Option<ResponseError>> = match result {
        Ok(errors) => errors,
        Err(e) => vec![Some(e); slots.len()],
    };
    for ((t, p), e) in slots.into_iter().zip(errors) {
        topics[t].partitions[p].error_code = e.map_or(0, |e| e.code());
    }
    TxnOffsetCommitResponse::default().with_topics(topics)
}
