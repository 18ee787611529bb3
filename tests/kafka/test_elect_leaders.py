"""ElectLeaders (KIP-183/460) through Kafka's API, as `kafka-leader-election`
and AdminClient.elect_leaders call it: a partition led by another replica goes
back to its preferred one; one already led by it gets ELECTION_NOT_NEEDED; an
election of every partition answers only for the partitions it moved; an
unknown partition and an unknown election type are refused."""
import confluent_kafka as ck
from confluent_kafka import ElectionType, TopicPartition
from confluent_kafka.admin import AdminClient

import wire
from harness import FAST, wait_for

API_ELECT_LEADERS = 43
# Nothing moves leaders back by itself here: the tests' elections do.
SETTINGS = FAST + ("auto.leader.rebalance.enable=false", "balancer.mode=off")


def partition(cluster, topic, p, via=1):
    return next(x for x in cluster.topic(topic, via=via)["partitions"] if x["partition"] == p)


def elect(admin, election, partitions):
    return admin.elect_leaders(election, partitions).result(timeout=30)


def test_preferred_election_moves_the_leader_back(make_cluster):
    cluster = make_cluster(3, SETTINGS)
    cluster.create_topic("el", partitions=2, rf=3)
    cluster.wait_topic("el", 2)
    preferred = partition(cluster, "el", 0)["replicas"][0]
    # Maintenance takes the preferred replica's leaderships; leaving it does not give them back.
    assert cluster.send(2, "PUT", f"/v1/brokers/{preferred}/maintenance")[0] == 200
    wait_for("partition 0 led by another replica", 30, lambda: partition(cluster, "el", 0)["leader"] != preferred)
    assert cluster.send(2, "DELETE", f"/v1/brokers/{preferred}/maintenance")[0] == 200
    assert partition(cluster, "el", 0)["leader"] != preferred

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    result = elect(admin, ElectionType.PREFERRED, [TopicPartition("el", 0)])
    assert result == {TopicPartition("el", 0): None}, result
    wait_for("the preferred replica leading partition 0 everywhere", 30,
             lambda: all(partition(cluster, "el", 0, via=n)["leader"] == preferred for n in (1, 2, 3)))

    # Again: nothing to do.
    result = elect(admin, ElectionType.PREFERRED, [TopicPartition("el", 0)])
    err = result[TopicPartition("el", 0)]
    assert err is not None and err.code() == ck.KafkaError.ELECTION_NOT_NEEDED, result
    # An unclean election of a partition that has a leader: not needed either.
    result = elect(admin, ElectionType.UNCLEAN, [TopicPartition("el", 1)])
    assert result[TopicPartition("el", 1)].code() == ck.KafkaError.ELECTION_NOT_NEEDED, result
    # An unknown partition.
    result = elect(admin, ElectionType.PREFERRED, [TopicPartition("nope", 0)])
    assert result[TopicPartition("nope", 0)].code() == ck.KafkaError.UNKNOWN_TOPIC_OR_PART, result


def test_electing_every_partition_answers_for_the_moved_ones_only(make_cluster):
    cluster = make_cluster(3, SETTINGS)
    cluster.create_topic("all", partitions=6, rf=3)
    cluster.wait_topic("all", 6)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    # Every partition is led by its preferred replica: nothing to report.
    assert elect(admin, ElectionType.PREFERRED, None) == {}
    broker = 2
    assert cluster.send(1, "PUT", f"/v1/brokers/{broker}/maintenance")[0] == 200
    moved = lambda: sorted(p["partition"] for p in cluster.topic("all")["partitions"]
                           if p["replicas"][0] == broker and p["leader"] != broker)
    wait_for(f"broker {broker} leading nothing", 30, lambda: moved() and all(
        p["leader"] != broker for p in cluster.topic("all")["partitions"]))
    assert cluster.send(1, "DELETE", f"/v1/brokers/{broker}/maintenance")[0] == 200
    expected = moved()
    assert expected, "broker 2 is the preferred replica of some partition"
    result = elect(admin, ElectionType.PREFERRED, None)
    assert sorted(tp.partition for tp in result if tp.topic == "all") == expected, result
    assert all(err is None for err in result.values()), result
    wait_for("every partition led by its preferred replica", 30, lambda: all(
        p["leader"] == p["replicas"][0] for p in cluster.topic("all")["partitions"]))


def test_an_unknown_election_type_is_refused(make_cluster):
    cluster = make_cluster(1, SETTINGS)
    cluster.create_topic("t", partitions=1, rf=1)
    cluster.wait_topic("t", 1)
    # ElectLeaders v1 by hand: election type 7, topic t partition 0, timeout.
    body = wire.i8(7) + wire.i32(1) + wire.string("t") + wire.i32(1) + wire.i32(0) + wire.i32(10_000)
    r = wire.roundtrip(cluster.node(1).kafka_addr, API_ELECT_LEADERS, 1, body)
    r.i32()  # throttle
    assert r.i16() == 42  # INVALID_REQUEST
    assert r.i32() == 1 and r.string() == "t" and r.i32() == 1
    assert r.i32() == 0 and r.i16() == 42
