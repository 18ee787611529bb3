"""Topic and broker configs through the Kafka admin APIs (confluent-kafka AdminClient):
Kafka's whole list of topic configs is accepted with Kafka's types and bounds,
IncrementalAlterConfigs APPENDs to and SUBTRACTs from list configs, dynamic broker
configs change the cluster-wide defaults topics inherit, and a LogAppendTime topic
stamps records with the broker's clock."""
import time
import uuid

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource,
                                   NewTopic, ResourceType)

import harness
import wire
from clients import confluent_consumer, confluent_producer

# A non-default valid value for every topic config in Kafka 3.x/4.x TopicConfig.
EVERY_TOPIC_CONFIG = {
    "cleanup.policy": "compact,delete",
    "compression.type": "zstd",
    "compression.gzip.level": "5",
    "compression.lz4.level": "10",
    "compression.zstd.level": "7",
    "delete.retention.ms": "3600000",
    "file.delete.delay.ms": "1000",
    "flush.messages": "1000",
    "flush.ms": "5000",
    "follower.replication.throttled.replicas": "0:1",
    "index.interval.bytes": "8192",
    "leader.replication.throttled.replicas": "*",
    "local.retention.bytes": "1000000",
    "local.retention.ms": "60000",
    "max.compaction.lag.ms": "86400000",
    "max.message.bytes": "2000000",
    "message.downconversion.enable": "false",
    "message.format.version": "3.0-IV1",
    "message.timestamp.after.max.ms": "3600000",
    "message.timestamp.before.max.ms": "86400000",
    "message.timestamp.difference.max.ms": "86400000",
    "message.timestamp.type": "LogAppendTime",
    "min.cleanable.dirty.ratio": "0.25",
    "min.compaction.lag.ms": "1000",
    "min.insync.replicas": "1",
    "preallocate": "true",
    "remote.storage.enable": "false",
    "retention.bytes": "100000000",
    "retention.ms": "86400000",
    "segment.bytes": "10485760",
    "segment.index.bytes": "1048576",
    "segment.jitter.ms": "1000",
    "segment.ms": "3600000",
    "unclean.leader.election.enable": "true",
    "remote.log.copy.disable": "false",
    "remote.log.delete.on.disable": "false",
}

BAD_VALUES = [
    ("compression.type", "brotli"),
    ("compression.gzip.level", "0"),
    ("message.timestamp.type", "WallClock"),
    ("min.cleanable.dirty.ratio", "1.5"),
    ("delete.retention.ms", "-1"),
    ("segment.index.bytes", "2"),
    ("preallocate", "maybe"),
    ("cleanup.policy", "shred"),
    ("leader.replication.throttled.replicas", "0-1"),
    ("no.such.config", "1"),
]


def admin(cluster):
    return AdminClient({"bootstrap.servers": cluster.bootstrap})


def result(futures, timeout=30):
    """The one future's result, or the KafkaError it failed with."""
    (future,) = futures.values()
    try:
        return future.result(timeout)
    except ck.KafkaException as e:
        return e.args[0]


def describe(a, rtype, name):
    return result(a.describe_configs([ConfigResource(rtype, name)]))


def incremental(a, rtype, name, *entries):
    return result(a.incremental_alter_configs([ConfigResource(rtype, name, incremental_configs=list(entries))]))


def op(name, value, kind):
    return ConfigEntry(name, value, incremental_operation=kind)


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_every_kafka_topic_config_is_accepted_and_described(cluster):
    a = admin(cluster)
    topic = unique("every-config")
    assert result(a.create_topics([NewTopic(topic, 1, 1, config=EVERY_TOPIC_CONFIG)])) is None
    configs = harness.wait_for("the new topic's configs", 20, lambda: describe(a, ResourceType.TOPIC, topic))
    for name, value in EVERY_TOPIC_CONFIG.items():
        assert name in configs, f"{name} is not described"
        assert configs[name].value == value, (name, configs[name].value)
        assert configs[name].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value, name


@pytest.mark.parametrize("name,value", BAD_VALUES)
def test_bad_names_and_values_are_invalid_config(cluster, name, value):
    a = admin(cluster)
    err = result(a.create_topics([NewTopic(unique("bad-config"), 1, 1, config={name: value})]))
    assert isinstance(err, ck.KafkaError) and err.code() == ck.KafkaError.INVALID_CONFIG, (name, err)
    assert name in err.str(), err.str()


def test_append_and_subtract_on_list_configs(cluster):
    a = admin(cluster)
    topic = unique("list-configs")
    assert result(a.create_topics([NewTopic(topic, 1, 1)])) is None
    harness.wait_for("topic", 20, lambda: describe(a, ResourceType.TOPIC, topic))
    assert incremental(a, ResourceType.TOPIC, topic, op("cleanup.policy", "compact", AlterConfigOpType.APPEND)) is None
    assert describe(a, ResourceType.TOPIC, topic)["cleanup.policy"].value == "delete,compact"
    assert incremental(a, ResourceType.TOPIC, topic, op("cleanup.policy", "delete", AlterConfigOpType.SUBTRACT)) is None
    assert describe(a, ResourceType.TOPIC, topic)["cleanup.policy"].value == "compact"
    for entry in (op("leader.replication.throttled.replicas", "0:1,0:2", AlterConfigOpType.APPEND),
                  op("leader.replication.throttled.replicas", "0:2", AlterConfigOpType.APPEND),
                  op("leader.replication.throttled.replicas", "0:1", AlterConfigOpType.SUBTRACT)):
        assert incremental(a, ResourceType.TOPIC, topic, entry) is None
    assert describe(a, ResourceType.TOPIC, topic)["leader.replication.throttled.replicas"].value == "0:2"
    err = incremental(a, ResourceType.TOPIC, topic, op("retention.ms", "1000", AlterConfigOpType.APPEND))
    assert err.code() == ck.KafkaError.INVALID_CONFIG and "append is not allowed" in err.str(), err
    err = incremental(a, ResourceType.TOPIC, topic, op("retention.ms", "1000", AlterConfigOpType.SUBTRACT))
    assert err.code() == ck.KafkaError.INVALID_CONFIG and "subtract is not allowed" in err.str(), err


API_DESCRIBE_CONFIGS, API_INCREMENTAL_ALTER_CONFIGS = 32, 44
INVALID_REQUEST = 42


def raw_incremental(cluster, rtype, name, ops):
    """IncrementalAlterConfigs v0 by hand (librdkafka refuses an empty resource name, which
    is Kafka's cluster-wide default broker resource): [(name, op, value)] -> error code."""
    body = (wire.i32(1) + wire.i8(rtype) + wire.string(name) + wire.i32(len(ops))
            + b"".join(wire.string(k) + wire.i8(o) + wire.string(v) for k, o, v in ops) + wire.i8(0))
    r = wire.roundtrip(cluster.node(1).kafka_addr, API_INCREMENTAL_ALTER_CONFIGS, 0, body)
    r.i32()  # throttle
    assert r.i32() == 1
    return r.i16()


def raw_describe(cluster, rtype, name):
    """DescribeConfigs v1 by hand: {name: (value, source, read_only)}."""
    body = wire.i32(1) + wire.i8(rtype) + wire.string(name) + wire.i32(-1) + wire.i8(0)
    r = wire.roundtrip(cluster.node(1).kafka_addr, API_DESCRIBE_CONFIGS, 1, body)
    r.i32()  # throttle
    assert r.i32() == 1
    err, _, _, _ = r.i16(), r.string(), r.i8(), r.string()
    assert err == 0, err
    out = {}
    for _ in range(r.i32()):
        key, value, read_only, source, _ = r.string(), r.string(), r.i8(), r.i8(), r.i8()
        for _ in range(r.i32()):
            r.string(), r.string(), r.i8()
        out[key] = (value, source, bool(read_only))
    return out


def test_dynamic_broker_configs(cluster):
    a = admin(cluster)
    topic = unique("inherits")
    assert result(a.create_topics([NewTopic(topic, 1, 1)])) is None
    harness.wait_for("topic", 20, lambda: describe(a, ResourceType.TOPIC, topic))
    set_, delete = AlterConfigOpType.SET, AlterConfigOpType.DELETE
    try:
        # One broker's own dynamic configs (the broker id as the resource name).
        assert incremental(a, ResourceType.BROKER, "1", op("log.retention.ms", "123456", set_),
                           op("log.message.timestamp.type", "LogAppendTime", set_)) is None
        retention = describe(a, ResourceType.TOPIC, topic)["retention.ms"]
        assert (retention.value, retention.source) == ("123456", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
        broker = describe(a, ResourceType.BROKER, "1")
        assert broker["log.retention.ms"].value == "123456"
        assert broker["log.retention.ms"].source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
        assert broker["num.partitions"].is_read_only and not broker["log.retention.ms"].is_read_only
        # The dynamic config takes effect: the topic now stamps LogAppendTime.
        assert_log_append_time(cluster, topic)
        err = incremental(a, ResourceType.BROKER, "1", op("num.partitions", "3", set_))
        assert err.code() == ck.KafkaError.INVALID_REQUEST and "dynamically" in err.str(), err
        err = incremental(a, ResourceType.BROKER, "1", op("message.max.bytes", "-5", set_))
        assert err.code() == ck.KafkaError.INVALID_REQUEST, err
        err = incremental(a, ResourceType.BROKER, "1", op("no.such.broker.config", "1", set_))
        assert err.code() == ck.KafkaError.INVALID_CONFIG, err
        err = incremental(a, ResourceType.BROKER, "1", op("log.cleanup.policy", "compact", AlterConfigOpType.APPEND))
        assert err is None, err
        assert describe(a, ResourceType.BROKER, "1")["log.cleanup.policy"].value == "delete,compact"
        # AlterConfigs (not incremental) replaces the broker's whole set.
        assert result(a.alter_configs([ConfigResource(ResourceType.BROKER, "1",
                                                      set_config={"log.retention.ms": "777"})])) is None
        assert describe(a, ResourceType.BROKER, "1")["log.cleanup.policy"].source == ConfigSource.DEFAULT_CONFIG.value
        assert incremental(a, ResourceType.BROKER, "1", op("log.retention.ms", None, delete)) is None
        # The cluster-wide default (empty name), under the broker's own.
        assert raw_incremental(cluster, 4, "", [("log.retention.ms", 0, "654321")]) == 0
        assert raw_incremental(cluster, 4, "", [("num.partitions", 0, "2")]) == INVALID_REQUEST
        assert raw_describe(cluster, 4, "") == {
            "log.retention.ms": ("654321", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value, False)}
        retention = describe(a, ResourceType.TOPIC, topic)["retention.ms"]
        assert (retention.value, retention.source) == ("654321", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
    finally:
        incremental(a, ResourceType.BROKER, "1", op("log.retention.ms", None, delete),
                    op("log.message.timestamp.type", None, delete))
        raw_incremental(cluster, 4, "", [("log.retention.ms", 1, None)])
    retention = describe(a, ResourceType.TOPIC, topic)["retention.ms"]
    assert (retention.value, retention.source) == ("604800000", ConfigSource.DEFAULT_CONFIG.value)
    assert raw_describe(cluster, 4, "") == {}


def assert_log_append_time(cluster, topic):
    """Produces a record with a year-old timestamp; the delivery report and the consumer
    see LogAppendTime with the broker's clock."""
    old = int(time.time() * 1000) - 365 * 86_400_000
    reports = []
    p = confluent_producer(cluster.bootstrap)
    before = int(time.time() * 1000)
    p.produce(topic, key=b"k", value=b"v", partition=0, timestamp=old,
              on_delivery=lambda err, msg: reports.append((err, msg.timestamp())))
    assert p.flush(30) == 0
    after = int(time.time() * 1000)
    (err, (kind, ts)), = reports
    assert err is None
    assert kind == ck.TIMESTAMP_LOG_APPEND_TIME and before - 5000 <= ts <= after + 5000, (kind, ts)
    c = confluent_consumer(cluster.bootstrap, **{"group.id": unique("lat"), "auto.offset.reset": "earliest"})
    try:
        c.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
        msgs = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not msgs:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                msgs.append(m)
        assert msgs, "nothing consumed"
        kind, ts = msgs[-1].timestamp()
        assert kind == ck.TIMESTAMP_LOG_APPEND_TIME and before - 5000 <= ts <= after + 5000, (kind, ts, old)
    finally:
        c.close()


def test_log_append_time_topic(cluster):
    a = admin(cluster)
    topic = unique("log-append-time")
    config = {"message.timestamp.type": "LogAppendTime"}
    assert result(a.create_topics([NewTopic(topic, 1, 1, config=config)])) is None
    harness.wait_for("topic", 20, lambda: describe(a, ResourceType.TOPIC, topic))
    cluster.wait_topic(topic, 1)
    assert_log_append_time(cluster, topic)
