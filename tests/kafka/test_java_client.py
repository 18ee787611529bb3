"""The reference Java client (kafka-clients 4.x, fetched by tests/setup_jvm.sh) against a
real cluster: an idempotent acks=all producer, and a consumer group whose members fetch
through incremental fetch sessions (KIP-227) and get every record exactly once, also
across a leader's SIGKILL."""
import os
import subprocess
import tempfile
import uuid

import pytest

import harness
import jvm
import wire
from test_fetch_sessions import session_metrics, sessions_opened

SOURCE = os.path.join(jvm.REPO, "tests", "jvm", "StromClient.java")


@pytest.fixture(scope="module")
def java():
    jvm.require()


def run_java(java, *args, jvm_args=(), timeout=180):
    """Runs StromClient.java with args; returns its stdout lines as (partition, offset, value)."""
    p = subprocess.run(jvm.command(SOURCE, *args, jvm_args=jvm_args), capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, f"{args[0]} exited {p.returncode}:\n{p.stderr[-4000:]}"
    rows = []
    for line in p.stdout.splitlines():
        partition, offset, value = line.split(" ", 2)
        rows.append((int(partition), int(offset), value))
    return rows


def check_exactly_once(produced, consumed, count):
    assert sorted(v for _, _, v in produced) == sorted(f"v-{i}" for i in range(count))
    assert sorted(v for _, _, v in consumed) == sorted(v for _, _, v in produced), "every record once"
    by_partition = {}
    for partition, offset, _ in consumed:
        by_partition.setdefault(partition, []).append(offset)
    for partition, offsets in by_partition.items():
        assert offsets == sorted(offsets), f"partition {partition} out of order"
    assert {(p, o) for p, o, _ in produced} == {(p, o) for p, o, _ in consumed}, "same partitions and offsets"


def test_java_producer_and_group_consumer(java, cluster3):
    c = cluster3
    topic = f"java-{uuid.uuid4().hex[:8]}"
    c.create_topic(topic, partitions=6, rf=3, configs={"min.insync.replicas": "2"})
    c.wait_topic(topic, 6)
    produced = run_java(java, "produce", c.bootstrap, topic, "3000")
    assert len(produced) == 3000
    opened = sum(sessions_opened(c, nid) for nid in c.running())
    consumed = run_java(java, "consume", c.bootstrap, topic, f"g-{topic}", "3000", "120")
    check_exactly_once(produced, consumed, 3000)
    # The consumer fetched through a session on each leader, and closed them as it left.
    leaders = set(c.leaders(topic).values())
    assert sum(sessions_opened(c, nid) for nid in c.running()) - opened >= len(leaders)
    harness.wait_for("the consumer's sessions to be closed", 10,
                     lambda: sum(session_metrics(c, nid)[0] for nid in c.running()) == 0)


def test_java_consumer_across_a_leader_kill(java, make_cluster):
    """A consumer reads half, a partition leader is killed, the rest is produced to the new
    leaders, and the same consumer (its session on the dead broker gone) reads it."""
    c = make_cluster(3, settings=harness.FAST)
    topic = f"java-kill-{uuid.uuid4().hex[:8]}"
    c.create_topic(topic, partitions=3, rf=3, configs={"min.insync.replicas": "2"})
    c.wait_topic(topic, 3)
    produced = run_java(java, "produce", c.bootstrap, topic, "1000")
    # The victim leads a partition but is not the group's coordinator: the group stays as it
    # is (a coordinator's death could make the member rejoin and, with nothing committed yet,
    # read again from the start, which is Kafka's at-least-once and not what this checks).
    group = f"g-{topic}"

    def find():
        err, node, _, _ = wire.find_coordinator(c.node(1).kafka_addr, group)
        return node if err == 0 else None

    coordinator = harness.wait_for("the group's coordinator", 30, find)
    victim = next(leader for _, leader in sorted(c.leaders(topic).items()) if leader != coordinator)
    cmd = jvm.command(SOURCE, "consume", c.bootstrap, topic, group, "2000", "150")
    errors = tempfile.TemporaryFile(mode="w+")
    consumer = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errors, text=True)

    def stderr_tail():
        errors.seek(0)
        return errors.read()[-4000:]

    try:
        consumed = []
        while len(consumed) < 1000:
            line = consumer.stdout.readline()
            assert line, f"consumer ended early:\n{stderr_tail()}"
            partition, offset, value = line.rstrip("\n").split(" ", 2)
            consumed.append((int(partition), int(offset), value))
        c.kill(victim)
        survivor = next(n for n in (1, 2, 3) if n != victim)
        harness.wait_for("every partition led by a live broker", 30,
                         lambda: all(l not in (None, victim) for l in c.leaders(topic, via=survivor).values()))
        bootstrap = ",".join(c.node(n).kafka for n in c.running())
        produced += run_java(java, "produce", bootstrap, topic, "1000", jvm_args=["-Dstrom.first=1000"])
        out, _ = consumer.communicate(timeout=150)
        assert consumer.returncode == 0, f"consumer exited {consumer.returncode}:\n{stderr_tail()}"
        for line in out.splitlines():
            partition, offset, value = line.split(" ", 2)
            consumed.append((int(partition), int(offset), value))
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.wait()
        errors.close()
    check_exactly_once(produced, consumed, 2000)


def test_java_consumer_protocol_group_after_a_classic_one(java, cluster3):
    """The Java client with group.protocol=consumer (KIP-848, the broker's range assignor):
    a classic member reads half and commits, leaves, and a consumer-protocol member of the
    same group (now empty, so it becomes a consumer group) reads exactly the other half from
    the committed offsets (Kafka's offline migration)."""
    c = cluster3
    topic = f"java-kip848-{uuid.uuid4().hex[:8]}"
    group = f"g-{topic}"
    c.create_topic(topic, partitions=4, rf=3)
    c.wait_topic(topic, 4)
    produced = run_java(java, "produce", c.bootstrap, topic, "2000")
    first = run_java(java, "consume", c.bootstrap, topic, group, "1000", "120", "max.poll.records=100")
    # It may have fetched (and printed) past what it committed: what it committed is the
    # position after each partition's last record it printed.
    committed = {}
    for partition, offset, _ in first:
        committed[partition] = max(committed.get(partition, 0), offset + 1)
    rest = sum(1 for p, o, _ in produced if o >= committed.get(p, 0))
    second = run_java(java, "consume", c.bootstrap, topic, group, str(rest), "120",
                      "group.protocol=consumer", "group.remote.assignor=range")
    assert all(o >= committed.get(p, 0) for p, o, _ in second), "nothing below the committed offsets again"
    check_exactly_once(produced, first + second, 2000)
    view = harness.wait_for("the group's admin view", 20,
                            lambda: (lambda s_b: s_b[1] if s_b[0] == 200 else None)(c.get(1, f"/v1/groups/{group}")))
    assert (view["group_protocol"], view["assignor"]) == ("consumer", "range"), view


def test_java_classic_group_converts_online_to_the_consumer_protocol_and_back(java, cluster3):
    """KIP-848's online migration with the Java client: two classic members (its default
    assignors, range first, so they rebalance eagerly) share 6 partitions; a member with
    group.protocol=consumer joins the live group, which converts and splits 2/2/2 with the
    classic members still in it; it leaves, and the group is classic again, split 3/3. No
    partition is owned by two members at once, and every acknowledged record is consumed."""
    from test_consumer_protocol import Member, check_exclusive, consumer_view, wait_split
    from test_groups import Feeder
    c = cluster3
    topic = f"java-online-{uuid.uuid4().hex[:8]}"
    group = f"g-{topic}"
    c.create_topic(topic, partitions=6, rf=3)
    c.wait_topic(topic, 6)

    def member(*settings):
        argv = jvm.command(SOURCE, "member", c.bootstrap, topic, group, *settings)
        return Member(c, group, topic, argv=argv)

    classic = ("heartbeat.interval.ms=500", "session.timeout.ms=10000")
    members = []
    feeder = Feeder(c.bootstrap, topic, 6, "jonline", rate=200)
    try:
        members = [member(*classic), member(*classic)]
        wait_split(members, 6, [3, 3], timeout=90)
        feeder.start()
        harness.wait_for("records flowing", 30, lambda: feeder.count() >= 200)
        members.append(member("group.protocol=consumer", "group.remote.assignor=uniform"))
        wait_split(members, 6, [2, 2, 2], timeout=90)
        view = consumer_view(c, group, lambda v: v["group_protocol"] == "consumer" and len(v["members"]) == 3)
        assert sorted(m["member_type"] for m in view["members"]) == ["classic", "classic", "consumer"], view
        members[2].leave()
        wait_split(members[:2], 6, [3, 3], timeout=90)
        consumer_view(c, group, lambda v: v["group_protocol"] == "classic" and v["state"] == "Stable")
        acked = feeder.stop()
        harness.wait_for("every acknowledged record consumed", 60,
                         lambda: {v.decode() for v in acked} <= set().union(*(m.consumed() for m in members)))
        assert check_exclusive(members) >= 6
    finally:
        feeder.stop_event.set()
        for m in members:
            m.stop()
