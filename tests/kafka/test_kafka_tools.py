"""Kafka's own command-line tools (kafka-tools 4.4, run with `java -cp`, as
bin/kafka-*.sh would run them) against a real cluster: kafka-topics, the console producer
and consumer, kafka-consumer-groups, kafka-configs, kafka-acls, kafka-reassign-partitions,
kafka-leader-election, kafka-metadata-quorum, kafka-transactions describe-producers and the
perf tests. The
cluster has Kafka's authorizer on; the PLAINTEXT listener's ANONYMOUS is a super user, so
the tools need no credentials, and alice (SCRAM, on a SASL_PLAINTEXT listener) checks
that ACLs written by kafka-acls take effect."""
import os
import re
import subprocess
import uuid

import pytest
from confluent_kafka import KafkaError, Producer

import harness
import jvm

PASSWORD = "pw-tools"
SETTINGS = harness.FAST + (
    "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "super.users=User:ANONYMOUS", "connection.failed.authentication.delay.ms=20",
    # Leaders stay where the tools put them (no preferred elections of Strom's own).
    "balancer.mode=off", "auto.leader.rebalance.enable=false")


@pytest.fixture(scope="module")
def tools_cluster(tmp_path_factory):
    jvm.require()
    c = harness.start(tmp_path_factory.mktemp("strom"), 3, SETTINGS, listeners=("SASL_PLAINTEXT",))
    try:
        status, body = c.send(1, "POST", "/v1/users", {"name": "alice", "password": PASSWORD})
        assert status == 201, body
        yield c
    finally:
        c.close()


def tool(cls, *args, stdin=None, timeout=120, ok=True):
    """Runs org.apache.kafka.tools.<cls> with args; its stdout (and, when ok=False, its
    exit code and stderr too)."""
    p = subprocess.run(jvm.command(f"org.apache.kafka.tools.{cls}", *args), input=stdin, capture_output=True, text=True, timeout=timeout)
    if not ok:
        return p.returncode, p.stdout, p.stderr
    assert p.returncode == 0, f"{cls} {' '.join(args)} exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"
    return p.stdout


def new_topic(prefix="tools"):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_kafka_topics(tools_cluster):
    c, b = tools_cluster, tools_cluster.bootstrap
    topic = new_topic()
    out = tool("TopicCommand", "--bootstrap-server", b, "--create", "--topic", topic, "--partitions", "3",
               "--replication-factor", "3", "--config", "min.insync.replicas=2")
    assert f"Created topic {topic}." in out
    c.wait_topic(topic, 3)
    assert topic in tool("TopicCommand", "--bootstrap-server", b, "--list").split()
    out = tool("TopicCommand", "--bootstrap-server", b, "--describe", "--topic", topic)
    assert re.search(rf"Topic: {topic}\s+TopicId: \S+\s+PartitionCount: 3\s+ReplicationFactor: 3\s+"
                     r"Configs: min.insync.replicas=2", out), out
    rows = re.findall(r"Partition: (\d+)\s+Leader: (\d+)\s+Replicas: ([\d,]+)\s+Isr: ([\d,]+)", out)
    assert sorted(int(p) for p, *_ in rows) == [0, 1, 2], out
    for _, leader, replicas, isr in rows:
        assert len(replicas.split(",")) == 3 and leader in replicas.split(",") and len(isr.split(",")) == 3

    tool("TopicCommand", "--bootstrap-server", b, "--alter", "--topic", topic, "--partitions", "5")
    c.wait_topic(topic, 5)
    # Creating it again is refused with Kafka's error.
    code, _, err = tool("TopicCommand", "--bootstrap-server", b, "--create", "--topic", topic, "--partitions", "1",
                        ok=False)
    assert code != 0 and "already exists" in err, err

    tool("TopicCommand", "--bootstrap-server", b, "--delete", "--topic", topic)
    harness.wait_for("the topic to be gone", 30,
                     lambda: topic not in tool("TopicCommand", "--bootstrap-server", b, "--list").split())


def test_console_clients_and_consumer_groups(tools_cluster):
    c, b = tools_cluster, tools_cluster.bootstrap
    topic, group = new_topic(), f"tools-group-{uuid.uuid4().hex[:8]}"
    c.create_topic(topic, partitions=3, rf=3)
    c.wait_topic(topic, 3)
    lines = [f"k{i % 7}:value-{i}" for i in range(60)]
    tool("ConsoleProducer", "--bootstrap-server", b, "--topic", topic, "--reader-property", "parse.key=true",
         "--reader-property", "key.separator=:", stdin="\n".join(lines) + "\n")

    def consume():
        out = tool("consumer.ConsoleConsumer", "--bootstrap-server", b, "--topic", topic, "--group", group,
                   "--from-beginning", "--max-messages", "60", "--formatter-property", "print.key=true",
                   "--formatter-property", "key.separator=:")
        return sorted(line for line in out.splitlines() if line.startswith("k"))

    assert consume() == sorted(lines)

    assert group in tool("consumer.group.ConsumerGroupCommand", "--bootstrap-server", b, "--list").split()

    def describe():
        out = tool("consumer.group.ConsumerGroupCommand", "--bootstrap-server", b, "--describe", "--group", group)
        rows = re.findall(rf"{group}\s+{topic}\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)", out)
        return {int(p): (int(cur), int(end), int(lag)) for p, cur, end, lag in rows}

    committed = describe()
    assert sorted(committed) == [0, 1, 2]
    assert sum(end for _, end, _ in committed.values()) == 60
    assert all(cur == end and lag == 0 for cur, end, lag in committed.values()), committed

    out = tool("consumer.group.ConsumerGroupCommand", "--bootstrap-server", b, "--reset-offsets", "--to-earliest",
               "--group", group, "--topic", topic, "--execute")
    assert len(re.findall(rf"{group}\s+{topic}\s+\d+\s+0", out)) == 3, out
    assert all(cur == 0 and lag == end for cur, end, lag in describe().values())
    # The group reads everything again from the reset offsets.
    assert consume() == sorted(lines)

    out = tool("consumer.group.ConsumerGroupCommand", "--bootstrap-server", b, "--delete", "--group", group)
    assert "successful" in out, out
    assert group not in tool("consumer.group.ConsumerGroupCommand", "--bootstrap-server", b, "--list").split()


def test_kafka_transactions_describe_producers(tools_cluster):
    """kafka-transactions describe-producers (DescribeProducers, KIP-664) names the
    idempotent producer that wrote to a partition, with its last sequence; the leader
    answers, and the tool finds it."""
    c, b = tools_cluster, tools_cluster.bootstrap
    topic = new_topic()
    c.create_topic(topic, partitions=1, rf=3)
    c.wait_topic(topic, 1)
    p = Producer({"bootstrap.servers": b, "enable.idempotence": True, "linger.ms": 5})
    for i in range(50):
        p.produce(topic, value=f"v{i}".encode(), partition=0)
    assert p.flush(60) == 0
    out = tool("TransactionsCommand", "--bootstrap-server", b, "describe-producers", "--topic", topic,
               "--partition", "0")
    header, *rows = [line.split() for line in out.strip().splitlines()]
    assert header[:4] == ["ProducerId", "ProducerEpoch", "LatestCoordinatorEpoch", "LastSequence"], out
    assert len(rows) == 1 and rows[0][3] == "49" and int(rows[0][0]) >= 0, out
    # No producer has written to a new topic.
    empty = new_topic()
    c.create_topic(empty, partitions=1, rf=3)
    c.wait_topic(empty, 1)
    out = tool("TransactionsCommand", "--bootstrap-server", b, "describe-producers", "--topic", empty,
               "--partition", "0")
    assert out.strip().splitlines()[1:] == [], out


def test_kafka_configs(tools_cluster):
    c, b = tools_cluster, tools_cluster.bootstrap
    topic = new_topic()
    c.create_topic(topic, partitions=1, rf=3)
    c.wait_topic(topic, 1)
    base = ("--bootstrap-server", b, "--entity-type", "topics", "--entity-name", topic)
    tool("ConfigCommand", *base, "--alter", "--add-config", "retention.ms=3600000,cleanup.policy=[compact,delete]")
    out = tool("ConfigCommand", *base, "--describe")
    assert "retention.ms=3600000" in out and "cleanup.policy=compact,delete" in out, out
    # Each config's synonyms: where a value is set, in force first (DescribeConfigs' include_synonyms).
    assert ("retention.ms=3600000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=3600000, "
            "DEFAULT_CONFIG:log.retention.ms=604800000}") in out, out
    tool("ConfigCommand", *base, "--alter", "--delete-config", "retention.ms")
    out = tool("ConfigCommand", *base, "--describe")
    assert "retention.ms" not in out and "cleanup.policy=compact,delete" in out, out
    # A value the topic config does not take: refused, and nothing changes.
    code, _, err = tool("ConfigCommand", *base, "--alter", "--add-config", "retention.ms=soon", ok=False)
    assert code != 0 and "retention.ms" in err, err
    assert "retention.ms" not in tool("ConfigCommand", *base, "--describe")

    # A cluster-wide dynamic default reaches the topic, and the synonyms say so.
    default = ("--bootstrap-server", b, "--entity-type", "brokers", "--entity-default")
    tool("ConfigCommand", *default, "--alter", "--add-config", "log.retention.ms=86400000")
    try:
        want = ("retention.ms=86400000 sensitive=false synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:"
                "log.retention.ms=86400000, DEFAULT_CONFIG:log.retention.ms=604800000}")
        harness.wait_for("the topic to inherit the new default", 30,
                         lambda: want in tool("ConfigCommand", *base, "--describe", "--all"))
    finally:
        tool("ConfigCommand", *default, "--alter", "--delete-config", "log.retention.ms")
    # A node's own settings (the test harness sets the heartbeat interval on every node).
    out = tool("ConfigCommand", "--bootstrap-server", b, "--entity-type", "brokers", "--entity-name", "1",
               "--describe", "--all")
    assert ("broker.heartbeat.interval.ms=200 sensitive=false synonyms={STATIC_BROKER_CONFIG:"
            "broker.heartbeat.interval.ms=200, DEFAULT_CONFIG:broker.heartbeat.interval.ms=500}") in out, out


def test_kafka_acls_take_effect(tools_cluster):
    c, b = tools_cluster, tools_cluster.bootstrap
    prefix = f"acl-{uuid.uuid4().hex[:6]}-"
    allowed, denied = prefix + "a", new_topic("other")
    for t in (allowed, denied):
        c.create_topic(t, partitions=1, rf=3)
        c.wait_topic(t, 1)
    acl = ("--bootstrap-server", b, "--allow-principal", "User:alice", "--operation", "Write", "--operation",
           "Describe", "--topic", prefix, "--resource-pattern-type", "prefixed")
    tool("AclCommand", "--add", *acl)
    out = tool("AclCommand", "--bootstrap-server", b, "--list", "--topic", prefix, "--resource-pattern-type",
               "prefixed")
    assert "principal=User:alice" in out and "operation=WRITE" in out and "permissionType=ALLOW" in out, out
    # ACL changes reach the other brokers after the answer, as in Kafka.
    for nid in c.nodes:
        harness.wait_for(f"node {nid} to apply the ACL", 30,
                         lambda nid=nid: any(a.get("principal") == "User:alice" for a in c.get(nid, "/v1/acls")[1]))

    sasl = ",".join(n.listeners["SASL_PLAINTEXT"] for n in c.nodes.values())

    def produce_as_alice(topic):
        p = Producer({"bootstrap.servers": sasl, "security.protocol": "SASL_PLAINTEXT",
                      "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "alice", "sasl.password": PASSWORD,
                      "message.timeout.ms": 10000})
        errors = []
        p.produce(topic, b"x", on_delivery=lambda err, _msg: errors.append(err))
        p.flush(15)
        return errors

    assert produce_as_alice(allowed) == [None]
    errors = produce_as_alice(denied)
    assert len(errors) == 1 and errors[0] is not None and errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    tool("AclCommand", "--remove", "--force", *acl)
    out = tool("AclCommand", "--bootstrap-server", b, "--list", "--topic", prefix, "--resource-pattern-type",
               "prefixed")
    assert "User:alice" not in out, out


def test_perf_tools(tools_cluster):
    c, b = tools_cluster, tools_cluster.bootstrap
    topic = new_topic("perf")
    c.create_topic(topic, partitions=3, rf=3, configs={"min.insync.replicas": "2"})
    c.wait_topic(topic, 3)
    out = tool("ProducerPerformance", "--topic", topic, "--num-records", "20000", "--record-size", "100",
               "--throughput", "-1", "--command-property", f"bootstrap.servers={b}", "acks=all")
    assert re.search(r"^20000 records sent", out, re.M), out
    out = tool("ConsumerPerformance", "--bootstrap-server", b, "--topic", topic, "--num-records", "20000")
    # start, end, MB, MB/s, records, ...
    row = out.strip().splitlines()[-1].split(", ")
    assert int(row[4]) >= 20000, out


def test_reassign_partitions_and_leader_election(tools_cluster):
    c, b = tools_cluster, tools_cluster.bootstrap
    topic = new_topic("move")
    c.create_topic(topic, partitions=1, rf=2)
    c.wait_topic(topic, 1)
    replicas = c.topic(topic)["partitions"][0]["replicas"]
    leader = c.leaders(topic)[0]
    spare = next(n for n in (1, 2, 3) if n not in replicas)
    # The move replaces the follower with the spare broker, first in the list: the leader
    # stays (the target keeps it), and the spare becomes the preferred leader.
    target = [spare, leader]
    path = os.path.join(c.dir, f"{topic}.json")
    with open(path, "w") as f:
        f.write('{"version":1,"partitions":[{"topic":"%s","partition":0,"replicas":[%d,%d]}]}' % (topic, *target))
    out = tool("reassign.ReassignPartitionsCommand", "--bootstrap-server", b, "--reassignment-json-file", path,
               "--execute", "--throttle", "50000000")
    assert f"Successfully started partition reassignment for {topic}-0" in out, out
    assert "The inter-broker throttle limit was set to 50000000 B/s" in out, out

    def verified():
        out = tool("reassign.ReassignPartitionsCommand", "--bootstrap-server", b, "--reassignment-json-file", path,
                   "--verify")
        return out if f"Reassignment of partition {topic}-0 is completed." in out else None

    out = harness.wait_for("the move to complete", 60, verified)
    assert "Clearing broker-level throttles on brokers 1,2,3" in out, out
    assert "throttled" not in tool("ConfigCommand", "--bootstrap-server", b, "--entity-type", "brokers",
                                   "--entity-name", "1", "--describe")
    p = c.topic(topic)["partitions"][0]
    assert (p["replicas"], p["leader"]) == (target, leader), p

    elect = ("LeaderElectionCommand", "--bootstrap-server", b, "--election-type", "preferred", "--topic", topic,
             "--partition", "0")
    out = tool(*elect)
    assert f"Successfully completed leader election (PREFERRED) for partitions {topic}-0" in out, out
    harness.wait_for("the preferred replica to lead", 30, lambda: c.leaders(topic)[0] == spare)
    assert f"Valid replica already elected for partitions {topic}-0" in tool(*elect)


def test_metadata_quorum(tools_cluster):
    c, b = tools_cluster, tools_cluster.bootstrap
    controller = c.cluster_view(1)["controller_id"]
    out = tool("MetadataQuorumCommand", "--bootstrap-server", b, "describe", "--status")
    assert re.search(rf"^LeaderId:\s+{controller}$", out, re.M), out
    voters = re.search(r"^CurrentVoters:\s+(.*)$", out, re.M).group(1)
    assert sorted(int(i) for i in re.findall(r'"id": (\d+)', voters)) == [1, 2, 3], out
    out = tool("MetadataQuorumCommand", "--bootstrap-server", b, "describe", "--replication")
    rows = re.findall(r"^(\d+)\s+\S+\s+(\d+)\s+(\d+)\s+\S+\s+\S+\s+(Leader|Follower)", out, re.M)
    assert sorted((int(n), status) for n, _, _, status in rows) == sorted(
        (n, "Leader" if n == controller else "Follower") for n in (1, 2, 3)), out
