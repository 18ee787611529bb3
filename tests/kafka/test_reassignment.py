"""Partition reassignment (KIP-455) on real 4-node clusters: every partition of a topic
moves under an idempotent acks=all producer, also with the leader, an adding replica or
the controller killed mid-move, and nothing acknowledged is lost or duplicated; a
cancelled move returns the original replicas; bad targets get clear errors; Kafka's
AlterPartitionReassignments and ListPartitionReassignments work by hand."""
import json
import os
import signal
import subprocess
import threading
import time

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient, NewTopic
import pytest

import wire
from harness import FAST, strom_bin, wait_for

NODES = 4
# Moves here are the tests' own: the balancer (which would spread the replicas these
# tests pile on brokers 1-3 onto broker 4) stays off.
MANUAL = FAST + ("balancer.mode=off",)


def reassign(cluster, topic, partition, replicas, via=1):
    return cluster.send(via, "POST", f"/v1/partitions/{topic}/{partition}/reassign", {"replicas": replicas})


def strom_cli(cluster, *args):
    """Runs `strom ARGS` against node 1's admin API; its standard output."""
    out = subprocess.run([strom_bin(), *args, "--admin-url", f"http://{cluster.node(1).admin}"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout


def partitions(cluster, topic, via=1):
    t = cluster.topic(topic, via=via)
    return {p["partition"]: p for p in t["partitions"]} if t else {}


def wait_moved(cluster, topic, targets, timeout=60, via=None):
    """Waits until every partition's replicas are its target and nothing is reassigning."""
    def done():
        nid = via or cluster.running()[0]
        ps = partitions(cluster, topic, via=nid)
        status, running = cluster.get(nid, "/v1/reassignments", timeout=5)
        moved = (status == 200 and not [r for r in running if r["topic"] == topic]
                 and all(ps.get(i, {}).get("replicas") == t and ps[i]["reassignment"] is None
                         and sorted(ps[i]["isr"]) == sorted(t) for i, t in targets.items()))
        # Raised, so that a time-out names what was seen last.
        assert moved, {i: (p["replicas"], p["isr"], p["reassignment"]) for i, p in ps.items()}
        return moved
    wait_for(f"{topic} moved to {targets}", timeout, done, interval=0.2)


class Load:
    """An idempotent acks=all producer in a thread, writing keyed records round-robin
    over the partitions and recording each acknowledged (partition, offset, value)."""

    def __init__(self, cluster, topic, partition_count):
        self.acked = []
        self.errors = []
        self.stop = threading.Event()
        self.p = ck.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True,
                              "linger.ms": 5, "message.timeout.ms": 120000, "socket.timeout.ms": 10000,
                              "log_level": 0})
        self.topic, self.partition_count = topic, partition_count
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        i = 0
        while not self.stop.is_set() and i < 200_000:
            value = b"r-%08d" % i
            try:
                self.p.produce(self.topic, value=value, partition=i % self.partition_count, on_delivery=self.done)
                i += 1
            except BufferError:
                self.p.poll(0.05)
            if i % 50 == 0:
                self.p.poll(0.002)

    def done(self, err, msg):
        if err:
            self.errors.append(err)
        else:
            self.acked.append((msg.partition(), msg.offset(), msg.value()))

    def finish(self):
        self.stop.set()
        self.thread.join(timeout=30)
        left = self.p.flush(120)
        assert left == 0, f"{left} records undelivered"
        return self.acked


def read_back(cluster, topic, partition_count, expect, timeout=90):
    c = ck.Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "reassignment-tests",
                     "enable.auto.commit": False, "fetch.wait.max.ms": 100, "log_level": 0})
    c.assign([ck.TopicPartition(topic, p, 0) for p in range(partition_count)])
    got = {p: [] for p in range(partition_count)}
    deadline = time.monotonic() + timeout
    try:
        while sum(map(len, got.values())) < expect and time.monotonic() < deadline:
            for m in c.consume(num_messages=1000, timeout=0.5):
                if not m.error():
                    got[m.partition()].append((m.offset(), m.value()))
    finally:
        c.close()
    return got


def assert_every_ack_once_in_order(acked, got):
    """Every acknowledged record is stored exactly once, and each partition holds its
    records in production order. Checked by value: librdkafka's idempotent producer
    acknowledges a batch whose answer it lost, once a later batch of the same producer
    succeeds, without an offset."""
    by_partition = {}
    for p, offset, value in acked:
        by_partition.setdefault(p, []).append((offset, value))
    for p, records in by_partition.items():
        offsets = [o for o, _ in got[p]]
        assert len(set(offsets)) == len(offsets), f"partition {p}: an offset read twice"
        stored = [v for _, v in sorted(got[p])]
        assert len(set(stored)) == len(stored), f"partition {p}: a record stored twice"
        assert stored == sorted(stored), f"partition {p}: records stored out of production order"
        read = dict(got[p])
        present = set(stored)
        for offset, value in records:
            assert value in present, f"partition {p}: acknowledged record {value!r} is missing"
            if offset is not None:
                assert read.get(offset) == value, f"partition {p}: offset {offset} reads {read.get(offset)!r}"


def setup_on_first_three(cluster, topic, count):
    """A topic whose every partition is on brokers 1, 2, 3 (moved there first)."""
    cluster.create_topic(topic, partitions=count, rf=3, configs={"min.insync.replicas": "2"})
    cluster.wait_topic(topic, count)
    for i, p in partitions(cluster, topic).items():
        if p["replicas"] != [1, 2, 3]:
            status, body = reassign(cluster, topic, i, [1, 2, 3])
            assert status == 202, body
    wait_moved(cluster, topic, {i: [1, 2, 3] for i in range(count)})


@pytest.mark.parametrize("kill", ["none", "leader", "adding", "controller"])
def test_every_partition_moves_under_load_and_nothing_acknowledged_is_lost(make_cluster, kill):
    cluster = make_cluster(NODES, MANUAL)
    topic, count = f"move-{kill}", 4
    setup_on_first_three(cluster, topic, count)
    load = Load(cluster, topic, count)
    wait_for("records flowing", 30, lambda: len(load.acked) > 500)
    if kill != "none":
        # The adding replica cannot catch up until it resumes: the kill lands mid-move.
        cluster.signal(4, signal.SIGSTOP)
    targets = {i: [2, 3, 4] if i % 2 == 0 else [4, 3, 2] for i in range(count)}
    for i, t in targets.items():
        status, body = reassign(cluster, topic, i, t)
        assert status == 202, body
        assert body["reassignment"]["adding"] == [4] and body["reassignment"]["removing"] == [1], body
    if kill != "none":
        running = cluster.get(1, "/v1/reassignments")[1]
        assert len([r for r in running if r["topic"] == topic]) == count, running
        if kill == "adding":
            cluster.kill(4)
            cluster.launch(4)
        else:
            if kill == "leader":
                victim = partitions(cluster, topic)[0]["leader"]
            else:
                victim = cluster.cluster_view(1)["controller_id"]
            cluster.kill(victim)
            cluster.signal(4, signal.SIGCONT)
            survivor = next(n for n in (1, 2, 3) if n != victim)
            wait_for(f"node {victim} fenced", 30, lambda: any(
                b["id"] == victim and b["state"] != "active" for b in cluster.cluster_view(survivor)["brokers"]))
            cluster.launch(victim)
        cluster.wait_active(timeout=60)
    wait_moved(cluster, topic, targets, timeout=90)
    before = len(load.acked)
    wait_for("records flowing after the move", 30, lambda: len(load.acked) > before + 200)
    acked = load.finish()
    assert not load.errors, load.errors[:3]
    got = read_back(cluster, topic, count, len(acked))
    assert_every_ack_once_in_order(acked, got)
    # Broker 1 left every replica set: its logs of the topic are gone.
    logs = os.path.join(cluster.node(1).data_dir, "logs")
    wait_for("broker 1's logs of the topic deleted", 30,
             lambda: not [d for d in os.listdir(logs) if d.startswith(topic + "-")])


def test_cancel_mid_move_returns_the_original_replicas(make_cluster):
    cluster = make_cluster(NODES, MANUAL)
    topic = "cancel"
    setup_on_first_three(cluster, topic, 1)
    p = ck.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "log_level": 0})
    for i in range(1000):
        p.produce(topic, value=b"x" * 100)
    assert p.flush(30) == 0
    cluster.signal(4, signal.SIGSTOP)
    try:
        status, body = reassign(cluster, topic, 0, [1, 2, 4])
        assert status == 202, body
        assert body["replicas"] == [1, 2, 4, 3], body
        assert body["reassignment"]["target"] == [1, 2, 4] and body["reassignment"]["removing"] == [3], body
        assert body["reassignment"]["bytes_left"] > 100_000, "broker 4 has copied nothing yet"
        status, listed = cluster.get(2, "/v1/reassignments")
        assert status == 200 and [(r["topic"], r["partition"], r["adding"]) for r in listed] == [(topic, 0, [4])]
        assert listed[0]["bytes_left"] > 100_000, listed
        # The same through the CLI: a table, and JSON; then the cancel.
        table = strom_cli(cluster, "reassignments")
        assert "BYTES-LEFT" in table and topic in table, table
        assert [r["target"] for r in json.loads(strom_cli(cluster, "reassignments", "--json"))] == [[1, 2, 4]]
        body = json.loads(strom_cli(cluster, "partition", "cancel-reassignment", topic, "0", "--json"))
        assert body["replicas"] == [1, 2, 3] and body["reassignment"] is None, body
        assert sorted(body["isr"]) == [1, 2, 3]
        status, body = cluster.send(2, "DELETE", f"/v1/partitions/{topic}/0/reassign")
        assert (status, body["error"]) == (409, "NO_REASSIGNMENT_IN_PROGRESS"), body
    finally:
        cluster.signal(4, signal.SIGCONT)
    logs = os.path.join(cluster.node(4).data_dir, "logs")
    wait_for("broker 4 holds no replica of the topic", 30,
             lambda: not [d for d in os.listdir(logs) if d.startswith(topic + "-")] if os.path.isdir(logs) else True)
    assert partitions(cluster, topic)[0]["replicas"] == [1, 2, 3]


def test_bad_reassignments_are_refused_and_change_nothing(make_cluster):
    cluster = make_cluster(NODES, MANUAL)
    topic = "bad-moves"
    cluster.create_topic(topic, partitions=1, rf=2)
    before = cluster.wait_topic(topic, 1)["partitions"][0]
    for target, code in [([1, 9], "INVALID_REPLICA_ASSIGNMENT"), ([1, 1], "INVALID_REPLICA_ASSIGNMENT"),
                         ([], "INVALID_REPLICA_ASSIGNMENT")]:
        status, body = reassign(cluster, topic, 0, target)
        assert (status, body["error"]) == (400, code), (target, body)
        assert body["message"]
    status, body = reassign(cluster, topic, 5, [1, 2])
    assert (status, body["error"]) == (404, "UNKNOWN_TOPIC_OR_PARTITION"), body
    status, body = reassign(cluster, "no-such-topic", 0, [1, 2])
    assert (status, body["error"]) == (404, "UNKNOWN_TOPIC_OR_PARTITION"), body
    status, body = cluster.send(1, "POST", f"/v1/partitions/{topic}/0/reassign", {"brokers": [1]})
    assert (status, body["error"]) == (400, "INVALID_REQUEST"), body
    status, body = cluster.send(1, "DELETE", f"/v1/partitions/{topic}/0/reassign")
    assert (status, body["error"]) == (409, "NO_REASSIGNMENT_IN_PROGRESS"), body
    after = partitions(cluster, topic)[0]
    assert (after["replicas"], after["partition_epoch"]) == (before["replicas"], before["partition_epoch"])


# ---- Kafka's APIs by hand (flexible versions: compact strings and arrays) -----------------

API_ALTER_REASSIGNMENTS, API_LIST_REASSIGNMENTS = 45, 46


def alter_reassignments(addr, topic, moves):
    """AlterPartitionReassignments v0: moves = {partition: [ids] or None (cancel)};
    {partition: (error code, message)}."""
    parts = []
    for i, replicas in moves.items():
        encoded = wire.uvarint(0) if replicas is None else wire.carray([wire.i32(b) for b in replicas])
        parts.append(wire.i32(i) + encoded + wire.NO_TAGS)
    body = wire.i32(30000) + wire.carray([wire.cstring(topic) + wire.carray(parts) + wire.NO_TAGS]) + wire.NO_TAGS
    r = wire.roundtrip(addr, API_ALTER_REASSIGNMENTS, 0, body, flexible=True, timeout=30)
    r.i32()  # throttle
    assert r.i16() == 0
    r.cstring()
    out = {}
    for _ in range(r.carray_len()):
        assert r.cstring() == topic
        for _ in range(r.carray_len()):
            i, code, message = r.i32(), r.i16(), r.cstring()
            r.skip_tags()
            out[i] = (code, message)
        r.skip_tags()
    return out


def list_reassignments(addr):
    """ListPartitionReassignments v0 of every topic: {(topic, partition): (replicas, adding, removing)}."""
    body = wire.i32(30000) + wire.uvarint(0) + wire.NO_TAGS
    r = wire.roundtrip(addr, API_LIST_REASSIGNMENTS, 0, body, flexible=True)
    r.i32()  # throttle
    assert r.i16() == 0
    r.cstring()
    out = {}
    for _ in range(r.carray_len()):
        name = r.cstring()
        for _ in range(r.carray_len()):
            i = r.i32()
            lists = [[r.i32() for _ in range(r.carray_len())] for _ in range(3)]
            r.skip_tags()
            out[(name, i)] = tuple(lists)
        r.skip_tags()
    return out


def test_kafka_reassignment_apis_by_hand(make_cluster):
    cluster = make_cluster(NODES, MANUAL)
    topic = "kafka-api-moves"
    setup_on_first_three(cluster, topic, 2)
    addr = cluster.node(2).kafka_addr
    versions = wire.api_versions(addr)
    assert versions[API_ALTER_REASSIGNMENTS] == (0, 1) and versions[API_LIST_REASSIGNMENTS] == (0, 0)
    cluster.signal(4, signal.SIGSTOP)
    try:
        got = alter_reassignments(addr, topic, {0: [4, 2, 3], 1: [1, 9, 3]})
        assert got[0] == (0, None), got
        assert got[1][0] == 39, got  # INVALID_REPLICA_ASSIGNMENT
        assert list_reassignments(addr) == {(topic, 0): ([4, 2, 3, 1], [4], [1])}
        assert alter_reassignments(addr, topic, {0: None}) == {0: (0, None)}
        assert list_reassignments(addr) == {}
        code, message = alter_reassignments(addr, topic, {0: None})[0]
        assert code == 85 and message, message  # NO_REASSIGNMENT_IN_PROGRESS
    finally:
        cluster.signal(4, signal.SIGCONT)
    got = alter_reassignments(addr, topic, {1: [4, 2, 3]})
    assert got == {1: (0, None)}
    # As in Kafka, a cancelled move keeps the replica order of the move: the
    # target's first, then the originals that were leaving.
    wait_moved(cluster, topic, {0: [2, 3, 1], 1: [4, 2, 3]})


def test_throttled_move_waits_for_the_rate_and_speeds_up_when_lifted(make_cluster):
    """leader.replication.throttled.rate (dynamic, through PATCH /v1/brokers/configs)
    bounds the catch-up traffic of an adding replica: at 1 MB/s a 20 MB partition still
    has most of its bytes left after 3 s; lifting the throttle (null) lets the move
    finish. ISR replication is not throttled: acks=all writes go on meanwhile."""
    cluster = make_cluster(NODES, MANUAL)
    topic = "throttled"
    setup_on_first_three(cluster, topic, 1)
    p = ck.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 20, "log_level": 0})
    for i in range(20_000):
        while True:
            try:
                p.produce(topic, value=b"t" * 1000)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0
    status, configs = cluster.send(2, "PATCH", "/v1/brokers/configs", {"leader.replication.throttled.rate": "1000000"})
    assert status == 200 and configs["leader.replication.throttled.rate"] == "1000000", configs
    status, body = cluster.send(1, "PATCH", "/v1/brokers/configs", {"replica.lag.time.max.ms": "5"})
    assert (status, body["error"]) == (400, "INVALID_REQUEST"), body
    status, body = reassign(cluster, topic, 0, [1, 2, 4])
    assert status == 202, body
    started = time.monotonic()
    acked = []
    for i in range(100):
        p.produce(topic, value=b"during-%d" % i, on_delivery=lambda e, m: acked.append(e))
    assert p.flush(30) == 0 and acked == [None] * 100, "ISR writes are not throttled"
    while time.monotonic() - started < 3:
        time.sleep(0.1)
    [row] = cluster.get(1, "/v1/reassignments")[1]
    assert row["bytes_left"] > 10_000_000, f"at 1 MB/s, {row['bytes_left']} bytes left after 3 s"
    status, configs = cluster.send(3, "PATCH", "/v1/brokers/configs", {"leader.replication.throttled.rate": None})
    assert status == 200 and configs["leader.replication.throttled.rate"] == "9223372036854775807", configs
    wait_moved(cluster, topic, {0: [1, 2, 4]}, timeout=60)


def test_a_produce_waiting_on_a_removed_leader_is_answered_at_once(make_cluster):
    """An acks=all produce waiting on a leader that a move takes out of the replicas gets
    NOT_LEADER_OR_FOLLOWER when the move completes, not its whole request timeout (it used
    to wait the 30 s out, and every later request on the connection behind it)."""
    cluster = make_cluster(4, MANUAL)
    cluster.create_topic("leaving", partitions=1, rf=2)
    cluster.wait_topic("leaving", 1)
    leader, follower = cluster.topic("leaving")["partitions"][0]["replicas"]
    controller = cluster.wait_active()
    if follower == controller:
        # The follower is paused below: were it the controller, the move would wait for a
        # new one (the request to start it gave up after 5 s, about 1 run in 2). Move that
        # replica elsewhere first.
        follower = next(b for b in (1, 2, 3, 4) if b not in (leader, controller))
        status, body = cluster.send(leader, "POST", "/v1/partitions/leaving/0/reassign",
                                    {"replicas": [leader, follower]})
        assert status == 202, body

        def moved():
            p = cluster.topic("leaving")["partitions"][0]
            return p["replicas"] == [leader, follower] and p["reassignment"] is None and p["leader"] == leader
        wait_for("the follower moved off the controller", 30, moved)
    target = [b for b in (1, 2, 3, 4) if b not in (leader, follower)]
    result = {}
    # The follower is paused: the high watermark cannot pass the record, so the produce waits.
    cluster.signal(follower, signal.SIGSTOP)
    try:
        def produce():
            started = time.monotonic()
            result["answer"] = wire.produce(cluster.node(leader).kafka_addr, "leaving", 0,
                                            wire.record_batch([(b"k", b"v")]), acks=-1, timeout_ms=30000)
            result["took"] = time.monotonic() - started
        thread = threading.Thread(target=produce)
        thread.start()

        def pending():
            p = cluster.topic("leaving", via=leader)["partitions"][0]
            return p["log_end_offset"] is not None and p["log_end_offset"] > p["high_watermark"]
        wait_for("the produce appended and waiting for the high watermark", 10, pending)
        status, body = cluster.send(target[0], "POST", "/v1/partitions/leaving/0/reassign", {"replicas": target})
        assert status == 202, body
        thread.join(40)
        assert not thread.is_alive()
    finally:
        cluster.signal(follower, signal.SIGCONT)
    err, _ = result["answer"]
    assert err == 6, result  # NOT_LEADER_OR_FOLLOWER: the client retries on the new leader
    assert result["took"] < 10, result
    assert cluster.topic("leaving", via=target[0])["partitions"][0]["replicas"] == target


def test_a_replica_moved_away_and_straight_back_copies_the_log_again(make_cluster):
    """Broker 3 is moved off a partition (it deletes its copy) and straight back on. Its
    follower long-poll, sent before the first move with the old log end and still waiting
    at the leader (`replica.fetch.wait.max.ms` is long here to hold it open), must not
    count as its position: that let broker 3 join the ISR with an empty log within
    milliseconds (bench/reassign_bench.py saw it in 2 runs of 3). The move back copies at
    the throttle's pace instead, and broker 3 ends with the whole log."""
    cluster = make_cluster(NODES, MANUAL + ("replica.fetch.wait.max.ms=10000",))
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    # Both led by broker 1 and followed by broker 3: 3's fetcher for leader 1 (and its
    # waiting long-poll) lives on through the moves thanks to "anchor".
    futures = admin.create_topics([NewTopic(t, num_partitions=1, replica_assignment=[[1, 2, 3]]) for t in ("back", "anchor")])
    for f in futures.values():
        f.result(30)
    cluster.wait_topic("back", 1)
    cluster.wait_topic("anchor", 1)
    p = ck.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 20, "log_level": 0})
    for i in range(2_000):
        while True:
            try:
                p.produce("back", value=b"%06d" % i + b"b" * 994)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0
    wait_for("broker 3 in the ISR", 30, lambda: 3 in partitions(cluster, "back")[0]["isr"])
    status, body = reassign(cluster, "back", 0, [1, 2, 4])
    assert status == 202, body
    wait_moved(cluster, "back", {0: [1, 2, 4]})
    copy = os.path.join(cluster.node(3).data_dir, "logs", "back-0")
    wait_for("broker 3 to delete its copy", 30, lambda: not os.path.exists(copy))
    status, _ = cluster.send(1, "PATCH", "/v1/brokers/configs", {"leader.replication.throttled.rate": "200000"})
    assert status == 200
    status, body = reassign(cluster, "back", 0, [1, 2, 3])
    assert status == 202, body
    started = time.monotonic()
    while time.monotonic() - started < 3:
        time.sleep(0.1)
    # At 200 kB/s, 2 MB takes about 10 s: most of it is still to come.
    [row] = [r for r in cluster.get(1, "/v1/reassignments")[1] if r["topic"] == "back"]
    assert row["bytes_left"] > 1_000_000, row
    assert 3 not in partitions(cluster, "back")[0]["isr"]
    status, _ = cluster.send(1, "PATCH", "/v1/brokers/configs", {"leader.replication.throttled.rate": None})
    assert status == 200
    wait_moved(cluster, "back", {0: [1, 2, 3]})
    leader_files = os.path.join(cluster.node(1).data_dir, "logs", "back-0")

    def log_bytes(d):
        return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".log"))
    wait_for("broker 3's copy as long as the leader's", 30, lambda: log_bytes(copy) == log_bytes(leader_files))


def test_a_replica_far_behind_catches_up_to_the_leaders_bytes_under_load_and_a_kill(make_cluster):
    """Broker 4 is added to a partition holding 40 MB of 100 kB records while an acks=all
    producer keeps writing to it. Far behind, it appends each large answer while its next
    fetch is already out (src/replication/fetcher.rs, AppendAhead). SIGKILLed a third of the
    way (a throttle holds the copy back until then) and started again, it catches up: its log then holds the leader's batches byte for byte,
    and every acknowledged record reads back once, in order."""
    cluster = make_cluster(NODES, MANUAL)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    futures = admin.create_topics([NewTopic("far", num_partitions=1, replica_assignment=[[1, 2, 3]],
                                            config={"min.insync.replicas": "2"})])
    for f in futures.values():
        f.result(30)
    cluster.wait_topic("far", 1)
    big = ck.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 20, "log_level": 0,
                       "batch.size": 1_000_000})
    value = os.urandom(100_000)
    for _ in range(400):
        while True:
            try:
                big.produce("far", value=value, partition=0)
                break
            except BufferError:
                big.poll(0.05)
    assert big.flush(120) == 0
    load = Load(cluster, "far", 1)
    wait_for("records flowing", 30, lambda: len(load.acked) > 500)
    # 10 MB/s after a first 10 MB: the kill below lands with most of the log to come.
    status, _ = cluster.send(1, "PATCH", "/v1/brokers/configs", {"leader.replication.throttled.rate": "10000000"})
    assert status == 200
    status, body = reassign(cluster, "far", 0, [1, 2, 4])
    assert status == 202, body
    copy = os.path.join(cluster.node(4).data_dir, "logs", "far-0")
    leader_copy = os.path.join(cluster.node(1).data_dir, "logs", "far-0")

    def segments(d):
        try:
            return sorted(f for f in os.listdir(d) if f.endswith(".log"))
        except FileNotFoundError:
            return []

    def log_bytes(d):
        return sum(os.path.getsize(os.path.join(d, f)) for f in segments(d))
    wait_for("broker 4 a third of the way", 60, lambda: log_bytes(copy) > 13_000_000, interval=0.05)
    cluster.kill(4)
    assert 4 not in partitions(cluster, "far")[0]["isr"]
    cluster.launch(4)
    cluster.wait_active(timeout=60)
    status, _ = cluster.send(1, "PATCH", "/v1/brokers/configs", {"leader.replication.throttled.rate": None})
    assert status == 200
    wait_moved(cluster, "far", {0: [1, 2, 4]}, timeout=180)
    before = len(load.acked)
    wait_for("records flowing after the move", 30, lambda: len(load.acked) > before + 200)
    acked = load.finish()
    assert not load.errors, load.errors[:3]
    wait_for("broker 4's log as long as the leader's", 60, lambda: log_bytes(copy) == log_bytes(leader_copy))

    def contents(d):
        out = bytearray()
        for f in segments(d):
            with open(os.path.join(d, f), "rb") as fh:
                out += fh.read()
        return bytes(out)
    mine, leaders = contents(copy), contents(leader_copy)
    assert len(mine) > 40_000_000
    assert mine == leaders, "broker 4's log differs from the leader's"
    got = read_back(cluster, "far", 1, len(acked) + 400)
    small = {0: [(o, v) for o, v in got[0] if len(v) < 100_000]}
    assert sum(1 for _, v in got[0] if len(v) == 100_000) == 400
    assert_every_ack_once_in_order(acked, small)
