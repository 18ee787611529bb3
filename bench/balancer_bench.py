#!/usr/bin/env python3
"""Balancer benchmark: 3 brokers hold every replica of a topic (--partitions, RF 3, a
little data: --mb in all), then 2 new brokers (4 and 5) start at once; the time from both
being active to the controller reporting a balanced, quiet cluster, and the moves the
balancer made against the fewest that could do it.

1. Starts a 5-node cluster of which only nodes 1-3 (the voters) are launched; nodes 4
   and 5 are launched later, never having registered before. Settings:
   broker.heartbeat.interval.ms=200, broker.session.timeout.ms=1500,
   balancer.max.concurrent.moves=--max-moves (balancer.mode=continuous, the default).
2. Creates the topic, fills it (acks=all, the same count of --record-size records in
   every partition), waits until every ISR is full and the balancer plans nothing.
3. Launches nodes 4 and 5 and polls the controller (every 0.2 s) until it is converged:
   replica counts over the 5 brokers (GET /v1/brokers) differ by at most 1, leader counts
   likewise, GET /v1/reassignments is empty and GET /v1/balancer plans no `moves`; and it
   stays so for --stable-s (2 s) of polling. The time is from both new brokers active to
   the start of that stable window.
4. Moves made, counted three ways: `moves_started` of GET /v1/balancer (the
   controller's count since it became controller; the difference over the run) when the
   field exists; the moves the controller logged ("balancer moves started moves=N");
   and each partition's targets as polled every 0.2 s or so (GET /v1/topics on the
   controller), split into replica moves (replicas that enter a partition) and reorders
   (same replicas, another order: a leader move). Beside them the net change from the
   first to the last assignment: replica moves = sum over partitions of |final replicas
   - initial replicas|, leadership changes = partitions whose first replica changed.
   The minimum is
   what the initial counts force out of the overloaded brokers when every broker ends
   with floor or ceil of the average (900 replicas over 5: 3 x (300 - 180) = 360; 300
   leaders over 5: 3 x (100 - 60) = 120, each of which a replica move of a first replica
   can carry, so the fewest reassignments in all is 360).
5. Reads every partition back: counts must equal the high watermarks.

    cargo build --release && tests/setup_python.sh
    target/pyenv/bin/python bench/balancer_bench.py [--partitions 300] [--mb 300] [--max-moves 4]
    target/pyenv/bin/python bench/balancer_bench.py --partitions 60 --mb 30    # a quick check
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

OLD = (1, 2, 3)
NEW = (4, 5)
RF = 3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ch.add_common_args(ap)
    ap.add_argument("--partitions", type=int, default=300)
    ap.add_argument("--mb", type=int, default=300, help="MB of records in the topic in all")
    ap.add_argument("--stable-s", type=float, default=2.0, help="how long converged must hold, s")
    args = ap.parse_args()
    if not os.access(args.binary, os.X_OK):
        raise SystemExit(f"{args.binary} is missing: cargo build --release (or --binary PATH)")
    directory = tempfile.mkdtemp(prefix="strom-balancer-bench-")
    settings = list(harness.FAST) + [f"balancer.max.concurrent.moves={args.max_moves}"] + args.set
    print(f"strom: {args.binary}; {os.cpu_count()} CPUs; directory {directory}", flush=True)
    print(f"settings: {' '.join(settings)}", flush=True)
    try:
        cluster = ch.start(directory, len(OLD) + len(NEW), settings, args.binary, args.rust_log, later=NEW)
        try:
            run(args, cluster)
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


def assignment(ps):
    return {i: list(p["replicas"]) for i, p in ps.items()}


def counts(assign, index=None):
    """Replicas (index None) or first replicas (index 0) per broker."""
    out = {}
    for replicas in assign.values():
        for b in (replicas if index is None else replicas[index:index + 1]):
            out[b] = out.get(b, 0) + 1
    return out


def balancer_state(cluster, via):
    """(converged, what was seen) as controller `via` reports it."""
    s1, brokers = cluster.get(via, "/v1/brokers", timeout=5)
    s2, running = cluster.get(via, "/v1/reassignments", timeout=5)
    s3, bal = cluster.get(via, "/v1/balancer", timeout=5)
    if s1 != 200 or s2 != 200 or s3 != 200:
        return False, ("unanswered", s1, s2, s3)
    active = {b["id"]: b for b in brokers if b["state"] == "active"}
    replicas = {b: v["replicas"] for b, v in active.items()}
    leaders = {b: v["leaders"] for b, v in active.items()}
    seen = {"replicas": replicas, "leaders": leaders, "running": len(running), "planned": len(bal["moves"]),
            "moves_started": bal.get("moves_started")}
    ok = (sorted(active) == sorted(OLD + NEW)
          and max(replicas.values()) - min(replicas.values()) <= 1
          and max(leaders.values()) - min(leaders.values()) <= 1
          and not running and not bal["moves"])
    return ok, seen


def observe(trajectory, ps):
    for i, p in (ps or {}).items():
        target = p["reassignment"]["target"] if p["reassignment"] else p["replicas"]
        if i in trajectory and target != trajectory[i][-1]:
            trajectory[i].append(list(target))


def steps(trajectory, initial, final):
    """From the polled trajectories: (replica moves, reorders, {partition: trajectory}
    of the partitions whose replicas moved more often than their net change needs)."""
    replica_moves = reorders = 0
    redundant = {}
    for i, seq in trajectory.items():
        moved = 0
        for a, b in zip(seq, seq[1:]):
            if set(a) != set(b):
                moved += len(set(b) - set(a))
            elif a != b:
                reorders += 1
        replica_moves += moved
        if moved > len(set(final[i]) - set(initial[i])):
            redundant[i] = seq
    return replica_moves, reorders, redundant


def run(args, cluster):
    topic = "balance"
    count = args.partitions
    per_partition, payload, before = ch.create_filled(cluster, topic, args, RF)
    controller = ch.controller_id(cluster)
    harness.wait_for("the balancer to plan nothing before brokers join", 60,
                     lambda: cluster.get(controller, "/v1/balancer", timeout=5)[1]["moves"] == [], interval=0.2)
    before = ch.partitions(cluster, topic, controller)
    initial = assignment(before)
    started0 = cluster.get(controller, "/v1/balancer", timeout=5)[1].get("moves_started")
    print(f"every ISR full; controller {controller}; replicas {counts(initial)}, preferred leaders "
          f"{counts(initial, 0)}; moves_started {started0}", flush=True)

    marks = ch.log_marks(cluster)
    t_launch = time.monotonic()
    for nid in NEW:
        cluster.launch(nid)

    def new_active():
        cluster.check_alive()
        view = cluster.cluster_view(controller)
        states = {b["id"]: b["state"] for b in view["brokers"]} if view else {}
        return all(states.get(b) == "active" for b in NEW)
    harness.wait_for(f"brokers {NEW} active", 120, new_active, interval=0.05)
    t_active = time.monotonic()
    print(f"  +{t_active - t_launch:6.2f} s brokers {NEW} active (from launch)", flush=True)

    # Each partition's distinct targets as polled: moves too quick for the poll are missed.
    trajectory = {i: [r] for i, r in initial.items()}
    t_first_move = None
    t_stable_from = None
    max_running = 0
    seen = None
    deadline = t_active + args.timeout
    while True:
        now = time.monotonic()
        if now > deadline:
            raise SystemExit(f"not converged after {args.timeout} s; last seen {seen}")
        cluster.check_alive()
        view = cluster.cluster_view(controller)
        if view and view.get("controller_id") not in (None, controller):
            print(f"note: the controller changed from {controller} to {view['controller_id']}", flush=True)
            controller = view["controller_id"]
            t_stable_from = None
        ok, seen = balancer_state(cluster, controller)
        observe(trajectory, ch.partitions(cluster, topic, controller))
        if isinstance(seen, dict):
            max_running = max(max_running, seen["running"])
            if t_first_move is None and seen["running"]:
                t_first_move = now
                print(f"  +{now - t_active:6.2f} s first reassignment seen", flush=True)
        if ok:
            if t_stable_from is None:
                t_stable_from = now
                print(f"  +{now - t_active:6.2f} s converged: {seen}; checking it holds {args.stable_s} s",
                      flush=True)
            elif now - t_stable_from >= args.stable_s:
                break
        elif t_stable_from is not None:
            print(f"  +{now - t_active:6.2f} s no longer converged: {seen}", flush=True)
            t_stable_from = None
        time.sleep(0.2)

    final_balancer = cluster.get(controller, "/v1/balancer", timeout=5)[1]
    started1 = final_balancer.get("moves_started")
    byte_load = final_balancer.get("imbalance", {}).get("bytes")
    after = ch.wait_fully_replicated(cluster, topic, RF, count, 60)
    final = assignment(after)
    observe(trajectory, after)
    polled_replica_moves, polled_reorders, redundant = steps(trajectory, initial, final)
    logged, lines = ch.sum_log_field(cluster, marks, "balancer moves started", "moves")

    replica_moves = sum(len(set(final[i]) - set(initial[i])) for i in initial)
    first_changed = [i for i in initial if final[i][0] != initial[i][0]]
    net_reorders = [i for i in first_changed if set(final[i]) == set(initial[i])]
    partitions_touched = sum(final[i] != initial[i] for i in initial)
    all_brokers = OLD + NEW
    min_replicas, _ = ch.min_moves(counts(initial), brokers=all_brokers)
    min_leaders, _ = ch.min_moves(counts(initial, 0), brokers=all_brokers)
    if "moves_started" not in final_balancer:
        api_moves = "no such field"
    elif started1 is None or started0 is None:
        api_moves = f"null ({started0} before, {started1} after)"
    else:
        api_moves = started1 - started0

    expected = {i: after[i]["high_watermark"] for i in after}
    t_read = time.perf_counter()
    got = ch.read_counts(cluster.bootstrap, topic, expected, timeout=max(120, args.timeout / 4))
    read_s = time.perf_counter() - t_read
    short = {i: (got[i], expected[i]) for i in after if got[i] != expected[i] or expected[i] != per_partition}

    converge_s = t_stable_from - t_active
    print(f"""
===== balancer_bench summary =====
cluster                  {len(OLD)} -> {len(all_brokers)} brokers, {count} partitions RF {RF}, \
{payload / MB:.0f} MB in {args.record_size} B records
settings                 balancer.max.concurrent.moves={args.max_moves}, balancer.mode=continuous
new brokers active       {t_active - t_launch:.2f} s after launch
first reassignment seen  {(t_first_move - t_active) if t_first_move else float('nan'):.2f} s after both active
CONVERGED IN             {converge_s:.2f} s from both new brokers active (held {args.stable_s} s after)
replicas per broker      {counts(initial)} -> {counts(final)}
preferred leaders        {counts(initial, 0)} -> {counts(final, 0)}; leaders (controller) {seen['leaders']}
bytes per broker         {byte_load if byte_load is not None else 'not reported (GET /v1/balancer has no imbalance.bytes)'}
REPLICA MOVES            {polled_replica_moves} seen by polling, net {replica_moves} (|final - initial| summed \
over partitions); minimum {min_replicas} ({polled_replica_moves / min_replicas if min_replicas else float('nan'):.2f}x)
LEADER-ONLY MOVES        {polled_reorders} reorders of the same replicas seen by polling (minimum 0: each \
leadership change can ride on a replica move)
LEADERSHIP CHANGES       {len(first_changed)} partitions ended with another first replica ({len(net_reorders)} of them \
with the same replicas), minimum {min_leaders}
MOVES IN ALL             {polled_replica_moves + polled_reorders} seen by polling; moves_started (GET /v1/balancer): \
{api_moves}; controller log "balancer moves started": {logged} \
in {lines} batches; minimum {min_replicas}
replicas moved twice     {len(redundant)} partitions{'' if not redundant else ' e.g. ' + '; '.join(
    f'{i}: ' + ' -> '.join(map(str, t)) for i, t in list(redundant.items())[:5])}
partitions touched       {partitions_touched} of {count}; most reassignments running at once {max_running}
read back                {len(after)} partitions, {sum(got.values())} records in {read_s:.1f} s: \
{'every count == high watermark == records written' if not short else f'MISMATCH (read, hwm): {short}'}
""", flush=True)
    if short:
        raise SystemExit("data check failed")


if __name__ == "__main__":
    main()
