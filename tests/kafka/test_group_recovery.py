"""Group state lives in __consumer_offsets: after SIGKILL and restart of the only
broker, the coordinator reads its partition back and the group, its generation and
its committed offsets are all there; a member of the stored generation that never
comes back is expired by its session timeout."""
import time

import pytest
from confluent_kafka import Consumer, TopicPartition

import clients
import harness

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


def group_view(c, group):
    status, body = c.get(1, f"/v1/groups/{group}")
    return body if status == 200 else None


@pytest.mark.timeout(240)
def test_groups_and_offsets_survive_a_restart(make_cluster):
    c = make_cluster(1, settings=SETTINGS)
    c.create_topic(TOPIC, partitions=4)
    c.wait_topic(TOPIC, 4)
    clients.produce_confluent(c.bootstrap, TOPIC, clients.make_records(400, 4))

    # An empty group with committed offsets (its member left) ...
    k = consumer(c, "left")
    k.subscribe([TOPIC])
    consume_n(k, 150)
    k.commit(asynchronous=False)
    committed = {tp.partition: tp.offset for tp in k.committed([TopicPartition(TOPIC, p) for p in range(4)],
                                                                 timeout=10)}
    k.close()
    harness.wait_for("group `left` empty", 30, lambda: (group_view(c, "left") or {}).get("state") == "Empty")

    # ... and a stable group whose member is still there when the broker dies.
    s = consumer(c, "stayed")
    s.subscribe([TOPIC])
    consume_n(s, 10)
    s.commit(asynchronous=False)
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
