"""Producing and consuming with confluent-kafka and kafka-python, bounded in time,
and comparing what was read with what was written, byte for byte."""
import random
import time
import uuid
from dataclasses import dataclass, field

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient, NewTopic
import kafka as kp
from kafka.structs import TopicPartition as KpTopicPartition

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


@dataclass
class Rec:
    key: bytes | None
    value: bytes | None
    headers: list = field(default_factory=list)  # [(str, bytes)]
    timestamp: int = 0  # ms, CreateTime
    partition: int = 0


@dataclass
class Got:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list
    timestamp: int
    timestamp_type: str  # "create" | "append" | other


def make_records(n, partitions, seed=1, base_ts=None):
    """n records spread round robin over partitions: keys (some null, some empty), values
    (compressible text, random bytes, some empty, some null, a few large), headers (none,
    several, repeated names, empty values) and distinct CreateTime timestamps that are
    not monotonic inside a partition."""
    rng = random.Random(seed)
    base_ts = int(time.time() * 1000) - 3_600_000 if base_ts is None else base_ts
    out = []
    for i in range(n):
        if i % 97 == 0:
            key = None
        elif i % 89 == 0:
            key = b""
        else:
            key = f"key-{i}-".encode() + rng.randbytes(rng.randint(0, 12))
        if i % 101 == 0 and key is not None:
            value = None
        elif i % 53 == 0:
            value = b""
        elif i % 2500 == 7:
            value = rng.randbytes(64 * 1024)
        elif i % 2:
            value = (f"value {i} " * rng.randint(1, 60)).encode()
        else:
            value = rng.randbytes(rng.randint(1, 700))
        headers = []
        if i % 3:
            headers = [("seq", str(i).encode()), ("bin", rng.randbytes(rng.randint(0, 20)))]
            if i % 5 == 0:
                headers += [("dup", b"first"), ("dup", b"second"), ("empty", b"")]
        ts = base_ts + i * 10 + rng.randint(-9, 9)
        out.append(Rec(key, value, headers, ts, i % partitions))
    return out


def expected_by_partition(records):
    by = {}
    for r in records:
        by.setdefault(r.partition, []).append(r)
    return by


def _assert_record(where, e, g):
    assert g.key == e.key, f"{where}: key {g.key!r:.80} != {e.key!r:.80}"
    assert g.value == e.value, (f"{where}: value differs (len {len(g.value or b'')} vs "
                                f"{len(e.value or b'')}): {g.value!r:.80} != {e.value!r:.80}")
    assert g.headers == e.headers, f"{where}: headers {g.headers!r:.200} != {e.headers!r:.200}"
    assert g.timestamp_type == "create", f"{where}: timestamp type {g.timestamp_type}"
    assert g.timestamp == e.timestamp, f"{where}: timestamp {g.timestamp} != {e.timestamp}"


def assert_same(records, got, delivered=None):
    """got = {partition: [Got in offset order]}; delivered (optional) = [(partition, offset)]
    per record, as the producer's delivery reports said.

    Checked in this order, so that a failure names the first thing wrong: every partition
    holds exactly as many records as were produced to it, at contiguous offsets from 0;
    each record is, byte for byte, at the offset its delivery report gave (key, value,
    headers, CreateTime timestamp); and the records of a partition are stored in the
    order they were produced."""
    expected = expected_by_partition(records)
    assert sorted(got) == sorted(expected), f"partitions read {sorted(got)}, written {sorted(expected)}"
    for p, exp in expected.items():
        offsets = [g.offset for g in got[p]]
        assert offsets == list(range(len(exp))), (
            f"partition {p}: offsets not contiguous from 0 or wrong count: read {len(offsets)} records, "
            f"wrote {len(exp)}; first offsets {offsets[:10]}, first gap/dup at index "
            f"{next((i for i, o in enumerate(offsets) if o != i), None)}")
        for g in got[p]:
            assert g.partition == p, f"partition {p} offset {g.offset}: partition {g.partition}"
    if delivered is not None:
        for i, (r, (p, off)) in enumerate(zip(records, delivered)):
            assert p == r.partition, f"record {i} produced to partition {r.partition}, delivered to {p}"
            assert 0 <= off < len(got[p]), f"record {i}: delivery report offset {off} not in partition {p}"
            _assert_record(f"record {i} at partition {p} offset {off} (its delivery report)", r, got[p][off])
        for p in expected:
            offs = [off for r, (q, off) in zip(records, delivered) if q == p]
            wrong = next((i for i in range(len(offs)) if offs[i] != i), None)
            assert wrong is None, (
                f"partition {p}: records stored out of production order (one producer, no retries): the "
                f"{wrong}th record produced is at offset {offs[wrong]}; offsets in production order near it: "
                f"{offs[max(0, wrong - 3):wrong + 8]}")
    for p, exp in expected.items():
        for e, g in zip(exp, got[p]):
            _assert_record(f"partition {p} offset {g.offset} (production order)", e, g)


# ---- confluent-kafka -----------------------------------------------------------------------

def _librdkafka_conf(conf):
    """Python keyword names to librdkafka's: message_max_bytes -> message.max.bytes;
    callbacks (error_cb, stats_cb, ...) keep their names."""
    return {k if k.endswith("_cb") else k.replace("_", "."): v for k, v in conf.items()}


class DeliveryErrors(AssertionError):
    pass


def confluent_producer(bootstrap, **conf):
    base = {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "enable.idempotence": False,
            "message.timeout.ms": 60000, "socket.timeout.ms": 30000}
    base.update(_librdkafka_conf(conf))
    return ck.Producer(base)


def produce_confluent(bootstrap, topic, records, codec="none", flush_timeout=120, **conf):
    """Produces every record to its partition; returns [(partition, offset)] per record.
    Raises DeliveryErrors listing failed deliveries."""
    p = confluent_producer(bootstrap, compression_type=codec, **conf)
    results = [None] * len(records)

    def cb(i):
        def done(err, msg):
            results[i] = (err, msg.partition(), msg.offset(), msg.timestamp())
        return done

    deadline = time.monotonic() + flush_timeout
    for i, r in enumerate(records):
        while True:
            try:
                p.produce(topic, value=r.value, key=r.key, headers=r.headers or None, timestamp=r.timestamp,
                          partition=r.partition, on_delivery=cb(i))
                break
            except BufferError:
                assert time.monotonic() < deadline, "producer queue stayed full"
                p.poll(0.1)
        if i % 1000 == 0:
            p.poll(0)
    left = p.flush(max(1.0, deadline - time.monotonic()))
    assert left == 0, f"{left} of {len(records)} records still undelivered after {flush_timeout} s"
    errors = [(i, r[0]) for i, r in enumerate(results) if r[0] is not None]
    if errors:
        raise DeliveryErrors(f"{len(errors)} of {len(records)} deliveries failed, first: {errors[:3]}")
    return [(r[1], r[2]) for r in results]


def confluent_consumer(bootstrap, **conf):
    base = {"bootstrap.servers": bootstrap, "group.id": f"strom-tests-{uuid.uuid4()}", "enable.auto.commit": False,
            "enable.auto.offset.store": False, "enable.partition.eof": False, "check.crcs": True,
            "fetch.wait.max.ms": 100, "socket.timeout.ms": 30000}
    base.update(_librdkafka_conf(conf))
    return ck.Consumer(base)


def _confluent_got(m):
    ts_type, ts = m.timestamp()
    kind = {ck.TIMESTAMP_CREATE_TIME: "create", ck.TIMESTAMP_LOG_APPEND_TIME: "append"}.get(ts_type, str(ts_type))
    return Got(m.partition(), m.offset(), m.key(), m.value(), list(m.headers() or []), ts, kind)


def consume_confluent(bootstrap, topic, counts, timeout=120, **conf):
    """Reads partitions {p: n} from offset 0 until n records each (or the deadline):
    {p: [Got]}."""
    c = confluent_consumer(bootstrap, **conf)
    try:
        c.assign([ck.TopicPartition(topic, p, 0) for p in counts])
        got = {p: [] for p in counts}
        deadline = time.monotonic() + timeout
        while any(len(got[p]) < n for p, n in counts.items()):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s reading {topic}: have "
                                     f"{ {p: len(v) for p, v in got.items()} } of {counts}")
            for m in c.consume(num_messages=1000, timeout=0.5):
                if m.error():
                    raise AssertionError(f"consumer error on {topic}: {m.error()}")
                got[m.partition()].append(_confluent_got(m))
        return got
    finally:
        c.close()


def confluent_admin(bootstrap):
    return AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 30000})


def create_topic_confluent(bootstrap, name, partitions, rf=1, configs=None, timeout=30):
    a = confluent_admin(bootstrap)
    fs = a.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=rf, config=configs or {})],
                         operation_timeout=timeout, request_timeout=timeout)
    fs[name].result(timeout=timeout)


# ---- kafka-python ---------------------------------------------------------------------------

def kp_producer(bootstrap, **conf):
    base = dict(bootstrap_servers=bootstrap, acks="all", linger_ms=5, enable_idempotence=False, max_block_ms=30000,
                request_timeout_ms=30000, delivery_timeout_ms=60000)
    base.update(conf)
    return kp.KafkaProducer(**base)


def produce_kafka_python(bootstrap, topic, records, codec="none", flush_timeout=120, **conf):
    p = kp_producer(bootstrap, compression_type=None if codec == "none" else codec, **conf)
    try:
        futures = [p.send(topic, value=r.value, key=r.key, headers=r.headers, partition=r.partition,
                          timestamp_ms=r.timestamp) for r in records]
        p.flush(timeout=flush_timeout)
        out, errors = [], []
        for i, f in enumerate(futures):
            assert f.is_done, f"record {i} still undelivered after flush({flush_timeout})"
            if f.failed():
                errors.append((i, f.exception))
                out.append(None)
            else:
                md = f.value
                out.append((md.partition, md.offset))
        if errors:
            raise DeliveryErrors(f"{len(errors)} of {len(records)} deliveries failed, first: {errors[:3]}")
        return out
    finally:
        p.close(timeout=10)


def kp_consumer(bootstrap, **conf):
    base = dict(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
                fetch_max_wait_ms=100, request_timeout_ms=30000, check_crcs=True)
    base.update(conf)
    return kp.KafkaConsumer(**base)


def consume_kafka_python(bootstrap, topic, counts, timeout=120, **conf):
    c = kp_consumer(bootstrap, **conf)
    try:
        tps = [KpTopicPartition(topic, p) for p in counts]
        c.assign(tps)
        for tp in tps:
            c.seek(tp, 0)
        got = {p: [] for p in counts}
        deadline = time.monotonic() + timeout
        while any(len(got[p]) < n for p, n in counts.items()):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s reading {topic}: have "
                                     f"{ {p: len(v) for p, v in got.items()} } of {counts}")
            for tp, msgs in c.poll(timeout_ms=500).items():
                for m in msgs:
                    kind = {0: "create", 1: "append"}.get(m.timestamp_type, str(m.timestamp_type))
                    got[tp.partition].append(Got(m.partition, m.offset, m.key, m.value, list(m.headers or []),
                                                 m.timestamp, kind))
        return got
    finally:
        c.close(autocommit=False, timeout_ms=5000)


def create_topic_kafka_python(bootstrap, name, partitions, rf=1, configs=None, timeout=30):
    a = kp.KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=timeout * 1000)
    try:
        a.create_topics({name: {"num_partitions": partitions, "replication_factor": rf, "configs": configs or {}}},
                        timeout_ms=timeout * 1000)
    finally:
        a.close()


PRODUCERS = {"confluent": produce_confluent, "kafka-python": produce_kafka_python}
CONSUMERS = {"confluent": consume_confluent, "kafka-python": consume_kafka_python}
CREATORS = {"confluent": create_topic_confluent, "kafka-python": create_topic_kafka_python}
