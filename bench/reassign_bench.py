#!/usr/bin/env python3
"""Partition-move benchmark on a 4-node loopback cluster (balancer off, so every move is
the benchmark's own):

- the machine's limits in the same run: sequential disk write + fsync, loopback TCP;
- moving one partition of `--mb` MB (RF 3, broker 3 replaced by broker 4) with the
  throttle off: seconds and MB/s, against the limits;
- the same move back with `leader.replication.throttled.rate` at `--throttle-mb` MB/s:
  the rate achieved, against the one set;
- produce latency (acks=all, RF 3, a steady 500 records/s of 1 KiB to another topic)
  p50/p99 during each move, against the same load with no move.

    cargo build --release && tests/setup_python.sh
    target/pyenv/bin/python bench/reassign_bench.py [--mb 1024] [--throttle-mb 50]
"""
import argparse
import os
import sys
import tempfile
import threading
import time

import confluent_kafka as ck

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "kafka"))
sys.path.insert(0, os.path.dirname(__file__))
import harness  # noqa: E402
from kafka_bench import disk_write_mb_s, loopback_mb_s, pct  # noqa: E402

MB = 1_000_000


class LatencyProbe:
    """acks=all produce at a steady rate in a thread; delivery latencies in ms."""

    def __init__(self, cluster, topic, rate=500, size=1024):
        self.p = ck.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 1,
                              "log_level": 0, "enable.idempotence": True})
        self.topic, self.rate, self.value = topic, rate, os.urandom(size)
        self.latencies = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        period = 1 / self.rate
        next_at = time.monotonic()
        while not self.stop.is_set():
            sent = time.monotonic()
            self.p.produce(self.topic, value=self.value,
                           on_delivery=lambda e, m, s=sent: None if e else self.latencies.append(
                               (time.monotonic() - s) * 1000))
            self.p.poll(0)
            next_at += period
            delay = next_at - time.monotonic()
            if delay > 0:
                self.stop.wait(delay)

    def window(self):
        """Latencies recorded since the last call."""
        self.p.poll(0)
        out, self.latencies = self.latencies, []
        return out

    def close(self):
        self.stop.set()
        self.thread.join(timeout=10)
        self.p.flush(30)


def fill(cluster, topic, total_mb):
    p = ck.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "1", "linger.ms": 20, "log_level": 0,
                     "batch.size": 1_000_000, "queue.buffering.max.kbytes": 512_000})
    value = os.urandom(100_000)
    for _ in range(total_mb * MB // len(value)):
        while True:
            try:
                p.produce(topic, value=value, partition=0)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(600) == 0


def move(cluster, topic, target, timeout=3600):
    """Starts the move and polls it to completion: (seconds, copy rate in MB/s). The copy
    rate is the slope of `bytes_left` between the first sample after 2 s and the last one
    above a tenth of the start, so neither the start nor the ISR join is in it."""
    status, body = cluster.send(1, "POST", f"/v1/partitions/{topic}/0/reassign", {"replicas": target})
    assert status == 202, body
    start = time.monotonic()
    samples = []
    deadline = start + timeout
    while time.monotonic() < deadline:
        status, rows = cluster.get(1, "/v1/reassignments", timeout=5)
        rows = [r for r in rows or [] if r["topic"] == topic]
        if status == 200 and not rows:
            break
        if rows and rows[0]["bytes_left"] is not None:
            samples.append((time.monotonic(), rows[0]["bytes_left"]))
        time.sleep(0.1)
    took = time.monotonic() - start
    first_left = samples[0][1] if samples else 0
    window = [(t, b) for t, b in samples if t - start >= 2 and b > first_left / 10]
    if len(window) >= 2 and window[-1][0] > window[0][0]:
        return took, (window[0][1] - window[-1][1]) / (window[-1][0] - window[0][0]) / MB
    # Too quick to sample: the whole move, start and ISR join included.
    return took, first_left / MB / took


def summary(latencies):
    return f"p50 {pct(latencies, 50):.1f} ms, p99 {pct(latencies, 99):.1f} ms ({len(latencies)} records)"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(harness.REPO, "target", "release", "strom"))
    ap.add_argument("--mb", type=int, default=1024, help="size of the moved partition, MB")
    ap.add_argument("--throttle-mb", type=int, default=50, help="leader.replication.throttled.rate, MB/s")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="strom-reassign-bench-") as d:
        disk = disk_write_mb_s(d)
        loop = loopback_mb_s()
        print(f"limits: disk write+fsync {disk:.0f} MB/s, loopback {loop:.0f} MB/s", flush=True)
        cluster = harness.start(d, 4, settings=("balancer.mode=off",), binary=os.path.abspath(args.bin),
                                rust_log="warn")
        try:
            cluster.create_topic("moved", partitions=1, rf=3)
            cluster.create_topic("probe", partitions=1, rf=3, configs={"min.insync.replicas": "2"})
            cluster.wait_topic("moved", 1)
            cluster.wait_topic("probe", 1)
            for topic in ("moved", "probe"):
                if cluster.topic(topic)["partitions"][0]["replicas"] != [1, 2, 3]:
                    move(cluster, topic, [1, 2, 3], timeout=60)
            fill(cluster, "moved", args.mb)
            size = cluster.topic("moved")["partitions"][0]["log_end_offset"]
            print(f"partition filled: {args.mb} MB in {size} records", flush=True)
            probe = LatencyProbe(cluster, "probe")
            try:
                time.sleep(10)
                base = probe.window()
                print(f"produce latency, no move: {summary(base)}", flush=True)
                took, copy = move(cluster, "moved", [1, 2, 4])
                during = probe.window()
                print(f"move of {args.mb} MB, throttle off: {took:.1f} s in all, copying at {copy:.0f} MB/s "
                      f"({copy / min(disk, loop):.2f} of the lower limit); produce latency during it: "
                      f"{summary(during)}", flush=True)
                # Broker 3 must have dropped its copy, or the move back has nothing to copy.
                gone = os.path.join(cluster.node(3).data_dir, "logs", "moved-0")
                harness.wait_for("broker 3 to delete its copy", 60, lambda: not os.path.exists(gone))
                status, _ = cluster.send(1, "PATCH", "/v1/brokers/configs",
                                         {"leader.replication.throttled.rate": str(args.throttle_mb * MB)})
                assert status == 200
                took, copy = move(cluster, "moved", [1, 2, 3])
                during = probe.window()
                print(f"move of {args.mb} MB, throttle {args.throttle_mb} MB/s: {took:.1f} s in all, copying at "
                      f"{copy:.1f} MB/s ({copy / args.throttle_mb - 1:+.1%} off the throttle); produce latency "
                      f"during it: {summary(during)}", flush=True)
            finally:
                probe.close()
        finally:
            cluster.close()


if __name__ == "__main__":
    main()
