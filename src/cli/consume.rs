//! `strom topic consume`: records printed to stdout in a format of the
//! caller's choosing (kcat's `-f` tokens), from the end of the log, from its
//! beginning, or as a member of a consumer group (Kafka's classic group
//! protocol with the range assignor, committing what it has printed).

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition as AssignedPartitions;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    BrokerId, ConsumerProtocolAssignment, ConsumerProtocolSubscription, FetchRequest, FindCoordinatorRequest, GroupId,
    HeartbeatRequest, JoinGroupRequest, LeaveGroupRequest, ListOffsetsRequest, OffsetCommitRequest, OffsetFetchRequest,
    SyncGroupRequest, TopicName,
};
use kafka_protocol::protocol::{Encodable, StrBytes};
use kafka_protocol::records::{Record, RecordBatchDecoder};

use super::kafka::{error_name, retriable, KafkaClient, TopicLayout};
use super::{Api, CliResult};

/// What `strom topic consume` was asked.
pub struct ConsumeOptions {
    pub topic: String,
    pub bootstrap: Option<String>,
    pub from_beginning: bool,
    pub group: Option<String>,
    pub format: String,
    pub count: Option<u64>,
    pub partition: Option<i32>,
}

const FETCH_WAIT_MS: i32 = 500;
const HEARTBEAT_EVERY: Duration = Duration::from_secs(3);
const SESSION_TIMEOUT_MS: i32 = 30_000;
const REBALANCE_TIMEOUT_MS: i32 = 30_000;
const ASSIGNOR: &str = "range";

// ---- output format -------------------------------------------------------------

/// One piece of a `--format`.
#[derive(Debug, Clone, PartialEq)]
enum Token {
    Text(String),
    Topic,
    Partition,
    Offset,
    Key,
    Value,
    Timestamp,
    Headers,
}

/// A parsed `--format`: kcat's tokens (`%t` topic, `%p` partition, `%o`
/// offset, `%k` key, `%s` value (`%v` too), `%T` timestamp in ms, `%h`
/// headers as k=v,..., `%%` a percent sign) and the escapes `\n`, `\t`, `\\`.
#[derive(Debug, Clone, PartialEq)]
pub struct Format(Vec<Token>);

impl Format {
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut tokens = Vec::new();
        let mut literal = String::new();
        let mut chars = text.chars();
        while let Some(c) = chars.next() {
            match c {
                '%' => {
                    let token = match chars.next() {
                        Some('t') => Token::Topic,
                        Some('p') => Token::Partition,
                        Some('o') => Token::Offset,
                        Some('k') => Token::Key,
                        Some('s' | 'v') => Token::Value,
                        Some('T') => Token::Timestamp,
                        Some('h') => Token::Headers,
                        Some('%') => {
                            literal.push('%');
                            continue;
                        }
                        Some(other) => {
                            return Err(format!("--format: unknown token %{other} (use %t %p %o %k %s %T %h %%)"))
                        }
                        None => return Err("--format ends with a lone %".into()),
                    };
                    if !literal.is_empty() {
                        tokens.push(Token::Text(std::mem::take(&mut literal)));
                    }
                    tokens.push(token);
                }
                '\\' => match chars.next() {
                    Some('n') => literal.push('\n'),
                    Some('t') => literal.push('\t'),
                    Some('\\') => literal.push('\\'),
                    Some(other) => {
                        literal.push('\\');
                        literal.push(other);
                    }
                    None => literal.push('\\'),
                },
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            tokens.push(Token::Text(literal));
        }
        Ok(Self(tokens))
    }

    fn write(&self, out: &mut impl Write, topic: &str, partition: i32, record: &Record) -> std::io::Result<()> {
        for token in &self.0 {
            match token {
                Token::Text(s) => out.write_all(s.as_bytes())?,
                Token::Topic => out.write_all(topic.as_bytes())?,
                Token::Partition => write!(out, "{partition}")?,
                Token::Offset => write!(out, "{}", record.offset)?,
                Token::Key => out.write_all(record.key.as_deref().unwrap_or_default())?,
                Token::Value => out.write_all(record.value.as_deref().unwrap_or_default())?,
                Token::Timestamp => write!(out, "{}", record.timestamp)?,
                Token::Headers => {
                    for (i, (k, v)) in record.headers.iter().enumerate() {
                        if i > 0 {
                            out.write_all(b",")?;
                        }
                        out.write_all(k.as_bytes())?;
                        out.write_all(b"=")?;
                        out.write_all(v.as_deref().unwrap_or_default())?;
                    }
                }
            }
        }
        Ok(())
    }
}

// ---- the range assignor --------------------------------------------------------

/// Kafka's RangeAssignor for one topic: members sorted by id, each takes
/// `P / C` consecutive partitions and the first `P % C` one more (8
/// partitions over 3 members: 3/3/2).
pub fn range_assign(members: &[String], partitions: i32) -> BTreeMap<String, Vec<i32>> {
    let mut sorted: Vec<&String> = members.iter().collect();
    sorted.sort();
    sorted.dedup();
    let mut out = BTreeMap::new();
    let count = sorted.len() as i32;
    if count == 0 {
        return out;
    }
    let (each, extra) = (partitions / count, partitions % count);
    for (i, member) in sorted.into_iter().enumerate() {
        let i = i as i32;
        let start = i * each + i.min(extra);
        let len = each + i32::from(i < extra);
        out.insert(member.clone(), (start..start + len).collect());
    }
    out
}

fn versioned<T: Encodable>(message: &T, version: i16) -> Result<Bytes, String> {
    let mut buf = BytesMut::new();
    buf.extend_from_slice(&version.to_be_bytes());
    message.encode(&mut buf, version).map_err(|e| e.to_string())?;
    Ok(buf.freeze())
}

/// The assignments the group's leader hands out: the range assignor over
/// every topic the members subscribe to.
async fn assign_group(
    client: &mut KafkaClient,
    members: &[(String, Vec<String>)],
) -> Result<Vec<SyncGroupRequestAssignment>, String> {
    let mut topics: Vec<&String> = members.iter().flat_map(|(_, t)| t).collect();
    topics.sort();
    topics.dedup();
    let mut per_member: BTreeMap<String, Vec<AssignedPartitions>> =
        members.iter().map(|(m, _)| (m.clone(), Vec::new())).collect();
    for topic in topics {
        let partitions = match client.layout(topic).await {
            Ok(layout) => layout.leaders.len() as i32,
            Err(_) => continue, // a topic that does not exist (yet) assigns nothing
        };
        let subscribers: Vec<String> =
            members.iter().filter(|(_, t)| t.contains(topic)).map(|(m, _)| m.clone()).collect();
        for (member, ps) in range_assign(&subscribers, partitions) {
            if !ps.is_empty() {
                per_member.entry(member).or_default().push(
                    AssignedPartitions::default()
                        .with_topic(TopicName(StrBytes::from_string(topic.clone())))
                        .with_partitions(ps),
                );
            }
        }
    }
    per_member
        .into_iter()
        .map(|(member, assigned)| {
            let bytes = versioned(&ConsumerProtocolAssignment::default().with_assigned_partitions(assigned), 0)?;
            Ok(SyncGroupRequestAssignment::default()
                .with_member_id(StrBytes::from_string(member))
                .with_assignment(bytes))
        })
        .collect()
}

// ---- group membership ----------------------------------------------------------

struct Member {
    group: String,
    member_id: String,
    generation: i32,
    coordinator: i32,
    last_heartbeat: Instant,
}

fn group_id(group: &str) -> GroupId {
    GroupId(StrBytes::from_string(group.to_string()))
}

/// Whether a coordinator error means: find the coordinator again.
fn coordinator_moved(code: i16) -> bool {
    matches!(
        ResponseError::try_from_code(code),
        Some(
            ResponseError::NotCoordinator
                | ResponseError::CoordinatorNotAvailable
                | ResponseError::CoordinatorLoadInProgress
        )
    )
}

/// Whether a group error means: this member must join again.
fn must_rejoin(code: i16) -> bool {
    matches!(
        ResponseError::try_from_code(code),
        Some(
            ResponseError::RebalanceInProgress
                | ResponseError::IllegalGeneration
                | ResponseError::UnknownMemberId
                | ResponseError::FencedInstanceId
        )
    )
}

impl Member {
    async fn find_coordinator(&mut self, client: &mut KafkaClient, deadline: Instant) -> Result<(), String> {
        loop {
            let request = FindCoordinatorRequest::default().with_key(StrBytes::from_string(self.group.clone()));
            let response = client.send_any(&request, 3).await?;
            if response.error_code == 0 {
                client.learn_broker(response.node_id, &response.host, response.port);
                self.coordinator = response.node_id.0;
                return Ok(());
            }
            if !retriable(response.error_code) || Instant::now() > deadline {
                return Err(format!("FindCoordinator for group {}: {}", self.group, error_name(response.error_code)));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Joins (or rejoins) the group; returns this member's partitions of `topic`.
    async fn join(&mut self, client: &mut KafkaClient, topic: &str) -> Result<Vec<i32>, String> {
        let deadline = Instant::now() + Duration::from_secs(120);
        let subscription = versioned(
            &ConsumerProtocolSubscription::default().with_topics(vec![StrBytes::from_string(topic.to_string())]),
            0,
        )?;
        if self.coordinator < 0 {
            self.find_coordinator(client, deadline).await?;
        }
        loop {
            if Instant::now() > deadline {
                return Err(format!("could not join group {} within 120 s", self.group));
            }
            let join = JoinGroupRequest::default()
                .with_group_id(group_id(&self.group))
                .with_session_timeout_ms(SESSION_TIMEOUT_MS)
                .with_rebalance_timeout_ms(REBALANCE_TIMEOUT_MS)
                .with_member_id(StrBytes::from_string(self.member_id.clone()))
                .with_protocol_type(StrBytes::from_static_str("consumer"))
                .with_protocols(vec![JoinGroupRequestProtocol::default()
                    .with_name(StrBytes::from_static_str(ASSIGNOR))
                    .with_metadata(subscription.clone())]);
            let joined = match client.send_to_broker(self.coordinator, &join, 7).await {
                Ok(r) => r,
                Err(_) => {
                    self.find_coordinator(client, deadline).await?;
                    continue;
                }
            };
            match ResponseError::try_from_code(joined.error_code) {
                None => {}
                Some(ResponseError::MemberIdRequired) => {
                    self.member_id = joined.member_id.to_string();
                    continue;
                }
                Some(ResponseError::UnknownMemberId) => {
                    self.member_id.clear();
                    continue;
                }
                Some(_) if coordinator_moved(joined.error_code) => {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    self.find_coordinator(client, deadline).await?;
                    continue;
                }
                Some(ResponseError::RebalanceInProgress) => continue,
                Some(_) => return Err(format!("JoinGroup {}: {}", self.group, error_name(joined.error_code))),
            }
            self.member_id = joined.member_id.to_string();
            self.generation = joined.generation_id;
            let assignments = if joined.leader == joined.member_id {
                let members: Vec<(String, Vec<String>)> = joined
                    .members
                    .iter()
                    .map(|m| {
                        let topics = crate::group::assignment::decode_subscription(&m.metadata).unwrap_or_default();
                        (m.member_id.to_string(), topics)
                    })
                    .collect();
                assign_group(client, &members).await?
            } else {
                Vec::new()
            };
            let sync = SyncGroupRequest::default()
                .with_group_id(group_id(&self.group))
                .with_generation_id(self.generation)
                .with_member_id(StrBytes::from_string(self.member_id.clone()))
                .with_protocol_type(Some(StrBytes::from_static_str("consumer")))
                .with_protocol_name(joined.protocol_name.clone())
                .with_assignments(assignments);
            let synced = match client.send_to_broker(self.coordinator, &sync, 5).await {
                Ok(r) => r,
                Err(_) => {
                    self.find_coordinator(client, deadline).await?;
                    continue;
                }
            };
            if synced.error_code != 0 {
                if must_rejoin(synced.error_code) || coordinator_moved(synced.error_code) {
                    if coordinator_moved(synced.error_code) {
                        self.find_coordinator(client, deadline).await?;
                    }
                    continue;
                }
                return Err(format!("SyncGroup {}: {}", self.group, error_name(synced.error_code)));
            }
            self.last_heartbeat = Instant::now();
            let mine = crate::group::assignment::decode_assignment(&synced.assignment).unwrap_or_default();
            let partitions: Vec<i32> = mine.into_iter().filter(|(t, _)| t == topic).flat_map(|(_, ps)| ps).collect();
            eprintln!(
                "joined group {} (generation {}): partitions {:?} of {topic}",
                self.group, self.generation, partitions
            );
            return Ok(partitions);
        }
    }

    /// A heartbeat when one is due; `Ok(true)` when the group rebalances.
    async fn heartbeat(&mut self, client: &mut KafkaClient) -> Result<bool, String> {
        if self.last_heartbeat.elapsed() < HEARTBEAT_EVERY {
            return Ok(false);
        }
        let request = HeartbeatRequest::default()
            .with_group_id(group_id(&self.group))
            .with_generation_id(self.generation)
            .with_member_id(StrBytes::from_string(self.member_id.clone()));
        self.last_heartbeat = Instant::now();
        let response = match client.send_to_broker(self.coordinator, &request, 4).await {
            Ok(r) => r,
            Err(_) => {
                self.find_coordinator(client, Instant::now() + Duration::from_secs(30)).await?;
                return Ok(true);
            }
        };
        match response.error_code {
            0 => Ok(false),
            code if must_rejoin(code) => Ok(true),
            code if coordinator_moved(code) => {
                self.find_coordinator(client, Instant::now() + Duration::from_secs(30)).await?;
                Ok(true)
            }
            code => Err(format!("Heartbeat {}: {}", self.group, error_name(code))),
        }
    }

    /// The group's committed offsets for `partitions` (-1 where none).
    async fn committed(
        &mut self,
        client: &mut KafkaClient,
        topic: &str,
        partitions: &[i32],
    ) -> Result<BTreeMap<i32, i64>, String> {
        let request = OffsetFetchRequest::default().with_group_id(group_id(&self.group)).with_topics(Some(vec![
            OffsetFetchRequestTopic::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partition_indexes(partitions.to_vec()),
        ]));
        let response = client.send_to_broker(self.coordinator, &request, 7).await?;
        if response.error_code != 0 {
            return Err(format!("OffsetFetch {}: {}", self.group, error_name(response.error_code)));
        }
        Ok(response
            .topics
            .iter()
            .flat_map(|t| t.partitions.iter())
            .map(|p| (p.partition_index, if p.error_code == 0 { p.committed_offset } else { -1 }))
            .collect())
    }

    /// Commits `offsets` (the next offset to read per partition); `Ok(false)`
    /// when the group has moved on (the member must rejoin first).
    async fn commit(
        &mut self,
        client: &mut KafkaClient,
        topic: &str,
        offsets: &BTreeMap<i32, i64>,
    ) -> Result<bool, String> {
        if offsets.is_empty() {
            return Ok(true);
        }
        let request = OffsetCommitRequest::default()
            .with_group_id(group_id(&self.group))
            .with_generation_id_or_member_epoch(self.generation)
            .with_member_id(StrBytes::from_string(self.member_id.clone()))
            .with_topics(vec![OffsetCommitRequestTopic::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partitions(
                    offsets
                        .iter()
                        .map(|(&p, &o)| {
                            OffsetCommitRequestPartition::default()
                                .with_partition_index(p)
                                .with_committed_offset(o)
                                .with_committed_leader_epoch(-1)
                                .with_committed_metadata(Some(StrBytes::from_static_str("")))
                        })
                        .collect(),
                )]);
        let response = match client.send_to_broker(self.coordinator, &request, 8).await {
            Ok(r) => r,
            Err(e) => {
                // The coordinator went away: join again (through a new one).
                eprintln!("committing to group {}: {e}; joining again", self.group);
                self.coordinator = -1;
                return Ok(false);
            }
        };
        for p in response.topics.iter().flat_map(|t| t.partitions.iter()) {
            match p.error_code {
                0 => {}
                code if must_rejoin(code) || coordinator_moved(code) => return Ok(false),
                code => return Err(format!("OffsetCommit {}: {}", self.group, error_name(code))),
            }
        }
        Ok(true)
    }

    async fn leave(&mut self, client: &mut KafkaClient) {
        let request = LeaveGroupRequest::default().with_group_id(group_id(&self.group)).with_members(vec![
            MemberIdentity::default()
                .with_member_id(StrBytes::from_string(self.member_id.clone()))
                .with_reason(Some(StrBytes::from_static_str("strom topic consume is done"))),
        ]);
        if let Err(e) = client.send_to_broker(self.coordinator, &request, 4).await {
            eprintln!("leaving group {}: {e}", self.group);
        }
    }
}

// ---- fetching ------------------------------------------------------------------

/// The earliest (`-2`) or latest (`-1`) offset of each partition.
async fn list_offsets(
    client: &mut KafkaClient,
    topic: &str,
    layout: &TopicLayout,
    partitions: &[i32],
    timestamp: i64,
) -> Result<BTreeMap<i32, i64>, String> {
    let mut by_leader: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
    for &p in partitions {
        by_leader.entry(*layout.leaders.get(&p).unwrap_or(&-1)).or_default().push(p);
    }
    let mut out = BTreeMap::new();
    for (leader, ps) in by_leader {
        if leader < 0 {
            return Err(format!("partitions {ps:?} of {topic} have no leader"));
        }
        let request =
            ListOffsetsRequest::default().with_replica_id(BrokerId(-1)).with_topics(vec![ListOffsetsTopic::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partitions(
                    ps.iter()
                        .map(|&p| {
                            ListOffsetsPartition::default()
                                .with_partition_index(p)
                                .with_current_leader_epoch(-1)
                                .with_timestamp(timestamp)
                        })
                        .collect(),
                )]);
        let response = client.send_to_broker(leader, &request, 7).await?;
        for p in response.topics.iter().flat_map(|t| t.partitions.iter()) {
            if p.error_code != 0 {
                return Err(format!("ListOffsets {topic}-{}: {}", p.partition_index, error_name(p.error_code)));
            }
            out.insert(p.partition_index, p.offset);
        }
    }
    Ok(out)
}

/// The records of whole batches in `records` (a Fetch answer may end in a
/// partial batch, which is left for the next Fetch). Control records (markers)
/// are skipped.
fn decode_records(mut records: Bytes) -> Result<Vec<Record>, String> {
    let mut out = Vec::new();
    while records.remaining() >= 12 {
        let len = i32::from_be_bytes([records[8], records[9], records[10], records[11]]);
        let total = 12 + len.max(0) as usize;
        if len <= 0 || records.remaining() < total {
            break;
        }
        let mut batch = records.split_to(total);
        let set =
            RecordBatchDecoder::decode(&mut batch).map_err(|e| format!("a record batch that does not decode: {e}"))?;
        out.extend(set.records.into_iter().filter(|r| !r.control));
    }
    Ok(out)
}

/// A reader that went away (`strom topic consume ... | head`) ends the
/// consumer as `--count` does (commit, leave, exit 0); another write error
/// is a failure.
fn stdout_closed(e: std::io::Error) -> Result<Round, String> {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        Ok(Round::Done)
    } else {
        Err(format!("writing stdout: {e}"))
    }
}

struct Consumer {
    client: KafkaClient,
    options: ConsumeOptions,
    format: Format,
    layout: TopicLayout,
    positions: BTreeMap<i32, i64>,
    /// Positions not yet committed (group mode): every one after a join, then
    /// those that moved.
    uncommitted: BTreeMap<i32, i64>,
    printed: u64,
}

enum Round {
    Continue,
    Done,
}

impl Consumer {
    fn done(&self) -> bool {
        self.options.count.is_some_and(|c| self.printed >= c)
    }

    /// Where to start partitions without a committed offset.
    async fn start_positions(&mut self, partitions: &[i32]) -> Result<BTreeMap<i32, i64>, String> {
        let timestamp = if self.options.from_beginning { -2 } else { -1 };
        list_offsets(&mut self.client, &self.options.topic, &self.layout, partitions, timestamp).await
    }

    /// One Fetch to each leader; prints what came back.
    async fn fetch_round(&mut self, out: &mut impl Write) -> Result<Round, String> {
        let mut by_leader: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
        for &p in self.positions.keys() {
            by_leader.entry(*self.layout.leaders.get(&p).unwrap_or(&-1)).or_default().push(p);
        }
        if self.positions.is_empty() {
            tokio::time::sleep(Duration::from_millis(FETCH_WAIT_MS as u64)).await;
            return Ok(Round::Continue);
        }
        let wait = FETCH_WAIT_MS / by_leader.len().max(1) as i32;
        let mut refresh = false;
        for (leader, partitions) in by_leader {
            if leader < 0 {
                refresh = true;
                continue;
            }
            let request = FetchRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_max_wait_ms(wait)
                .with_min_bytes(1)
                .with_max_bytes(16 * 1024 * 1024)
                .with_isolation_level(0)
                .with_session_epoch(-1)
                .with_topics(vec![FetchTopic::default()
                    .with_topic(TopicName(StrBytes::from_string(self.options.topic.clone())))
                    .with_partitions(
                        partitions
                            .iter()
                            .map(|&p| {
                                FetchPartition::default()
                                    .with_partition(p)
                                    .with_current_leader_epoch(-1)
                                    .with_fetch_offset(self.positions[&p])
                                    .with_last_fetched_epoch(-1)
                                    .with_log_start_offset(-1)
                                    .with_partition_max_bytes(1024 * 1024)
                            })
                            .collect(),
                    )]);
            let response = match self.client.send_to_broker(leader, &request, 12).await {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("fetch from broker {leader}: {e}; retrying");
                    refresh = true;
                    continue;
                }
            };
            if response.error_code != 0 {
                return Err(format!("Fetch: {}", error_name(response.error_code)));
            }
            for p in response.responses.into_iter().flat_map(|t| t.partitions) {
                let partition = p.partition_index;
                match ResponseError::try_from_code(p.error_code) {
                    None => {}
                    Some(ResponseError::OffsetOutOfRange) => {
                        let reset = self.start_positions(&[partition]).await?;
                        if let Some(&o) = reset.get(&partition) {
                            eprintln!(
                                "partition {partition}: offset {} is out of range; going on from {o}",
                                self.positions[&partition]
                            );
                            self.positions.insert(partition, o);
                        }
                        continue;
                    }
                    Some(_) if retriable(p.error_code) => {
                        refresh = true;
                        continue;
                    }
                    Some(_) => return Err(format!("Fetch partition {partition}: {}", error_name(p.error_code))),
                }
                let Some(records) = p.records else { continue };
                let position = self.positions[&partition];
                for record in decode_records(records)? {
                    if record.offset < position {
                        continue; // the start of a batch read from its middle
                    }
                    if let Err(e) = self.format.write(out, &self.options.topic, partition, &record) {
                        return stdout_closed(e);
                    }
                    self.positions.insert(partition, record.offset + 1);
                    self.uncommitted.insert(partition, record.offset + 1);
                    self.printed += 1;
                    if self.done() {
                        return Ok(Round::Done);
                    }
                }
            }
        }
        if refresh {
            tokio::time::sleep(Duration::from_millis(200)).await;
            self.layout = self.client.layout(&self.options.topic).await?;
        }
        Ok(Round::Continue)
    }
}

/// SIGINT (Ctrl-C) or SIGTERM: stop, commit what was printed, leave the
/// group. Registered before anything else, so a signal during the join counts.
fn stop_signal() -> Result<impl std::future::Future<Output = ()>, String> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt()).map_err(|e| format!("SIGINT handler: {e}"))?;
    let mut term = signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM handler: {e}"))?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
    })
}

pub async fn consume(api: &Api, options: ConsumeOptions) -> CliResult {
    let mut interrupted = std::pin::pin!(stop_signal()?);
    let format = Format::parse(&options.format)?;
    if options.group.is_some() && options.partition.is_some() {
        return Err("--partition and --group do not go together: the group assigns the partitions".into());
    }
    let mut client = KafkaClient::new(options.bootstrap.clone(), api).await?;
    let layout = client.layout_with_leaders(&options.topic).await?;
    if let Some(p) = options.partition {
        if !layout.leaders.contains_key(&p) {
            return Err(format!("topic {} has no partition {p}", options.topic));
        }
    }
    let mut member = options.group.clone().map(|group| Member {
        group,
        member_id: String::new(),
        generation: -1,
        coordinator: -1,
        last_heartbeat: Instant::now(),
    });
    let mut consumer = Consumer {
        client,
        format,
        layout,
        positions: BTreeMap::new(),
        uncommitted: BTreeMap::new(),
        printed: 0,
        options,
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut joined = false;
    let result: Result<(), String> = async {
        loop {
            if let Some(m) = member.as_mut() {
                if !joined {
                    let partitions = m.join(&mut consumer.client, &consumer.options.topic).await?;
                    let committed = m.committed(&mut consumer.client, &consumer.options.topic, &partitions).await?;
                    let missing: Vec<i32> =
                        partitions.iter().copied().filter(|p| committed.get(p).is_none_or(|&o| o < 0)).collect();
                    consumer.layout = consumer.client.layout_with_leaders(&consumer.options.topic).await?;
                    let start = consumer.start_positions(&missing).await?;
                    consumer.positions = partitions
                        .iter()
                        .map(|p| {
                            (*p, committed.get(p).copied().filter(|&o| o >= 0).or(start.get(p).copied()).unwrap_or(0))
                        })
                        .collect();
                    // Every position is committed, not only those of partitions with records
                    // printed, as Kafka's consumers do: a partition started at its beginning
                    // (or end) goes on from there next time.
                    consumer.uncommitted = consumer.positions.clone();
                    joined = true;
                } else if m.heartbeat(&mut consumer.client).await? {
                    let offsets = std::mem::take(&mut consumer.uncommitted);
                    let _ = m.commit(&mut consumer.client, &consumer.options.topic, &offsets).await;
                    joined = false;
                    continue;
                }
            } else if consumer.positions.is_empty() {
                let partitions = match consumer.options.partition {
                    Some(p) => vec![p],
                    None => consumer.layout.partitions(),
                };
                consumer.positions = consumer.start_positions(&partitions).await?;
            }
            let round = tokio::select! {
                round = consumer.fetch_round(&mut out) => round?,
                _ = &mut interrupted => Round::Done,
            };
            let round = match out.flush() {
                Ok(()) => round,
                Err(e) => stdout_closed(e)?,
            };
            if let Some(m) = member.as_mut() {
                let offsets = std::mem::take(&mut consumer.uncommitted);
                if !m.commit(&mut consumer.client, &consumer.options.topic, &offsets).await? {
                    joined = false;
                }
            }
            if matches!(round, Round::Done) {
                return Ok(());
            }
        }
    }
    .await;
    let _ = out.flush(); // (a closed stdout was reported above)
    if let Some(m) = member.as_mut() {
        if joined {
            m.leave(&mut consumer.client).await;
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_gives_8_partitions_over_3_members_3_3_2() {
        let members: Vec<String> = ["c", "a", "b"].iter().map(|s| s.to_string()).collect();
        let got = range_assign(&members, 8);
        assert_eq!(got["a"], vec![0, 1, 2]);
        assert_eq!(got["b"], vec![3, 4, 5]);
        assert_eq!(got["c"], vec![6, 7]);
        let more = range_assign(&members, 2);
        assert_eq!((more["a"].len(), more["b"].len(), more["c"].len()), (1, 1, 0));
        assert!(range_assign(&[], 4).is_empty());
    }

    fn record(offset: i64) -> Record {
        let mut headers = kafka_protocol::indexmap::IndexMap::new();
        headers.insert(StrBytes::from_static_str("h"), Some(Bytes::from_static(b"1")));
        Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: kafka_protocol::records::TimestampType::Creation,
            offset,
            sequence: -1,
            timestamp: 99,
            key: Some(Bytes::from_static(b"k")),
            value: Some(Bytes::from_static(b"v")),
            headers,
        }
    }

    #[test]
    fn formats_use_kcats_tokens() {
        let f = Format::parse(r"%t/%p@%o %k=%s %T [%h] 100%%\n").expect("parses");
        let mut out = Vec::new();
        f.write(&mut out, "orders", 2, &record(7)).expect("writes");
        assert_eq!(String::from_utf8(out).expect("utf8"), "orders/2@7 k=v 99 [h=1] 100%\n");
        assert!(Format::parse("%x").is_err());
        assert!(Format::parse("50%").is_err());
    }

    #[test]
    fn a_partial_batch_at_the_end_waits_for_the_next_fetch() {
        let mut buf = BytesMut::new();
        let options = kafka_protocol::records::RecordEncodeOptions {
            version: 2,
            compression: kafka_protocol::records::Compression::None,
        };
        kafka_protocol::records::RecordBatchEncoder::encode(&mut buf, &[record(0), record(1)], &options)
            .expect("encodes");
        let whole = buf.len();
        kafka_protocol::records::RecordBatchEncoder::encode(&mut buf, &[record(2)], &options).expect("encodes");
        let full = decode_records(buf.clone().freeze()).expect("decodes");
        assert_eq!(full.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![0, 1, 2]);
        let cut = decode_records(buf.freeze().slice(..whole + 20)).expect("decodes");
        assert_eq!(cut.len(), 2);
    }
}
