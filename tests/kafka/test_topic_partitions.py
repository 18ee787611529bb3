"""DescribeTopicPartitions (KIP-966) by hand, as `kafka-topics --describe` (Kafka 3.8+)
sends it: topics in name order, paged by `response_partition_limit` with a cursor,
errors per named topic, a cursor outside the named topics refused. And the telemetry
APIs (KIP-714) as Kafka has them without a telemetry plugin: not advertised, and a
client that sends one anyway is disconnected."""
import pytest

import wire
from harness import FAST

API_DESCRIBE_TOPIC_PARTITIONS = 75
API_GET_TELEMETRY_SUBSCRIPTIONS = 71
API_PUSH_TELEMETRY = 72
UNKNOWN_TOPIC_OR_PARTITION, INVALID_REQUEST = 3, 42


def describe(addr, topics=(), limit=2000, cursor=None):
    """(topics, next_cursor): topics as [(error, name, {partition: (leader, replicas, isr)})]."""
    body = wire.carray([wire.cstring(t) + wire.NO_TAGS for t in topics]) + wire.i32(limit)
    if cursor is None:
        body += wire.i8(-1)
    else:
        body += wire.i8(1) + wire.cstring(cursor[0]) + wire.i32(cursor[1]) + wire.NO_TAGS
    body += wire.NO_TAGS
    r = wire.roundtrip(addr, API_DESCRIBE_TOPIC_PARTITIONS, 0, body, flexible=True)
    r.i32()  # throttle
    out = []
    for _ in range(r.carray_len()):
        err, name = r.i16(), r.cstring()
        r.take(16)  # topic id
        r.i8()  # is_internal
        parts = {}
        for _ in range(r.carray_len()):
            perr, index, leader, _epoch = r.i16(), r.i32(), r.i32(), r.i32()
            replicas = [r.i32() for _ in range(r.carray_len())]
            isr = [r.i32() for _ in range(r.carray_len())]
            elr = [r.i32() for _ in range(max(r.carray_len(), 0))]
            last_elr = [r.i32() for _ in range(max(r.carray_len(), 0))]
            [r.i32() for _ in range(r.carray_len())]  # offline
            r.skip_tags()
            assert perr == 0 and elr == [] and last_elr == [], (perr, elr, last_elr)
            parts[index] = (leader, replicas, isr)
        r.i32()  # authorized operations
        r.skip_tags()
        out.append((err, name, parts))
    next_cursor = None
    if r.i8() >= 0:
        next_cursor = (r.cstring(), r.i32())
        r.skip_tags()
    r.skip_tags()
    return out, next_cursor


def test_topics_are_paged_in_name_order_with_a_cursor(make_cluster):
    cluster = make_cluster(1, FAST)
    for name, n in [("tp-b", 2), ("tp-a", 3), ("tp-c", 1)]:
        cluster.create_topic(name, partitions=n, rf=1)
        cluster.wait_topic(name, n)
    addr = cluster.node(1).kafka_addr
    assert API_DESCRIBE_TOPIC_PARTITIONS in wire.api_versions(addr)

    topics, cursor = describe(addr)
    assert [t[1] for t in topics] == ["tp-a", "tp-b", "tp-c"] and cursor is None, topics
    assert all(err == 0 for err, _, _ in topics)
    assert {n: sorted(p) for _, n, p in topics} == {"tp-a": [0, 1, 2], "tp-b": [0, 1], "tp-c": [0]}
    assert topics[0][2][1] == (1, [1], [1])

    # Two partitions at a time: a cursor inside tp-a, then one at the start of tp-c.
    pages, cursor, seen = 0, None, []
    while True:
        topics, cursor = describe(addr, limit=2, cursor=cursor)
        pages += 1
        seen += [(n, i) for _, n, p in topics for i in sorted(p)]
        assert sum(len(p) for _, _, p in topics) <= 2
        if cursor is None:
            break
        assert pages < 10, cursor
    assert pages == 3 and seen == [("tp-a", 0), ("tp-a", 1), ("tp-a", 2), ("tp-b", 0), ("tp-b", 1), ("tp-c", 0)], seen
    assert describe(addr, limit=3)[1] == ("tp-b", 0), "the limit reached at a topic's end points at the next"

    # Named: sorted, missing ones answered apart.
    topics, cursor = describe(addr, ["tp-c", "missing", "tp-a"], limit=2)
    assert [(e, n) for e, n, _ in topics] == [(UNKNOWN_TOPIC_OR_PARTITION, "missing"), (0, "tp-a")], topics
    assert cursor == ("tp-a", 2)
    topics, cursor = describe(addr, ["tp-c", "tp-a"], limit=2, cursor=cursor)
    assert [(n, sorted(p)) for _, n, p in topics] == [("tp-a", [2]), ("tp-c", [0])] and cursor is None, topics

    # A cursor must name a topic asked for.
    topics, _ = describe(addr, ["tp-a"], cursor=("tp-b", 0))
    assert [(e, n) for e, n, _ in topics] == [(INVALID_REQUEST, "tp-a")], topics


def test_telemetry_apis_are_absent_as_in_kafka_without_a_telemetry_plugin(make_cluster):
    cluster = make_cluster(1, FAST)
    addr = cluster.node(1).kafka_addr
    versions = wire.api_versions(addr)
    assert API_GET_TELEMETRY_SUBSCRIPTIONS not in versions and API_PUSH_TELEMETRY not in versions
    # A client that asks anyway is disconnected, as Kafka disconnects it for an API it has not enabled.
    with pytest.raises((OSError, ValueError)):
        wire.roundtrip(addr, API_GET_TELEMETRY_SUBSCRIPTIONS, 0, bytes(16) + wire.NO_TAGS, flexible=True)
    assert API_GET_TELEMETRY_SUBSCRIPTIONS not in wire.api_versions(addr), "and the broker carries on"
