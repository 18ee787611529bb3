//! The consumer protocol's subscription and assignment bytes (carried opaque
//! in JoinGroup/SyncGroup), decoded for the admin view and OffsetDelete, and
//! read and written for classic members of a consumer-protocol group.
//! Versions newer than the ones known are read as the newest known, as Kafka
//! does: later versions only append fields.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition;
use kafka_protocol::messages::{ConsumerProtocolAssignment, ConsumerProtocolSubscription, TopicName};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

const NEWEST: i16 = 3;

fn versioned(raw: &Bytes) -> Option<(i16, Bytes)> {
    let mut buf = raw.clone();
    if buf.remaining() < 2 {
        return None;
    }
    let version = buf.get_i16();
    (version >= 0).then(|| (version.min(NEWEST), buf))
}

/// The topics a consumer subscribes to; `None` if the bytes are not a consumer subscription.
pub fn decode_subscription(raw: &Bytes) -> Option<Vec<String>> {
    let (version, mut buf) = versioned(raw)?;
    let sub = ConsumerProtocolSubscription::decode(&mut buf, version).ok()?;
    Some(sub.topics.into_iter().map(|t| t.to_string()).collect())
}

/// A classic consumer's subscription as its JoinGroup metadata states it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subscription {
    pub topics: Vec<String>,
    /// What it owns while it rejoins (v1+; a cooperative consumer keeps its
    /// partitions through a rebalance, an eager one gives them all up first).
    pub owned: Vec<(String, Vec<i32>)>,
    pub rack: Option<String>,
}

/// The whole subscription; `None` if the bytes are not a consumer subscription.
pub fn decode_subscription_full(raw: &Bytes) -> Option<Subscription> {
    let (version, mut buf) = versioned(raw)?;
    let sub = ConsumerProtocolSubscription::decode(&mut buf, version).ok()?;
    Some(Subscription {
        topics: sub.topics.into_iter().map(|t| t.to_string()).collect(),
        owned: sub.owned_partitions.into_iter().map(|tp| (tp.topic.0.to_string(), tp.partitions)).collect(),
        rack: sub.rack_id.map(|r| r.to_string()),
    })
}

/// Assignment bytes (version 0, which every client reads) for `(topic, partitions)`.
pub fn encode_assignment(assigned: &[(String, Vec<i32>)]) -> Bytes {
    let a = ConsumerProtocolAssignment::default().with_assigned_partitions(
        assigned
            .iter()
            .map(|(t, ps)| {
                TopicPartition::default()
                    .with_topic(TopicName(StrBytes::from_string(t.clone())))
                    .with_partitions(ps.clone())
            })
            .collect(),
    );
    let mut buf = BytesMut::new();
    buf.put_i16(0);
    // Encoding a version-0 assignment cannot fail: it has no field a version lacks.
    if a.encode(&mut buf, 0).is_err() {
        return Bytes::new();
    }
    buf.freeze()
}

/// `(topic, partitions)` assigned to a consumer; empty for no assignment,
/// `None` if the bytes are not a consumer assignment.
pub fn decode_assignment(raw: &Bytes) -> Option<Vec<(String, Vec<i32>)>> {
    if raw.is_empty() {
        return Some(Vec::new());
    }
    let (version, mut buf) = versioned(raw)?;
    let a = ConsumerProtocolAssignment::decode(&mut buf, version).ok()?;
    let mut out: Vec<(String, Vec<i32>)> =
        a.assigned_partitions.into_iter().map(|tp| (tp.topic.0.to_string(), tp.partitions)).collect();
    for (_, ps) in &mut out {
        ps.sort_unstable();
    }
    out.sort();
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode<T: Encodable>(version: i16, msg: &T) -> Bytes {
        let mut buf = BytesMut::new();
        buf.put_i16(version);
        msg.encode(&mut buf, version).expect("encodes");
        buf.freeze()
    }

    #[test]
    fn assignments_decode_sorted() {
        let a = ConsumerProtocolAssignment::default().with_assigned_partitions(vec![
            TopicPartition::default().with_topic(TopicName(StrBytes::from_static_str("b"))).with_partitions(vec![2, 0]),
            TopicPartition::default().with_topic(TopicName(StrBytes::from_static_str("a"))).with_partitions(vec![1]),
        ]);
        for version in 0..=NEWEST {
            assert_eq!(
                decode_assignment(&encode(version, &a)),
                Some(vec![("a".to_string(), vec![1]), ("b".to_string(), vec![0, 2])])
            );
        }
        assert_eq!(decode_assignment(&Bytes::new()), Some(vec![]));
        assert_eq!(decode_assignment(&Bytes::from_static(&[0, 1, 0xff])), None);
    }

    #[test]
    fn subscriptions_decode_and_future_versions_read_as_the_newest() {
        let s = ConsumerProtocolSubscription::default().with_topics(vec![StrBytes::from_static_str("orders")]);
        assert_eq!(decode_subscription(&encode(1, &s)), Some(vec!["orders".to_string()]));
        let mut future = encode(NEWEST, &s).to_vec();
        future[1] = 9;
        assert_eq!(decode_subscription(&Bytes::from(future)), Some(vec!["orders".to_string()]));
        assert_eq!(decode_subscription(&Bytes::from_static(b"x")), None);
    }

    #[test]
    fn full_subscriptions_and_encoded_assignments_round_trip() {
        use kafka_protocol::messages::consumer_protocol_subscription::TopicPartition as Owned;
        let s = ConsumerProtocolSubscription::default()
            .with_topics(vec![StrBytes::from_static_str("orders")])
            .with_owned_partitions(vec![Owned::default()
                .with_topic(TopicName(StrBytes::from_static_str("orders")))
                .with_partitions(vec![1, 3])])
            .with_rack_id(Some(StrBytes::from_static_str("r1")));
        let full = decode_subscription_full(&encode(3, &s)).expect("a subscription");
        assert_eq!(full.topics, vec!["orders".to_string()]);
        assert_eq!(full.owned, vec![("orders".to_string(), vec![1, 3])]);
        assert_eq!(full.rack.as_deref(), Some("r1"));
        // Version 0 knows no owned partitions: an eager consumer's, owning nothing.
        assert_eq!(decode_subscription_full(&encode(0, &s)).map(|f| f.owned), Some(vec![]));
        let assigned = vec![("a".to_string(), vec![0, 2]), ("b".to_string(), vec![1])];
        assert_eq!(decode_assignment(&encode_assignment(&assigned)), Some(assigned));
    }
}
