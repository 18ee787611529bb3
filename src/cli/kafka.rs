//! The Kafka side of `strom topic produce` and `strom topic consume`: a small
//! client over the Kafka protocol (the same connection type followers fetch
//! with), one request at a time per broker. It finds the brokers through the
//! admin API unless `--bootstrap` names them, and follows partition leaders
//! through Metadata, refreshing them when a broker answers that it does not
//! lead a partition any more.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{BrokerId, MetadataRequest, TopicName};
use kafka_protocol::protocol::{Request, StrBytes};

use crate::replication::client::KafkaConnection;

use super::Api;

/// How long one request may take (a Fetch waits at most its max wait on top).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const CLIENT_ID: &str = "strom-cli";

/// A broker's error code as Kafka names it, e.g. `NOT_LEADER_OR_FOLLOWER (6)`.
pub fn error_name(code: i16) -> String {
    match ResponseError::try_from_code(code) {
        Some(e) => format!("{e:?} ({code})"),
        None => format!("error code {code}"),
    }
}

/// Whether a request that failed with `code` is worth retrying after a
/// metadata refresh (a leader moved, an ISR is short for a moment).
pub fn retriable(code: i16) -> bool {
    ResponseError::try_from_code(code).is_some_and(|e| e.is_retriable())
}

/// One topic's layout: partition -> leader (-1 while none).
#[derive(Debug, Clone, Default)]
pub struct TopicLayout {
    pub leaders: BTreeMap<i32, i32>,
}

impl TopicLayout {
    pub fn partitions(&self) -> Vec<i32> {
        self.leaders.keys().copied().collect()
    }
}

pub struct KafkaClient {
    bootstrap: Vec<String>,
    /// Broker id -> host:port, from the last Metadata answer.
    brokers: HashMap<i32, String>,
    connections: HashMap<String, KafkaConnection>,
}

impl KafkaClient {
    /// `bootstrap` as given, or every broker's Kafka address from the admin API.
    pub async fn new(bootstrap: Option<String>, api: &Api) -> Result<Self, String> {
        let bootstrap: Vec<String> = match bootstrap {
            Some(list) => list.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect(),
            None => {
                let cluster = api
                    .get("/v1/cluster")
                    .await
                    .map_err(|e| format!("{e}; give the Kafka listeners with --bootstrap HOST:PORT,... instead"))?;
                cluster["brokers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|b| b["kafka"].as_str().map(str::to_string))
                    .collect()
            }
        };
        if bootstrap.is_empty() {
            return Err("no Kafka address to connect to (--bootstrap HOST:PORT,...)".into());
        }
        Ok(Self { bootstrap, brokers: HashMap::new(), connections: HashMap::new() })
    }

    async fn connection(&mut self, addr: &str) -> Result<&mut KafkaConnection, String> {
        if !self.connections.contains_key(addr) {
            let conn = KafkaConnection::connect(addr, CLIENT_ID, None)
                .await
                .map_err(|e| format!("cannot connect to the Kafka listener {addr}: {e}"))?;
            self.connections.insert(addr.to_string(), conn);
        }
        self.connections.get_mut(addr).ok_or_else(|| format!("no connection to {addr}"))
    }

    /// Sends `request` to `addr`; a failed connection is dropped (the next
    /// call reconnects).
    pub async fn send_to<R: Request>(
        &mut self,
        addr: &str,
        request: &R,
        version: i16,
        timeout: Duration,
    ) -> Result<R::Response, String> {
        let conn = self.connection(addr).await?;
        match conn.send(request, version, timeout).await {
            Ok(response) => Ok(response),
            Err(e) => {
                self.connections.remove(addr);
                Err(format!("{addr}: {e} (a listener that wants TLS or SASL closes a plain connection)"))
            }
        }
    }

    /// Sends `request` to broker `id`.
    pub async fn send_to_broker<R: Request>(
        &mut self,
        id: i32,
        request: &R,
        version: i16,
    ) -> Result<R::Response, String> {
        let addr = self.brokers.get(&id).cloned().ok_or_else(|| format!("broker {id} is not in the metadata"))?;
        self.send_to(&addr, request, version, REQUEST_TIMEOUT).await
    }

    /// Sends `request` to the first bootstrap (or known) broker that answers.
    pub async fn send_any<R: Request>(&mut self, request: &R, version: i16) -> Result<R::Response, String> {
        let mut addrs = self.bootstrap.clone();
        addrs.extend(self.brokers.values().cloned());
        let mut last = String::from("no broker");
        for addr in addrs {
            match self.send_to(&addr, request, version, REQUEST_TIMEOUT).await {
                Ok(response) => return Ok(response),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The leaders of `topic`'s partitions (and the brokers' addresses).
    pub async fn layout(&mut self, topic: &str) -> Result<TopicLayout, String> {
        let request = MetadataRequest::default()
            .with_topics(Some(vec![
                MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_string(topic.to_string()))))
            ]))
            .with_allow_auto_topic_creation(false);
        let response = self.send_any(&request, 9).await?;
        for b in &response.brokers {
            self.brokers.insert(b.node_id.0, format!("{}:{}", b.host, b.port));
        }
        let t = response
            .topics
            .iter()
            .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))
            .ok_or_else(|| format!("the broker did not describe topic {topic}"))?;
        if t.error_code != 0 {
            return Err(format!("topic {topic}: {}", error_name(t.error_code)));
        }
        Ok(TopicLayout { leaders: t.partitions.iter().map(|p| (p.partition_index, p.leader_id.0)).collect() })
    }

    /// The layout, waiting (up to `REQUEST_TIMEOUT`) until every partition has a leader.
    pub async fn layout_with_leaders(&mut self, topic: &str) -> Result<TopicLayout, String> {
        let deadline = tokio::time::Instant::now() + REQUEST_TIMEOUT;
        loop {
            let layout = self.layout(topic).await?;
            if layout.leaders.values().all(|&l| l >= 0) || tokio::time::Instant::now() > deadline {
                return Ok(layout);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Learns a broker's address (from a FindCoordinator answer).
    pub fn learn_broker(&mut self, id: BrokerId, host: &str, port: i32) {
        self.brokers.insert(id.0, format!("{host}:{port}"));
    }
}

/// Kafka's default partitioner for keyed records: murmur2 of the key, made
/// positive, modulo the partition count (the Java client's and rpk's choice,
/// so a key lands where those clients would put it).
pub fn partition_for_key(key: &[u8], partitions: i32) -> i32 {
    ((murmur2(key) & 0x7fff_ffff) % partitions.max(1) as u32) as i32
}

/// Kafka's murmur2 (the 32-bit MurmurHash2 with Kafka's seed).
pub fn murmur2(data: &[u8]) -> u32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h = SEED ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_matches_kafkas_partitioner() {
        // Values from Kafka's UtilsTest.testMurmur2 (as signed ints there).
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973932308),
            (b"foobar", -790332482),
            (b"a-little-bit-long-string", -985981536),
            (b"a-little-bit-longer-string", -1486304829),
            (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
            (b"abc", 479470107),
        ];
        for (key, expected) in cases {
            assert_eq!(murmur2(key) as i32, expected, "{}", String::from_utf8_lossy(key));
        }
    }

    #[test]
    fn keys_spread_over_partitions_and_stay_put() {
        let p = partition_for_key(b"user-42", 6);
        assert!((0..6).contains(&p));
        assert_eq!(p, partition_for_key(b"user-42", 6));
        let used: std::collections::HashSet<i32> =
            (0..100).map(|i| partition_for_key(format!("k{i}").as_bytes(), 6)).collect();
        assert_eq!(used.len(), 6);
    }
}
