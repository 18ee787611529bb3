#!/usr/bin/env python3
"""Self-healing benchmark: how long a 4-node loopback cluster takes to restore the full
replication factor after one broker is SIGKILLed for good, and at what rate it copies,
against the machine's disk-write and loopback limits measured in the same run.

1. Measures the limits (sequential 1 MiB writes + fsync in the run's directory; one
   Python TCP connection over loopback), as bench/kafka_bench.py does.
2. Starts 4 nodes (voters 1-3) with broker.heartbeat.interval.ms=200,
   broker.session.timeout.ms=1500, balancer.node.unavailable.timeout.ms=--unavailable-ms,
   balancer.max.concurrent.moves=--max-moves; creates a topic of --partitions partitions,
   RF 3; fills it with --mb MB of --record-size records, the same count in every
   partition (acks=all, one confluent-kafka producer with 1 MB batches); waits until
   every ISR is full.
3. SIGKILLs one broker (--victim, default the highest of 2-4 that is not the
   controller; with round-robin placement it holds 3/4 of the partitions) and polls the
   controller until every partition has 3 replicas again, none on the dead broker,
   ISR == replicas and no reassignment running (in the topic and GET /v1/reassignments).
4. Reads every partition (or --verify-partitions N of them) back with a consumer: the
   count of each must equal its high watermark and the number written; compares the
   size of the segment files of the three replicas of every partition on disk.

    cargo build --release && tests/setup_python.sh
    target/pyenv/bin/python bench/heal_bench.py [--partitions 100] [--mb 2048] [--unavailable-ms 5000]
    target/pyenv/bin/python bench/heal_bench.py --partitions 20 --mb 100    # a quick check

Bytes re-replicated are the sizes of the segment files (*.log, record batches with their
headers) of the dead broker's replicas in its data directory, read after the kill; the
payload (high watermark x record size) is printed beside them.
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
import cluster_helpers as ch  # noqa: E402
from cluster_helpers import MB, harness  # noqa: E402
from kafka_bench import disk_write_mb_s, loopback_mb_s  # noqa: E402

NODES = 4
RF = 3


def pick_victim(requested, controller):
    if requested:
        if requested == controller:
            raise SystemExit(f"--victim {requested} is the controller; pick another broker")
        return requested
    return next(b for b in (4, 3, 2) if b != controller)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ch.add_common_args(ap, limits=True)
    ap.add_argument("--partitions", type=int, default=100)
    ap.add_argument("--mb", type=int, default=2048, help="MB of records in the topic in all")
    ap.add_argument("--unavailable-ms", type=int, default=5000, help="balancer.node.unavailable.timeout.ms")
    ap.add_argument("--victim", type=int, default=0, help="broker to kill (default: highest of 2-4 not the controller)")
    ap.add_argument("--verify-partitions", type=int, default=0,
                    help="partitions read back after healing (default 0: all)")
    args = ap.parse_args()
    if not os.access(args.binary, os.X_OK):
        raise SystemExit(f"{args.binary} is missing: cargo build --release (or --binary PATH)")
    directory = tempfile.mkdtemp(prefix="strom-heal-bench-")
    settings = list(harness.FAST) + [f"balancer.node.unavailable.timeout.ms={args.unavailable_ms}",
                                     f"balancer.max.concurrent.moves={args.max_moves}"] + args.set
    print(f"strom: {args.binary}; {os.cpu_count()} CPUs; directory {directory}", flush=True)
    print(f"settings: {' '.join(settings)}", flush=True)
    try:
        disk = disk_write_mb_s(directory, args.disk_mb)
        loop = loopback_mb_s(args.loopback_mb)
        print(f"limits: disk write+fsync {disk:.0f} MB/s, loopback TCP {loop:.0f} MB/s", flush=True)
        cluster = ch.start(directory, NODES, settings, args.binary, args.rust_log)
        try:
            run(args, cluster, disk, loop)
        except BaseException:
            print(cluster.log_tails(30), file=sys.stderr)
            raise
        finally:
            cluster.close()
    finally:
        if args.keep:
            print(f"data and logs kept in {directory}")
        else:
            shutil.rmtree(directory, ignore_errors=True)


def run(args, cluster, disk, loop):
    topic = "heal"
    count = args.partitions
    per_partition, payload, before = ch.create_filled(cluster, topic, args, RF)

    controller = ch.controller_id(cluster)
    victim = pick_victim(args.victim, controller)
    lost = sorted(i for i, p in before.items() if victim in p["replicas"])
    hwm = {i: p["high_watermark"] for i, p in before.items()}
    led = sum(p["leader"] == victim for p in before.values())
    print(f"every ISR full; controller {controller}; killing broker {victim}: replica of {len(lost)} of {count} "
          f"partitions, leader of {led}", flush=True)

    marks = ch.log_marks(cluster)
    t_kill = time.monotonic()
    cluster.kill(victim)
    # The dead broker's files stay: the bytes a new replica has to copy.
    disk_bytes = sum(ch.log_bytes(cluster.node(victim), topic, i) or 0 for i in lost)
    payload_lost = sum(hwm[i] for i in lost) * args.record_size

    t = {"fenced": None, "first_move": None, "full": None}
    moved = set()
    max_running = 0
    deadline = t_kill + args.timeout
    last = None
    while True:
        now = time.monotonic()
        if now > deadline:
            raise SystemExit(f"not healed after {args.timeout} s; last seen {last}")
        cluster.check_alive()
        view = cluster.cluster_view(controller)
        if view and view.get("controller_id") != controller and view.get("controller_id") is not None:
            print(f"note: the controller changed from {controller} to {view['controller_id']}", flush=True)
            controller = view["controller_id"]
        if t["fenced"] is None and view and any(
                b["id"] == victim and b["state"] == "fenced" for b in view["brokers"]):
            t["fenced"] = now
            print(f"  +{now - t_kill:6.2f} s broker {victim} fenced", flush=True)
        status, running = cluster.get(controller, "/v1/reassignments", timeout=5)
        if status != 200:
            last = ("reassignments", status, running)
            time.sleep(0.1)
            continue
        rows = [r for r in running if r["topic"] == topic]
        for r in rows:
            moved.add(r["partition"])
        max_running = max(max_running, len(running))
        if t["first_move"] is None and running:
            t["first_move"] = now
            print(f"  +{now - t_kill:6.2f} s first reassignment seen: {running[0]}", flush=True)
        ps = ch.partitions(cluster, topic, controller)
        if t["fenced"] is not None and not running and ch.fully_replicated(ps, RF, count, excluded=(victim,)):
            t["full"] = time.monotonic()
            print(f"  +{t['full'] - t_kill:6.2f} s every partition has {RF} in-sync replicas again, "
                  f"none on {victim}, no reassignment running", flush=True)
            break
        if ps:
            under = sum(len(p["isr"]) < RF or victim in p["replicas"] for p in ps.values())
            last = {"under_replicated": under, "running": [(r["topic"], r["partition"], r["target"],
                                                          r["bytes_left"]) for r in running]}
        time.sleep(0.1 if t["first_move"] is None else 0.25)

    # The same state, with every high watermark (a leader may miss the 1 s the controller waits).
    after = ch.wait_fully_replicated(cluster, topic, RF, count, 60, excluded=(victim,))
    heal_started, heal_lines = ch.sum_log_field(cluster, marks, "moving leaderships and replicas off brokers",
                                                "changes")

    # What the balancer does next (leader moves; before the read-back, whose consumer
    # group creates __consumer_offsets): waited for, not required.
    def quiet():
        s1, bal = cluster.get(controller, "/v1/balancer", timeout=5)
        s2, running = cluster.get(controller, "/v1/reassignments", timeout=5)
        return s1 == 200 and s2 == 200 and not bal["moves"] and not running
    try:
        harness.wait_for("the balancer to plan nothing", 30, quiet, interval=0.2)
        settled = "plans nothing"
    except TimeoutError as e:
        settled = f"still planning after 30 s: {e}"
    end = ch.partitions(cluster, topic, controller)
    balancer_started, _ = ch.sum_log_field(cluster, marks, "balancer moves started", "moves")
    brokers = {b["id"]: b for b in cluster.get(controller, "/v1/brokers", timeout=5)[1]}

    # Each dead replica's replacement: sizes on disk against the replicas that stayed.
    new_bytes = 0
    mismatched = []
    for i in range(count):
        sizes = {b: ch.log_bytes(cluster.node(b), topic, i) for b in after[i]["replicas"]}
        if len(set(sizes.values())) != 1:
            mismatched.append((i, sizes))
        if i in lost:
            added = [b for b in after[i]["replicas"] if b not in before[i]["replicas"]]
            new_bytes += sum(sizes[b] or 0 for b in added)

    preferred = {}
    for p in end.values():
        preferred[p["replicas"][0]] = preferred.get(p["replicas"][0], 0) + 1
    off_preferred = sorted(i for i, p in end.items() if p["leader"] != p["replicas"][0])

    verify = sorted(after)[:args.verify_partitions] if args.verify_partitions else sorted(after)
    expected = {i: after[i]["high_watermark"] for i in verify}
    t_read = time.perf_counter()
    got = ch.read_counts(cluster.bootstrap, topic, expected, timeout=max(120, args.timeout / 4))
    read_s = time.perf_counter() - t_read
    short = {i: (got[i], expected[i]) for i in verify if got[i] != expected[i] or expected[i] != per_partition}

    t_timeout_end = t["fenced"] + args.unavailable_ms / 1000
    heal_from_timeout = t["full"] - t_timeout_end
    heal_from_first = t["full"] - t["first_move"] if t["first_move"] else float("nan")
    rate_timeout = disk_bytes / MB / heal_from_timeout if heal_from_timeout > 0 else float("nan")
    rate_first = disk_bytes / MB / heal_from_first if heal_from_first > 0 else float("nan")
    print(f"""
===== heal_bench summary =====
cluster                 {NODES} nodes, {count} partitions RF {RF}, {payload / MB:.0f} MB in {args.record_size} B records
settings                balancer.node.unavailable.timeout.ms={args.unavailable_ms} (T), \
balancer.max.concurrent.moves={args.max_moves}
killed                  broker {victim} (controller {controller}): replica of {len(lost)} partitions, leader of {led}
fenced                  {t['fenced'] - t_kill:.2f} s after the kill
timeout end (approx.)   {t_timeout_end - t_kill:.2f} s after the kill (fenced + T; the controller starts T at \
its first 100 ms tick after the fence)
first reassignment seen {(t['first_move'] - t_kill) if t['first_move'] else float('nan'):.2f} s after the kill \
({(t['first_move'] - t_timeout_end) if t['first_move'] else float('nan'):+.2f} s against the timeout end)
full RF again           {t['full'] - t_kill:.2f} s after the kill
HEAL TIME               {heal_from_timeout:.2f} s from the timeout end, {heal_from_first:.2f} s from the first \
reassignment seen
bytes re-replicated     {disk_bytes / MB:.1f} MB (segment files of the dead broker's {len(lost)} replicas on disk; \
payload {payload_lost / MB:.1f} MB = high watermark x {args.record_size} B); new replicas hold {new_bytes / MB:.1f} MB
HEAL RATE               {rate_timeout:.1f} MB/s from the timeout end, {rate_first:.1f} MB/s from the first \
reassignment (of disk write {rate_first / disk:.2f}x, of loopback {rate_first / loop:.2f}x)
limits (same run)       disk write+fsync {disk:.0f} MB/s, loopback TCP {loop:.0f} MB/s
moves                   heal reassignments started {heal_started} (in {heal_lines} controller log lines), \
balancer moves started {balancer_started} (kill to quiet); partitions seen moving {len(moved)}; \
most running at once {max_running}
after                   replicas per broker {{{', '.join(f'{b}: {v["replicas"]}' for b, v in brokers.items())}}}, \
leaders {{{', '.join(f'{b}: {v["leaders"]}' for b, v in brokers.items())}}}, preferred leaders \
{dict(sorted(preferred.items()))}; {len(off_preferred)} partitions led by a replica that is not the first \
{off_preferred[:10]}; the balancer {settled}
replica sizes on disk   {count - len(mismatched)} of {count} partitions with equal segment bytes on their \
{RF} replicas{'' if not mismatched else f'; differing: {mismatched[:5]}'}
read back               {len(verify)} partitions, {sum(got.values())} records in {read_s:.1f} s: \
{'every count == high watermark == records written' if not short else f'MISMATCH (read, hwm): {short}'}
""", flush=True)
    if short or mismatched:
        raise SystemExit("data check failed")


if __name__ == "__main__":
    main()
