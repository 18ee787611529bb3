#!/usr/bin/env python3
"""The consumer group protocol of KIP-848 against the classic one, in the same run, on a
3-node loopback cluster with default broker settings: the time for a new group of 3
confluent-kafka members (8 partitions) from their subscribe() calls until all three hold
their final, non-empty assignment. The consumer protocol's members use
group.protocol=consumer and the broker's range assignor; the classic members
librdkafka's defaults (range,roundrobin). Median of --runs fresh groups of each, after one
uncounted warm-up group of each.

    cargo build --release && tests/setup_python.sh
    target/pyenv/bin/python bench/kip848_bench.py [--runs 5] [--set KEY=VALUE ...]
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

PARTITIONS = 8


def member(bootstrap, group, i, protocol):
    conf = {"bootstrap.servers": bootstrap, "group.id": group, "client.id": f"{group}-{i}", "log_level": 0,
            "enable.auto.commit": False, "auto.offset.reset": "earliest"}
    if protocol == "consumer":
        conf.update({"group.protocol": "consumer", "group.remote.assignor": "range"})
    return ck.Consumer(conf)


def settle_once(bootstrap, topic, group, protocol, timeout=60):
    """Seconds from the first subscribe() of 3 new members until they hold every partition,
    each a non-empty share."""
    members = [member(bootstrap, group, i, protocol) for i in range(3)]
    owned = [set() for _ in members]
    stop = threading.Event()
    errors = []

    def run(i, c):
        def on_assign(_, parts):
            owned[i] |= {p.partition for p in parts}

        def on_revoke(_, parts):
            owned[i] -= {p.partition for p in parts}

        try:
            c.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
            while not stop.is_set():
                c.poll(0.01)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(members)]
    start = time.monotonic()
    for t in threads:
        t.start()
    try:
        def settled():
            assert not errors, errors
            held = sorted(p for o in owned for p in o)
            return all(owned) and held == list(range(PARTITIONS))

        harness.wait_for(f"3 members of {group} holding {PARTITIONS} partitions", timeout, settled, interval=0.005)
        return time.monotonic() - start
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        for c in members:
            c.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(harness.REPO, "target", "release", "strom"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="broker setting (repeatable)")
    ap.add_argument("--rust-log", default="warn")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="strom-kip848-bench-") as d:
        cluster = harness.start(d, 3, settings=args.set, binary=os.path.abspath(args.bin), rust_log=args.rust_log)
        results = {}
        try:
            cluster.create_topic("kip848", partitions=PARTITIONS, rf=3)
            cluster.wait_topic("kip848", PARTITIONS)
            for protocol in ("consumer", "classic"):
                settle_once(cluster.bootstrap, "kip848", f"warmup-{protocol}", protocol)
            for i in range(args.runs):
                for protocol in ("consumer", "classic"):
                    took = settle_once(cluster.bootstrap, "kip848", f"bench-{protocol}-{i}", protocol)
                    results.setdefault(protocol, []).append(took)
                    print(f"  run {i + 1} {protocol:<8} {took:.3f} s", flush=True)
        finally:
            cluster.close()
    print()
    print(f"binary {args.bin}; broker settings {' '.join(args.set) or 'default'}; 3 members, {PARTITIONS} partitions")
    print(f"{'protocol':<10} {'runs':>5} {'median s':>9} {'min s':>7} {'max s':>7}")
    for protocol, runs in results.items():
        print(f"{protocol:<10} {len(runs):>5} {statistics.median(runs):>9.3f} {min(runs):>7.3f} {max(runs):>7.3f}")


if __name__ == "__main__":
    main()
