#!/usr/bin/env python3
"""Consumer-group benchmark on a 3-node loopback cluster (__consumer_offsets with
replication factor 3), confluent-kafka clients with the range assignor:

- rebalance time of a new group of 3 members: from the first member's subscribe() (its
  first FindCoordinator/JoinGroup) until all three hold their final, non-empty
  assignment (6 partitions, 2 each); median of --runs fresh groups (after one uncounted
  warm-up run);
- offset commit latency: --commits synchronous commits (commit(asynchronous=False)) of one
  member of a stable group, each call timed, p50/p99;
- recovery of a group after its coordinator's broker is SIGKILLed: a member commits
  synchronously in a loop; from the kill to the completion of the first successful commit
  that was issued after the kill (so it went to the new coordinator); median of --runs,
  the killed node restarted and back in every __consumer_offsets ISR between runs.

    cargo build --release && tests/setup_python.sh
    target/pyenv/bin/python bench/group_bench.py [--bin target/release/strom]

The cluster runs with group.initial.rebalance.delay.ms=0 (Kafka's default 3000 ms would
be most of the rebalance time of a new group); --set changes any broker setting.
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
import wire  # noqa: E402


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def consumer(bootstrap, group, client_id, heartbeat_ms, **extra):
    conf = {"bootstrap.servers": bootstrap, "group.id": group, "client.id": client_id, "log_level": 0,
            "partition.assignment.strategy": "range", "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "heartbeat.interval.ms": heartbeat_ms, "session.timeout.ms": 10000, "max.poll.interval.ms": 30000,
            "fetch.wait.max.ms": 100}
    conf.update(extra)
    return ck.Consumer(conf)


def coordinator(cluster, group, exclude=(), timeout=60):
    """The node id of the group's coordinator once a running node names one that has loaded it."""
    def ask():
        for nid in cluster.running():
            try:
                err, node, host, port = wire.find_coordinator(cluster.node(nid).kafka_addr, group, timeout=5)
                if err == 0 and node not in exclude and node in cluster.running():
                    if wire.offset_fetch((host, port), group, None, timeout=5)[0] == 0:
                        return node
            except (OSError, ValueError):
                pass
        return None

    return harness.wait_for(f"a coordinator for {group}", timeout, ask, interval=0.05)


def rebalance_once(cluster, topic, partitions, group, heartbeat_ms, timeout=60):
    """Seconds from the first subscribe() of 3 new members until all hold their final assignment."""
    members = [consumer(cluster.bootstrap, group, f"{group}-{i}", heartbeat_ms) for i in range(3)]
    assignment = [[] for _ in members]
    stop = threading.Event()
    errors = []

    def run(i, c):
        def on_assign(_, parts):
            assignment[i] = sorted(p.partition for p in parts)

        def on_revoke(_, parts):
            assignment[i] = []

        try:
            c.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
            while not stop.is_set():
                c.poll(0.02)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(members)]
    start = time.monotonic()
    for t in threads:
        t.start()
    try:
        def settled():
            assert not errors, errors
            held = sorted(p for a in assignment for p in a)
            return all(assignment) and held == list(range(partitions))

        harness.wait_for(f"3 members of {group} holding {partitions} partitions", timeout, settled, interval=0.005)
        took = time.monotonic() - start
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        for c in members:
            c.close()
    return took


def subscribe_and_wait(c, topic, timeout=60):
    """Subscribes and polls until the group has given this consumer its partitions."""
    assigned = []
    c.subscribe([topic], on_assign=lambda _, parts: assigned.extend(parts))
    deadline = time.monotonic() + timeout
    while not assigned:
        assert time.monotonic() < deadline, f"no assignment in {timeout} s"
        c.poll(0.05)


def commit_latencies(cluster, topic, group, n, heartbeat_ms):
    c = consumer(cluster.bootstrap, group, f"{group}-committer", heartbeat_ms)
    try:
        subscribe_and_wait(c, topic)
        lat = []
        for i in range(n):
            t0 = time.perf_counter()
            res = c.commit(offsets=[ck.TopicPartition(topic, 0, i + 1)], asynchronous=False)
            lat.append(time.perf_counter() - t0)
            assert not any(tp.error for tp in res), res
            if i % 50 == 0:
                c.poll(0)
        return lat
    finally:
        c.close()


def recovery_once(cluster, topic, group, heartbeat_ms, timeout=90):
    """Kills the group's coordinator while a member commits in a loop; seconds from the kill to
    the completion of the first successful commit issued after it, and the killed node."""
    c = consumer(cluster.bootstrap, group, f"{group}-member", heartbeat_ms)
    kill_at = [None]
    recovered = []
    succeeded = [0]
    stop = threading.Event()
    errors = []

    def run():
        i = 0
        try:
            while not stop.is_set():
                i += 1
                started = time.monotonic()
                try:
                    res = c.commit(offsets=[ck.TopicPartition(topic, 0, i)], asynchronous=False)
                    ok = not any(tp.error for tp in res)
                except ck.KafkaException:
                    ok = False  # the coordinator is gone or moving: the loop goes on
                if ok:
                    succeeded[0] += 1
                    if kill_at[0] is not None and started > kill_at[0] and not recovered:
                        recovered.append(time.monotonic())
                c.poll(0.005)
        except Exception as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)

    try:
        subscribe_and_wait(c, topic)
        victim = coordinator(cluster, group)
        t = threading.Thread(target=run)
        t.start()
        try:
            harness.wait_for("a steady stream of commits before the kill", 30,
                             lambda: errors or succeeded[0] >= 50, interval=0.01)
            kill_at[0] = time.monotonic()
            cluster.kill(victim)
            harness.wait_for("a successful commit after the kill", timeout, lambda: recovered, interval=0.01)
        finally:
            stop.set()
            t.join(timeout)
        assert not errors, errors
        return recovered[0] - kill_at[0], victim
    finally:
        c.close()


def restore(cluster, victim):
    cluster.launch(victim)
    cluster.wait_active(timeout=60)
    survivor = next(n for n in cluster.running() if n != victim)

    def all_isr():
        t = cluster.topic("__consumer_offsets", via=survivor)
        return t and all(len(p["isr"]) == len(p["replicas"]) and p["leader"] is not None for p in t["partitions"])

    harness.wait_for("every __consumer_offsets ISR complete", 60, all_isr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(harness.REPO, "target", "release", "strom"))
    ap.add_argument("--runs", type=int, default=5, help="runs of the rebalance and of the recovery measurement")
    ap.add_argument("--commits", type=int, default=2000)
    ap.add_argument("--heartbeat-ms", type=int, default=500, help="the consumers' heartbeat.interval.ms")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="broker setting (repeatable)")
    ap.add_argument("--rust-log", default="warn")
    args = ap.parse_args()
    settings = {"group.initial.rebalance.delay.ms": "0"}
    for kv in args.set:
        key, sep, value = kv.partition("=")
        if not sep:
            ap.error(f"--set {kv}: expected KEY=VALUE")
        settings[key] = value
    settings = [f"{k}={v}" for k, v in settings.items()]
    with tempfile.TemporaryDirectory(prefix="strom-group-bench-") as d:
        cluster = harness.start(d, 3, settings=settings, binary=os.path.abspath(args.bin), rust_log=args.rust_log)
        rows = []
        try:
            cluster.create_topic("groups", partitions=6, rf=3, configs={"min.insync.replicas": "2"})
            cluster.wait_topic("groups", 6)
            coordinator(cluster, "bench-warmup")  # creates __consumer_offsets (RF 3)
            cluster.wait_topic("__consumer_offsets", len(cluster.topic("__consumer_offsets")["partitions"]), timeout=60)

            # One run first, not counted: the clients' first connections to every broker.
            rebalance_once(cluster, "groups", 6, "bench-rebalance-warmup", args.heartbeat_ms)
            reb = [rebalance_once(cluster, "groups", 6, f"bench-rebalance-{i}", args.heartbeat_ms)
                   for i in range(args.runs)]
            rows.append(("rebalance, 3 new members (s)", len(reb), statistics.median(reb), min(reb), max(reb)))
            print(f"rebalance of 3 new members: median {statistics.median(reb):.3f} s "
                  f"(runs {', '.join(f'{r:.3f}' for r in reb)})", flush=True)

            lat = commit_latencies(cluster, "groups", "bench-commits", args.commits, args.heartbeat_ms)
            ms = [x * 1000 for x in lat]
            rows.append(("offset commit, synchronous (ms)", len(ms), pct(ms, 50), pct(ms, 99), max(ms)))
            print(f"offset commit latency ({len(ms)} synchronous commits): p50 {pct(ms, 50):.2f} ms, "
                  f"p99 {pct(ms, 99):.2f} ms, max {max(ms):.2f} ms", flush=True)

            rec = []
            for i in range(args.runs):
                took, victim = recovery_once(cluster, "groups", f"bench-recovery-{i}", args.heartbeat_ms)
                rec.append(took)
                print(f"  recovery run {i + 1}: coordinator {victim} killed, first commit after {took:.3f} s",
                      flush=True)
                restore(cluster, victim)
            rows.append(("coordinator SIGKILL -> commit (s)", len(rec), statistics.median(rec), min(rec), max(rec)))
            print(f"recovery after the coordinator's SIGKILL: median {statistics.median(rec):.3f} s "
                  f"(runs {', '.join(f'{r:.3f}' for r in rec)})", flush=True)
        finally:
            cluster.close()

    print()
    print(f"binary {args.bin}; settings {' '.join(settings)}; consumers heartbeat.interval.ms={args.heartbeat_ms}")
    print(f"{'measure':<36} {'n':>5} {'median/p50':>11} {'min/p99':>9} {'max':>9}")
    for name, n, a, b, c in rows:
        print(f"{name:<36} {n:>5} {a:>11.3f} {b:>9.3f} {c:>9.3f}")


if __name__ == "__main__":
    main()
