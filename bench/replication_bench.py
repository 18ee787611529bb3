#!/usr/bin/env python3
"""Replication benchmark on a 3-node loopback cluster with default settings:

- produce throughput with RF=3 and acks=all, as a ratio to RF=1 and acks=1 in the same run,
  with an idempotent producer and with the RF=1 run's own (not idempotent) client, median
  of three interleaved rounds;
- end-to-end latency (produce to consume) p50/p99 at a steady moderate rate, RF=3, acks=all;
- the failover stall: from SIGKILL of a partition leader, of a follower and of the controller
  to the first acknowledged acks=all write (of a record sent after the kill) on every
  partition; median of 5 each.

    cargo build --release && tests/setup_python.sh
    target/pyenv/bin/python bench/replication_bench.py [--bin target/release/strom]
"""
import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

import confluent_kafka as ck

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "kafka"))
import harness  # noqa: E402


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def producer(bootstrap, acks, idempotent=None, **extra):
    idempotent = acks == "all" if idempotent is None else idempotent
    conf = {"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 5, "log_level": 0,
            "enable.idempotence": idempotent, "message.timeout.ms": 60000, "queue.buffering.max.messages": 500000}
    conf.update(extra)
    return ck.Producer(conf)


def throughput(cluster, topic, acks, n, size, idempotent=None):
    p = producer(cluster.bootstrap, acks, idempotent)
    value = os.urandom(size)
    errors = []
    start = time.monotonic()
    for i in range(n):
        while True:
            try:
                p.produce(topic, value=value, on_delivery=lambda e, m: errors.append(e) if e else None)
                break
            except BufferError:
                p.poll(0.01)
    p.flush(300)
    took = time.monotonic() - start
    assert not errors, errors[:3]
    return n / took, n * size / took / 1e6


def e2e_latency(cluster, topic, rate, seconds):
    c = ck.Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "bench", "log_level": 0,
                     "fetch.wait.max.ms": 10, "enable.auto.commit": False})
    c.assign([ck.TopicPartition(topic, 0, ck.OFFSET_END)])
    lat = []
    stop = threading.Event()
    # Records of the first second are not counted: the consumer is still
    # resolving its position and its first fetch.
    cutoff_ms = [float("inf")]

    def consume():
        # poll(), not consume(n): consume waits for n messages or its timeout,
        # which would add up to that timeout to every measured latency.
        while not stop.is_set():
            m = c.poll(0.1)
            if m is not None and not m.error() and m.timestamp()[1] > cutoff_ms[0]:
                lat.append(time.time() * 1000 - m.timestamp()[1])

    t = threading.Thread(target=consume)
    t.start()
    time.sleep(1)
    p = producer(cluster.bootstrap, "all", **{"linger.ms": 0})
    cutoff_ms[0] = time.time() * 1000 + 1000
    start, i = time.monotonic(), 0
    while time.monotonic() - start < seconds:
        while i < (time.monotonic() - start) * rate:
            p.produce(topic, partition=0, value=b"x" * 100)
            i += 1
        p.poll(0.001)
    p.flush(30)
    time.sleep(1)
    stop.set()
    t.join()
    c.close()
    return pct(lat, 50), pct(lat, 99), len(lat)


def stall_once(cluster, topic, partitions, victim):
    """Kills `victim` while a producer writes to every partition; returns the stall in s."""
    p = producer(cluster.bootstrap, "all")
    first_ack = {}
    kill_at = [None]
    stop = threading.Event()

    def on_delivery(sent_at):
        def cb(err, msg):
            if err is None and kill_at[0] is not None and sent_at > kill_at[0]:
                first_ack.setdefault(msg.partition(), time.monotonic())
        return cb

    def run():
        while not stop.is_set():
            for part in range(partitions):
                try:
                    p.produce(topic, partition=part, value=b"s", on_delivery=on_delivery(time.monotonic()))
                except BufferError:
                    pass
            p.poll(0.005)
        p.flush(60)

    t = threading.Thread(target=run)
    t.start()
    time.sleep(2)
    kill_at[0] = time.monotonic()
    cluster.kill(victim)
    harness.wait_for("acks on every partition after the kill", 60, lambda: len(first_ack) == partitions)
    stop.set()
    t.join()
    return max(first_ack.values()) - kill_at[0]


def restore(cluster, victim, topic, partitions):
    cluster.launch(victim)
    survivor = next(n for n in cluster.running() if n != victim)

    def all_isr():
        t = cluster.topic(topic, via=survivor)
        return t and all(len(pp["isr"]) == 3 for pp in t["partitions"])

    harness.wait_for("every ISR back to 3", 60, all_isr)
    cluster.wait_active(timeout=60)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(harness.REPO, "target", "release", "strom"))
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="strom-repl-bench-") as d:
        cluster = harness.start(d, 3, binary=os.path.abspath(args.bin), rust_log="warn")
        try:
            cluster.create_topic("rf1", partitions=1, rf=1)
            cluster.create_topic("rf3", partitions=1, rf=3, configs={"min.insync.replicas": "2"})
            cluster.wait_topic("rf1", 1)
            cluster.wait_topic("rf3", 1)
            # Three rounds, interleaved; the median of each. The second RF=3 figure uses the
            # RF=1 run's own client (not idempotent: librdkafka then keeps up to 1,000,000
            # requests in flight, where the idempotent producer keeps 5).
            rounds = {"r1": [], "r3": [], "r3p": []}
            for _ in range(3):
                rounds["r1"].append(throughput(cluster, "rf1", "1", args.records, args.size))
                rounds["r3"].append(throughput(cluster, "rf3", "all", args.records, args.size))
                rounds["r3p"].append(throughput(cluster, "rf3", "all", args.records, args.size, idempotent=False))
            r1, r3, r3p = (sorted(rounds[k])[1] for k in ("r1", "r3", "r3p"))
            print(f"produce {args.records} x {args.size} B: RF=1 acks=1 {r1[0]:,.0f} rec/s {r1[1]:.1f} MB/s; "
                  f"RF=3 acks=all idempotent {r3[0]:,.0f} rec/s {r3[1]:.1f} MB/s, ratio {r3[0] / r1[0]:.2f}; "
                  f"RF=3 acks=all not idempotent {r3p[0]:,.0f} rec/s {r3p[1]:.1f} MB/s, ratio {r3p[0] / r1[0]:.2f}",
                  flush=True)
            cluster.create_topic("e2e", partitions=1, rf=3, configs={"min.insync.replicas": "2"})
            cluster.wait_topic("e2e", 1)
            p50, p99, n = e2e_latency(cluster, "e2e", 2000, 10)
            print(f"end-to-end latency at 2,000 records/s (RF=3, acks=all, {n} records): p50 {p50:.1f} ms, p99 {p99:.1f} ms",
                  flush=True)

            cluster.create_topic("stall", partitions=3, rf=3, configs={"min.insync.replicas": "2"})
            cluster.create_topic("stall1", partitions=1, rf=3, configs={"min.insync.replicas": "2"})
            cluster.wait_topic("stall", 3)
            cluster.wait_topic("stall1", 1)
            results = {}
            for kind in ("leader", "follower", "controller"):
                stalls = []
                for _ in range(args.runs):
                    controller = cluster.wait_active()
                    topic, parts = ("stall1", 1) if kind == "follower" else ("stall", 3)
                    t = cluster.topic(topic)
                    if kind == "leader":
                        victim = t["partitions"][0]["leader"]
                    elif kind == "controller":
                        victim = controller
                    else:
                        victim = next(r for r in t["partitions"][0]["replicas"]
                                      if r != t["partitions"][0]["leader"] and r != controller)
                    stalls.append(stall_once(cluster, topic, parts, victim))
                    restore(cluster, victim, "stall", 3)
                results[kind] = stalls
                print(f"failover stall, SIGKILL of the {kind}: median {statistics.median(stalls):.2f} s "
                      f"(runs {', '.join(f'{s:.2f}' for s in stalls)})", flush=True)
        finally:
            cluster.close()


if __name__ == "__main__":
    main()
