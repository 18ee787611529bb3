"""The `groups` workload: a consumer group whose members join, leave, crash and commit
while the nemeses run, and its checker.

  groups.py member  --bootstrap B --topic T --group G --id W --inc K --out FILE
  groups.py observe --bootstrap B --topic T --group G --partitions P --out FILE

The topic `chaos-groups` (--partitions, RF --replication-factor, min.insync.replicas
--min-insync) is fed by one more idempotent acks=all producer (worker.py's produce role,
history in history/groups/gproducer.jsonl). `--group-members` member processes
(confluent-kafka, group.id chaos-group, eager range/roundrobin assignment,
enable.auto.commit=false, session.timeout.ms 6000) subscribe, read with poll() and
commit synchronously after each batch the offsets past what they read in the current
assignment. Every member process is one incarnation; members leave (SIGTERM: commit,
close, which sends LeaveGroup) and crash (SIGKILL) and come back on a seeded schedule
of their own (member_schedule: "SEED/groups"). An observer process polls the group's
committed offsets (OffsetFetch, as a consumer that never joins) every half second.

Member history (JSON lines; flushed before every commit and at every callback, so that
a SIGKILL loses nothing that a commit could cover):
  {"f":"assign"|"revoke","w","inc","gen","mid","parts":[...],"t","lost"?}
  {"f":"poll","w","inc","p","o","v","t"}
  {"f":"commit","w","inc","gen","gen_after","mid","offsets":{"p":o},"t0","t1","ok":true|false|null,"err"}
The generation is read from consumer_group_metadata() (librdkafka's serialized group
metadata: "CGMDv2:" + int32 generation id), before and after each commit.

Checks (check()):
  group_offset_regression   per partition, a successful commit (acknowledged without
                            error to its committer) lower than one acknowledged before it
                            was sent; the observer's committed offsets going down between
                            two fetches, or a fetch answering less than a commit
                            acknowledged before the fetch was sent (README: "OffsetFetch
                            never answers an older commit than one already confirmed")
  group_unconsumed          a record of the final read below the group's final committed
                            offset that no member ever polled (at-least-once)
  group_foreign_read        a member polled a partition outside its current assignment
                            (between on_assign and on_revoke/on_lost, in its own log
                            order), or two members were given one partition in the same
                            generation
  group_zombie_commit       a commit acknowledged to a member of generation g that was
                            sent after another member had been assigned partitions in a
                            generation above g (the coordinator must fence it:
                            ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID)
  group_lost, group_duplicate, group_inconsistent_offset
                            the queue checker's lost / duplicate / inconsistent-offset on
                            the groups topic (acknowledged sends against the final read),
                            and polls whose value differs from the final read's
"""
import argparse
import bisect
import json
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

TOPIC = "chaos-groups"
GROUP = "chaos-group"
KINDS = ("group_offset_regression", "group_unconsumed", "group_foreign_read", "group_zombie_commit",
         "group_lost", "group_duplicate", "group_inconsistent_offset")
NO_OFFSET = -1001  # librdkafka's OFFSET_INVALID: nothing committed
# Errors with which the coordinator refused a commit (nothing written).
REFUSED = {"ILLEGAL_GENERATION", "UNKNOWN_MEMBER_ID", "REBALANCE_IN_PROGRESS", "FENCED_INSTANCE_ID",
           "_ASSIGNMENT_LOST", "STALE_MEMBER_EPOCH", "_STATE", "OFFSET_METADATA_TOO_LARGE", "_NO_OFFSET"}


def parse_generation(cgmd):
    """The generation id in librdkafka's serialized consumer group metadata, or None."""
    try:
        b = bytes(cgmd)
    except TypeError:
        return None
    if not b.startswith(b"CGMDv2:") or len(b) < 11:
        return None
    return struct.unpack("=i", b[7:11])[0]


# ---- the member and observer processes -----------------------------------------------

class Hist:
    def __init__(self, path):
        self.f = open(path, "a", buffering=1 << 16)

    def write(self, rec, flush=False):
        self.f.write(json.dumps(rec, separators=(",", ":")) + "\n")
        if flush:
            self.f.flush()

    def close(self):
        self.f.flush()
        self.f.close()


def member_main(a):
    from confluent_kafka import Consumer, KafkaException, TopicPartition
    import worker
    hist = Hist(a.out)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    conf = dict(worker.COMMON, **{"bootstrap.servers": a.bootstrap, "group.id": a.group,
                                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                                  "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
                                  "max.poll.interval.ms": 60000, "fetch.wait.max.ms": 100,
                                  "client.id": f"chaos-{a.id}-{a.inc}"})
    c = Consumer(conf)
    assigned = set()
    pending = {}  # partition -> next offset, for records read in the current assignment
    base = {"w": a.id, "inc": a.inc}

    def gen():
        try:
            return parse_generation(c.consumer_group_metadata())
        except Exception:  # noqa: BLE001
            return None

    def mid():
        try:
            return c.memberid()
        except Exception:  # noqa: BLE001
            return None

    def on_assign(_c, parts):
        ps = sorted(tp.partition for tp in parts)
        hist.write(dict(base, f="assign", gen=gen(), mid=mid(), parts=ps, t=time.time()), flush=True)
        assigned.clear()
        assigned.update(ps)
        pending.clear()

    def on_revoke(_c, parts, lost=False):
        ps = sorted(tp.partition for tp in parts)
        hist.write(dict(base, f="revoke", gen=gen(), mid=mid(), parts=ps, t=time.time(), lost=lost), flush=True)
        assigned.difference_update(ps)
        pending.clear()

    c.subscribe([a.topic], on_assign=on_assign, on_revoke=on_revoke,
                on_lost=lambda cc, parts: on_revoke(cc, parts, lost=True))
    hist.write(dict(base, f="event", t=time.time(), what="started"), flush=True)
    counts = {"poll": 0, "commit_ok": 0, "commit_fail": 0, "commit_unknown": 0}

    def commit():
        offs = {p: o for p, o in pending.items() if p in assigned}
        if not offs:
            return
        hist.f.flush()  # the polls reach the file before a commit can cover them
        g0, m0 = gen(), mid()
        t0 = time.time()
        rec = dict(base, f="commit", gen=g0, mid=m0, offsets={str(p): o for p, o in sorted(offs.items())}, t0=t0)
        try:
            res = c.commit(offsets=[TopicPartition(a.topic, p, o) for p, o in sorted(offs.items())],
                           asynchronous=False)
            errs = {str(tp.partition): tp.error.name() for tp in (res or []) if tp.error is not None}
            if errs:
                rec.update(ok=False, err=errs)
            else:
                rec["ok"] = True
        except KafkaException as e:
            err = e.args[0]
            name = err.name() if hasattr(err, "name") else str(err)
            rec.update(ok=False if name in REFUSED else None, err=name)
        rec["t1"] = time.time()
        rec["gen_after"] = gen()
        hist.write(rec, flush=True)
        counts["commit_ok" if rec["ok"] else "commit_fail" if rec["ok"] is False else "commit_unknown"] += 1
        if rec["ok"]:
            for p, o in offs.items():
                if pending.get(p) == o:
                    del pending[p]

    while not stop:
        deadline = time.monotonic() + 0.3
        n = 0
        while n < 200 and time.monotonic() < deadline and not stop:
            try:
                m = c.poll(0.05)
            except KafkaException as e:
                hist.write(dict(base, f="event", t=time.time(), what=f"poll raised: {e}"))
                break
            if m is None:
                continue
            if m.error():
                if not m.error().code() == -191:  # _PARTITION_EOF
                    hist.write(dict(base, f="event", t=time.time(), what=f"error: {m.error().str()}"))
                continue
            p, o = m.partition(), m.offset()
            hist.write(dict(base, f="poll", p=p, o=o, v=m.value().decode(), t=time.time()))
            counts["poll"] += 1
            if p in assigned:
                pending[p] = o + 1
            n += 1
        commit()
    # Leave: commit what was read, then close (LeaveGroup).
    commit()
    try:
        c.close()
    except Exception as e:  # noqa: BLE001
        hist.write(dict(base, f="event", t=time.time(), what=f"close raised: {e}"))
    hist.write(dict(base, f="event", t=time.time(), what=f"left: {counts}"), flush=True)
    hist.close()
    print(f"member {a.id}/{a.inc}: {counts}", flush=True)


def committed_offsets(consumer, topic, partitions, timeout=5):
    """{partition: committed offset or NO_OFFSET}; raises KafkaException."""
    from confluent_kafka import TopicPartition
    tps = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=timeout)
    out = {}
    for tp in tps:
        if tp.error is not None:
            raise RuntimeError(f"committed offset of partition {tp.partition}: {tp.error}")
        out[tp.partition] = tp.offset
    return out


def group_admin_consumer(bootstrap, group):
    """A consumer of the group that never joins it: for OffsetFetch only."""
    from confluent_kafka import Consumer
    import worker
    return Consumer(dict(worker.COMMON, **{"bootstrap.servers": bootstrap, "group.id": group,
                                           "enable.auto.commit": False}))


def observe_main(a):
    from confluent_kafka import KafkaException
    hist = Hist(a.out)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    c = group_admin_consumer(a.bootstrap, a.group)
    n = 0
    while not stop:
        t0 = time.time()
        try:
            offs = committed_offsets(c, a.topic, a.partitions)
            hist.write({"f": "fetch", "w": a.id, "t0": t0, "t1": time.time(),
                        "offsets": {str(p): o for p, o in offs.items()}}, flush=True)
            n += 1
        except (KafkaException, RuntimeError) as e:
            hist.write({"f": "event", "w": a.id, "t": time.time(), "what": f"fetch failed: {e}"}, flush=True)
        time.sleep(0.5)
    hist.close()
    try:
        c.close()
    except Exception:  # noqa: BLE001
        pass
    print(f"observer {a.id}: {n} fetches", flush=True)


# ---- the schedule (pure) ---------------------------------------------------------------

def member_schedule(seed, minutes, members, warmup_s=5.0):
    """[{"at", "member", "action": "crash"|"leave", "down"}]: a pure function of its
    arguments. One member at a time is away for 1-6 s; 4-10 s between departures."""
    rng = random.Random(f"{seed}/groups")
    horizon = minutes * 60.0
    out = []
    t = warmup_s + rng.uniform(0, 3)
    while True:
        down = rng.uniform(1.0, 6.0)
        if t + down > horizon - 2.0:
            break
        out.append({"at": round(t, 2), "member": rng.randrange(members), "action": rng.choice(["crash", "leave"]),
                    "down": round(down, 2)})
        t += down + rng.uniform(4.0, 10.0)
    return out


# ---- the checker (pure) ----------------------------------------------------------------

def load(history_dir):
    """(member records in each member's file order, observer fetches, producer sends, events)."""
    import checker
    members, fetches, events = [], [], []
    sends = []
    if not os.path.isdir(history_dir):
        return members, fetches, sends, events
    for name in sorted(os.listdir(history_dir)):
        if not name.endswith(".jsonl"):
            continue
        path = os.path.join(history_dir, name)
        if name.startswith("gproducer"):
            continue
        with open(path) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                k = rec.get("f")
                if k == "fetch":
                    fetches.append(rec)
                elif k in ("assign", "revoke", "poll", "commit"):
                    members.append(rec)
                else:
                    events.append(rec)
    # The producer's sends, deduplicated as the queue checker does.
    tmp = os.path.join(history_dir, "producer")
    if os.path.isdir(tmp):
        sends, _, pevents = checker.load_history(tmp)
        events += pevents
    return members, fetches, sends, events


def check(members, fetches, sends, final_log, final_committed):
    """members: member records (each member's file order); fetches: the observer's;
    sends: the producer's; final_log: {p: [(o, v)]}; final_committed: {p: offset or
    NO_OFFSET} after every member left. Returns (anomalies, stats)."""
    import checker
    an = {k: [] for k in KINDS}
    final_at = {}
    for p, recs in final_log.items():
        for o, v in recs:
            final_at[(int(p), o)] = v

    # Ownership, replayed per member incarnation in log order.
    owned = {}
    polled = set()
    assigns = []  # (t, gen, member, mid, parts)
    reported_inconsistent = set()
    npoll = 0
    for r in members:
        key = (r["w"], r.get("inc", 0))
        if r["f"] == "assign":
            owned[key] = set(r["parts"])
            assigns.append(r)
        elif r["f"] == "revoke":
            owned.setdefault(key, set()).difference_update(r["parts"])
        elif r["f"] == "poll":
            npoll += 1
            p, o = r["p"], r["o"]
            polled.add((p, o, r["v"]))
            if p not in owned.get(key, set()):
                an["group_foreign_read"].append({"what": "polled a partition outside its assignment",
                                                 "member": r["w"], "inc": r.get("inc"), "partition": p,
                                                 "offset": o, "t": r["t"],
                                                 "assignment": sorted(owned.get(key, set()))})
            fv = final_at.get((p, o))
            if fv is not None and fv != r["v"] and (p, o, r["v"]) not in reported_inconsistent:
                reported_inconsistent.add((p, o, r["v"]))
                an["group_inconsistent_offset"].append({"partition": p, "offset": o, "polled": r["v"], "final": fv,
                                                        "member": r["w"], "inc": r.get("inc"), "t": r["t"]})
    # Two members given one partition in the same generation.
    by_gen = {}
    for r in assigns:
        g = r.get("gen")
        if g is None or g < 0:
            continue
        for p in r["parts"]:
            by_gen.setdefault((g, p), {}).setdefault(r.get("mid") or f"{r['w']}/{r.get('inc')}", r)
    for (g, p), holders in sorted(by_gen.items()):
        if len(holders) > 1:
            an["group_foreign_read"].append({"what": "one partition assigned to two members in one generation",
                                             "generation": g, "partition": p,
                                             "members": [{"member": h["w"], "inc": h.get("inc"), "mid": m,
                                                          "t": h["t"]} for m, h in holders.items()]})

    commits = [r for r in members if r["f"] == "commit"]
    ok = [c for c in commits if c.get("ok") is True]

    # Committed offsets: successful commits in real-time order.
    per_p = {}
    for c in ok:
        for p, o in c["offsets"].items():
            per_p.setdefault(int(p), []).append((c["t0"], c["t1"], o, c))
    for p, cs in per_p.items():
        by_t1 = sorted(cs, key=lambda x: x[1])
        t1s = [x[1] for x in by_t1]
        best = []  # prefix max of offsets in t1 order
        m = None
        for x in by_t1:
            if m is None or x[2] > m[2]:
                m = x
            best.append(m)
        for t0, t1, o, c in cs:
            i = bisect.bisect_left(t1s, t0)
            if i and best[i - 1][2] > o:
                prev = best[i - 1][3]
                an["group_offset_regression"].append({
                    "what": "a commit acknowledged lower than one acknowledged before it was sent",
                    "partition": p, "offset": o, "previous": best[i - 1][2],
                    "commit": {k: c.get(k) for k in ("w", "inc", "gen", "mid", "t0", "t1")},
                    "previous_commit": {k: prev.get(k) for k in ("w", "inc", "gen", "mid", "t0", "t1")}})
    # The observer's fetches: never down, never below an acknowledged commit.
    fetches = sorted(fetches, key=lambda f: f["t0"])
    for p in sorted({int(p) for f in fetches for p in f["offsets"]} | set(per_p)):
        cs = sorted(per_p.get(p, []), key=lambda x: x[1])
        t1s = [x[1] for x in cs]
        pmax = []
        m = None
        for x in cs:
            if m is None or x[2] > m[2]:
                m = x
            pmax.append(m)
        last = None
        for f in fetches:
            o = f["offsets"].get(str(p))
            if o is None:
                continue
            o = o if o >= 0 else -1
            if last is not None and last["t1"] < f["t0"] and o < last["o"]:
                an["group_offset_regression"].append({"what": "the committed offset went down between two fetches",
                                                      "partition": p, "offset": o, "previous": last["o"],
                                                      "fetch_t0": f["t0"], "previous_fetch_t1": last["t1"]})
            i = bisect.bisect_left(t1s, f["t0"])
            if i and pmax[i - 1][2] > o:
                c = pmax[i - 1][3]
                an["group_offset_regression"].append({
                    "what": "a fetch answered less than a commit acknowledged before it was sent",
                    "partition": p, "fetched": o, "acknowledged": pmax[i - 1][2], "fetch_t0": f["t0"],
                    "commit": {k: c.get(k) for k in ("w", "inc", "gen", "mid", "t0", "t1")}})
            if last is None or o >= last["o"]:
                last = {"o": o, "t1": f["t1"]}

    # Zombie commits: acknowledged with a generation older than one already handed out.
    gen_at = sorted((r["t"], r["gen"], r.get("mid")) for r in assigns if r.get("gen") is not None)
    for c in ok:
        g = c.get("gen")
        if g is None or g < 0 or c.get("gen_after") != g:
            continue
        newer = [x for x in gen_at if x[0] < c["t0"] and x[1] > g and x[2] != c.get("mid")]
        if newer:
            t, g2, m2 = newer[0]
            an["group_zombie_commit"].append({"member": c["w"], "inc": c.get("inc"), "mid": c.get("mid"),
                                              "generation": g, "offsets": c["offsets"], "t0": c["t0"],
                                              "t1": c["t1"], "newer_generation": g2, "newer_member": m2,
                                              "newer_assigned_at": t})

    # At least once: below the final committed offset, every record of the log was polled.
    polled_at = {(p, o) for p, o, v in polled if final_at.get((p, o)) == v}
    acked_values = {s["v"] for s in sends if s.get("ok") is True}
    for p, recs in sorted(final_log.items()):
        p = int(p)
        end = final_committed.get(p, NO_OFFSET)
        for o, v in recs:
            if o < end and (p, o) not in polled_at:
                an["group_unconsumed"].append({"partition": p, "offset": o, "value": v, "committed": end,
                                               "acked": v in acked_values})

    # The producer's side, with the queue checker.
    q, _ = checker.check(sends, [], final_log)
    an["group_lost"] = q["lost"]
    an["group_duplicate"] = q["duplicate"]
    an["group_inconsistent_offset"] += q["inconsistent-offset"]

    incs = {(r["w"], r.get("inc")) for r in members}
    gens = sorted({r["gen"] for r in assigns if r.get("gen") is not None})
    stats = {"member_incarnations": len(incs), "assignments": len(assigns),
             "generations": [gens[0], gens[-1]] if gens else [],
             "polls": npoll, "commits": {"ok": len(ok), "refused": sum(c.get("ok") is False for c in commits),
                                         "indeterminate": sum(c.get("ok") is None for c in commits)},
             "fetches": len(fetches), "final_committed": {str(p): o for p, o in sorted(final_committed.items())},
             "final_read": sum(len(v) for v in final_log.values()),
             "sends": {"invoked": len(sends), "ok": len(acked_values)},
             "checked_below_committed": sum(1 for p, recs in final_log.items() for o, _ in recs
                                            if o < final_committed.get(int(p), NO_OFFSET))}
    return an, stats


# ---- the workload, for run.py -----------------------------------------------------------

class Workload:
    name = "groups"

    def __init__(self, run, members=3, rate=100.0):
        self.run = run
        self.members = members
        self.rate = rate
        self.hist = os.path.join(run.hist_dir, "groups")
        self.lock = threading.Lock()
        self.procs = {}       # member index -> Popen (None while away)
        self.inc = {}         # member index -> incarnation
        self.expected_exit = set()
        self.producer = None
        self.observer = None
        self.thread = None
        self.stop_churn = threading.Event()   # no more departures
        self.idle = threading.Event()         # the churn thread has seen stop_churn
        # The churn thread outlives its departures: a process started from a thread gets its
        # parent-death signal (PR_SET_PDEATHSIG) when that thread ends.
        self.thread_exit = threading.Event()
        self.events = []      # what the churn did
        self.schedule = member_schedule(run.a.seed, run.a.minutes, members)
        self.closed = False
        self.timeline_data = None

    # processes

    def _popen(self, argv, logname):
        import topology
        return topology.popen_logged(argv, os.path.join(self.run.dir, "workers", f"{logname}.log"))

    def _start_member(self, i):
        k = self.inc.get(i, -1) + 1
        self.inc[i] = k
        wid = f"member-{i}"
        argv = [sys.executable, os.path.join(HERE, "groups.py"), "member", "--bootstrap", self.run.topo.bootstrap,
                "--topic", TOPIC, "--group", GROUP, "--id", wid, "--inc", str(k),
                "--out", os.path.join(self.hist, f"{wid}.{k}.jsonl")]
        self.procs[i] = self._popen(argv, wid)

    def start(self):
        a, topo = self.run.a, self.run.topo
        os.makedirs(os.path.join(self.hist, "producer"), exist_ok=True)
        import topology
        topo.create_topic(TOPIC, a.partitions, a.replication_factor, {"min.insync.replicas": str(a.min_insync)})
        topology.wait_for(f"topic {TOPIC} with a leader and full ISR everywhere", 60,
                          lambda: topo.healthy(TOPIC, a.partitions))
        argv = [sys.executable, os.path.join(HERE, "worker.py"), "produce", "--bootstrap", topo.bootstrap,
                "--topic", TOPIC, "--partitions", str(a.partitions), "--id", "gproducer",
                "--out", os.path.join(self.hist, "producer", "gproducer.jsonl"), "--rate", str(self.rate),
                "--message-timeout-ms", str(a.message_timeout_ms),
                "--progress", os.path.join(self.run.dir, "workers", "gproducer.progress.json")]
        self.producer = self._popen(argv, "gproducer")
        with self.lock:
            for i in range(self.members):
                self._start_member(i)
        argv = [sys.executable, os.path.join(HERE, "groups.py"), "observe", "--bootstrap", topo.bootstrap,
                "--topic", TOPIC, "--group", GROUP, "--partitions", str(a.partitions), "--id", "observer",
                "--out", os.path.join(self.hist, "observer.jsonl")]
        self.observer = self._popen(argv, "gobserver")
        self.run.say(f"workload groups: topic {TOPIC} ({a.partitions} partitions), a producer at {self.rate:g}/s, "
                     f"{self.members} members of group {GROUP} ({len(self.schedule)} departures scheduled), "
                     f"an OffsetFetch observer")

    def check_alive(self):
        for name, p in (("groups producer", self.producer), ("groups observer", self.observer)):
            if p is not None and p.poll() is not None and not self.closed:
                raise RuntimeError(f"the {name} exited ({p.returncode}); see {self.run.dir}/workers/")

    def begin(self, t0):
        self.t0 = t0
        self.thread = threading.Thread(target=self._churn, daemon=True)
        self.thread.start()

    def _churn(self):
        timeline = []
        for ev in self.schedule:
            timeline.append((ev["at"], 0, "away", ev))
            timeline.append((ev["at"] + ev["down"], 1, "back", ev))
        timeline.sort(key=lambda x: (x[0], x[1]))
        k = 0
        while not self.stop_churn.is_set():
            now = time.time() - self.t0
            while k < len(timeline) and timeline[k][0] <= now:
                _, _, what, ev = timeline[k]
                k += 1
                with self.lock:
                    if self.stop_churn.is_set():
                        break
                    self._do(what, ev)
            with self.lock:
                # A member that exited by itself (not our doing) is noted and restarted.
                for i, p in list(self.procs.items()):
                    if self.stop_churn.is_set():
                        break
                    if p is not None and p.poll() is not None and p not in self.expected_exit:
                        self.events.append({"t": time.time(), "member": i, "inc": self.inc[i],
                                            "what": f"exited by itself ({p.returncode}); restarted"})
                        self.run.say(f"WARNING: group member {i} exited by itself ({p.returncode}); restarted")
                        self._start_member(i)
            self.stop_churn.wait(0.1)
        self.idle.set()
        self.thread_exit.wait()

    def _do(self, what, ev):
        i = ev["member"]
        p = self.procs.get(i)
        if what == "away":
            if p is None or p.poll() is not None:
                return
            self.expected_exit.add(p)
            if ev["action"] == "crash":
                p.kill()
                p.wait()
            else:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
                    ev = dict(ev, action="leave (killed after 15 s)")
            self.procs[i] = None
            self.events.append({"t": time.time(), "member": i, "inc": self.inc[i], "what": ev["action"]})
        elif self.procs.get(i) is None:
            self._start_member(i)
            self.events.append({"t": time.time(), "member": i, "inc": self.inc[i], "what": "rejoin"})

    def heal(self):
        """The fault phase is over: no more departures; every member runs."""
        self.stop_churn.set()
        if self.thread is not None:
            self.idle.wait(timeout=30)
        with self.lock:
            for i in range(self.members):
                if self.procs.get(i) is None or self.procs[i].poll() is not None:
                    self._start_member(i)
                    self.events.append({"t": time.time(), "member": i, "inc": self.inc[i], "what": "rejoin (heal)"})

    def stop_load(self):
        self.closed = True  # the producer stops now; check_alive no longer applies
        p = self.producer
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.run.say("groups producer did not stop: killed")
            p.kill()
            p.wait()

    def finish(self, faults, crashes):
        import worker
        from confluent_kafka import KafkaException
        a = self.run.a
        self.heal()
        self.stop_load()
        self.closed = True
        extra_anoms = {}
        final_failed = None
        try:
            final_log, ends, complete = worker.final_read(self.run.topo.bootstrap, TOPIC, a.partitions)
        except Exception as e:  # noqa: BLE001
            final_failed = str(e)
            final_log, ends, complete = {p: [] for p in range(a.partitions)}, {}, False
            extra_anoms.setdefault("unrecovered", []).append(
                {"what": f"the final read of {TOPIC} failed", "error": str(e)})
        with open(os.path.join(self.hist, "final-read.json"), "w") as f:
            json.dump({"ends": ends, "complete": complete, "log": final_log}, f)
        # Let the group catch up with the log (bounded), then every member leaves.
        admin = group_admin_consumer(self.run.topo.bootstrap, GROUP)
        caught_up = False
        last = {}
        deadline = time.monotonic() + 60
        t_wait = time.time()
        while ends and time.monotonic() < deadline:
            try:
                last = committed_offsets(admin, TOPIC, a.partitions)
                if all(last.get(p, NO_OFFSET) >= e for p, e in ends.items() if e > 0):
                    caught_up = True
                    break
            except (KafkaException, RuntimeError):
                pass
            time.sleep(0.5)
        stall = None
        if not caught_up:
            stall = {"client": GROUP, "what": f"the group's committed offsets {last} did not reach the high "
                                              f"watermarks {ends} within 60 s",
                     "last_poll_s": None}
            self.run.say(f"WARNING: {stall['what']}")
        else:
            self.run.say(f"group {GROUP} committed up to the high watermarks {time.time() - t_wait:.1f} s after "
                         f"the load stopped")
        with self.lock:
            procs = [p for p in self.procs.values() if p is not None and p.poll() is None]
            for p in procs:
                self.expected_exit.add(p)
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.thread_exit.set()
        if self.observer is not None and self.observer.poll() is None:
            self.observer.send_signal(signal.SIGTERM)
            try:
                self.observer.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.observer.kill()
        final_committed = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                final_committed = committed_offsets(admin, TOPIC, a.partitions)
                break
            except (KafkaException, RuntimeError):
                time.sleep(0.5)
        try:
            admin.close()
        except Exception:  # noqa: BLE001
            pass
        if final_committed is None:
            extra_anoms.setdefault("unrecovered", []).append(
                {"what": f"could not read group {GROUP}'s committed offsets in 30 s after the members left"})
            final_committed = {}
        members, fetches, sends, events = load(self.hist)
        # The final committed offsets are one more observation.
        if final_committed:
            fetches = fetches + [{"t0": time.time() - 0.001, "t1": time.time(),
                                  "offsets": {str(p): o for p, o in final_committed.items()}}]
        anomalies, stats = check(members, fetches, sends, final_log, final_committed)
        if final_failed:
            for k in ("group_lost", "group_unconsumed"):
                anomalies[k] = []
        client_dups = []
        if anomalies["group_duplicate"]:
            # As for the queue: copies under another producer epoch are librdkafka's re-sends.
            import checker
            anomalies["group_duplicate"], client_dups = checker.classify_duplicates(
                anomalies["group_duplicate"], [n.data_dir for n in self.run.topo.nodes.values()], TOPIC)
            if client_dups:
                self.run.say(f"groups: {len(client_dups)} value(s) written twice by the client under a new producer "
                             f"epoch (not the broker's): group_client_duplicates in the report")
        stats["client_duplicates"] = len(client_dups)
        stats["final_high_watermarks"] = {str(p): e for p, e in ends.items()}
        stats["caught_up"] = caught_up
        stats["churn"] = len(self.events)
        anomalies.update(extra_anoms)
        self.timeline_data = {"commits": [r["t1"] for r in members if r["f"] == "commit" and r.get("ok")],
                              "churn": list(self.events)}
        self.run.say(f"groups: {stats['member_incarnations']} member incarnations, {stats['assignments']} "
                     f"assignments (generations {stats['generations']}), {stats['polls']} polls, commits "
                     f"{stats['commits']}, {stats['fetches']} observer fetches; final committed "
                     f"{stats['final_committed']}, high watermarks {stats['final_high_watermarks']}; "
                     f"{stats['checked_below_committed']} records checked consumed")
        return anomalies, stats, {"group_churn": self.events, "group_stall": stall,
                                  "group_client_duplicates": client_dups[:500],
                                  "group_schedule": self.schedule,
                                  "group_events": [e for e in events if "drained" not in e.get("what", "")][:100]}

    def cleanup(self):
        self.stop_churn.set()
        self.closed = True
        import topology
        procs = [p for p in list(self.procs.values()) if p is not None] + [self.producer, self.observer]
        for p in procs:
            if p is not None:
                topology.kill_quietly(p)
        self.thread_exit.set()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["member", "observe"])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", default=TOPIC)
    ap.add_argument("--group", default=GROUP)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--id", required=True)
    ap.add_argument("--inc", type=int, default=0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    (member_main if a.mode == "member" else observe_main)(a)


if __name__ == "__main__":
    sys.exit(main())
