#!/usr/bin/env python3
"""Kafka data-plane benchmark: one strom node on loopback, one confluent-kafka producer
(acks=1 and acks=all runs) and one consumer; records/s, MB/s, produce latency p50/p99,
the broker's CPU-seconds per GB moved and its RSS, each throughput also as a ratio to
this machine's limits measured in the same run (sequential write + fsync to the data
directory's disk, Python TCP over loopback). A second mode reports the idle RSS of a
node holding 1,000 partitions.

    tests/setup_python.sh                       # the virtualenv with confluent-kafka
    cargo build --release
    target/pyenv/bin/python bench/kafka_bench.py                 # 100 B and 1 KiB runs
    target/pyenv/bin/python bench/kafka_bench.py --sizes 1024 --records 100000
    target/pyenv/bin/python bench/kafka_bench.py --idle-partitions 1000

See bench/README.md for what each number means.
"""
import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import socket
import sys
import tempfile
import threading
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "kafka"))

import harness  # noqa: E402  (tests/kafka/harness.py: starts and kills strom processes)

try:
    import confluent_kafka as ck
except ImportError:
    sys.exit("confluent-kafka is missing: run tests/setup_python.sh and use target/pyenv/bin/python")

CLK_TCK = os.sysconf("SC_CLK_TCK")
MB = 1_000_000
GB = 1_000_000_000


# ---- /proc --------------------------------------------------------------------------------

def cpu_seconds(pid):
    """utime + stime of pid (all its threads), in seconds."""
    user, system = cpu_user_system(pid)
    return user + system


def cpu_user_system(pid):
    """(utime, stime) of pid (all its threads), in seconds."""
    return stat_times(f"/proc/{pid}/stat")[1:]


def stat_times(path):
    """(comm, utime s, stime s) from a /proc stat file."""
    with open(path) as f:
        head, tail = f.read().rsplit(")", 1)
    fields = tail.split()
    # After "pid (comm)", field 3 is state; utime and stime are fields 14 and 15.
    return head.split("(", 1)[1], int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def cpu_by_thread_name(pid):
    """{thread name with trailing digits and dashes dropped: [utime, stime]} over pid's live threads."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name, user, system = stat_times(f"/proc/{pid}/task/{tid}/stat")
        except OSError:
            continue  # the thread ended meanwhile
        acc = out.setdefault(name.rstrip("0123456789-_ "), [0.0, 0.0])
        acc[0] += user
        acc[1] += system
    return out


def proc_status(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def pct(values, p):
    values = sorted(values)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


# ---- machine limits ------------------------------------------------------------------------

def disk_write_mb_s(directory, total_mb=256):
    """Sequential 1 MiB writes to a file in directory, then fsync: MB/s including the fsync."""
    path = os.path.join(directory, "disk-probe.bin")
    block = os.urandom(1 << 20)
    n = max(1, total_mb * MB // len(block))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        t = time.perf_counter()
        for _ in range(n):
            os.write(fd, block)
        os.fsync(fd)
        elapsed = time.perf_counter() - t
    finally:
        os.close(fd)
        os.unlink(path)
    return n * len(block) / MB / elapsed


def loopback_mb_s(total_mb=2048):
    """One TCP connection over 127.0.0.1, one thread sending 1 MiB buffers, one receiving."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    total = total_mb * MB
    received = [0]

    def receive():
        conn, _ = srv.accept()
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        with conn:
            while True:
                n = conn.recv_into(view)
                if not n:
                    break
                received[0] += n

    th = threading.Thread(target=receive)
    th.start()
    block = os.urandom(1 << 20)
    with socket.create_connection(srv.getsockname()) as c:
        t = time.perf_counter()
        sent = 0
        while sent < total:
            c.sendall(block)
            sent += len(block)
        c.shutdown(socket.SHUT_WR)
        th.join(timeout=120)
        elapsed = time.perf_counter() - t
    srv.close()
    assert received[0] == sent, f"loopback probe: sent {sent}, received {received[0]}"
    return sent / MB / elapsed


# ---- produce / consume ------------------------------------------------------------------------

def produce(bootstrap, topic, partitions, n, size, acks, timeout, conf=None):
    """conf: more librdkafka settings (security, for bench/security_bench.py)."""
    p = ck.Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 5, "enable.idempotence": False,
                     "compression.type": "none", "queue.buffering.max.messages": 1_000_000,
                     "queue.buffering.max.kbytes": 1_048_576, "message.timeout.ms": int(timeout * 1000),
                     **(conf or {})})
    # Incompressible values (compression is off anyway); a few distinct ones so that
    # building them costs nothing per record.
    values = [os.urandom(size) for _ in range(16)]
    latencies = []
    errors = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(err)
        else:
            latencies.append(msg.latency())

    deadline = time.monotonic() + timeout
    t = time.perf_counter()
    for i in range(n):
        while True:
            try:
                p.produce(topic, values[i & 15], partition=i % partitions, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.001)
                if time.monotonic() > deadline:
                    raise SystemExit("producer queue stayed full past the deadline")
        if i & 1023 == 0:
            p.poll(0)
    left = p.flush(max(1.0, deadline - time.monotonic()))
    elapsed = time.perf_counter() - t
    if left or errors:
        raise SystemExit(f"produce failed: {left} undelivered, {len(errors)} errors, first {errors[:3]}")
    return elapsed, latencies


def consume(bootstrap, topic, partitions, n, timeout, conf=None):
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{time.time_ns()}",
                     "enable.auto.commit": False, "enable.partition.eof": False,
                     "fetch.max.bytes": 52_428_800, "max.partition.fetch.bytes": 10_485_760,
                     "queued.max.messages.kbytes": 262_144, **(conf or {})})
    try:
        c.assign([ck.TopicPartition(topic, p, 0) for p in range(partitions)])
        got = 0
        nbytes = 0
        deadline = time.monotonic() + timeout
        t = time.perf_counter()
        while got < n:
            if time.monotonic() > deadline:
                raise SystemExit(f"consume: {got} of {n} records read before the deadline")
            for m in c.consume(num_messages=10_000, timeout=0.5):
                if m.error():
                    raise SystemExit(f"consumer error: {m.error()}")
                got += 1
                nbytes += len(m.value())
        return time.perf_counter() - t, nbytes
    finally:
        c.close()


# ---- runs ----------------------------------------------------------------------------------------

def throughput_runs(args, limits):
    directory = tempfile.mkdtemp(prefix="strom-kbench-")
    results = []
    cluster = harness.start(directory, 1, settings=args.set, binary=args.bin, rust_log=args.rust_log)
    try:
        node = cluster.node(1)
        pid = node.pid
        if not args.skip_limits:
            limits["disk_write_mb_s"] = disk_write_mb_s(node.data_dir, args.disk_mb)
            limits["loopback_tcp_mb_s"] = loopback_mb_s(args.loopback_mb)
            print(f"machine limits: sequential write+fsync to {node.data_dir}: {limits['disk_write_mb_s']:.0f} MB/s; "
                  f"loopback TCP (Python, one connection): {limits['loopback_tcp_mb_s']:.0f} MB/s", flush=True)
        for rnd, size, acks in [(k, s, a) for k in range(args.rounds) for s in args.sizes for a in args.acks]:
            n = args.records or max(1000, args.bytes_per_run // size)
            topic = f"bench-{size}-acks{acks}" + (f"-round{rnd + 1}" if args.rounds > 1 else "")
            held = dir_bytes(node.data_dir)
            cluster.create_topic(topic, partitions=args.partitions)
            cluster.wait_topic(topic, args.partitions)
            payload = n * size

            us0, th0 = cpu_user_system(pid), cpu_by_thread_name(pid)
            with perf_record(args.perf, pid, f"round{rnd + 1}-{size}-acks{acks}-produce"):
                elapsed, lat = produce(node.kafka, topic, args.partitions, n, size, acks, args.timeout)
            us1, th1 = cpu_user_system(pid), cpu_by_thread_name(pid)
            rss_produce = proc_status(pid, "VmRSS")
            with perf_record(args.perf, pid, f"round{rnd + 1}-{size}-acks{acks}-consume"):
                c_elapsed, c_bytes = consume(node.kafka, topic, args.partitions, n, args.timeout)
            us2, th2 = cpu_user_system(pid), cpu_by_thread_name(pid)
            cpu0, cpu1, cpu2 = sum(us0), sum(us1), sum(us2)
            rss_consume = proc_status(pid, "VmRSS")
            assert c_bytes == payload, f"consumed {c_bytes} bytes, produced {payload}"

            r = {
                "round": rnd + 1, "data_held_mb_before": held / MB,
                "broker_user_s_produce": us1[0] - us0[0], "broker_system_s_produce": us1[1] - us0[1],
                "broker_user_s_consume": us2[0] - us1[0], "broker_system_s_consume": us2[1] - us1[1],
                "broker_threads_produce": thread_delta(th0, th1),
                "broker_threads_consume": thread_delta(th1, th2),
                "size": size, "acks": acks, "records": n, "partitions": args.partitions,
                "produce_records_s": n / elapsed, "produce_mb_s": payload / MB / elapsed,
                "produce_latency_p50_ms": pct(lat, 50) * 1000, "produce_latency_p99_ms": pct(lat, 99) * 1000,
                "consume_records_s": n / c_elapsed, "consume_mb_s": payload / MB / c_elapsed,
                "broker_cpu_s_per_gb_produce": (cpu1 - cpu0) / (payload / GB),
                "broker_cpu_s_per_gb_consume": (cpu2 - cpu1) / (payload / GB),
                "broker_cpu_s_per_gb_in_out": (cpu2 - cpu0) / (2 * payload / GB),
                "broker_rss_mb_after_produce": rss_produce / MB, "broker_rss_mb_after_consume": rss_consume / MB,
                "broker_peak_rss_mb": proc_status(pid, "VmHWM") / MB,
            }
            results.append(r)
            report(r, limits)
            if args.delete_between_rounds:
                delete_and_wait(cluster, node, topic, held)
        cluster.check_alive()
        if args.rounds > 1:
            report_rounds(results)
    finally:
        cluster.close()
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
        else:
            print(f"data and logs kept in {directory}")
    return results


@contextlib.contextmanager
def perf_record(directory, pid, name):
    """`perf record -g` of pid while the block runs, into directory/name.data (nothing without a directory)."""
    if not directory:
        yield
        return
    os.makedirs(directory, exist_ok=True)
    out = os.path.join(directory, name + ".data")
    rec = subprocess.Popen(["perf", "record", "-q", "-g", "-F", "999", "-p", str(pid), "-o", out],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        rec.send_signal(signal.SIGINT)
        rec.wait(timeout=60)
        print(f"  perf: {out} (perf report -i {out} --no-children --sort sym)", flush=True)


def delete_and_wait(cluster, node, topic, held_before):
    """Delete a round's topic and wait (60 s at most) until the data directory is back to its size before."""
    status, body = cluster.send(1, "DELETE", f"/v1/topics/{topic}")
    assert status in (200, 202, 204), f"delete {topic}: {status} {body}"
    harness.wait_for(f"{topic}'s files removed", 60, lambda: dir_bytes(node.data_dir) <= held_before + 50 * MB,
                     interval=0.2)


def dir_bytes(directory):
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def thread_delta(before, after):
    """{thread name: [user s, system s]} spent between two cpu_by_thread_name samples."""
    out = {}
    for name, (u, s) in after.items():
        u0, s0 = before.get(name, (0.0, 0.0))
        if u - u0 > 0 or s - s0 > 0:
            out[name] = [round(u - u0, 3), round(s - s0, 3)]
    return out


def report_rounds(results):
    """Round after round on one node, each on a new topic: is the broker's CPU per GB flat in the data held?"""
    print("\nround  held before   produce s/GB (user+sys)   consume s/GB (user+sys)   produce MB/s  consume MB/s")
    for r in results:
        gb = r["records"] * r["size"] / GB
        print(f"{r['round']:>5}  {r['data_held_mb_before']:8.0f} MB   "
              f"{r['broker_cpu_s_per_gb_produce']:5.2f} ({r['broker_user_s_produce'] / gb:4.2f}+"
              f"{r['broker_system_s_produce'] / gb:4.2f})        "
              f"{r['broker_cpu_s_per_gb_consume']:5.2f} ({r['broker_user_s_consume'] / gb:4.2f}+"
              f"{r['broker_system_s_consume'] / gb:4.2f})        "
              f"{r['produce_mb_s']:8.0f}      {r['consume_mb_s']:8.0f}")
    for phase in ("produce", "consume"):
        names = sorted({n for r in results for n in r[f"broker_threads_{phase}"]})
        print(f"  {phase} CPU by thread (user+system s per GB), round by round:")
        for name in names:
            cells = []
            for r in results:
                u, s = r[f"broker_threads_{phase}"].get(name, (0.0, 0.0))
                cells.append(f"{(u + s) / (r['records'] * r['size'] / GB):5.2f}")
            print(f"    {name:<24} " + " ".join(cells))


def ratio(value, limit):
    return f"{value / limit:.2f}x" if limit else "n/a"


def report(r, limits):
    disk, lo = limits.get("disk_write_mb_s"), limits.get("loopback_tcp_mb_s")
    print(f"\n{r['size']} B records, acks={r['acks']}, {r['records']:,} records, {r['partitions']} partition(s)")
    print(f"  produce: {r['produce_records_s']:>12,.0f} records/s  {r['produce_mb_s']:8.1f} MB/s  "
          f"(of disk write {ratio(r['produce_mb_s'], disk)}, of loopback {ratio(r['produce_mb_s'], lo)})  "
          f"latency p50 {r['produce_latency_p50_ms']:.1f} ms, p99 {r['produce_latency_p99_ms']:.1f} ms")
    print(f"  consume: {r['consume_records_s']:>12,.0f} records/s  {r['consume_mb_s']:8.1f} MB/s  "
          f"(of loopback {ratio(r['consume_mb_s'], lo)})")
    print(f"  broker CPU: {r['broker_cpu_s_per_gb_produce']:.1f} s/GB produced, "
          f"{r['broker_cpu_s_per_gb_consume']:.1f} s/GB consumed, {r['broker_cpu_s_per_gb_in_out']:.1f} s/GB in+out; "
          f"RSS {r['broker_rss_mb_after_produce']:.1f} MB after produce, {r['broker_rss_mb_after_consume']:.1f} MB "
          f"after consume, peak {r['broker_peak_rss_mb']:.1f} MB", flush=True)


def idle_partitions(args):
    directory = tempfile.mkdtemp(prefix="strom-kbench-idle-")
    cluster = harness.start(directory, 1, settings=args.set, binary=args.bin, rust_log=args.rust_log)
    out = {}
    try:
        pid = cluster.node(1).pid
        out["rss_mb_empty"] = proc_status(pid, "VmRSS") / MB
        total = args.idle_partitions
        per_topic = min(total, args.partitions_per_topic)
        t = time.perf_counter()
        created = 0
        i = 0
        while created < total:
            count = min(per_topic, total - created)
            cluster.create_topic(f"idle-{i}", partitions=count)
            cluster.wait_topic(f"idle-{i}", count, timeout=300)
            created += count
            i += 1
        out["create_s"] = time.perf_counter() - t
        out["partitions"] = created
        out["topics"] = i
        out["rss_mb_created"] = settle_rss(pid, args.settle_s)
        # One record in every partition, so that each has an open segment and indexes.
        one_record_each(cluster.node(1).kafka, [(f"idle-{j}", min(per_topic, total - j * per_topic)) for j in range(i)])
        out["rss_mb_one_record_each"] = settle_rss(pid, args.settle_s)
        cluster.check_alive()
    finally:
        cluster.close()
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
    print(f"idle node: RSS {out['rss_mb_empty']:.1f} MB empty; {out['partitions']} partitions in {out['topics']} "
          f"topic(s) created in {out['create_s']:.1f} s: RSS {out['rss_mb_created']:.1f} MB; after one record in each "
          f"partition: RSS {out['rss_mb_one_record_each']:.1f} MB")
    return out


def one_record_each(bootstrap, topics):
    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    errors = []
    for topic, count in topics:
        for part in range(count):
            p.produce(topic, b"x", partition=part, on_delivery=lambda e, m: e and errors.append(e))
        p.poll(0)
    left = p.flush(120)
    if left or errors:
        raise SystemExit(f"records to the idle partitions: {left} undelivered, errors {errors[:3]}")


def settle_rss(pid, seconds):
    """RSS after `seconds` of idling (the node is measured idle, so this wait is the point)."""
    end = time.monotonic() + seconds
    rss = proc_status(pid, "VmRSS")
    while time.monotonic() < end:
        time.sleep(0.5)
        rss = proc_status(pid, "VmRSS")
    return rss / MB


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(REPO, "target", "release", "strom"))
    ap.add_argument("--sizes", default="100,1024", help="record value sizes in bytes, comma-separated")
    ap.add_argument("--acks", default="1,all", help="producer acks settings to run, comma-separated")
    ap.add_argument("--records", type=int, default=0, help="records per run (default: --bytes-per-run / size)")
    ap.add_argument("--bytes-per-run", type=int, default=200 * MB, help="payload per run when --records is not given")
    ap.add_argument("--partitions", type=int, default=1, help="partitions of each benchmark topic")
    ap.add_argument("--timeout", type=float, default=600, help="deadline of each produce or consume phase, s")
    ap.add_argument("--disk-mb", type=int, default=512, help="size of the disk write probe")
    ap.add_argument("--loopback-mb", type=int, default=2048, help="bytes pushed by the loopback probe")
    ap.add_argument("--skip-limits", action="store_true", help="do not measure the machine's limits")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="broker setting (repeatable)")
    ap.add_argument("--rust-log", default="warn")
    ap.add_argument("--idle-partitions", type=int, default=0,
                    help="instead: report the idle RSS of a node holding this many partitions")
    ap.add_argument("--partitions-per-topic", type=int, default=100)
    ap.add_argument("--settle-s", type=float, default=5, help="idle time before reading RSS in --idle-partitions")
    ap.add_argument("--keep", action="store_true", help="keep the data directory and logs")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--perf", metavar="DIR",
                    help="record the broker with `perf record -g` during each produce and consume phase, into DIR")
    ap.add_argument("--delete-between-rounds", action="store_true",
                    help="delete each run's topic after it (and wait for its files to go), so the data held stays flat")
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat every run this many times back to back on the same node, each on a new topic, "
                         "and print the broker's CPU per GB round by round (is it flat in the data held?)")
    args = ap.parse_args()
    args.bin = os.path.abspath(args.bin)
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.acks = [a.strip() for a in args.acks.split(",")]
    if not os.access(args.bin, os.X_OK):
        sys.exit(f"{args.bin} is missing: cargo build --release (or --bin PATH)")
    print(f"strom: {args.bin}; confluent-kafka {ck.__version__} (librdkafka {ck.libversion()[0]}); "
          f"{os.cpu_count()} CPUs", flush=True)

    if args.idle_partitions:
        result = {"idle": idle_partitions(args)}
    else:
        limits = {}
        runs = throughput_runs(args, limits)
        result = {"limits": limits, "runs": runs}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
