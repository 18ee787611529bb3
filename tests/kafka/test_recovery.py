"""Bad batches and bad versions get Kafka's error codes; after SIGKILL a segment with
garbage appended, or with its tail cut mid-batch, is recovered to the last good batch
and the partition goes on."""
import glob
import os
import socket

import wire

CORRUPT_MESSAGE = 2
UNSUPPORTED_VERSION = 35


def test_bad_crc_is_corrupt_message(cluster):
    cluster.create_topic("crc", partitions=1)
    cluster.wait_topic("crc", 1)
    addr = cluster.node(1).kafka_addr
    batch = bytearray(wire.record_batch([(b"k", b"value")]))
    batch[-3] ^= 0xFF  # inside the CRC-covered part
    assert wire.produce(addr, "crc", 0, bytes(batch))[0] == CORRUPT_MESSAGE
    assert wire.produce(addr, "crc", 0, b"\x00" * 30)[0] == CORRUPT_MESSAGE
    assert wire.produce(addr, "crc", 0, wire.record_batch([(b"k", b"ok")])) == (0, 0), "the partition still works"


def test_api_versions_newer_than_supported_is_answered_in_v0(cluster):
    with socket.create_connection(cluster.node(1).kafka_addr, timeout=10) as s:
        s.sendall(wire.request(wire.API_API_VERSIONS, 99, 5, b""))
        r = wire.recv_response(s, 5)
        assert r.i16() == UNSUPPORTED_VERSION
        keys = {r.i16(): (r.i16(), r.i16()) for _ in range(r.i32())}
        assert keys[wire.API_PRODUCE][0] == 3 and keys[wire.API_API_VERSIONS] == (0, 3)


def segment(cluster, topic):
    files = sorted(glob.glob(os.path.join(cluster.node(1).data_dir, "logs", f"{topic}-0", "*.log")))
    assert files, "no segment file"
    return files[-1]


def read_values(addr, topic):
    err, hw, records = wire.fetch(addr, topic, 0, 0)
    assert err == 0, f"fetch error {err}"
    return hw, wire.batch_headers(records)


def test_segment_damage_is_recovered_to_the_last_good_batch(make_cluster):
    c = make_cluster(1, settings=("log.flush.interval.messages=1",))
    c.create_topic("torn", partitions=1)
    c.wait_topic("torn", 1)
    addr = c.node(1).kafka_addr
    for i in range(5):
        assert wire.produce(addr, "torn", 0, wire.record_batch([(b"k%d" % i, b"v" * 100)]))[0] == 0
    c.kill(1)

    # Garbage after the last batch: cut on restart, nothing lost.
    with open(segment(c, "torn"), "ab") as f:
        f.write(os.urandom(1000))
    c.launch(1)
    c.wait_ready()
    hw, batches = read_values(addr, "torn")
    assert (hw, [b[0] for b in batches]) == (5, [0, 1, 2, 3, 4])
    assert wire.produce(addr, "torn", 0, wire.record_batch([(b"after", b"garbage")])) == (0, 5)
    c.kill(1)

    # The last batch torn mid-way: recovered to the batch before it.
    path = segment(c, "torn")
    os.truncate(path, os.path.getsize(path) - 10)
    c.launch(1)
    c.wait_ready()
    hw, batches = read_values(addr, "torn")
    assert (hw, [b[0] for b in batches]) == (5, [0, 1, 2, 3, 4])
    assert wire.produce(addr, "torn", 0, wire.record_batch([(b"again", b"ok")])) == (0, 5)
    assert "truncat" in open(c.node(1).log).read().lower() or "cut" in open(c.node(1).log).read().lower()


def test_a_restarted_broker_is_ready_only_with_its_logs_open(make_cluster):
    """After SIGKILL the node opens (recovers) every log it hosts, several at once, before
    it registers: by the time it is unfenced and answers /ready, every partition is open
    and answers at its old high watermark."""
    c = make_cluster(1)
    c.create_topic("many", partitions=12)
    c.wait_topic("many", 12)
    addr = c.node(1).kafka_addr
    for p in range(12):
        for i in range(3):
            assert wire.produce(addr, "many", p, wire.record_batch([(b"k", b"v" * 200)]))[0] == 0
    c.kill(1)
    before = os.path.getsize(c.node(1).log)
    c.launch(1)
    c.wait_ready()
    # Straight after /ready: every partition answers with its records.
    for p in range(12):
        err, hw, _ = wire.fetch(addr, "many", p, 0)
        assert (err, hw) == (0, 3), f"partition {p}: error {err}, high watermark {hw} right after /ready"
    with open(c.node(1).log) as f:
        f.seek(before)
        lines = f.read().splitlines()

    def first(text):
        found = [i for i, line in enumerate(lines) if text in line]
        assert found, f"no log line with {text!r} after the restart"
        return found[0]

    opened = lines[first("partition logs opened before registering")]
    assert "partitions=12" in opened and "threads=" in opened, opened
    assert first("partition logs opened before registering") < first("registered with the controller")
    assert sum("opened partition log" in line and 'topic="many"' in line
               for line in lines[:first("registered with the controller")]) == 12


def test_logs_of_a_topic_deleted_while_a_broker_was_down_are_deleted_when_it_returns(make_cluster):
    """The restarted broker opens every log on its disk before it registers; those of a
    topic deleted while it was down are then deleted (Kafka's stray replicas), and the
    topics it still hosts keep their records."""
    from harness import FAST, wait_for
    c = make_cluster(3, FAST)
    for name in ("doomed", "kept"):
        c.create_topic(name, partitions=2, rf=3)
        c.wait_topic(name, 2)
    for p in range(2):
        leader = c.topic("kept")["partitions"][p]["leader"]
        assert wire.produce(c.node(leader).kafka_addr, "kept", p, wire.record_batch([(b"k", b"v")]))[0] == 0
    logs = os.path.join(c.node(3).data_dir, "logs")
    assert {d for d in os.listdir(logs) if d.startswith("doomed-")} == {"doomed-0", "doomed-1"}
    c.kill(3)
    status, body = c.send(1, "DELETE", "/v1/topics/doomed")
    assert status in (200, 202, 204), f"delete topic: {status} {body}"
    c.launch(3)
    c.wait_ready()
    wait_for("the deleted topic's logs gone from node 3", 30,
             lambda: not [d for d in os.listdir(logs) if d.startswith("doomed-")])
    assert {d for d in os.listdir(logs) if d.startswith("kept-")} == {"kept-0", "kept-1"}

    def kept_on_3():
        t = c.topic("kept", via=3)
        return t and all(3 in p["isr"] and p["high_watermark"] == 1 for p in t["partitions"])
    wait_for("node 3 back in the ISR of the kept topic", 30, kept_on_3)
