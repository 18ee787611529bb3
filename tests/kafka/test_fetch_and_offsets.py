"""Fetch size limits (KIP-74), ListOffsets MAX_TIMESTAMP (KIP-734), authorized
operations (KIP-430) and Metadata by topic id: defects an independent client suite found, each checked with
confluent-kafka and, where the client hides the detail, with hand-made requests."""
import time
import uuid

from confluent_kafka import TopicCollection, TopicPartition
from confluent_kafka.admin import OffsetSpec

import clients
import wire


def fetch_partitions(addr, topic, partitions, max_bytes, partition_max_bytes, replica_id=-1):
    """Fetch v4 of several partitions from offset 0: {partition: (error, records bytes)}."""
    body = (wire.i32(replica_id) + wire.i32(100) + wire.i32(1) + wire.i32(max_bytes) + wire.i8(0) + wire.i32(1)
            + wire.string(topic) + wire.i32(len(partitions)))
    for p in partitions:
        body += wire.i32(p) + wire.i64(0) + wire.i32(partition_max_bytes)
    r = wire.roundtrip(addr, wire.API_FETCH, 4, body, timeout=15)
    r.i32()  # throttle
    assert r.i32() == 1 and r.string() == topic
    out = {}
    for _ in range(r.i32()):
        p, err = r.i32(), r.i16()
        r.i64()  # high watermark
        r.i64()  # last stable offset
        for _ in range(max(r.i32(), 0)):
            r.i64()
            r.i64()
        out[p] = (err, r.nbytes() or b"")
    return out


def produce_batch(addr, topic, partition, value_bytes, count=1):
    err, base = wire.produce(addr, topic, partition,
                             wire.record_batch([(None, bytes([65 + i]) * value_bytes) for i in range(count)],
                                               int(time.time() * 1000)), acks=1)
    assert err == 0, f"produce to {topic}-{partition}: {wire.error_name(err)}"
    return base


def test_fetch_respects_max_bytes_with_a_large_partition_limit(cluster):
    """fetch.max.bytes 1 MB with 20 MB per partition: every answer stays near 1 MB (one
    batch may exceed it, never the sum), so the client accepts it and reads everything.
    Before the fix the broker answered the whole 6 MB and librdkafka refused the
    response ("Invalid response size") and consumed nothing."""
    topic = "fetch-max-bytes"
    cluster.create_topic(topic, partitions=1)
    cluster.wait_topic(topic, 1)
    records = [clients.Rec(key=f"k{i}".encode(), value=bytes([i % 256]) * 100_000, partition=0) for i in range(60)]
    clients.produce_confluent(cluster.bootstrap, topic, records, batch_size=500_000, linger_ms=50)
    got = clients.consume_confluent(cluster.bootstrap, topic, {0: 60}, timeout=60, fetch_max_bytes=1_000_000,
                                    max_partition_fetch_bytes=20_000_000,
                                    receive_message_max_bytes=1_000_000 + 600_000)
    assert [g.offset for g in got[0]] == list(range(60))
    assert all(g.value == r.value for g, r in zip(got[0], records))


def test_first_batch_goes_whole_and_nothing_else_past_max_bytes(cluster):
    """KIP-74 by hand: a 300 kB batch is returned whole to a 1 kB fetch (so a consumer
    makes progress), and the other partitions of that answer get nothing; a fetch with
    room for exactly the first batch of each partition gets both, and no partition's
    answer is over its limit except that first batch."""
    topic = "fetch-min-one-batch"
    cluster.create_topic(topic, partitions=2)
    cluster.wait_topic(topic, 2)
    addr = cluster.node(1).kafka_addr
    for p in (0, 1):
        produce_batch(addr, topic, p, 300_000)
        produce_batch(addr, topic, p, 1_000, count=3)

    got = fetch_partitions(addr, topic, [0, 1], max_bytes=1_000, partition_max_bytes=20_000_000)
    assert got[0][0] == 0 and got[1][0] == 0, got
    first = wire.batch_headers(got[0][1])
    assert [(b, n) for b, n, _ in first] == [(0, 1)], f"partition 0 should hold only its first batch: {first}"
    assert 300_000 < len(got[0][1]) < 301_000
    assert got[1][1] == b"", f"partition 1 got {len(got[1][1])} bytes past the fetch's max_bytes"

    # Per-partition limit: the first non-empty partition still gets its first batch;
    # the second, with a limit below its first batch, gets nothing.
    got = fetch_partitions(addr, topic, [0, 1], max_bytes=10_000_000, partition_max_bytes=1_000)
    assert [b for b, _, _ in wire.batch_headers(got[0][1])] == [0]
    assert got[1][1] == b""

    # Room for everything: both partitions whole.
    got = fetch_partitions(addr, topic, [0, 1], max_bytes=10_000_000, partition_max_bytes=20_000_000)
    for p in (0, 1):
        assert [(b, n) for b, n, _ in wire.batch_headers(got[p][1])] == [(0, 1), (1, 3)], got[p][1][:80]


def test_list_offsets_max_timestamp(cluster):
    """ListOffsets with timestamp -3 (KIP-734) answers the record with the largest
    timestamp: 100, 400, 250 gives offset 1 at 400, also when the record is inside a
    batch; an empty partition answers -1."""
    topic = "max-timestamp"
    cluster.create_topic(topic, partitions=2)
    cluster.wait_topic(topic, 2)
    records = [clients.Rec(key=None, value=f"v{ts}".encode(), timestamp=ts, partition=0) for ts in (100, 400, 250)]
    # One batch: the answer needs the record inside it, not the batch's base offset.
    clients.produce_confluent(cluster.bootstrap, topic, records, linger_ms=200)
    clients.produce_confluent(cluster.bootstrap, topic, [clients.Rec(key=None, value=b"late", timestamp=300)])
    admin = clients.confluent_admin(cluster.bootstrap)
    spec = {TopicPartition(topic, 0): OffsetSpec.max_timestamp(), TopicPartition(topic, 1): OffsetSpec.max_timestamp()}
    result = {tp.partition: f.result(timeout=30) for tp, f in admin.list_offsets(spec, request_timeout=30).items()}
    assert (result[0].offset, result[0].timestamp) == (1, 400), result[0]
    assert result[1].offset == -1, result[1]
    # Earliest and latest are unchanged.
    spec = {TopicPartition(topic, 0): OffsetSpec.earliest()}
    assert admin.list_offsets(spec)[TopicPartition(topic, 0)].result(timeout=30).offset == 0
    spec = {TopicPartition(topic, 0): OffsetSpec.latest()}
    assert admin.list_offsets(spec)[TopicPartition(topic, 0)].result(timeout=30).offset == 4


def test_authorized_operations_are_every_supported_operation(cluster):
    """Without an authorizer Kafka reports every operation a resource supports when a
    client asks: 7 for the cluster, 8 for a topic, 3 for a group (not none)."""
    topic = "authorized-ops"
    cluster.create_topic(topic, partitions=1)
    cluster.wait_topic(topic, 1)
    admin = clients.confluent_admin(cluster.bootstrap)
    described = admin.describe_cluster(include_authorized_operations=True, request_timeout=30).result(timeout=30)
    assert {op.name for op in described.authorized_operations} == {
        "CREATE", "CLUSTER_ACTION", "DESCRIBE_CONFIGS", "ALTER_CONFIGS", "IDEMPOTENT_WRITE", "ALTER", "DESCRIBE"}

    futures = admin.describe_topics(TopicCollection([topic]), include_authorized_operations=True, request_timeout=30)
    t = futures[topic].result(timeout=30)
    assert {op.name for op in t.authorized_operations} == {
        "READ", "WRITE", "CREATE", "DESCRIBE", "DELETE", "ALTER", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"}

    group = "authorized-ops-group"
    c = clients.confluent_consumer(cluster.bootstrap, group_id=group)
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + 30
        while not c.assignment():
            assert time.monotonic() < deadline, "consumer got no assignment"
            c.poll(0.2)
        g = admin.describe_consumer_groups([group], include_authorized_operations=True,
                                           request_timeout=30)[group].result(timeout=30)
        assert {op.name for op in g.authorized_operations} == {"READ", "DESCRIBE", "DELETE"}
    finally:
        c.close()


def test_authorized_operations_by_hand_only_when_asked(cluster):
    """Metadata v8 carries the topic's and the cluster's bit fields when asked, and
    Kafka's 'not asked' value (-2147483648) otherwise."""
    topic = "authorized-ops-raw"
    cluster.create_topic(topic, partitions=1)
    cluster.wait_topic(topic, 1)
    addr = cluster.node(1).kafka_addr

    def metadata(include):
        body = (wire.i32(1) + wire.string(topic) + wire.i8(0) + wire.i8(1 if include else 0)
                + wire.i8(1 if include else 0))
        r = wire.roundtrip(addr, wire.API_METADATA, 8, body)
        r.i32()  # throttle
        for _ in range(r.i32()):
            r.i32(), r.string(), r.i32(), r.string()
        r.string()  # cluster id
        r.i32()  # controller
        assert r.i32() == 1
        assert r.i16() == 0 and r.string() == topic
        r.i8()  # internal
        for _ in range(r.i32()):
            r.i16(), r.i32(), r.i32(), r.i32()
            for _ in range(3):
                for _ in range(r.i32()):
                    r.i32()
        topic_ops = r.i32()
        return topic_ops, r.i32()

    topic_ops, cluster_ops = metadata(True)
    assert bin(topic_ops).count("1") == 8 and bin(cluster_ops).count("1") == 7, (topic_ops, cluster_ops)
    assert metadata(False) == (-2147483648, -2147483648)


def metadata_v12(addr, topics):
    """Metadata v12 (flexible) for topics given as (uuid.UUID or None, name or None):
    [(error_code, name, topic_id, partition count)]."""
    body = wire.carray([id_.bytes + wire.cstring(name) + wire.NO_TAGS for id_, name in topics])
    body += wire.i8(0) + wire.i8(0) + wire.NO_TAGS
    r = wire.roundtrip(addr, wire.API_METADATA, 12, body, flexible=True)
    r.i32()  # throttle
    for _ in range(r.carray_len()):
        r.i32(), r.cstring(), r.i32(), r.cstring()
        r.skip_tags()
    r.cstring()  # cluster id
    r.i32()  # controller
    out = []
    for _ in range(r.carray_len()):
        err, name, topic_id = r.i16(), r.cstring(), uuid.UUID(bytes=r.take(16))
        r.i8()  # internal
        n = r.carray_len()
        for _ in range(n):
            r.i16(), r.i32(), r.i32(), r.i32()
            for _ in range(3):
                for _ in range(r.carray_len()):
                    r.i32()
            r.skip_tags()
        r.i32()  # authorized operations
        r.skip_tags()
        out.append((err, name, topic_id, n))
    return out


def test_metadata_v12_by_topic_id(cluster):
    """Metadata v12 looks topics up by id (a lookup the request allows since v10): the
    answer names the topic; an unknown id gets UNKNOWN_TOPIC_ID (100), not silence."""
    topic = "metadata-by-id"
    cluster.create_topic(topic, partitions=3)
    described = cluster.wait_topic(topic, 3)
    topic_id = uuid.UUID(described["topic_id"])
    unknown = uuid.uuid4()
    got = metadata_v12(cluster.node(1).kafka_addr, [(topic_id, None), (unknown, None)])
    assert sorted(got, key=lambda t: t[0]) == [(0, topic, topic_id, 3), (100, None, unknown, 0)], got
    # By name, the id comes back.
    assert metadata_v12(cluster.node(1).kafka_addr, [(uuid.UUID(int=0), topic)]) == [(0, topic, topic_id, 3)]
