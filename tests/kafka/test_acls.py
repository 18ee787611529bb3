"""ACLs: Kafka's model and checks, with real clients over SASL.

A 3-node cluster with the authorizer on (`allow.everyone.if.no.acl.found`
false), SASL_PLAINTEXT for the users, and the inter-broker PLAINTEXT listener,
whose anonymous principal is a super user (followers fetch through it).
"""
import subprocess
import time
import uuid

import confluent_kafka as ck
from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient,
                                   ResourcePatternType, ResourceType)
import pytest

import clients
import harness
import wire

PASSWORD = "pw-acl"
ACL_SETTINGS = ("authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                "super.users=User:admin;User:ANONYMOUS", "connection.failed.authentication.delay.ms=20")


@pytest.fixture(scope="module")
def acl_cluster(tmp_path_factory):
    c = harness.start(tmp_path_factory.mktemp("strom"), 3, harness.FAST + ACL_SETTINGS,
                      listeners=("SASL_PLAINTEXT",))
    try:
        for user in ("admin", "alice", "bob"):
            status, body = c.send(1, "POST", "/v1/users", {"name": user, "password": PASSWORD})
            assert status == 201, body
        for t in ("a-1", "b-1"):
            c.create_topic(t, partitions=2, rf=3)
            c.wait_topic(t, 2)
        yield c
    finally:
        c.close()


def conf(cluster, user, **extra):
    base = {"bootstrap.servers": ",".join(n.listeners["SASL_PLAINTEXT"] for n in cluster.nodes.values()),
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": user,
            "sasl.password": PASSWORD, "socket.timeout.ms": 15000}
    base.update(extra)
    return base


def admin(cluster, user="admin"):
    return AdminClient(conf(cluster, user))


def applied_everywhere(cluster):
    """Waits until every node lists the ACLs node 1 lists. An admin write
    answers once node 1 has applied it; the other brokers apply it soon after
    (ACLs propagate as in Kafka), and a test that goes on to a partition
    leader elsewhere must not race that."""
    want = sorted(map(str, cluster.get(1, "/v1/acls")[1]))
    for nid in cluster.nodes:
        harness.wait_for(f"node {nid} to apply the ACL change", 30,
                         lambda nid=nid: sorted(map(str, cluster.get(nid, "/v1/acls")[1])) == want)


def add_acl(cluster, **acl):
    status, body = cluster.send(1, "POST", "/v1/acls", acl)
    assert status == 201, (status, body)
    applied_everywhere(cluster)
    return body


def remove_acls(cluster, **flt):
    status, body = cluster.send(1, "DELETE", "/v1/acls", flt)
    assert status == 200, (status, body)
    applied_everywhere(cluster)
    return body


def produce_one(cluster, user, topic, timeout=20):
    """Produces one record as `user`; the delivery error (or None)."""
    p = ck.Producer(conf(cluster, user, **{"acks": "all", "message.timeout.ms": timeout * 1000,
                                           "enable.idempotence": False}))
    result = []
    p.produce(topic, value=b"v", on_delivery=lambda err, msg: result.append(err))
    p.flush(timeout + 5)
    assert result, "no delivery report"
    return result[0]


TOPIC_AUTHORIZATION_FAILED = 29


def sasl_plain(addr, user):
    """A connection authenticated with SASL PLAIN (SaslHandshake v1, SaslAuthenticate v0)."""
    host, port = addr.rsplit(":", 1)
    s = wire.socket.create_connection((host, int(port)), timeout=15)
    s.sendall(wire.request(17, 1, 1, wire.string("PLAIN")))
    assert wire.recv_response(s, 1).i16() == 0
    s.sendall(wire.request(36, 0, 2, wire.nbytes(f"\x00{user}\x00{PASSWORD}".encode())))
    assert wire.recv_response(s, 2).i16() == 0
    return s


_correlation = iter(range(100, 1 << 30))


def produce_on(sock, topic, partition):
    """Produce v3 of one record on an open connection: the partition's error code."""
    cid = next(_correlation)
    body = (wire.string(None) + wire.i16(-1) + wire.i32(10000) + wire.i32(1) + wire.string(topic) + wire.i32(1)
            + wire.i32(partition) + wire.nbytes(wire.record_batch([(b"k", b"v")])))
    sock.sendall(wire.request(wire.API_PRODUCE, 3, cid, body))
    r = wire.recv_response(sock, cid)
    assert r.i32() == 1 and r.string() == topic and r.i32() == 1 and r.i32() == partition
    return r.i16()


@pytest.fixture
def clean_acls(acl_cluster):
    yield
    remove_acls(acl_cluster)


def test_prefixed_allow_metadata_hiding_deny_wins_and_groups(acl_cluster, clean_acls):
    c = acl_cluster
    add_acl(c, principal="User:alice", resource_type="topic", resource_name="a-", pattern_type="prefixed",
            operation="write", permission="allow")
    assert produce_one(c, "alice", "a-1") is None
    err = produce_one(c, "alice", "b-1", timeout=5)
    assert err is not None and err.code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED, err

    # Metadata shows alice a-1 (WRITE implies DESCRIBE) and hides b-1.
    md = admin(c, "alice").list_topics(timeout=20)
    assert "a-1" in md.topics and "b-1" not in md.topics, sorted(md.topics)
    assert "b-1" in admin(c, "admin").list_topics(timeout=20).topics, "a super user sees everything"

    # A consumer group without READ on the group: GROUP_AUTHORIZATION_FAILED.
    add_acl(c, principal="User:alice", resource_type="topic", resource_name="a-1", operation="read",
            permission="allow")
    consumer = ck.Consumer(conf(c, "alice", **{"group.id": "g-alice", "auto.offset.reset": "earliest",
                                               "enable.auto.commit": False}))
    try:
        consumer.subscribe(["a-1"])
        deadline = time.monotonic() + 20
        seen = None
        while seen is None and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and m.error():
                seen = m.error()
        assert seen is not None and seen.code() == ck.KafkaError.GROUP_AUTHORIZATION_FAILED, seen
    finally:
        consumer.close()

    # With READ on the group, the same consumer reads what alice wrote.
    add_acl(c, principal="User:alice", resource_type="group", resource_name="g-", pattern_type="prefixed",
            operation="read", permission="allow")
    consumer = ck.Consumer(conf(c, "alice", **{"group.id": "g-alice2", "auto.offset.reset": "earliest",
                                               "enable.auto.commit": False}))
    try:
        consumer.subscribe(["a-1"])
        deadline = time.monotonic() + 30
        got = None
        while got is None and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and not m.error():
                got = m
        assert got is not None and got.value() == b"v"
        consumer.commit(message=got, asynchronous=False)
    finally:
        consumer.close()

    # On one open, authenticated connection to the partition's leader: a DENY
    # beats the ALLOW at once, and removing it takes effect within a second.
    leader = c.topic("a-1")["partitions"][0]["leader"]
    s = sasl_plain(c.node(leader).listeners["SASL_PLAINTEXT"], "alice")
    try:
        assert produce_on(s, "a-1", 0) == 0
        add_acl(c, principal="User:alice", resource_type="topic", resource_name="a-1", operation="write",
                permission="deny")
        assert produce_on(s, "a-1", 0) == TOPIC_AUTHORIZATION_FAILED
        removed = time.monotonic()
        remove_acls(c, principal="User:alice", permission="deny")
        while produce_on(s, "a-1", 0) != 0:
            assert time.monotonic() - removed < 1.0, "still refused a second after the DENY was removed"
    finally:
        s.close()


def test_acl_apis_of_kafka_and_their_errors(acl_cluster, clean_acls):
    c = acl_cluster
    a = admin(c)
    binding = AclBinding(ResourceType.TOPIC, "x-", ResourcePatternType.PREFIXED, "User:bob", "*",
                         AclOperation.READ, AclPermissionType.ALLOW)
    for f in a.create_acls([binding]).values():
        assert f.result(timeout=30) is None
    found = a.describe_acls(AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                             AclOperation.ANY, AclPermissionType.ANY)).result(timeout=30)
    assert binding in found, found
    # The ACL is committed when CreateAcls answers; node 2 applies it soon
    # after (ACLs propagate to brokers as in Kafka), so its view is polled.
    want = {"principal": "User:bob", "host": "*", "resource_type": "topic", "resource_name": "x-",
            "pattern_type": "prefixed", "operation": "read", "permission": "allow"}
    harness.wait_for("node 2's /v1/acls to list the new ACL", 30,
                     lambda: (lambda r: r[0] == 200 and want in r[1])(c.get(2, "/v1/acls")))
    # MATCH: the ACLs that apply to x-1 include the prefixed one.
    matching = a.describe_acls(AclBindingFilter(ResourceType.TOPIC, "x-1", ResourcePatternType.MATCH, None, None,
                                                AclOperation.ANY, AclPermissionType.ANY)).result(timeout=30)
    assert binding in matching

    # A user without ALTER on the cluster may not create ACLs; nor DESCRIBE them.
    bob = admin(c, "bob")
    with pytest.raises(ck.KafkaException) as e:
        for f in bob.create_acls([binding]).values():
            f.result(timeout=30)
    assert e.value.args[0].code() == ck.KafkaError.CLUSTER_AUTHORIZATION_FAILED, str(e.value)
    # DescribeAcls: librdkafka drops the response's error code (an empty list
    # comes back), so it is read by hand: CLUSTER_AUTHORIZATION_FAILED (31), no ACLs.
    s = sasl_plain(c.node(1).listeners["SASL_PLAINTEXT"], "bob")
    try:
        body = wire.i8(1) + wire.string(None) + wire.i8(1) + wire.string(None) + wire.string(None) + wire.i8(1) \
            + wire.i8(1)
        s.sendall(wire.request(29, 1, 9, body))
        r = wire.recv_response(s, 9)
        r.i32()  # throttle
        assert r.i16() == 31
        r.string()  # message
        assert r.i32() == 0, "no ACL is shown"
    finally:
        s.close()

    deleted = a.delete_acls([AclBindingFilter(ResourceType.TOPIC, "x-", ResourcePatternType.PREFIXED, None, None,
                                              AclOperation.ANY, AclPermissionType.ANY)])
    for f in deleted.values():
        assert binding in f.result(timeout=30)

    # An ACL with an unknown operation: CreateAcls v1 by hand, INVALID_REQUEST (42),
    # and nothing is stored.
    creation = (wire.i8(2) + wire.string("t") + wire.i8(3) + wire.string("User:bob") + wire.string("*")
                + wire.i8(99) + wire.i8(3))
    r = wire.roundtrip(c.node(1).kafka_addr, 30, 1, wire.i32(1) + creation)
    r.i32()  # throttle
    assert r.i32() == 1
    assert r.i16() == 42, "an unknown operation is refused"
    # (DeleteAcls may have been answered by another broker: node 1 is polled.)
    harness.wait_for("node 1 to list no ACL", 30, lambda: c.get(1, "/v1/acls") == (200, []))

    # The admin API refuses the same, naming why.
    for bad in [dict(principal="User:bob", resource_type="topic", resource_name="t", operation="frobnicate",
                     permission="allow"),
                dict(principal="bob", resource_type="topic", resource_name="t", operation="read", permission="allow"),
                dict(principal="User:bob", resource_type="topic", resource_name="t", operation="read",
                     permission="allow", host="example.com"),
                dict(principal="User:bob", resource_type="cluster", resource_name="other", operation="alter",
                     permission="allow"),
                dict(resource_type="topic", resource_name="t", operation="read", permission="allow")]:
        status, body = c.send(1, "POST", "/v1/acls", bad)
        assert status == 400 and body["error"] == "INVALID_REQUEST", (bad, status, body)


def test_the_acl_cli(acl_cluster, clean_acls):
    c = acl_cluster
    url = f"http://{c.node(1).admin}"
    run = lambda *a: subprocess.run([harness.strom_bin(), *a, "--admin-url", url], capture_output=True, timeout=30)
    p = run("acl", "add", "--principal", "User:bob", "--resource-type", "cluster", "--operation", "describe",
            "--permission", "allow")
    assert p.returncode == 0, p.stderr.decode()
    p = run("acl", "list")
    assert p.returncode == 0 and "User:bob" in p.stdout.decode() and "kafka-cluster" in p.stdout.decode()
    assert run("acl", "remove").returncode != 0, "removing with no filter is refused by the CLI"
    p = run("acl", "remove", "--principal", "User:bob")
    assert p.returncode == 0 and "User:bob" in p.stdout.decode()
    assert c.get(1, "/v1/acls")[1] == []


def test_cluster_operations_need_the_cluster_acls(acl_cluster, clean_acls):
    c = acl_cluster
    bob = admin(c, "bob")
    # Creating a topic needs CREATE on the cluster or the topic.
    fs = bob.create_topics([ck.admin.NewTopic("bob-topic", 1, 1)], operation_timeout=20)
    with pytest.raises(ck.KafkaException) as e:
        fs["bob-topic"].result(timeout=30)
    assert e.value.args[0].code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
    add_acl(c, principal="User:bob", resource_type="topic", resource_name="bob-", pattern_type="prefixed",
            operation="all", permission="allow")
    fs = bob.create_topics([ck.admin.NewTopic("bob-topic", 1, 3)], operation_timeout=20)
    fs["bob-topic"].result(timeout=30)
    # Describing the cluster's configs needs DESCRIBE_CONFIGS on the cluster.
    from confluent_kafka.admin import ConfigResource
    fs = bob.describe_configs([ConfigResource(ConfigResource.Type.BROKER, "1")])
    with pytest.raises(ck.KafkaException) as e:
        list(fs.values())[0].result(timeout=30)
    assert e.value.args[0].code() == ck.KafkaError.CLUSTER_AUTHORIZATION_FAILED
    # The topic's configs are his (ALL implies DESCRIBE_CONFIGS).
    fs = bob.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "bob-topic")])
    assert "retention.ms" in list(fs.values())[0].result(timeout=30)
    # Idempotent producers: WRITE on some topic is enough (Kafka's rule).
    records = clients.make_records(50, partitions=1, seed=3)
    boot = conf(c, "bob")
    clients.produce_confluent(boot["bootstrap.servers"], "bob-topic", records, enable_idempotence=True,
                              security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256",
                              sasl_username="bob", sasl_password=PASSWORD)
