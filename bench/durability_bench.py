#!/usr/bin/env python3
"""Durable writes: what `flush.messages=1` (an fsync before every acknowledgement) costs
against no forced flush, with many producers at once. Strom groups concurrent appends
into one fdatasync per partition (group commit), so the cost should shrink as producers
are added.

One strom node (or --nodes 3 with RF 3, where followers fsync too) on loopback; two
topics, identical but for the topic config `flush.messages=1`; --producers confluent-kafka
producers (default 16), each in its own thread, acks=all, 1 KiB records, together
--records records per round. Rounds alternate between the two topics; the medians are
reported, with produce p50/p99 latency, the broker's CPU-seconds, and the machine's
limits measured in the same run (sequential write+fsync MB/s and small write+fdatasync
per second in the data directory).

    tests/setup_python.sh
    cargo build --release
    target/pyenv/bin/python bench/durability_bench.py
    target/pyenv/bin/python bench/durability_bench.py --nodes 3 --producers 16 --rounds 3
    cargo build --release --example loadgen       # then, with bench/loadgen.rs as the client:
    target/pyenv/bin/python bench/durability_bench.py --client rust --seconds 5

The Python producers share one interpreter and are the limit of their runs; the Rust
client (one synchronous request per connection) is not.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "kafka"))
sys.path.insert(0, HERE)

import harness  # noqa: E402
from kafka_bench import cpu_seconds, disk_write_mb_s, pct, MB  # noqa: E402

try:
    import confluent_kafka as ck
except ImportError:
    sys.exit("confluent-kafka is missing: run tests/setup_python.sh and use target/pyenv/bin/python")


def fdatasync_per_s(directory, n=200):
    """4 KiB appended to one file then fdatasync, n times: syncs per second."""
    path = os.path.join(directory, "fsync-probe.bin")
    block = os.urandom(4096)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        t = time.perf_counter()
        for _ in range(n):
            os.write(fd, block)
            os.fdatasync(fd)
        return n / (time.perf_counter() - t)
    finally:
        os.close(fd)
        os.unlink(path)


def one_producer(bootstrap, topic, partitions, n, size, linger_ms, timeout, ready, out):
    """Connects and learns the topic's leaders (one record to each partition, not
    counted), waits at the barrier `ready`, then sends n records (partition chosen round
    robin, from a random start) and appends (latencies, errors) to out."""
    p = ck.Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": linger_ms, "enable.idempotence": True,
                     "compression.type": "none", "message.timeout.ms": int(timeout * 1000)})
    values = [os.urandom(size) for _ in range(8)]
    for part in range(partitions):
        p.produce(topic, values[0], partition=part)
    if p.flush(timeout):
        raise SystemExit("warm-up records undelivered")
    ready.wait()
    latencies, errors = [], []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(err)
        else:
            latencies.append(msg.latency())

    start = int.from_bytes(os.urandom(2), "little")
    deadline = time.monotonic() + timeout
    for i in range(n):
        while True:
            try:
                p.produce(topic, values[i & 7], partition=(start + i) % partitions, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.001)
                if time.monotonic() > deadline:
                    errors.append("producer queue stayed full past the deadline")
                    out.append((latencies, errors))
                    return
        if i & 255 == 0:
            p.poll(0)
    left = p.flush(max(1.0, deadline - time.monotonic()))
    if left:
        errors.append(f"{left} records undelivered at the deadline")
    out.append((latencies, errors))


def round_rust(cluster, topic, args):
    """One round with bench/loadgen.rs: --producers connections, each one synchronous
    Produce request of --batch records in flight."""
    import subprocess
    pids = [n.pid for n in cluster.nodes.values()]
    cpu0 = sum(cpu_seconds(pid) for pid in pids)
    out = subprocess.run([args.loadgen, "--bootstrap", cluster.node(1).kafka, "--topic", topic,
                          "--partitions", str(args.partitions), "--connections", str(args.producers),
                          "--batch", str(args.batch), "--size", str(args.size), "--seconds", str(args.seconds),
                          "--json"], capture_output=True, text=True, timeout=args.seconds + args.timeout)
    cpu = sum(cpu_seconds(pid) for pid in pids) - cpu0
    if out.returncode != 0:
        raise SystemExit(f"loadgen failed ({out.returncode}): {out.stdout[-2000:]} {out.stderr[-2000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return {"mb_s": r["mb_s"], "records_s": r["records_s"], "p50_ms": r["p50_ms"], "p99_ms": r["p99_ms"],
            "broker_cpu_s": cpu}


def round_(cluster, topic, args):
    if args.client == "rust":
        return round_rust(cluster, topic, args)
    per = args.records // args.producers
    out = []
    ready = threading.Barrier(args.producers + 1)
    threads = [threading.Thread(target=one_producer,
                                args=(cluster.bootstrap, topic, args.partitions, per, args.size, args.linger_ms,
                                      args.timeout, ready, out))
               for _ in range(args.producers)]
    for th in threads:
        th.start()
    ready.wait()
    pids = [n.pid for n in cluster.nodes.values()]
    cpu0 = sum(cpu_seconds(pid) for pid in pids)
    t = time.perf_counter()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - t
    cpu = sum(cpu_seconds(pid) for pid in pids) - cpu0
    lat = [x for ls, _ in out for x in ls]
    errors = [e for _, es in out for e in es]
    if errors or len(lat) != per * args.producers:
        raise SystemExit(f"{topic}: {len(errors)} errors (first {errors[:3]}), {len(lat)} of {per * args.producers} acked")
    payload = per * args.producers * args.size
    return {"mb_s": payload / MB / elapsed, "records_s": len(lat) / elapsed,
            "p50_ms": pct(lat, 50) * 1000, "p99_ms": pct(lat, 99) * 1000, "broker_cpu_s": cpu}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(REPO, "target", "release", "strom"))
    ap.add_argument("--nodes", type=int, default=1, help="1, or 3 (topics then have RF 3)")
    ap.add_argument("--producers", type=int, default=16)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--size", type=int, default=1000, help="record value size, bytes")
    ap.add_argument("--linger-ms", type=float, default=1, help="the producers' linger.ms")
    ap.add_argument("--records", type=int, default=160_000, help="records per round, all producers together")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per topic (alternating)")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--client", choices=["python", "rust"], default="python",
                    help="python: confluent-kafka producers in threads; rust: bench/loadgen.rs, one synchronous "
                         "request per connection (cargo build --release --example loadgen)")
    ap.add_argument("--loadgen", default=os.path.join(REPO, "target", "release", "examples", "loadgen"))
    ap.add_argument("--batch", type=int, default=16, help="rust client: records per request")
    ap.add_argument("--seconds", type=float, default=10, help="rust client: length of a round")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="broker setting (repeatable)")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()
    args.bin = os.path.abspath(args.bin)
    if not os.access(args.bin, os.X_OK):
        sys.exit(f"{args.bin} is missing: cargo build --release (or --bin PATH)")
    if args.client == "rust" and not os.access(args.loadgen, os.X_OK):
        sys.exit(f"{args.loadgen} is missing: cargo build --release --example loadgen")
    rf = 3 if args.nodes >= 3 else 1
    print(f"strom: {args.bin}; confluent-kafka {ck.__version__} (librdkafka {ck.libversion()[0]}); "
          f"{os.cpu_count()} CPUs; {args.nodes} node(s), RF {rf}, {args.partitions} partitions, "
          f"{args.producers} {args.client} producers, acks=all, {args.size} B records, "
          + (f"{args.batch} per request, {args.seconds} s rounds" if args.client == "rust"
             else f"{args.records} records per round"),
          flush=True)
    directory = tempfile.mkdtemp(prefix="strom-dbench-")
    cluster = harness.start(directory, args.nodes, settings=args.set, binary=args.bin, rust_log="warn")
    results = {"args": vars(args), "limits": {}, "rounds": {"none": [], "fsync": []}}
    try:
        data_dir = cluster.node(1).data_dir
        limits = results["limits"]
        limits["disk_write_mb_s"] = disk_write_mb_s(data_dir, 256)
        limits["fdatasync_per_s"] = fdatasync_per_s(data_dir)
        print(f"machine limits: sequential write+fsync {limits['disk_write_mb_s']:.0f} MB/s; "
              f"4 KiB write+fdatasync {limits['fdatasync_per_s']:.0f}/s", flush=True)
        topics = {"none": "durability-none", "fsync": "durability-fsync"}
        for kind, topic in topics.items():
            configs = {"flush.messages": "1"} if kind == "fsync" else {}
            if rf > 1:
                configs["min.insync.replicas"] = "2"
            cluster.create_topic(topic, partitions=args.partitions, rf=rf, configs=configs)
            cluster.wait_topic(topic, args.partitions)
        for r in range(args.rounds):
            for kind, topic in topics.items():
                res = round_(cluster, topic, args)
                results["rounds"][kind].append(res)
                print(f"round {r + 1} {kind:5}: {res['mb_s']:6.1f} MB/s {res['records_s']:8.0f} rec/s  "
                      f"p50 {res['p50_ms']:6.1f} ms  p99 {res['p99_ms']:6.1f} ms  broker CPU {res['broker_cpu_s']:.2f} s",
                      flush=True)
        cluster.check_alive()
    finally:
        cluster.close()
        shutil.rmtree(directory, ignore_errors=True)
    med = {kind: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for kind, rs in results["rounds"].items()}
    results["median"] = med
    ratio = med["fsync"]["mb_s"] / med["none"]["mb_s"]
    results["fsync_over_none"] = ratio
    print(f"median: no forced flush {med['none']['mb_s']:.1f} MB/s (p50 {med['none']['p50_ms']:.1f}, "
          f"p99 {med['none']['p99_ms']:.1f} ms); flush.messages=1 {med['fsync']['mb_s']:.1f} MB/s "
          f"(p50 {med['fsync']['p50_ms']:.1f}, p99 {med['fsync']['p99_ms']:.1f} ms); ratio {ratio:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
