"""Group state lives in __consumer_offsets: after SIGKILL and restart of the only
broker, the coordinator reads its partition back and the group, its generation and
its committed offsets are all there; a member of the stored generation that never
comes back is expired by its session timeout."""
import os
import time

import pytest
from confluent_kafka import Consumer, TopicPartition

import clients
import harness
import wire

SETTINGS = ("group.initial.rebalance.delay.ms=0", "offsets.topic.num.partitions=3",
            "group.min.session.timeout.ms=1000")
TOPIC = "recover-me"


def consumer(c, group, **conf):
    return Consumer({"bootstrap.servers": c.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                     "enable.auto.commit": False, "session.timeout.ms": 3000, "heartbeat.interval.ms": 300,
                     **conf})


def consume_n(k, n, timeout=60):
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        m = k.poll(0.2)
        if m is not None and not m.error():
            got.append((m.partition(), m.offset()))
    assert len(got) >= n, f"consumed {len(got)} of {n}"
    return got


def cluster_with_records(make_cluster, partitions, records, extra=()):
    """A 1-node cluster with topic TOPIC of `partitions` holding `records` records."""
    c = make_cluster(1, settings=SETTINGS + tuple(extra))
    c.create_topic(TOPIC, partitions=partitions)
    c.wait_topic(TOPIC, partitions)
    clients.produce_confluent(c.bootstrap, TOPIC, clients.make_records(records, partitions))
    return c


def member_that_committed(c, group, n):
    """A subscribed member of `group` that consumed `n` records and committed them."""
    k = consumer(c, group)
    k.subscribe([TOPIC])
    consume_n(k, n)
    k.commit(asynchronous=False)
    return k


def group_view(c, group):
    status, body = c.get(1, f"/v1/groups/{group}")
    return body if status == 200 else None


@pytest.mark.timeout(240)
def test_groups_and_offsets_survive_a_restart(make_cluster):
    c = cluster_with_records(make_cluster, 4, 400)

    # An empty group with committed offsets (its member left) ...
    k = member_that_committed(c, "left", 150)
    committed = {tp.partition: tp.offset for tp in k.committed([TopicPartition(TOPIC, p) for p in range(4)],
                                                                 timeout=10)}
    k.close()
    harness.wait_for("group `left` empty", 30, lambda: (group_view(c, "left") or {}).get("state") == "Empty")

    # ... and a stable group whose member is still there when the broker dies.
    s = member_that_committed(c, "stayed", 10)
    before = harness.wait_for("group `stayed` stable", 30,
                              lambda: (v := group_view(c, "stayed")) and v["state"] == "Stable" and v)

    c.kill(1)
    c.launch(1)
    c.wait_ready()

    view = harness.wait_for("group `left` back", 30, lambda: group_view(c, "left"))
    assert view["state"] == "Empty"
    assert {o["partition"]: o["committed"] for o in view["offsets"]} == \
        {p: o for p, o in committed.items() if o >= 0}
    assert all(o["log_end_offset"] == 100 and o["lag"] == 100 - o["committed"] for o in view["offsets"])

    # The stored generation comes back Stable with its member, who never heartbeats again.
    stayed = harness.wait_for("group `stayed` back", 30, lambda: group_view(c, "stayed"))
    assert (stayed["state"], stayed["generation"]) == ("Stable", before["generation"])
    assert [m["member_id"] for m in stayed["members"]] == [m["member_id"] for m in before["members"]]
    s.close()  # its LeaveGroup goes to the new incarnation and removes it
    harness.wait_for("group `stayed` empty", 30, lambda: group_view(c, "stayed")["state"] == "Empty")

    # A new member of `left` resumes exactly at the committed offsets (100 per partition
    # were produced: a partition committed at 100 has nothing left to read).
    expected = {p: max(o, 0) for p, o in committed.items() if o < 100}
    k = consumer(c, "left")
    k.subscribe([TOPIC])
    first = {}
    deadline = time.monotonic() + 60
    while len(first) < len(expected) and time.monotonic() < deadline:
        m = k.poll(0.2)
        if m is not None and not m.error():
            first.setdefault(m.partition(), m.offset())
    k.close()
    assert first == expected


@pytest.mark.timeout(240)
def test_offsets_of_an_empty_group_expire_and_a_live_group_keeps_them(make_cluster):
    """offsets.retention.minutes=1 (the smallest Kafka allows), checked every second."""
    c = cluster_with_records(make_cluster, 1, 20, ("offsets.retention.minutes=1",
                                                   "offsets.retention.check.interval.ms=1000"))
    member_that_committed(c, "gone", 20).close()
    emptied = time.monotonic()

    kept = member_that_committed(c, "kept", 20)

    # The empty group's offsets go after a minute, and the group with them; the live
    # group (polling, so heartbeating) keeps its offsets however old they are.
    def gone_gone():
        kept.poll(0.1)
        return group_view(c, "gone") is None

    harness.wait_for("group `gone` expired", 120, gone_gone)
    assert time.monotonic() - emptied >= 58, "expired before offsets.retention.minutes"
    view = group_view(c, "kept")
    assert view["state"] == "Stable" and [o["committed"] for o in view["offsets"]] == [20]
    kept.close()
    assert any("expired committed offsets" in line for line in open(c.node(1).log))
    restarted = consumer(c, "gone")
    assert restarted.committed([TopicPartition(TOPIC, 0)], timeout=10)[0].offset < 0
    restarted.close()


@pytest.mark.timeout(240)
def test_consumer_offsets_is_compacted_and_reloads_the_same(make_cluster):
    """Small __consumer_offsets segments, the cleaner every 200 ms: a thousand commits of
    one partition leave a few records on disk, and a restart loads the last commit."""
    c = make_cluster(1, settings=SETTINGS + ("offsets.topic.segment.bytes=4096",
                                             "log.retention.check.interval.ms=200"))
    c.create_topic(TOPIC, partitions=1)
    c.wait_topic(TOPIC, 1)
    k = consumer(c, "busy")
    k.subscribe([TOPIC])
    harness.wait_for("an assignment", 60, lambda: k.poll(0.1) is None and k.assignment())
    for i in range(1, 1001):
        k.commit(offsets=[TopicPartition(TOPIC, 0, i)], asynchronous=False)
    part = wire.java_string_hash("busy")
    part = (abs(part) if part != -2**31 else 0) % 3
    pdir = f"{c.node(1).data_dir}/logs/__consumer_offsets-{part}"

    def on_disk():
        return sum(os.path.getsize(os.path.join(pdir, f)) for f in os.listdir(pdir) if f.endswith(".log"))

    # Each commit is a batch of about 120 bytes: uncompacted, well over 100 KB.
    harness.wait_for("__consumer_offsets compacted", 60, lambda: on_disk() < 40_000)
    assert any("compacted log segment" in line for line in open(c.node(1).log))
    k.close()
    c.kill(1)
    c.launch(1)
    c.wait_ready()
    view = harness.wait_for("group `busy` back", 30, lambda: group_view(c, "busy"))
    assert [o["committed"] for o in view["offsets"]] == [1000]
