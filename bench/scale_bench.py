#!/usr/bin/env python3
"""Many partitions on a few nodes (issue 10's scale item): a cluster of --nodes nodes
holding --partitions partitions at --rf, in --topics topics. Reports, per step:

- the time to create the topics and to see every partition led with a full ISR;
- idle CPU (% of a core, per node, over --idle-seconds) and RSS, open file descriptors;
- Metadata latency (all topics) from a client, median and worst of --metadata-rounds;
- a produce to every partition and a read back of one record from each;
- SIGKILL of one broker that leads partitions: the time until every partition it led
  has another leader (fail over), then the time from its restart to /ready and to a
  full ISR everywhere again;
- --connections client connections held open (ApiVersions on each), with RSS before
  and after.

Usage: target/pyenv/bin/python bench/scale_bench.py [--binary target/release/strom]
       [--nodes 3] [--partitions 10000] [--rf 3] [--topics 100] [--connections 1000]
       [--perf DIR]   (perf record of node 1 over the idle window)
"""
import argparse
import os
import socket
import statistics
import sys
import tempfile
import time

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "kafka"))
import harness  # noqa: E402
import wire  # noqa: E402

sys.path.insert(0, os.path.join(REPO, "bench"))
from kafka_bench import perf_record  # noqa: E402


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def node_stats(c):
    return {nid: {"rss_mb": round(harness.rss_bytes(c.node(nid).pid) / 1e6, 1), "fds": fds(c.node(nid).pid)}
            for nid in c.running()}


def all_led_full(c, names, per_topic, rf, via):
    """True once every partition of `names` has a leader and rf replicas in sync, as
    node `via` sees it (one admin call per topic)."""
    for name in names:
        t = c.topic(name, via=via)
        if not t or len(t["partitions"]) != per_topic:
            return False
        for p in t["partitions"]:
            if p["leader"] is None or len(p["isr"]) != rf:
                return False
    return True


def led_by(c, names, via):
    out = {}
    for name in names:
        t = c.topic(name, via=via)
        for p in t["partitions"]:
            out[(name, p["partition"])] = p["leader"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(REPO, "target", "release", "strom"))
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=10_000)
    ap.add_argument("--rf", type=int, default=3)
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--idle-seconds", type=float, default=10)
    ap.add_argument("--metadata-rounds", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--rust-log", default="warn,strom::replication=info")
    ap.add_argument("--perf", metavar="DIR", help="`perf record -g` node 1 over the idle window, into DIR")
    args = ap.parse_args()
    per_topic = args.partitions // args.topics
    names = [f"scale-{i:04d}" for i in range(args.topics)]
    directory = tempfile.mkdtemp(prefix="strom-scale-")
    print(f"data and logs in {directory}", flush=True)
    c = harness.start(directory, n=args.nodes, settings=args.set, binary=args.binary, rust_log=args.rust_log,
                      timeout=120)
    results = {}
    socks = []
    try:
        t0 = time.time()
        for name in names:
            c.create_topic(name, partitions=per_topic, rf=args.rf)
        results["create_s"] = round(time.time() - t0, 2)
        harness.wait_for("every partition led with a full ISR", args.timeout,
                         lambda: all(all_led_full(c, names, per_topic, args.rf, nid) for nid in c.running()),
                         interval=1)
        results["led_full_isr_s"] = round(time.time() - t0, 2)
        print(f"created {args.partitions} partitions in {results['create_s']} s, "
              f"all led with full ISR after {results['led_full_isr_s']} s", flush=True)

        before = {nid: cpu_seconds(c.node(nid).pid) for nid in c.running()}
        with perf_record(args.perf, c.node(1).pid, "idle-node1"):
            time.sleep(args.idle_seconds)  # measuring idle CPU over a fixed window
        results["idle_cpu_pct"] = {nid: round(100 * (cpu_seconds(c.node(nid).pid) - before[nid]) / args.idle_seconds, 1)
                                   for nid in c.running()}
        results["idle"] = node_stats(c)
        print(f"idle: CPU % of a core {results['idle_cpu_pct']}, {results['idle']}", flush=True)

        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        lat = []
        for _ in range(args.metadata_rounds):
            s = time.time()
            md = admin.list_topics(timeout=60)
            lat.append(time.time() - s)
        assert sum(len(t.partitions) for n, t in md.topics.items() if n.startswith("scale-")) == args.partitions
        results["metadata_ms"] = {"median": round(1000 * statistics.median(lat), 1), "max": round(1000 * max(lat), 1)}
        print(f"Metadata of every topic: {results['metadata_ms']}", flush=True)

        s = time.time()
        p = ck.Producer({"bootstrap.servers": c.bootstrap, "linger.ms": 50, "acks": "all"})
        for name in names:
            for i in range(per_topic):
                p.produce(name, value=b"v" * 100, partition=i)
        assert p.flush(300) == 0
        results["produce_one_per_partition_s"] = round(time.time() - s, 2)
        print(f"one acks=all record to each partition: {results['produce_one_per_partition_s']} s", flush=True)

        # Fail over: kill the broker leading the most partitions that is not the controller.
        controller = c.wait_active(timeout=60)
        leaders = led_by(c, names, controller)
        counts = {nid: sum(1 for l in leaders.values() if l == nid) for nid in c.running()}
        victim = max((nid for nid in counts if nid != controller), key=lambda n: counts[n])
        print(f"killing node {victim}, leader of {counts[victim]} partitions", flush=True)
        s = time.time()
        c.kill(victim)

        def moved():
            now = led_by(c, names, controller)
            return all(now[k] not in (None, victim) for k, l in leaders.items() if l == victim)

        harness.wait_for("every partition of the dead node led elsewhere", args.timeout, moved, interval=0.2)
        results["failover_s"] = round(time.time() - s, 2)
        print(f"every partition it led has a new leader after {results['failover_s']} s", flush=True)
        s = time.time()
        c.launch(victim)
        harness.wait_for("restarted node ready", args.timeout,
                         lambda: c.get(victim, "/ready", timeout=5)[0] == 200, interval=0.2)
        results["restart_ready_s"] = round(time.time() - s, 2)
        harness.wait_for("full ISR again", args.timeout,
                         lambda: all_led_full(c, names, per_topic, args.rf, controller), interval=1)
        results["restart_full_isr_s"] = round(time.time() - s, 2)
        print(f"restarted: /ready after {results['restart_ready_s']} s, "
              f"full ISR after {results['restart_full_isr_s']} s", flush=True)

        before = node_stats(c)
        addr = c.node(1).kafka_addr
        for _ in range(args.connections):
            sk = socket.create_connection(addr, timeout=10)
            wire.api_versions_on(sk)
            socks.append(sk)
        after = node_stats(c)
        results["connections"] = {"held": len(socks), "node1_before": before[1], "node1_after": after[1]}
        print(f"{len(socks)} connections held on node 1: {before[1]} -> {after[1]}", flush=True)
        print(results)
    finally:
        for sk in socks:
            sk.close()
        c.close()
        if not args.keep:
            import shutil
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
