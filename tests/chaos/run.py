#!/usr/bin/env python3
"""Strom's fault harness: a cluster in network namespaces, a seeded schedule of faults,
workloads, and checkers: the queue (nothing acknowledged lost), a consumer group with
churning members (offsets never back, every record consumed, no read outside one's
assignment), admin-API metadata operations (linearizable) and transactions (committed
ones whole and kept, aborted ones never read by read_committed consumers).

  python3 tests/chaos/run.py --seed S --minutes M --nemesis kill,pause,partition \\
      [--workload queue,groups,metadata,txn] [--negative-control early-ack|min-isr-1|power-loss-no-flush] \\
      --report DIR

The queue workload always runs (the faults aim at its partitions' leaders); groups,
metadata and txn are added to it. Nemeses: kill, pause, partition, netem, degrade (random loss
and a slow link without netem: nftables and tbf), clock (libfaketime
jumps one node's realtime clock), disk (one node's data tmpfs filled below
storage.min.free.bytes) and power (every node killed at once, what it had not fsynced
dropped by lossyfs.py, a FUSE file system; --sync-before-faults writes back what the
nodes wrote before the faults first).

Exit 0: no anomaly; 1: anomalies found (DIR/report.json lists them); 2: usage error,
something not implemented yet, or a machine that cannot run it (not root, no network
namespaces, no nftables; for clock, disk, power: no libfaketime, tmpfs or FUSE). See
tests/chaos/README.md.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
VENV_PY = os.path.join(REPO, "target", "pyenv", "bin", "python")

try:
    import confluent_kafka  # noqa: F401
except ImportError:
    if os.path.exists(VENV_PY) and os.path.realpath(sys.prefix) != os.path.dirname(os.path.dirname(VENV_PY)) \
            and not os.environ.get("STROM_CHAOS_REEXEC"):
        os.environ["STROM_CHAOS_REEXEC"] = "1"
        os.execv(VENV_PY, [VENV_PY, os.path.abspath(__file__)] + sys.argv[1:])
    sys.stderr.write("confluent-kafka is not importable: run tests/setup_python.sh (it makes target/pyenv)\n")
    sys.exit(2)

import argparse  # noqa: E402
import atexit  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, HERE)

import bounds  # noqa: E402
import checker  # noqa: E402
import groups as groups_workload  # noqa: E402
import metadata as metadata_workload  # noqa: E402
import nemesis as nem  # noqa: E402
import topology  # noqa: E402
import txn as txn_workload  # noqa: E402
import worker  # noqa: E402

WORKLOADS = ("queue", "groups", "metadata", "txn")
WORKLOADS_NOT_IMPLEMENTED = ()
NEGATIVE_CONTROLS = ("early-ack", "min-isr-1", "power-loss-no-flush")
NEGATIVE_CONTROLS_NOT_IMPLEMENTED = ()
TOPIC = "chaos"


class Usage(Exception):
    pass


def parse(argv):
    ap = argparse.ArgumentParser(prog="run.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--minutes", type=float, default=3.0, help="length of the fault phase")
    ap.add_argument("--seeds", type=int, default=1,
                    help="run seeds SEED..SEED+N-1 one after another (reports in DIR/seed-S, DIR/summary.json)")
    ap.add_argument("--nemesis", default=None,
                    help=f"comma-separated: {','.join(nem.IMPLEMENTED)}; 'none' for no faults (default "
                         "kill,pause,partition; power alone under --negative-control power-loss-no-flush). "
                         "clock: libfaketime jumps one node's realtime clock; disk: fills one node's data tmpfs "
                         "below storage.min.free.bytes; power: kills every node at once and drops what they had "
                         "not fsynced (lossyfs), with log.flush.interval.messages=1 unless --set names a "
                         "log.flush setting")
    ap.add_argument("--workload", default="queue",
                    help="comma-separated: queue (always on: the faults aim at its partitions' leaders), groups "
                         "(a consumer group with churning members: groups.py), metadata (topic create/delete/"
                         "config/read through the admin API of random nodes, checked for linearizability: "
                         "metadata.py), txn (transactional producers committing and aborting, read_committed "
                         "consumers: txn.py)")
    ap.add_argument("--group-members", type=int, default=3, help="groups workload: members (default 3)")
    ap.add_argument("--group-rate", type=float, default=100.0, help="groups workload: records/s (default 100)")
    ap.add_argument("--metadata-clients", type=int, default=4, help="metadata workload: client threads (default 4)")
    ap.add_argument("--metadata-topics", type=int, default=3, help="metadata workload: topics (default 3)")
    ap.add_argument("--txn-producers", type=int, default=2, help="txn workload: transactional producers (default 2)")
    ap.add_argument("--txn-rate", type=float, default=10.0,
                    help="txn workload: transactions/s over all its producers (default 10)")
    ap.add_argument("--txn-consumers", type=int, default=1,
                    help="txn workload: read_committed consumers reading throughout (default 1)")
    ap.add_argument("--negative-control", choices=NEGATIVE_CONTROLS + NEGATIVE_CONTROLS_NOT_IMPLEMENTED)
    ap.add_argument("--report", help="report directory (default: a new /tmp/strom-chaos.* directory)")
    ap.add_argument("--nodes", type=int, default=5, help="nodes, each in its own network namespace (default 5)")
    ap.add_argument("--voters", type=int, default=3, help="metadata quorum voters: nodes 1..V (default 3)")
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--replication-factor", type=int, default=3)
    ap.add_argument("--min-insync", type=int, default=2)
    ap.add_argument("--rate", type=float, default=300.0, help="records/s over all producers")
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--consumers", type=int, default=2)
    ap.add_argument("--stranded-client", action="store_true",
                    help="one more producer, inside the namespace of a node the seed picks")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra node setting")
    ap.add_argument("--message-timeout-ms", type=int, default=0,
                    help="producers' message.timeout.ms (default 0: never; librdkafka re-sends timed-out "
                         "messages under a bumped epoch, which can duplicate them)")
    ap.add_argument("--binary", default=None, help="strom binary (default $STROM_BIN or target/debug/strom)")
    ap.add_argument("--keep-data", action="store_true", help="keep the nodes' data dirs even when no anomaly")
    ap.add_argument("--sync-before-faults", action="store_true",
                    help="power: lossyfs persists everything the nodes wrote before the faults begin (e.g. "
                         "meta.properties, which the broker never fsyncs), as a page cache written back by then "
                         "would; by default nothing that was not fsynced survives a power loss")
    ap.add_argument("--print-schedule", action="store_true", help="print the schedule and exit")
    ap.add_argument("--check-env", action="store_true",
                    help="check that this machine can run the harness (root, namespaces, nft) and exit")
    a = ap.parse_args(argv)
    if a.nemesis is None:
        a.nemesis = "power" if a.negative_control == "power-loss-no-flush" else "kill,pause,partition"
    nemeses = [] if a.nemesis.strip() in ("", "none") else [x.strip() for x in a.nemesis.split(",") if x.strip()]
    for n in nemeses:
        if n in nem.NOT_IMPLEMENTED:
            raise Usage(f"nemesis '{n}' is not implemented yet (implemented: {', '.join(nem.IMPLEMENTED)})")
        if n not in nem.IMPLEMENTED:
            raise Usage(f"unknown nemesis '{n}' (implemented: {', '.join(nem.IMPLEMENTED)})")
    if a.negative_control == "power-loss-no-flush":
        # Power losses with the broker's default flush settings (no fsync of the logs). What
        # the nodes wrote at their first start is written back first: this control is about
        # the logs alone (README, finding 1: a node without its meta.properties cannot start).
        nemeses.append("power")
        a.sync_before_faults = True
        if any(x.split("=", 1)[0].strip().startswith("log.flush.") for x in a.set):
            raise Usage("--negative-control power-loss-no-flush runs without log.flush.* settings "
                        "(drop --set log.flush.*)")
    a.nemeses = sorted(set(nemeses))
    workloads = [x.strip() for x in a.workload.split(",") if x.strip()]
    for w in workloads:
        if w in WORKLOADS_NOT_IMPLEMENTED:
            raise Usage(f"workload '{w}' is not implemented yet (implemented: {', '.join(WORKLOADS)})")
        if w not in WORKLOADS:
            raise Usage(f"unknown workload '{w}' (implemented: {', '.join(WORKLOADS)})")
    a.workloads = ["queue"] + [w for w in WORKLOADS[1:] if w in workloads]
    if a.group_members < 1 or a.group_rate <= 0 or a.metadata_clients < 1 or a.metadata_topics < 1:
        raise Usage("--group-members, --group-rate, --metadata-clients and --metadata-topics must be positive")
    if a.txn_producers < 1 or a.txn_rate <= 0 or a.txn_consumers < 1:
        raise Usage("--txn-producers, --txn-rate and --txn-consumers must be positive")
    if a.negative_control in NEGATIVE_CONTROLS_NOT_IMPLEMENTED:
        raise Usage(f"negative control '{a.negative_control}' is not implemented yet "
                    f"(implemented: {', '.join(NEGATIVE_CONTROLS)})")
    if a.nodes < 3 or a.voters < 1 or a.voters > a.nodes or a.nodes > 9:
        raise Usage("--nodes must be 3..9 and --voters 1..nodes")
    if a.replication_factor > a.nodes:
        raise Usage("--replication-factor larger than --nodes")
    if a.seeds < 1:
        raise Usage("--seeds must be at least 1")
    if a.minutes <= 0 or a.rate <= 0 or a.producers < 1 or a.consumers < 1 or a.partitions < 1:
        raise Usage("--minutes, --rate, --producers, --consumers and --partitions must be positive")
    return a


class Run:
    def __init__(self, a):
        self.a = a
        self.t_start = time.time()
        self.topo = None
        self.workers = []  # (role, id, Popen)
        self.dir = os.path.abspath(a.report)
        self.hist_dir = os.path.join(self.dir, "history")
        self.crashes = []
        self.extra = []  # the groups, metadata and txn workloads (groups.Workload, metadata.Workload, txn.Workload)

    def say(self, msg):
        print(f"[{time.time() - self.t_start:7.2f}s] {msg}", flush=True)

    # ---- clean-up on every path ---------------------------------------------------------

    def cleanup(self):
        for _, _, proc in self.workers:
            topology.kill_quietly(proc)
        for w in self.extra:
            w.cleanup()
        if self.topo is not None:
            self.topo.close()

    # ---- workers ------------------------------------------------------------------------

    def start_worker(self, role, wid, extra, in_node=None):
        out = os.path.join(self.hist_dir, f"{wid}.jsonl")
        argv = [sys.executable, os.path.join(HERE, "worker.py"), role, "--bootstrap", self.topo.bootstrap,
                "--topic", TOPIC, "--partitions", str(self.a.partitions), "--id", wid, "--out", out] + extra
        log = open(os.path.join(self.dir, "workers", f"{wid}.log"), "ab")
        if in_node is None:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    preexec_fn=topology._die_with_parent)
        else:
            proc = self.topo.run_in_ns(in_node, argv, log, log)
        log.close()
        self.workers.append((role, wid, proc))
        return proc

    def progress(self):
        out = {}
        for role, wid, _ in self.workers:
            if role != "produce":
                continue
            try:
                with open(os.path.join(self.dir, "workers", f"{wid}.progress.json")) as f:
                    out[wid] = json.load(f)
            except (OSError, ValueError):
                pass
        return out

    def acked_since(self, t):
        """Partitions with an acknowledgement after wall time t (from the root-namespace producers)."""
        done = set()
        for wid, pr in self.progress().items():
            if wid.startswith("stranded"):
                continue
            for p, last in enumerate(pr.get("last_ack") or []):
                if last is not None and last > t:
                    done.add(p)
        return done

    def check_workers(self):
        for role, wid, proc in self.workers:
            if proc.poll() is not None:
                raise RuntimeError(f"worker {wid} exited ({proc.returncode}); see {self.dir}/workers/{wid}.log")
        for w in self.extra:
            w.check_alive()

    # ---- the run ------------------------------------------------------------------------

    def run(self):
        a = self.a
        os.makedirs(self.hist_dir, exist_ok=True)
        os.makedirs(os.path.join(self.dir, "workers"), exist_ok=True)
        schedule = nem.make_schedule(a.seed, a.minutes, a.nemeses, a.nodes, a.partitions)
        print_schedule(a, schedule, self.say)

        settings = list(topology.DEFAULT_SETTINGS)
        topic_configs = {"min.insync.replicas": str(a.min_insync)}
        if a.negative_control == "early-ack":
            settings.append("unsafe.ack.before.commit=true")
        elif a.negative_control == "min-isr-1":
            settings += ["min.insync.replicas=1", "unclean.leader.election.enable=true"]
            topic_configs = {"min.insync.replicas": "1", "unclean.leader.election.enable": "true"}
        settings += nemesis_settings(a)
        settings += a.set
        binary = os.path.abspath(a.binary or os.environ.get("STROM_BIN") or
                                 os.path.join(REPO, "target", "debug", "strom"))
        if not os.access(binary, os.X_OK):
            raise Usage(f"strom binary {binary} is missing (build it, or pass --binary / set STROM_BIN)")

        self.topo = topology.Topology(self.dir, binary, n=a.nodes, voters=a.voters, settings=settings, log=self.say,
                                      clock="clock" in a.nemeses, disk="disk" in a.nemeses,
                                      power="power" in a.nemeses)
        self.topo.up()
        self.say(f"{a.nodes} nodes started in namespaces strom-{self.topo.tag}-1..{a.nodes} "
                 f"({self.topo.subnet}.1-{a.nodes}); voters 1..{min(a.voters, a.nodes)}; settings {settings}")
        controller = self.topo.wait_ready()
        self.say(f"cluster ready: controller {controller}, {a.nodes} active brokers")
        self.topo.create_topic(TOPIC, a.partitions, a.replication_factor, topic_configs)
        topology.wait_for("the topic with a leader and full ISR everywhere", 60,
                          lambda: self.topo.healthy(TOPIC, a.partitions))
        self.say(f"topic {TOPIC}: {a.partitions} partitions, RF {a.replication_factor}, configs {topic_configs}")

        drain_file = os.path.join(self.dir, "workers", "drain.json")
        for i in range(a.consumers):
            self.start_worker("consume", f"consumer-{i}", ["--drain", drain_file])
        rate = a.rate / a.producers
        for i in range(a.producers):
            wid = f"producer-{i}"
            self.start_worker("produce", wid, ["--rate", str(rate), "--message-timeout-ms", str(a.message_timeout_ms),
                                               "--progress", os.path.join(self.dir, "workers", f"{wid}.progress.json")])
        stranded = None
        if a.stranded_client:
            import random
            stranded = random.Random(f"{a.seed}/stranded").randint(1, a.nodes)
            wid = f"stranded-{stranded}"
            self.start_worker("produce", wid, ["--rate", str(min(rate, 50.0)), "--message-timeout-ms",
                                               str(a.message_timeout_ms), "--progress",
                                               os.path.join(self.dir, "workers", f"{wid}.progress.json")],
                              in_node=stranded)
        self.say(f"workload: {a.producers} idempotent acks=all producers ({a.rate:g} records/s in all), "
                 f"{a.consumers} assign-mode consumers"
                 + (f", a stranded producer in node {stranded}'s namespace" if stranded else ""))
        if "groups" in a.workloads:
            self.extra.append(groups_workload.Workload(self, a.group_members, a.group_rate))
        if "metadata" in a.workloads:
            self.extra.append(metadata_workload.Workload(self, a.metadata_clients, a.metadata_topics))
        if "txn" in a.workloads:
            self.extra.append(txn_workload.Workload(self, a.txn_producers, a.txn_rate, a.txn_consumers))
        for w in self.extra:
            w.start()
        t_load = time.time()
        topology.wait_for("an acknowledgement on every partition", 60,
                          lambda: (self.check_workers(), len(self.acked_since(0)) == a.partitions)[1])
        if a.sync_before_faults and "power" in a.nemeses:
            self.say(f"written back before the faults (--sync-before-faults): {self.topo.sync_storage()}")
        t0 = time.time()
        self.say("every partition acknowledged a write: faults begin")
        for w in self.extra:
            w.begin(t0)

        # Fault phase: the schedule's events at their times (faults are held for their durations).
        nemeses = nem.Nemeses(self.topo, TOPIC, self.say)
        events = sorted([(op["at"], 0, "start", op) for op in schedule] +
                        [(op["at"] + op["duration"], 1, "stop", op) for op in schedule],
                        key=lambda e: (e[0], -e[1]))
        faults = []
        anomalies_extra = {}
        horizon = t0 + a.minutes * 60.0
        for at, _, what, op in events:
            self._hold_until(t0 + at)
            now = time.time()
            try:
                if what == "start":
                    rec = nemeses.start(op, now)
                    faults.append(rec)
                    self.say(f"#{op['id']} start: {rec['what']}")
                else:
                    rec = nemeses.stop(op, now)
                    if rec:
                        self.say(f"#{op['id']} stop ({op['nemesis']}): healed after {now - rec['start']:.1f} s")
            except Exception as e:  # noqa: BLE001 - a nemesis failing is reported, the run goes on
                self.say(f"#{op['id']} {what} failed: {e}")
                anomalies_extra.setdefault("nemesis-errors", []).append({"id": op["id"], "what": what,
                                                                         "error": str(e)})
        self._hold_until(horizon)

        # Heal everything, wait for full health, and for every partition to acknowledge again.
        if self.crashes:
            anomalies_extra["crash"] = list(self.crashes)
        t_heal = time.time()
        nemeses.heal_all()
        for w in self.extra:
            w.heal()
        for f in faults:
            if f["stop"] is None:
                f["stop"] = t_heal
        self.say("all faults healed; waiting for every node active and every partition with a leader and full ISR")
        try:
            topology.wait_for("every partition with a leader and full ISR", 120,
                              lambda: self.topo.healthy(TOPIC, a.partitions), interval=0.25)
            self.say(f"healthy again {time.time() - t_heal:.1f} s after healing")
        except TimeoutError as e:
            self.say(f"NOT RECOVERED: {e}")
            anomalies_extra.setdefault("unrecovered", []).append(
                {"what": "cluster not healthy 120 s after healing", "detail": str(e)[:2000],
                 "topic": self.topo.topic(TOPIC)})
        try:
            topology.wait_for("an acknowledgement on every partition after healing", 60,
                              lambda: len(self.acked_since(t_heal)) == a.partitions, interval=0.2)
        except TimeoutError:
            missing = sorted(set(range(a.partitions)) - self.acked_since(t_heal))
            self.say(f"NOT RECOVERED: partitions {missing} acknowledged nothing in the 60 s after healing")
            anomalies_extra.setdefault("unrecovered", []).append(
                {"what": "no acknowledgement within 60 s after healing", "partitions": missing})

        # Stop the producers (they wait for what is in flight), then let the consumers drain.
        t_end_load = time.time()
        for role, wid, proc in self.workers:
            if role == "produce":
                proc.send_signal(signal.SIGTERM)
        for w in self.extra:
            w.stop_load()
        for role, wid, proc in self.workers:
            if role == "produce":
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    self.say(f"producer {wid} did not stop: killed")
                    proc.kill()
                    proc.wait()
        self.say(f"producers stopped ({time.time() - t_end_load:.1f} s to finish what was in flight); final read")
        final_failed = None
        try:
            final_log, ends, complete = worker.final_read(self.topo.bootstrap, TOPIC, a.partitions)
        except Exception as e:  # noqa: BLE001 - no leader answered ListOffsets for 120 s
            final_failed = str(e)
            final_log, ends, complete = {p: [] for p in range(a.partitions)}, {}, False
            self.say(f"NOT RECOVERED: the final read failed: {e}")
            anomalies_extra.setdefault("unrecovered", []).append(
                {"what": "the final read failed: no high watermark for every partition in 120 s", "error": str(e)})
        with open(os.path.join(self.hist_dir, "final-read.json"), "w") as f:
            json.dump({"ends": ends, "complete": complete, "log": final_log}, f)
        if not complete and not final_failed:
            anomalies_extra.setdefault("unrecovered", []).append(
                {"what": "the final read did not reach every high watermark in 120 s", "ends": ends})
        worker.write_json_atomic(drain_file, {str(p): e for p, e in ends.items()})
        for role, wid, proc in self.workers:
            if role == "consume":
                topology.wait_or_stop(proc)
        self.say(f"final read: {sum(len(v) for v in final_log.values())} records, high watermarks {ends}")

        # Check.
        panics = scan_node_logs(self.topo)
        if panics:
            anomalies_extra["panic"] = panics
        sends, polls, events_ = checker.load_history(self.hist_dir)
        anomalies, stats = checker.check(sends, polls, final_log)
        client_dups = []
        if anomalies["duplicate"]:
            anomalies["duplicate"], client_dups = checker.classify_duplicates(
                anomalies["duplicate"], [n.data_dir for n in self.topo.nodes.values()], TOPIC)
            if client_dups:
                self.say(f"{len(client_dups)} value(s) written twice by the client under a new producer epoch "
                         f"(librdkafka's epoch bump; not the broker's): see client_duplicates in the report")
        if final_failed:
            # Without a final read, only what the consumers saw can be judged.
            for k in ("lost", "inconsistent-offset", "poll-skip", "unseen"):
                anomalies[k] = []
        anomalies.update(anomalies_extra)
        extra_report = {}
        for w in self.extra:  # the groups, metadata and txn workloads: their own ends and checks
            w_anomalies, stats[w.name], w_report = w.finish(faults, self.crashes)
            for k, v in w_anomalies.items():
                anomalies.setdefault(k, []).extend(v)
            extra_report.update(w_report)
        # Clients that stopped making progress while the others went on (the cause may be the
        # client's or a broker connection's: reported, not counted as an anomaly).
        stalls = []
        for role, wid, _ in self.workers:
            if role == "produce":
                acks = [x["t1"] for x in sends if x["w"] == wid and x.get("ok") is True]
                last = max(acks) if acks else t_load
                if last < t_heal:
                    stalls.append({"client": wid, "what": "no acknowledgement after the faults were healed",
                                   "last_ack_s": round(last - t0, 1)})
            else:
                if any(e.get("w") == wid and "drain timed out" in e.get("what", "") for e in events_):
                    seen = [x["t"] for x in polls if x["w"] == wid]
                    stalls.append({"client": wid, "what": "did not read to the end within 60 s of the final read",
                                   "last_poll_s": round(max(seen) - t0, 1) if seen else None})
        for st in stalls:
            self.say(f"WARNING: client {st['client']} stalled: {st['what']} (last progress at "
                     f"{st.get('last_ack_s', st.get('last_poll_s'))} s)")
        per_fault, worst, baseline = checker.unavailability(
            [s for s in sends if not s["w"].startswith("stranded")], faults, a.partitions, t_end_load)
        single = bounds.evaluate(per_fault, faults, bounds.session_timeout_s(settings), t_end_load)
        counts = {k: len(v) for k, v in anomalies.items()}
        bad = {k: n for k, n in counts.items() if n}
        report = {
            "seed": a.seed, "minutes": a.minutes, "nemesis": a.nemeses, "workload": ",".join(a.workloads),
            "negative_control": a.negative_control,
            "options": {"nodes": a.nodes, "voters": a.voters, "partitions": a.partitions,
                        "replication_factor": a.replication_factor, "topic_configs": topic_configs,
                        "settings": settings, "rate": a.rate, "producers": a.producers, "consumers": a.consumers,
                        "stranded_client": stranded, "binary": binary},
            "schedule": schedule,
            "faults": [{**f, "start_s": round(f["start"] - t0, 3), "stop_s": round(f["stop"] - t0, 3)}
                       for f in faults],
            "ops": stats, "acked": stats["send"]["ok"],
            "anomalies": {k: v[:checker.LIST_LIMIT] for k, v in anomalies.items()},
            "anomaly_counts": counts,
            "client_duplicates": client_dups[:checker.LIST_LIMIT],
            "client_stalls": stalls,
            "unavailable_s": worst,
            "unavailability": per_fault,
            "bounds": single,
            "longest_gap_outside_faults_s": baseline,
            "final_high_watermarks": {str(p): e for p, e in ends.items()},
            "client_events": [e for e in events_ if "drained" not in e.get("what", "")][:200],
            "times": {"t0": t0, "load_started": t_load, "healed": t_heal, "load_stopped": t_end_load,
                      "total_s": round(time.time() - self.t_start, 1)},
            "valid": not bad,
            **extra_report,
        }
        with open(os.path.join(self.dir, "report.json"), "w") as f:
            json.dump(report, f, indent=1)
        try:
            import timeline
            timeline.render(os.path.join(self.dir, "timeline.png"), sends, faults, anomalies, t_load,
                            t_end_load, a.partitions,
                            f"seed {a.seed}, {a.minutes:g} min, nemesis {','.join(a.nemeses) or 'none'}"
                            + (f", negative control {a.negative_control}" if a.negative_control else "")
                            + f": {'anomalies ' + str(bad) if bad else 'no anomaly'}",
                            extra={w.name: w.timeline_data for w in self.extra})
        except ImportError as e:
            self.say(f"no timeline.png: {e} (tests/setup_python.sh installs matplotlib)")

        s = stats["send"]
        self.say(f"sends: {s['invoked']} invoked, {s['ok']} acknowledged, {s['fail']} failed, "
                 f"{s['indeterminate']} indeterminate; {stats['poll']} polled; {stats['final_read']} in the final read")
        for pf in per_fault:
            self.say(f"  unavailable #{pf['id']:<3} {pf['nemesis']:<9} {pf['worst_s']:6.2f} s "
                     f"(partition {pf['worst_partition']}; overlapping {pf['worst_overlapping_s']:.2f} s) {pf['what']}")
        self.say(f"worst unavailability per nemesis (per partition): {worst}; outside faults: "
                 f"{max(baseline.values()) if baseline else 0:.2f} s")
        for line in bounds.describe(single):
            self.say(("WARNING: " if "EXCEEDED" in line else "") + line)
        if bad:
            for k in bad:
                self.say(f"ANOMALY {k}: {counts[k]}; first: {json.dumps(anomalies[k][:3])[:600]}")
            self.say(f"INVALID: {bad}; report {self.dir}/report.json, node logs {self.dir}/nodes")
        else:
            self.say(f"VALID: no anomaly; report {self.dir}/report.json")
        return 1 if bad else 0

    def _hold_until(self, deadline):
        """Holds the current faults until `deadline` (wall time), watching the workers and
        the nodes (a node that exits by itself is a crash: recorded, restarted at the heal)."""
        while True:
            self.check_workers()
            self.topo.check_storage()
            for nid, rc in self.topo.exited_unexpectedly():
                node = self.topo.nodes[nid]
                self.say(f"CRASH: node {nid} exited by itself ({rc}); see {node.log}")
                self.crashes.append({"node": nid, "returncode": rc, "t": time.time(), "log": node.log})
                node.proc = None
            left = deadline - time.time()
            if left <= 0:
                return
            time.sleep(min(left, 0.5))


def nemesis_settings(a):
    """Node settings the nemeses need. disk: the floor the ballast goes below. power: an
    fsync after every record (log.flush.interval.messages=1), so that a power loss may
    lose nothing acknowledged, unless --set names a log.flush setting or the negative
    control power-loss-no-flush asks for the broker's defaults (no fsync: it must lose)."""
    out = []
    if "disk" in a.nemeses:
        out.append(f"storage.min.free.bytes={topology.MIN_FREE_BYTES}")
    own_flush = any(x.split("=", 1)[0].strip().startswith("log.flush.") for x in a.set)
    if "power" in a.nemeses and a.negative_control != "power-loss-no-flush" and not own_flush:
        out.append("log.flush.interval.messages=1")
    return out


def scan_node_logs(topo):
    """Panics in the nodes' logs (a panicking task, e.g. the metadata quorum's core, can
    leave a node up but useless): each with its node, log line and message."""
    found = []
    for node in topo.nodes.values():
        try:
            with open(node.log, errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for i, line in enumerate(lines):
            if " panicked at " in line:
                found.append({"node": node.id, "log": node.log, "line": i + 1, "where": line.strip(),
                              "message": lines[i + 1].strip() if i + 1 < len(lines) else ""})
    return found


def print_schedule(a, schedule, say=print):
    say(f"seed {a.seed}, {a.minutes:g} min, nemesis {','.join(a.nemeses) or 'none'}, {a.nodes} nodes"
        + (f", negative control {a.negative_control}" if a.negative_control else "")
        + f": schedule of {len(schedule)} faults")
    for op in schedule:
        say("  " + nem.describe(op))
    if "groups" in getattr(a, "workloads", ()):
        members = groups_workload.member_schedule(a.seed, a.minutes, a.group_members)
        say(f"group members' departures ({len(members)}):")
        for ev in members:
            say(f"  {ev['at']:7.2f}s +{ev['down']:5.2f}s member {ev['member']} {ev['action']}")


def main(argv=None):
    try:
        a = parse(sys.argv[1:] if argv is None else argv)
    except Usage as e:
        sys.stderr.write(f"run.py: {e}\n")
        return 2
    if a.print_schedule:
        print_schedule(a, nem.make_schedule(a.seed, a.minutes, a.nemeses, a.nodes, a.partitions))
        return 0
    try:
        topology.check_env(need_nft=bool({"partition", "degrade"} & set(a.nemeses)) or a.check_env, need_netem="netem" in a.nemeses,
                           need_faketime="clock" in a.nemeses, need_tmpfs="disk" in a.nemeses,
                           need_fuse="power" in a.nemeses)
    except topology.EnvError as e:
        sys.stderr.write(f"run.py: cannot run here: {e}\n")
        return 2
    if a.check_env:
        print("ok: root, network namespaces, nftables and tc are available")
        return 0
    if not a.report:
        import tempfile
        a.report = tempfile.mkdtemp(prefix="strom-chaos.")
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal_default)
    if a.seeds == 1:
        return run_one(a)
    return run_seeds(a)


def run_one(a):
    """One run (one seed) with its report in a.report: the exit code."""
    run = Run(a)
    atexit.register(run.cleanup)
    rc = 2
    try:
        rc = run.run()
    except Usage as e:
        sys.stderr.write(f"run.py: {e}\n")
        rc = 2
    except KeyboardInterrupt as e:
        run.say(f"interrupted ({e}): cleaning up")
        rc = 130
    except Exception as e:  # noqa: BLE001 - a harness failure: report it, keep the logs
        import traceback
        traceback.print_exc()
        run.say(f"HARNESS ERROR: {e}; logs in {run.dir}")
        rc = 3
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        run.cleanup()
        signal.signal(signal.SIGINT, on_signal_default)
        signal.signal(signal.SIGTERM, on_signal_default)
    if rc == 0 and not a.keep_data:
        shutil.rmtree(os.path.join(run.dir, "data"), ignore_errors=True)
    return rc


def on_signal_default(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def run_seeds(a):
    """--seeds N: seeds a.seed .. a.seed+N-1 one after another, each reported in
    DIR/seed-S; DIR/summary.json sums them up. Exit 1 if any run found an anomaly,
    3 if any failed as a harness, 130 when interrupted (the runs so far are summed)."""
    import copy
    root = os.path.abspath(a.report)
    os.makedirs(root, exist_ok=True)
    runs, worst, rc_all = {}, {}, 0
    for seed in range(a.seed, a.seed + a.seeds):
        one = copy.copy(a)
        one.seed, one.seeds, one.report = seed, 1, os.path.join(root, f"seed-{seed}")
        print(f"==== seed {seed} ({seed - a.seed + 1} of {a.seeds}): report {one.report}", flush=True)
        rc = run_one(one)
        entry = {"exit": rc}
        try:
            with open(os.path.join(one.report, "report.json")) as f:
                r = json.load(f)
            entry.update(valid=r["valid"], acked=r["acked"],
                         anomaly_counts={k: n for k, n in r["anomaly_counts"].items() if n},
                         unavailable_s=r["unavailable_s"], bounds=r.get("bounds"))
            for k, v in r["unavailable_s"].items():
                worst[k] = max(worst.get(k, 0.0), v)
        except (OSError, ValueError, KeyError):
            entry["valid"] = None
        runs[str(seed)] = entry
        rc_all = max(rc_all, {0: 0, 1: 1, 130: 130}.get(rc, 3))
        summary = {"seeds": list(range(a.seed, seed + 1)), "minutes": a.minutes, "nemesis": a.nemeses,
                   "runs": runs, "unavailable_s": worst, "exit": rc_all}
        with open(os.path.join(root, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        if rc == 130:
            break
    bad = [s for s, e in runs.items() if e["exit"] != 0]
    print(f"==== {len(runs)} runs: {'all valid' if not bad else 'not valid: seeds ' + ', '.join(bad)}; "
          f"worst unavailability per nemesis {worst}; summary {root}/summary.json", flush=True)
    return rc_all

if __name__ == "__main__":
    sys.exit(main())
