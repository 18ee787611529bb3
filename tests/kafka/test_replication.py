"""ISR replication and failover on real 3-node clusters: nothing acknowledged is lost
when a leader dies, a stopped follower leaves and rejoins the ISR, acks=all is refused
without enough replicas, and a follower truncates a suffix the new leader never had."""
import time

import confluent_kafka as ck
import pytest

import wire
from harness import FAST, wait_for

NOT_LEADER_OR_FOLLOWER, OUT_OF_ORDER_SEQUENCE_NUMBER = 6, 45


def producer(cluster, **conf):
    base = {"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5,
            "message.timeout.ms": 60000, "socket.timeout.ms": 10000, "log_level": 0}
    base.update(conf)
    return ck.Producer(base)


def read_all(cluster, topic, partitions, expect, timeout=60):
    """{partition: [(offset, key)]} read from offset 0 until `expect` records in total."""
    c = ck.Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "replication-tests",
                     "enable.auto.commit": False, "fetch.wait.max.ms": 100, "log_level": 0})
    c.assign([ck.TopicPartition(topic, p, 0) for p in range(partitions)])
    got = {p: [] for p in range(partitions)}
    deadline = time.monotonic() + timeout
    try:
        while sum(map(len, got.values())) < expect and time.monotonic() < deadline:
            for m in c.consume(num_messages=1000, timeout=0.5):
                if not m.error():
                    got[m.partition()].append((m.offset(), m.key()))
    finally:
        c.close()
    return got


def isr(cluster, topic, partition, via):
    t = cluster.topic(topic, via=via)
    return t["partitions"][partition]["isr"] if t else None


def test_leader_killed_under_acks_all_loses_nothing(make_cluster):
    cluster = make_cluster(3, FAST)
    cluster.create_topic("failover", partitions=3, rf=3, configs={"min.insync.replicas": "2"})
    cluster.wait_topic("failover", 3)
    p = producer(cluster)
    acked, failed = {}, []

    def done(err, msg):
        if err:
            failed.append(err)
        else:
            acked[msg.key()] = (msg.partition(), msg.offset())

    total, killed = 50_000, None
    for i in range(total):
        while True:
            try:
                p.produce("failover", key=b"k%06d" % i, value=b"v%d" % i, on_delivery=done)
                break
            except BufferError:
                p.poll(0.05)
        if i == total // 3:
            p.flush(60)
            killed = cluster.leaders("failover")[0]
            cluster.kill(killed)
        if i % 500 == 0:
            p.poll(0)
    assert p.flush(120) == 0
    assert not failed, f"{len(failed)} deliveries failed, first {failed[:3]}"
    assert len(acked) == total

    survivor = next(n for n in cluster.running())
    new_leader = cluster.leaders("failover", via=survivor)[0]
    assert new_leader not in (None, killed)
    got = read_all(cluster, "failover", 3, total)
    seen = {}
    for part, records in got.items():
        offsets = [o for o, _ in records]
        assert offsets == sorted(offsets), f"partition {part} out of order"
        for offset, key in records:
            assert key not in seen, f"{key} read twice"
            seen[key] = (part, offset)
    assert seen == acked, f"{sum(k not in seen for k in acked)} acknowledged records missing"

    # The killed broker comes back and every ISR grows back to three.
    cluster.launch(killed)
    wait_for("the restarted broker back in every ISR", 30,
             lambda: all(killed in isr(cluster, "failover", part, survivor) for part in range(3)))


def test_stopped_follower_leaves_the_isr_and_rejoins(make_cluster):
    import signal

    # A long session keeps the stopped broker registered: only the leader's
    # lag check (replica.lag.time.max.ms) takes it out of the ISR.
    cluster = make_cluster(3, ("broker.heartbeat.interval.ms=200", "broker.session.timeout.ms=60000",
                               "replica.lag.time.max.ms=1000"))
    cluster.create_topic("lag", partitions=1, rf=3, configs={"min.insync.replicas": "2"})
    cluster.wait_topic("lag", 1)
    leader = cluster.leaders("lag")[0]
    follower = next(n for n in (1, 2, 3) if n != leader)
    watcher = leader
    p = producer(cluster)
    for i in range(100):
        p.produce("lag", value=b"before-%d" % i)
    assert p.flush(30) == 0

    cluster.signal(follower, signal.SIGSTOP)
    stopped_at = time.monotonic()
    wait_for("the stopped follower out of the ISR", 15, lambda: follower not in isr(cluster, "lag", 0, watcher))
    assert time.monotonic() - stopped_at < 10
    errors = []
    for i in range(100):
        p.produce("lag", value=b"during-%d" % i, on_delivery=lambda e, m: errors.append(e) if e else None)
    assert p.flush(30) == 0 and not errors, "writes continue with two in-sync replicas"

    cluster.signal(follower, signal.SIGCONT)
    wait_for("the follower back in the ISR", 20, lambda: follower in isr(cluster, "lag", 0, watcher))
    got = read_all(cluster, "lag", 1, 200)
    assert len(got[0]) == 200


def test_two_of_three_down_refuses_acks_all(make_cluster):
    cluster = make_cluster(3, FAST)
    cluster.create_topic("strict", partitions=1, rf=3, configs={"min.insync.replicas": "2"})
    cluster.wait_topic("strict", 1)
    leader = cluster.leaders("strict")[0]
    for other in (n for n in (1, 2, 3) if n != leader):
        cluster.kill(other)
    p = producer(cluster, **{"message.timeout.ms": 6000, "bootstrap.servers": cluster.node(leader).kafka})
    acked, failed = [], []
    for i in range(20):
        p.produce("strict", value=b"x%d" % i,
                  on_delivery=lambda e, m: failed.append(e) if e else acked.append(m.offset()))
    p.flush(30)
    assert acked == [], f"acknowledged without enough replicas: {acked}"
    assert len(failed) == 20


def test_follower_truncates_a_suffix_the_new_leader_never_had(make_cluster):
    import signal

    cluster = make_cluster(3, FAST)
    cluster.create_topic("diverge", partitions=1, rf=2, configs={"min.insync.replicas": "1"})
    t = cluster.wait_topic("diverge", 1)
    a, b = t["partitions"][0]["replicas"]
    watcher = next(n for n in (1, 2, 3) if n not in (a, b))
    plain = {"enable.idempotence": False, "acks": "1", "bootstrap.servers": cluster.bootstrap}
    p = producer(cluster, **plain)
    for i in range(10):
        p.produce("diverge", value=b"committed-%d" % i)
    assert p.flush(30) == 0
    # The high watermark is the minimum over the ISR: at 10, B has every record.
    wait_for("both replicas holding the committed records", 10,
             lambda: cluster.topic("diverge", via=watcher)["partitions"][0]["high_watermark"] == 10)

    # B stops; A goes on alone and appends records B never sees.
    cluster.signal(b, signal.SIGSTOP)
    wait_for("B out of the ISR", 15, lambda: isr(cluster, "diverge", 0, watcher) == [a])
    for i in range(5):
        p.produce("diverge", value=b"only-on-a-%d" % i)
    assert p.flush(30) == 0
    # A dies; B returns; the operator elects B although it missed A's last records.
    cluster.kill(a)
    cluster.signal(b, signal.SIGCONT)
    wait_for("B active again", 20, lambda: any(
        x["id"] == b and x["state"] == "active" for x in cluster.get(watcher, "/v1/brokers")[1]))
    wait_for("the partition offline (A fenced, B not in the ISR)", 15,
             lambda: cluster.topic("diverge", via=watcher)["partitions"][0]["leader"] is None)
    status, body = cluster.send(watcher, "POST", "/v1/partitions/diverge/0/elect-leader", {"type": "unclean"})
    assert status == 200 and body["leader"] == b, (status, body)
    p2 = producer(cluster, **dict(plain, **{"bootstrap.servers": cluster.node(b).kafka}))
    for i in range(3):
        p2.produce("diverge", value=b"new-leader-%d" % i)
    assert p2.flush(30) == 0

    # A restarts as a follower, truncates its divergent suffix and catches up.
    cluster.launch(a)
    wait_for("A back in the ISR", 30, lambda: a in isr(cluster, "diverge", 0, watcher))
    wait_for("A's log to say it truncated", 10,
             lambda: "truncated a divergent suffix" in open(cluster.node(a).log).read())
    # B goes; A, now in sync, is elected cleanly; what it serves is B's history.
    cluster.kill(b)
    wait_for("A leading again", 15, lambda: cluster.topic("diverge", via=watcher)["partitions"][0]["leader"] == a)
    c = ck.Consumer({"bootstrap.servers": cluster.node(a).kafka, "group.id": "t", "log_level": 0})
    c.assign([ck.TopicPartition("diverge", 0, 0)])
    values, deadline = [], time.monotonic() + 30
    while len(values) < 13 and time.monotonic() < deadline:
        for m in c.consume(100, timeout=0.5):
            if not m.error():
                values.append(m.value())
    c.close()
    assert values == [b"committed-%d" % i for i in range(10)] + [b"new-leader-%d" % i for i in range(3)]
    assert not any(v.startswith(b"only-on-a") for v in values)


def test_follower_behind_the_leaders_log_start_catches_up(make_cluster):
    """A follower that was down while retention deleted the segments it still needed gets
    OFFSET_OUT_OF_RANGE with the leader's log start offset, starts over there and rejoins
    the ISR. (The error used to carry log start -1, so the follower fetched the same
    offset forever and never rejoined.)"""
    cluster = make_cluster(3, FAST + ("log.retention.check.interval.ms=200",))
    cluster.create_topic("behind", partitions=1, rf=3,
                         configs={"segment.bytes": "20000", "retention.bytes": "40000"})
    cluster.wait_topic("behind", 1)
    leader = cluster.leaders("behind")[0]
    follower = next(n for n in (1, 2, 3) if n != leader)
    p = producer(cluster, **{"batch.size": 4000})
    for i in range(20):
        p.produce("behind", value=b"before-%04d" % i)
    assert p.flush(30) == 0
    wait_for("every replica in the ISR", 20, lambda: sorted(isr(cluster, "behind", 0, leader) or []) == [1, 2, 3])
    cluster.kill(follower)
    wait_for("the killed follower out of the ISR", 20, lambda: follower not in isr(cluster, "behind", 0, leader))
    for i in range(2000):
        p.produce("behind", value=b"x" * 200)
        if i % 200 == 0:
            p.poll(0)
    assert p.flush(60) == 0

    def log_start():
        t = cluster.topic("behind", via=leader)
        return t["partitions"][0]["log_start_offset"] if t else None
    wait_for("retention past the follower's log end", 30, lambda: (log_start() or 0) > 1000)
    cluster.launch(follower)
    wait_for("the follower back in the ISR", 60, lambda: follower in (isr(cluster, "behind", 0, leader) or []))


@pytest.mark.parametrize("controller_too", [False, True], ids=["follower-side", "controller-leads"])
def test_a_leader_cut_off_from_the_controller_stops_taking_writes(make_cluster, controller_too):
    """A leader that hears nothing from the controller for broker.session.timeout.ms (1.5 s
    here) has most likely been fenced, its partitions led elsewhere: it refuses writes with
    NOT_LEADER_OR_FOLLOWER, which sends clients to fresh metadata, instead of appending what
    can never commit (with acks=1, what the next leader truncates). Also when it is the
    controller itself, cut off from the other voters. It takes writes again once the
    controller answers. Reads go on, except past its log end (see below)."""
    import signal

    import wire

    cluster = make_cluster(3, FAST)
    controller = cluster.cluster_view(1)["controller_id"]
    cluster.create_topic("cut", partitions=1, rf=3)
    cluster.wait_topic("cut", 1)
    leader = cluster.topic("cut")["partitions"][0]["leader"]
    if controller_too != (leader == controller):
        target = [controller] + [b for b in (1, 2, 3) if b != controller] if controller_too else \
            [b for b in (1, 2, 3) if b != controller] + [controller]
        status, body = cluster.send(1, "POST", "/v1/partitions/cut/0/reassign", {"replicas": target})
        assert status == 202, body
        cluster.send(1, "POST", "/v1/partitions/cut/0/elect-leader", {"type": "preferred"})
        wait_for("the chosen leader", 30, lambda: cluster.topic("cut")["partitions"][0]["leader"] == target[0])
        leader = target[0]
    addr = cluster.node(leader).kafka_addr
    batch = wire.record_batch([(b"k", b"v")])
    assert wire.produce(addr, "cut", 0, batch)[0] == 0  # acks=all: committed, readable while cut off
    others = [b for b in (1, 2, 3) if b != leader]
    for b in others:
        cluster.signal(b, signal.SIGSTOP)
    try:
        cut_at = time.monotonic()
        wait_for("NOT_LEADER_OR_FOLLOWER from the cut-off leader", 15,
                 lambda: wire.produce(addr, "cut", 0, batch, acks=1, timeout_ms=2000)[0] == 6, interval=0.2)
        refused_after = time.monotonic() - cut_at
        # Reads of what it holds go on; past its log end it cannot know whether a new
        # leader has more, so a consumer there is sent to fresh metadata, not told
        # OFFSET_OUT_OF_RANGE (which makes it reset its position; seed 212).
        err, _, records = wire.fetch(addr, "cut", 0, 0)
        assert err == 0 and records, err
        assert wire.fetch(addr, "cut", 0, 1000)[0] == 6
    finally:
        for b in others:
            cluster.signal(b, signal.SIGCONT)
    assert refused_after < 10, refused_after
    p = ck.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True,
                     "log_level": 0})
    p.produce("cut", value=b"after", partition=0)
    assert p.flush(30) == 0, "writes are taken again once the quorum is back"


def test_a_decision_waits_for_the_controllers_pending_one(make_cluster):
    """Found by the fault harness (seed 204): the controller, cut off from the other
    voters, proposed the fence of a stopped follower, which timed out but stayed in its
    log; then it proposed fencing itself, decided against an image without that first
    fence (the follower still "active", so elected leader with the ISR it was in). When
    the voters came back both committed in that order: the first fence shrank the ISR to
    the leader alone, whose high watermark took in its last records (acknowledged to
    acks=all producers, min.insync.replicas=1), then the stale election handed the
    partition to the follower, which never had them. Every controller decision now waits
    until its own log is applied."""
    import wire

    cluster = make_cluster(3, FAST + ("replica.lag.time.max.ms=3000",))
    controller = cluster.cluster_view(1)["controller_id"]
    cluster.create_topic("pending", partitions=1, rf=3, configs={"min.insync.replicas": "1"})
    cluster.wait_topic("pending", 1)
    if cluster.topic("pending")["partitions"][0]["leader"] != controller:
        target = [controller] + [b for b in (1, 2, 3) if b != controller]
        status, body = cluster.send(1, "POST", "/v1/partitions/pending/0/reassign", {"replicas": target})
        assert status == 202, body
        cluster.send(1, "POST", "/v1/partitions/pending/0/elect-leader", {"type": "preferred"})
        wait_for("the controller leading", 30, lambda: cluster.topic("pending")["partitions"][0]["leader"] == controller)
    first, second = [b for b in (1, 2, 3) if b != controller]
    addr = cluster.node(controller).kafka_addr
    before = [(None, b"before-%d" % i) for i in range(20)]
    assert wire.produce(addr, "pending", 0, wire.record_batch(before), acks=-1) == (0, 0)

    cluster.kill(first)
    down = [first]
    try:
        wait_for("the first follower, killed, fenced out of the ISR", 20,
                 lambda: first not in (isr(cluster, "pending", 0, controller) or [first]))
        cluster.kill(second)
        down.append(second)
        # Taken by the leader (sent once, never again) before it notices it is cut off;
        # committed only when the ISR shrinks to the leader alone.
        during = [(None, b"during-%d" % i) for i in range(20)]
        code, _ = wire.produce(addr, "pending", 0, wire.record_batch(during), acks=-1, timeout_ms=1000)
        assert code in (0, 7), f"produce while cut off answered {code}"  # 7: REQUEST_TIMED_OUT
        log = cluster.node(controller).log
        wait_for("the controller's fence of the second follower to time out, and its next decision to wait", 30,
                 lambda: "fencing deferred" in open(log, errors="replace").read(), interval=0.2)
    finally:
        # Restarted (not resumed), they follow the controller, whose pending entries commit.
        for b in down:
            cluster.launch(b)
    cluster.wait_active(timeout=60)
    wait_for("the partition online", 30, lambda: cluster.topic("pending")["partitions"][0]["leader"] is not None)
    # The leader was never deposed, only cut off: its records commit once the ISR
    # shrinks to it alone (its high watermark passes them, and consumers may read them),
    # whether or not the produce request still waited by then.
    stored = {}
    c = ck.Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "pending-check",
                     "enable.auto.commit": False, "log_level": 0})
    c.assign([ck.TopicPartition("pending", 0, 0)])
    deadline = time.monotonic() + 30
    try:
        while len(stored) < 40 and time.monotonic() < deadline:
            for m in c.consume(num_messages=1000, timeout=0.5):
                if not m.error():
                    stored[m.offset()] = m.value()
    finally:
        c.close()
    expected = [v for _, v in before + during]
    got = [stored.get(o) for o in range(40)]
    assert got == expected, f"the leader's committed records were truncated: {got}"


def test_followers_fetch_within_replica_fetch_max_bytes_and_still_take_larger_batches(make_cluster):
    """replica.fetch.max.bytes below a batch's size: as in Kafka, the first batch of a
    partition comes whole anyway, so followers still replicate everything and the ISR stays
    full; acks=all writes commit."""
    cluster = make_cluster(3, FAST + ("replica.fetch.max.bytes=1000", "replica.fetch.response.max.bytes=2000"))
    cluster.create_topic("small-fetch", partitions=2, rf=3, configs={"min.insync.replicas": "3"})
    cluster.wait_topic("small-fetch", 2)
    p = producer(cluster, **{"linger.ms": 20, "batch.size": 65536})
    for i in range(200):
        p.produce("small-fetch", key=b"%d" % i, value=b"x" * 3000, partition=i % 2)
    assert p.flush(60) == 0, "acks=all writes not committed with small follower fetches"
    got = read_all(cluster, "small-fetch", 2, 200)
    assert sum(map(len, got.values())) == 200
    for part in range(2):
        assert sorted(isr(cluster, "small-fetch", part, 1)) == [1, 2, 3]


def test_a_batch_behind_one_refused_before_its_broker_led_is_retriable(make_cluster):
    """librdkafka pipelines produce requests. When R1 reaches a broker just before it learns
    it leads and R2 just after, R2's sequence gap is R1 on its way back: R2 is answered
    NOT_LEADER_OR_FOLLOWER as R1 was. OUT_OF_ORDER_SEQUENCE_NUMBER would make librdkafka bump
    its epoch and renumber every unacknowledged message, in every partition, so messages
    another leader had stored without answering were stored twice (seen in a decommission
    under load in CI)."""
    cluster = make_cluster(3, FAST + ("balancer.mode=off",))
    cluster.create_topic("gap", partitions=1, rf=3)
    replicas = cluster.wait_topic("gap", 1)["partitions"][0]["replicas"]
    leader, new = replicas[0], replicas[1]
    err, pid, epoch = wire.init_producer_id(cluster.node(leader).kafka_addr)
    assert err == 0 and pid >= 0

    def send(node, seq):
        batch = wire.record_batch([(None, b"r%d" % seq)], producer_id=pid, producer_epoch=epoch, base_sequence=seq)
        return wire.produce(cluster.node(node).kafka_addr, "gap", 0, batch)[0]

    assert send(leader, 0) == 0
    assert send(new, 1) == NOT_LEADER_OR_FOLLOWER, "R1 reaches a follower"
    # The follower leads: first in the replica order, then a preferred election.
    order = [new] + [b for b in replicas if b != new]
    status, body = cluster.send(1, "POST", "/v1/partitions/gap/0/reassign", {"replicas": order})
    assert status == 202, body
    wait_for("the new replica order", 30, lambda: cluster.topic("gap")["partitions"][0]["replicas"] == order)
    status, body = cluster.send(1, "POST", "/v1/partitions/gap/0/elect-leader", {"type": "preferred"})
    assert status == 200 and body["leader"] == new, (status, body)
    wait_for(f"broker {new} to lead", 30, lambda: (cluster.topic("gap", via=new) or {}).get(
        "partitions", [{}])[0].get("leader") == new)
    assert send(new, 2) == NOT_LEADER_OR_FOLLOWER, "R2's gap is R1, refused here: not OUT_OF_ORDER"
    # The client sends both again, in order; a gap nothing explains is still out of order.
    assert send(new, 1) == 0
    assert send(new, 2) == 0
    assert send(new, 9) == OUT_OF_ORDER_SEQUENCE_NUMBER
    c = ck.Consumer({"bootstrap.servers": cluster.node(new).kafka, "group.id": "gap", "log_level": 0})
    c.assign([ck.TopicPartition("gap", 0, 0)])
    values, deadline = [], time.monotonic() + 30
    while len(values) < 3 and time.monotonic() < deadline:
        values += [m.value() for m in c.consume(100, timeout=0.5) if not m.error()]
    c.close()
    assert values == [b"r0", b"r1", b"r2"]
