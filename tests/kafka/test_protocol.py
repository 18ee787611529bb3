"""Kafka protocol details checked with hand-made requests (tests/kafka/wire.py)."""
import socket
import time

import wire


def test_pipelined_produce_requests_are_handled_in_order(cluster):
    """Kafka handles the requests of one connection one at a time, in order, and answers
    in order: 50 Produce requests sent back to back to one partition are appended in the
    order sent (base offsets 0..49) and answered in that order."""
    topic = "pipelined"
    cluster.create_topic(topic, partitions=1)
    cluster.wait_topic(topic, 1)
    addr = cluster.node(1).kafka_addr
    v = wire.pick_version(wire.api_versions(addr), wire.API_PRODUCE, 3, 8)
    assert v is not None
    now = int(time.time() * 1000)
    n = 50
    frames = b""
    for i in range(n):
        body = (wire.string(None) + wire.i16(1) + wire.i32(10000) + wire.i32(1) + wire.string(topic) + wire.i32(1)
                + wire.i32(0) + wire.nbytes(wire.record_batch([(None, f"req-{i}".encode() * (1 + (i * 37) % 200))], now)))
        frames += wire.request(wire.API_PRODUCE, v, 1000 + i, body)
    answered = []
    with socket.create_connection(addr, timeout=20) as s:
        s.sendall(frames)
        for _ in range(n):
            size = int.from_bytes(wire.recv_exact(s, 4), "big", signed=True)
            r = wire.Reader(wire.recv_exact(s, size))
            corr = r.i32()
            assert r.i32() == 1 and r.string() == topic and r.i32() == 1 and r.i32() == 0
            err, base = r.i16(), r.i64()
            answered.append((corr, err, base))
    assert [a[0] for a in answered] == [1000 + i for i in range(n)], f"responses out of order: {answered}"
    assert all(a[1] == 0 for a in answered), answered
    assert [a[2] for a in answered] == list(range(n)), (
        f"batches appended out of request order; base offsets by request: {[a[2] for a in answered]}")
