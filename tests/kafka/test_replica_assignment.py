"""CreateTopics with a manual replica assignment (`kafka-topics --replica-assignment`,
`NewTopic(replica_assignment=...)`): the replicas are kept in the order given, the
first is the leader, and a bad assignment is refused with Kafka's errors."""
import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from harness import FAST


def new_topic(topic, assignment):
    # librdkafka sends num_partitions and replication_factor as -1 with an assignment.
    return NewTopic(topic, num_partitions=len(assignment), replica_assignment=assignment)


def create(admin, topic, assignment):
    """None on success, else the KafkaError."""
    try:
        admin.create_topics([new_topic(topic, assignment)], operation_timeout=20)[topic].result(30)
        return None
    except ck.KafkaException as e:
        return e.args[0]


def test_replicas_are_placed_as_given(make_cluster):
    cluster = make_cluster(3, FAST)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    assignment = [[3, 1], [2, 3], [1, 2], [3, 2]]
    assert create(admin, "manual", assignment) is None
    t = cluster.wait_topic("manual", 4)
    placed = {p["partition"]: (p["replicas"], p["leader"]) for p in t["partitions"]}
    assert placed == {i: (r, r[0]) for i, r in enumerate(assignment)}, placed
    p = ck.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(4):
        p.produce("manual", value=b"v", partition=i)
    assert p.flush(30) == 0

    # validate_only checks without creating.
    fut = admin.create_topics([new_topic("checked", [[1, 2]])], validate_only=True)
    fut["checked"].result(30)
    assert "checked" not in admin.list_topics(timeout=10).topics


@pytest.mark.parametrize("assignment,code", [
    ([[1, 1]], ck.KafkaError.INVALID_REPLICA_ASSIGNMENT),   # a broker twice
    ([[1, 9]], ck.KafkaError.INVALID_REPLICA_ASSIGNMENT),   # no broker 9
    ([[1, 2], [3]], ck.KafkaError.INVALID_REPLICA_ASSIGNMENT),  # replica counts differ
])
def test_a_bad_assignment_is_refused(make_cluster, assignment, code):
    # (An empty replica list, also refused, is stopped by the client before it is sent;
    # the controller's unit test covers it.)
    cluster = make_cluster(3, FAST)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    err = create(admin, "bad", assignment)
    assert err is not None and err.code() == code, err
    assert "bad" not in admin.list_topics(timeout=10).topics
