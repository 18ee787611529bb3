"""Per-record checks on Produce (Kafka's LogValidator): a compacted topic refuses records
without a key (INVALID_RECORD), and a CreateTime topic with message.timestamp.before/after
bounds refuses timestamps outside them (INVALID_TIMESTAMP). Refused record sets are not
stored; Produce v8+ names each bad record (KIP-467's record_errors) and the reason."""
import time

import confluent_kafka as ck

import wire
from clients import confluent_producer

INVALID_TIMESTAMP, INVALID_RECORD = 32, 87


def produce_all(bootstrap, topic, records, timeout=30):
    """Produces [(key, value, timestamp or None)]; returns the delivery errors in order
    (None for delivered)."""
    p = confluent_producer(bootstrap, **{"retries": 0, "linger.ms": 0})
    outcome = {}
    for i, (key, value, ts) in enumerate(records):
        kwargs = {"timestamp": ts} if ts is not None else {}
        p.produce(topic, value=value, key=key, partition=0,
                  on_delivery=lambda err, msg, i=i: outcome.__setitem__(i, err), **kwargs)
        p.flush(timeout)  # one record per batch, so each gets its own verdict
    assert p.flush(timeout) == 0, "records left undelivered"
    assert len(outcome) == len(records), outcome
    return [outcome[i] for i in range(len(records))]


def log_end(cluster, topic):
    return cluster.topic(topic)["partitions"][0]["log_end_offset"]


def produce_v8(addr, topic, batch):
    """A raw Produce v8: (error_code, base_offset, record_errors [(index, message)], error_message)."""
    body = (wire.string(None) + wire.i16(-1) + wire.i32(10000) + wire.i32(1) + wire.string(topic) + wire.i32(1)
            + wire.i32(0) + wire.nbytes(batch))
    r = wire.roundtrip(addr, wire.API_PRODUCE, 8, body, timeout=20)
    assert r.i32() == 1 and r.string() == topic and r.i32() == 1 and r.i32() == 0
    err, base = r.i16(), r.i64()
    r.i64()  # log_append_time_ms
    r.i64()  # log_start_offset
    errors = [(r.i32(), r.string()) for _ in range(r.i32())]
    return err, base, errors, r.string()


def test_compacted_topic_refuses_records_without_key(cluster):
    topic = "validation-compacted"
    cluster.create_topic(topic, configs={"cleanup.policy": "compact"})
    cluster.wait_topic(topic, 1)
    errors = produce_all(cluster.bootstrap, topic, [(None, b"keyless", None)])
    assert errors[0] is not None and errors[0].code() == ck.KafkaError.INVALID_RECORD, errors
    assert log_end(cluster, topic) == 0, "a refused record must not be stored"
    errors = produce_all(cluster.bootstrap, topic, [(b"k1", b"v1", None), (b"", b"empty key", None),
                                                     (b"k2", None, None)])
    assert errors == [None, None, None], errors
    assert log_end(cluster, topic) == 3


def test_compact_delete_policy_also_needs_keys(cluster):
    topic = "validation-compact-delete"
    cluster.create_topic(topic, configs={"cleanup.policy": "delete,compact"})
    cluster.wait_topic(topic, 1)
    errors = produce_all(cluster.bootstrap, topic, [(None, b"keyless", None), (b"k", b"v", None)])
    assert errors[0] is not None and errors[0].code() == ck.KafkaError.INVALID_RECORD, errors
    assert errors[1] is None


def test_delete_policy_takes_records_without_key(cluster):
    topic = "validation-delete"
    cluster.create_topic(topic)
    cluster.wait_topic(topic, 1)
    assert produce_all(cluster.bootstrap, topic, [(None, b"keyless", None)]) == [None]


def test_record_errors_name_each_bad_record(cluster):
    topic = "validation-record-errors"
    cluster.create_topic(topic, configs={"cleanup.policy": "compact"})
    cluster.wait_topic(topic, 1)
    addr = cluster.node(1).kafka_addr
    batch = wire.record_batch([(b"k", b"a"), (None, b"b"), (b"k", b"c"), (None, b"d")], int(time.time() * 1000))
    err, base, record_errors, message = produce_v8(addr, topic, batch)
    assert err == INVALID_RECORD and base == -1
    assert [i for i, _ in record_errors] == [1, 3], record_errors
    assert all("without key" in m for _, m in record_errors), record_errors
    assert message and "2 record errors" in message, message
    # Older versions carry just the code.
    assert wire.produce(addr, topic, 0, batch, version=7)[0] == INVALID_RECORD
    assert log_end(cluster, topic) == 0


def test_timestamps_outside_the_configured_window_are_refused(cluster):
    topic = "validation-timestamps"
    cluster.create_topic(topic, configs={"message.timestamp.after.max.ms": "60000",
                                         "message.timestamp.before.max.ms": "3600000"})
    cluster.wait_topic(topic, 1)
    now = int(time.time() * 1000)
    errors = produce_all(cluster.bootstrap, topic, [
        (b"k", b"an hour ahead", now + 3_600_000),
        (b"k", b"two hours ago", now - 7_200_000),
        (b"k", b"now", now),
        (b"k", b"half a minute ahead", now + 30_000),
    ])
    assert [e.code() if e else None for e in errors] == [
        ck.KafkaError.INVALID_TIMESTAMP, ck.KafkaError.INVALID_TIMESTAMP, None, None], errors
    assert log_end(cluster, topic) == 2
    err, _, record_errors, message = produce_v8(cluster.node(1).kafka_addr, topic,
                                                wire.record_batch([(b"k", b"v")], now + 3_600_000))
    assert err == INVALID_TIMESTAMP and [i for i, _ in record_errors] == [0], record_errors
    assert "out of range" in record_errors[0][1] and message


def test_legacy_timestamp_difference_bounds_both_ways(cluster):
    topic = "validation-difference"
    cluster.create_topic(topic, configs={"message.timestamp.difference.max.ms": "60000"})
    cluster.wait_topic(topic, 1)
    now = int(time.time() * 1000)
    errors = produce_all(cluster.bootstrap, topic, [(b"k", b"ahead", now + 600_000), (b"k", b"behind", now - 600_000),
                                                     (b"k", b"now", now)])
    assert [e.code() if e else None for e in errors] == [
        ck.KafkaError.INVALID_TIMESTAMP, ck.KafkaError.INVALID_TIMESTAMP, None], errors
