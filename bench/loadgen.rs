//! A Kafka produce load generator that is not the limit of the measurement:
//! `--connections` connections, each with one Produce request in flight at a
//! time (a synchronous producer: the next request goes when the last is
//! answered), each request one batch of `--batch` records of `--size` bytes
//! to one partition, the partitions taken round robin across connections.
//! Every connection talks to its partition's leader (from Metadata). It
//! reports records/s, MB/s and the latency of requests (p50/p99/max).
//!
//! ```sh
//! cargo build --release --example loadgen
//! target/release/examples/loadgen --bootstrap 127.0.0.1:9092 --topic t --partitions 3 \
//!     --connections 16 --batch 16 --size 1000 --seconds 10
//! ```
//!
//! The topic must exist. Records are uncompressed, without a producer id
//! (not idempotent), so each request is the same prebuilt batch.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{MetadataRequest, ProduceRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use strom::log::compaction::{encode_batch, plain_record};
use strom::replication::client::KafkaConnection;

#[derive(Parser, Debug, Clone)]
#[command(about = "Produce load generator (one request in flight per connection)")]
struct Args {
    /// Any broker's Kafka address.
    #[arg(long)]
    bootstrap: String,
    #[arg(long)]
    topic: String,
    /// Partitions to write, 0..N.
    #[arg(long, default_value_t = 1)]
    partitions: i32,
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// Records per request (one batch).
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Record value size, bytes.
    #[arg(long, default_value_t = 1000)]
    size: usize,
    /// -1 (all), 1 or 0 is not offered: the loop waits for each answer.
    #[arg(long, default_value_t = -1, allow_hyphen_values = true)]
    acks: i16,
    /// How long to produce.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Print the result as one JSON object too.
    #[arg(long)]
    json: bool,
}

const PRODUCE_VERSION: i16 = 9;
const TIMEOUT: Duration = Duration::from_secs(30);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// partition -> leader's "host:port".
async fn leaders(args: &Args) -> Result<HashMap<i32, String>, BoxError> {
    let mut conn = KafkaConnection::connect(&args.bootstrap, "strom-loadgen", None).await?;
    let request = MetadataRequest::default().with_topics(Some(vec![
        MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_string(args.topic.clone()))))
    ]));
    let response = conn.send(&request, 9, TIMEOUT).await?;
    let brokers: HashMap<i32, String> =
        response.brokers.iter().map(|b| (b.node_id.0, format!("{}:{}", b.host, b.port))).collect();
    let topic = response.topics.first().ok_or("no topic in the Metadata answer")?;
    if topic.error_code != 0 {
        return Err(format!("topic {}: error {}", args.topic, topic.error_code).into());
    }
    let mut out = HashMap::new();
    for p in &topic.partitions {
        let addr = brokers.get(&p.leader_id.0).ok_or(format!("partition {} has no leader", p.partition_index))?;
        out.insert(p.partition_index, addr.clone());
    }
    Ok(out)
}

struct ConnResult {
    records: u64,
    latencies_us: Vec<u64>,
    errors: u64,
}

async fn run_connection(
    addr: String,
    request: ProduceRequest,
    records_per_request: u64,
    until: Instant,
) -> Result<ConnResult, BoxError> {
    // Hundreds of connections open at once: a connect that times out is tried again.
    let mut tries = 0;
    let mut conn = loop {
        match KafkaConnection::connect(&addr, "strom-loadgen", None).await {
            Ok(conn) => break conn,
            Err(e) if tries >= 4 => return Err(format!("connect to {addr}: {e}").into()),
            Err(_) => tries += 1,
        }
    };
    let mut out = ConnResult { records: 0, latencies_us: Vec::new(), errors: 0 };
    while Instant::now() < until {
        let t = Instant::now();
        let response = conn
            .send(&request, PRODUCE_VERSION, TIMEOUT)
            .await
            .map_err(|e| format!("produce request {} to {addr}: {e}", out.latencies_us.len() + 1))?;
        out.latencies_us.push(t.elapsed().as_micros() as u64);
        let failed = response.responses.iter().flat_map(|t| &t.partition_responses).any(|p| p.error_code != 0);
        if failed {
            out.errors += 1;
        } else {
            out.records += records_per_request;
        }
    }
    Ok(out)
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64 / 1000.0
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    if args.acks == 0 {
        return Err("acks=0 is not offered: each connection waits for its answer".into());
    }
    let leaders = leaders(&args).await?;
    let value = Bytes::from(vec![b'x'; args.size]);
    let records = (0..args.batch as i64).map(|i| plain_record(i, None, Some(value.clone()), 0)).collect();
    let batch = Bytes::from(encode_batch(records).ok_or("empty batch")?);
    let until = Instant::now() + Duration::from_secs_f64(args.seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..args.connections {
        let partition = (c as i32) % args.partitions.max(1);
        let addr = leaders.get(&partition).ok_or(format!("partition {partition} not in the topic"))?.clone();
        let request = ProduceRequest::default().with_acks(args.acks).with_timeout_ms(30_000).with_topic_data(vec![
            TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_string(args.topic.clone())))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(partition)
                    .with_records(Some(batch.clone()))]),
        ]);
        tasks.push(tokio::spawn(run_connection(addr, request, args.batch as u64, until)));
    }
    let (mut records, mut errors, mut latencies) = (0u64, 0u64, Vec::new());
    for t in tasks {
        let r = t.await??;
        records += r.records;
        errors += r.errors;
        latencies.extend(r.latencies_us);
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let mb_s = records as f64 * args.size as f64 / 1e6 / elapsed;
    let (p50, p99, max) = (pct(&latencies, 50.0), pct(&latencies, 99.0), pct(&latencies, 100.0));
    println!(
        "{records} records in {elapsed:.1} s: {:.0} records/s, {mb_s:.1} MB/s; {} requests, {errors} failed; \
         request latency p50 {p50:.2} ms, p99 {p99:.2} ms, max {max:.2} ms",
        records as f64 / elapsed,
        latencies.len()
    );
    if args.json {
        println!(
            "{{\"records\": {records}, \"seconds\": {elapsed:.3}, \"records_s\": {:.1}, \"mb_s\": {mb_s:.2}, \
             \"requests\": {}, \"errors\": {errors}, \"p50_ms\": {p50:.3}, \"p99_ms\": {p99:.3}, \"max_ms\": {max:.3}}}",
            records as f64 / elapsed,
            latencies.len()
        );
    }
    if errors > 0 {
        std::process::exit(1);
    }
    Ok(())
}
