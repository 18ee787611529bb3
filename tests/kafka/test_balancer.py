"""The balancer (balancer.mode=continuous, the default): a broker that joins a cluster
whose replicas sit on the others gets its share until replica counts differ by at most
one, consumers still read everything, and then nothing moves any more."""
import subprocess
import time

import confluent_kafka as ck

from harness import FAST, strom_bin, wait_for


def counts(cluster, via=1):
    brokers = cluster.get(via, "/v1/brokers", timeout=5)[1]
    return {b["id"]: b["replicas"] for b in brokers if b["state"] == "active"}


def epochs(cluster, topic):
    t = cluster.topic(topic)
    return {p["partition"]: (p["partition_epoch"], tuple(p["replicas"])) for p in t["partitions"]}


def test_a_joining_broker_gets_its_share_and_the_balancer_then_stays_quiet(make_cluster):
    cluster = make_cluster(4, FAST)
    cluster.kill(4)
    wait_for("broker 4 fenced", 30, lambda: any(
        b["id"] == 4 and b["state"] == "fenced" for b in cluster.cluster_view(1)["brokers"]))
    topic = "spread"
    cluster.create_topic(topic, partitions=12, rf=3)
    cluster.wait_topic(topic, 12)
    assert all(4 not in p["replicas"] for p in cluster.topic(topic)["partitions"])
    p = ck.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "log_level": 0})
    for i in range(1200):
        p.produce(topic, value=b"v-%d" % i, partition=i % 12)
    assert p.flush(30) == 0

    cluster.launch(4)
    cluster.wait_active(timeout=60)

    def balanced():
        # Asked of the controller, whose image is never behind its own decisions.
        via = cluster.cluster_view(1)["controller_id"]
        c = counts(cluster, via)
        running = cluster.get(via, "/v1/reassignments", timeout=5)[1]
        # Replicas first, then preferred leaders: done when the plan is empty too.
        planned = cluster.get(via, "/v1/balancer", timeout=5)[1]["moves"]
        return len(c) == 4 and max(c.values()) - min(c.values()) <= 1 and not running and not planned
    wait_for("replica and leader counts within one of each other", 90, balanced, interval=0.2)
    # Still so after a balancer interval: nothing was in flight.
    time.sleep(1.2)
    assert balanced(), counts(cluster)
    assert counts(cluster)[4] == 9, counts(cluster)

    # Quiet once balanced: no partition changes over several balancer intervals (1 s each).
    before = epochs(cluster, topic)
    until = time.monotonic() + 3.5
    while time.monotonic() < until:
        assert epochs(cluster, topic) == before, "the balancer moved a balanced cluster"
        time.sleep(0.25)
    status, b = cluster.get(2, "/v1/balancer")
    assert status == 200 and b["mode"] == "continuous" and b["moves"] == [], b

    # Leaders report their partitions' sizes to the controller (every 5 s), which
    # weighs bytes too; every broker holds replicas of the data written, so bytes.
    via = cluster.cluster_view(1)["controller_id"]

    def reported():
        b = cluster.get(via, "/v1/balancer", timeout=5)[1]
        bytes_ = b["imbalance"]["bytes"]
        return b if bytes_ and all(n > 0 for n in bytes_.values()) else None
    b = wait_for("partition sizes reported to the controller", 20, reported, interval=0.5)
    assert b["moves_started"] >= 9 and len(b["imbalance"]["bytes"]) == 4, b
    assert sorted(b["imbalance"]["replicas"]) == ["1", "2", "3", "4"], b
    out = subprocess.run([strom_bin(), "balancer", "status", "--admin-url", f"http://{cluster.node(1).admin}"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "continuous" in out.stdout, out

    c = ck.Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "balancer-test", "log_level": 0,
                     "enable.auto.commit": False})
    c.assign([ck.TopicPartition(topic, i, 0) for i in range(12)])
    got = set()
    deadline = time.monotonic() + 60
    try:
        while len(got) < 1200 and time.monotonic() < deadline:
            for m in c.consume(num_messages=500, timeout=0.5):
                if not m.error():
                    got.add(m.value())
    finally:
        c.close()
    assert len(got) == 1200
