"""Real Kafka clients against strom: topics created through each library's AdminClient,
10,000 records under every codec read back byte for byte with the other library,
partition leaders on other nodes, ListOffsets, the idempotent producer."""
import collections
import logging
import signal
import struct
import time
import zlib

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient
from kafka.structs import TopicPartition as KpTopicPartition

import clients
import wire
from clients import CODECS, Rec

N_RECORDS = 10_000


def test_api_versions_advertises_the_core_apis(cluster):
    versions = wire.api_versions(cluster.node(1).kafka_addr)
    for key, name in [(wire.API_PRODUCE, "Produce"), (wire.API_FETCH, "Fetch"), (wire.API_LIST_OFFSETS, "ListOffsets"),
                      (wire.API_METADATA, "Metadata"), (wire.API_API_VERSIONS, "ApiVersions"),
                      (wire.API_CREATE_TOPICS, "CreateTopics")]:
        assert key in versions, f"ApiVersions does not advertise {name} ({key}): {sorted(versions)}"
        lo, hi = versions[key]
        assert 0 <= lo <= hi, f"{name}: bad range {lo}..{hi}"


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("producer,consumer", [("confluent", "kafka-python"), ("kafka-python", "confluent")])
def test_codec_round_trip(cluster, producer, consumer, codec):
    topic = f"rt-{producer}-{codec}"
    partitions = 3
    clients.CREATORS[producer](cluster.bootstrap, topic, partitions)
    t = cluster.wait_topic(topic, partitions)
    assert [p["partition"] for p in t["partitions"]] == list(range(partitions))

    records = clients.make_records(N_RECORDS, partitions, seed=zlib.crc32(f"{producer}/{codec}".encode()))
    delivered = clients.PRODUCERS[producer](cluster.bootstrap, topic, records, codec)
    counts = {p: len(v) for p, v in clients.expected_by_partition(records).items()}
    got = clients.CONSUMERS[consumer](cluster.bootstrap, topic, counts)

    # Independent checks; all of them run and every failure is reported.
    failures = []
    try:
        clients.assert_same(records, got, delivered)
    except AssertionError as e:
        failures.append(f"read back: {e}")

    # Nothing more than what was produced, as the broker itself reports.
    t = cluster.topic(topic)
    for p in t["partitions"]:
        if (p["log_start_offset"], p["high_watermark"]) != (0, counts[p["partition"]]):
            failures.append(f"admin API: partition {p['partition']} has log start {p['log_start_offset']}, high "
                            f"watermark {p['high_watermark']}; {counts[p['partition']]} records were produced")

    # The batches are stored and served with the producer's codec (pass-through).
    # librdkafka sends a batch uncompressed when compressing did not make it smaller.
    addr = cluster.node(1).kafka_addr
    versions = wire.api_versions(addr)
    if wire.pick_version(versions, wire.API_FETCH, 4, 4) is None:
        failures.append("the broker's Fetch versions exclude v4, which the raw codec check speaks")
    else:
        seen = set()
        for part in range(partitions):
            err, hw, data = wire.fetch(addr, topic, part, 0)
            batches = wire.batch_headers(data)
            if err != 0 or hw != counts[part] or not batches:
                failures.append(f"raw Fetch of partition {part} from 0: error {err}, high watermark {hw}, "
                                f"{len(batches)} complete batches")
            seen |= {c for _, _, c in batches}
        want = {wire.CODECS[codec]}
        # Both libraries send a batch uncompressed when compressing it did not make it smaller.
        if not (want & seen and seen <= want | {0}):
            hint = ""
            if producer == "confluent" and codec == "lz4" and wire.API_FIND_COORDINATOR not in versions:
                hint = (" (librdkafka enables LZ4 only when the broker's ApiVersions lists FindCoordinator "
                        "with v0 in range; this broker does not list FindCoordinator, so librdkafka logs "
                        "'Broker does not support compression type lz4: not compressing batch')")
            failures.append(f"stored batches have codec ids {sorted(seen)}; produced with {codec} "
                            f"({wire.CODECS[codec]}){hint}")
    assert not failures, "\n".join(failures)


def test_leaders_on_other_nodes(cluster3):
    """Clients bootstrapped from one node reach leaders on the other nodes."""
    topic = "spread"
    partitions = 6
    cluster3.create_topic(topic, partitions=partitions, rf=1)
    t = cluster3.wait_topic(topic, partitions)
    leaders = {p["partition"]: p["leader"] for p in t["partitions"]}
    assert set(leaders.values()) == {1, 2, 3}, f"6 partitions RF 1 on 3 brokers should lead on all: {leaders}"

    # Metadata through node 1 names every broker and every leader.
    md = AdminClient({"bootstrap.servers": cluster3.node(1).kafka}).list_topics(topic, timeout=30)
    assert {b.id: f"{b.host}:{b.port}" for b in md.brokers.values()} == {
        n.id: n.kafka for n in cluster3.nodes.values()}
    tm = md.topics[topic]
    assert tm.error is None, tm.error
    assert {p.id: p.leader for p in tm.partitions.values()} == leaders

    records = clients.make_records(3000, partitions, seed=6)
    delivered = clients.produce_confluent(cluster3.node(1).kafka, topic, records, "lz4")
    counts = {p: len(v) for p, v in clients.expected_by_partition(records).items()}
    got = clients.consume_confluent(cluster3.node(2).kafka, topic, counts)
    clients.assert_same(records, got, delivered)
    got = clients.consume_kafka_python(cluster3.node(3).kafka, topic, counts)
    clients.assert_same(records, got, delivered)

    # kafka-python producing through node 3 only, too.
    more = clients.make_records(600, partitions, seed=7)
    delivered2 = clients.produce_kafka_python(cluster3.node(3).kafka, topic, more, "zstd")
    for (p, off), r in zip(delivered2, more):
        assert p == r.partition and off >= counts[p]
    for p in range(partitions):
        hw = cluster3.topic(topic, via=leaders[p])["partitions"][p]["high_watermark"]
        assert hw == counts[p] + 100, f"partition {p} (leader {leaders[p]}): high watermark {hw}"


def test_list_offsets(cluster):
    topic = "times"
    cluster.create_topic(topic, partitions=1)
    cluster.wait_topic(topic, 1)
    t0 = int(time.time() * 1000) - 600_000
    # 300 records one second apart, produced in three separate requests (three batches at least).
    records = [Rec(f"k{i}".encode(), f"v{i}".encode(), [], t0 + i * 1000, 0) for i in range(300)]
    for chunk in (records[:100], records[100:200], records[200:]):
        clients.produce_confluent(cluster.bootstrap, topic, chunk, "gzip")

    # Every check runs; all failures are reported together.
    failures = []

    def check(ok, message):
        if not ok:
            failures.append(message)

    c = clients.confluent_consumer(cluster.bootstrap)
    try:
        wm = c.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=15)
        check(wm == (0, 300), f"confluent get_watermark_offsets = {wm}, want (0, 300)")
        cases = {
            t0 - 1: 0,  # before everything: the first record
            t0: 0,
            t0 + 1: 1,  # the first record with timestamp >= target, inside the first batch
            t0 + 50_000: 50,
            t0 + 150_500: 151,  # inside the second batch
            t0 + 299_000: 299,
            t0 + 400_000: -1,  # after the last timestamp: no such offset (OFFSET_END)
        }
        for ts, want in cases.items():
            res = c.offsets_for_times([ck.TopicPartition(topic, 0, ts)], timeout=15)[0]
            check(res.error is None and res.offset == want,
                  f"confluent offsets_for_times(t0 + {ts - t0} ms) = {res.offset} (error {res.error}), want {want}")
    finally:
        c.close()

    k = clients.kp_consumer(cluster.bootstrap)
    try:
        tp = KpTopicPartition(topic, 0)
        got = k.beginning_offsets([tp], timeout_ms=15000)
        check(got == {tp: 0}, f"kafka-python beginning_offsets = {got}")
        got = k.end_offsets([tp], timeout_ms=15000)
        check(got == {tp: 300}, f"kafka-python end_offsets = {got}")
        found = k.offsets_for_times({tp: t0 + 123_400}, timeout_ms=15000)[tp]
        check(found is not None and (found.offset, found.timestamp) == (124, t0 + 124_000),
              f"kafka-python offsets_for_times(t0 + 123400 ms) = {found}, want offset 124 with timestamp t0 + 124000")
        found = k.offsets_for_times({tp: t0 + 400_000}, timeout_ms=15000)[tp]
        check(found is None, f"kafka-python offsets_for_times(after the last record) = {found}, want None")
    finally:
        k.close(autocommit=False, timeout_ms=5000)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("library", ["confluent", "kafka-python"])
def test_idempotent_producer(cluster, library):
    topic = f"idem-{library}"
    cluster.create_topic(topic, partitions=2)
    cluster.wait_topic(topic, 2)
    records = clients.make_records(5000, 2, seed=11)
    if library == "confluent":
        delivered = clients.produce_confluent(cluster.bootstrap, topic, records, "snappy", enable_idempotence=True,
                                              max_in_flight=5)
    else:
        delivered = clients.produce_kafka_python(cluster.bootstrap, topic, records, "snappy", enable_idempotence=True,
                                                 max_in_flight_requests_per_connection=5)
    counts = {p: len(v) for p, v in clients.expected_by_partition(records).items()}
    got = clients.consume_confluent(cluster.bootstrap, topic, counts)
    clients.assert_same(records, got, delivered)
    t = cluster.topic(topic)
    assert {p["partition"]: p["high_watermark"] for p in t["partitions"]} == counts, "duplicates in the log"

    # The stored batches carry a producer id (raw Fetch: bytes 43..51 of each batch).
    versions = wire.api_versions(cluster.node(1).kafka_addr)
    if wire.pick_version(versions, wire.API_FETCH, 4, 4) is not None:
        _, _, data = wire.fetch(cluster.node(1).kafka_addr, topic, 0, 0)
        pid = struct.unpack_from(">q", data, 43)[0]
        assert pid >= 0, f"idempotent batch stored with producer id {pid}"


def test_idempotent_producer_retries_do_not_duplicate(make_cluster):
    """The broker is frozen (SIGSTOP) while Produce requests are in flight, so the client
    times them out and sends them again; the frozen broker still reads the first copies
    once it runs again (SIGCONT). With enable.idempotence the log holds every record once.
    (The same run with enable.idempotence=false leaves dozens of duplicates in the log,
    so the fault does cause retries of records that were already appended.)"""
    c = make_cluster(1)
    topic = "idem-retries"
    c.create_topic(topic, partitions=1)
    c.wait_topic(topic, 1)

    timeouts = []

    class Capture(logging.Handler):
        def emit(self, record):
            if "timed out" in record.getMessage().lower():
                timeouts.append(record.getMessage())

    log = logging.getLogger("strom-tests.librdkafka.idempotence")
    log.propagate = False
    capture = Capture()
    log.addHandler(capture)
    acked, failed = [], []
    # librdkafka times out in-flight requests after socket.timeout.ms, disconnects and retries.
    p = clients.confluent_producer(c.bootstrap, enable_idempotence=True, socket_timeout_ms=1500, linger_ms=2,
                                   message_timeout_ms=60000, logger=log)
    sent = 0

    def produce_until(what, cond, timeout=30):
        nonlocal sent
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
            try:
                if len(p) < 2000:
                    p.produce(topic, value=f"idem-{sent}".encode(), partition=0,
                              on_delivery=lambda e, m: (failed if e else acked).append(e or m.value()))
                    sent += 1
                p.poll(0.001)
            except ck.KafkaException as e:
                raise AssertionError(f"the idempotent producer failed while waiting for {what}: {e}") from None

    try:
        produce_until("1,000 acknowledged records", lambda: len(acked) >= 1000)
        c.signal(1, signal.SIGSTOP)
        try:
            produce_until("the client to time out a request to the frozen broker", lambda: timeouts, timeout=20)
        finally:
            c.signal(1, signal.SIGCONT)
        resumed = sent
        produce_until("records produced after the broker resumed to be acknowledged",
                      lambda: len(acked) >= resumed + 500, timeout=60)
        try:
            assert p.flush(60) == 0
        except ck.KafkaException as e:
            raise AssertionError(f"the idempotent producer failed in flush: {e}") from None
    finally:
        log.removeHandler(capture)
    assert not failed, f"deliveries failed: {failed[:3]}"
    assert sorted(acked) == sorted(f"idem-{i}".encode() for i in range(sent))

    hw = c.topic(topic)["partitions"][0]["high_watermark"]
    got = clients.consume_confluent(c.bootstrap, topic, {0: hw})[0]
    values = [g.value for g in got]
    dups = sorted(v for v, n in collections.Counter(values).items() if n > 1)
    assert not dups, f"{len(values) - len(set(values))} duplicated records in the log after retries, e.g. {dups[:3]}"
    assert hw == sent, f"log holds {hw} records, {sent} were produced"
    assert values == [f"idem-{i}".encode() for i in range(sent)], "records out of production order"
