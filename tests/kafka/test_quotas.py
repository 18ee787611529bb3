"""Client quotas (KIP-13/55): a byte rate on one client id holds while another
client runs at full speed; DescribeClientQuotas and AlterClientQuotas by hand.

The cluster measures rates over `quota.window.num=2` one-second windows, so
that a quota takes hold within a second or two (Kafka's 11 windows let the
first ten seconds' worth through at once).
"""
import threading
import time

import confluent_kafka as ck
import pytest

import harness
import wire

API_DESCRIBE_CLIENT_QUOTAS, API_ALTER_CLIENT_QUOTAS = 48, 49
QUOTA = 1_000_000  # bytes/s


def alter_quota(addr, entity, key, value, remove=False):
    """AlterClientQuotas v0 of one entry with one op; the entry's error code."""
    ent = wire.i32(len(entity)) + b"".join(wire.string(t) + wire.string(n) for t, n in entity)
    op = wire.string(key) + wire.struct.pack(">d", value) + wire.i8(1 if remove else 0)
    body = wire.i32(1) + ent + wire.i32(1) + op + wire.i8(0)
    r = wire.roundtrip(addr, API_ALTER_CLIENT_QUOTAS, 0, body)
    r.i32()  # throttle
    assert r.i32() == 1
    return r.i16()


def describe_quotas(addr, entity_type, name):
    """DescribeClientQuotas v0 for one exact entity: {key: value}, or the error code."""
    body = wire.i32(1) + wire.string(entity_type) + wire.i8(0) + wire.string(name) + wire.i8(0)
    r = wire.roundtrip(addr, API_DESCRIBE_CLIENT_QUOTAS, 0, body)
    r.i32()
    err = r.i16()
    r.string()
    if err:
        return err
    values = {}
    for _ in range(r.i32()):
        for _ in range(r.i32()):
            r.string(), r.string()
        for _ in range(r.i32()):
            key = r.string()
            values[key] = wire.struct.unpack(">d", r.take(8))[0]
    return values


@pytest.fixture(scope="module")
def quota_cluster(tmp_path_factory):
    c = harness.start(tmp_path_factory.mktemp("strom"), 1, harness.FAST + ("quota.window.num=2",))
    yield c
    c.close()


def run_producer(bootstrap, topic, client_id, seconds, out):
    """Produces 1 KiB records as fast as the client allows for `seconds`;
    out['bytes'] = bytes acknowledged within that time."""
    # Requests of at most 64 KiB: a quota is measured over two one-second
    # windows here, and 1 MB requests against 1 MB/s would be too coarse to see.
    p = ck.Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "linger.ms": 5, "acks": 1,
                     "queue.buffering.max.kbytes": 4096, "batch.size": 64 << 10})
    payload = b"x" * 1024
    done = {"bytes": 0}
    deadline = time.monotonic() + seconds

    def cb(err, msg):
        if err is None and time.monotonic() <= deadline:
            done["bytes"] += len(msg.value())

    while time.monotonic() < deadline:
        try:
            p.produce(topic, payload, on_delivery=cb)
        except BufferError:
            p.poll(0.01)
        p.poll(0)
    p.flush(30)
    out.update(done)


def test_a_produce_quota_holds_while_another_client_runs_free(quota_cluster):
    c = quota_cluster
    c.create_topic("quota-p", partitions=2)
    c.wait_topic("quota-p", 2)
    addr = c.node(1).kafka_addr
    assert alter_quota(addr, [("client-id", "slow")], "producer_byte_rate", QUOTA) == 0
    assert describe_quotas(addr, "client-id", "slow") == {"producer_byte_rate": QUOTA}
    slow, fast = {}, {}
    seconds = 20
    threads = [threading.Thread(target=run_producer, args=(c.bootstrap, "quota-p", cid, seconds, out))
               for cid, out in (("slow", slow), ("fast", fast))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=seconds + 60)
    slow_rate, fast_rate = slow["bytes"] / seconds, fast["bytes"] / seconds
    assert 0.8 * QUOTA <= slow_rate <= 1.2 * QUOTA, f"slow client at {slow_rate / 1e6:.2f} MB/s, quota 1 MB/s"
    assert fast_rate > 5 * QUOTA, f"the unthrottled client ran at only {fast_rate / 1e6:.2f} MB/s"


def test_a_fetch_quota_holds(quota_cluster):
    c = quota_cluster
    c.create_topic("quota-f", partitions=1)
    c.wait_topic("quota-f", 1)
    # Batches of at most 64 KiB, so that the consumer's 64 KiB fetches are
    # answered 64 KiB at a time (a fetch returns at least one whole batch).
    p = ck.Producer({"bootstrap.servers": c.bootstrap, "linger.ms": 5, "batch.size": 64 << 10})
    payload = b"y" * 1024
    for _ in range(16_000):
        while True:
            try:
                p.produce("quota-f", payload)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0
    addr = c.node(1).kafka_addr
    assert alter_quota(addr, [("client-id", "slowc")], "consumer_byte_rate", QUOTA) == 0
    consumer = ck.Consumer({"bootstrap.servers": c.bootstrap, "client.id": "slowc", "group.id": "quota-f",
                            "enable.auto.commit": False, "fetch.max.bytes": 64 << 10, "message.max.bytes": 64 << 10,
                            "max.partition.fetch.bytes": 64 << 10})
    try:
        consumer.assign([ck.TopicPartition("quota-f", 0, 0)])
        seconds, got = 8, 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for m in consumer.consume(num_messages=1000, timeout=0.2):
                if not m.error():
                    got += len(m.value())
        rate = got / seconds
        assert 0.75 * QUOTA <= rate <= 1.25 * QUOTA, f"consumer read {rate / 1e6:.2f} MB/s under a 1 MB/s quota"
    finally:
        consumer.close()


def test_quota_requests_that_do_not_fit_are_refused(quota_cluster):
    addr = quota_cluster.node(1).kafka_addr
    assert alter_quota(addr, [("client-id", "c")], "controller_mutation_rate", 5.0) == 42
    assert alter_quota(addr, [("client-id", "c")], "producer_byte_rate", -1.0) == 42
    assert alter_quota(addr, [("ip", "1.2.3.4")], "producer_byte_rate", 5.0) == 42
    assert alter_quota(addr, [("user", None)], "producer_byte_rate", 5.0) == 0, "the default user"
    assert alter_quota(addr, [("user", None)], "producer_byte_rate", 0.0, remove=True) == 0
    assert describe_quotas(addr, "client-id", "c") == {}


def test_quotas_through_the_admin_api(quota_cluster):
    c = quota_cluster
    addr = c.node(1).kafka_addr
    status, body = c.send(1, "PATCH", "/v1/quotas", {"client_id": "api-client", "quotas": {"producer_byte_rate": 5000}})
    assert status == 200 and {"user": None, "client_id": "api-client", "quotas": {"producer_byte_rate": 5000.0}} in body
    assert describe_quotas(addr, "client-id", "api-client") == {"producer_byte_rate": 5000.0}, "the same records"
    status, body = c.send(1, "PATCH", "/v1/quotas", {"user": "<default>", "quotas": {"consumer_byte_rate": 7.5}})
    assert status == 200 and {"user": "<default>", "client_id": None, "quotas": {"consumer_byte_rate": 7.5}} in body
    for bad in [{"quotas": {"producer_byte_rate": 1}}, {"client_id": "x", "quotas": {"bogus": 1}},
                {"client_id": "x", "quotas": {"producer_byte_rate": 0}}, {"client_id": "x", "quotas": {}},
                {"client_id": "x"}]:
        status, body = c.send(1, "PATCH", "/v1/quotas", bad)
        assert (status, body["error"]) == (400, "INVALID_REQUEST"), (bad, status, body)
    status, body = c.send(1, "PATCH", "/v1/quotas", {"client_id": "api-client", "quotas": {"producer_byte_rate": None}})
    assert status == 200 and all(q["client_id"] != "api-client" for q in body)
    assert c.send(1, "PATCH", "/v1/quotas", {"user": "<default>", "quotas": {"consumer_byte_rate": None}})[0] == 200


def count_requests(addr, client_id, seconds):
    """ApiVersions v1 requests one connection gets answered in `seconds`, and the
    largest throttle time in their answers."""
    s = wire.socket.create_connection(addr, timeout=10)
    n, throttle, deadline = 0, 0, time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            s.sendall(wire.request(wire.API_API_VERSIONS, 1, n, b"", client_id=client_id))
            r = wire.recv_response(s, n)
            assert r.i16() == 0
            for _ in range(r.i32()):
                r.take(6)  # api key, min and max version
            throttle = max(throttle, r.i32())
            n += 1
    finally:
        s.close()
    return n, throttle


def test_a_request_percentage_quota_mutes_a_busy_client(quota_cluster):
    """request_percentage (KIP-124): the time spent on a client's requests is measured;
    over the quota, its connection is muted and its answers carry the throttle time."""
    addr = quota_cluster.node(1).kafka_addr
    # 0.01% of a thread: 100 µs of handling per second.
    assert alter_quota(addr, [("client-id", "chatty")], "request_percentage", 0.01) == 0
    try:
        free, free_throttle = count_requests(addr, "quiet", 3)
        throttled, throttle = count_requests(addr, "chatty", 3)
        assert free > 200, f"an unthrottled client got only {free} answers in 3 s"
        assert throttled < free / 10, f"the throttled client got {throttled} answers, the free one {free}"
        # The answers say so too (KIP-219), so that a client can back off by itself.
        assert free_throttle == 0
        assert throttle > 0, "no throttle time in the throttled client's answers"
    finally:
        assert alter_quota(addr, [("client-id", "chatty")], "request_percentage", 0.0, remove=True) == 0
