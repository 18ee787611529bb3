"""Dynamic metadata-quorum voters (KIP-853 semantics) on real clusters: an observer is
promoted and a voter removed under topic-create load with the controller killed in
between, and no acknowledged topic is lost; the voters survive a restart of every node;
changes that would leave no live majority, unknown nodes, duplicates, the last voter
and an observer that has not caught up are refused with clear errors and change nothing."""
import json
import signal
import subprocess
import threading

from harness import FAST, strom_bin, wait_for


def voters(cluster, via):
    status, q = cluster.get(via, "/v1/quorum", timeout=5)
    return sorted(v["id"] for v in q["voters"]) if status == 200 else None


def wait_voters(cluster, expected, timeout=30):
    for nid in cluster.running():
        wait_for(f"voters {expected} on node {nid}", timeout, lambda: voters(cluster, nid) == expected)


class TopicLoad:
    """Creates topics one after another through changing nodes; records each 201."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.created = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        i = 0
        while not self.stop.is_set() and i < 5_000:
            running = self.cluster.running()
            via = running[i % len(running)] if running else 1
            name = f"load-{i:05d}"
            status, _ = self.cluster.send(via, "POST", "/v1/topics",
                                          {"name": name, "partitions": 1, "replication_factor": 1}, timeout=10)
            if status == 201:
                self.created.append(name)
                i += 1
            elif status == 409:
                # Created by an earlier try whose answer was lost.
                self.created.append(name)
                i += 1
            else:
                self.stop.wait(0.1)

    def finish(self):
        self.stop.set()
        self.thread.join(timeout=30)
        return self.created


def test_voters_change_under_load_with_the_controller_killed(make_cluster):
    cluster = make_cluster(4, FAST)
    assert voters(cluster, 1) == [1, 2, 3]
    load = TopicLoad(cluster)
    wait_for("topics being created", 30, lambda: len(load.created) > 10)

    status, q = cluster.send(2, "POST", "/v1/quorum/voters", {"id": 4})
    assert status == 200, q
    assert sorted(v["id"] for v in q["voters"]) == [1, 2, 3, 4] and q["observers"] == [], q
    wait_voters(cluster, [1, 2, 3, 4])

    controller = cluster.cluster_view(1)["controller_id"]
    cluster.kill(controller)
    survivor = next(n for n in (1, 2, 3, 4) if n != controller)
    wait_for("a new controller", 30,
             lambda: (cluster.cluster_view(survivor) or {}).get("controller_id") not in (None, controller))
    before = len(load.created)
    wait_for("topics created under the new controller", 30, lambda: len(load.created) > before + 5)
    cluster.launch(controller)
    cluster.wait_active(timeout=60)

    # Remove the voter that was killed and came back: three voters remain.
    status, q = cluster.send(survivor, "DELETE", f"/v1/quorum/voters/{controller}")
    assert status == 200, q
    remaining = sorted({1, 2, 3, 4} - {controller})
    assert sorted(v["id"] for v in q["voters"]) == remaining, q
    assert [o["id"] for o in q["observers"]] == [controller], q
    wait_voters(cluster, remaining)
    before = len(load.created)
    wait_for("topics created after the removal", 30, lambda: len(load.created) > before + 5)
    created = load.finish()

    # No acknowledged topic is lost, on any node.
    for nid in cluster.running():
        wait_for(f"every created topic on node {nid}", 30, lambda: set(created) <= {
            t["name"] for t in cluster.get(nid, "/v1/topics")[1]})

    # The voters survive a restart of every node; the removed voter's --quorum flag
    # still names it as a voter, and it rejoins as an observer.
    for nid in list(cluster.running()):
        cluster.kill(nid)
    for nid in cluster.nodes:
        cluster.launch(nid)
    cluster.wait_active(timeout=60)
    wait_voters(cluster, remaining)
    status, q = cluster.get(1, "/v1/quorum")
    assert [o["id"] for o in q["observers"]] == [controller], q
    assert set(created) <= {t["name"] for t in cluster.get(1, "/v1/topics")[1]}
    status, _ = cluster.send(1, "POST", "/v1/topics", {"name": "after-restart", "partitions": 1,
                                                      "replication_factor": 1})
    assert status == 201


def test_refused_voter_changes_change_nothing(make_cluster):
    cluster = make_cluster(4, FAST)
    assert voters(cluster, 1) == [1, 2, 3]

    def refused(method, path, body, code, status):
        got_status, got = cluster.send(1, method, path, body)
        assert (got_status, got["error"]) == (status, code), got
        assert got["message"]

    refused("POST", "/v1/quorum/voters", {"id": 9}, "VOTER_NOT_FOUND", 404)
    refused("POST", "/v1/quorum/voters", {"id": 2}, "DUPLICATE_VOTER", 409)
    refused("POST", "/v1/quorum/voters", {"node": 4}, "INVALID_REQUEST", 400)
    refused("DELETE", "/v1/quorum/voters/4", None, "VOTER_NOT_FOUND", 404)
    refused("DELETE", "/v1/quorum/voters/x", None, "INVALID_REQUEST", 400)

    # An observer that is stopped is neither alive nor caught up.
    cluster.signal(4, signal.SIGSTOP)
    try:
        wait_for("node 4 fenced", 30, lambda: any(
            b["id"] == 4 and b["state"] == "fenced" for b in cluster.cluster_view(1)["brokers"]))
        for i in range(5):
            assert cluster.create_topic(f"while-stopped-{i}")
        refused("POST", "/v1/quorum/voters", {"id": 4}, "INVALID_QUORUM_CHANGE", 409)
    finally:
        cluster.signal(4, signal.SIGCONT)

    # With voter 3 down, removing voter 2 would leave {1, 3}: one live voter of two.
    victim = 3 if cluster.cluster_view(1)["controller_id"] != 3 else 2
    other = ({2, 3} - {victim}).pop()
    cluster.kill(victim)
    wait_for(f"node {victim} fenced", 30, lambda: any(
        b["id"] == victim and b["state"] == "fenced" for b in cluster.cluster_view(1)["brokers"]))
    refused("DELETE", f"/v1/quorum/voters/{other}", None, "INVALID_QUORUM_CHANGE", 409)
    assert voters(cluster, 1) == [1, 2, 3]
    # Removing the dead voter itself leaves {1, other}, both alive.
    status, q = cluster.send(1, "DELETE", f"/v1/quorum/voters/{victim}")
    assert status == 200, q
    assert voters(cluster, 1) == sorted([1, other])


def test_the_last_voter_stays_and_the_cli_shows_the_quorum(make_cluster):
    cluster = make_cluster(1, FAST)
    status, body = cluster.send(1, "DELETE", "/v1/quorum/voters/1")
    assert (status, body["error"]) == (409, "INVALID_QUORUM_CHANGE"), body
    admin = ["--admin-url", f"http://{cluster.node(1).admin}"]
    out = subprocess.run([strom_bin(), "quorum", "describe", *admin], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "voter" in out.stdout and "LAG" in out.stdout, out
    out = subprocess.run([strom_bin(), "quorum", "describe", "--json", *admin], capture_output=True, text=True,
                         timeout=30)
    assert [v["id"] for v in json.loads(out.stdout)["voters"]] == [1]
    out = subprocess.run([strom_bin(), "quorum", "remove-voter", "1", *admin], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 1 and "INVALID_QUORUM_CHANGE" in out.stderr, out


def describe_quorum(addr):
    """DescribeQuorum v0 (flexible) of __cluster_metadata-0: (leader, epoch, high watermark,
    voter ids, observer ids)."""
    import wire

    body = wire.carray([wire.cstring("__cluster_metadata") + wire.carray([wire.i32(0) + wire.NO_TAGS])
                        + wire.NO_TAGS]) + wire.NO_TAGS
    r = wire.roundtrip(addr, 55, 0, body, flexible=True)
    assert r.i16() == 0
    assert r.carray_len() == 1 and r.cstring() == "__cluster_metadata"
    assert r.carray_len() == 1
    assert r.i32() == 0 and r.i16() == 0
    leader, epoch, hw = r.i32(), r.i32(), r.i64()
    members = []
    for _ in range(2):
        ids = []
        for _ in range(r.carray_len()):
            ids.append(r.i32())
            r.i64()  # log end offset
            r.skip_tags()
        members.append(sorted(ids))
    return leader, epoch, hw, members[0], members[1]


def test_kafka_describe_quorum_and_unregister_broker_by_hand(make_cluster):
    import wire

    cluster = make_cluster(4, FAST)
    leader, epoch, hw, voters_, observers = describe_quorum(cluster.node(4).kafka_addr)
    assert (voters_, observers) == ([1, 2, 3], [4])
    assert leader in (1, 2, 3) and epoch >= 1 and hw > 0
    # UnregisterBroker v0 (flexible): a live broker with replicas is refused, a dead empty one goes.
    cluster.create_topic("held", partitions=1, rf=3)
    cluster.wait_topic("held", 1)
    holder = cluster.topic("held")["partitions"][0]["replicas"][0]

    def unregister(broker_id):
        r = wire.roundtrip(cluster.node(holder).kafka_addr, 64, 0, wire.i32(broker_id) + wire.NO_TAGS, flexible=True)
        r.i32()  # throttle
        return r.i16(), r.cstring()

    code, message = unregister(holder)
    assert code == 42 and "replicas" in message, (code, message)  # BROKER_NOT_EMPTY, as INVALID_REQUEST
    assert unregister(9)[0] == 102  # BROKER_ID_NOT_REGISTERED
    empty = next(b for b in (1, 2, 3, 4) if b not in cluster.topic("held")["partitions"][0]["replicas"])
    cluster.kill(empty)
    wait_for(f"broker {empty} fenced", 30, lambda: any(
        b["id"] == empty and b["state"] == "fenced" for b in cluster.cluster_view(holder)["brokers"]))
    assert unregister(empty) == (0, None)
    assert empty not in [b["id"] for b in cluster.get(holder, "/v1/brokers")[1]]


def test_kafka_add_and_remove_raft_voter_by_hand(make_cluster):
    """AddRaftVoter and RemoveRaftVoter v0 (KIP-853), as kafka-metadata-quorum sends them."""
    import struct

    import wire

    cluster = make_cluster(4, FAST)
    addr = cluster.node(4).kafka_addr
    cluster_id = cluster.cluster_view(1)["cluster_id"]
    directory = b"\x01" * 16

    def add(voter, cid=cluster_id):
        listener = wire.cstring("CONTROLLER") + wire.cstring("127.0.0.1") + struct.pack(">H", 9093) + wire.NO_TAGS
        body = (wire.cstring(cid) + wire.i32(30000) + wire.i32(voter) + directory + wire.carray([listener])
                + wire.NO_TAGS)
        r = wire.roundtrip(addr, 80, 0, body, flexible=True, timeout=40)
        r.i32()  # throttle
        return r.i16(), r.cstring()

    def remove(voter, cid=cluster_id):
        r = wire.roundtrip(addr, 81, 0, wire.cstring(cid) + wire.i32(voter) + directory + wire.NO_TAGS,
                           flexible=True, timeout=40)
        r.i32()
        return r.i16(), r.cstring()

    assert add(4, cid="another-cluster")[0] == 104  # INCONSISTENT_CLUSTER_ID
    assert add(4) == (0, None)
    assert describe_quorum(addr)[3] == [1, 2, 3, 4]
    code, message = add(4)
    assert code == 126 and "4" in message, (code, message)  # DUPLICATE_VOTER
    assert remove(9)[0] == 128  # VOTER_NOT_FOUND
    # A null cluster id is not checked, as in Kafka.
    assert remove(4, cid=None) == (0, None)
    _, _, _, voters_, observers = describe_quorum(addr)
    assert (voters_, observers) == ([1, 2, 3], [4])
    status, quorum = cluster.get(1, "/v1/quorum")
    assert [v["id"] for v in quorum["voters"]] == [1, 2, 3], quorum
