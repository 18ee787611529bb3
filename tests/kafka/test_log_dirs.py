"""DescribeLogDirs (KIP-113/827) by hand, as `kafka-log-dirs --describe` sends
it: the broker's one log directory, every replica it holds with its size and
lag, a named subset, the file system's total and usable bytes (v4), and a
version the broker does not have refused."""
import confluent_kafka as ck
import pytest

import wire
from harness import FAST

API_DESCRIBE_LOG_DIRS = 35


def describe_v1(addr, topics=None):
    """DescribeLogDirs v1: [(error, dir, {topic: {partition: (size, lag)}})]."""
    if topics is None:
        body = wire.i32(-1)
    else:
        body = wire.i32(len(topics)) + b"".join(
            wire.string(t) + wire.i32(len(ps)) + b"".join(wire.i32(p) for p in ps) for t, ps in topics.items())
    r = wire.roundtrip(addr, API_DESCRIBE_LOG_DIRS, 1, body)
    r.i32()  # throttle
    out = []
    for _ in range(r.i32()):
        err, directory = r.i16(), r.string()
        found = {}
        for _ in range(r.i32()):
            name = found.setdefault(r.string(), {})
            for _ in range(r.i32()):
                index, size, lag, future = r.i32(), r.i64(), r.i64(), r.i8()
                assert future == 0
                name[index] = (size, lag)
        out.append((err, directory, found))
    return out


def describe_v4(addr):
    """DescribeLogDirs v4 (flexible) of every partition: (error, [(error, dir, total, usable)])."""
    r = wire.roundtrip(addr, API_DESCRIBE_LOG_DIRS, 4, wire.uvarint(0) + wire.uvarint(0), flexible=True)
    r.i32()  # throttle
    err = r.i16()
    dirs = []
    for _ in range(r.carray_len()):
        e, directory = r.i16(), r.cstring()
        for _ in range(r.carray_len()):
            r.cstring()
            for _ in range(r.carray_len()):
                r.i32(), r.i64(), r.i64(), r.i8()
                r.skip_tags()
            r.skip_tags()
        total, usable = r.i64(), r.i64()
        r.skip_tags()
        dirs.append((e, directory, total, usable))
    return err, dirs


def test_log_dirs_list_the_replicas_and_their_sizes(make_cluster):
    cluster = make_cluster(1, FAST)
    cluster.create_topic("ld", partitions=3, rf=1)
    cluster.create_topic("other", partitions=1, rf=1)
    cluster.wait_topic("ld", 3)
    cluster.wait_topic("other", 1)
    p = ck.Producer({"bootstrap.servers": cluster.bootstrap})
    for i in range(300):
        p.produce("ld", value=b"x" * 1000, partition=i % 2)
    assert p.flush(30) == 0
    addr = cluster.node(1).kafka_addr

    [(err, directory, topics)] = describe_v1(addr)
    assert err == 0 and directory.endswith("/logs"), directory
    assert sorted(topics["ld"]) == [0, 1, 2] and sorted(topics["other"]) == [0]
    assert topics["ld"][0][0] > 150_000 and topics["ld"][1][0] > 150_000, topics["ld"]
    assert topics["ld"][2] == (0, 0), "an empty replica, not behind"

    [(err, _, subset)] = describe_v1(addr, {"ld": [1], "nope": [0]})
    assert err == 0 and subset == {"ld": {1: topics["ld"][1]}}, subset

    err, dirs = describe_v4(addr)
    assert err == 0 and len(dirs) == 1, dirs
    _, _, total, usable = dirs[0]
    assert total > 0 and 0 <= usable <= total, dirs

    # v0 is not one Strom (or Kafka 4) has: the connection is closed, as Kafka closes it.
    with pytest.raises((OSError, ValueError)):
        wire.roundtrip(addr, API_DESCRIBE_LOG_DIRS, 0, wire.i32(-1))
    # The broker carries on.
    assert describe_v1(addr, {"other": [0]})[0][2] == {"other": {0: topics["other"][0]}}
