//! The records of `__transaction_state`, in Kafka's layout (version 0 of
//! `TransactionLogKey` and `TransactionLogValue`) so that Kafka's own tools
//! can read the topic: the key is the transactional id, the value the
//! transaction's producer, status and partitions; a null value is a
//! tombstone. Primitives are those of `__consumer_offsets`.

use bytes::{BufMut, Bytes, BytesMut};

use crate::group::records::{get_i16, get_i32, get_i64, get_str, need, put_str, RecordError, Result};

use super::state::{TxnMeta, TxnState};

const KEY_VERSION: i16 = 0;
const VALUE_VERSION: i16 = 0;

pub fn encode_key(transactional_id: &str) -> Bytes {
    let mut buf = BytesMut::with_capacity(4 + transactional_id.len());
    buf.put_i16(KEY_VERSION);
    put_str(&mut buf, transactional_id);
    buf.freeze()
}

pub fn decode_key(mut buf: Bytes) -> Result<String> {
    match get_i16(&mut buf)? {
        KEY_VERSION => get_str(&mut buf),
        version => Err(RecordError::UnknownVersion { what: "transaction key", version }),
    }
}

/// Kafka's status byte of each state.
fn status_byte(state: TxnState) -> i8 {
    match state {
        TxnState::Empty => 0,
        TxnState::Ongoing => 1,
        TxnState::PrepareCommit => 2,
        TxnState::PrepareAbort => 3,
        TxnState::CompleteCommit => 4,
        TxnState::CompleteAbort => 5,
    }
}

fn state_of(status: i8) -> Result<TxnState> {
    Ok(match status {
        0 => TxnState::Empty,
        1 => TxnState::Ongoing,
        2 => TxnState::PrepareCommit,
        3 => TxnState::PrepareAbort,
        4 => TxnState::CompleteCommit,
        5 => TxnState::CompleteAbort,
        // Dead (6) and PrepareEpochFence (7) are never written by Kafka.
        other => return Err(RecordError::UnknownVersion { what: "transaction status", version: i16::from(other) }),
    })
}

pub fn encode_value(meta: &TxnMeta) -> Bytes {
    let mut buf = BytesMut::with_capacity(64);
    buf.put_i16(VALUE_VERSION);
    buf.put_i64(meta.producer_id);
    buf.put_i16(meta.producer_epoch);
    buf.put_i32(meta.timeout_ms);
    buf.put_i8(status_byte(meta.state));
    let mut by_topic: Vec<(&str, Vec<i32>)> = Vec::new();
    for (topic, partition) in &meta.partitions {
        match by_topic.last_mut() {
            Some((t, ps)) if *t == topic.as_str() => ps.push(*partition),
            _ => by_topic.push((topic.as_str(), vec![*partition])),
        }
    }
    buf.put_i32(by_topic.len() as i32);
    for (topic, partitions) in by_topic {
        put_str(&mut buf, topic);
        buf.put_i32(partitions.len() as i32);
        partitions.iter().for_each(|p| buf.put_i32(*p));
    }
    buf.put_i64(meta.update_ms);
    buf.put_i64(meta.start_ms);
    buf.freeze()
}

pub fn decode_value(transactional_id: &str, mut buf: Bytes) -> Result<TxnMeta> {
    let version = get_i16(&mut buf)?;
    if version != VALUE_VERSION {
        return Err(RecordError::UnknownVersion { what: "transaction value", version });
    }
    let producer_id = get_i64(&mut buf)?;
    let producer_epoch = get_i16(&mut buf)?;
    let timeout_ms = get_i32(&mut buf)?;
    need(&buf, 1)?;
    let state = state_of(bytes::Buf::get_i8(&mut buf))?;
    let mut partitions = std::collections::BTreeSet::new();
    for _ in 0..get_i32(&mut buf)?.max(0) {
        let topic = get_str(&mut buf)?;
        for _ in 0..get_i32(&mut buf)?.max(0) {
            partitions.insert((topic.clone(), get_i32(&mut buf)?));
        }
    }
    let update_ms = get_i64(&mut buf)?;
    let start_ms = get_i64(&mut buf)?;
    Ok(TxnMeta {
        transactional_id: transactional_id.to_string(),
        producer_id,
        producer_epoch,
        timeout_ms,
        state,
        partitions,
        start_ms,
        update_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip() {
        let meta = TxnMeta {
            transactional_id: "tx".into(),
            producer_id: 42,
            producer_epoch: 3,
            timeout_ms: 60_000,
            state: TxnState::Ongoing,
            partitions: [("a".to_string(), 1), ("a".to_string(), 0), ("b".to_string(), 7)].into_iter().collect(),
            start_ms: 10,
            update_ms: 20,
        };
        assert_eq!(decode_value("tx", encode_value(&meta)), Ok(meta));
        assert_eq!(decode_key(encode_key("tx")), Ok("tx".to_string()));
        assert!(decode_value("tx", Bytes::from_static(&[0, 0, 1])).is_err(), "truncated");
        assert!(decode_key(Bytes::from_static(&[0, 9, 0, 0])).is_err(), "unknown version");
    }
}
