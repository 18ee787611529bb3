"""Log compaction of user topics (cleanup.policy=compact), driven by confluent-kafka: an
idempotent producer writes compressed batches of keyed records, the cleaner drops every
superseded record, and a consumer reading from the beginning then sees each key's
latest value at its own offset, the tombstone of a deleted key, and nothing that
retention would have removed (compact alone keeps every segment, as in Kafka). The
producer keeps producing afterwards: its last batches stay whole."""
import time

import confluent_kafka as ck

import harness
from clients import confluent_consumer, confluent_producer

KEYS = 20
ROUNDS = 150


def produce(bootstrap, topic, records):
    """Produces (key, value) pairs with one idempotent lz4 producer; returns
    {offset: (key, value)} from the delivery reports."""
    p = confluent_producer(bootstrap, **{"enable.idempotence": True, "compression.type": "lz4",
                                         "linger.ms": 2, "batch.num.messages": 50})
    delivered, failed = {}, []

    def report(err, msg):
        if err is not None:
            failed.append(err)
        else:
            delivered[msg.offset()] = (msg.key(), msg.value())

    for key, value in records:
        p.produce(topic, key=key, value=value, partition=0, on_delivery=report)
        p.poll(0)
    assert p.flush(60) == 0, "undelivered records"
    assert not failed, failed[:3]
    return delivered


def read_all(bootstrap, topic, **conf):
    """Every record of partition 0 up to its high watermark: [(offset, key, value)]."""
    c = confluent_consumer(bootstrap, **conf)
    try:
        low, high = c.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=10)
        c.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
        got = []
        deadline = time.monotonic() + 60
        while high > 0 and (not got or got[-1][0] < high - 1):
            assert time.monotonic() < deadline, f"read {len(got)} records, up to {got[-1:]} of {high}"
            m = c.poll(0.5)
            if m is not None:
                assert m.error() is None, m.error()
                got.append((m.offset(), m.key(), m.value()))
        return low, high, got
    finally:
        c.close()


def test_a_compacted_topic_keeps_each_keys_latest_record(make_cluster):
    c = make_cluster(1, settings=("log.retention.check.interval.ms=200",))
    topic = "compacted"
    c.create_topic(topic, partitions=1, configs={
        "cleanup.policy": "compact", "segment.bytes": "4096", "min.cleanable.dirty.ratio": "0.01",
        # Compact alone: retention does not apply, however short.
        "retention.ms": "1", "delete.retention.ms": "3600000"})
    c.wait_topic(topic, 1)
    pad = b"x" * 100
    records = [(b"gone", b"soon deleted"), (b"gone", None)]
    records += [(f"k{i % KEYS}".encode(), f"v{i // KEYS}-".encode() + pad) for i in range(KEYS * ROUNDS)]
    delivered = produce(c.node(1).kafka, topic, records)
    assert len(delivered) == len(records)
    latest = {}
    for offset in sorted(delivered):
        latest[delivered[offset][0]] = (offset, delivered[offset][1])

    def compacted():
        low, high, got = read_all(c.node(1).kafka, topic)
        if len(got) >= len(records) // 3:
            return None
        # A read under way while the cleaner swapped its segments in may have had the
        # first segment as it was before (a consistent log, as in Kafka, but not yet a
        # cleaned one; seen in CI). A pass swaps every segment at once, and this read
        # saw some cleaned: one started now sees the whole pass.
        return read_all(c.node(1).kafka, topic)

    low, high, got = harness.wait_for("compaction", 90, compacted, interval=0.5)
    assert (low, high) == (0, len(records)), "retention removed records of a compact-only topic"
    offsets = [o for o, _, _ in got]
    assert offsets == sorted(set(offsets)), "offsets go up"
    for offset, key, value in got:
        assert delivered[offset] == (key, value), f"offset {offset} holds {key, value}, not what was produced"
    seen = {key: (offset, value) for offset, key, value in got}
    assert seen == latest, "a key's latest record is missing"
    assert seen[b"gone"][1] is None, "the tombstone stays for delete.retention.ms"
    assert sum(1 for _, key, _ in got if key == b"gone") == 1, "the deleted key's value went"

    # The producer state survived the rewrite: a new idempotent producer and more
    # records append after the high watermark, and the log compacts again.
    more = produce(c.node(1).kafka, topic, [(b"k0", b"after"), (b"k1", b"after")])
    assert sorted(more) == [high, high + 1]
    c.check_alive()


def test_compaction_removes_aborted_records_and_cleans_committed_ones(make_cluster):
    """A transactional producer commits and aborts rounds of updates to a few keys: once
    cleaned, a read_uncommitted reader finds the aborted values gone (but in batches that
    end a segment, which stay whole so that the segment keeps its end offset; markers
    stay, offsets keep their gaps) and each key's latest committed value, which no
    aborted value written after it removed."""
    c = make_cluster(1, settings=("log.retention.check.interval.ms=200",))
    topic = "compacted-transactions"
    c.create_topic(topic, partitions=1, configs={
        "cleanup.policy": "compact", "segment.bytes": "16384", "min.cleanable.dirty.ratio": "0.01"})
    c.wait_topic(topic, 1)
    p = ck.Producer({"bootstrap.servers": c.node(1).kafka, "transactional.id": "compaction-txn", "linger.ms": 2})
    p.init_transactions(60)
    pad = b"x" * 100
    keys = [f"k{i}".encode() for i in range(10)]
    rounds = 30
    for r in range(rounds):
        for outcome in ("committed", "aborted"):
            p.begin_transaction()
            for k in keys:
                p.produce(topic, key=k, value=f"{outcome}-{r}-".encode() + pad, partition=0)
            assert p.flush(30) == 0  # sent before an abort: librdkafka purges what it has not sent
            if outcome == "committed":
                p.commit_transaction(30)
            else:
                p.abort_transaction(30)
    # Another committed round seals the last aborted one below the last stable offset.
    p.begin_transaction()
    for k in keys:
        p.produce(topic, key=k, value=b"final-" + pad, partition=0)
    p.commit_transaction(30)
    # A plain record last, where a reader knows it has read everything (a marker is never read).
    produce(c.node(1).kafka, topic, [(b"sentinel", b"end")])

    def cleaned():
        _, _, got = read_all(c.node(1).kafka, topic, **{"isolation.level": "read_uncommitted"})
        aborted = sum(1 for _, _, v in got if v and v.startswith(b"aborted"))
        return got if aborted <= rounds * len(keys) // 4 else None

    got = harness.wait_for("most aborted records to be cleaned away", 90, cleaned, interval=0.5)
    latest = {k: v for _, k, v in got}
    assert latest == {**{k: b"final-" + pad for k in keys}, b"sentinel": b"end"}, "each key's latest committed value"
    assert len(got) < rounds * len(keys), "superseded committed values went too"
    offsets = [o for o, _, _ in got]
    assert offsets == sorted(set(offsets)), "offsets go up"
    c.check_alive()
