//! The records of `__consumer_offsets`, in Kafka's classic layout so that
//! Kafka's own tools can read the topic: a key (version 1: an offset commit,
//! version 2: group metadata) and a value, or a null value as a tombstone.
//! A group of the consumer protocol (KIP-848) is stored whole under a key of
//! Strom's own (version 100, which Kafka does not use), its value JSON.
//! Strings are i16-length prefixed (-1 = null), bytes i32-length prefixed,
//! arrays i32-count prefixed, everything big-endian.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Why a stored record could not be read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("record ends early")]
    Truncated,
    #[error("unknown {what} version {version}")]
    UnknownVersion { what: &'static str, version: i16 },
    #[error("a string is not UTF-8")]
    NotUtf8,
}

pub(crate) type Result<T> = std::result::Result<T, RecordError>;

/// What a record of `__consumer_offsets` is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RecordKey {
    Offset {
        group: String,
        topic: String,
        partition: i32,
    },
    Group {
        group: String,
    },
    /// A group of the consumer protocol: its whole state.
    ConsumerGroup {
        group: String,
    },
}

/// A committed offset as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetValue {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
    pub commit_timestamp: i64,
}

/// One member of a stored group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberValue {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub rebalance_timeout_ms: i32,
    pub session_timeout_ms: i32,
    pub subscription: Bytes,
    pub assignment: Bytes,
}

/// A group's membership after a completed rebalance, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupValue {
    pub protocol_type: String,
    pub generation: i32,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    pub current_state_timestamp: i64,
    pub members: Vec<MemberValue>,
}

const OFFSET_KEY_VERSION: i16 = 1;
const GROUP_KEY_VERSION: i16 = 2;
const CONSUMER_GROUP_KEY_VERSION: i16 = 100;
const OFFSET_VALUE_VERSION: i16 = 3;
const GROUP_VALUE_VERSION: i16 = 3;

pub(crate) fn put_str(buf: &mut BytesMut, s: &str) {
    // Names are bounded well below i16::MAX by request decoding; clamp anyway.
    let bytes = &s.as_bytes()[..s.len().min(i16::MAX as usize)];
    buf.put_i16(bytes.len() as i16);
    buf.put_slice(bytes);
}

pub(crate) fn put_opt_str(buf: &mut BytesMut, s: Option<&str>) {
    match s {
        Some(s) => put_str(buf, s),
        None => buf.put_i16(-1),
    }
}

fn put_bytes(buf: &mut BytesMut, b: &[u8]) {
    buf.put_i32(b.len() as i32);
    buf.put_slice(b);
}

pub(crate) fn need(buf: &Bytes, n: usize) -> Result<()> {
    if buf.remaining() < n {
        Err(RecordError::Truncated)
    } else {
        Ok(())
    }
}

pub(crate) fn get_i16(buf: &mut Bytes) -> Result<i16> {
    need(buf, 2)?;
    Ok(buf.get_i16())
}

pub(crate) fn get_i32(buf: &mut Bytes) -> Result<i32> {
    need(buf, 4)?;
    Ok(buf.get_i32())
}

pub(crate) fn get_i64(buf: &mut Bytes) -> Result<i64> {
    need(buf, 8)?;
    Ok(buf.get_i64())
}

pub(crate) fn get_opt_str(buf: &mut Bytes) -> Result<Option<String>> {
    let len = get_i16(buf)?;
    if len < 0 {
        return Ok(None);
    }
    need(buf, len as usize)?;
    let raw = buf.split_to(len as usize);
    String::from_utf8(raw.to_vec()).map(Some).map_err(|_| RecordError::NotUtf8)
}

pub(crate) fn get_str(buf: &mut Bytes) -> Result<String> {
    Ok(get_opt_str(buf)?.unwrap_or_default())
}

fn get_bytes(buf: &mut Bytes) -> Result<Bytes> {
    let len = get_i32(buf)?;
    if len < 0 {
        return Ok(Bytes::new());
    }
    need(buf, len as usize)?;
    Ok(buf.split_to(len as usize))
}

impl RecordKey {
    pub fn group(&self) -> &str {
        match self {
            RecordKey::Offset { group, .. } | RecordKey::Group { group } | RecordKey::ConsumerGroup { group } => group,
        }
    }

    pub fn encode(&self) -> Bytes {
        let mut buf = BytesMut::new();
        match self {
            RecordKey::Offset { group, topic, partition } => {
                buf.put_i16(OFFSET_KEY_VERSION);
                put_str(&mut buf, group);
                put_str(&mut buf, topic);
                buf.put_i32(*partition);
            }
            RecordKey::Group { group } => {
                buf.put_i16(GROUP_KEY_VERSION);
                put_str(&mut buf, group);
            }
            RecordKey::ConsumerGroup { group } => {
                buf.put_i16(CONSUMER_GROUP_KEY_VERSION);
                put_str(&mut buf, group);
            }
        }
        buf.freeze()
    }

    pub fn decode(mut buf: Bytes) -> Result<Self> {
        match get_i16(&mut buf)? {
            0 | 1 => Ok(RecordKey::Offset {
                group: get_str(&mut buf)?,
                topic: get_str(&mut buf)?,
                partition: get_i32(&mut buf)?,
            }),
            2 => Ok(RecordKey::Group { group: get_str(&mut buf)? }),
            CONSUMER_GROUP_KEY_VERSION => Ok(RecordKey::ConsumerGroup { group: get_str(&mut buf)? }),
            version => Err(RecordError::UnknownVersion { what: "key", version }),
        }
    }
}

impl OffsetValue {
    pub fn encode(&self) -> Bytes {
        let mut buf = BytesMut::with_capacity(32 + self.metadata.len());
        buf.put_i16(OFFSET_VALUE_VERSION);
        buf.put_i64(self.offset);
        buf.put_i32(self.leader_epoch);
        put_str(&mut buf, &self.metadata);
        buf.put_i64(self.commit_timestamp);
        buf.freeze()
    }

    /// Reads versions 1 (with an expire timestamp) and 3.
    pub fn decode(mut buf: Bytes) -> Result<Self> {
        let version = get_i16(&mut buf)?;
        let offset = get_i64(&mut buf)?;
        let leader_epoch = if version >= 3 { get_i32(&mut buf)? } else { -1 };
        let metadata = get_str(&mut buf)?;
        let commit_timestamp = get_i64(&mut buf)?;
        match version {
            0 | 2 | 3 => {}
            1 => {
                get_i64(&mut buf)?;
            }
            version => return Err(RecordError::UnknownVersion { what: "offset value", version }),
        }
        Ok(OffsetValue { offset, leader_epoch, metadata, commit_timestamp })
    }
}

impl GroupValue {
    pub fn encode(&self) -> Bytes {
        let mut buf = BytesMut::new();
        buf.put_i16(GROUP_VALUE_VERSION);
        put_str(&mut buf, &self.protocol_type);
        buf.put_i32(self.generation);
        put_opt_str(&mut buf, self.protocol.as_deref());
        put_opt_str(&mut buf, self.leader.as_deref());
        buf.put_i64(self.current_state_timestamp);
        buf.put_i32(self.members.len() as i32);
        for m in &self.members {
            put_str(&mut buf, &m.member_id);
            put_opt_str(&mut buf, m.instance_id.as_deref());
            put_str(&mut buf, &m.client_id);
            put_str(&mut buf, &m.client_host);
            buf.put_i32(m.rebalance_timeout_ms);
            buf.put_i32(m.session_timeout_ms);
            put_bytes(&mut buf, &m.subscription);
            put_bytes(&mut buf, &m.assignment);
        }
        buf.freeze()
    }

    /// Reads versions 0 to 3.
    pub fn decode(mut buf: Bytes) -> Result<Self> {
        let version = get_i16(&mut buf)?;
        if !(0..=3).contains(&version) {
            return Err(RecordError::UnknownVersion { what: "group value", version });
        }
        let protocol_type = get_str(&mut buf)?;
        let generation = get_i32(&mut buf)?;
        let protocol = get_opt_str(&mut buf)?;
        let leader = get_opt_str(&mut buf)?;
        let current_state_timestamp = if version >= 2 { get_i64(&mut buf)? } else { -1 };
        let count = get_i32(&mut buf)?.max(0);
        let mut members = Vec::new();
        for _ in 0..count {
            let member_id = get_str(&mut buf)?;
            let instance_id = if version >= 3 { get_opt_str(&mut buf)? } else { None };
            let client_id = get_str(&mut buf)?;
            let client_host = get_str(&mut buf)?;
            let rebalance_timeout_ms = if version >= 1 { get_i32(&mut buf)? } else { -1 };
            let session_timeout_ms = get_i32(&mut buf)?;
            let subscription = get_bytes(&mut buf)?;
            let assignment = get_bytes(&mut buf)?;
            members.push(MemberValue {
                member_id,
                instance_id,
                client_id,
                client_host,
                rebalance_timeout_ms: if rebalance_timeout_ms < 0 { session_timeout_ms } else { rebalance_timeout_ms },
                session_timeout_ms,
                subscription,
                assignment,
            });
        }
        Ok(GroupValue { protocol_type, generation, protocol, leader, current_state_timestamp, members })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn offset_commit_round_trips() {
        let key = RecordKey::Offset { group: "g".into(), topic: "orders".into(), partition: 7 };
        assert_eq!(RecordKey::decode(key.encode()), Ok(key));
        let value = OffsetValue { offset: 42, leader_epoch: 3, metadata: "m".into(), commit_timestamp: 1_700_000 };
        assert_eq!(OffsetValue::decode(value.encode()), Ok(value));
    }

    #[test]
    fn group_round_trips() {
        let key = RecordKey::Group { group: "g".into() };
        assert_eq!(RecordKey::decode(key.encode()), Ok(key));
        let key = RecordKey::ConsumerGroup { group: "g".into() };
        assert_eq!(RecordKey::decode(key.encode()), Ok(key));
        let value = GroupValue {
            protocol_type: "consumer".into(),
            generation: 5,
            protocol: Some("range".into()),
            leader: Some("m1".into()),
            current_state_timestamp: 99,
            members: vec![MemberValue {
                member_id: "m1".into(),
                instance_id: Some("i1".into()),
                client_id: "c".into(),
                client_host: "/127.0.0.1".into(),
                rebalance_timeout_ms: 300_000,
                session_timeout_ms: 10_000,
                subscription: Bytes::from_static(b"sub"),
                assignment: Bytes::from_static(b"asg"),
            }],
        };
        assert_eq!(GroupValue::decode(value.encode()), Ok(value));
    }

    #[test]
    fn truncated_and_unknown_records_are_errors() {
        let key = RecordKey::Offset { group: "g".into(), topic: "t".into(), partition: 0 }.encode();
        assert_eq!(RecordKey::decode(key.slice(..key.len() - 1)), Err(RecordError::Truncated));
        assert_eq!(
            RecordKey::decode(Bytes::from_static(&[0, 9])),
            Err(RecordError::UnknownVersion { what: "key", version: 9 })
        );
        assert_eq!(GroupValue::decode(Bytes::new()), Err(RecordError::Truncated));
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(raw in proptest::collection::vec(any::<u8>(), 0..64)) {
            let raw = Bytes::from(raw);
            let _ = RecordKey::decode(raw.clone());
            let _ = OffsetValue::decode(raw.clone());
            let _ = GroupValue::decode(raw);
        }
    }
}
