"""The consumer group protocol of KIP-848 (ConsumerGroupHeartbeat, the broker assigns) with
librdkafka's group.protocol=consumer, each member its own process: the broker's range
assignor splits 8 partitions 3/3/2; members joining, leaving and crashing move partitions
without any partition owned by two members at once (checked on the merged timeline of
every member's assign/revoke callbacks); the group and its committed offsets survive its
coordinator's broker being SIGKILLed; the coordinator's error codes for bad heartbeats;
an empty classic group becoming a consumer group; and KIP-848's online migration, a live
classic group converting when a member of the new protocol joins and back when it leaves."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import confluent_kafka as ck
import pytest

import harness
import wire
from harness import FAST, wait_for
from test_groups import Feeder, find_coordinator, group_view, produce

FENCED_MEMBER_EPOCH, UNSUPPORTED_ASSIGNOR, UNKNOWN_MEMBER_ID = 110, 112, 25
INVALID_REQUEST, INVALID_REGULAR_EXPRESSION, INCONSISTENT_GROUP_PROTOCOL = 42, 128, 23
GROUP_ID_NOT_FOUND, REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION = 69, 27, 22

SESSION_MS = 6000
SETTINGS = FAST + (
    "offsets.topic.num.partitions=4",
    f"group.consumer.session.timeout.ms={SESSION_MS}",
    "group.consumer.heartbeat.interval.ms=1000",
)
MEMBER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kip848_member.py")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = harness.start(tmp_path_factory.mktemp("kip848"), 3, SETTINGS)
    yield c
    c.close()


class Member:
    """A kip848_member.py process (or another `argv` that prints the same events); its
    events are read by a thread as they come."""

    def __init__(self, cluster, group, topic, assignor="range", instance=None, argv=None):
        if argv is None:
            argv = [sys.executable, MEMBER, cluster.bootstrap, group, topic, assignor] + ([instance] if instance else [])
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.events, self.lock = [], threading.Lock()
        self.killed_at = None
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                self.events.append(event)

    def snapshot(self):
        with self.lock:
            return list(self.events)

    def owned(self):
        """The partitions its callbacks say it owns now."""
        owned = set()
        for e in self.snapshot():
            if e["ev"] == "assign":
                owned |= set(e["parts"])
            elif e["ev"] in ("revoke", "lost"):
                owned -= set(e["parts"])
        return owned

    def consumed(self):
        return {v for e in self.snapshot() if e["ev"] == "consumed" for v in e["values"]}

    def leave(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
        self.reader.join(timeout=10)

    def crash(self):
        self.killed_at = time.monotonic()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.reader.join(timeout=10)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def stderr_tail(self):
        try:
            return self.proc.stderr.read()[-2000:] if self.proc.poll() is not None else ""
        except (OSError, ValueError):
            return ""


def check_exclusive(members):
    """Replays every member's assign/revoke/lost callbacks in time order (a member owns
    nothing once it starts closing, or from its kill on): no partition is ever owned by two
    members at once."""
    timeline = []
    for i, m in enumerate(members):
        for e in m.snapshot():
            if e["ev"] in ("assign", "revoke", "lost"):
                timeline.append((e["t"], i, e["ev"], e["parts"]))
            elif e["ev"] == "closing":
                timeline.append((e["t"], i, "lost", list(range(1 << 10))))
        if m.killed_at is not None:
            timeline.append((m.killed_at, i, "lost", list(range(1 << 10))))
    timeline.sort(key=lambda x: x[0])
    owner = {}
    for t, i, ev, parts in timeline:
        for p in parts:
            if ev == "assign":
                assert owner.get(p) in (None, i), f"partition {p} given to member {i} at {t} while member {owner[p]} owns it"
                owner[p] = i
            elif owner.get(p) == i:
                del owner[p]
    return len(timeline)


def wait_split(members, partitions, sizes, timeout=60):
    """Waits until the members' owned partitions cover every partition once, in `sizes`."""
    def split():
        owned = [m.owned() for m in members]
        union = set().union(*owned)
        if sorted(len(o) for o in owned) == sorted(sizes) and union == set(range(partitions)) \
                and sum(map(len, owned)) == partitions:
            return owned
        return None
    try:
        return wait_for(f"partitions split {sizes}", timeout, split, interval=0.05)
    except TimeoutError:
        raise AssertionError(f"owned: {[sorted(m.owned()) for m in members]}; "
                             f"stderr: {[m.stderr_tail() for m in members]}") from None


def consumer_view(cluster, group, predicate, timeout=30):
    def ok():
        for nid in cluster.running():
            v = group_view(cluster, group, via=nid)
            if v and predicate(v):
                return v
        return None
    return wait_for(f"admin view of {group}", timeout, ok, interval=0.1)


def test_range_assignor_splits_3_3_2_and_members_move_partitions_without_double_ownership(cluster):
    topic, group = "kip848-churn", "kip848-churn-group"
    cluster.create_topic(topic, partitions=8, rf=3)
    cluster.wait_topic(topic, 8)
    members = []
    feeder = Feeder(cluster.bootstrap, topic, 8, "churn", rate=300)
    try:
        started = time.monotonic()
        members = [Member(cluster, group, topic) for _ in range(3)]
        owned = wait_split(members, 8, [3, 3, 2])
        took = time.monotonic() - started
        print(f"3 members assigned 3/3/2 {took:.2f} s after their processes started")
        # The broker computed it: contiguous ranges, as Kafka's range assignor gives.
        assert sorted(sorted(o) for o in owned) == [[0, 1, 2], [3, 4, 5], [6, 7]]
        view = consumer_view(cluster, group, lambda v: v["state"] == "Stable" and len(v["members"]) == 3)
        assert (view["group_protocol"], view["assignor"], view["protocol_type"]) == ("consumer", "range", "consumer")
        targets = sorted(sum(len(a["partitions"]) for a in m["target_assignment"]) for m in view["members"])
        assert targets == [2, 3, 3]
        assert all(m["member_epoch"] == view["assignment_epoch"] for m in view["members"])

        feeder.start()
        wait_for("records flowing", 30, lambda: feeder.count() >= 300)
        # A fourth member joins: 2/2/2/2.
        members.append(Member(cluster, group, topic))
        wait_split(members, 8, [2, 2, 2, 2])
        # One leaves cleanly: its partitions go to the other three at once.
        members[0].leave()
        wait_split(members[1:], 8, [3, 3, 2])
        # One crashes: after its session its partitions go to the other two.
        members[1].crash()
        wait_split(members[2:], 8, [4, 4], timeout=SESSION_MS / 1000 + 30)
        acked = feeder.stop()
        wait_for("every acknowledged record consumed", 60,
                 lambda: {v.decode() for v in acked} <= set().union(*(m.consumed() for m in members)))
        events = check_exclusive(members)
        assert events >= 8, "the timeline has the members' callbacks"
    finally:
        feeder.stop_event.set()
        for m in members:
            m.stop()


def test_the_group_survives_its_coordinators_broker_being_sigkilled(cluster):
    topic, group = "kip848-failover", "kip848-failover-group"
    cluster.create_topic(topic, partitions=6, rf=3)
    cluster.wait_topic(topic, 6)
    members = []
    feeder = Feeder(cluster.bootstrap, topic, 6, "failover", rate=300)
    killed = None
    try:
        members = [Member(cluster, group, topic, assignor="uniform") for _ in range(2)]
        wait_split(members, 6, [3, 3])
        feeder.start()
        wait_for("records consumed", 30, lambda: sum(len(m.consumed()) for m in members) >= 300)
        before = consumer_view(cluster, group, lambda v: v["state"] == "Stable" and len(v["members"]) == 2)
        ids = sorted(m["member_id"] for m in before["members"])
        killed, _ = find_coordinator(cluster, group)
        killed_at = time.monotonic()
        cluster.kill(killed)
        # Another broker takes the group over from the log: the same members, and they
        # keep consuming what is produced after the kill.
        after = consumer_view(cluster, group, lambda v: sorted(m["member_id"] for m in v["members"]) == ids
                              and v["state"] == "Stable", timeout=60)
        assert after["generation"] >= before["generation"]
        mark = feeder.count()
        wait_for("records produced after the kill consumed", 60,
                 lambda: feeder.count() > mark + 300
                 and sum(len(m.consumed()) for m in members) > mark + 300)
        acked = feeder.stop()
        wait_for("every acknowledged record consumed", 60,
                 lambda: {v.decode() for v in acked} <= set().union(*(m.consumed() for m in members)))
        check_exclusive(members)
        # The members kept their partitions throughout: no partition lost, revoked or
        # assigned again after the kill (a member the new coordinator did not know would
        # have lost its partitions and joined again).
        moved = [e for m in members for e in m.snapshot()
                 if e["ev"] in ("assign", "revoke", "lost") and e["t"] > killed_at]
        assert not moved, moved
        # Committed offsets were kept: they reach at least what was committed before the kill.
        committed = consumer_view(cluster, group, lambda v: len(v["offsets"]) == 6)
        assert all(o["committed"] > 0 for o in committed["offsets"]), committed["offsets"]
    finally:
        feeder.stop_event.set()
        for m in members:
            m.stop()
        if killed is not None:
            cluster.launch(killed)
            cluster.wait_active(3)


# Coordinator errors a client answers by looking the coordinator up again and retrying
# (leadership of a __consumer_offsets partition may move, for example when the balancer
# moves leaders back to a restarted node).
COORDINATOR_ERRORS = {14, 15, 16}  # COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR


def at_coordinator(cluster, group, call, timeout=30):
    """call(coordinator address) -> a dict with "error", or {key: error code}; retried at the
    group's coordinator, looked up again, while it answers a coordinator error."""
    deadline = time.monotonic() + timeout
    while True:
        _, addr = find_coordinator(cluster, group)
        out = call(addr)
        errors = {out["error"]} if "error" in out else set(out.values())
        if not errors & COORDINATOR_ERRORS or time.monotonic() > deadline:
            return out


def topic_id_of(cluster, topic):
    info = cluster.topic(topic)
    return bytes.fromhex(info["topic_id"].replace("-", ""))


def test_heartbeat_errors_and_a_whole_member_life_by_hand(cluster):
    topic, group = "kip848-wire", "kip848-wire-group"
    cluster.create_topic(topic, partitions=8, rf=1)
    cluster.wait_topic(topic, 8)

    def hb(*args, **kw):
        return at_coordinator(cluster, group, lambda addr: wire.consumer_group_heartbeat(addr, *args, **kw))

    assert hb(group, "m-1", 0, topics=[topic], owned={}, server_assignor="sticky")["error"] == UNSUPPORTED_ASSIGNOR
    assert hb(group, "m-1", 0, regex="(", owned={})["error"] == INVALID_REGULAR_EXPRESSION
    assert hb("", "m-1", 0, topics=[topic], owned={})["error"] == INVALID_REQUEST
    assert hb(group, "m-1", 0, topics=[topic], owned=None)["error"] == INVALID_REQUEST
    assert hb(group, "m-unknown", 3)["error"] == UNKNOWN_MEMBER_ID
    joined = hb(group, "m-1", 0, topics=[topic], owned={}, server_assignor="range")
    assert (joined["error"], joined["member_epoch"]) == (0, 1), joined
    tid = topic_id_of(cluster, topic)
    assert joined["assignment"] == {tid: list(range(8))}
    assert 0 < joined["interval"] <= 1000
    # An epoch from the future, or an old one that is not the previous epoch: fenced.
    assert hb(group, "m-1", 7, owned=joined["assignment"])["error"] == FENCED_MEMBER_EPOCH
    # A second member: m-1 must give up half first (told at its own epoch).
    second = hb(group, "m-2", 0, topics=[topic], owned={}, server_assignor="range")
    assert (second["error"], second["member_epoch"], second["assignment"]) == (0, 2, {}), second
    told = hb(group, "m-1", 1, owned=joined["assignment"])
    assert (told["error"], told["member_epoch"], told["assignment"]) == (0, 1, {tid: [0, 1, 2, 3]}), told
    acked = hb(group, "m-1", 1, owned=told["assignment"])
    assert (acked["error"], acked["member_epoch"]) == (0, 2), acked
    freed = hb(group, "m-2", 2, owned={})
    assert (freed["error"], freed["assignment"]) == (0, {tid: [4, 5, 6, 7]}), freed
    # A classic member of another protocol type cannot join a group of the consumer protocol.
    joined_classic = at_coordinator(cluster, group, lambda addr: wire.join(addr, group, [topic], version=5,
                                                                            protocol_type="connect"))
    assert joined_classic["error"] == INCONSISTENT_GROUP_PROTOCOL
    for member in ("m-1", "m-2"):
        left = hb(group, member, -1)
        assert (left["error"], left["member_epoch"]) == (0, -1), left
    view = consumer_view(cluster, group, lambda v: v["state"] == "Empty")
    assert view["group_protocol"] == "consumer"


def test_an_empty_classic_group_becomes_a_consumer_group(cluster):
    topic, group = "kip848-convert", "kip848-convert-group"
    cluster.create_topic(topic, partitions=2, rf=1)
    cluster.wait_topic(topic, 2)
    # Offsets only (a classic group with no members), then a consumer-protocol member.
    errors = at_coordinator(cluster, group, lambda addr: wire.offset_commit(addr, group, {(topic, 0): (5, "")}))
    assert set(errors.values()) == {0}, errors
    joined = at_coordinator(cluster, group,
                            lambda addr: wire.consumer_group_heartbeat(addr, group, "m-1", 0, topics=[topic], owned={}))
    assert (joined["error"], joined["member_epoch"]) == (0, 1), joined
    view = consumer_view(cluster, group, lambda v: v["group_protocol"] == "consumer" and v["members"])
    assert [o["committed"] for o in view["offsets"] if o["partition"] == 0] == [5]
    # A classic group of another protocol type is not taken over.
    classic = "kip848-connect-group"
    assert at_coordinator(cluster, classic, lambda addr: wire.join(addr, classic, [topic], version=5,
                                                                   protocol_type="connect"))["error"] == 0
    refused = at_coordinator(cluster, classic, lambda addr: wire.consumer_group_heartbeat(
        addr, classic, "m-1", 0, topics=[topic], owned={}))
    assert refused["error"] == GROUP_ID_NOT_FOUND


def test_a_classic_member_joins_a_consumer_group_by_hand(cluster):
    """A classic member in a group of the consumer protocol, request by request: the broker
    assigns it (it is a follower, its generation is its member epoch), and its heartbeats
    ask it to rejoin until it holds its whole target."""
    topic, group = "kip848-mixed", "kip848-mixed-group"
    cluster.create_topic(topic, partitions=4, rf=1)
    cluster.wait_topic(topic, 4)
    tid = topic_id_of(cluster, topic)

    def call(f):
        return at_coordinator(cluster, group, f)

    def sync(member, generation):
        out = call(lambda a: dict(zip(("error", "data"), wire.sync_group(a, group, generation, member))))
        return out["error"], wire.decode_assignment(out["data"])

    def beat(member, generation):
        return call(lambda a: {"error": wire.heartbeat(a, group, generation, member)})["error"]

    first = call(lambda a: wire.consumer_group_heartbeat(a, group, "m-1", 0, topics=[topic], owned={}))
    assert (first["error"], first["member_epoch"], first["assignment"]) == (0, 1, {tid: [0, 1, 2, 3]}), first
    joined = call(lambda a: wire.join(a, group, [topic], version=5, protocol="cooperative-sticky"))
    assert joined["error"] == 0 and joined["leader"] == "" and joined["members"] == [], joined
    me, generation = joined["member_id"], joined["generation"]
    assert generation == 2, "it joined at the new epoch, with nothing yet"
    assert sync(me, generation) == (0, {})
    assert beat(me, generation) == REBALANCE_IN_PROGRESS
    # The other member gives up two partitions; rejoining, the classic member gets them.
    told = call(lambda a: wire.consumer_group_heartbeat(a, group, "m-1", 1, owned={tid: [0, 1, 2, 3]}))
    kept = told["assignment"][tid]
    assert len(kept) == 2, told
    acked = call(lambda a: wire.consumer_group_heartbeat(a, group, "m-1", 1, owned={tid: kept}))
    assert (acked["error"], acked["member_epoch"]) == (0, 2), acked
    rejoined = call(lambda a: wire.join(a, group, [topic], member_id=me, version=5, protocol="cooperative-sticky"))
    assert (rejoined["error"], rejoined["generation"]) == (0, 2), rejoined
    error, got = sync(me, 2)
    assert error == 0 and sorted(got[topic]) == sorted(set(range(4)) - set(kept)), (error, got)
    assert beat(me, 2) == 0
    assert beat(me, 1) == ILLEGAL_GENERATION
    view = consumer_view(cluster, group, lambda v: v["state"] == "Stable")
    assert sorted(m["member_type"] for m in view["members"]) == ["classic", "consumer"], view
    # The member of the new protocol leaves: the group is a classic group again, and rebalances.
    left = call(lambda a: wire.consumer_group_heartbeat(a, group, "m-1", -1))
    assert left["error"] == 0, left
    view = consumer_view(cluster, group, lambda v: v["group_protocol"] == "classic")
    assert view["state"] == "PreparingRebalance" and [m["member_id"] for m in view["members"]] == [me], view
    assert beat(me, 2) == REBALANCE_IN_PROGRESS
    again = call(lambda a: wire.join(a, group, [topic], member_id=me, version=5, protocol="cooperative-sticky"))
    assert (again["error"], again["generation"], again["leader"]) == (0, 3, me), again
    assert call(lambda a: dict(zip(("error", "member_error"), wire.leave_group(a, group, me))))["error"] == 0

def consume_and_commit(bootstrap, group, topic, count, protocol, timeout=60):
    """One confluent-kafka member of `group` (protocol "classic" or "consumer") reads `count`
    records of a one-partition topic, commits them, and leaves; the values it read."""
    conf = {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
            "enable.auto.commit": False}
    if protocol == "consumer":
        conf.update({"group.protocol": "consumer", "group.remote.assignor": "uniform"})
    c = ck.Consumer(conf)
    got = []
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + timeout
        while len(got) < count:
            assert time.monotonic() < deadline, f"{protocol} member read {len(got)} of {count}"
            msg = c.poll(0.2)
            if msg is not None and msg.error() is None:
                got.append(msg.value().decode())
                if len(got) == count:
                    c.commit(message=msg, asynchronous=False)
    finally:
        c.close()
    return got


def test_a_group_moves_from_classic_to_consumer_and_back_with_librdkafka(cluster):
    """Kafka's offline migration: the group's members stop and come back with the other
    protocol; each generation of members starts from the offsets the last one committed."""
    topic, group = "kip848-migrate", "kip848-migrate-group"
    cluster.create_topic(topic, partitions=1, rf=3)
    cluster.wait_topic(topic, 1)
    produce(cluster.bootstrap, topic, [(0, f"m-{i:04d}".encode()) for i in range(300)])
    seen = []
    for protocol in ("classic", "consumer", "classic"):
        seen += consume_and_commit(cluster.bootstrap, group, topic, 100, protocol)
        view = consumer_view(cluster, group, lambda v: v["state"] == "Empty")
        assert view["group_protocol"] == protocol, view
    assert seen == [f"m-{i:04d}" for i in range(300)], "each member went on where the last one stopped"


def test_a_live_group_moves_from_classic_to_consumer_and_back_without_double_ownership(cluster):
    """KIP-848's online migration with librdkafka: two classic members (cooperative-sticky)
    share 6 partitions; a member of the consumer protocol joins the live group, which
    converts, keeps its classic members and splits 2/2/2; it leaves, and the group converts
    back and splits 3/3 between the two classic members. No partition is owned by two members
    at any time, and every acknowledged record is consumed."""
    topic, group = "kip848-online", "kip848-online-group"
    cluster.create_topic(topic, partitions=6, rf=3)
    cluster.wait_topic(topic, 6)
    members = []
    feeder = Feeder(cluster.bootstrap, topic, 6, "online", rate=300)
    try:
        members = [Member(cluster, group, topic, assignor="classic:cooperative-sticky") for _ in range(2)]
        wait_split(members, 6, [3, 3])
        view = consumer_view(cluster, group, lambda v: v["state"] == "Stable")
        assert view["group_protocol"] == "classic", view
        feeder.start()
        wait_for("records flowing", 30, lambda: feeder.count() >= 300)

        started = time.monotonic()
        members.append(Member(cluster, group, topic, assignor="uniform"))
        wait_split(members, 6, [2, 2, 2])
        print(f"upgrade: 2/2/2 {time.monotonic() - started:.2f} s after the new member's process started")
        view = consumer_view(cluster, group, lambda v: v["state"] == "Stable" and len(v["members"]) == 3)
        assert view["group_protocol"] == "consumer", view
        assert sorted(m["member_type"] for m in view["members"]) == ["classic", "classic", "consumer"], view

        started = time.monotonic()
        members[2].leave()
        wait_split(members[:2], 6, [3, 3])
        print(f"downgrade: 3/3 {time.monotonic() - started:.2f} s after the new member was told to leave")
        view = consumer_view(cluster, group, lambda v: v["group_protocol"] == "classic" and v["state"] == "Stable")
        assert len(view["members"]) == 2, view
        acked = feeder.stop()
        wait_for("every acknowledged record consumed", 60,
                 lambda: {v.decode() for v in acked} <= set().union(*(m.consumed() for m in members)))
        assert check_exclusive(members) >= 6, "the timeline has the members' callbacks"
    finally:
        feeder.stop_event.set()
        for m in members:
            m.stop()
