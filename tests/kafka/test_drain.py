"""Brokers that leave: a decommission under an acks=all producer drains a broker and
unregisters it with nothing acknowledged lost; a drain the others cannot hold is refused;
maintenance keeps a broker's replicas and takes its leaderships; a broker dead longer
than balancer.node.unavailable.timeout.ms has its replicas re-created on live brokers,
and can then be unregistered."""
import subprocess

from harness import FAST, strom_bin, wait_for
from test_reassignment import MANUAL, Load, assert_every_ack_once_in_order, partitions, read_back, setup_on_first_three


def broker(cluster, bid, via=1):
    status, b = cluster.get(via, f"/v1/brokers/{bid}", timeout=5)
    return b if status == 200 else None


def registered(cluster, via=1):
    return sorted(b["id"] for b in cluster.get(via, "/v1/brokers", timeout=5)[1])


def test_decommission_under_load_drains_and_unregisters(make_cluster):
    cluster = make_cluster(4, MANUAL)
    topic, count = "drain", 4
    setup_on_first_three(cluster, topic, count)
    # Put broker 4 in every partition, in place of a different broker each.
    for i in range(count):
        replicas = [4 if r == 1 + i % 3 else r for r in [1, 2, 3]]
        assert cluster.send(1, "POST", f"/v1/partitions/{topic}/{i}/reassign", {"replicas": replicas})[0] == 202
    wait_for("broker 4 holding a replica of every partition", 60, lambda: all(
        4 in p["replicas"] and 4 in p["isr"] and p["reassignment"] is None for p in partitions(cluster, topic).values()))
    load = Load(cluster, topic, count)
    wait_for("records flowing", 30, lambda: len(load.acked) > 500)

    out = subprocess.run([strom_bin(), "broker", "decommission", "4", "--json", "--admin-url",
                          f"http://{cluster.node(2).admin}"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert '"draining"' in out.stdout or '"done"' in out.stdout, out.stdout
    wait_for("broker 4 drained and unregistered", 90, lambda: registered(cluster) == [1, 2, 3])
    for p in partitions(cluster, topic).values():
        assert sorted(p["replicas"]) == [1, 2, 3] and p["leader"] != 4, p
    before = len(load.acked)
    wait_for("records flowing after the drain", 30, lambda: len(load.acked) > before + 200)
    acked = load.finish()
    assert not load.errors, load.errors[:3]
    assert_every_ack_once_in_order(acked, read_back(cluster, topic, count, len(acked)))
    # The drained process, still running, may not register again: clients no longer see it.
    status, q = cluster.get(1, "/v1/quorum")
    assert 4 not in [m["id"] for m in q["voters"] + q["observers"]], q
    assert registered(cluster) == [1, 2, 3]


def test_decommission_and_unregister_refusals(make_cluster):
    cluster = make_cluster(3, FAST)
    cluster.create_topic("rf3", partitions=1, rf=3)
    cluster.wait_topic("rf3", 1)
    status, body = cluster.send(1, "POST", "/v1/brokers/3/decommission")
    assert (status, body["error"]) == (409, "NOT_ENOUGH_BROKERS"), body
    assert broker(cluster, 3)["decommission"] is None
    status, body = cluster.send(1, "POST", "/v1/brokers/7/decommission")
    assert (status, body["error"]) == (404, "BROKER_ID_NOT_REGISTERED"), body
    status, body = cluster.send(1, "DELETE", "/v1/brokers/2")
    assert (status, body["error"]) == (409, "BROKER_NOT_EMPTY"), body
    status, body = cluster.send(1, "DELETE", "/v1/brokers/x")
    assert (status, body["error"]) == (400, "INVALID_REQUEST"), body
    assert registered(cluster) == [1, 2, 3]


def test_maintenance_keeps_replicas_and_takes_leaderships(make_cluster):
    cluster = make_cluster(3, FAST)
    cluster.create_topic("maint", partitions=6, rf=3)
    cluster.wait_topic("maint", 6)
    leader = partitions(cluster, "maint")[0]["leader"]
    status, b = cluster.send(2, "PUT", f"/v1/brokers/{leader}/maintenance")
    assert status == 200 and b["maintenance"] is True, b
    wait_for(f"broker {leader} leading nothing", 30, lambda: broker(cluster, leader)["leaders"] == 0)
    assert broker(cluster, leader)["replicas"] == 6, "replicas stay"
    assert all(leader in p["isr"] for p in partitions(cluster, "maint").values())
    status, b = cluster.send(2, "DELETE", f"/v1/brokers/{leader}/maintenance")
    assert status == 200 and b["maintenance"] is False, b
    status, body = cluster.send(2, "PUT", "/v1/brokers/9/maintenance")
    assert (status, body["error"]) == (404, "BROKER_ID_NOT_REGISTERED"), body


def test_a_dead_broker_is_replaced_after_the_unavailable_timeout(make_cluster):
    # The default balancer.mode (continuous) heals; it may also spread replicas meanwhile.
    cluster = make_cluster(4, FAST + ("balancer.node.unavailable.timeout.ms=3000",))
    topic, count = "heal", 4
    cluster.create_topic(topic, partitions=count, rf=3, configs={"min.insync.replicas": "2"})
    cluster.wait_topic(topic, count)
    load = Load(cluster, topic, count)
    wait_for("records flowing", 30, lambda: len(load.acked) > 500)
    victim = next(b for b in (3, 4, 2) if any(b in p["replicas"] for p in partitions(cluster, topic).values()))
    cluster.kill(victim)
    live = sorted({1, 2, 3, 4} - {victim})
    wait_for("every partition back at RF 3 on live brokers", 90, lambda: all(
        set(p["replicas"]) <= set(live) and len(p["replicas"]) == 3 and sorted(p["isr"]) == sorted(p["replicas"])
        and p["reassignment"] is None for p in partitions(cluster, topic, via=1).values()))
    before = len(load.acked)
    wait_for("records flowing after healing", 30, lambda: len(load.acked) > before + 200)
    acked = load.finish()
    assert not load.errors, load.errors[:3]
    assert_every_ack_once_in_order(acked, read_back(cluster, topic, count, len(acked)))
    # Dead and empty: it may be unregistered.
    assert broker(cluster, victim)["replicas"] == 0
    status, _ = cluster.send(1, "DELETE", f"/v1/brokers/{victim}")
    assert status == 204
    assert registered(cluster) == live
