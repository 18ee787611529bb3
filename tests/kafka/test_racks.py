"""Racks (`broker.rack`): brokers advertise their rack to Kafka clients and in the admin
API, new topics place each partition's replicas in different racks, the balancer finds
nothing to change in that placement, and a drained broker's replicas stay in its rack."""
import subprocess

from kafka.admin import KafkaAdminClient

from harness import FAST, strom_bin, wait_for

RACKS = {1: "a", 2: "a", 3: "b", 4: "b"}


def racks_of(cluster, replicas):
    return {RACKS[r] for r in replicas}


def test_replicas_spread_over_racks_and_clients_see_the_racks(make_cluster):
    cluster = make_cluster(4, FAST, node_settings={n: (f"broker.rack={r}",) for n, r in RACKS.items()})
    status, brokers = cluster.get(1, "/v1/brokers")
    assert status == 200 and {b["id"]: b["rack"] for b in brokers} == RACKS, brokers

    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    try:
        described = admin.describe_cluster()
    finally:
        admin.close()
    assert {b["broker_id"]: b["rack"] for b in described["brokers"]} == RACKS, described

    # Ids alone would place replicas on 1+2 and 3+4: the same rack twice.
    for topic, rf in (("pairs", 2), ("triples", 3)):
        cluster.create_topic(topic, partitions=8, rf=rf)
        cluster.wait_topic(topic, 8)
        for p in cluster.topic(topic)["partitions"]:
            assert racks_of(cluster, p["replicas"]) == {"a", "b"}, (topic, p)

    # The balancer agrees with the placement: nothing to move.
    via = cluster.cluster_view(1)["controller_id"]
    status, b = cluster.get(via, "/v1/balancer")
    assert status == 200 and b["moves"] == [], b
    assert b["moves_started"] == 0, b


def test_a_drained_brokers_replicas_stay_in_its_rack(make_cluster):
    cluster = make_cluster(4, FAST + ("balancer.mode=off",),
                           node_settings={n: (f"broker.rack={r}",) for n, r in RACKS.items()})
    cluster.create_topic("drained", partitions=6, rf=2)
    cluster.wait_topic("drained", 6)
    held = [p for p in cluster.topic("drained")["partitions"] if 3 in p["replicas"]]
    assert held, "broker 3 holds replicas"
    status, body = cluster.send(1, "POST", "/v1/brokers/3/decommission")
    assert status == 202, body

    def gone():
        return all(b["id"] != 3 for b in cluster.get(1, "/v1/brokers", timeout=5)[1])
    wait_for("broker 3 drained and unregistered", 60, gone, interval=0.2)
    for p in cluster.topic("drained")["partitions"]:
        assert racks_of(cluster, p["replicas"]) == {"a", "b"}, p
        assert 3 not in p["replicas"]
    moved = {p["partition"]: p["replicas"] for p in cluster.topic("drained")["partitions"]}
    assert all(4 in moved[p["partition"]] for p in held), moved


def test_a_bad_rack_is_refused_at_start():
    out = subprocess.run([strom_bin(), "serve", "--node-id", "1", "--data-dir", "/nonexistent-strom",
                          "--set", "broker.rack="], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2, out
    assert "broker.rack" in out.stderr and "printable" in out.stderr, out.stderr
