"""The partition side of transactions (KIP-98), driven by hand as a transaction coordinator
would drive it: transactional batches hold the last stable offset (LSO) back until the
coordinator's WriteTxnMarkers ends them; read_committed consumers (librdkafka, kafka-python)
read below the LSO and drop aborted records, read_uncommitted ones see every record and no
marker. The aborted transactions and open ones survive a leader's SIGKILL (followers learn
them from the markers they replicate). Bad input: markers from a fenced coordinator or an
old producer epoch, control batches from a client, transactional batches without a
transactional id, markers for a topic that does not exist."""
import crc32c

import wire
from clients import consume_confluent, consume_kafka_python
from harness import wait_for

NONE, UNKNOWN_TOPIC_OR_PARTITION, INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE = 0, 3, 47, 48
INVALID_PRODUCER_ID_MAPPING, TRANSACTION_COORDINATOR_FENCED, TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 49, 52, 53
INVALID_RECORD = 87


def producer(addr):
    err, pid, epoch = wire.init_producer_id(addr)
    assert err == NONE, wire.error_name(err)
    return pid, epoch


def txn_producer(addr, txn_id, topic):
    """A transactional producer as the coordinator knows it (InitProducerId), with `topic`'s
    partition 0 added to its transaction, so that its batches pass the leader's check with
    the coordinator (KIP-890): (producer id, epoch)."""
    found = wait_for("the transaction coordinator", 30, lambda: (lambda r: r if r[0] == NONE else None)(
        wire.find_coordinator(addr, txn_id, key_type=1)))
    coordinator = (found[2], found[3])
    _, pid, epoch = wait_for("InitProducerId", 30, lambda: (lambda r: r if r[0] == NONE else None)(
        wire.init_txn_producer(coordinator, txn_id)))
    assert wire.add_partitions_to_txn(coordinator, txn_id, pid, epoch, {topic: [0]}) == {(topic, 0): NONE}
    return pid, epoch


def leader_addr(cluster, topic, via=None):
    via = via or next(iter(cluster.running()))
    leader = wait_for(f"a leader for {topic}", 30, lambda: cluster.leaders(topic, via=via).get(0))
    return leader, cluster.node(leader).kafka_addr


def produce(addr, topic, records, pid=-1, epoch=-1, seq=-1, transactional=False, txn_id=None):
    batch = wire.record_batch(records, producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                              transactional=transactional)
    return wire.produce(addr, topic, 0, batch, transactional_id=txn_id)


def values(got):
    return [g.value for g in got[0]]


def test_read_committed_skips_aborted_and_waits_for_open_transactions(cluster3):
    topic = "txn-partition"
    cluster3.create_topic(topic, rf=3)
    cluster3.wait_topic(topic, 1)
    leader, addr = leader_addr(cluster3, topic)
    committer, aborter = txn_producer(addr, "tx-c", topic), txn_producer(addr, "tx-a", topic)

    assert produce(addr, topic, [(b"k", b"before")]) == (NONE, 0)
    assert produce(addr, topic, [(None, b"c1"), (None, b"c2")], *committer, 0, True, "tx-c") == (NONE, 1)
    assert produce(addr, topic, [(None, b"a1"), (None, b"a2")], *aborter, 0, True, "tx-a") == (NONE, 3)
    assert produce(addr, topic, [(None, b"plain")]) == (NONE, 5)
    assert produce(addr, topic, [(None, b"c3")], *committer, 2, True, "tx-c") == (NONE, 6)

    # Both transactions are open: read_committed readers stop at the first one's first offset.
    assert wire.list_offset_latest(addr, topic, 0, isolation_level=1) == (NONE, 1)
    assert wire.list_offset_latest(addr, topic, 0, isolation_level=0) == (NONE, 7)
    err, hw, lso, aborted, records = wire.fetch_isolated(addr, topic, 0, 0, isolation_level=1)
    assert (err, hw, lso, aborted) == (NONE, 7, 1, [])
    assert [b[0] for b in wire.batch_headers(records)] == [0], "only the batch below the LSO"

    # The coordinator ends them: the committer's commits, the aborter's aborts.
    written = wire.write_txn_markers(addr, [(committer[0], committer[1], True, 0, {topic: [0]}),
                                            (aborter[0], aborter[1], False, 0, {topic: [0]})])
    assert written == {(committer[0], topic, 0): NONE, (aborter[0], topic, 0): NONE}, written
    assert wire.list_offset_latest(addr, topic, 0, isolation_level=1) == (NONE, 9)
    err, hw, lso, aborted, _ = wire.fetch_isolated(addr, topic, 0, 0, isolation_level=1)
    assert (err, hw, lso, aborted) == (NONE, 9, 9, [(aborter[0], 3)])
    assert produce(addr, topic, [(None, b"after")]) == (NONE, 9)

    committed = [b"before", b"c1", b"c2", b"plain", b"c3", b"after"]
    everything = [b"before", b"c1", b"c2", b"a1", b"a2", b"plain", b"c3", b"after"]
    got = consume_confluent(cluster3.bootstrap, topic, {0: 6}, timeout=60, **{"isolation.level": "read_committed"})
    assert values(got) == committed
    assert [g.offset for g in got[0]] == [0, 1, 2, 5, 6, 9], "offsets keep their gaps (aborted records, markers)"
    got = consume_kafka_python(cluster3.bootstrap, topic, {0: 6}, timeout=60, isolation_level="read_committed")
    assert values(got) == committed
    got = consume_confluent(cluster3.bootstrap, topic, {0: 8}, timeout=60, **{"isolation.level": "read_uncommitted"})
    assert values(got) == everything, "read_uncommitted sees aborted records and no marker"

    # A new transaction of the committer stays open across the leader's death.
    assert produce(addr, topic, [(None, b"open")], *committer, 3, True, "tx-c") == (NONE, 10)
    assert produce(addr, topic, [(None, b"later")]) == (NONE, 11)
    wait_for("every replica to hold offset 11", 30,
             lambda: cluster3.topic(topic)["partitions"][0]["high_watermark"] == 12)
    cluster3.kill(leader)
    survivor = next(iter(cluster3.running()))
    new_leader, addr = wait_for("a new leader", 30, lambda: (lambda l: l if l[0] != leader else None)(
        leader_addr(cluster3, topic, via=survivor)))
    assert new_leader != leader
    lso = wait_for("the new leader to answer ListOffsets", 30,
                   lambda: (lambda r: r[1] if r[0] == NONE else None)(
                       wire.list_offset_latest(addr, topic, 0, isolation_level=1)))
    assert lso == 10, "the open transaction still holds the LSO on the new leader"
    err, _, _, aborted, _ = wire.fetch_isolated(addr, topic, 0, 0, isolation_level=1)
    assert (err, aborted) == (NONE, [(aborter[0], 3)]), "the new leader knows the aborted transaction"
    written = wire.write_txn_markers(addr, [(committer[0], committer[1], False, 0, {topic: [0]})])
    assert written == {(committer[0], topic, 0): NONE}
    got = consume_confluent(cluster3.bootstrap, topic, {0: 7}, timeout=60, **{"isolation.level": "read_committed"})
    assert values(got) == committed + [b"later"]
    cluster3.launch(leader)


def test_bad_transactional_input_is_refused_without_effect(cluster):
    topic = "txn-bad-input"
    cluster.create_topic(topic)
    cluster.wait_topic(topic, 1)
    addr = cluster.node(1).kafka_addr
    pid, epoch = producer(addr)

    # Transactional batches need the producer's transactional id in the request.
    assert produce(addr, topic, [(None, b"x")], pid, epoch, 0, True) == (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1)
    # A transactional batch without a producer, and a control batch, are a broker's to write.
    assert produce(addr, topic, [(None, b"x")], transactional=True, txn_id="tx") == (INVALID_RECORD, -1)
    control = bytearray(wire.record_batch([(b"\0\0\0\1", b"\0\0\0\0\0\0")], producer_id=pid, producer_epoch=epoch))
    control[21:23] = (0x30).to_bytes(2, "big")
    control[17:21] = crc32c.crc32c(bytes(control[21:])).to_bytes(4, "big")
    assert wire.produce(addr, topic, 0, bytes(control), transactional_id="tx") == (INVALID_RECORD, -1)
    # A producer that never called InitProducerId for the id is not in any transaction.
    wait_for("the transaction coordinator", 30, lambda: wire.find_coordinator(addr, "tx", key_type=1)[0] == NONE)
    unknown = wait_for("a verified answer", 30, lambda: (lambda r: r if r[0] != 19 else None)(
        produce(addr, topic, [(None, b"x")], pid, epoch, 0, True, "tx-never-initialized")))
    assert unknown == (INVALID_PRODUCER_ID_MAPPING, -1), "NOT_ENOUGH_REPLICAS (19) only while the coordinator loads"
    assert cluster.topic(topic)["partitions"][0]["log_end_offset"] == 0, "nothing refused was stored"

    pid, epoch = txn_producer(addr, "tx", topic)
    # A partition the transaction does not hold is refused too.
    other = "txn-bad-input-other"
    cluster.create_topic(other)
    cluster.wait_topic(other, 1)
    assert produce(addr, other, [(None, b"x")], pid, epoch, 0, True, "tx") == (INVALID_TXN_STATE, -1)
    assert produce(addr, topic, [(None, b"t")], pid, epoch, 0, True, "tx") == (NONE, 0)
    # A newer coordinator (epoch 5) aborts at a bumped producer epoch...
    assert wire.write_txn_markers(addr, [(pid, epoch + 1, False, 5, {topic: [0]})]) == {(pid, topic, 0): NONE}
    # ...after which the old coordinator and the old producer epoch are fenced.
    assert wire.write_txn_markers(addr, [(pid, epoch + 1, True, 4, {topic: [0]})]) == {
        (pid, topic, 0): TRANSACTION_COORDINATOR_FENCED}
    assert wire.write_txn_markers(addr, [(pid, epoch, True, 5, {topic: [0]})]) == {
        (pid, topic, 0): INVALID_PRODUCER_EPOCH}
    assert produce(addr, topic, [(None, b"zombie")], pid, epoch, 1, True, "tx") == (INVALID_PRODUCER_EPOCH, -1)
    assert wire.write_txn_markers(addr, [(pid, epoch + 1, True, 5, {"no-such-topic": [0]})]) == {
        (pid, "no-such-topic", 0): UNKNOWN_TOPIC_OR_PARTITION}
    assert wire.list_offset_latest(addr, topic, 0, isolation_level=1) == (NONE, 2), "the abort ended it"
    err, _, lso, aborted, _ = wire.fetch_isolated(addr, topic, 0, 0, isolation_level=1)
    assert (err, lso, aborted) == (NONE, 2, [(pid, 0)])


ILLEGAL_GENERATION = 22
INVALID_TRANSACTION_TIMEOUT = 50


def test_the_coordinator_refuses_bad_requests_without_effect(cluster):
    """Kafka's answers to bad transactional requests, checked by hand: no state changes."""
    topic = "txn-coordinator-bad-input"
    cluster.create_topic(topic)
    cluster.wait_topic(topic, 1)
    addr = cluster.node(1).kafka_addr
    txn_id = "tx-bad-requests"
    wait_for("the transaction coordinator", 30,
             lambda: wire.find_coordinator(addr, txn_id, key_type=1)[0] == NONE)

    # (Retriable answers while the coordinator loads the id's partition.)
    unknown = wait_for("an answer about an unknown id", 30, lambda: (lambda e: e if e not in (14, 15, 16) else None)(
        wire.end_txn(addr, "tx-never-initialized", 1, 0, True)))
    assert unknown == INVALID_PRODUCER_ID_MAPPING
    assert wire.init_txn_producer(addr, txn_id, timeout_ms=0)[0] == INVALID_TRANSACTION_TIMEOUT
    assert wire.init_txn_producer(addr, txn_id, timeout_ms=10**9)[0] == INVALID_TRANSACTION_TIMEOUT
    err, pid, epoch = wait_for("InitProducerId", 30, lambda: (lambda r: r if r[0] == NONE else None)(
        wire.init_txn_producer(addr, txn_id)))
    assert epoch == 0

    assert wire.add_partitions_to_txn(addr, txn_id, pid, epoch, {"no-such-topic": [0]}) == {
        ("no-such-topic", 0): UNKNOWN_TOPIC_OR_PARTITION}
    assert wire.add_partitions_to_txn(addr, txn_id, pid, epoch, {topic: [5]}) == {(topic, 5): UNKNOWN_TOPIC_OR_PARTITION}
    assert wire.add_partitions_to_txn(addr, txn_id, pid + 1, epoch, {topic: [0]}) == {
        (topic, 0): INVALID_PRODUCER_ID_MAPPING}
    assert wire.add_partitions_to_txn(addr, txn_id, pid, epoch + 1, {topic: [0]}) == {
        (topic, 0): INVALID_PRODUCER_EPOCH}, "v1 is told INVALID_PRODUCER_EPOCH, not PRODUCER_FENCED"
    assert wire.end_txn(addr, txn_id, pid, epoch, True) == INVALID_TXN_STATE, "no transaction is open"

    # A group with a member at generation 1 refuses a transactional commit for generation 0.
    group = "txn-bad-group"
    wait_for("the group coordinator", 30, lambda: wire.find_coordinator(addr, group)[0] == NONE)
    joined = wait_for("a member in the group", 30, lambda: (lambda j: j if j["error"] not in (14, 15, 16) else None)(
        wire.join(addr, group, [topic])))
    assert joined["error"] == NONE, wire.error_name(joined["error"])
    member, generation = joined["member_id"], joined["generation"]
    stale = wire.txn_offset_commit(addr, txn_id, group, pid, epoch, generation - 1, member, {(topic, 0): 3})
    assert stale == {(topic, 0): ILLEGAL_GENERATION}
    assert wire.txn_offset_commit(addr, txn_id, group, pid, epoch, generation, member, {("no-such-topic", 0): 3}) == {
        ("no-such-topic", 0): UNKNOWN_TOPIC_OR_PARTITION}
    _, fetched = wire.offset_fetch(addr, group, [(topic, 0)])
    assert fetched[(topic, 0)][0] == -1, "nothing refused was committed"

    # The refusals left the id as it was: a transaction still begins and ends.
    assert wire.add_partitions_to_txn(addr, txn_id, pid, epoch, {topic: [0]}) == {(topic, 0): NONE}
    assert wire.end_txn(addr, txn_id, pid, epoch, False) == NONE
    wait_for("the abort to complete", 30, lambda: wire.end_txn(addr, txn_id, pid, epoch, False) == NONE)
