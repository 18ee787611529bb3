"""Kafka transactions end to end (KIP-98, KIP-447), driven by real clients against the
transaction coordinator: librdkafka (confluent-kafka) and kafka-python transactional
producers commit and abort transactions over partitions replicated on three nodes;
read_committed consumers read every committed record exactly once, in order, and no
aborted one, while read_uncommitted consumers see both (never a marker). A consume-
transform-produce loop commits its output and its group's offsets in one transaction
(an aborted round moves neither). A second producer instance with the same
transactional id aborts the first one's open transaction and fences it. The coordinator
aborts a transaction left open past its transaction.timeout.ms. A transaction survives
the SIGKILL of its coordinator: the commit is finished by the broker that takes over.

Every reader stops at a sentinel: a non-transactional record written to each partition
after the transactions under test, visible to read_committed readers only once every
transaction before it has ended."""
import time

import confluent_kafka as ck
import kafka as kp
import kafka.errors  # noqa: F401 (kp.errors)
import pytest
from kafka.structs import OffsetAndMetadata, TopicPartition as KpTopicPartition

import wire
from clients import Rec, confluent_consumer, kp_consumer, produce_confluent
from harness import FAST, wait_for

NONE = 0
SENTINEL = b"end-of-partition"
FENCED_CODES = (ck.KafkaError._FENCED, ck.KafkaError.PRODUCER_FENCED, ck.KafkaError.INVALID_PRODUCER_EPOCH)


# ---- helpers ----------------------------------------------------------------------------

def new_topic(cluster, name, partitions=1):
    cluster.create_topic(name, partitions=partitions, rf=min(3, len(cluster.nodes)))
    cluster.wait_topic(name, partitions)
    return name


def txn_producer(bootstrap, txn_id, init=True, **conf):
    """A confluent-kafka transactional producer (idempotence implied), initialized unless
    init=False. conf: librdkafka settings."""
    p = ck.Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 5, **conf})
    if init:
        p.init_transactions(60)
    return p


def produce_flushed(p, topic, values_by_partition):
    """Produces {partition: [value]} and waits until every record is delivered, so the
    records lie in the log before anything produced afterwards. Returns
    {partition: [(offset, value)]} from the delivery reports."""
    reports = []
    for part, values in values_by_partition.items():
        for v in values:
            p.produce(topic, value=v, partition=part,
                      on_delivery=lambda err, m: reports.append((err, m.partition(), m.offset(), m.value())))
    assert p.flush(60) == 0, "records still undelivered after 60 s"
    errors = [r for r in reports if r[0] is not None]
    assert not errors, f"{len(errors)} deliveries failed, first: {errors[:3]}"
    out = {part: [] for part in values_by_partition}
    for _, part, offset, value in reports:
        out[part].append((offset, value))
    for part in out:
        assert out[part] == sorted(out[part]), f"partition {part}: delivered out of production order: {out[part]}"
    return out


def write_sentinels(bootstrap, topic, partitions):
    produce_confluent(bootstrap, topic, [Rec(None, SENTINEL, partition=p) for p in range(partitions)])


def read_to_sentinels(bootstrap, topic, partitions, isolation, timeout=60):
    """{partition: [(offset, value)]} of every record a confluent-kafka consumer at
    `isolation` reads before the sentinel ending each partition."""
    c = confluent_consumer(bootstrap, **{"isolation.level": isolation})
    try:
        c.assign([ck.TopicPartition(topic, p, 0) for p in range(partitions)])
        got, done = {p: [] for p in range(partitions)}, set()
        deadline = time.monotonic() + timeout
        while len(done) < partitions:
            assert time.monotonic() < deadline, (
                f"timed out after {timeout} s reading {topic} ({isolation}): sentinels of {sorted(done)} only, "
                f"read { {p: len(v) for p, v in got.items()} }")
            for m in c.consume(num_messages=500, timeout=0.5):
                assert not m.error(), f"consumer error on {topic}: {m.error()}"
                assert m.partition() not in done, f"partition {m.partition()}: {m.value()!r} after the sentinel"
                if m.value() == SENTINEL:
                    done.add(m.partition())
                else:
                    got[m.partition()].append((m.offset(), m.value()))
        return got
    finally:
        c.close()


def read_kafka_python_to_sentinel(bootstrap, topic, timeout=60):
    """[value] a kafka-python read_committed consumer reads from partition 0 before the sentinel."""
    c = kp_consumer(bootstrap, isolation_level="read_committed")
    try:
        tp = KpTopicPartition(topic, 0)
        c.assign([tp])
        c.seek(tp, 0)
        got = []
        deadline = time.monotonic() + timeout
        while SENTINEL not in got:
            assert time.monotonic() < deadline, f"timed out after {timeout} s reading {topic}: have {got}"
            for msgs in c.poll(timeout_ms=500).values():
                got += [m.value for m in msgs]
        assert got[-1] == SENTINEL, f"records after the sentinel: {got}"
        return got[:-1]
    finally:
        c.close(autocommit=False, timeout_ms=5000)


def numbered(prefix, partitions, n=10):
    return {part: [f"{prefix}-{part}-{i}".encode() for i in range(n)] for part in range(partitions)}


def values_of(by_partition):
    return {p: [v for _, v in recs] for p, recs in by_partition.items()}


def coordinator_of(cluster, txn_id, not_node=None):
    """The node FindCoordinator(key_type=1) names for txn_id, asked of a running node,
    once it names a node other than not_node."""
    def ask():
        via = cluster.node(next(iter(cluster.running()))).kafka_addr
        err, node, _, _ = wire.find_coordinator(via, txn_id, key_type=1)
        return node if err == NONE and node != not_node else None

    return wait_for(f"the transaction coordinator of {txn_id!r} (other than {not_node})", 60, ask)


def leader_addr(cluster, topic, partition=0):
    via = next(iter(cluster.running()))
    leader = wait_for(f"a leader for {topic}/{partition}", 30,
                      lambda: cluster.leaders(topic, via=via).get(partition))
    return cluster.node(leader).kafka_addr


def committed_offsets(consumer, topic, partitions):
    return [tp.offset for tp in consumer.committed([ck.TopicPartition(topic, p) for p in range(partitions)],
                                                   timeout=10)]


# ---- confluent-kafka ----------------------------------------------------------------------

def test_read_committed_reads_committed_transactions_once_in_order(cluster3):
    """Two transactional producers interleave their transactions' records on three
    partitions (each chunk delivered before the next is produced) and end them in every
    combination of commit and abort, four rounds."""
    topic = new_topic(cluster3, "txn-commit-abort", partitions=3)
    producers = [txn_producer(cluster3.bootstrap, f"interleave-{k}") for k in range(2)]
    rounds = [(True, False), (False, True), (True, True), (False, False)]
    committed, everything = {p: [] for p in range(3)}, {p: [] for p in range(3)}
    for r, ends in enumerate(rounds):
        for p in producers:
            p.begin_transaction()
        for chunk in range(2):
            for k, p in enumerate(producers):
                delivered = produce_flushed(p, topic, {
                    part: [f"round{r}-producer{k}-chunk{chunk}-part{part}-{i}".encode() for i in range(5)]
                    for part in range(3)})
                for part, recs in delivered.items():
                    everything[part] += recs
                    if ends[k]:
                        committed[part] += recs
        for p, commit in zip(producers, ends):
            if commit:
                p.commit_transaction(60)
            else:
                p.abort_transaction(60)
    for p in producers:
        p.close()
    write_sentinels(cluster3.bootstrap, topic, 3)

    got = read_to_sentinels(cluster3.bootstrap, topic, 3, "read_committed")
    for part in range(3):
        assert len(got[part]) == len(committed[part]) == 40, f"partition {part}: read {len(got[part])} records"
        assert got[part] == committed[part], (
            f"partition {part}: read_committed did not read exactly the committed records, each once, at their "
            f"delivered offsets; first difference at index "
            f"{next((i for i, (a, b) in enumerate(zip(got[part], committed[part])) if a != b), None)}")
    got = read_to_sentinels(cluster3.bootstrap, topic, 3, "read_uncommitted")
    assert got == everything, "read_uncommitted reads every record, aborted ones included, and no marker"
    for part in range(3):
        # A producer's next transaction starts after its previous one's markers: the six
        # markers of rounds 0-2 lie among the records, round 3's after them.
        offsets = [o for o, _ in everything[part]]
        assert offsets[-1] + 1 - len(offsets) == 6, f"partition {part}: markers among the records"


def test_read_process_write_commits_output_and_offsets_together(cluster3):
    """A consumer in a group reads an input topic; each batch is transformed and written
    to an output topic in a transaction that also commits the consumer's positions. The
    first batch's transaction is aborted: its output stays invisible, the group's offsets
    stay uncommitted, and the batch is read again from the start."""
    src = new_topic(cluster3, "rpw-in", partitions=3)
    dst = new_topic(cluster3, "rpw-out", partitions=3)
    group, per_partition = "rpw-group", 20
    inputs = [Rec(f"k{i}".encode(), f"in-{p}-{i}".encode(), partition=p)
              for p in range(3) for i in range(per_partition)]
    produce_confluent(cluster3.bootstrap, src, inputs)

    consumer = confluent_consumer(cluster3.bootstrap, **{"group.id": group, "auto.offset.reset": "earliest",
                                                         "isolation.level": "read_committed"})
    producer = txn_producer(cluster3.bootstrap, "rpw-tx")
    try:
        consumer.subscribe([src])
        aborted_outputs = 0
        deadline = time.monotonic() + 60
        while True:
            assigned = consumer.assignment()
            if len(assigned) == 3 and all(tp.offset == per_partition for tp in consumer.position(assigned)):
                break
            assert time.monotonic() < deadline, f"input not consumed within 60 s: {consumer.position(assigned)}"
            batch = consumer.consume(num_messages=25, timeout=0.5)
            assert not any(m.error() for m in batch), [m.error() for m in batch if m.error()]
            if not batch:
                continue
            producer.begin_transaction()
            for m in batch:
                producer.produce(dst, key=m.key(), value=b"out:" + m.value(), partition=m.partition())
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                 consumer.consumer_group_metadata(), 30)
            if aborted_outputs:
                producer.commit_transaction(60)
                continue
            # Sent before the abort: librdkafka purges what it has not sent yet.
            assert producer.flush(30) == 0
            producer.abort_transaction(60)
            aborted_outputs = len(batch)
            assert committed_offsets(consumer, src, 3) == [ck.OFFSET_INVALID] * 3, (
                "an aborted transaction's offsets were committed")
            for tp in consumer.assignment():
                consumer.seek(ck.TopicPartition(src, tp.partition, 0))

        wait_for("the group's committed offsets to reach the input's end", 30,
                 lambda: committed_offsets(consumer, src, 3) == [per_partition] * 3)
        for p in range(3):
            assert consumer.get_watermark_offsets(ck.TopicPartition(src, p), timeout=10)[1] == per_partition
    finally:
        consumer.close()
    producer.close()

    write_sentinels(cluster3.bootstrap, dst, 3)
    expected = {p: [b"out:" + r.value for r in inputs if r.partition == p] for p in range(3)}
    assert values_of(read_to_sentinels(cluster3.bootstrap, dst, 3, "read_committed")) == expected, (
        "the output holds exactly one transformed record per input record, in input order")
    everything = read_to_sentinels(cluster3.bootstrap, dst, 3, "read_uncommitted")
    assert sum(map(len, everything.values())) == 3 * per_partition + aborted_outputs, (
        "the aborted round's output was written (and only read_uncommitted sees it)")


def test_a_new_producer_instance_fences_the_old_one(cluster3):
    """Producer B's init_transactions with A's transactional id aborts A's open transaction
    before it returns (its markers are written) and bumps the epoch; A's commit then
    fails fatally; only B's records are committed."""
    topic = new_topic(cluster3, "txn-fence")
    a = txn_producer(cluster3.bootstrap, "fence-tx")
    a.begin_transaction()
    produce_flushed(a, topic, {0: [f"zombie-{i}".encode() for i in range(5)]})
    addr = leader_addr(cluster3, topic)
    assert wire.list_offset_latest(addr, topic, 0, isolation_level=1) == (NONE, 0), "A's transaction is open"

    b = txn_producer(cluster3.bootstrap, "fence-tx")
    assert wire.list_offset_latest(addr, topic, 0, isolation_level=1) == (NONE, 6), (
        "init_transactions returns once the previous instance's transaction is aborted (its marker at offset 5)")
    with pytest.raises(ck.KafkaException) as raised:
        a.commit_transaction(30)
    err = raised.value.args[0]
    assert err.fatal() and err.code() in FENCED_CODES, f"the zombie's commit failed with {err!r}"
    with pytest.raises(ck.KafkaException):
        a.begin_transaction()

    b.begin_transaction()
    fresh = produce_flushed(b, topic, {0: [f"fresh-{i}".encode() for i in range(5)]})
    b.commit_transaction(60)
    b.close()
    write_sentinels(cluster3.bootstrap, topic, 1)
    assert read_to_sentinels(cluster3.bootstrap, topic, 1, "read_committed") == fresh
    assert values_of(read_to_sentinels(cluster3.bootstrap, topic, 1, "read_uncommitted"))[0] == (
        [f"zombie-{i}".encode() for i in range(5)] + [f"fresh-{i}".encode() for i in range(5)])


# ---- kafka-python -------------------------------------------------------------------------

def test_kafka_python_transactions_commit_abort_and_offsets(cluster3):
    """kafka-python's transactional producer: a committed, an aborted, and a committed
    transaction that also commits a group's offset (send_offsets_to_transaction)."""
    topic = new_topic(cluster3, "txn-kafka-python")
    group = "kp-txn-group"
    p = kp.KafkaProducer(bootstrap_servers=cluster3.bootstrap, transactional_id="kp-tx", linger_ms=5,
                         max_block_ms=60000, request_timeout_ms=30000)
    try:
        p.init_transactions()

        def transaction(prefix, commit, offsets=None):
            p.begin_transaction()
            for i in range(4):
                p.send(topic, value=f"{prefix}-{i}".encode(), partition=0)
            p.flush(timeout=60)
            if offsets is not None:
                p.send_offsets_to_transaction(offsets, group)
            if commit:
                p.commit_transaction()
            else:
                p.abort_transaction()

        transaction("first", True)
        transaction("aborted", False)
        transaction("with-offsets", True, {KpTopicPartition(topic, 0): OffsetAndMetadata(7, "", -1)})
    finally:
        p.close(timeout=10)
    write_sentinels(cluster3.bootstrap, topic, 1)

    assert read_kafka_python_to_sentinel(cluster3.bootstrap, topic) == (
        [f"first-{i}".encode() for i in range(4)] + [f"with-offsets-{i}".encode() for i in range(4)])
    c = kp_consumer(cluster3.bootstrap, group_id=group, isolation_level="read_committed")
    try:
        wait_for(f"group {group}'s committed offset 7", 30,
                 lambda: c.committed(KpTopicPartition(topic, 0), timeout_ms=10000) == 7)
    finally:
        c.close(autocommit=False, timeout_ms=5000)


# ---- the coordinator's own work ------------------------------------------------------------

def test_the_coordinator_aborts_a_transaction_past_its_timeout(make_cluster):
    cluster = make_cluster(1, FAST + ("transaction.abort.timed.out.transaction.cleanup.interval.ms=200",))
    topic = new_topic(cluster, "txn-timeout")
    addr = cluster.node(1).kafka_addr
    p = txn_producer(cluster.bootstrap, "timeout-tx", **{"transaction.timeout.ms": 3000})
    p.begin_transaction()
    produce_flushed(p, topic, {0: [f"expired-{i}".encode() for i in range(5)]})
    assert wire.list_offset_latest(addr, topic, 0, isolation_level=1) == (NONE, 0), "the transaction is open"

    # The producer stays idle; the coordinator aborts (an abort marker at offset 5).
    wait_for("the coordinator to abort the timed-out transaction (the LSO at the log end, 6)", 30,
             lambda: wire.list_offset_latest(addr, topic, 0, isolation_level=1) == (NONE, 6))
    assert wire.list_offset_latest(addr, topic, 0, isolation_level=0) == (NONE, 6), "nothing but the marker"
    with pytest.raises(ck.KafkaException) as raised:
        p.commit_transaction(30)
    err = raised.value.args[0]
    assert err.fatal() or err.txn_requires_abort(), f"the timed-out transaction's commit failed with {err!r}"

    write_sentinels(cluster.bootstrap, topic, 1)
    assert read_to_sentinels(cluster.bootstrap, topic, 1, "read_committed") == {0: []}
    assert len(read_to_sentinels(cluster.bootstrap, topic, 1, "read_uncommitted")[0]) == 5



def describe_state(bootstrap, txn_id):
    """The id's state as its coordinator describes it (kafka-python's DescribeTransactions),
    None when the coordinator answers TRANSACTIONAL_ID_NOT_FOUND."""
    admin = kp.KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000)
    try:
        return admin.describe_transactions([txn_id])[txn_id].state.value
    except kp.errors.TransactionalIdNotFoundError:
        return None
    finally:
        admin.close()


def test_an_idle_transactional_id_expires(make_cluster):
    """transactional.id.expiration.ms: an id with no transaction open and no request for
    that long is forgotten (a tombstone in __transaction_state), so DescribeTransactions
    answers TRANSACTIONAL_ID_NOT_FOUND, also after the coordinator restarts and reads the
    partition back; a new producer with the id then starts afresh."""
    cluster = make_cluster(1, FAST + ("transactional.id.expiration.ms=4000",
                                      "transaction.remove.expired.transaction.cleanup.interval.ms=200"))
    topic = new_topic(cluster, "txn-expiry")
    p = txn_producer(cluster.bootstrap, "expiring-tx")
    p.begin_transaction()
    produce_flushed(p, topic, {0: [b"before"]})
    p.commit_transaction(30)
    assert describe_state(cluster.bootstrap, "expiring-tx") == "CompleteCommit"
    wait_for("the idle id to be forgotten", 60, lambda: describe_state(cluster.bootstrap, "expiring-tx") is None)
    cluster.kill(1)
    cluster.launch(1)
    cluster.wait_ready()

    def reloaded_and_gone():
        try:
            return describe_state(cluster.bootstrap, "expiring-tx") is None
        except (kp.errors.CoordinatorLoadInProgressError, kp.errors.NotCoordinatorError,
                kp.errors.KafkaConnectionError, kp.errors.KafkaTimeoutError):
            return False

    wait_for("the restarted coordinator to have forgotten the id too", 60, reloaded_and_gone)
    again = txn_producer(cluster.bootstrap, "expiring-tx")
    again.begin_transaction()
    produce_flushed(again, topic, {0: [b"after"]})
    again.commit_transaction(30)
    assert describe_state(cluster.bootstrap, "expiring-tx") == "CompleteCommit"
    write_sentinels(cluster.bootstrap, topic, 1)
    assert values_of(read_to_sentinels(cluster.bootstrap, topic, 1, "read_committed")) == {0: [b"before", b"after"]}

def test_a_commit_survives_its_coordinators_death(cluster3):
    """The broker leading the transactional id's __transaction_state partition is
    SIGKILLed with a transaction open; commit_transaction finds the new coordinator,
    which finishes the commit; the next transaction runs on the new coordinator."""
    topic = new_topic(cluster3, "txn-failover", partitions=3)
    txn_id = "failover-tx"
    p = txn_producer(cluster3.bootstrap, txn_id)
    coordinator = coordinator_of(cluster3, txn_id)
    p.begin_transaction()
    before = produce_flushed(p, topic, numbered("before", 3))
    cluster3.kill(coordinator)
    try:
        p.commit_transaction(90)
        assert coordinator_of(cluster3, txn_id, not_node=coordinator) in cluster3.running()
        p.begin_transaction()
        after = produce_flushed(p, topic, numbered("after", 3))
        p.commit_transaction(60)
        p.close()
        write_sentinels(cluster3.bootstrap, topic, 3)
        got = read_to_sentinels(cluster3.bootstrap, topic, 3, "read_committed")
        assert got == {part: before[part] + after[part] for part in range(3)}, (
            "read_committed reads both transactions' records exactly once, at their delivered offsets")
    finally:
        cluster3.launch(coordinator)
        cluster3.wait_ready()
