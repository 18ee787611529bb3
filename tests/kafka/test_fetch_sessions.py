"""Incremental fetch sessions (KIP-227): the protocol by hand (Fetch v11), kafka-python's
consumer (which opens sessions), and followers (which fetch through one session per leader)."""
import re
import time
import uuid

import clients
import harness
import wire

FETCH_SESSION_ID_NOT_FOUND = 70
INVALID_FETCH_SESSION_EPOCH = 71


def fetch_v11(addr, session_id, epoch, partitions, forget=(), max_wait_ms=100, topic=None):
    """Fetch v11 of `partitions` ({partition: offset}) of `topic`, forgetting `forget`
    (partitions of the same topic). Returns (error, session id, {partition: (error, hw, records)})."""
    body = (wire.i32(-1) + wire.i32(max_wait_ms) + wire.i32(1) + wire.i32(8 << 20) + wire.i8(0)
            + wire.i32(session_id) + wire.i32(epoch))
    if partitions:
        body += wire.i32(1) + wire.string(topic) + wire.i32(len(partitions))
        for p, offset in partitions.items():
            # partition, current leader epoch, fetch offset, log start offset, partition max bytes
            body += wire.i32(p) + wire.i32(-1) + wire.i64(offset) + wire.i64(-1) + wire.i32(1 << 20)
    else:
        body += wire.i32(0)
    if forget:
        body += wire.i32(1) + wire.string(topic) + wire.i32(len(forget)) + b"".join(wire.i32(p) for p in forget)
    else:
        body += wire.i32(0)
    body += wire.string("")  # rack id
    r = wire.roundtrip(addr, wire.API_FETCH, 11, body, timeout=15)
    r.i32()  # throttle
    err, sid = r.i16(), r.i32()
    out = {}
    for _ in range(r.i32()):
        name = r.string()
        for _ in range(r.i32()):
            p, perr, hw = r.i32(), r.i16(), r.i64()
            r.i64()  # last stable offset
            r.i64()  # log start offset
            for _ in range(max(r.i32(), 0)):
                r.i64()
                r.i64()
            r.i32()  # preferred read replica
            out[(name, p)] = (perr, hw, r.nbytes() or b"")
    return err, sid, out


def produce(addr, topic, partition, n=1):
    err, base = wire.produce(addr, topic, partition,
                             wire.record_batch([(None, b"v%d" % i) for i in range(n)], int(time.time() * 1000)))
    assert err == 0, f"produce to {topic}-{partition}: {wire.error_name(err)}"
    return base + n


def fetch_session_metrics(cluster, nid, kind="consumer"):
    """A node's fetch-session metrics of consumers or followers: {name: value}."""
    status, text = cluster.get(nid, "/metrics")
    assert status == 200, text
    pattern = r'^(strom_fetch_session\w*)\{kind="%s"\} (\d+)$' % kind
    return {name: int(v) for name, v in re.findall(pattern, text, re.M)}


def session_metrics(cluster, nid, kind="consumer"):
    """(sessions, partitions in them) a node holds for consumers or followers."""
    m = fetch_session_metrics(cluster, nid, kind)
    return m["strom_fetch_sessions"], m["strom_fetch_session_partitions"]


def sessions_opened(cluster, nid, kind="consumer"):
    return fetch_session_metrics(cluster, nid, kind)["strom_fetch_sessions_opened_total"]


def test_an_incremental_session_by_hand(cluster):
    addr = cluster.node(1).kafka_addr
    topic = f"sessions-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, partitions=3)
    cluster.wait_topic(topic, 3)
    end0 = produce(addr, topic, 0, 5)

    # Epoch 0 opens a session; the full answer carries every partition.
    err, sid, got = fetch_v11(addr, 0, 0, {0: 0, 1: 0, 2: 0}, topic=topic)
    assert err == 0 and sid != 0, (err, sid)
    assert sorted(got) == [(topic, 0), (topic, 1), (topic, 2)]
    assert got[(topic, 0)][1] == end0 and got[(topic, 0)][2], "partition 0's records"
    assert session_metrics(cluster, 1) == (1, 3)

    # Epoch 1: the consumer moved on in partition 0; nothing is new, so nothing is carried.
    err, sid1, got = fetch_v11(addr, sid, 1, {0: end0}, topic=topic)
    assert (err, sid1, got) == (0, sid, {})

    # Epoch 2 names no partition: the session still fetches all three, and carries only
    # the one that has new records, from the position it remembers.
    end2 = produce(addr, topic, 2, 3)
    err, _, got = fetch_v11(addr, sid, 2, {}, topic=topic)
    assert err == 0 and list(got) == [(topic, 2)], got
    assert got[(topic, 2)][1] == end2 and got[(topic, 2)][2]

    # The same epoch again, or an unknown session: refused, and the session lives on.
    assert fetch_v11(addr, sid, 2, {}, topic=topic)[0] == INVALID_FETCH_SESSION_EPOCH
    assert fetch_v11(addr, sid ^ 0x5A5A, 1, {}, topic=topic)[0] == FETCH_SESSION_ID_NOT_FOUND

    # Epoch 3 forgets partition 2: its new records are no longer fetched.
    err, _, got = fetch_v11(addr, sid, 3, {2: end2}, forget=[2], topic=topic)
    assert err == 0, err
    produce(addr, topic, 2, 1)
    err, _, got = fetch_v11(addr, sid, 4, {}, topic=topic)
    assert (err, got) == (0, {}), got
    assert session_metrics(cluster, 1) == (1, 2)

    # Epoch -1 closes it; the answer is a sessionless full one.
    err, sid_closed, got = fetch_v11(addr, sid, -1, {1: 0}, topic=topic)
    assert (err, sid_closed, list(got)) == (0, 0, [(topic, 1)])
    assert session_metrics(cluster, 1) == (0, 0)
    assert fetch_v11(addr, sid, 5, {}, topic=topic)[0] == FETCH_SESSION_ID_NOT_FOUND


def _kafka_python_reads_everything(c, topic, sessions):
    """kafka-python, which opens an incremental session, reads every record of 6 partitions
    exactly once while a producer keeps writing to some of them."""
    c.create_topic(topic, partitions=6)
    c.wait_topic(topic, 6)
    first = [clients.Rec(None, b"a%d" % i, partition=i % 6) for i in range(600)]
    clients.produce_confluent(c.bootstrap, topic, first)
    consumer = clients.kp_consumer(c.bootstrap)
    try:
        from kafka import TopicPartition
        tps = [TopicPartition(topic, p) for p in range(6)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        got = {}

        def read(n):
            deadline = time.monotonic() + 60
            while sum(len(v) for v in got.values()) < n:
                assert time.monotonic() < deadline, f"read {sum(len(v) for v in got.values())} of {n}"
                for tp, msgs in consumer.poll(timeout_ms=300).items():
                    got.setdefault(tp.partition, []).extend((m.offset, m.value) for m in msgs)

        read(600)
        # The consumer fetches through a session of its 6 partitions (or, with no slots, none).
        held = session_metrics(c, 1)
        assert (held[0] >= 1 and held[1] >= 6) if sessions else held == (0, 0), held
        # Later records go to two partitions only: the others are idle in the session.
        second = [clients.Rec(None, b"b%d" % i, partition=i % 2) for i in range(200)]
        clients.produce_confluent(c.bootstrap, topic, second)
        read(800)
    finally:
        consumer.close(autocommit=False, timeout_ms=5000)
    for p, rows in got.items():
        offsets = [o for o, _ in rows]
        assert offsets == list(range(len(offsets))), f"partition {p}: offsets {offsets[:10]}..."
    values = sorted(v for rows in got.values() for _, v in rows)
    assert values == sorted([r.value for r in first] + [r.value for r in second])


def test_kafka_python_reads_through_a_session(cluster):
    _kafka_python_reads_everything(cluster, f"kp-session-{uuid.uuid4().hex[:8]}", sessions=True)


def test_without_session_slots_every_fetch_is_full(make_cluster):
    c = make_cluster(1, settings=harness.FAST + ("max.incremental.fetch.session.cache.slots=0",))
    topic = f"no-sessions-{uuid.uuid4().hex[:8]}"
    _kafka_python_reads_everything(c, topic, sessions=False)
    err, sid, got = fetch_v11(c.node(1).kafka_addr, 0, 0, {0: 0, 1: 0}, topic=topic)
    assert (err, sid, len(got)) == (0, 0, 2), "no session opened: a sessionless full answer"
    assert session_metrics(c, 1) == (0, 0)


def test_followers_fetch_through_one_session_per_leader(cluster3):
    c = cluster3
    topic = f"follower-sessions-{uuid.uuid4().hex[:8]}"
    c.create_topic(topic, partitions=6, rf=3, configs={"min.insync.replicas": "2"})
    t = c.wait_topic(topic, 6)
    led = {nid: sum(p["leader"] == nid for p in t["partitions"]) for nid in (1, 2, 3)}
    records = [clients.Rec(None, b"r%d" % i, partition=i % 6) for i in range(300)]
    clients.produce_confluent(c.bootstrap, topic, records)

    # Each leader holds one session per follower, covering every partition it leads.
    def sessions_cover_the_topic():
        for nid in (1, 2, 3):
            sessions, partitions = session_metrics(c, nid, "follower")
            # Other tests' topics in this module's cluster may add to both counts.
            if led[nid] and (sessions < 2 or partitions < 2 * led[nid]):
                return None
        return True

    harness.wait_for("each leader to hold its followers' sessions", 30, sessions_cover_the_topic)
    # The followers are in sync through their sessions.
    harness.wait_for("a full ISR on every partition", 30, lambda: all(
        len(p["isr"]) == 3 for p in c.topic(topic)["partitions"]))
    got = clients.consume_confluent(c.bootstrap, topic, {p: 50 for p in range(6)})
    assert sorted(r.value for rows in got.values() for r in rows) == sorted(r.value for r in records)
