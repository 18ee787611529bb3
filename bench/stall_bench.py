#!/usr/bin/env python3
"""Does the broker stop answering while it writes? Probes' latency during a produce at
full speed.

One strom node on loopback; one topic (--partitions, `segment.bytes` of --segment-mb, so
that segments roll, and fsync as they roll, during the run). bench/loadgen.rs produces
as fast as the broker answers (--connections connections, one synchronous Produce of
--batch records of --size bytes in flight each) for --seconds. Meanwhile two probes,
each on its own connection, send one request every --probe-ms and time the answer:
  - ApiVersions: touches no partition; it waits only if the broker's async threads are
    busy (a write or fsync made on one of them stalls everything it serves);
  - ListOffsets (latest) of partition 0: takes that partition's lock as well, so it
    waits if an append or a roll holds the lock across a write or an fsync.
Reported per round: each probe's p50/p99/max, the produce MB/s and p99 from loadgen,
the broker's CPU-seconds, and the peak `Dirty` of /proc/meminfo (writeback pressure).

--catch-up instead fills the topic for --seconds, drops the page cache (root only:
`sync` and /proc/sys/vm/drop_caches) and then probes while one confluent-kafka consumer
reads the whole topic from offset 0: a lagging consumer whose reads come from the disk.
--read-mb-s N makes that disk slower for the broker alone: its process goes into a
cgroup (v1 blkio, root) whose reads from the data directory's device are throttled to
N MB/s.

    cargo build --release --bins --example loadgen
    target/pyenv/bin/python bench/stall_bench.py
    target/pyenv/bin/python bench/stall_bench.py --bin OTHER/strom --rounds 3 --seconds 20
"""
import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "kafka"))
sys.path.insert(0, HERE)

import cluster_helpers  # noqa: E402
import wire  # noqa: E402

MB = 1024 * 1024


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def dirty_kb():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Dirty:"):
                return int(line.split()[1])
    return 0


def pct(values, p):
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def list_offsets_body(topic):
    """ListOffsets v1: replica -1, one topic, partition 0, timestamp -1 (latest)."""
    return wire.i32(-1) + wire.i32(1) + wire.string(topic) + wire.i32(1) + wire.i32(0) + wire.i64(-1)


def probe(addr, api_key, version, body, period_s, stop, out):
    """Sends one request every period_s until stop is set; appends each latency (s)."""
    cid = 0
    with wire.socket.create_connection(addr, timeout=30) as s:
        while not stop.is_set():
            cid += 1
            t = time.perf_counter()
            s.sendall(wire.request(api_key, version, cid, body))
            wire.recv_response(s, cid)
            out.append(time.perf_counter() - t)
            left = period_s - (time.perf_counter() - t)
            if left > 0:
                stop.wait(left)


def start_probes(node, topic, args, stop):
    """Starts the ApiVersions and ListOffsets probes on node until stop is set; returns
    the threads and the two lists their latencies go to."""
    host, port = node.kafka.rsplit(":", 1)
    addr = (host, int(port))
    lat_versions, lat_offsets = [], []
    probes = [
        threading.Thread(target=probe, args=(addr, 18, 0, b"", args.probe_ms / 1000, stop, lat_versions)),
        threading.Thread(target=probe, args=(addr, 2, 1, list_offsets_body(topic), args.probe_ms / 1000, stop,
                                             lat_offsets)),
    ]
    for th in probes:
        th.start()
    return probes, lat_versions, lat_offsets


def probe_stats(lat_versions, lat_offsets):
    """Each probe's p50/p99/max in ms, and how many answers each had."""
    def ms(xs):
        return [pct(xs, 50) * 1000, pct(xs, 99) * 1000, max(xs) * 1000]
    return {"api_versions_ms": ms(lat_versions), "list_offsets_ms": ms(lat_offsets),
            "probes": [len(lat_versions), len(lat_offsets)]}


def one_round(cluster, topic, args):
    node = cluster.node(1)
    stop = threading.Event()
    probes, lat_versions, lat_offsets = start_probes(node, topic, args, stop)
    peak_dirty = [0]

    def watch_dirty():
        while not stop.is_set():
            peak_dirty[0] = max(peak_dirty[0], dirty_kb())
            stop.wait(0.1)
    watcher = threading.Thread(target=watch_dirty)
    watcher.start()
    cpu0 = cpu_seconds(node.pid)
    out = subprocess.run([args.loadgen, "--bootstrap", node.kafka, "--topic", topic,
                          "--partitions", str(args.partitions), "--connections", str(args.connections),
                          "--batch", str(args.batch), "--size", str(args.size), "--seconds", str(args.seconds),
                          "--json"], capture_output=True, text=True, timeout=args.seconds + 120)
    cpu = cpu_seconds(node.pid) - cpu0
    stop.set()
    for th in probes + [watcher]:
        th.join()
    if out.returncode != 0:
        raise SystemExit(f"loadgen failed ({out.returncode}): {out.stdout[-2000:]} {out.stderr[-2000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    # Every acknowledged record is in the log: the high watermarks add up.
    held = sum(p["high_watermark"] or 0 for p in cluster.topic(topic)["partitions"])
    if held != r["records"]:
        raise SystemExit(f"{topic}: loadgen had {r['records']} records acknowledged, the partitions hold {held}")
    return {
        "produce_mb_s": r["mb_s"], "produce_p99_ms": r["p99_ms"], "produce_max_ms": r.get("max_ms"),
        "broker_cpu_s": cpu, "peak_dirty_mb": peak_dirty[0] / 1024,
        **probe_stats(lat_versions, lat_offsets),
    }


def drop_page_cache():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1\n")


BLKIO = "/sys/fs/cgroup/blkio"


def throttle_reads(pid, directory, mb_s):
    """Puts pid into a new blkio cgroup whose reads from directory's device are limited
    to mb_s MB/s; returns the cgroup's path (remove it with unthrottle)."""
    group = os.path.join(BLKIO, f"strom-stall-{pid}")
    os.makedirs(group, exist_ok=True)
    st = os.stat(directory)
    with open(os.path.join(group, "blkio.throttle.read_bps_device"), "w") as f:
        f.write(f"{os.major(st.st_dev)}:{os.minor(st.st_dev)} {int(mb_s * MB)}\n")
    with open(os.path.join(group, "cgroup.procs"), "w") as f:
        f.write(f"{pid}\n")
    return group


def unthrottle(group):
    """Moves what is left in the cgroup back to the root one and removes it."""
    try:
        with open(os.path.join(group, "cgroup.procs")) as f:
            pids = f.read().split()
        for pid in pids:
            with open(os.path.join(BLKIO, "cgroup.procs"), "w") as f:
                f.write(f"{pid}\n")
        os.rmdir(group)
    except OSError as e:
        print(f"could not remove {group}: {e}", file=sys.stderr)


def catch_up_round(cluster, topic, args):
    """Fills the topic, drops the page cache, then probes while a consumer reads it all."""
    from confluent_kafka import Consumer, TopicPartition
    node = cluster.node(1)
    out = subprocess.run([args.loadgen, "--bootstrap", node.kafka, "--topic", topic,
                          "--partitions", str(args.partitions), "--connections", str(args.connections),
                          "--batch", str(args.batch), "--size", str(args.size), "--seconds", str(args.seconds),
                          "--json"], capture_output=True, text=True, timeout=args.seconds + 120)
    if out.returncode != 0:
        raise SystemExit(f"loadgen failed ({out.returncode}): {out.stdout[-2000:]} {out.stderr[-2000:]}")
    records = json.loads(out.stdout.strip().splitlines()[-1])["records"]
    drop_page_cache()
    stop = threading.Event()
    probes, lat_versions, lat_offsets = start_probes(node, topic, args, stop)
    c = Consumer({"bootstrap.servers": node.kafka, "group.id": "stall-bench", "enable.auto.commit": False,
                  "fetch.max.bytes": 52428800, "max.partition.fetch.bytes": 1048576})
    c.assign([TopicPartition(topic, p, 0) for p in range(args.partitions)])
    cpu0 = cpu_seconds(node.pid)
    t = time.perf_counter()
    seen = nbytes = 0
    deadline = time.monotonic() + 600
    try:
        while seen < records and time.monotonic() < deadline:
            for m in c.consume(num_messages=10000, timeout=1.0):
                if m.error() is None:
                    seen += 1
                    nbytes += len(m.value())
    finally:
        elapsed = time.perf_counter() - t
        cpu = cpu_seconds(node.pid) - cpu0
        c.close()
        stop.set()
        for th in probes:
            th.join()
    if seen != records:
        raise SystemExit(f"{topic}: read {seen} of {records} records")
    return {
        "consume_mb_s": nbytes / MB / elapsed, "records": records, "broker_cpu_s": cpu,
        **probe_stats(lat_versions, lat_offsets),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(REPO, "target", "release", "strom"))
    ap.add_argument("--loadgen", default=os.path.join(REPO, "target", "release", "examples", "loadgen"))
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1000, help="records per Produce request")
    ap.add_argument("--size", type=int, default=1000, help="record value bytes")
    ap.add_argument("--segment-mb", type=int, default=64, help="the topic's segment.bytes, MiB")
    ap.add_argument("--probe-ms", type=float, default=5)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="broker setting (repeatable)")
    ap.add_argument("--json", help="write the results to this file")
    ap.add_argument("--catch-up", action="store_true",
                    help="fill for --seconds, drop the page cache, probe while a consumer reads it all")
    ap.add_argument("--read-mb-s", type=float,
                    help="throttle the broker's disk reads to this many MB/s (cgroup v1 blkio, root)")
    args = ap.parse_args()
    for path in (args.bin, args.loadgen):
        if not os.access(path, os.X_OK):
            sys.exit(f"{path} is missing: cargo build --release --bins --example loadgen")
    directory = tempfile.mkdtemp(prefix="strom-stall-")
    cluster = cluster_helpers.start(directory, 1, args.set, os.path.abspath(args.bin), "warn")
    results = []
    group = None
    try:
        if args.read_mb_s:
            group = throttle_reads(cluster.node(1).pid, directory, args.read_mb_s)
        for i in range(args.rounds):
            topic = f"stall-{i}"
            cluster.create_topic(topic, partitions=args.partitions, rf=1,
                                 configs={"segment.bytes": str(args.segment_mb * MB)})
            cluster.wait_topic(topic, args.partitions)
            if args.catch_up:
                r = catch_up_round(cluster, topic, args)
                results.append(r)
                print(f"round {i + 1}: consume {r['consume_mb_s']:.0f} MB/s from a cold page cache "
                      f"({r['records']} records), broker CPU {r['broker_cpu_s']:.1f} s; "
                      "ApiVersions p50/p99/max {:.2f}/{:.2f}/{:.1f} ms; ListOffsets {:.2f}/{:.2f}/{:.1f} ms".format(
                          *r["api_versions_ms"], *r["list_offsets_ms"]), flush=True)
            else:
                r = one_round(cluster, topic, args)
                results.append(r)
                print(f"round {i + 1}: produce {r['produce_mb_s']:.0f} MB/s (p99 {r['produce_p99_ms']:.1f} ms), "
                      f"broker CPU {r['broker_cpu_s']:.1f} s, peak Dirty {r['peak_dirty_mb']:.0f} MB; "
                      "ApiVersions p50/p99/max {:.2f}/{:.2f}/{:.1f} ms; ListOffsets {:.2f}/{:.2f}/{:.1f} ms".format(
                          *r["api_versions_ms"], *r["list_offsets_ms"]), flush=True)
            # Deleted after its round: the next round starts with the page cache it freed.
            status, body = cluster.send(1, "DELETE", f"/v1/topics/{topic}")
            if status not in (200, 202, 204):
                raise SystemExit(f"delete {topic}: {status} {body}")
    finally:
        cluster.close()
        if group:
            unthrottle(group)
        shutil.rmtree(directory, ignore_errors=True)
    if len(results) > 1:
        med = lambda key, i: statistics.median(r[key][i] for r in results)  # noqa: E731
        print("median: ApiVersions max {:.1f} ms, ListOffsets max {:.1f} ms".format(
            med("api_versions_ms", 2), med("list_offsets_ms", 2)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
