//! Fetch: raw batches from the partition logs, below the high watermark for
//! consumers (up to the log end for follower replicas), bounded by
//! `max_bytes` and each partition's limit; long-polls up to `max_wait_ms`
//! until `min_bytes` are there. A client may open an incremental fetch
//! session (KIP-227, [`crate::kafka::fetch_session`]): its requests then name
//! only the partitions whose position changed, and its answers carry only the
//! partitions with something new. Records are not read: each partition's
//! answer is a range of its segment file, which the connection sends from the
//! page cache (see [`crate::kafka::frame`]). A `read_committed` consumer
//! (isolation level 1) reads below the last stable offset and is told the
//! aborted transactions in what it gets, whose records it drops (KIP-98).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::select_all;
use kafka_protocol::messages::fetch_response::{AbortedTransaction, FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{FetchRequest, FetchResponse};
use kafka_protocol::ResponseError;

use super::{missing_partition_code, partition_error_code};
use crate::clock::mono_ms;
use crate::kafka::fetch_session::{Owner, Plan};
use crate::kafka::frame::RecordSlices;
use crate::kafka::registry::Client;
use crate::log::slice::FileSlice;
use crate::log::LogError;
use crate::node::NodeContext;
use crate::replication::partition::{Partition, ReplicaFetch};
use crate::replication::PartitionError;
use crate::security::acl::{Operation, ResourceType};

/// Longest long-poll, whatever the client asks.
const MAX_WAIT_CAP: Duration = Duration::from_secs(30);

fn empty(index: i32, code: i16) -> PartitionData {
    PartitionData::default()
        .with_partition_index(index)
        .with_error_code(code)
        .with_high_watermark(-1)
        .with_last_stable_offset(-1)
        .with_log_start_offset(-1)
        .with_preferred_read_replica(kafka_protocol::messages::BrokerId(-1))
        .with_aborted_transactions(Some(Vec::new()))
        .with_records(Some(Bytes::new()))
}

/// The hosted replica of each partition of a plan, in its order: looked up
/// once per request, and again only when the hosted replicas or their roles
/// change (a follower's session names thousands of partitions).
type Resolved = Vec<Vec<Option<Arc<Partition>>>>;

fn resolve(ctx: &NodeContext, plan: &Plan) -> Resolved {
    plan.iter()
        .map(|(topic, wants)| wants.iter().map(|w| ctx.replicas.get(topic.0.as_str(), w.partition)).collect())
        .collect()
}

/// One pass over the partitions of `plan`; returns the answer, the file
/// ranges its records fields stand for, and its bytes.
fn read_all(
    ctx: &NodeContext,
    max_bytes: i32,
    plan: &Plan,
    resolved: &Resolved,
    replica: Option<ReplicaFetch>,
    readable: &[bool],
    read_committed: bool,
) -> (Vec<FetchableTopicResponse>, RecordSlices, usize) {
    let mut slices = RecordSlices::default();
    let mut budget = max_bytes.max(0) as usize;
    let mut total = 0usize;
    let image = ctx.quorum.image();
    // Without a rate no fetch is throttled, and no partition's reassignment
    // state need be looked up.
    let throttling = replica.is_some() && !ctx.replicas.leader_throttle.is_unlimited();
    let topics = plan
        .iter()
        .zip(resolved)
        .zip(readable)
        .map(|(((topic, wants), hosted), &readable)| {
            let name = topic.0.as_str();
            let partitions = wants
                .iter()
                .zip(hosted)
                .map(|(fp, hosted)| {
                    if !readable {
                        return empty(fp.partition, ResponseError::TopicAuthorizationFailed.code());
                    }
                    let Some(partition) = hosted else {
                        return empty(fp.partition, missing_partition_code(&image, name, fp.partition));
                    };
                    // KIP-74: the response's `max_bytes` and each partition's
                    // limit bound what is returned, except that the first
                    // batch of the first non-empty partition goes whole, even
                    // if larger than both, so that a consumer makes progress.
                    let mut limit = (fp.partition_max_bytes.max(0) as usize).min(budget);
                    // Read even with no budget left: a follower's fetch
                    // offset is its progress, recorded by the read.
                    let mut min_one_batch = total == 0;
                    // A replica a reassignment adds catches up within
                    // `leader.replication.throttled.rate`; ISR members never wait.
                    let throttled = throttling
                        && replica.is_some_and(|r| {
                            image
                                .topics
                                .get(name)
                                .and_then(|t| t.partitions.get(&fp.partition))
                                .is_some_and(|p| p.is_catching_up(r.id))
                        });
                    if throttled {
                        match ctx.replicas.leader_throttle.allowance(mono_ms()) {
                            Some(0) => (limit, min_one_batch) = (0, false),
                            Some(allowed) => limit = limit.min(allowed),
                            None => {}
                        }
                    }
                    let read = partition.read(
                        fp.fetch_offset,
                        limit,
                        min_one_batch,
                        fp.current_leader_epoch,
                        replica,
                        read_committed,
                    );
                    match read {
                        Ok(r) => {
                            if throttled {
                                ctx.replicas.leader_throttle.record(r.records.len(), mono_ms());
                            }
                            if r.joins_isr {
                                ctx.replicas.wake_isr();
                            }
                            total += r.records.len();
                            budget = budget.saturating_sub(r.records.len());
                            let aborted = r
                                .aborted
                                .iter()
                                .map(|t| {
                                    AbortedTransaction::default()
                                        .with_producer_id(kafka_protocol::messages::ProducerId(t.producer_id))
                                        .with_first_offset(t.first_offset)
                                })
                                .collect();
                            empty(fp.partition, 0)
                                .with_high_watermark(r.high_watermark)
                                .with_last_stable_offset(r.last_stable_offset)
                                .with_log_start_offset(r.log_start_offset)
                                .with_aborted_transactions(Some(aborted))
                                .with_records(Some(slices.add(r.records)))
                        }
                        // Out of range: the log start offset and high watermark
                        // tell a follower (or a consumer's reset) where the log is.
                        Err(e @ PartitionError::Log(LogError::OffsetOutOfRange { .. })) => {
                            let o = partition.offsets();
                            // Past its own end, a leader cut off from the controller
                            // cannot tell "out of range" from "behind a leader that
                            // replaced it"; a consumer told OFFSET_OUT_OF_RANGE resets
                            // its position (librdkafka goes back to the start, found by
                            // the fault harness, seed 212), so it is sent to fresh
                            // metadata instead.
                            if fp.fetch_offset > o.log_end_offset && ctx.lifecycle.out_of_touch() {
                                return empty(fp.partition, ResponseError::NotLeaderOrFollower.code());
                            }
                            empty(fp.partition, partition_error_code(&e))
                                .with_high_watermark(o.high_watermark)
                                .with_last_stable_offset(o.high_watermark)
                                .with_log_start_offset(o.log_start_offset)
                        }
                        Err(e) => empty(fp.partition, partition_error_code(&e)),
                    }
                })
                .collect();
            FetchableTopicResponse::default().with_topic(topic.clone()).with_partitions(partitions)
        })
        .collect();
    (topics, slices, total)
}

/// The answer, and the file ranges its records fields stand for.
pub async fn handle(
    ctx: &NodeContext,
    request: FetchRequest,
    version: i16,
    client: &Client,
) -> (FetchResponse, RecordSlices) {
    let replica = [request.replica_id.0, request.replica_state.replica_id.0].into_iter().find(|id| *id >= 0);
    // Stamped on arrival: the position this request carries stops counting
    // if its replica is removed and added back while it waits.
    let replica_fetch = replica.map(ReplicaFetch::now);
    let owner = Owner { principal: client.principal.clone(), replica };
    let (kind, plan) = match ctx.fetch_sessions.begin(&request, &owner, mono_ms().max(0) as u64) {
        Ok(begun) => begun,
        Err(e) => {
            let answer = FetchResponse::default().with_error_code(e.code()).with_session_id(0);
            return (answer, RecordSlices::default());
        }
    };
    // A follower needs CLUSTER_ACTION on the cluster; a consumer READ on each topic.
    let image = ctx.quorum.image();
    let readable: Vec<bool> = match replica {
        Some(_) => vec![ctx.authorize_cluster(client, &image, Operation::ClusterAction); plan.len()],
        None => plan
            .iter()
            .map(|(topic, _)| ctx.authorize(client, &image, Operation::Read, ResourceType::Topic, topic.0.as_str()))
            .collect(),
    };
    drop(image);
    let deadline = Instant::now() + Duration::from_millis(request.max_wait_ms.max(0) as u64).min(MAX_WAIT_CAP);
    let min_bytes = request.min_bytes.max(0) as usize;
    let read_committed = request.isolation_level == 1;
    // Subscribed before the lookup, so a change of roles after it wakes the wait.
    let mut roles = ctx.replicas.subscribe();
    let mut resolved = resolve(ctx, &plan);
    warm_far_behind(&plan, &resolved, &readable).await;
    loop {
        // Subscribe before reading, so an append between the read and the
        // wait still wakes us; past the deadline there is no wait to wake.
        let mut watches: Vec<_> = match Instant::now() < deadline {
            true => resolved
                .iter()
                .flatten()
                .flatten()
                .map(|p| if replica.is_some() { p.subscribe_log_end() } else { p.subscribe() })
                .collect(),
            false => Vec::new(),
        };
        let (mut topics, slices, bytes) =
            read_all(ctx, request.max_bytes, &plan, &resolved, replica_fetch, &readable, read_committed);
        if version < 5 {
            // The log start offset is not in responses before v5.
            topics.iter_mut().flat_map(|t| t.partitions.iter_mut()).for_each(|p| p.log_start_offset = -1);
        }
        let now = Instant::now();
        let any_error = topics.iter().flat_map(|t| &t.partitions).any(|p| p.error_code != 0);
        if bytes >= min_bytes || now >= deadline || any_error || watches.is_empty() {
            ctx.fetch_sessions.finish(kind, &mut topics);
            return (FetchResponse::default().with_responses(topics).with_session_id(kind.session_id()), slices);
        }
        let changes: Vec<_> = watches.iter_mut().map(|w| Box::pin(w.changed())).collect();
        tokio::select! {
            _ = select_all(changes) => {}
            _ = roles.changed() => resolved = resolve(ctx, &plan),
            _ = tokio::time::sleep_until(deadline.into()) => {}
        }
    }
}

/// Warms, on a blocking thread, the file ranges that the reads of `plan`
/// far behind their logs' ends will make (a lagging consumer, a replica
/// catching up), so that the read, which scans batch headers under the
/// partition's lock, and the send from the connection's async thread find
/// them in the page cache instead of waiting for the disk. Reads near the
/// end (consumers keeping up) need none, and cost nothing here.
async fn warm_far_behind(plan: &Plan, resolved: &Resolved, readable: &[bool]) {
    let cold: Vec<FileSlice> = plan
        .iter()
        .zip(resolved)
        .zip(readable)
        .filter(|(_, &readable)| readable)
        .flat_map(|(((_, wants), hosted), _)| {
            wants.iter().zip(hosted).filter_map(|(fp, partition)| {
                partition.as_ref()?.prefetch_range(fp.fetch_offset, fp.partition_max_bytes.max(0) as u64)
            })
        })
        .collect();
    if cold.is_empty() {
        return;
    }
    let warmed = tokio::task::spawn_blocking(move || {
        for slice in cold {
            if let Err(e) = slice.warm() {
                tracing::debug!(error = %e, "warming a fetch's records failed; they are read as they are");
            }
        }
    })
    .await;
    if let Err(e) = warmed {
        if e.is_panic() {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}
