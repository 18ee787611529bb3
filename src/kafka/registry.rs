//! The supported Kafka APIs: one table that both dispatches requests and
//! answers ApiVersions, so the advertised versions cannot drift from the code.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{ApiKey, ApiVersionsResponse, RequestKind, ResponseKind};
use kafka_protocol::protocol::{StrBytes, VersionRange};
use kafka_protocol::ResponseError;

use super::connection::{encode_response, Request};
use super::frame::{RecordSlices, ResponseFrame};
use super::handlers;
use crate::node::NodeContext;
use crate::security::quotas::{self, QuotaKind};

/// (API, lowest version, highest version) that Strom implements.
pub const APIS: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 9),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 7),
    (ApiKey::Metadata, 0, 12),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::OffsetForLeaderEpoch, 2, 4),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::DescribeCluster, 0, 1),
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::OffsetCommit, 2, 9),
    (ApiKey::OffsetFetch, 1, 9),
    (ApiKey::ListGroups, 0, 5),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::OffsetDelete, 0, 0),
    (ApiKey::ConsumerGroupHeartbeat, 0, 1),
    (ApiKey::ConsumerGroupDescribe, 0, 1),
    (ApiKey::AlterPartitionReassignments, 0, 1),
    (ApiKey::ListPartitionReassignments, 0, 0),
    (ApiKey::DeleteRecords, 0, 2),
    (ApiKey::ElectLeaders, 0, 2),
    (ApiKey::DescribeLogDirs, 1, 4),
    (ApiKey::DescribeProducers, 0, 0),
    (ApiKey::WriteTxnMarkers, 1, 1),
    (ApiKey::AddPartitionsToTxn, 0, 4),
    (ApiKey::AddOffsetsToTxn, 0, 3),
    (ApiKey::EndTxn, 0, 4),
    (ApiKey::TxnOffsetCommit, 0, 3),
    (ApiKey::DescribeTransactions, 0, 0),
    (ApiKey::ListTransactions, 0, 2),
    (ApiKey::DescribeTopicPartitions, 0, 0),
    (ApiKey::DescribeQuorum, 0, 1),
    (ApiKey::UnregisterBroker, 0, 0),
    (ApiKey::AddRaftVoter, 0, 0),
    (ApiKey::RemoveRaftVoter, 0, 0),
    // After a v0 SaslHandshake the SASL tokens travel as bare frames, not in SaslAuthenticate.
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
    (ApiKey::DescribeUserScramCredentials, 0, 0),
    (ApiKey::AlterUserScramCredentials, 0, 0),
    (ApiKey::DescribeAcls, 1, 3),
    (ApiKey::CreateAcls, 1, 3),
    (ApiKey::DeleteAcls, 1, 3),
    (ApiKey::DescribeClientQuotas, 0, 1),
    (ApiKey::AlterClientQuotas, 0, 1),
];

pub fn supported(api: ApiKey) -> Option<VersionRange> {
    APIS.iter().find(|(k, _, _)| *k == api).map(|(_, min, max)| VersionRange { min: *min, max: *max })
}

fn api_versions(error_code: i16) -> ApiVersionsResponse {
    let mut r = ApiVersionsResponse::default();
    r.error_code = error_code;
    r.api_keys = APIS
        .iter()
        .map(|(k, min, max)| {
            ApiVersion::default().with_api_key(*k as i16).with_min_version(*min).with_max_version(*max)
        })
        .collect();
    r
}

/// The v0 answer to an ApiVersions request newer than we know (KIP-511).
pub fn api_versions_unsupported(correlation_id: i32) -> Option<ResponseFrame> {
    let body = ResponseKind::ApiVersions(api_versions(ResponseError::UnsupportedVersion.code()));
    encode_response(ApiKey::ApiVersions, 0, correlation_id, &body).ok().map(ResponseFrame::from_bytes)
}

/// Who sent a request, for the APIs that record it (group members). Cheap
/// to build for every request: the id shares the request's buffer.
#[derive(Debug, Clone)]
pub struct Client {
    pub host: IpAddr,
    pub id: Option<StrBytes>,
    /// The Kafka listener the request came in on.
    pub listener: Arc<str>,
    /// Who sent it: `User:NAME` after SASL, `User:<certificate subject>`
    /// for a TLS client certificate, else `User:ANONYMOUS`.
    pub principal: Arc<str>,
    /// The connection's mute, for quota throttling.
    pub mute: Arc<Mute>,
    /// Time spent on this request so far, while a `request_percentage`
    /// quota exists anywhere.
    pub clock: Option<Arc<RequestClock>>,
}

/// The time spent handling one request: its dispatch and the polls of its
/// response future, up to now (a poll in progress counts up to now).
#[derive(Debug, Default)]
pub struct RequestClock {
    /// Time of the finished polls, and when the current one began.
    state: std::sync::Mutex<(Duration, Option<Instant>)>,
}

impl RequestClock {
    fn lock(&self) -> std::sync::MutexGuard<'_, (Duration, Option<Instant>)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn start(&self) {
        self.lock().1 = Some(Instant::now());
    }

    fn stop(&self) {
        let mut st = self.lock();
        if let Some(began) = st.1.take() {
            st.0 += began.elapsed();
        }
    }

    /// The time spent so far.
    pub fn spent(&self) -> Duration {
        let st = self.lock();
        st.0 + st.1.map_or(Duration::ZERO, |began| began.elapsed())
    }
}

/// Until when a connection reads nothing more (KIP-219: a throttled
/// client's connection is muted for its throttle time).
#[derive(Debug, Default)]
pub struct Mute {
    /// `clock::mono_ms` of the end of the mute; 0: not muted.
    until_ms: std::sync::atomic::AtomicI64,
}

impl Mute {
    pub fn mute_for(&self, ms: u64) {
        let until = crate::clock::mono_ms() + ms as i64;
        self.until_ms.fetch_max(until, std::sync::atomic::Ordering::AcqRel);
    }

    /// Waits out the mute, if any.
    pub async fn wait(&self) {
        let until = self.until_ms.load(std::sync::atomic::Ordering::Acquire);
        let left = until - crate::clock::mono_ms();
        if left > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(left as u64)).await;
        }
    }
}

/// What a connection knows about its client.
#[derive(Debug, Clone)]
pub struct Session {
    pub host: IpAddr,
    pub listener: Arc<str>,
    pub principal: Arc<str>,
    pub mute: Arc<Mute>,
}

/// A response being worked out; `None` when no answer is due (acks=0).
pub type PendingResponse = Pin<Box<dyn Future<Output = Option<ResponseFrame>> + Send>>;

/// Starts handling `request`. Produce appends are made before this returns,
/// in the connection's request order (large ones on a blocking thread: they
/// write to the disk); everything that waits (acks=all, long-poll fetches,
/// controller round trips) runs in the returned future.
pub async fn dispatch(ctx: Arc<NodeContext>, request: Request, session: &Session) -> PendingResponse {
    // With a `request_percentage` quota somewhere, the time spent handling
    // each request counts against it, and the throttle goes in its answer.
    let clock = ctx
        .quorum
        .image()
        .client_quotas
        .values()
        .any(|q| q.contains_key(quotas::REQUEST_PERCENTAGE))
        .then(|| Arc::new(RequestClock::default()));
    let client = Client {
        host: session.host,
        id: request.header.client_id.clone(),
        listener: session.listener.clone(),
        principal: session.principal.clone(),
        mute: session.mute.clone(),
        clock: clock.clone(),
    };
    let Some(clock) = clock else {
        return dispatch_as(ctx, request, client).await;
    };
    clock.start();
    let pending = dispatch_as(ctx, request, client).await;
    clock.stop();
    Box::pin(Timed { inner: pending, clock })
}

/// A response future whose polls are timed on the request's clock.
struct Timed {
    inner: PendingResponse,
    clock: Arc<RequestClock>,
}

impl Future for Timed {
    type Output = Option<ResponseFrame>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        self.clock.start();
        let polled = self.inner.as_mut().poll(cx);
        self.clock.stop();
        polled
    }
}

/// Records the time `client`'s request took against its `request_percentage`
/// quota; the throttle time in ms that results (0 without such a quota).
fn request_throttle(ctx: &NodeContext, client: &Client) -> i32 {
    match &client.clock {
        Some(clock) => ctx.throttle(client, QuotaKind::Request, clock.spent().as_micros() as usize),
        None => 0,
    }
}

/// Puts the request quota's throttle time into `response` where it is
/// longer than the one already there (a byte-rate quota's).
fn add_throttle(response: &mut ResponseKind, ms: i32) {
    macro_rules! throttled {
        ($($kind:ident),* $(,)?) => {
            match response {
                $(ResponseKind::$kind(r) => r.throttle_time_ms = r.throttle_time_ms.max(ms),)*
                _ => {}
            }
        };
    }
    if ms <= 0 {
        return;
    }
    throttled!(
        Produce,
        Fetch,
        ListOffsets,
        Metadata,
        ApiVersions,
        CreateTopics,
        DeleteTopics,
        InitProducerId,
        OffsetForLeaderEpoch,
        DescribeConfigs,
        AlterConfigs,
        CreatePartitions,
        IncrementalAlterConfigs,
        DescribeCluster,
        FindCoordinator,
        JoinGroup,
        SyncGroup,
        Heartbeat,
        LeaveGroup,
        OffsetCommit,
        OffsetFetch,
        ListGroups,
        DescribeGroups,
        DeleteGroups,
        OffsetDelete,
        ConsumerGroupHeartbeat,
        ConsumerGroupDescribe,
        DeleteRecords,
        AlterPartitionReassignments,
        ListPartitionReassignments,
        DescribeLogDirs,
        DescribeProducers,
        AddPartitionsToTxn,
        AddOffsetsToTxn,
        EndTxn,
        TxnOffsetCommit,
        DescribeTransactions,
        ListTransactions,
        ElectLeaders,
        DescribeClientQuotas,
        AlterClientQuotas,
        CreateAcls,
        DescribeAcls,
        DeleteAcls,
        DescribeUserScramCredentials,
        AlterUserScramCredentials,
        DescribeTopicPartitions,
        UnregisterBroker,
        AddRaftVoter,
        RemoveRaftVoter,
    );
}

async fn dispatch_as(ctx: Arc<NodeContext>, request: Request, client: Client) -> PendingResponse {
    let (api, version, correlation_id) =
        (request.api, request.header.request_api_version, request.header.correlation_id);
    match request.body {
        RequestKind::Produce(r) => {
            let bytes: usize = r
                .topic_data
                .iter()
                .flat_map(|t| t.partition_data.iter())
                .map(|p| p.records.as_ref().map_or(0, |r| r.len()))
                .sum();
            // A transaction's first batches in a partition are checked with
            // its coordinator first (KIP-890), still in the request order.
            let refused = handlers::txn::verify_produce(&ctx, &r).await;
            // A large append runs on a blocking thread, a small one here
            // (see APPEND_OFF_THREAD_BYTES).
            let in_flight = if bytes < crate::replication::APPEND_OFF_THREAD_BYTES {
                handlers::produce::append(&ctx, r, version, &client, &refused)
            } else {
                let (ctx, client) = (ctx.clone(), client.clone());
                let append = move || handlers::produce::append(&ctx, r, version, &client, &refused);
                match tokio::task::spawn_blocking(append).await {
                    Ok(in_flight) => in_flight,
                    // A panic in an append is a bug: it ends this connection, as it would in the reader.
                    Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                    // The runtime is shutting down: no answer.
                    Err(_) => return Box::pin(async { None }),
                }
            };
            let throttle_ms = ctx.throttle(&client, QuotaKind::Produce, bytes);
            Box::pin(async move {
                let mut produced = in_flight.finish().await?;
                produced.throttle_time_ms = throttle_ms;
                let mut response = ResponseKind::Produce(produced);
                add_throttle(&mut response, request_throttle(&ctx, &client));
                encode(api, version, correlation_id, &response, RecordSlices::default())
            })
        }
        body => Box::pin(async move { handle(&ctx, api, version, correlation_id, body, client).await }),
    }
}

/// The response's frame, with `records` spliced in where their markers are.
fn encode(
    api: ApiKey,
    version: i16,
    correlation_id: i32,
    response: &ResponseKind,
    records: RecordSlices,
) -> Option<ResponseFrame> {
    let flexible = api.response_header_version(version) >= 1;
    let frame = encode_response(api, version, correlation_id, response)
        .and_then(|encoded| ResponseFrame::splice(encoded, records, flexible));
    match frame {
        Ok(frame) => Some(frame),
        Err(e) => {
            tracing::error!(?api, version, error = %e, "cannot encode a response");
            None
        }
    }
}

async fn handle(
    ctx: &NodeContext,
    api: ApiKey,
    version: i16,
    correlation_id: i32,
    body: RequestKind,
    client: Client,
) -> Option<ResponseFrame> {
    let mut records = RecordSlices::default();
    if let Some(op) = handlers::denied::cluster_operation(api) {
        if !ctx.authorize_cluster(&client, &ctx.quorum.image(), op) {
            tracing::info!(?api, principal = %client.principal, host = %client.host, "cluster authorization failed");
            let mut response = handlers::denied::refusal(body)?;
            add_throttle(&mut response, request_throttle(ctx, &client));
            return encode(api, version, correlation_id, &response, records);
        }
    }
    let mut response = match body {
        RequestKind::ApiVersions(_) => ResponseKind::ApiVersions(api_versions(0)),
        RequestKind::Metadata(r) => ResponseKind::Metadata(handlers::metadata::handle(ctx, r, version, &client).await),
        RequestKind::DescribeTopicPartitions(r) => {
            ResponseKind::DescribeTopicPartitions(handlers::topic_partitions::handle(ctx, r, &client))
        }
        RequestKind::FindCoordinator(r) => {
            ResponseKind::FindCoordinator(handlers::groups::find(ctx, r, version, &client).await)
        }
        RequestKind::JoinGroup(r) => ResponseKind::JoinGroup(handlers::groups::join(ctx, r, version, &client).await),
        RequestKind::SyncGroup(r) => ResponseKind::SyncGroup(handlers::groups::sync(ctx, r, version, &client).await),
        RequestKind::Heartbeat(r) => ResponseKind::Heartbeat(handlers::groups::heartbeat(ctx, r, version, &client)),
        RequestKind::LeaveGroup(r) => ResponseKind::LeaveGroup(handlers::groups::leave(ctx, r, version, &client)),
        RequestKind::OffsetCommit(r) => {
            ResponseKind::OffsetCommit(handlers::groups::commit(ctx, r, version, &client).await)
        }
        RequestKind::OffsetFetch(r) => {
            ResponseKind::OffsetFetch(handlers::groups::fetch_offsets(ctx, r, version, &client))
        }
        RequestKind::ConsumerGroupHeartbeat(r) => {
            ResponseKind::ConsumerGroupHeartbeat(handlers::consumer_groups::heartbeat(ctx, r, version, &client).await)
        }
        RequestKind::ConsumerGroupDescribe(r) => {
            ResponseKind::ConsumerGroupDescribe(handlers::consumer_groups::describe(ctx, r, version, &client))
        }
        RequestKind::ListGroups(r) => ResponseKind::ListGroups(handlers::groups::list(ctx, r, version, &client)),
        RequestKind::DescribeGroups(r) => {
            ResponseKind::DescribeGroups(handlers::groups::describe(ctx, r, version, &client))
        }
        RequestKind::DeleteGroups(r) => ResponseKind::DeleteGroups(handlers::groups::delete(ctx, r, &client).await),
        RequestKind::OffsetDelete(r) => {
            ResponseKind::OffsetDelete(handlers::groups::delete_offsets(ctx, r, &client).await)
        }
        RequestKind::Fetch(r) => {
            let follower = r.replica_id.0 >= 0 || r.replica_state.replica_id.0 >= 0;
            let (mut response, slices) = handlers::fetch::handle(ctx, r, version, &client).await;
            records = slices;
            if !follower {
                let (send, throttle_ms) = ctx.admit_fetch(&client, records.len());
                response.throttle_time_ms = throttle_ms;
                if !send {
                    // Over the consumer quota: the partitions without their
                    // records (the client fetches the same offsets again).
                    for p in response.responses.iter_mut().flat_map(|t| t.partitions.iter_mut()) {
                        p.records = Some(bytes::Bytes::new());
                    }
                    records = RecordSlices::default();
                }
            }
            ResponseKind::Fetch(response)
        }
        RequestKind::ListOffsets(r) => {
            ResponseKind::ListOffsets(handlers::list_offsets::handle(ctx, r, version, &client))
        }
        RequestKind::DeleteRecords(r) => ResponseKind::DeleteRecords(handlers::delete_records::handle(ctx, r, &client)),
        RequestKind::OffsetForLeaderEpoch(r) => {
            ResponseKind::OffsetForLeaderEpoch(handlers::list_offsets::leader_epoch(ctx, r, &client))
        }
        RequestKind::CreateTopics(r) => {
            ResponseKind::CreateTopics(handlers::topics::create(ctx, r, version, &client).await)
        }
        RequestKind::DeleteTopics(r) => {
            ResponseKind::DeleteTopics(handlers::topics::delete(ctx, r, version, &client).await)
        }
        RequestKind::CreatePartitions(r) => {
            ResponseKind::CreatePartitions(handlers::topics::partitions(ctx, r, &client).await)
        }
        RequestKind::AlterPartitionReassignments(r) => {
            ResponseKind::AlterPartitionReassignments(handlers::reassignments::alter(ctx, r, version).await)
        }
        RequestKind::DescribeQuorum(r) => ResponseKind::DescribeQuorum(handlers::quorum::describe(ctx, r).await),
        RequestKind::UnregisterBroker(r) => ResponseKind::UnregisterBroker(handlers::quorum::unregister(ctx, r).await),
        RequestKind::AddRaftVoter(r) => ResponseKind::AddRaftVoter(handlers::quorum::add_voter(ctx, r).await),
        RequestKind::RemoveRaftVoter(r) => ResponseKind::RemoveRaftVoter(handlers::quorum::remove_voter(ctx, r).await),
        RequestKind::DescribeLogDirs(r) => ResponseKind::DescribeLogDirs(handlers::log_dirs::handle(ctx, r)),
        RequestKind::DescribeProducers(r) => {
            ResponseKind::DescribeProducers(handlers::producers::handle(ctx, r, &client))
        }
        RequestKind::ElectLeaders(r) => ResponseKind::ElectLeaders(handlers::elections::handle(ctx, r, version).await),
        RequestKind::ListPartitionReassignments(r) => {
            ResponseKind::ListPartitionReassignments(handlers::reassignments::list(ctx, r))
        }
        RequestKind::DescribeConfigs(r) => ResponseKind::DescribeConfigs(handlers::configs::describe(ctx, r, &client)),
        RequestKind::AlterConfigs(r) => ResponseKind::AlterConfigs(handlers::configs::alter(ctx, r, &client).await),
        RequestKind::IncrementalAlterConfigs(r) => {
            ResponseKind::IncrementalAlterConfigs(handlers::configs::incremental_alter(ctx, r, &client).await)
        }
        RequestKind::DescribeCluster(r) => {
            ResponseKind::DescribeCluster(handlers::cluster::describe(ctx, r, version, &client))
        }
        RequestKind::DescribeClientQuotas(r) => ResponseKind::DescribeClientQuotas(handlers::quotas::describe(ctx, r)),
        RequestKind::AlterClientQuotas(r) => ResponseKind::AlterClientQuotas(handlers::quotas::alter(ctx, r).await),
        RequestKind::CreateAcls(r) => ResponseKind::CreateAcls(handlers::acls::create(ctx, r).await),
        RequestKind::DescribeAcls(r) => ResponseKind::DescribeAcls(handlers::acls::describe(ctx, r)),
        RequestKind::DeleteAcls(r) => ResponseKind::DeleteAcls(handlers::acls::delete(ctx, r).await),
        RequestKind::DescribeUserScramCredentials(r) => {
            ResponseKind::DescribeUserScramCredentials(handlers::users::describe(ctx, r))
        }
        RequestKind::AlterUserScramCredentials(r) => {
            ResponseKind::AlterUserScramCredentials(handlers::users::alter(ctx, r).await)
        }
        RequestKind::InitProducerId(r) => {
            ResponseKind::InitProducerId(handlers::cluster::init_producer_id(ctx, r, version, &client).await)
        }
        RequestKind::WriteTxnMarkers(r) => ResponseKind::WriteTxnMarkers(handlers::txn_markers::handle(ctx, r).await),
        RequestKind::AddPartitionsToTxn(r) => {
            ResponseKind::AddPartitionsToTxn(handlers::txn::add_partitions(ctx, r, version, &client).await)
        }
        RequestKind::AddOffsetsToTxn(r) => {
            ResponseKind::AddOffsetsToTxn(handlers::txn::add_offsets(ctx, r, version, &client).await)
        }
        RequestKind::EndTxn(r) => ResponseKind::EndTxn(handlers::txn::end(ctx, r, version, &client).await),
        RequestKind::TxnOffsetCommit(r) => {
            ResponseKind::TxnOffsetCommit(handlers::txn::commit_offsets(ctx, r, version, &client).await)
        }
        RequestKind::DescribeTransactions(r) => {
            ResponseKind::DescribeTransactions(handlers::txn::describe(ctx, r, &client))
        }
        RequestKind::ListTransactions(r) => ResponseKind::ListTransactions(handlers::txn::list(ctx, r, &client)),
        other => {
            tracing::warn!(?api, "no handler for a request the registry accepted: {other:?}");
            return None;
        }
    };
    add_throttle(&mut response, request_throttle(ctx, &client));
    encode(api, version, correlation_id, &response, records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertised_versions_are_within_what_the_codec_knows() {
        for (api, min, max) in APIS {
            let codec = api.valid_versions();
            assert!(min <= max && *min >= codec.min && *max <= codec.max, "{api:?} {min}..{max} vs {codec}");
        }
    }
}
