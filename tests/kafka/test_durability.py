"""SIGKILL of the single node while producing with acks=all and a flush after every
message: every acknowledged record is there, at its acknowledged offset, after restart."""
import time

import confluent_kafka as ck

import clients

ROUNDS = 3
ACKED_PER_ROUND = 3000


def test_acknowledged_records_survive_sigkill(make_cluster):
    c = make_cluster(1, settings=("log.flush.interval.messages=1",))
    topic = "durable"
    c.create_topic(topic, partitions=2)
    c.wait_topic(topic, 2)

    acked = {}  # (partition, offset) -> value
    failed = []

    def on_delivery(err, msg):
        if err is None:
            key = (msg.partition(), msg.offset())
            assert key not in acked or acked[key] == msg.value(), f"offset {key} acknowledged twice, differently"
            acked[key] = msg.value()
        else:
            failed.append(err)

    p = clients.confluent_producer(c.bootstrap, acks="all", linger_ms=1, message_timeout_ms=60000,
                                   compression_type="zstd")
    sent = 0
    for round_ in range(ROUNDS):
        # What was in flight at the last kill is delivered (again) to the restarted node first.
        left = p.flush(90)
        assert left == 0, f"round {round_}: {left} records neither delivered nor failed 90 s after the restart"
        target = len(acked) + ACKED_PER_ROUND
        deadline = time.monotonic() + 60
        want_in_flight_until = time.monotonic() + 10
        # Produce until ACKED_PER_ROUND more records are acknowledged and (for up to 10 s)
        # at least 500 more are queued or in flight; then SIGKILL the node and start it
        # again from the same data directory.
        while len(acked) < target or (len(p) < 500 and time.monotonic() < want_in_flight_until):
            assert time.monotonic() < deadline, (
                f"round {round_}: only {len(acked)} of {target} records acknowledged in 60 s; failures {failed[:3]}")
            if len(p) >= 5000:  # keep at most 5,000 records queued or in flight
                p.poll(0.01)
                continue
            try:
                p.produce(topic, value=f"record-{sent}-".encode() + b"." * (sent % 200), key=str(sent).encode(),
                          partition=sent % 2, on_delivery=on_delivery)
                sent += 1
            except BufferError:
                pass
            p.poll(0)
        in_flight = len(p)
        c.kill(1)
        p.poll(0)  # deliveries already received before the kill count as acknowledged
        acked_at_kill = len(acked)
        c.launch(1)
        c.wait_ready(timeout=60)
        c.wait_topic(topic, 2)
        print(f"round {round_}: sent {sent}, acknowledged {acked_at_kill} at the SIGKILL, {in_flight} in flight")

    left = p.flush(90)
    assert left == 0, f"{left} records neither delivered nor failed 90 s after the last restart"
    print(f"in all: sent {sent}, acknowledged {len(acked)}, failed {len(failed)}")

    cons = clients.confluent_consumer(c.bootstrap)
    try:
        ends = {}
        for part in (0, 1):
            lo, hi = cons.get_watermark_offsets(ck.TopicPartition(topic, part), timeout=15)
            assert lo == 0
            ends[part] = hi
    finally:
        cons.close()
    past_end = [k for k in acked if k[1] >= ends[k[0]]]
    assert not past_end, f"{len(past_end)} acknowledged offsets are past the log end {ends}, e.g. {sorted(past_end)[:5]}"

    got = clients.consume_confluent(c.bootstrap, topic, ends)
    for part, recs in got.items():
        assert [g.offset for g in recs] == list(range(ends[part])), f"partition {part}: offsets not contiguous"
    stored = {(g.partition, g.offset): g.value for recs in got.values() for g in recs}
    lost = sorted(k for k in acked if k not in stored)
    assert not lost, f"{len(lost)} acknowledged records are missing after restarts, e.g. {lost[:5]}"
    wrong = [(k, v, stored.get(k)) for k, v in sorted(acked.items()) if stored[k] != v]
    assert not wrong, f"{len(wrong)} acknowledged records differ after restarts, e.g. {wrong[:3]}"
    # Every value in the log is one that was sent (retries may duplicate, never invent).
    sent_values = {f"record-{i}-".encode() + b"." * (i % 200) for i in range(sent)}
    invented = [k for k, v in stored.items() if v not in sent_values]
    assert not invented, f"records in the log that were never produced: {invented[:5]}"
