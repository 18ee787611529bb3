"""Bad input at the Kafka port: the offending connection is closed, the broker and the
clients on other connections carry on; oversized records and unknown topics are
refused with the right Kafka errors."""
import os
import socket
import struct
import threading
import time

import confluent_kafka as ck
import pytest
from confluent_kafka import KafkaError

import clients
import harness
import wire

MAX_BYTES = 100_000  # message.max.bytes of the broker under test


@pytest.fixture(scope="module")
def strict(tmp_path_factory):
    """One node with auto topic creation off and a small message.max.bytes."""
    c = harness.start(tmp_path_factory.mktemp("strict"), 1,
                      harness.FAST + ("auto.create.topics.enable=false", f"message.max.bytes={MAX_BYTES}"))
    yield c
    c.close()


def closed_by_peer(sock, timeout=10):
    """True when the peer closes the connection (EOF or reset) within timeout; reads and
    discards anything it sends first."""
    sock.settimeout(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            data = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False
        if not data:
            return True
    return False


BAD_INPUTS = {
    # 16 bytes of 0xFF: api key -1, version -1, ...
    "garbage": struct.pack(">i", 16) + b"\xff" * 16,
    # Random bytes after a plausible length prefix and an API key that does not exist.
    "random": struct.pack(">ih", 200, 0x7ABC) + os.urandom(198),
    # An ApiVersions frame that says 107 bytes, sends 20, then our side shuts its writes.
    "truncated": wire.request(wire.API_API_VERSIONS, 0, 1, b"\x00" * 86)[:24],
    # A 2 GB length prefix (2^31 - 1) and the start of a body.
    "length-2GB": struct.pack(">i", 2**31 - 1) + b"\x00\x12\x00\x00" + b"\x00" * 60,
    # A negative length.
    "length-negative": struct.pack(">i", -5) + b"\x00" * 16,
    # A header that is longer than its frame: client id length 30000 in a 12-byte frame.
    "header-overrun": struct.pack(">ihhih", 10, 18, 0, 1, 30000),
}


def test_bad_frames_close_only_their_connection(strict):
    node = strict.node(1)
    topic = "bystander"
    strict.create_topic(topic, partitions=1)
    strict.wait_topic(topic, 1)

    errors = []
    delivered = []
    stop = threading.Event()
    producer = clients.confluent_producer(node.kafka, acks="all", linger_ms=0,
                                          error_cb=lambda e: errors.append(("producer", e)))

    def produce_loop():
        i = 0
        while not stop.is_set() and i < 100_000:
            try:
                producer.produce(topic, value=f"bystander-{i}".encode(),
                                 on_delivery=lambda e, m: delivered.append((e, m.offset(), m.value())))
                i += 1
            except BufferError:
                pass
            producer.poll(0.002)

    consumer = clients.confluent_consumer(node.kafka, error_cb=lambda e: errors.append(("consumer", e)))
    consumer.assign([ck.TopicPartition(topic, 0, 0)])
    consumed = []

    def consume_loop():
        while not stop.is_set():
            for m in consumer.consume(num_messages=500, timeout=0.2):
                if m.error():
                    errors.append(("consume", m.error()))
                else:
                    consumed.append((m.offset(), m.value()))

    threads = [threading.Thread(target=produce_loop), threading.Thread(target=consume_loop)]
    for t in threads:
        t.start()
    try:
        harness.wait_for("the bystander producer and consumer to be running", 30,
                         lambda: len(delivered) > 100 and len(consumed) > 100)
        rss_before = harness.rss_bytes(node.pid)
        for name, data in BAD_INPUTS.items():
            with socket.create_connection(node.kafka_addr, timeout=10) as s:
                s.sendall(data)
                if name == "truncated":
                    s.shutdown(socket.SHUT_WR)
                assert closed_by_peer(s), f"{name}: the broker kept the connection open for 10 s"
            assert node.alive(), f"the broker died on {name} input"
            # The broker still answers on a new connection.
            assert wire.api_versions(node.kafka_addr), f"no ApiVersions answer after {name} input"
            n = len(delivered)
            harness.wait_for(f"the bystander producer to progress after {name} input", 30,
                             lambda: len(delivered) > n + 20)
        rss_after = harness.rss_bytes(node.pid)
        assert rss_after - rss_before < 256 * 1024 * 1024, (
            f"broker RSS grew from {rss_before >> 20} MiB to {rss_after >> 20} MiB on bad frames")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert producer.flush(30) == 0
    consumer.close()

    failed = [d for d in delivered if d[0] is not None]
    assert not failed, f"bystander deliveries failed: {failed[:3]}"
    assert not errors, f"bystander clients saw errors: {errors[:5]}"
    # No gaps, no duplicates (the order of appends is test_protocol.py's business).
    offsets = sorted(o for _, o, _ in delivered)
    assert offsets == list(range(len(offsets))), f"bystander offsets have gaps or duplicates: {offsets[:20]}..."
    # Every record the consumer saw is the one produced at that offset.
    by_offset = {o: v for _, o, v in delivered}
    assert consumed, "bystander consumer read nothing"
    assert [o for o, _ in consumed] == list(range(len(consumed))), "bystander consumer skipped offsets"
    wrong = [(o, v, by_offset.get(o)) for o, v in consumed if by_offset.get(o) != v]
    assert not wrong, f"bystander consumer read other bytes than were acknowledged: {wrong[:3]}"


def test_record_larger_than_message_max_bytes(strict):
    topic = "big"
    strict.create_topic(topic, partitions=1)
    strict.wait_topic(topic, 1)
    big = os.urandom(MAX_BYTES + 50_000)  # incompressible: too large compressed or not

    # confluent-kafka: allow it client-side, so the broker is the one refusing.
    p = clients.confluent_producer(strict.bootstrap, message_max_bytes=10_000_000, message_timeout_ms=30000)
    results = []
    p.produce(topic, value=big, on_delivery=lambda e, m: results.append(e))
    assert p.flush(45) == 0
    assert len(results) == 1 and results[0] is not None, f"the oversized record was accepted: {results}"
    assert results[0].code() == KafkaError.MSG_SIZE_TOO_LARGE, f"expected MESSAGE_TOO_LARGE, got {results[0]}"
    # The same producer still delivers a normal record afterwards.
    p.produce(topic, value=b"small", on_delivery=lambda e, m: results.append((e, m.offset())))
    assert p.flush(30) == 0
    assert results[1] == (None, 0), f"small record after the refused one: {results[1]}"

    # kafka-python too.
    import kafka.errors

    kp = clients.kp_producer(strict.bootstrap, max_request_size=10_000_000)
    try:
        f = kp.send(topic, value=big)
        kp.flush(timeout=45)
        assert f.is_done and f.failed(), "kafka-python: the oversized record was accepted"
        assert isinstance(f.exception, kafka.errors.MessageSizeTooLargeError), repr(f.exception)
    finally:
        kp.close(timeout=10)

    t = strict.topic(topic)
    assert t["partitions"][0]["high_watermark"] == 1, "the oversized records must not be in the log"


def test_unknown_topic_without_auto_create(strict):
    topic = "no-such-topic"
    node = strict.node(1)

    # Metadata asking for it (a producer's Metadata request allows auto creation).
    p = clients.confluent_producer(strict.bootstrap, topic_metadata_propagation_max_ms=1000, message_timeout_ms=15000)
    md = p.list_topics(topic, timeout=15)
    assert topic in md.topics and md.topics[topic].error is not None, f"metadata for {topic}: {md.topics.get(topic)}"
    assert md.topics[topic].error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART, md.topics[topic].error

    # Producing to it fails with UNKNOWN_TOPIC_OR_PARTITION (librdkafka may report its
    # local twin _UNKNOWN_TOPIC once it knows the topic does not exist).
    results = []
    try:
        p.produce(topic, value=b"x", on_delivery=lambda e, m: results.append(e))
    except ck.KafkaException as e:
        results.append(e.args[0])
    assert p.flush(30) == 0
    assert len(results) == 1 and results[0] is not None, f"produce to an unknown topic succeeded: {results}"
    assert results[0].code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC), results[0]

    # A raw Produce request gets the broker's partition error UNKNOWN_TOPIC_OR_PARTITION (3).
    versions = wire.api_versions(node.kafka_addr)
    v = wire.pick_version(versions, wire.API_PRODUCE, 3, 8)
    assert v is not None, f"broker Produce versions {versions.get(wire.API_PRODUCE)} include none of 3..8"
    err, _ = wire.produce(node.kafka_addr, topic, 0, wire.record_batch([(b"k", b"v")], int(time.time() * 1000)),
                          version=v)
    assert err == 3, f"raw Produce to an unknown topic: error code {err}, expected 3 (UNKNOWN_TOPIC_OR_PARTITION)"

    # And the topic was not created by any of this.
    status, body = strict.get(1, f"/v1/topics/{topic}")
    assert status == 404, f"{topic} exists after producing with auto.create.topics.enable=false: {body}"


def test_raw_produce_is_accepted(strict):
    """The raw encoder used above is right: the same request to an existing topic succeeds."""
    topic = "raw-ok"
    strict.create_topic(topic, partitions=1)
    strict.wait_topic(topic, 1)
    node = strict.node(1)
    v = wire.pick_version(wire.api_versions(node.kafka_addr), wire.API_PRODUCE, 3, 8)
    assert v is not None
    batch = wire.record_batch([(b"k1", b"v1"), (None, b"v2")], int(time.time() * 1000))
    assert wire.produce(node.kafka_addr, topic, 0, batch, version=v) == (0, 0)
    got = clients.consume_confluent(strict.bootstrap, topic, {0: 2})[0]
    assert [(g.key, g.value) for g in got] == [(b"k1", b"v1"), (None, b"v2")]


def test_client_telemetry_is_not_offered_as_kafka_without_a_telemetry_plugin(strict):
    """KIP-714: a Kafka broker without a telemetry plugin leaves GetTelemetrySubscriptions
    (71) and PushTelemetry (72) out of ApiVersions, so clients that push metrics by default
    (librdkafka 2.5+, the Java client 3.7+) skip them; one sent anyway is an API the broker
    does not enable, and its connection is closed."""
    versions = wire.api_versions(strict.node(1).kafka_addr)
    assert versions and 71 not in versions and 72 not in versions, sorted(versions)
    with socket.create_connection(strict.node(1).kafka_addr, timeout=10) as s:
        # v0, flexible: a zero client instance id and no tagged fields.
        s.sendall(wire.request(71, 0, 1, b"\x00" * 16 + b"\x00", flexible=True))
        assert closed_by_peer(s), "the broker kept the connection open for 10 s"
    assert wire.api_versions(strict.node(1).kafka_addr) == versions, "the broker carries on"
