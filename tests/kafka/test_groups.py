"""Consumer groups (classic protocol) with real clients and by hand: the range assignor
splits 8 partitions 3/3/2 and every record reaches exactly one member; members joining
and leaving mid-stream lose nothing; the coordinator's broker SIGKILLed costs a
rediscovery, never a committed offset; restarted and static members resume where they
were; the coordinator's error codes for bad requests; the admin API, the CLI, the lag
metric, and both libraries' admin clients."""
import concurrent.futures
import json
import re
import subprocess
import threading
import time

import confluent_kafka as ck
import kafka as kp
import kafka.errors as kp_errors
import pytest
from confluent_kafka import KafkaError, KafkaException
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.structs import OffsetAndMetadata
from kafka.structs import TopicPartition as KpTopicPartition

import clients
import harness
import wire
from harness import FAST, wait_for

# Kafka error codes the coordinator answers with.
NONE = 0
OFFSET_METADATA_TOO_LARGE = 12
NOT_COORDINATOR = 16
ILLEGAL_GENERATION = 22
UNKNOWN_MEMBER_ID = 25
INVALID_SESSION_TIMEOUT = 26
REBALANCE_IN_PROGRESS = 27
NON_EMPTY_GROUP = 68
GROUP_ID_NOT_FOUND = 69
MEMBER_ID_REQUIRED = 79
GROUP_MAX_SIZE_REACHED = 81
FENCED_INSTANCE_ID = 82
GROUP_SUBSCRIBED_TO_TOPIC = 86

OFFSETS_PARTITIONS = 4
MIN_SESSION_MS, MAX_SESSION_MS = 2000, 60000
MAX_GROUP_SIZE = 3
# Fast groups: a short initial rebalance delay, few offsets partitions, a session-timeout
# window the tests can step out of on both sides, at most 3 members a group.
GROUP_SETTINGS = FAST + (
    "group.initial.rebalance.delay.ms=300",
    f"offsets.topic.num.partitions={OFFSETS_PARTITIONS}",
    f"group.min.session.timeout.ms={MIN_SESSION_MS}",
    f"group.max.session.timeout.ms={MAX_SESSION_MS}",
    f"group.max.size={MAX_GROUP_SIZE}",
)

# Commit failures a member may see while its group rebalances (they cost re-delivery,
# never a skipped record); anything else is a bug.
REBALANCE_COMMIT_ERRORS = {"REBALANCE_IN_PROGRESS", "ILLEGAL_GENERATION", "UNKNOWN_MEMBER_ID",
                           "RebalanceInProgressError", "IllegalGenerationError", "UnknownMemberIdError",
                           "CommitFailedError"}


@pytest.fixture(scope="module")
def groups(tmp_path_factory):
    """One node with the fast group settings above."""
    c = harness.start(tmp_path_factory.mktemp("groups"), 1, GROUP_SETTINGS)
    yield c
    c.close()


# ---- helpers: the coordinator, the admin view, the CLI, metrics ------------------------------

def find_coordinator(cluster, group, timeout=30, exclude=()):
    """(node id, (host, port)) of the group's coordinator, as the first running node that
    answers FindCoordinator without error says (the first ask creates __consumer_offsets;
    until its partition has a leader the answer is COORDINATOR_NOT_AVAILABLE), once the
    coordinator has loaded the group's partition (OffsetFetch no longer answers
    COORDINATOR_LOAD_IN_PROGRESS, which clients retry)."""
    seen = []

    def ask():
        for nid in cluster.running():
            try:
                err, node, host, port = wire.find_coordinator(cluster.node(nid).kafka_addr, group)
                seen.append((nid, wire.error_name(err), node))
                if err != NONE or node in exclude or node not in cluster.running():
                    continue
                ferr, _ = wire.offset_fetch((host, port), group, None)
                seen.append((nid, "OffsetFetch", wire.error_name(ferr)))
                if ferr == NONE:
                    return node, (host, port)
            except (OSError, ValueError) as e:
                seen.append((nid, repr(e)))
        return None

    try:
        return wait_for(f"a coordinator for group {group}", timeout, ask, interval=0.1)
    except TimeoutError as e:
        raise AssertionError(f"{e}; last answers (node asked, error, coordinator): {seen[-6:]}") from None


def group_view(cluster, group, via=1):
    status, body = cluster.get(via, f"/v1/groups/{group}", timeout=10)
    return body if status == 200 else None


def admin_assignment(view, topic):
    """{client_id: sorted partitions of topic} of the members in an admin group view."""
    out = {}
    for m in view["members"]:
        parts = sorted(p for a in m["assignment"] if a["topic"] == topic for p in a["partitions"])
        out[m["client_id"]] = parts
    return out


def admin_offsets(view):
    return {(o["topic"], o["partition"]): o for o in view["offsets"]}


def strom_cli(cluster, *args, via=1):
    r = subprocess.run([harness.strom_bin(), *args, "--admin-url", f"http://{cluster.node(via).admin}"],
                       capture_output=True, text=True, timeout=30)
    return r.returncode, r.stdout, r.stderr


_GAUGE = re.compile(r'^strom_consumer_group_lag\{([^}]*)\}\s+(\S+)\s*$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def lag_gauges(cluster, group, via=1):
    """{(topic, partition): lag} of the strom_consumer_group_lag gauges of a group."""
    status, text = cluster.get(via, "/metrics", timeout=10)
    assert status == 200, f"/metrics: {status}"
    out = {}
    for line in str(text).splitlines():
        m = _GAUGE.match(line)
        if m:
            labels = dict(_LABEL.findall(m.group(1)))
            if labels.get("group") == group:
                out[(labels.get("topic"), int(labels.get("partition", -1)))] = float(m.group(2))
    return out


def produce(bootstrap, topic, records):
    """records = [(partition, value)], values unique; waits for every delivery."""
    p = clients.confluent_producer(bootstrap)
    failed = []
    for part, value in records:
        while True:
            try:
                p.produce(topic, value=value, partition=part, on_delivery=lambda e, m: failed.append(e) if e else None)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0, "records still undelivered after 60 s"
    assert not failed, f"{len(failed)} deliveries failed, first {failed[:3]}"


class Feeder(threading.Thread):
    """Produces unique values round robin over `partitions` at about `rate` records/s until
    stopped; `acked` lists (partition, offset, value) of acknowledged records."""

    def __init__(self, bootstrap, topic, partitions, prefix, rate=1000, **conf):
        super().__init__(name=f"feeder-{prefix}", daemon=True)
        self.topic, self.partitions, self.prefix, self.rate = topic, partitions, prefix, rate
        self.producer = clients.confluent_producer(bootstrap, **dict({"enable.idempotence": True}, **conf))
        self.acked, self.failed = [], []
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.error = None

    def _done(self, err, msg):
        with self.lock:
            if err:
                self.failed.append(err)
            else:
                self.acked.append((msg.partition(), msg.offset(), msg.value()))

    def run(self):
        try:
            start, i = time.monotonic(), 0
            while not self.stop_event.is_set():
                while i < (time.monotonic() - start) * self.rate and not self.stop_event.is_set():
                    try:
                        self.producer.produce(self.topic, value=f"{self.prefix}-{i:07d}".encode(),
                                              partition=i % self.partitions, on_delivery=self._done)
                        i += 1
                    except BufferError:
                        break
                self.producer.poll(0.01)
        except BaseException as e:  # noqa: BLE001 - reported by stop()
            self.error = e

    def count(self):
        with self.lock:
            return len(self.acked)

    def stop(self, timeout=60):
        """Stops producing, waits for every delivery; returns the acknowledged values."""
        self.stop_event.set()
        self.join(30)
        assert not self.is_alive(), "the feeder thread did not stop"
        assert self.error is None, f"the feeder failed: {self.error!r}"
        assert self.producer.flush(timeout) == 0, f"records still undelivered after {timeout} s"
        assert not self.failed, f"{len(self.failed)} deliveries failed, first {self.failed[:3]}"
        return {v for _, _, v in self.acked}


class Member(threading.Thread):
    """One member of a consumer group, in its own thread with its own client (kind =
    "confluent" or "kafka-python"), range assignor, subscribed to one topic.

    It polls until stopped and records what it read (`records`: (partition, offset, value)),
    each assignment it was given (`assignments`), each revocation and its current
    assignment as its client reports it (`assignment`, sorted partitions, None before the
    first). With commit=True it commits synchronously after processing each batch (the
    offsets after the records just recorded) and, confluent-kafka only, on revocation what
    it processed of the revoked partitions. When stopped (also on failure) it closes its
    client, which leaves the group (a static member does not)."""

    def __init__(self, kind, bootstrap, group, topic, client_id, commit=True, **conf):
        super().__init__(name=client_id, daemon=True)
        self.kind, self.bootstrap, self.group, self.topic, self.client_id = kind, bootstrap, group, topic, client_id
        self.commit, self.conf = commit, conf
        self.lock = threading.Lock()
        self.records = []
        self.assignment = None
        self.member_id = None  # as the client reports it (confluent-kafka only)
        self.assignments, self.revocations = [], []
        self.commits = []  # (monotonic time, {partition: offset}) of successful commits
        self.commit_errors = []  # (monotonic time, error name)
        self.client_errors = []
        self.processed = {}  # partition -> offset after the last record processed
        self.stop_event = threading.Event()
        self.error = None

    # -- the thread

    def run(self):
        try:
            if self.kind == "confluent":
                self._run_confluent()
            else:
                self._run_kafka_python()
        except BaseException as e:  # noqa: BLE001 - reported by check()
            self.error = e

    def _process(self, batch):
        done = {}
        with self.lock:
            for part, offset, value in batch:
                self.records.append((part, offset, value))
                done[part] = offset + 1
            self.processed.update(done)
        return done

    def _assigned(self, parts):
        with self.lock:
            self.assignments.append(sorted(parts))

    def _revoked(self, parts, commit):
        with self.lock:
            todo = {p: self.processed[p] for p in parts if p in self.processed}
            self.revocations.append(sorted(parts))
        if self.commit and todo:
            commit(todo)
        with self.lock:
            for p in parts:
                self.processed.pop(p, None)

    def _committed(self, offsets, error):
        with self.lock:
            if error is None:
                self.commits.append((time.monotonic(), dict(offsets)))
            else:
                self.commit_errors.append((time.monotonic(), error))

    def _run_confluent(self):
        conf = {"bootstrap.servers": self.bootstrap, "group.id": self.group, "client.id": self.client_id,
                "partition.assignment.strategy": "range", "enable.auto.commit": False,
                "auto.offset.reset": "earliest", "enable.partition.eof": False, "fetch.wait.max.ms": 100,
                "heartbeat.interval.ms": 300, "session.timeout.ms": 10000, "max.poll.interval.ms": 30000,
                "socket.timeout.ms": 10000, "error_cb": lambda e: self.client_errors.append(e)}
        conf.update(self.conf)
        c = ck.Consumer(conf)

        def commit(offsets):
            tps = [ck.TopicPartition(self.topic, p, o) for p, o in sorted(offsets.items())]
            try:
                res = c.commit(offsets=tps, asynchronous=False)
            except KafkaException as e:
                self._committed(offsets, e.args[0].name())
                return
            bad = [tp.error.name() for tp in res or [] if tp.error]
            self._committed(offsets, bad[0] if bad else None)

        def on_assign(consumer, parts):
            self._assigned([p.partition for p in parts])

        def on_revoke(consumer, parts):
            self._revoked([p.partition for p in parts], commit)

        try:
            c.subscribe([self.topic], on_assign=on_assign, on_revoke=on_revoke)
            while not self.stop_event.is_set():
                batch = []
                for m in c.consume(num_messages=500, timeout=0.2):
                    if m.error():
                        self.client_errors.append(m.error())
                    else:
                        batch.append((m.partition(), m.offset(), m.value()))
                done = self._process(batch)
                if self.commit and done:
                    commit(done)
                self.assignment = sorted(tp.partition for tp in c.assignment())
                self.member_id = c.memberid() or None
        finally:
            c.close()

    def _run_kafka_python(self):
        member = self
        c = kp.KafkaConsumer(bootstrap_servers=self.bootstrap, group_id=self.group, client_id=self.client_id,
                             partition_assignment_strategy=[RangePartitionAssignor], enable_auto_commit=False,
                             auto_offset_reset="earliest", fetch_max_wait_ms=100, heartbeat_interval_ms=300,
                             session_timeout_ms=10000, max_poll_interval_ms=30000, request_timeout_ms=30000,
                             **self.conf)

        def commit(offsets):
            try:
                c.commit({KpTopicPartition(self.topic, p): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()})
            except kp_errors.KafkaError as e:
                self._committed(offsets, type(e).__name__)
                return
            self._committed(offsets, None)

        # kafka-python 3 runs listeners on its IO thread, where a blocking commit is refused
        # (RuntimeError "Cannot block on net.run() from the IO thread"); nothing needs it:
        # this loop commits right after processing each batch, so at a revocation (inside
        # poll) everything processed is already committed.
        class Listener(kp.ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked):
                member._revoked([tp.partition for tp in revoked], lambda offsets: None)

            def on_partitions_assigned(self, assigned):
                member._assigned([tp.partition for tp in assigned])

        try:
            c.subscribe([self.topic], listener=Listener())
            while not self.stop_event.is_set():
                batch = []
                for tp, msgs in c.poll(timeout_ms=200).items():
                    batch += [(m.partition, m.offset, m.value) for m in msgs]
                done = self._process(batch)
                if self.commit and done:
                    commit(done)
                self.assignment = sorted(tp.partition for tp in c.assignment())
        finally:
            c.close(autocommit=False, timeout_ms=10000)

    # -- the test's side

    def check(self):
        if self.error is not None:
            raise AssertionError(f"member {self.client_id} failed: {self.error!r}")
        if not self.is_alive() and not self.stop_event.is_set():
            raise AssertionError(f"member {self.client_id} stopped by itself")

    def values(self):
        with self.lock:
            return [v for _, _, v in self.records]

    def snapshot(self):
        with self.lock:
            return list(self.records)

    def stop(self, timeout=60):
        self.stop_event.set()
        self.join(timeout)
        assert not self.is_alive(), f"member {self.client_id} did not close within {timeout} s"
        self.check()


class Running:
    """Starts members; stops all of them (together, so that their closes do not wait on each
    other's rebalances) when the block ends, also on failure."""

    def __init__(self, *members):
        self.members = list(members)

    def add(self, member):
        self.members.append(member)
        member.start()
        return member

    def __enter__(self):
        for m in self.members:
            m.start()
        return self

    def __exit__(self, *exc):
        for m in self.members:
            m.stop_event.set()
        for m in self.members:
            m.join(60)
        return False


def wait_assigned(cluster, group, members, topic, partitions, timeout=60, via=1):
    """Waits until the admin view shows the group Stable with exactly these members, each
    member's own client reports the partitions (and, for confluent-kafka, the member id) the
    admin view gives its client id, and together they hold 0..partitions-1 once each;
    returns the admin view."""
    last = {}

    def check():
        for m in members:
            m.check()
        view = group_view(cluster, group, via=via)
        own = {m.client_id: m.assignment for m in members}
        last.update(view=view, own={m.client_id: (m.member_id, m.assignment) for m in members})
        if not view or view["state"] != "Stable" or len(view["members"]) != len(members):
            return None
        if admin_assignment(view, topic) != own:
            return None
        ids = {m["client_id"]: m["member_id"] for m in view["members"]}
        if any(m.member_id is not None and ids.get(m.client_id) != m.member_id for m in members):
            return None
        held = sorted(p for ps in own.values() for p in ps)
        return view if held == list(range(partitions)) else None

    try:
        return wait_for(f"group {group} Stable with {len(members)} members holding {partitions} partitions", timeout,
                        check, interval=0.1)
    except TimeoutError as e:
        raise AssertionError(f"{e}\nlast admin view: {json.dumps(last.get('view'))}\n"
                             f"the members' own assignments: {last.get('own')}") from None


def poll_code(what, timeout, f, want):
    """Calls f() until it returns `want`; fails naming every other answer seen."""
    seen = []

    def check():
        code = f()
        seen.append(code)
        return code == want

    try:
        wait_for(what, timeout, check, interval=0.05)
    except TimeoutError as e:
        raise AssertionError(f"{e}; answers: {sorted(set(map(str, seen)))}") from None


# ---- clients in groups -------------------------------------------------------------------------

@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["confluent", "kafka-python"])
def test_range_assignor_splits_eight_partitions_and_each_record_reaches_one_member(groups, kind):
    topic, group, other = f"range-{kind}", f"range-{kind}", f"range-{kind}-second"
    groups.create_topic(topic, partitions=8)
    groups.wait_topic(topic, 8)
    members = [Member(kind, groups.bootstrap, group, topic, f"{kind}-member-{i}") for i in range(3)]
    with Running(*members) as running:
        view = wait_assigned(groups, group, members, topic, 8)
        sizes = sorted(len(m.assignment) for m in members)
        assert sizes == [2, 3, 3], (
            f"range over 8 partitions and 3 members: {[(m.client_id, m.assignment) for m in members]}")
        assert view["protocol"] == "range", view
        assert view["generation"] >= 1, view
        listed = {g["group_id"]: g for g in groups.get(1, "/v1/groups")[1]}
        assert listed.get(group) == {"group_id": group, "group_protocol": "classic", "state": "Stable", "members": 3,
                                     "protocol": "range"}, listed
        generation = view["generation"]

        # Produced once the group is stable: every record is read by the member holding its
        # partition, by no other, and once.
        owner = {p: m for m in members for p in m.assignment}
        records = [(i % 8, f"{kind}-{i:05d}".encode()) for i in range(4000)]
        produce(groups.bootstrap, topic, records)
        second = running.add(Member(kind, groups.bootstrap, other, topic, f"{kind}-second"))
        want = {v for _, v in records}

        def all_read():
            for m in members + [second]:
                m.check()
            return want <= set(v for m in members for v in m.values()) and want <= set(second.values())

        wait_for("every record read by the group and by the second group", 60, all_read, interval=0.2)
        by_value = {}
        for m in members:
            for part, offset, value in m.snapshot():
                by_value.setdefault(value, []).append((m.client_id, part, offset))
        twice = {v: w for v, w in by_value.items() if len(w) > 1}
        view_now = group_view(groups, group)
        assert not twice, (f"{len(twice)} records read more than once in group {group} (generation {generation} -> "
                           f"{view_now and view_now['generation']}), e.g. {list(twice.items())[:3]}")
        strays = [(m.client_id, part) for m in members for part, _, _ in m.snapshot() if owner[part] is not m]
        assert not strays, f"records read by a member not holding their partition: {strays[:5]}"
        assert sorted(second.values()) == sorted(want), (
            f"the second group read {len(second.values())} records ({len(set(second.values()))} distinct) "
            f"of {len(want)}")

        # Committed after processing: every partition's committed offset reaches its log end.
        def caught_up():
            v = group_view(groups, group)
            offs = admin_offsets(v) if v else {}
            rows = [offs.get((topic, p)) for p in range(8)]
            ok = all(r and r["committed"] == 500 and r["log_end_offset"] == 500 and r["lag"] == 0 for r in rows)
            return v if ok else None

        view = wait_for(f"group {group}'s committed offsets at the log end (lag 0) in the admin view", 30, caught_up)
        assert view["generation"] == generation, f"the group rebalanced while consuming: {generation} -> {view}"
        wait_for("strom_consumer_group_lag 0 for the 8 partitions", 30,
                 lambda: lag_gauges(groups, group) == {(topic, p): 0.0 for p in range(8)})


@pytest.mark.timeout(150)
def test_members_joining_and_leaving_mid_stream_skip_nothing(groups):
    topic = group = "churn"
    partitions = 6
    groups.create_topic(topic, partitions=partitions)
    groups.wait_topic(topic, partitions)
    feeder = Feeder(groups.bootstrap, topic, partitions, "churn", rate=800)
    a = Member("confluent", groups.bootstrap, group, topic, "churn-a")
    b = Member("confluent", groups.bootstrap, group, topic, "churn-b")
    with Running(a) as running:
        feeder.start()
        try:
            wait_assigned(groups, group, [a], topic, partitions)
            wait_for("member a to read 500 records", 30, lambda: a.check() or len(a.values()) >= 500)
            first_gen = group_view(groups, group)["generation"]

            running.add(b)
            view = wait_assigned(groups, group, [a, b], topic, partitions)
            assert view["generation"] > first_gen, view
            assert sorted(map(len, (a.assignment, b.assignment))) == [3, 3], (a.assignment, b.assignment)
            n_b = len(b.values())
            wait_for("member b to read records of its own", 30, lambda: b.check() or len(b.values()) >= n_b + 200)

            a.stop()  # commits what it processed on revocation, leaves the group
            view = wait_assigned(groups, group, [b], topic, partitions)
            assert view["generation"] >= first_gen + 2, view
            n_b = len(b.values())
            wait_for("member b to read records after a left", 30, lambda: b.check() or len(b.values()) >= n_b + 200)
        finally:
            produced = feeder.stop()

        def everything_read():
            b.check()
            return produced <= set(a.values()) | set(b.values())

        try:
            wait_for(f"all {len(produced)} records read by a or b", 60, everything_read, interval=0.2)
        except TimeoutError:
            missing = sorted(produced - set(a.values()) - set(b.values()))
            raise AssertionError(f"{len(missing)} of {len(produced)} records never read, e.g. {missing[:5]}") from None
        end = {}
        t = groups.topic(topic)
        for p in t["partitions"]:
            end[p["partition"]] = p["high_watermark"]

        def committed_at_end():
            v = group_view(groups, group)
            offs = admin_offsets(v) if v else {}
            return all(offs.get((topic, p), {}).get("committed") == end[p] for p in range(partitions))

        wait_for("b's commits to reach the log end of every partition", 30, committed_at_end)
        errors = [e for _, e in a.commit_errors + b.commit_errors]
        assert set(errors) <= REBALANCE_COMMIT_ERRORS, f"unexpected commit errors: {errors}"
        # b was given 3 partitions, then all 6, and a's partitions were revoked when it left.
        assert b.assignments[-1] == list(range(partitions)), b.assignments
        assert a.revocations and sorted(a.revocations[-1]) == sorted(a.assignments[-1]), (a.assignments, a.revocations)
        dup = len(a.values()) + len(b.values()) - len(set(a.values()) | set(b.values()))
        print(f"churn: {len(produced)} records, {dup} read twice, commit errors {errors}")


@pytest.mark.timeout(200)
def test_coordinator_killed_group_moves_and_no_commit_goes_back(make_cluster):
    cluster = make_cluster(3, FAST + ("offsets.topic.replication.factor=3",
                                      f"offsets.topic.num.partitions={OFFSETS_PARTITIONS}",
                                      "group.initial.rebalance.delay.ms=0"))
    topic, group, partitions = "orders", "survivors", 3
    cluster.create_topic(topic, partitions=partitions, rf=3, configs={"min.insync.replicas": "2"})
    cluster.wait_topic(topic, partitions)
    tps = [(topic, p) for p in range(partitions)]

    # The committed offsets as the coordinator of the moment reports them, every 100 ms.
    snapshots, watch_errors = [], []
    stop_watch = threading.Event()

    def watch():
        while not stop_watch.is_set():
            for nid in cluster.running():
                try:
                    err, node, host, port = wire.find_coordinator(cluster.node(nid).kafka_addr, group, timeout=3)
                    if err != NONE:
                        continue
                    gerr, offs = wire.offset_fetch((host, port), group, tps, timeout=3)
                    if gerr == NONE and all(offs.get(tp, (0, 0, 1))[2] == NONE for tp in tps):
                        snapshots.append((time.monotonic(), node, {p: offs[(topic, p)][0] for _, p in tps}))
                    else:
                        watch_errors.append((node, gerr, offs))
                    break
                except (OSError, ValueError) as e:
                    watch_errors.append((nid, repr(e)))
            stop_watch.wait(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    feeder = Feeder(cluster.bootstrap, topic, partitions, "orders", rate=400)
    a = Member("confluent", cluster.bootstrap, group, topic, "survivor-a")
    try:
        with Running(a) as running:
            feeder.start()
            coord, _ = find_coordinator(cluster, group)
            watcher.start()
            wait_assigned(cluster, group, [a], topic, partitions)
            wait_for("commits on every partition", 30,
                     lambda: a.check() or (snapshots and all(o > 0 for o in snapshots[-1][2].values())))

            # The coordinator is the leader of the group's __consumer_offsets partition.
            offsets_topic = cluster.topic("__consumer_offsets")
            assert offsets_topic is not None, "GET /v1/topics/__consumer_offsets: not found"
            assert len(offsets_topic["partitions"]) == OFFSETS_PARTITIONS, offsets_topic
            assert all(len(p["replicas"]) == 3 for p in offsets_topic["partitions"]), offsets_topic
            home = wire.offsets_partition_for(group, OFFSETS_PARTITIONS)
            assert offsets_topic["partitions"][home]["leader"] == coord, (
                f"FindCoordinator says node {coord}; partition {home} of __consumer_offsets is led by "
                f"{offsets_topic['partitions'][home]['leader']}")
            # Another node refuses group requests with NOT_COORDINATOR.
            other = next(n for n in (1, 2, 3) if n != coord)
            other_addr = cluster.node(other).kafka_addr
            assert wire.heartbeat(other_addr, group, 1, "someone") == NOT_COORDINATOR
            assert wire.offset_fetch(other_addr, group, tps)[0] == NOT_COORDINATOR
            assert set(wire.offset_commit(other_addr, group, {tps[0]: (0, None)}).values()) == {NOT_COORDINATOR}

            before = snapshots[-1][2]
            kill_at = time.monotonic()
            cluster.kill(coord)
            new, new_addr = find_coordinator(cluster, group, timeout=30, exclude=(coord,))
            assert new != coord
            wait_for("a commit by the member through the new coordinator", 45,
                     lambda: a.check() or any(t > kill_at for t, _ in a.commits), interval=0.1)
            recovered = next(t for t, _ in a.commits if t > kill_at) - kill_at
            wait_for("the committed offsets to move past those before the kill", 30,
                     lambda: snapshots[-1][0] > kill_at and any(snapshots[-1][2][p] > before[p] for p in before))
            produced = feeder.stop()

            wait_for(f"all {len(produced)} records read", 60, lambda: a.check() or produced <= set(a.values()),
                     interval=0.2)
            survivor = cluster.running()[0]
            end = {p["partition"]: p["high_watermark"] for p in cluster.topic(topic, via=survivor)["partitions"]}

            def committed_end():
                err, offs = wire.offset_fetch(new_addr, group, tps)
                return err == NONE and {p: offs[(topic, p)][0] for _, p in tps} == end

            wait_for("the committed offsets at the log end", 30, committed_end)
            a.stop()
            running.members.remove(a)

            # The admin API of a surviving node shows the same offsets.
            view = wait_for("the admin view of the group on a survivor", 15,
                            lambda: group_view(cluster, group, via=survivor))
            assert {o["partition"]: o["committed"] for o in view["offsets"]} == end, view

            # A new member resumes exactly where the group committed.
            more = [(i % partitions, f"after-{i:04d}".encode()) for i in range(300)]
            produce(cluster.bootstrap, topic, more)
            b = running.add(Member("confluent", cluster.bootstrap, group, topic, "survivor-b"))
            wait_for("the new member to read the 300 new records", 60,
                     lambda: b.check() or len(b.values()) >= 300, interval=0.2)
            firsts = {}
            for part, offset, _ in b.snapshot():
                firsts.setdefault(part, offset)
            assert firsts == end, f"the new member started at {firsts}; the group had committed {end}"
            assert sorted(b.values()) == sorted(v for _, v in more), (
                "the new member read other records than the new ones")
    finally:
        stop_watch.set()
        if watcher.is_alive():
            watcher.join(15)
        if feeder.is_alive():
            feeder.stop_event.set()
            feeder.join(30)

    # No committed offset ever went backwards, across the change of coordinator.
    backwards = []
    for (t0, n0, o0), (t1, n1, o1) in zip(snapshots, snapshots[1:]):
        for p in o0:
            if o1[p] < o0[p]:
                backwards.append((p, o0[p], f"node {n0}", o1[p], f"node {n1}", round(t1 - kill_at, 2)))
    assert not backwards, f"committed offsets went back (partition, before, after, s after the kill): {backwards[:5]}"
    after_kill = [o for t, n, o in snapshots if t > kill_at]
    assert after_kill and all(after_kill[0][p] >= before[p] for p in before), (before, after_kill[:1])
    print(f"coordinator {coord} killed: new coordinator {new}, first commit through it after {recovered:.2f} s")


@pytest.mark.timeout(120)
def test_restarted_consumer_resumes_where_it_committed(cluster):
    """On the default group settings (50 offsets partitions, 3 s initial rebalance delay)."""
    topic, group = "resume", "resume-group"
    cluster.create_topic(topic, partitions=2)
    cluster.wait_topic(topic, 2)
    produce(cluster.bootstrap, topic, [(i % 2, f"resume-{i:04d}".encode()) for i in range(400)])
    conf = dict(group_id=group, partition_assignment_strategy=[RangePartitionAssignor], heartbeat_interval_ms=500,
                session_timeout_ms=10000)

    def read(consumer, n, timeout=60):
        got = {0: [], 1: []}
        deadline = time.monotonic() + timeout
        while sum(map(len, got.values())) < n:
            assert time.monotonic() < deadline, f"read {sum(map(len, got.values()))} of {n} records in {timeout} s"
            for tp, msgs in consumer.poll(timeout_ms=300).items():
                got[tp.partition] += [m.offset for m in msgs]
        return got

    c1 = clients.kp_consumer(cluster.bootstrap, client_id="resume-1", **conf)
    try:
        c1.subscribe([topic])
        got = read(c1, 400)
        assert got == {0: list(range(200)), 1: list(range(200))}
        # Processed up to 120 and 80: commit that, then stop without committing the rest.
        c1.commit({KpTopicPartition(topic, 0): OffsetAndMetadata(120, "resume-test", -1),
                   KpTopicPartition(topic, 1): OffsetAndMetadata(80, "", -1)})
    finally:
        c1.close(autocommit=False, timeout_ms=10000)

    offsets_topic = cluster.topic("__consumer_offsets")
    assert offsets_topic is not None, "GET /v1/topics/__consumer_offsets: not found"
    assert len(offsets_topic["partitions"]) == 50, "offsets.topic.num.partitions defaults to 50"
    assert all(len(p["replicas"]) == 1 for p in offsets_topic["partitions"]), "replication factor min(3, 1 broker)"
    coord, addr = find_coordinator(cluster, group)
    err, offs = wire.offset_fetch(addr, group, [(topic, 0), (topic, 1)])
    assert err == NONE and offs == {(topic, 0): (120, "resume-test", NONE), (topic, 1): (80, "", NONE)}, offs
    view = group_view(cluster, group)
    assert view and view["state"] == "Empty" and view["members"] == [], view
    assert sorted((o["partition"], o["committed"], o["log_end_offset"], o["lag"]) for o in view["offsets"]) == [
        (0, 120, 200, 80), (1, 80, 200, 120)], view

    c2 = clients.kp_consumer(cluster.bootstrap, client_id="resume-2", **conf)
    try:
        c2.subscribe([topic])
        got = read(c2, 80 + 120)
        assert got == {0: list(range(120, 200)), 1: list(range(80, 200))}, (
            f"after the restart: partition 0 from {got[0][:1]}, {len(got[0])} records; partition 1 from {got[1][:1]}, "
            f"{len(got[1])} records (committed 120 and 80)")
        c2.commit()
    finally:
        c2.close(autocommit=False, timeout_ms=10000)
    err, offs = wire.offset_fetch(addr, group, [(topic, 0), (topic, 1)])
    assert {tp: o[0] for tp, o in offs.items()} == {(topic, 0): 200, (topic, 1): 200}, offs


@pytest.mark.timeout(120)
def test_static_member_restarted_within_the_session_keeps_its_assignment(groups):
    """Two static members (group.instance.id); each in turn is closed and restarted with the
    same instance id well within its session timeout (so one of the two restarts is the
    group leader's). Each time: no rebalance (same generation in the admin view), the
    restarted member gets its partitions back, the other member is neither revoked nor
    reassigned, and the replaced member id is fenced (FENCED_INSTANCE_ID)."""
    topic, group = "static", "static-group"
    groups.create_topic(topic, partitions=4)
    groups.wait_topic(topic, 4)

    def member(name):
        return Member("confluent", groups.bootstrap, group, topic, name,
                      **{"group.instance.id": name, "session.timeout.ms": 30000, "max.poll.interval.ms": 45000})

    current = {"static-a": member("static-a"), "static-b": member("static-b")}
    with Running(*current.values()) as running:
        view = wait_assigned(groups, group, list(current.values()), topic, 4)
        generation = view["generation"]
        parts = {name: m.assignment for name, m in current.items()}
        described = wire.describe_groups(find_coordinator(groups, group)[1], [group])[group]
        assert sorted(m["instance_id"] for m in described["members"]) == ["static-a", "static-b"], described

        for name, other in (("static-a", "static-b"), ("static-b", "static-a")):
            old_id = next(m["member_id"] for m in view["members"] if m["client_id"] == name)
            bystander = current[other]
            events = (len(bystander.assignments), len(bystander.revocations))
            current[name].stop()  # a static member closes without leaving the group
            running.members.remove(current[name])
            view = group_view(groups, group)
            assert view["generation"] == generation and len(view["members"]) == 2, (
                f"closing static member {name} changed the group: generation {generation} -> {view}")

            current[name] = running.add(member(name))
            view = wait_assigned(groups, group, list(current.values()), topic, 4)
            assert current[name].assignment == parts[name], (
                f"restarted static member {name} got {current[name].assignment}, had {parts[name]}")
            assert view["generation"] == generation, (
                f"restarting static member {name}: generation {generation} -> {view['generation']}, a rebalance; "
                f"{other} was given {bystander.assignments} and revoked {bystander.revocations}")
            assert bystander.assignment == parts[other] and (
                len(bystander.assignments), len(bystander.revocations)) == events, (
                f"restarting {name} disturbed {other}: assignments {bystander.assignments}, "
                f"revocations {bystander.revocations}")
            new_id = next(m["member_id"] for m in view["members"] if m["client_id"] == name)
            if new_id != old_id:
                code = wire.heartbeat(find_coordinator(groups, group)[1], group, generation, old_id, instance_id=name)
                assert code == FENCED_INSTANCE_ID, f"heartbeat of {name}'s replaced member id: {wire.error_name(code)}"

        # Both go on reading their own partitions.
        records = [(i % 4, f"static-{i:04d}".encode()) for i in range(400)]
        produce(groups.bootstrap, topic, records)
        members = list(current.values())
        wait_for("both members to read their partitions' records", 30,
                 lambda: [m.check() for m in members] and {v for m in members for v in m.values()} >= {
                     v for _, v in records})
        for name, m in current.items():
            assert {p for p, _, _ in m.snapshot()} <= set(parts[name]), (name, parts[name])


# ---- by hand: the coordinator's answers ------------------------------------------------------

def join_and_sync(addr, group, topic, partitions, **kw):
    """A one-member group by hand: (member id, generation), the member holding `partitions`."""
    j = wire.join(addr, group, [topic], **kw)
    assert j["error"] == NONE, f"JoinGroup: {wire.error_name(j['error'])}"
    assert j["leader"] == j["member_id"] and [m[0] for m in j["members"]] == [j["member_id"]], j
    err, asg = wire.sync_group(addr, group, j["generation"], j["member_id"],
                               [(j["member_id"], wire.consumer_assignment({topic: partitions}))])
    assert err == NONE, f"SyncGroup: {wire.error_name(err)}"
    assert wire.decode_assignment(asg) == {topic: partitions}
    return j["member_id"], j["generation"]


@pytest.mark.timeout(90)
def test_membership_errors_by_hand(groups):
    topic, group = "raw-groups", "raw-group"
    groups.create_topic(topic, partitions=2)
    groups.wait_topic(topic, 2)
    coord, addr = find_coordinator(groups, group)
    assert coord == 1
    # FindCoordinator in every version, batched in v4.
    for v in range(0, 4):
        assert wire.find_coordinator(addr, group, version=v)[:2] == (NONE, 1), f"FindCoordinator v{v}"
    batched = wire.find_coordinators(addr, [group, "raw-other"])
    assert {k: r[:2] for k, r in batched.items()} == {group: (NONE, 1), "raw-other": (NONE, 1)}, batched

    # A dynamic member joining with v4+ may first be given a member id to join with (KIP-394,
    # MEMBER_ID_REQUIRED) or be let in at once; clients handle both.
    first = wire.join_group(addr, group, "", [("range", wire.consumer_subscription([topic]))], version=5)
    assert first["error"] in (NONE, MEMBER_ID_REQUIRED) and first["member_id"], first
    j = first
    if first["error"] == MEMBER_ID_REQUIRED:
        j = wire.join_group(addr, group, first["member_id"], [("range", wire.consumer_subscription([topic]))],
                            version=5)
    assert j["error"] == NONE and j["member_id"] == first["member_id"] and j["leader"] == j["member_id"], j
    assert j["protocol"] == "range" and j["members"] == [(j["member_id"], None, wire.consumer_subscription([topic]))], j
    m1, gen = j["member_id"], j["generation"]
    err, _ = wire.sync_group(addr, group, gen, m1, [(m1, wire.consumer_assignment({topic: [0, 1]}))])
    assert err == NONE
    for v in range(0, 5):
        assert wire.heartbeat(addr, group, gen, m1, version=v) == NONE, f"Heartbeat v{v}"

    assert wire.heartbeat(addr, group, gen, "no-such-member") == UNKNOWN_MEMBER_ID
    assert wire.heartbeat(addr, group, gen - 1, m1) == ILLEGAL_GENERATION
    assert wire.heartbeat(addr, group, gen + 1, m1) == ILLEGAL_GENERATION
    assert wire.sync_group(addr, group, gen, "no-such-member")[0] == UNKNOWN_MEMBER_ID
    assert wire.leave_group(addr, group, "no-such-member", version=0)[0] == UNKNOWN_MEMBER_ID
    assert wire.leave_group(addr, group, "no-such-member", version=3) == (NONE, UNKNOWN_MEMBER_ID)
    for bad in (MIN_SESSION_MS - 1, MAX_SESSION_MS + 1):
        res = wire.join(addr, "raw-session", [topic], session_timeout_ms=bad)
        assert res["error"] == INVALID_SESSION_TIMEOUT, f"session timeout {bad}: {wire.error_name(res['error'])}"
    # Commits of a member: current generation accepted, stale refused, strangers refused.
    tp = (topic, 0)
    assert wire.offset_commit(addr, group, {tp: (3, None)}, generation=gen, member_id=m1) == {tp: NONE}
    assert wire.offset_commit(addr, group, {tp: (4, None)}, generation=gen - 1, member_id=m1) == {
        tp: ILLEGAL_GENERATION}
    assert wire.offset_commit(addr, group, {tp: (4, None)}, generation=gen, member_id="no-such-member") == {
        tp: UNKNOWN_MEMBER_ID}
    err, offs = wire.offset_fetch(addr, group, [tp])
    assert err == NONE and offs[tp][0] == 3 and offs[tp][2] == NONE, offs

    # A second member: the first one's heartbeat says REBALANCE_IN_PROGRESS until it rejoins.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        second = pool.submit(wire.join, addr, group, [topic], rebalance_timeout_ms=20000)
        poll_code("the first member's heartbeat to answer REBALANCE_IN_PROGRESS", 15,
                  lambda: wire.heartbeat(addr, group, gen, m1), REBALANCE_IN_PROGRESS)
        assert not second.done(), f"the second join was answered before the first member rejoined: {second.result()}"
        j1 = wire.join(addr, group, [topic], member_id=m1)
        j2 = second.result(timeout=30)
    assert j1["error"] == NONE and j2["error"] == NONE, (j1, j2)
    assert j1["generation"] == j2["generation"] == gen + 1, (j1["generation"], j2["generation"], gen)
    assert j1["leader"] == j2["leader"], (j1["leader"], j2["leader"])
    m2 = j2["member_id"]
    leader, follower = (j1, j2) if j1["leader"] == m1 else (j2, j1)
    assert sorted(m[0] for m in leader["members"]) == sorted([m1, m2]) and follower["members"] == [], (leader, follower)
    gen2 = j1["generation"]
    plan = {m1: {topic: [0]}, m2: {topic: [1]}}
    err, asg = wire.sync_group(addr, group, gen2, leader["member_id"],
                               [(m, wire.consumer_assignment(a)) for m, a in plan.items()])
    assert err == NONE and wire.decode_assignment(asg) == plan[leader["member_id"]]
    err, asg = wire.sync_group(addr, group, gen2, follower["member_id"])
    assert err == NONE and wire.decode_assignment(asg) == plan[follower["member_id"]]
    assert wire.heartbeat(addr, group, gen2, m1) == NONE and wire.heartbeat(addr, group, gen2, m2) == NONE
    assert wire.heartbeat(addr, group, gen, m1) == ILLEGAL_GENERATION

    view = group_view(groups, group)
    assert view["state"] == "Stable" and view["generation"] == gen2 and view["protocol"] == "range", view
    assert sorted((m["member_id"], m["client_id"], json.dumps(m["assignment"], sort_keys=True))
                  for m in view["members"]) == sorted([
        (m1, "strom-tests", json.dumps([{"topic": topic, "partitions": [0]}], sort_keys=True)),
        (m2, "strom-tests", json.dumps([{"topic": topic, "partitions": [1]}], sort_keys=True))]), view
    assert all(m["host"] for m in view["members"]), view
    described = wire.describe_groups(addr, [group])[group]
    assert described["error"] == NONE and described["state"] == "Stable" and len(described["members"]) == 2, described
    err, listed = wire.list_groups(addr)
    assert err == NONE and (group, "consumer") in listed, listed

    assert wire.delete_groups(addr, [group, "raw-never-existed"]) == {
        group: NON_EMPTY_GROUP, "raw-never-existed": GROUP_ID_NOT_FOUND}

    assert wire.leave_group(addr, group, m1, version=0) == (NONE, None)
    assert wire.leave_group(addr, group, m2, version=3) == (NONE, NONE)
    view = wait_for("the group Empty after both members left", 10,
                    lambda: (lambda v: v if v and v["state"] == "Empty" else None)(group_view(groups, group)))
    assert view["members"] == [], view
    assert wire.delete_groups(addr, [group]) == {group: NONE}
    assert wire.offset_fetch(addr, group, [tp])[1][tp][0] == -1, "the deleted group's offsets are gone"
    status, body = groups.get(1, f"/v1/groups/{group}")
    assert status == 404, (status, body)


@pytest.mark.timeout(60)
def test_static_member_id_replaced_is_fenced_by_hand(groups):
    """Two static members; each in turn rejoins as a new incarnation (empty member id, same
    group.instance.id), follower first, then the leader. Kafka answers both with the
    current generation and the stored assignment, no rebalance (the rejoined leader is
    answered with the old leader id so that it does not assign again), and fences the old
    member id with FENCED_INSTANCE_ID."""
    topic, group = "raw-static", "raw-static-group"
    groups.create_topic(topic, partitions=2)
    groups.wait_topic(topic, 2)
    addr = find_coordinator(groups, group)[1]
    # Short rebalance timeouts: a rebalance these members do not rejoin ends in seconds.
    rt = {"rebalance_timeout_ms": 5000}
    first, gen1 = join_and_sync(addr, group, topic, [0, 1], instance_id="instance-1", **rt)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        second = pool.submit(wire.join, addr, group, [topic], instance_id="instance-2", **rt)
        poll_code("the first member's heartbeat to answer REBALANCE_IN_PROGRESS", 15,
                  lambda: wire.heartbeat(addr, group, gen1, first, instance_id="instance-1"), REBALANCE_IN_PROGRESS)
        j1 = wire.join(addr, group, [topic], member_id=first, instance_id="instance-1", **rt)
        j2 = second.result(timeout=30)
    assert j1["error"] == NONE and j2["error"] == NONE and j1["generation"] == j2["generation"], (j1, j2)
    gen = j1["generation"]
    leader_j, follower_j = (j1, j2) if j1["leader"] == j1["member_id"] else (j2, j1)
    plan = {j1["member_id"]: {topic: [0]}, j2["member_id"]: {topic: [1]}}
    instance = {j1["member_id"]: "instance-1", j2["member_id"]: "instance-2"}
    assert sorted(m[1] for m in leader_j["members"]) == ["instance-1", "instance-2"], leader_j
    err, _ = wire.sync_group(addr, group, gen, leader_j["member_id"],
                             [(m, wire.consumer_assignment(a)) for m, a in plan.items()],
                             instance_id=instance[leader_j["member_id"]])
    assert err == NONE
    err, _ = wire.sync_group(addr, group, gen, follower_j["member_id"], instance_id=instance[follower_j["member_id"]])
    assert err == NONE

    for role, old in (("follower", follower_j["member_id"]), ("leader", leader_j["member_id"])):
        inst = instance[old]
        j = wire.join(addr, group, [topic], instance_id=inst, **rt)
        assert j["error"] == NONE and j["member_id"] != old, (role, j)
        assert j["generation"] == gen, (
            f"the static {role} ({inst}) rejoining the Stable group was answered with generation {j['generation']}, "
            f"not the current {gen}: a rebalance (leader in the answer: {j['leader']!r}, old id {old!r})")
        err, asg = wire.sync_group(addr, group, gen, j["member_id"], instance_id=inst)
        assert err == NONE and wire.decode_assignment(asg) == plan[old], (role, err, asg)
        code = wire.heartbeat(addr, group, gen, old, instance_id=inst)
        assert code == FENCED_INSTANCE_ID, f"heartbeat of the replaced {role} id: {wire.error_name(code)}"
        assert wire.heartbeat(addr, group, gen, j["member_id"], instance_id=inst) == NONE
        view = group_view(groups, group)
        assert view["state"] == "Stable" and view["generation"] == gen, view
        plan[j["member_id"]] = plan.pop(old)
        instance[j["member_id"]] = inst
    for m, inst in instance.items():
        if m in plan:
            wire.leave_group(addr, group, m, instance_id=inst)


@pytest.mark.timeout(60)
def test_silent_member_expires_after_its_session_timeout(groups):
    """A member that stops heartbeating is removed once its session times out: the other
    member is told to rejoin and the group goes on without it."""
    topic, group = "raw-expiry", "raw-expiry-group"
    groups.create_topic(topic, partitions=2)
    groups.wait_topic(topic, 2)
    addr = find_coordinator(groups, group)[1]
    session = {"session_timeout_ms": MIN_SESSION_MS, "rebalance_timeout_ms": 10000}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        joins = [pool.submit(wire.join_group, addr, group, "", [("range", wire.consumer_subscription([topic]))],
                             version=3, **session) for _ in range(2)]
        j1, j2 = (f.result(timeout=30) for f in joins)
    assert j1["error"] == NONE and j2["error"] == NONE and j1["generation"] == j2["generation"], (j1, j2)
    gen = j1["generation"]
    leader, follower = (j1, j2) if j1["leader"] == j1["member_id"] else (j2, j1)
    plan = {leader["member_id"]: {topic: [0]}, follower["member_id"]: {topic: [1]}}
    assert wire.sync_group(addr, group, gen, leader["member_id"],
                           [(m, wire.consumer_assignment(a)) for m, a in plan.items()])[0] == NONE
    assert wire.sync_group(addr, group, gen, follower["member_id"])[0] == NONE
    silent, alive = follower["member_id"], leader["member_id"]
    silent_at = time.monotonic()

    # Only `alive` heartbeats; once `silent`'s session is over the group rebalances.
    poll_code("the live member's heartbeat to answer REBALANCE_IN_PROGRESS", 15,
              lambda: wire.heartbeat(addr, group, gen, alive), REBALANCE_IN_PROGRESS)
    expired_after = time.monotonic() - silent_at
    assert expired_after >= MIN_SESSION_MS / 1000 * 0.9, f"the member was expired after {expired_after:.2f} s"
    j = wire.join(addr, group, [topic], member_id=alive, **session)
    assert j["error"] == NONE and j["generation"] == gen + 1 and [m[0] for m in j["members"]] == [alive], j
    assert wire.sync_group(addr, group, j["generation"], alive,
                           [(alive, wire.consumer_assignment({topic: [0, 1]}))])[0] == NONE
    assert wire.heartbeat(addr, group, j["generation"], silent) == UNKNOWN_MEMBER_ID
    view = group_view(groups, group)
    assert view["state"] == "Stable" and [m["member_id"] for m in view["members"]] == [alive], view
    assert wire.leave_group(addr, group, alive) == (NONE, NONE)


@pytest.mark.timeout(60)
def test_group_max_size(groups):
    topic, group = "raw-full", "raw-full-group"
    groups.create_topic(topic, partitions=1)
    groups.wait_topic(topic, 1)
    addr = find_coordinator(groups, group)[1]
    protocols = [("range", wire.consumer_subscription([topic]))]
    # MAX_GROUP_SIZE members join together (within the initial rebalance delay).
    with concurrent.futures.ThreadPoolExecutor(MAX_GROUP_SIZE) as pool:
        joins = [pool.submit(wire.join_group, addr, group, "", protocols, version=3, rebalance_timeout_ms=10000)
                 for _ in range(MAX_GROUP_SIZE)]
        results = [f.result(timeout=30) for f in joins]
    assert all(r["error"] == NONE for r in results), results
    assert len({r["generation"] for r in results}) == 1, [r["generation"] for r in results]
    members = [r["member_id"] for r in results]
    res = wire.join_group(addr, group, "", protocols, version=3, rebalance_timeout_ms=10000)
    assert res["error"] == GROUP_MAX_SIZE_REACHED, f"a member beyond group.max.size: {wire.error_name(res['error'])}"
    res = wire.join(addr, group, [topic], version=5, rebalance_timeout_ms=10000)
    assert res["error"] == GROUP_MAX_SIZE_REACHED, f"the same with JoinGroup v5: {wire.error_name(res['error'])}"
    view = group_view(groups, group)
    assert len(view["members"]) == MAX_GROUP_SIZE, view
    for m in members:
        wire.leave_group(addr, group, m)


@pytest.mark.timeout(60)
def test_offset_commit_metadata_limit(groups):
    topic = "meta"
    groups.create_topic(topic, partitions=3)
    groups.wait_topic(topic, 3)
    addr = find_coordinator(groups, "meta-big")[1]
    assert find_coordinator(groups, "meta-other")[0] == 1
    res = wire.offset_commit(addr, "meta-big", {(topic, 0): (5, "x" * 10_000), (topic, 1): (6, "ok"),
                                                (topic, 2): (7, "y" * 4096)})
    assert res == {(topic, 0): OFFSET_METADATA_TOO_LARGE, (topic, 1): NONE, (topic, 2): NONE}, res
    assert wire.offset_commit(addr, "meta-big", {(topic, 2): (8, "z" * 4097)}) == {
        (topic, 2): OFFSET_METADATA_TOO_LARGE}
    assert wire.offset_commit(addr, "meta-other", {(topic, 0): (9, "fine")}) == {(topic, 0): NONE}

    err, offs = wire.offset_fetch(addr, "meta-big", [(topic, p) for p in range(3)])
    assert err == NONE
    assert offs[(topic, 0)][0] == -1, f"the refused commit was stored: {offs[(topic, 0)][:1]}"
    assert offs[(topic, 1)] == (6, "ok", NONE) and offs[(topic, 2)] == (7, "y" * 4096, NONE), offs
    assert wire.offset_fetch(addr, "meta-other", [(topic, 0)])[1] == {(topic, 0): (9, "fine", NONE)}

    # Every OffsetCommit / OffsetFetch version this helper speaks.
    for v in range(2, 8):
        assert wire.offset_commit(addr, "meta-other", {(topic, 1): (100 + v, f"v{v}")}, version=v) == {
            (topic, 1): NONE}, f"OffsetCommit v{v}"
        for fv in range(1, 6):
            err, offs = wire.offset_fetch(addr, "meta-other", [(topic, 1)], version=fv)
            assert offs == {(topic, 1): (100 + v, f"v{v}", NONE)}, f"OffsetFetch v{fv} after OffsetCommit v{v}: {offs}"
    err, offs = wire.offset_fetch(addr, "meta-other", None)
    assert err == NONE and {tp: o[0] for tp, o in offs.items()} == {(topic, 0): 9, (topic, 1): 107}, offs


@pytest.mark.timeout(90)
def test_join_group_with_a_2mb_metadata_blob(groups):
    topic, group = "huge-meta", "huge-meta-group"
    groups.create_topic(topic, partitions=1)
    groups.wait_topic(topic, 1)
    node = groups.node(1)
    addr = find_coordinator(groups, group)[1]
    blob = wire.consumer_subscription([topic], user_data=b"\xab" * (2 * 1024 * 1024))
    rss_before = harness.rss_bytes(node.pid)
    try:
        res = first = wire.join_group(addr, group, "", [("range", blob)], version=5, timeout=30)
        if first["error"] == MEMBER_ID_REQUIRED:
            res = wire.join_group(addr, group, first["member_id"], [("range", blob)], version=5, timeout=30)
        outcome = f"error {wire.error_name(res['error'])}"
        refused = res["error"] != NONE
    except (ConnectionError, OSError) as e:
        outcome, refused = f"connection closed ({e!r})", True
    assert refused, (f"a JoinGroup with 2 MB of protocol metadata was accepted: error {res['error']}, generation "
                     f"{res['generation']}, member {res['member_id']!r}, {len(res['members'])} member(s) with "
                     f"{[len(m[2] or b'') for m in res['members']]} bytes of metadata")
    assert node.alive(), f"the broker died ({outcome})"
    assert wire.api_versions(node.kafka_addr), "no ApiVersions answer afterwards"
    assert harness.rss_bytes(node.pid) - rss_before < 256 * 1024 * 1024
    # Another group still works, start to end.
    other = "huge-meta-bystander"
    oaddr = find_coordinator(groups, other)[1]
    m, gen = join_and_sync(oaddr, other, topic, [0])
    assert wire.offset_commit(oaddr, other, {(topic, 0): (1, None)}, generation=gen, member_id=m) == {(topic, 0): NONE}
    assert wire.offset_fetch(oaddr, other, [(topic, 0)])[1][(topic, 0)][0] == 1
    assert wire.leave_group(oaddr, other, m) == (NONE, NONE)
    print(f"2 MB JoinGroup: {outcome}")


# ---- admin API, CLI, metrics, admin clients ------------------------------------------------

@pytest.mark.timeout(90)
def test_admin_api_cli_and_lag_metric(groups):
    topic = "cli-topic"
    groups.create_topic(topic, partitions=2)
    groups.wait_topic(topic, 2)
    produce(groups.bootstrap, topic, [(0, b"a%d" % i) for i in range(10)] + [(1, b"b%d" % i) for i in range(4)])
    addr = find_coordinator(groups, "cli-empty")[1]
    assert find_coordinator(groups, "cli-live")[0] == 1
    assert wire.offset_commit(addr, "cli-empty", {(topic, 0): (7, "m"), (topic, 1): (4, None)}) == {
        (topic, 0): NONE, (topic, 1): NONE}
    live, gen = join_and_sync(addr, "cli-live", topic, [0, 1], session_timeout_ms=MAX_SESSION_MS)
    try:
        status, listed = groups.get(1, "/v1/groups")
        assert status == 200
        mine = {g["group_id"]: g for g in listed if g["group_id"].startswith("cli-")}
        assert mine["cli-empty"]["state"] == "Empty" and mine["cli-empty"]["members"] == 0, mine
        assert mine["cli-live"] == {"group_id": "cli-live", "group_protocol": "classic", "state": "Stable", "members": 1,
                                    "protocol": "range"}, mine

        empty = group_view(groups, "cli-empty")
        assert empty["group_id"] == "cli-empty" and empty["state"] == "Empty" and empty["members"] == [], empty
        assert sorted(empty["offsets"], key=lambda o: o["partition"]) == [
            {"topic": topic, "partition": 0, "committed": 7, "log_end_offset": 10, "lag": 3},
            {"topic": topic, "partition": 1, "committed": 4, "log_end_offset": 4, "lag": 0}], empty
        view = group_view(groups, "cli-live")
        assert (view["state"], view["generation"], view["protocol"]) == ("Stable", gen, "range"), view
        assert [(m["member_id"], m["client_id"], m["assignment"]) for m in view["members"]] == [
            (live, "strom-tests", [{"topic": topic, "partitions": [0, 1]}])], view
        assert view["offsets"] == [], view

        status, body = groups.get(1, "/v1/groups/no-such-group")
        assert status == 404 and isinstance(body, dict) and body.get("error") == "GROUP_ID_NOT_FOUND", (status, body)
        assert body.get("message"), body

        # The CLI prints the API's JSON with --json, tables without.
        code, out, err = strom_cli(groups, "group", "list", "--json")
        assert code == 0, err
        cli_mine = {g["group_id"]: g for g in json.loads(out) if g["group_id"].startswith("cli-")}
        assert cli_mine == mine, (cli_mine, mine)
        code, out, err = strom_cli(groups, "group", "list")
        assert code == 0, err
        rows = [line.split() for line in out.splitlines()]
        assert rows[0][:4] == ["GROUP", "STATE", "MEMBERS", "PROTOCOL"], out
        assert ["cli-live", "Stable", "1", "range"] in rows, out
        assert any(r[:3] == ["cli-empty", "Empty", "0"] for r in rows), out
        code, out, err = strom_cli(groups, "group", "describe", "cli-empty", "--json")
        assert code == 0 and json.loads(out) == empty, (code, out, err)
        code, out, err = strom_cli(groups, "group", "describe", "cli-live")
        assert code == 0, err
        assert "Group: cli-live" in out and "state: Stable" in out and f"generation: {gen}" in out, out
        assert live in out and f"{topic}:0,1" in out, out
        code, out, err = strom_cli(groups, "group", "describe", "cli-empty")
        assert code == 0, err
        assert any(line.split() == [topic, "0", "7", "10", "3"] for line in out.splitlines()), out
        code, out, err = strom_cli(groups, "group", "describe", "no-such-group")
        assert code == 1 and "GROUP_ID_NOT_FOUND" in err, (code, out, err)

        wait_for("the lag gauges of cli-empty", 30,
                 lambda: lag_gauges(groups, "cli-empty") == {(topic, 0): 3.0, (topic, 1): 0.0})
    finally:
        wire.leave_group(addr, "cli-live", live)


@pytest.mark.timeout(120)
def test_admin_clients_list_describe_offsets_and_delete(groups):
    topic = "adm"
    groups.create_topic(topic, partitions=2)
    groups.wait_topic(topic, 2)
    produce(groups.bootstrap, topic, [(i % 2, b"adm-%d" % i) for i in range(20)])
    addr = find_coordinator(groups, "adm-empty")[1]
    assert wire.offset_commit(addr, "adm-empty", {(topic, 0): (3, None), (topic, 1): (5, None)}) == {
        (topic, 0): NONE, (topic, 1): NONE}
    live = Member("confluent", groups.bootstrap, "adm-live", topic, "adm-live-1")
    admin = clients.confluent_admin(groups.bootstrap)
    kadmin = kp.KafkaAdminClient(bootstrap_servers=groups.bootstrap, request_timeout_ms=30000)
    try:
        with Running(live):
            wait_assigned(groups, "adm-live", [live], topic, 2)
            wait_for("adm-live to read the 20 records", 30, lambda: live.check() or len(live.values()) >= 20)

            # confluent-kafka: ListGroups, DescribeGroups, OffsetFetch, DeleteGroups.
            res = admin.list_consumer_groups(request_timeout=30).result(timeout=60)
            assert not res.errors, res.errors
            states = {g.group_id: g.state for g in res.valid}
            assert states.get("adm-live") == ck.ConsumerGroupState.STABLE, states
            assert states.get("adm-empty") == ck.ConsumerGroupState.EMPTY, states
            desc = {g: f.result(timeout=60) for g, f in
                    admin.describe_consumer_groups(["adm-live", "adm-empty"], request_timeout=30).items()}
            d = desc["adm-live"]
            assert d.state == ck.ConsumerGroupState.STABLE and d.partition_assignor == "range", d
            assert d.coordinator.id == 1 and not d.is_simple_consumer_group, d
            assert [(m.client_id, sorted((tp.topic, tp.partition) for tp in m.assignment.topic_partitions))
                    for m in d.members] == [("adm-live-1", [(topic, 0), (topic, 1)])], d.members
            assert desc["adm-empty"].state == ck.ConsumerGroupState.EMPTY and desc["adm-empty"].members == []
            got = admin.list_consumer_group_offsets([ck.ConsumerGroupTopicPartitions("adm-empty")],
                                                    request_timeout=30)["adm-empty"].result(timeout=60)
            assert sorted((tp.topic, tp.partition, tp.offset) for tp in got.topic_partitions) == [
                (topic, 0, 3), (topic, 1, 5)], got.topic_partitions
            for gid, code in (("adm-live", KafkaError.NON_EMPTY_GROUP), ("adm-missing", KafkaError.GROUP_ID_NOT_FOUND)):
                with pytest.raises(KafkaException) as e:
                    admin.delete_consumer_groups([gid], request_timeout=30)[gid].result(timeout=60)
                assert e.value.args[0].code() == code, f"delete {gid}: {e.value.args[0]}"

            # kafka-python: the same, and OffsetDelete.
            listed = {g["group_id"]: g for g in kadmin.list_groups()}
            assert listed["adm-live"]["protocol_type"] == "consumer" and "adm-empty" in listed, listed
            kd = kadmin.describe_groups(["adm-live"])["adm-live"]
            assert kd["error"] is None and kd["group_state"] == "Stable" and kd["protocol_data"] == "range", kd
            assert [m["client_id"] if isinstance(m, dict) else m.client_id for m in kd["members"]] == [
                "adm-live-1"], kd
            offs = kadmin.list_group_offsets("adm-empty")["adm-empty"]
            assert {(tp.topic, tp.partition): o.offset for tp, o in offs.items()} == {(topic, 0): 3, (topic, 1): 5}
            res = kadmin.delete_group_offsets("adm-empty", [KpTopicPartition(topic, 0)])
            assert res == {KpTopicPartition(topic, 0): kp_errors.NoError}, res
            offs = kadmin.list_group_offsets("adm-empty")["adm-empty"]
            assert {(tp.topic, tp.partition): o.offset for tp, o in offs.items()} == {(topic, 1): 5}, offs
            res = kadmin.delete_group_offsets("adm-live", [KpTopicPartition(topic, 0)])
            assert res == {KpTopicPartition(topic, 0): kp_errors.GroupSubscribedToTopicError}, res
            assert kadmin.delete_groups(["adm-empty"]) == {"adm-empty": "OK"}
            assert groups.get(1, "/v1/groups/adm-empty")[0] == 404
        # Once its member has left, the live group can go too.
        view = wait_for("adm-live Empty after its member left", 15,
                        lambda: (lambda v: v if v and v["state"] == "Empty" else None)(group_view(groups, "adm-live")))
        assert view["members"] == []
        assert admin.delete_consumer_groups(["adm-live"], request_timeout=30)["adm-live"].result(timeout=60) is None
        remaining = {g.group_id for g in admin.list_consumer_groups(request_timeout=30).result(timeout=60).valid}
        assert not {"adm-live", "adm-empty"} & remaining, remaining
    finally:
        kadmin.close()
