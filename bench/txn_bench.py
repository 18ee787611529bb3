#!/usr/bin/env python3
"""Transactions benchmark: transactional produce (1 KiB records, 100 records per
transaction) against idempotent produce in the same run, on one strom node (or three
with --nodes 3), with a read_committed consumer reading each topic back; then the
end-to-end latency (produce call to a read_committed consumer's receipt) at a fixed
rate, 2,000 records/s by default, for both kinds. Reports records/s, MB/s, the
transactional/idempotent ratio, latency p50/p99/max and the broker's CPU-seconds.

    tests/setup_python.sh
    cargo build --release
    target/pyenv/bin/python bench/txn_bench.py
    target/pyenv/bin/python bench/txn_bench.py --records 200000 --nodes 3 --rate 2000

See bench/README.md for what each number means.
"""
import argparse
import os
import struct
import sys
import tempfile
import threading
import time
import uuid

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "kafka"))
sys.path.insert(0, os.path.dirname(__file__))

import harness  # noqa: E402
from kafka_bench import cpu_seconds, pct  # noqa: E402

import confluent_kafka as ck  # noqa: E402

MB = 1_000_000


LINGER_MS = 5


def producer(bootstrap, transactional):
    conf = {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": LINGER_MS,
            "batch.size": 1 << 20, "queue.buffering.max.messages": 1_000_000}
    if transactional:
        conf["transactional.id"] = f"bench-{uuid.uuid4()}"
    p = ck.Producer(conf)
    if transactional:
        p.init_transactions(60)
    return p


def produce_all(bootstrap, topic, n, size, per_txn):
    """Produces n records of `size` bytes as fast as the client goes: in transactions of
    `per_txn` records, or idempotently when per_txn is 0. Returns seconds taken."""
    p = producer(bootstrap, per_txn > 0)
    value = b"x" * size
    started = time.monotonic()
    sent = 0
    while sent < n:
        chunk = min(per_txn or n, n - sent)
        if per_txn:
            p.begin_transaction()
        for _ in range(chunk):
            while True:
                try:
                    p.produce(topic, value=value)
                    break
                except BufferError:
                    p.poll(0.01)
        sent += chunk
        if per_txn:
            p.commit_transaction(60)
    assert p.flush(120) == 0
    return time.monotonic() - started


def consume_all(bootstrap, topic, partitions, n, timeout=300):
    """Reads n records back with a read_committed consumer: seconds taken."""
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}",
                     "enable.auto.commit": False, "isolation.level": "read_committed",
                     "fetch.wait.max.ms": 100})
    c.assign([ck.TopicPartition(topic, p, 0) for p in range(partitions)])
    got, started = 0, time.monotonic()
    while got < n:
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"read {got} of {n} records of {topic} in {timeout} s")
        for m in c.consume(num_messages=10_000, timeout=0.5):
            if m.error() is None:
                got += 1
    c.close()
    return time.monotonic() - started


def latency_run(bootstrap, topic, partitions, rate, seconds, size, per_txn):
    """Produces at `rate` records/s for `seconds` (in transactions of per_txn, or
    idempotently), each record carrying its send time; a read_committed consumer notes
    when each arrives. Returns the latencies in ms."""
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}",
                     "enable.auto.commit": False, "isolation.level": "read_committed",
                     "fetch.wait.max.ms": 10, "fetch.min.bytes": 1})
    c.assign([ck.TopicPartition(topic, p, ck.OFFSET_END) for p in range(partitions)])
    c.consume(num_messages=1, timeout=1.0)  # joins the partitions at their ends
    latencies = []
    total = int(rate * seconds)
    done = threading.Event()

    def read():
        while len(latencies) < total and not done.is_set():
            for m in c.consume(num_messages=1000, timeout=0.005):
                if m.error() is None:
                    sent = struct.unpack(">d", m.value()[:8])[0]
                    latencies.append((sent, (time.monotonic() - sent) * 1000))

    reader = threading.Thread(target=read)
    reader.start()
    p = producer(bootstrap, per_txn > 0)
    pad = b"x" * max(0, size - 8)
    started = time.monotonic()
    in_txn = 0
    for i in range(total):
        due = started + i / rate
        while time.monotonic() < due:
            p.poll(0)
            time.sleep(0.0002)
        if per_txn and in_txn == 0:
            p.begin_transaction()
        p.produce(topic, value=struct.pack(">d", time.monotonic()) + pad)
        p.poll(0)
        in_txn += 1
        if per_txn and in_txn == per_txn:
            p.commit_transaction(60)
            in_txn = 0
    if per_txn and in_txn:
        p.commit_transaction(60)
    p.flush(60)
    reader.join(timeout=60)
    done.set()
    c.close()
    # The first second is left out: the consumer's first fetches are still settling.
    return [ms for sent, ms in latencies if sent >= started + 1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.environ.get("STROM_BIN") or os.path.join(REPO, "target/release/strom"))
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--per-txn", type=int, default=100)
    ap.add_argument("--rate", type=int, default=2000, help="records/s of the latency runs")
    ap.add_argument("--seconds", type=float, default=10, help="length of each latency run (the first second is not counted)")
    ap.add_argument("--linger-ms", type=int, default=5, help="the producers' linger.ms")
    args = ap.parse_args()
    global LINGER_MS
    LINGER_MS = args.linger_ms
    with tempfile.TemporaryDirectory(prefix="strom-txn-bench-") as d:
        cluster = harness.start(d, n=args.nodes, binary=args.binary, rust_log="warn")
        try:
            rf = min(3, args.nodes)
            pids = [cluster.node(n).pid for n in cluster.running()]
            results = {}
            cluster.create_topic("bench-warm-up", partitions=args.partitions, rf=rf)
            cluster.wait_topic("bench-warm-up", args.partitions)
            produce_all(cluster.bootstrap, "bench-warm-up", 2000, args.size, 0)
            for kind, per_txn in (("idempotent", 0), ("transactional", args.per_txn)):
                topic = f"bench-{kind}"
                cluster.create_topic(topic, partitions=args.partitions, rf=rf)
                cluster.wait_topic(topic, args.partitions)
                cpu0 = sum(cpu_seconds(p) for p in pids)
                produce_s = produce_all(cluster.bootstrap, topic, args.records, args.size, per_txn)
                consume_s = consume_all(cluster.bootstrap, topic, args.partitions, args.records)
                cpu = sum(cpu_seconds(p) for p in pids) - cpu0
                lat_topic = f"bench-latency-{kind}"
                cluster.create_topic(lat_topic, partitions=args.partitions, rf=rf)
                cluster.wait_topic(lat_topic, args.partitions)
                lat = latency_run(cluster.bootstrap, lat_topic, args.partitions, args.rate, args.seconds, args.size,
                                  per_txn)
                results[kind] = (produce_s, consume_s, cpu, lat)
            mb = args.records * args.size / MB
            print(f"{args.nodes} node(s), {args.partitions} partitions, {args.records} records of {args.size} B, "
                  f"{args.per_txn} records per transaction")
            for kind, (produce_s, consume_s, cpu, lat) in results.items():
                print(f"  {kind:13} produce {args.records / produce_s:9,.0f} rec/s {mb / produce_s:7.1f} MB/s | "
                      f"read_committed {args.records / consume_s:9,.0f} rec/s | broker CPU {cpu:5.2f} s | "
                      f"latency at {args.rate} rec/s: p50 {pct(lat, 50):6.1f} ms p99 {pct(lat, 99):6.1f} ms "
                      f"max {max(lat, default=0):6.1f} ms ({len(lat)} records)")
            ratio = results["idempotent"][0] / results["transactional"][0]
            print(f"  transactional / idempotent produce throughput: {ratio:.2f}")
        finally:
            cluster.close()


if __name__ == "__main__":
    main()
