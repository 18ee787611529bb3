"""OffsetForLeaderEpoch for consumers (KIP-320), as clients send it after a leader
change to find out whether the log they read was truncated: asked as a consumer
(replica id -1), the leader answers where each epoch ends; a stale current epoch is
FENCED_LEADER_EPOCH, a newer one UNKNOWN_LEADER_EPOCH; and a confluent-kafka consumer
reads on across a leader change without losing or repeating its place."""
import confluent_kafka as ck

import wire
from harness import FAST, wait_for

API_OFFSET_FOR_LEADER_EPOCH = 23
FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH = 74, 75
SETTINGS = FAST + ("auto.leader.rebalance.enable=false", "balancer.mode=off")


def partition(cluster, topic, p, via=1):
    return next(x for x in cluster.topic(topic, via=via)["partitions"] if x["partition"] == p)


def epoch_end(addr, topic, p, leader_epoch, current_leader_epoch=-1):
    """OffsetForLeaderEpoch v3 as a consumer: (error, epoch, end offset)."""
    body = (wire.i32(-1) + wire.i32(1) + wire.string(topic) + wire.i32(1)
            + wire.i32(p) + wire.i32(current_leader_epoch) + wire.i32(leader_epoch))
    r = wire.roundtrip(addr, API_OFFSET_FOR_LEADER_EPOCH, 3, body)
    r.i32()  # throttle
    assert r.i32() == 1 and r.string() == topic and r.i32() == 1
    err, index, epoch, end = r.i16(), r.i32(), r.i32(), r.i64()
    assert index == p
    return err, epoch, end


def test_consumers_learn_where_each_epoch_ends(make_cluster):
    cluster = make_cluster(3, SETTINGS)
    cluster.create_topic("ep", partitions=1, rf=3)
    cluster.wait_topic("ep", 1)
    first = partition(cluster, "ep", 0)
    leader, epoch = first["leader"], first["leader_epoch"]
    p = ck.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(10):
        p.produce("ep", value=f"a{i}".encode(), partition=0)
    assert p.flush(30) == 0
    c = ck.Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "ep-reader",
                     "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.assign([ck.TopicPartition("ep", 0, 0)])
    seen = []
    wait_for("the first 10 records read", 30,
             lambda: (lambda m: m is not None and not m.error() and seen.append(m.value()))(c.poll(0.5)) or len(seen) == 10)

    addr = cluster.node(leader).kafka_addr
    assert epoch_end(addr, "ep", 0, epoch, epoch) == (0, epoch, 10)
    # Move the leadership: the new leader's epoch starts at 10.
    assert cluster.send(1, "PUT", f"/v1/brokers/{leader}/maintenance")[0] == 200
    wait_for("another leader", 30, lambda: partition(cluster, "ep", 0)["leader"] not in (None, leader))
    second = partition(cluster, "ep", 0)
    new_leader, new_epoch = second["leader"], second["leader_epoch"]
    assert new_epoch > epoch
    for i in range(5):
        p.produce("ep", value=f"b{i}".encode(), partition=0)
    assert p.flush(30) == 0
    new_addr = cluster.node(new_leader).kafka_addr
    wait_for("the new leader answering for its epoch", 30,
             lambda: epoch_end(new_addr, "ep", 0, new_epoch, new_epoch) == (0, new_epoch, 15))
    # The old epoch ended where the consumer read to: nothing it read was truncated.
    assert epoch_end(new_addr, "ep", 0, epoch, new_epoch) == (0, epoch, 10)
    assert epoch_end(new_addr, "ep", 0, epoch, epoch)[0] == FENCED_LEADER_EPOCH
    assert epoch_end(new_addr, "ep", 0, epoch, new_epoch + 5)[0] == UNKNOWN_LEADER_EPOCH

    # The consumer goes on from where it was, across the change.
    wait_for("the 5 new records read", 30,
             lambda: (lambda m: m is not None and not m.error() and seen.append(m.value()))(c.poll(0.5)) or len(seen) == 15)
    c.close()
    assert seen == [f"a{i}".encode() for i in range(10)] + [f"b{i}".encode() for i in range(5)]
    assert cluster.send(1, "DELETE", f"/v1/brokers/{leader}/maintenance")[0] == 200
