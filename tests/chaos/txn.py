"""The `txn` workload: transactional producers committing and aborting while the nemeses
run, read_committed consumers, and its checker.

  txn.py produce --bootstrap B --topic T --partitions P --index I --seed S --rate R --out FILE [--progress FILE]
(its consumers are worker.py's, with --read-committed)

The topic `chaos-txn` (--partitions, RF --replication-factor, min.insync.replicas
--min-insync). `--txn-producers` producer processes (confluent-kafka, transactional.id
chaos-txn-<i>, acks=all, idempotence on) run transactions at `--txn-rate` in all: each
writes 1-5 records with unique values "t<i>-<n>-<k>" to random partitions, then commits,
or aborts with probability 0.2 (both drawn from random.Random("SEED/txn/<i>")).
`--txn-consumers` read_committed consumers are assigned every partition from offset 0
and read throughout. At the end (the faults healed, the producers stopped) the harness
waits (bounded) until every partition's last stable offset is its high watermark (every
transaction decided), reads every partition read_committed up to there, and lets the
consumers drain to the same ends.

Producer history (JSON lines, flushed before and after every transaction):
  {"f":"begin","w","txn","pinc","vals":[[value, partition], ...],"intent":"commit"|"abort","t"}
  {"f":"end","w","txn","pinc","res":"committed"|"aborted"|"unknown","commit_sent":bool,
   "stage","err","t0","t1"}
  res: committed = commit_transaction() returned; aborted = abort_transaction() returned
  (also after an abortable error); unknown = anything else (a fatal error, retries given
  up, an abort that failed; the producer is then re-created and init_transactions() run
  again, pinc counting its incarnations). commit_sent: commit_transaction() was called.
Consumer history: {"f":"poll","w","s":SESSION,"p","o","v","t"}, as worker.py's.

Checks (check()):
  txn_lost          a value of a transaction whose commit returned, or a value a
                    read_committed consumer read during the run (of a transaction that
                    may have committed), missing from the final read
  txn_aborted_read  a value of a transaction that cannot have committed (its abort
                    returned, or it ended without commit_transaction() ever being called)
                    read by a read_committed consumer (during the run or in the final read)
  txn_partial       a transaction of which the final read holds some but not all values,
                    whatever its recorded outcome (unknown ones must be all-or-nothing too)
  txn_duplicate     a value at two different offsets (or partitions) in the final read
  txn_order         a read_committed consumer's offsets on a partition going back or
                    repeating within one session
"""
import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

TOPIC = "chaos-txn"
KINDS = ("txn_lost", "txn_aborted_read", "txn_partial", "txn_duplicate", "txn_order")
ABORT_PROBABILITY = 0.2
TXN_TIMEOUT_MS = 15000     # the producers' transaction.timeout.ms: an abandoned transaction is aborted by then
END_RETRY_S = 60.0         # how long commit_transaction / abort_transaction are retried on retriable errors
CALL_TIMEOUT_S = 10.0      # one call of init/commit/abort_transaction
LIST_LIMIT = 500


class Hist:
    def __init__(self, path):
        self.f = open(path, "a", buffering=1 << 16)
        self.last_flush = time.monotonic()

    def write(self, rec, flush=False):
        self.f.write(json.dumps(rec, separators=(",", ":")) + "\n")
        if flush or time.monotonic() - self.last_flush > 0.5:
            self.f.flush()
            self.last_flush = time.monotonic()

    def close(self):
        self.f.flush()
        self.f.close()


def txn_values(index, n, rng, partitions):
    """The values of producer `index`'s transaction n, their partitions, and the intended
    outcome: a pure function of the rng's state."""
    k = rng.randint(1, 5)
    vals = [[f"t{index}-{n}-{j}", rng.randrange(partitions)] for j in range(k)]
    intent = "abort" if rng.random() < ABORT_PROBABILITY else "commit"
    return vals, intent


# ---- the producer and consumer processes -----------------------------------------------

def produce_main(a):
    from confluent_kafka import KafkaException, Producer
    import worker
    hist = Hist(a.out)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    wid = f"txn-producer-{a.index}"
    conf = dict(worker.COMMON, **{"bootstrap.servers": a.bootstrap, "transactional.id": f"chaos-txn-{a.index}",
                                  "enable.idempotence": True, "acks": "all", "linger.ms": 5,
                                  "request.timeout.ms": 5000, "transaction.timeout.ms": TXN_TIMEOUT_MS,
                                  "client.id": f"chaos-{wid}"})
    rng = random.Random(f"{a.seed}/txn/{a.index}")
    counts = {"committed": 0, "aborted": 0, "unknown": 0}
    state = {"p": None, "pinc": -1, "last_commit": None}

    def event(what):
        hist.write({"f": "event", "w": wid, "t": time.time(), "what": what}, flush=True)

    def new_producer():
        """A new producer with init_transactions() done (retried until it is, or until stopped)."""
        old = state["p"]
        if old is not None:
            try:
                old.purge(in_queue=True, in_flight=True)
            except Exception:  # noqa: BLE001
                pass
        state["p"] = None
        failures = 0
        while True:
            state["pinc"] += 1
            p = Producer(conf)
            while True:
                try:
                    p.init_transactions(CALL_TIMEOUT_S)
                    event(f"producer {state['pinc']}: init_transactions done")
                    state["p"] = p
                    return True
                except KafkaException as e:
                    err = e.args[0]
                    if stop:
                        event(f"producer {state['pinc']}: stopped before init_transactions succeeded ({err.str()})")
                        return False
                    if err.retriable() and not err.fatal():
                        event(f"producer {state['pinc']}: init_transactions retriable: {err.str()}")
                        continue
                    # Fatal (e.g. fenced) or not retriable: a new producer, a bounded number
                    # of times in a row (a wrong configuration would never succeed).
                    failures += 1
                    event(f"producer {state['pinc']}: init_transactions failed ({failures}): {err.str()}; "
                          f"new producer")
                    if failures >= 20:
                        raise
                    break

    def end_call(fn):
        """commit_transaction / abort_transaction, retried on retriable errors for END_RETRY_S."""
        deadline = time.monotonic() + END_RETRY_S
        while True:
            try:
                fn(CALL_TIMEOUT_S)
                return
            except KafkaException as e:
                err = e.args[0]
                if err.fatal() or err.txn_requires_abort() or not err.retriable() or time.monotonic() > deadline:
                    raise

    def progress():
        if a.progress:
            worker.write_json_atomic(a.progress, dict(counts, last_commit=state["last_commit"], t=time.time()))

    if not new_producer():
        hist.close()
        return
    period = 1.0 / a.rate
    next_t = time.monotonic()
    n = 0
    while not stop:
        now = time.monotonic()
        if now < next_t:
            time.sleep(min(0.1, next_t - now))  # pacing to the rate, not a wait for a condition
            continue
        next_t = max(next_t + period, now)
        n += 1
        vals, intent = txn_values(a.index, n, rng, a.partitions)
        p = state["p"]
        t0 = time.time()
        hist.write({"f": "begin", "w": wid, "txn": n, "pinc": state["pinc"], "vals": vals, "intent": intent,
                    "t": t0}, flush=True)
        rec = {"f": "end", "w": wid, "txn": n, "pinc": state["pinc"], "commit_sent": False, "t0": t0}
        stage = "begin"
        renew = False
        try:
            p.begin_transaction()
            stage = "produce"
            for v, part in vals:
                p.produce(a.topic, value=v.encode(), key=v.encode(), partition=part)
            if intent == "commit":
                stage = "commit"
                rec["commit_sent"] = True
                end_call(p.commit_transaction)
                rec["res"] = "committed"
            else:
                stage = "abort"
                end_call(p.abort_transaction)
                rec["res"] = "aborted"
        except (KafkaException, BufferError) as e:
            err = e.args[0] if isinstance(e, KafkaException) else None
            rec["err"] = err.str() if err is not None else f"BufferError: {e}"
            if err is not None and err.fatal():
                rec["res"] = "unknown"
                renew = True
            elif stage != "abort" and (err is None or err.txn_requires_abort() or stage in ("begin", "produce")):
                # Abort what there is; the transaction is aborted only if the abort returns.
                try:
                    end_call(p.abort_transaction)
                    rec["res"] = "aborted"
                    rec["aborted_after_error"] = True
                except KafkaException as e2:
                    rec["res"] = "unknown"
                    rec["abort_err"] = e2.args[0].str()
                    renew = True
            else:
                # A failed abort, or a commit given up on: the outcome is unknown.
                rec["res"] = "unknown"
                renew = True
        rec["stage"] = stage
        rec["t1"] = time.time()
        hist.write(rec, flush=True)
        counts[rec["res"]] += 1
        if rec["res"] == "committed":
            state["last_commit"] = rec["t1"]
        progress()
        if renew:
            event(f"txn {n}: {rec['res']} at {stage} ({rec.get('err')}); new producer")
            if not new_producer():
                break
    event(f"stopped: {n} transactions {counts}")
    progress()
    hist.close()
    if state["p"] is not None:
        try:
            state["p"].purge(in_queue=True, in_flight=True)
        except Exception:  # noqa: BLE001
            pass
    print(f"txn producer {a.index}: {n} transactions {counts}", flush=True)


def final_read_committed(bootstrap, topic, partitions, timeout_s=120):
    """Waits until every partition's last stable offset is its high watermark (every
    transaction decided; no producer writes any more), then reads every partition
    read_committed from 0 up to there. Returns ({p: [(o, v)]}, {p: end}, complete,
    seconds waited for the LSO). Raises TimeoutError when the LSO does not reach the
    high watermark in time (the details in its message)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition
    import worker
    base = dict(worker.COMMON, **{"bootstrap.servers": bootstrap, "enable.auto.commit": False,
                                  "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100})
    cu = Consumer(dict(base, **{"group.id": "chaos-txn-final-u", "isolation.level": "read_uncommitted"}))
    cc = Consumer(dict(base, **{"group.id": "chaos-txn-final", "isolation.level": "read_committed",
                                "enable.partition.eof": True}))
    deadline = time.monotonic() + timeout_s
    t_start = time.monotonic()
    try:
        last = {}
        while True:
            ends = {}
            for p in range(partitions):
                tp = TopicPartition(topic, p)
                try:
                    _, hw = cu.get_watermark_offsets(tp, timeout=5, cached=False)
                    _, lso = cc.get_watermark_offsets(tp, timeout=5, cached=False)
                except KafkaException as e:
                    last[p] = f"error: {e}"
                    break
                last[p] = {"lso": lso, "hw": hw}
                if lso != hw or hw < 0:
                    break
                ends[p] = hw
            if len(ends) == partitions:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the last stable offsets did not reach the high watermarks in {timeout_s} s: "
                                   f"{last}")
            time.sleep(0.2)  # poll interval; the condition is checked above, bounded by the deadline
        waited = time.monotonic() - t_start
        log, complete = worker.read_to_ends(cc, topic, ends, deadline)
        return log, ends, complete, waited
    finally:
        for c in (cu, cc):
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass


# ---- the checker (pure) ----------------------------------------------------------------

def load(history_dir):
    """(transactions, polls, events) from the producers' and consumers' JSON lines."""
    recs = []
    if os.path.isdir(history_dir):
        for name in sorted(os.listdir(history_dir)):
            if not name.endswith(".jsonl"):
                continue
            with open(os.path.join(history_dir, name)) as f:
                for line in f:
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        recs.append(json.loads(line))
                    except ValueError:
                        continue  # a torn last line of a killed process
    txns = merge([r for r in recs if r.get("f") in ("begin", "end")])
    polls = [r for r in recs if r.get("f") == "poll"]
    events = [r for r in recs if r.get("f") not in ("begin", "end", "poll")]
    return txns, polls, events


def merge(records):
    """Producer begin/end records -> one dict per transaction: w, txn, vals, intent, res
    (committed, aborted, unknown), commit_sent (True, False, or None when the transaction
    has no end record: not known), t0, t1, err. A begin without an end is unknown."""
    out = {}
    for r in records:
        key = (r["w"], r["txn"])
        if r["f"] == "begin":
            out[key] = {"w": r["w"], "txn": r["txn"], "pinc": r.get("pinc"), "vals": [list(x) for x in r["vals"]],
                        "intent": r["intent"], "res": "unknown", "commit_sent": None, "t0": r.get("t"), "t1": None}
        elif key in out:
            t = out[key]
            t.update(res=r["res"], commit_sent=r.get("commit_sent"), t1=r.get("t1"), stage=r.get("stage"))
            if r.get("err"):
                t["err"] = r["err"]
    return sorted(out.values(), key=lambda t: (t["w"], t["txn"]))


def never_committed(t):
    """The transaction cannot have committed: its abort returned, or it ended without
    commit_transaction() ever being called."""
    return t["res"] == "aborted" or (t["res"] == "unknown" and t.get("commit_sent") is False)


def check(txns, polls, final_log, final_complete=True):
    """txns: merge()'s; polls: the consumers' (each consumer's file order); final_log:
    {p: [(o, v)]}, the final read_committed read; final_complete: it reached every end
    (else lost and partial are not judged). Returns (anomalies, stats)."""
    an = {k: [] for k in KINDS}
    owner = {}
    for t in txns:
        for v, p in t["vals"]:
            owner[v] = (t, p)

    def brief(t):
        return {"producer": t["w"], "txn": t["txn"], "res": t["res"], "intent": t["intent"],
                "commit_sent": t.get("commit_sent"), "t0": t.get("t0"), "t1": t.get("t1")}

    final_at = {}   # value -> [(p, o)]
    for p, recs in final_log.items():
        for o, v in recs:
            final_at.setdefault(v, []).append((int(p), o))

    # txn_duplicate: a value at two offsets of the final read.
    for v, locs in sorted(final_at.items()):
        if len(set(locs)) > 1:
            rec = {"value": v, "at": sorted(set(locs))}
            if v in owner:
                rec.update(brief(owner[v][0]))
            an["txn_duplicate"].append(rec)

    # txn_aborted_read: a value of a transaction that cannot have committed, read anywhere.
    reported = set()
    reads = [(r["w"], r.get("s", 0), r["p"], r["o"], r["v"], r.get("t")) for r in polls]
    reads += [("final", 0, int(p), o, v, None) for p, recs in final_log.items() for o, v in recs]
    for w, s, p, o, v, t_read in reads:
        own = owner.get(v)
        if own is None or not never_committed(own[0]):
            continue
        key = (w, v, p, o)
        if key in reported:
            continue
        reported.add(key)
        an["txn_aborted_read"].append(dict(brief(own[0]), value=v, reader=w, session=s, partition=p, offset=o,
                                           read_at=t_read))

    # txn_lost and txn_partial against a complete final read.
    polled_values = {r["v"] for r in polls}
    if final_complete:
        for t in txns:
            present = [v for v, _ in t["vals"] if v in final_at]
            missing = [[v, p] for v, p in t["vals"] if v not in final_at]
            for v, p in missing:
                why = []
                if t["res"] == "committed":
                    why.append("commit returned")
                if v in polled_values and not never_committed(t):
                    why.append("read during the run")  # (if it cannot have committed: txn_aborted_read)
                if why:
                    an["txn_lost"].append(dict(brief(t), value=v, partition=p, why=why))
            if present and missing:
                an["txn_partial"].append(dict(brief(t), present=present, missing=[v for v, _ in missing]))

    # txn_order: per consumer session and partition, offsets going back or repeating.
    last = {}
    for r in polls:
        key = (r["w"], r.get("s", 0), r["p"])
        prev = last.get(key)
        if prev is not None and r["o"] <= prev["o"]:
            an["txn_order"].append({"reader": r["w"], "session": r.get("s", 0), "partition": r["p"],
                                    "prev": prev["o"], "offset": r["o"], "value": r["v"], "polled_at": r.get("t")})
        last[key] = r

    res = {"committed": 0, "aborted": 0, "unknown": 0}
    for t in txns:
        res[t["res"]] = res.get(t["res"], 0) + 1
    stats = {
        "begun": len(txns), **res,
        "unknown_commit_sent": sum(1 for t in txns if t["res"] == "unknown" and t.get("commit_sent") is not False),
        "aborted_after_error": sum(1 for t in txns if t["res"] == "aborted" and t["intent"] == "commit"),
        "intent": {"commit": sum(t["intent"] == "commit" for t in txns),
                   "abort": sum(t["intent"] == "abort" for t in txns)},
        "values_written": len(owner),
        "polled": len(polls),
        "values_read": len(polled_values | set(final_at)),
        "final_read": sum(len(recs) for recs in final_log.values()),
        "final_complete": final_complete,
        "unknown_in_final": {
            "all": sum(1 for t in txns if t["res"] == "unknown" and t["vals"]
                       and all(v in final_at for v, _ in t["vals"])),
            "none": sum(1 for t in txns if t["res"] == "unknown" and not any(v in final_at for v, _ in t["vals"]))},
        "foreign_values": len([v for v in polled_values | set(final_at) if v not in owner]),
    }
    return an, stats


# ---- the workload, for run.py -----------------------------------------------------------

class Workload:
    name = "txn"

    def __init__(self, run, producers=2, rate=10.0, consumers=1):
        self.run = run
        self.producers = producers
        self.rate = rate
        self.consumers = consumers
        self.hist = os.path.join(run.hist_dir, "txn")
        self.procs = {}   # id -> Popen
        self.closed = False
        self.stalls = []
        self.t_heal = None
        self.t0 = None
        self.drain_file = os.path.join(run.dir, "workers", "txn-drain.json")
        self.timeline_data = None  # no panel of its own in timeline.png

    def _popen(self, argv, logname):
        import topology
        return topology.popen_logged(argv, os.path.join(self.run.dir, "workers", f"{logname}.log"))

    def _progress_file(self, i):
        return os.path.join(self.run.dir, "workers", f"txn-producer-{i}.progress.json")

    def start(self):
        import topology
        a, topo = self.run.a, self.run.topo
        os.makedirs(self.hist, exist_ok=True)
        topo.create_topic(TOPIC, a.partitions, a.replication_factor, {"min.insync.replicas": str(a.min_insync)})
        topology.wait_for(f"topic {TOPIC} with a leader and full ISR everywhere", 60,
                          lambda: topo.healthy(TOPIC, a.partitions))
        for i in range(self.consumers):
            wid = f"txn-consumer-{i}"
            self.procs[wid] = self._popen(
                [sys.executable, os.path.join(HERE, "worker.py"), "consume", "--read-committed",
                 "--bootstrap", topo.bootstrap, "--topic", TOPIC, "--partitions", str(a.partitions), "--id", wid,
                 "--out", os.path.join(self.hist, f"{wid}.jsonl"), "--drain", self.drain_file], wid)
        for i in range(self.producers):
            wid = f"txn-producer-{i}"
            self.procs[wid] = self._popen(
                [sys.executable, os.path.join(HERE, "txn.py"), "produce", "--bootstrap", topo.bootstrap,
                 "--topic", TOPIC, "--partitions", str(a.partitions), "--index", str(i), "--seed", str(a.seed),
                 "--rate", str(self.rate / self.producers), "--out", os.path.join(self.hist, f"{wid}.jsonl"),
                 "--progress", self._progress_file(i)], wid)
        self.run.say(f"workload txn: topic {TOPIC} ({a.partitions} partitions), {self.producers} transactional "
                     f"producers ({self.rate:g} transactions/s in all, 1-5 records each, {ABORT_PROBABILITY:g} "
                     f"aborted), {self.consumers} read_committed consumer(s)")

    def check_alive(self):
        if self.closed:
            return
        for wid, p in self.procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"txn client {wid} exited ({p.returncode}); see {self.run.dir}/workers/{wid}.log")

    def begin(self, t0):
        self.t0 = t0

    def heal(self):
        self.t_heal = time.time()

    def _last_commit(self, i):
        try:
            with open(self._progress_file(i)) as f:
                return json.load(f).get("last_commit")
        except (OSError, ValueError):
            return None

    def stop_load(self):
        if self.closed:
            return
        # Each producer commits a transaction after the heal (bounded), then all stop.
        t_heal = self.t_heal or time.time()
        try:
            import topology
            topology.wait_for("a committed transaction from every txn producer after healing", 60,
                              lambda: all((self._last_commit(i) or 0) > t_heal for i in range(self.producers)),
                              interval=0.2)
        except TimeoutError:
            for i in range(self.producers):
                last = self._last_commit(i)
                if not last or last <= t_heal:
                    st = {"client": f"txn-producer-{i}", "what": "no committed transaction in the 60 s after healing",
                          "last_commit_s": round(last - self.t0, 1) if last and self.t0 else None}
                    self.stalls.append(st)
                    self.run.say(f"WARNING: {st['client']}: {st['what']}")
        self.closed = True
        producers = [(wid, p) for wid, p in self.procs.items() if wid.startswith("txn-producer")]
        for _, p in producers:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for wid, p in producers:
            try:
                # A transaction in progress finishes first (its commit or abort retried ≤ 2 × 60 s).
                p.wait(timeout=2 * END_RETRY_S + 30)
            except subprocess.TimeoutExpired:
                self.run.say(f"{wid} did not stop: killed (its last transaction stays unknown)")
                p.kill()
                p.wait()

    def finish(self, faults, crashes):
        self.stop_load()
        a = self.run.a
        extra = {}
        complete, ends, waited = False, {}, None
        try:
            final_log, ends, complete, waited = final_read_committed(self.run.topo.bootstrap, TOPIC, a.partitions)
        except Exception as e:  # noqa: BLE001
            final_log = {p: [] for p in range(a.partitions)}
            self.run.say(f"NOT RECOVERED: the final read_committed read of {TOPIC} failed: {e}")
            extra.setdefault("unrecovered", []).append({"what": f"the final read of {TOPIC} failed",
                                                        "error": str(e)[:2000]})
        else:
            if not complete:
                extra.setdefault("unrecovered", []).append(
                    {"what": f"the final read of {TOPIC} did not reach every last stable offset in 120 s",
                     "ends": ends})
        with open(os.path.join(self.hist, "final-read.json"), "w") as f:
            json.dump({"ends": ends, "complete": complete, "log": final_log}, f)
        import topology
        import worker
        worker.write_json_atomic(self.drain_file, {str(p): e for p, e in ends.items()} if ends else {})
        for wid, p in self.procs.items():
            if wid.startswith("txn-consumer"):
                if not ends:
                    p.send_signal(signal.SIGTERM)
                topology.wait_or_stop(p)
        txns, polls, events = load(self.hist)
        anomalies, stats = check(txns, polls, final_log, final_complete=complete)
        stats["final_ends"] = {str(p): e for p, e in ends.items()}
        stats["lso_wait_s"] = round(waited, 2) if waited is not None else None
        stats["options"] = {"producers": self.producers, "rate": self.rate, "consumers": self.consumers,
                            "transaction_timeout_ms": TXN_TIMEOUT_MS}
        for e in events:
            if "drain timed out" in e.get("what", ""):
                self.stalls.append({"client": e.get("w"), "what": "did not read to the end within 60 s of the final "
                                                                  "read", "detail": e["what"][:300]})
                self.run.say(f"WARNING: {e.get('w')} did not read to the end: {e['what'][:200]}")
        anomalies.update(extra)
        self.run.say(f"txn: {stats['begun']} transactions begun, {stats['committed']} committed, {stats['aborted']} "
                     f"aborted, {stats['unknown']} unknown ({stats['unknown_commit_sent']} after a commit was sent); "
                     f"{stats['polled']} polled read_committed, {stats['final_read']} in the final read "
                     f"(LSO reached the high watermarks after {stats['lso_wait_s']} s)")
        return anomalies, stats, {"txn_stalls": self.stalls,
                                  "txn_events": [e for e in events if "drained" not in e.get("what", "")][:200]}

    def cleanup(self):
        self.closed = True
        import topology
        for p in self.procs.values():
            topology.kill_quietly(p)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["produce"])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", default=TOPIC)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--index", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rate", type=float, default=5.0, help="transactions/s of this producer")
    ap.add_argument("--out", required=True)
    ap.add_argument("--progress")
    a = ap.parse_args()
    produce_main(a)


if __name__ == "__main__":
    sys.exit(main())
