//! `strom topic produce`: lines from stdin become records, as kcat -P and
//! `rpk topic produce` do. An idempotent producer (InitProducerId, sequence
//! numbers per partition), so a batch retried after a leader change is
//! written once. Lines read within a few milliseconds of each other go out
//! as one batch per partition.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{InitProducerIdRequest, ProduceRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
use tokio::io::AsyncBufReadExt;

use super::kafka::{error_name, partition_for_key, retriable, KafkaClient, TopicLayout, REQUEST_TIMEOUT};
use super::{Api, CliResult};

/// What `strom topic produce` was asked.
pub struct ProduceOptions {
    pub topic: String,
    pub bootstrap: Option<String>,
    pub key_separator: Option<String>,
    pub headers: Vec<String>,
    pub partition: Option<i32>,
    pub acks: i16,
}

const MAX_BATCH_RECORDS: usize = 1000;
const MAX_BATCH_BYTES: usize = 512 * 1024;
const LINGER: Duration = Duration::from_millis(5);
const ATTEMPTS: u32 = 20;

/// One record read from stdin.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub key: Option<Bytes>,
    pub value: Bytes,
}

/// Splits a line at the first `separator` into key and value; a line without
/// the separator is a value with no key.
pub fn split_line(line: &str, separator: Option<&str>) -> Line {
    match separator.and_then(|sep| line.split_once(sep)) {
        Some((key, value)) => {
            Line { key: Some(Bytes::copy_from_slice(key.as_bytes())), value: Bytes::copy_from_slice(value.as_bytes()) }
        }
        None => Line { key: None, value: Bytes::copy_from_slice(line.as_bytes()) },
    }
}

/// `K=V` headers.
pub fn parse_headers(pairs: &[String]) -> Result<IndexMap<StrBytes, Option<Bytes>>, String> {
    let mut headers = IndexMap::new();
    for pair in pairs {
        let (k, v) = pair.split_once('=').ok_or_else(|| format!("--header `{pair}` is not K=V"))?;
        headers.insert(StrBytes::from_string(k.to_string()), Some(Bytes::copy_from_slice(v.as_bytes())));
    }
    Ok(headers)
}

/// The producer's identity and the next sequence number of each partition.
struct Idempotence {
    producer_id: i64,
    epoch: i16,
    sequences: BTreeMap<i32, i32>,
}

/// Encodes `lines` as one v2 batch of the idempotent producer, starting at `sequence`.
fn encode_batch(
    lines: &[Line],
    headers: &IndexMap<StrBytes, Option<Bytes>>,
    id: &Idempotence,
    sequence: i32,
    now_ms: i64,
) -> Result<Bytes, String> {
    let records: Vec<Record> = lines
        .iter()
        .enumerate()
        .map(|(i, line)| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: id.producer_id,
            producer_epoch: id.epoch,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: sequence.wrapping_add(i as i32),
            timestamp: now_ms,
            key: line.key.clone(),
            value: Some(line.value.clone()),
            headers: headers.clone(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(&mut buf, &records, &RecordEncodeOptions { version: 2, compression: Compression::None })
        .map_err(|e| format!("encoding records: {e}"))?;
    Ok(buf.freeze())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

struct Producer {
    client: KafkaClient,
    options: ProduceOptions,
    headers: IndexMap<StrBytes, Option<Bytes>>,
    id: Idempotence,
    partitions: i32,
    /// The partitions' leaders, refreshed when a send fails.
    layout: TopicLayout,
    /// Where the next keyless batch goes (round robin by batch).
    next_partition: i32,
    produced: u64,
}

impl Producer {
    /// Sends one partition's lines, retrying retriable errors with the same
    /// sequence numbers (the leader drops a batch it already has).
    async fn send(&mut self, partition: i32, lines: &[Line]) -> Result<(), String> {
        let sequence = *self.id.sequences.get(&partition).unwrap_or(&0);
        let records = encode_batch(lines, &self.headers, &self.id, sequence, now_ms())?;
        let request = ProduceRequest::default()
            .with_acks(self.options.acks)
            .with_timeout_ms(REQUEST_TIMEOUT.as_millis() as i32)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_string(self.options.topic.clone())))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(partition)
                    .with_records(Some(records))])]);
        let mut last = String::new();
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt.min(10)))).await;
            }
            if attempt > 0 {
                self.layout = self.client.layout_with_leaders(&self.options.topic).await?;
            }
            let Some(&leader) = self.layout.leaders.get(&partition) else {
                return Err(format!("topic {} has no partition {partition}", self.options.topic));
            };
            if leader < 0 {
                last = format!("partition {partition} has no leader");
                continue;
            }
            let response = match self.client.send_to_broker(leader, &request, 8).await {
                Ok(r) => r,
                Err(e) => {
                    last = e;
                    continue;
                }
            };
            let code = response
                .responses
                .iter()
                .flat_map(|t| t.partition_responses.iter())
                .find(|p| p.index == partition)
                .map(|p| (p.error_code, p.error_message.clone()));
            match code {
                Some((0, _)) => {
                    self.id.sequences.insert(partition, sequence.wrapping_add(lines.len() as i32));
                    self.produced += lines.len() as u64;
                    return Ok(());
                }
                Some((code, message)) => {
                    let text = format!(
                        "partition {partition}: {}{}",
                        error_name(code),
                        message.map(|m| format!(": {m}")).unwrap_or_default()
                    );
                    if !retriable(code) {
                        return Err(text);
                    }
                    last = text;
                }
                None => last = format!("the leader did not answer for partition {partition}"),
            }
        }
        Err(format!("gave up after {ATTEMPTS} attempts: {last}"))
    }

    /// Which partition a line goes to.
    fn partition_of(&self, line: &Line, keyless: i32) -> i32 {
        match (self.options.partition, &line.key) {
            (Some(p), _) => p,
            (None, Some(key)) => partition_for_key(key, self.partitions),
            (None, None) => keyless,
        }
    }

    async fn flush(&mut self, batch: Vec<Line>) -> Result<(), String> {
        if batch.is_empty() {
            return Ok(());
        }
        let keyless = self.next_partition;
        self.next_partition = (self.next_partition + 1) % self.partitions.max(1);
        let mut by_partition: BTreeMap<i32, Vec<Line>> = BTreeMap::new();
        for line in batch {
            by_partition.entry(self.partition_of(&line, keyless)).or_default().push(line);
        }
        for (partition, lines) in by_partition {
            self.send(partition, &lines).await?;
        }
        Ok(())
    }
}

pub async fn produce(api: &Api, options: ProduceOptions) -> CliResult {
    if options.acks != -1 && options.acks != 1 {
        return Err(format!("--acks {} is not supported here: use all or 1", options.acks));
    }
    let headers = parse_headers(&options.headers)?;
    let mut client = KafkaClient::new(options.bootstrap.clone(), api).await?;
    let layout = client.layout_with_leaders(&options.topic).await?;
    let partitions = layout.leaders.len() as i32;
    if let Some(p) = options.partition {
        if !(0..partitions).contains(&p) {
            return Err(format!("topic {} has {partitions} partitions; there is no partition {p}", options.topic));
        }
    }
    let init = client
        .send_any(&InitProducerIdRequest::default().with_transactional_id(None).with_transaction_timeout_ms(-1), 4)
        .await?;
    if init.error_code != 0 {
        return Err(format!("InitProducerId: {}", error_name(init.error_code)));
    }
    let mut producer = Producer {
        client,
        headers,
        id: Idempotence { producer_id: init.producer_id.0, epoch: init.producer_epoch, sequences: BTreeMap::new() },
        partitions,
        layout,
        next_partition: (now_ms() % i64::from(partitions.max(1))) as i32,
        produced: 0,
        options,
    };
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut batch: Vec<Line> = Vec::new();
    let mut bytes = 0;
    let separator = producer.options.key_separator.clone();
    loop {
        // Wait for a line as long as it takes when nothing is pending; with a
        // batch pending, send it once stdin has been quiet for the linger.
        let next = if batch.is_empty() {
            Ok(lines.next_line().await)
        } else {
            tokio::time::timeout(LINGER, lines.next_line()).await
        };
        match next {
            Ok(Ok(Some(line))) => {
                let line = split_line(line.strip_suffix('\r').unwrap_or(&line), separator.as_deref());
                bytes += line.value.len() + line.key.as_ref().map_or(0, Bytes::len);
                batch.push(line);
                if batch.len() >= MAX_BATCH_RECORDS || bytes >= MAX_BATCH_BYTES {
                    producer.flush(std::mem::take(&mut batch)).await?;
                    bytes = 0;
                }
            }
            Ok(Ok(None)) => break,
            Ok(Err(e)) => return Err(format!("reading stdin: {e}")),
            Err(_) => {
                producer.flush(std::mem::take(&mut batch)).await?;
                bytes = 0;
            }
        }
    }
    producer.flush(batch).await?;
    eprintln!("produced {} records to {}", producer.produced, producer.options.topic);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::records::RecordBatchDecoder;

    #[test]
    fn a_line_splits_at_the_first_separator() {
        assert_eq!(
            split_line("k1:v:1", Some(":")),
            Line { key: Some(Bytes::from_static(b"k1")), value: Bytes::from_static(b"v:1") }
        );
        assert_eq!(split_line("no key", Some(":")), Line { key: None, value: Bytes::from_static(b"no key") });
        assert_eq!(split_line("a:b", None), Line { key: None, value: Bytes::from_static(b"a:b") });
    }

    #[test]
    fn headers_must_be_pairs() {
        let h = parse_headers(&["a=1".into(), "b=x=y".into()]).expect("pairs");
        assert_eq!(h.get(&StrBytes::from_static_str("b")), Some(&Some(Bytes::from_static(b"x=y"))));
        assert!(parse_headers(&["nope".into()]).is_err());
    }

    #[test]
    fn a_batch_carries_the_producer_and_consecutive_sequences() {
        let id = Idempotence { producer_id: 7, epoch: 2, sequences: BTreeMap::new() };
        let lines = vec![split_line("a", None), split_line("k:b", Some(":"))];
        let headers = parse_headers(&["h=1".into()]).expect("pairs");
        let mut buf = encode_batch(&lines, &headers, &id, 40, 1234).expect("encodes");
        let set = RecordBatchDecoder::decode(&mut buf).expect("decodes");
        assert!(buf.is_empty(), "one batch");
        assert_eq!(set.records.len(), 2);
        assert_eq!(set.records[1].sequence, 41);
        assert_eq!(set.records[1].producer_id, 7);
        assert_eq!(set.records[1].key.as_deref(), Some(&b"k"[..]));
        assert_eq!(set.records[0].headers.len(), 1);
    }
}
