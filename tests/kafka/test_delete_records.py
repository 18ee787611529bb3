"""DeleteRecords (AdminClient.delete_records, kafka-delete-records): the log start
offset moves up on the leader, durably; records below it are gone for consumers;
followers move theirs from their next fetch, so it survives the leader's death and a
restart; segments wholly below it are deleted; bad requests get Kafka's errors."""
import glob
import os

import confluent_kafka as ck
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

import wire
from harness import FAST, wait_for

API_DELETE_RECORDS = 21


def raw_delete(cluster, topic, partition, offset):
    """DeleteRecords v1 by hand: (partition, low watermark, error code)."""
    body = wire.i32(1) + wire.string(topic) + wire.i32(1) + wire.i32(partition) + wire.i64(offset) + wire.i32(10_000)
    r = wire.roundtrip(cluster.node(1).kafka_addr, API_DELETE_RECORDS, 1, body)
    r.i32()  # throttle
    assert r.i32() == 1 and r.string() == topic and r.i32() == 1
    return r.i32(), r.i64(), r.i16()


def partition_dir(cluster, nid, topic, partition):
    return os.path.join(cluster.nodes[nid].data_dir, "logs", f"{topic}-{partition}")


def log_start_file(cluster, nid, topic, partition):
    try:
        with open(os.path.join(partition_dir(cluster, nid, topic, partition), "log-start-offset")) as f:
            return int(f.read().strip())
    except FileNotFoundError:
        return None


def delete(admin, topic, partition, offset):
    """(low watermark, None) or (None, KafkaError)."""
    fut = admin.delete_records([TopicPartition(topic, partition, offset)], operation_timeout=20)
    try:
        return list(fut.values())[0].result(30).low_watermark, None
    except ck.KafkaException as e:
        return None, e.args[0]


def watermarks(cluster, topic, partition):
    c = ck.Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "wm"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
    finally:
        c.close()


def first_offsets(cluster, topic, partition, start, n=3):
    """The first n offsets a consumer assigned at `start` gets (auto.offset.reset=earliest)."""
    c = ck.Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"read-{start}",
                     "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, partition, start)])
    got = []
    try:
        def poll():
            m = c.poll(0.5)
            if m is not None and not m.error():
                got.append(m.offset())
            return len(got) >= n
        assert wait_for(f"{n} records from {topic}-{partition}", 30, poll)
    finally:
        c.close()
    return got[:n]


def test_records_below_the_new_start_are_gone_everywhere(make_cluster):
    cluster = make_cluster(3, FAST)
    # Small segments, so that deleting records deletes whole segments too.
    cluster.create_topic("trim", partitions=2, rf=3, configs={"segment.bytes": "2048"})
    cluster.wait_topic("trim", 2)
    p = ck.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 0})
    for i in range(100):
        p.produce("trim", value=b"x" * 100, partition=0)
        p.flush(30)  # one batch per record: many small segments
    for i in range(50):
        p.produce("trim", value=b"y", partition=1)
    assert p.flush(30) == 0
    leader = cluster.leaders("trim")[0]
    segments_before = len(glob.glob(os.path.join(partition_dir(cluster, leader, "trim", 0), "*.log")))
    assert segments_before > 3

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    assert delete(admin, "trim", 0, 40) == (40, None)
    assert delete(admin, "trim", 1, -1) == (50, None)  # -1: up to the high watermark
    assert watermarks(cluster, "trim", 0) == (40, 100)
    assert watermarks(cluster, "trim", 1) == (50, 50)
    # Deleting below the current start changes nothing.
    assert delete(admin, "trim", 0, 10) == (40, None)

    # A consumer from the beginning starts at 40; one asking for 10 is out of range
    # and resets to the earliest offset, 40.
    assert first_offsets(cluster, "trim", 0, ck.OFFSET_BEGINNING) == [40, 41, 42]
    assert first_offsets(cluster, "trim", 0, 10) == [40, 41, 42]
    # Segments wholly below 40 are deleted on the leader.
    segments_after = len(glob.glob(os.path.join(partition_dir(cluster, leader, "trim", 0), "*.log")))
    assert segments_after < segments_before, (segments_before, segments_after)

    # Every replica moves its own start (from its next fetch) and keeps it on disk.
    assert wait_for("every replica at log start 40", 30,
                    lambda: all(log_start_file(cluster, n, "trim", 0) == 40 for n in (1, 2, 3)))

    # The leader dies: the new leader starts at 40 too. The old one comes back with it.
    cluster.kill(leader)
    via = next(n for n in (1, 2, 3) if n != leader)
    assert wait_for("a new leader", 30, lambda: cluster.leaders("trim", via=via)[0] not in (None, leader))
    assert wait_for("the new leader answers", 30, lambda: _low(cluster, "trim", 0) == 40)
    cluster.launch(leader)
    cluster.wait_active(3)
    assert log_start_file(cluster, leader, "trim", 0) == 40
    assert first_offsets(cluster, "trim", 0, ck.OFFSET_BEGINNING) == [40, 41, 42]


def _low(cluster, topic, partition):
    try:
        return watermarks(cluster, topic, partition)[0]
    except ck.KafkaException:
        return None


def test_bad_requests_get_kafkas_errors(make_cluster):
    cluster = make_cluster(1)
    cluster.create_topic("t", partitions=1, rf=1)
    cluster.wait_topic("t", 1)
    p = ck.Producer({"bootstrap.servers": cluster.bootstrap})
    for _ in range(5):
        p.produce("t", value=b"v")
    assert p.flush(30) == 0
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    low, err = delete(admin, "t", 0, 6)  # past the high watermark (5)
    assert low is None and err.code() == ck.KafkaError.OFFSET_OUT_OF_RANGE, err
    # librdkafka refuses unknown partitions itself; the broker's own answer, by hand.
    assert raw_delete(cluster, "t", 3, 1) == (3, -1, 3)  # UNKNOWN_TOPIC_OR_PARTITION
    assert raw_delete(cluster, "missing", 0, 1) == (0, -1, 3)
    assert raw_delete(cluster, "t", 0, -5) == (0, -1, 1)  # OFFSET_OUT_OF_RANGE
    assert raw_delete(cluster, "t", 0, 2) == (0, 2, 0)
    assert watermarks(cluster, "t", 0) == (2, 5)
