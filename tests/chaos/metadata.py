"""The `metadata` workload: concurrent topic create, delete, config change and read
through the admin API of random nodes, and a linearizability checker for it.

  metadata.py client --admins 1=http://A:9644,2=... --topics N --clients C --seed S --out FILE

Each of C client threads loops: pick a topic (chaos-meta-0..N-1), an operation and a
node (seeded), send it, record it, sleep 0-150 ms. Operations and what the harness
makes of the answers (src/admin/topics.rs, src/error.rs):

  create  POST   /v1/topics {"name", partitions N (1 or 2), RF 1, configs {"retention.ms": V}}
          201 ok (its body describes the topic: one more read); 409 fail (the topic
          exists); 404 indeterminate (committed, then the topic was gone when the
          answer described it)
  delete  DELETE /v1/topics/{name}          204 ok; 404 fail (no such topic)
  patch   PATCH  /v1/topics/{name}/configs {"retention.ms": V}   200 ok; 404 fail
  read    GET    /v1/topics/{name}          200: "V:N" (retention.ms, partitions); 404: absent

V is unique per operation, so a read names the write it saw; N tells a create's topic
from another create's whose configs landed on it. A 5xx answer, a timeout or a
connection reset after the request was sent is indeterminate (may or may not have
taken effect, at any time after it was sent); a refused connection is a request never
sent (dropped); another 4xx was refused by validation before anything was proposed
(dropped). History lines: {"f":"op","w","k","topic","v","n","node","t0","t1","st","res",
"obs","err"} with res ok|fail|info|refused|error.

The checker (check()): per topic (topics are independent), a register whose state is
None (no topic) or "V:N" (a patch replaces V, keeps N), and a Wing-Gong search with
memoization (the Knossos approach) over the topic's history:

  1. writes: the creates, deletes and patches alone must be linearizable (the answers
     201/409, 204/404, 200/404 say what state each saw). Failure: metadata_nonlinearizable.
  2. reads as Strom promises them: every node answers GETs from its own applied metadata
     image (README, "The admin API"), which is a prefix of the one committed log. So a
     read may be stale, but it must return the state after some prefix of the writes'
     linearization, no earlier than what the same node answered before (monotonic per
     node process: a killed node's chain starts over), no earlier than the writes that
     node acknowledged before the read began (a write is answered once the answering
     node applied it), and not including writes invoked after the read returned.
     Failure (with 1 passing): metadata_nonsequential_read.
  3. strict linearizability of writes and reads together: informational only (reads
     from a follower's or a deposed controller's local image are allowed to be stale).
"""
import argparse
import http.client
import json
import os
import random
import signal
import socket
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PREFIX = "chaos-meta-"
CONFIG_KEY = "retention.ms"
KINDS = ("metadata_nonlinearizable", "metadata_nonsequential_read")
WRITE_TIMEOUT_S = 15.0  # the server answers within ~11 s (5 s to the controller, 5 s to apply, 1 s describe)
READ_TIMEOUT_S = 4.0
BUDGET = 400_000        # search states per topic and check before giving up ("unknown")
INF = float("inf")


# ---- the client ---------------------------------------------------------------------

def request(url, method, path, body, timeout):
    """(status, parsed body, None) or (None, None, 'refused'|'timeout: ...'|'error: ...').
    'refused': the connection was refused, so nothing was sent."""
    host = url.split("//", 1)[1]
    h, _, p = host.partition(":")
    conn = http.client.HTTPConnection(h, int(p or 80), timeout=timeout)
    try:
        try:
            conn.connect()
        except ConnectionRefusedError:
            return None, None, "refused"
        except OSError as e:
            return None, None, f"connect: {e}"  # e.g. a connect timeout: nothing sent, but be safe
        data = json.dumps(body).encode() if body is not None else None
        try:
            conn.request(method, path, body=data, headers={"content-type": "application/json"})
            r = conn.getresponse()
            text = r.read()
        except socket.timeout:
            return None, None, "timeout"
        except OSError as e:
            return None, None, f"error: {e}"
        except http.client.HTTPException as e:
            return None, None, f"error: {e!r}"
        try:
            parsed = json.loads(text) if text else None
        except ValueError:
            parsed = text.decode(errors="replace")
        return r.status, parsed, None
    finally:
        conn.close()


def observed(body):
    """The state a topic description (GET /v1/topics/{name}, a create's 201) shows:
    "V:N" (its retention.ms and partition count), or "V" from a configs map."""
    if not isinstance(body, dict):
        return None
    configs = body.get("configs", body)
    v = configs.get(CONFIG_KEY) if isinstance(configs, dict) else None
    if v is None:
        return None
    parts = body.get("partitions")
    return f"{v}:{len(parts)}" if isinstance(parts, list) else str(v)


def classify(kind, status, body, err):
    """(res, observed) for one answer: res in ok|fail|info|refused|error (see the module
    doc); observed is the state a read, or a create's answer, shows (None: absent)."""
    if err == "refused":
        return "refused", None
    if status is None:
        return ("error" if kind == "read" else "info"), None
    if kind == "read":
        if status == 200 and isinstance(body, dict):
            obs = observed(body)
            return ("ok", obs) if obs is not None else ("error", None)
        if status == 404:
            return "ok", None
        return "error", None
    expected = {"create": (201, 409), "delete": (204, 404), "patch": (200, 404)}[kind]
    if status == expected[0]:
        return "ok", observed(body) if kind == "create" else None
    if status == expected[1]:
        return "fail", None
    if kind == "create" and status == 404:
        return "info", None
    if status >= 500:
        return "info", None
    return "error", None


def client_main(a):
    admins = {}
    for part in a.admins.split(","):
        nid, url = part.split("=", 1)
        admins[int(nid)] = url
    nodes = sorted(admins)
    topics = [f"{PREFIX}{i}" for i in range(a.topics)]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    out = open(a.out, "a", buffering=1 << 16)
    lock = threading.Lock()
    counts = {}

    def write(rec):
        with lock:
            out.write(json.dumps(rec, separators=(",", ":")) + "\n")
            counts[rec["res"]] = counts.get(rec["res"], 0) + 1

    def flusher():
        while not stop.wait(0.5):
            with lock:
                out.flush()

    def run(ci):
        rng = random.Random(f"{a.seed}/metadata/{ci}")
        seq = 0
        while not stop.is_set():
            topic = rng.choice(topics)
            kind = rng.choices(["create", "delete", "patch", "read"], weights=[2, 1.5, 2, 4.5])[0]
            node = rng.choice(nodes)
            seq += 1
            v = str(10_000_000 + ci * 1_000_000 + seq) if kind in ("create", "patch") else None
            n = rng.choice([1, 2])
            if kind == "create":
                method, path, body = "POST", "/v1/topics", {"name": topic, "partitions": n, "replication_factor": 1,
                                                            "configs": {CONFIG_KEY: v}}
            elif kind == "delete":
                method, path, body = "DELETE", f"/v1/topics/{topic}", None
            elif kind == "patch":
                method, path, body = "PATCH", f"/v1/topics/{topic}/configs", {CONFIG_KEY: v}
            else:
                method, path, body = "GET", f"/v1/topics/{topic}", None
            t0 = time.time()
            status, rbody, err = request(admins[node], method, path, body,
                                         READ_TIMEOUT_S if kind == "read" else WRITE_TIMEOUT_S)
            t1 = time.time()
            res, obs = classify(kind, status, rbody, err)
            rec = {"f": "op", "w": f"{a.id}.{ci}", "k": kind, "topic": topic, "v": v, "node": node, "t0": t0,
                   "t1": t1, "st": status, "res": res}
            if kind == "create":
                rec["n"] = n
            if (kind == "read" and res == "ok") or (kind == "create" and obs is not None):
                rec["obs"] = obs
            if err or (status is not None and status >= 300 and res != "fail"):
                rec["err"] = err or (rbody if isinstance(rbody, (dict, str)) else None)
            write(rec)
            stop.wait(rng.uniform(0, 0.15))

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(a.clients)]
    fl = threading.Thread(target=flusher, daemon=True)
    fl.start()
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(timeout=0.5)
    with lock:
        out.write(json.dumps({"f": "event", "w": a.id, "t": time.time(), "what": f"stopped: {counts}"}) + "\n")
        out.flush()
    print(f"metadata client {a.id}: {counts}", flush=True)


# ---- the checker (pure) ---------------------------------------------------------------

def load(history_dir):
    ops, events = [], []
    if not os.path.isdir(history_dir):
        return ops, events
    for name in sorted(os.listdir(history_dir)):
        if not name.endswith(".jsonl"):
            continue
        with open(os.path.join(history_dir, name)) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                (ops if rec.get("f") == "op" else events).append(rec)
    return ops, events


def _down_starts(restarts, node):
    return sorted(restarts.get(node, restarts.get(str(node), [])))


def prepare(ops):
    """The ops that say something, normalized: [{id, proc, k, v, res, t0, t1, node, obs}],
    with t1 = inf for indeterminate ones, per topic: {topic: [op, ...]}. A create's value
    is "V:N" (its retention.ms and partition count); a create's 201 answer, which
    describes the topic as the answering node saw it after applying the create, is one
    more read (after the create, on that node)."""
    per = {}
    for i, o in enumerate(ops):
        if o.get("res") not in ("ok", "fail", "info"):
            continue
        if o["k"] == "read" and o["res"] != "ok":
            continue
        v = o.get("v")
        if o["k"] == "create" and o.get("n") is not None:
            v = f"{v}:{o['n']}"
        n = {"id": o.get("id", i), "proc": o.get("w"), "k": o["k"], "v": v, "res": o["res"],
             "t0": o["t0"], "t1": INF if o["res"] == "info" else o["t1"], "node": o.get("node"),
             "obs": o.get("obs") if o["k"] == "read" else None, "st": o.get("st")}
        per.setdefault(o["topic"], []).append(n)
        if o["k"] == "create" and o["res"] == "ok" and o.get("obs") is not None:
            per[o["topic"]].append({"id": f"{n['id']}/answer", "proc": f"{o.get('w')}/answer", "k": "read", "v": None,
                                    "res": "ok", "t0": o["t0"], "t1": o["t1"], "node": o.get("node"),
                                    "obs": o["obs"], "st": o.get("st"), "after": n["id"]})
    return per


def _val(state):
    """The retention.ms part of a state "V:N" (or "V")."""
    return state.split(":", 1)[0] if state is not None else None


def _with_val(state, v):
    """A state with its retention.ms replaced by v (the partition count kept)."""
    return f"{v}:{state.split(':', 1)[1]}" if ":" in state else v


def _step(w, state):
    """(legal, new state) of write w from state (None: no topic). Indeterminate writes
    are only applied where they change the state (as a no-op they are the same as never
    having happened, which keeps more options open)."""
    k, res = w["k"], w["res"]
    exists = state is not None
    if k == "create":
        if res == "ok":
            return (not exists), w["v"]
        if res == "fail":
            return exists, state
        return (not exists), w["v"]
    if k == "delete":
        if res == "ok":
            return exists, None
        if res == "fail":
            return (not exists), state
        return exists, None
    if k == "patch":
        if res == "ok":
            return exists, _with_val(state, w["v"]) if exists else None
        if res == "fail":
            return (not exists), state
        return exists and _val(state) != w["v"], _with_val(state, w["v"]) if exists else None
    raise ValueError(k)


def _epochs(restarts, node, t):
    """How many new processes of the node had begun (after a kill or a crash) before time t."""
    import bisect
    return bisect.bisect_right(_down_starts(restarts, node), t)


def search(ops, mode="relaxed", restarts=None, budget=BUDGET, initial=None, time_limit_s=60.0):
    """Wing-Gong search with memoization over one topic's history.

    mode: "writes" (reads ignored), "relaxed" (reads as Strom promises them, see the
    module doc) or "strict" (every read linearizable too). restarts: {node: [times it
    was killed or crashed]}. Returns {"valid": True|False|None (budget or time
    exhausted), "explored": states, "writes": n, "reads": n, and on failure "stuck"}.

    The search linearizes writes one at a time (a write is a candidate once every write
    that completed before it began is linearized and every read that completed before it
    began is placed); after each, the reads that can be placed at the new state are
    placed greedily (a read changes nothing, and placing it as early as possible only
    loosens the constraints on others). Reads form chains ("groups"): in strict mode all
    reads (real-time order), in relaxed mode the reads of one node process (a node's
    reads are monotonic until it is killed; a read also follows the writes that node
    acknowledged before it began)."""
    import time as _time
    restarts = restarts or {}
    writes = [o for o in ops if o["k"] != "read"]
    reads = [o for o in ops if o["k"] == "read"] if mode != "writes" else []
    seen = {_val(r["obs"]) for r in reads if r["obs"] is not None}
    # An indeterminate patch whose value no read saw changes nothing anyone observed:
    # leaving it out is sound (and keeps the search small).
    writes = [w for w in writes if not (w["res"] == "info" and w["k"] == "patch" and w["v"] not in seen)]
    writes.sort(key=lambda o: o["t0"])
    W, R = len(writes), len(reads)
    det = [w["res"] != "info" for w in writes]
    det_mask = sum(1 << i for i in range(W) if det[i])
    all_reads = (1 << R) - 1
    wt0 = [w["t0"] for w in writes]
    wpred = [0] * W
    by_t1 = sorted((i for i in range(W) if det[i]), key=lambda i: writes[i]["t1"])
    # wpred[i]: determinate writes that completed before write i began (a prefix of by_t1).
    k = 0
    acc = 0
    for i in sorted(range(W), key=lambda i: wt0[i]):
        while k < len(by_t1) and writes[by_t1[k]]["t1"] < wt0[i]:
            acc |= 1 << by_t1[k]
            k += 1
        wpred[i] = acc

    # Read groups (chains), each sorted by t0.
    def group_of(r):
        if mode == "strict":
            return 0
        return (r["node"], _epochs(restarts, r["node"], r["t0"]))

    groups = {}
    for r in sorted(reads, key=lambda r: r["t0"]):
        groups.setdefault(group_of(r), []).append(r)
    reads = [r for g in sorted(groups, key=str) for r in groups[g]]
    gindex = []  # (first index, last index + 1) of each group in `reads`
    pos = 0
    for g in sorted(groups, key=str):
        gindex.append((pos, pos + len(groups[g])))
        pos += len(groups[g])
    rt0 = [r["t0"] for r in reads]
    rt1 = [r["t1"] for r in reads]
    obs = [r["obs"] for r in reads]
    rdead = [0] * W  # reads that must be placed before write i (no reading the future)
    by_rt1 = sorted(range(R), key=lambda j: rt1[j])
    k = 0
    acc = 0
    for i in sorted(range(W), key=lambda i: wt0[i]):
        while k < R and rt1[by_rt1[k]] < wt0[i]:
            acc |= 1 << by_rt1[k]
            k += 1
        rdead[i] = acc
    widx = {w["id"]: i for i, w in enumerate(writes)}
    rw = [0] * R  # writes that must be linearized before read j
    for j, r in enumerate(reads):
        m = 0
        if mode == "strict":
            for i in range(W):
                if det[i] and writes[i]["t1"] < r["t0"]:
                    m |= 1 << i
        else:
            ep = _epochs(restarts, r["node"], r["t0"])
            for i, w in enumerate(writes):
                if w["res"] == "ok" and w["node"] == r["node"] and w["t1"] < r["t0"] \
                        and _epochs(restarts, w["node"], w["t1"]) == ep:
                    m |= 1 << i
        if r.get("after") is not None and r["after"] in widx:  # a create's own answer: after the create
            m |= 1 << widx[r["after"]]
        rw[j] = m

    def satisfy(wmask, rmask, state, gptr):
        """Places every read that can be placed at `state`; returns (rmask, gptr)."""
        gptr = list(gptr)
        for g, (lo, hi) in enumerate(gindex):
            while True:
                p = gptr[g]
                while p < hi and (rmask >> p) & 1:
                    p += 1
                gptr[g] = p
                if p >= hi:
                    break
                # The window: unplaced reads of the group that began before the earliest
                # unplaced one ended (the others must follow it).
                horizon = INF
                placed = False
                j = p
                while j < hi and rt0[j] <= horizon:
                    if not (rmask >> j) & 1:
                        if obs[j] == state and not (rw[j] & ~wmask) and rt0[j] <= horizon:
                            # Real-time predecessors in the group: those that ended before it began.
                            ok = True
                            q = p
                            while q < j:
                                if not (rmask >> q) & 1 and rt1[q] < rt0[j]:
                                    ok = False
                                    break
                                q += 1
                            if ok:
                                rmask |= 1 << j
                                placed = True
                        if not (rmask >> j) & 1 and rt1[j] < horizon:
                            horizon = rt1[j]
                    j += 1
                if not placed:
                    break
        return rmask, tuple(gptr)

    memo = {}
    explored = 0
    best = (-1, None)
    deadline = _time.monotonic() + time_limit_s
    r0, g0 = satisfy(0, 0, initial, tuple(lo for lo, _ in gindex))
    # Frames: [wmask, rmask, state, gptr, lo, hpos, candidates, next, path]
    stack = [[0, r0, initial, g0, 0, 0, None, 0, ()]]
    while stack:
        fr = stack[-1]
        wmask, rmask, state = fr[0], fr[1], fr[2]
        if fr[6] is None:
            key = (wmask, state)
            prev = memo.get(key)
            if prev is not None and any((rmask | m) == m for m in prev):
                stack.pop()
                continue
            if prev is None:
                memo[key] = [rmask]
            else:
                prev[:] = [m for m in prev if (m | rmask) != rmask] + [rmask]
            explored += 1
            if (wmask & det_mask) == det_mask and rmask == all_reads:
                return {"valid": True, "explored": explored, "writes": W, "reads": R}
            if explored > budget or (explored % 1000 == 0 and _time.monotonic() > deadline):
                return {"valid": None, "explored": explored, "writes": W, "reads": R}
            depth = bin(wmask).count("1") + bin(rmask).count("1")
            if depth > best[0]:
                best = (depth, (wmask, rmask, state, fr[8]))
            lo, hpos = fr[4], fr[5]
            while lo < W and (wmask >> lo) & 1:
                lo += 1
            while hpos < len(by_t1) and (wmask >> by_t1[hpos]) & 1:
                hpos += 1
            fr[4], fr[5] = lo, hpos
            horizon = writes[by_t1[hpos]]["t1"] if hpos < len(by_t1) else INF
            cands = []
            i = lo
            while i < W and wt0[i] <= horizon:
                if not (wmask >> i) & 1 and not (wpred[i] & ~wmask) and not (rdead[i] & ~rmask):
                    legal, nstate = _step(writes[i], state)
                    if legal:
                        cands.append((i, nstate))
                i += 1
            # Determinate ones first, earliest completion first.
            cands.sort(key=lambda c: writes[c[0]]["t1"])
            fr[6] = cands
        if fr[7] >= len(fr[6]):
            stack.pop()
            continue
        i, nstate = fr[6][fr[7]]
        fr[7] += 1
        nw = wmask | (1 << i)
        nr, ng = satisfy(nw, rmask, nstate, fr[3])
        stack.append([nw, nr, nstate, ng, fr[4], fr[5], None, 0, fr[8] + (i,)])
    out = {"valid": False, "explored": explored, "writes": W, "reads": R}
    if best[1] is not None:
        wmask, rmask, state, path = best[1]
        pending_w = [writes[i] for i in by_t1 if not (wmask >> i) & 1][:3]
        pending_r = sorted((reads[j] for j in range(R) if not (rmask >> j) & 1), key=lambda r: r["t1"])[:3]
        out["stuck"] = {
            "state": state,
            "linearized_last": [writes[i] for i in path[-8:]],
            "cannot_linearize_writes": pending_w,
            "cannot_place_reads": pending_r,
        }
        first = [o["t1"] for o in pending_w + pending_r] or [INF]
        t = min(first)
        if t < INF:
            out["concurrent"] = [o for o in writes + reads if o["t0"] <= t and o["t1"] >= t - 1.0][:40]
    return out


def _brief(o, t_ref):
    b = {"k": o["k"], "res": o["res"], "node": o["node"], "client": o["proc"],
         "t0_s": round(o["t0"] - t_ref, 3), "t1_s": None if o["t1"] == INF else round(o["t1"] - t_ref, 3)}
    if o["k"] == "read":
        b["saw"] = o["obs"]
    elif o["v"] is not None:
        b["value"] = o["v"]
    if o.get("st") is not None:
        b["status"] = o["st"]
    return b


def explain(tops, mode, restarts, t_ref, budget=BUDGET, time_limit_s=20.0):
    """The shortest failing prefix of one topic's history (ops invoked up to some time T:
    dropping later ops only removes constraints, so failing is monotone in T), found by
    bisection: its last op (the one that cannot be fitted in) and the ops around it."""
    t0s = sorted({o["t0"] for o in tops})
    lo, hi = 0, len(t0s) - 1
    deadline = time.monotonic() + time_limit_s
    while lo < hi and time.monotonic() < deadline:
        mid = (lo + hi) // 2
        r = search([o for o in tops if o["t0"] <= t0s[mid]], mode, restarts, budget, time_limit_s=5.0)
        if r["valid"] is False:
            hi = mid
        elif r["valid"] is True:
            lo = mid + 1
        else:
            break
    t = t0s[hi]
    prefix = sorted((o for o in tops if o["t0"] <= t), key=lambda o: o["t0"])
    culprit = [o for o in prefix if o["t0"] == t]
    writes_before = [o for o in prefix if o["k"] != "read" and o["t0"] < t]
    context = {id(o) for o in writes_before[-8:]}
    context |= {id(o) for o in prefix if o["t1"] >= t - 0.5 and o["t0"] < t}  # still running around then
    if mode != "writes":
        reads_node = [o for o in prefix if o["k"] == "read" and o["node"] == culprit[0]["node"] and o["t0"] < t]
        context |= {id(o) for o in reads_node[-3:]}
    else:
        prefix = [o for o in prefix if o["k"] != "read"]
    return {"first_failing_op": [_brief(o, t_ref) for o in culprit],
            "failing_prefix_ops": len(prefix), "minimal": lo >= hi,
            "before_and_concurrent": [_brief(o, t_ref) for o in prefix
                                      if id(o) in context and all(o is not c for c in culprit)]}


def check(ops, restarts=None, strict=True, budget=BUDGET, t_ref=None, time_budget_s=150.0):
    """Returns (anomalies {kind: [...]}, stats). t_ref: the time the anomalies' t0_s/t1_s
    count from (default: the first op). time_budget_s bounds the whole check: each
    search gets its share of what is left (at most 60 s)."""
    anomalies = {k: [] for k in KINDS}
    per = prepare(ops)
    deadline = time.monotonic() + time_budget_s
    searches_left = [len(per) * (3 if strict else 2)]

    def limit():
        searches_left[0] -= 1
        return max(1.0, min(60.0, (deadline - time.monotonic()) / max(1, searches_left[0] + 1)))
    if t_ref is None:
        t_ref = min((o["t0"] for o in ops), default=0.0)
    stats = {"invoked": len(ops), "by_result": {}, "by_kind": {}, "topics": {}, "unknown": [], "odd_answers": 0}
    for o in ops:
        stats["by_result"][o.get("res")] = stats["by_result"].get(o.get("res"), 0) + 1
        k = f"{o['k']}:{o.get('res')}"
        stats["by_kind"][k] = stats["by_kind"].get(k, 0) + 1
        if o["k"] == "create" and o.get("st") == 404:
            stats["odd_answers"] += 1
    for topic in sorted(per):
        tops = per[topic]
        entry = {"ops": len(tops)}
        w = entry["writes"] = search(tops, "writes", restarts, budget, time_limit_s=limit())
        if w["valid"] is False:
            anomalies["metadata_nonlinearizable"].append(
                {"topic": topic, "check": "the creates, deletes and config changes alone",
                 **explain(tops, "writes", restarts, t_ref, budget)})
        elif w["valid"] is None:
            stats["unknown"].append({"topic": topic, "check": "writes", "explored": w["explored"]})
        r = entry["relaxed"] = search(tops, "relaxed", restarts, budget, time_limit_s=limit())
        if r["valid"] is False and w["valid"] is not False:
            anomalies["metadata_nonsequential_read"].append(
                {"topic": topic, "check": "reads as prefixes of the one write order (monotonic per node, "
                                          "after the node's own acknowledged writes)",
                 **explain(tops, "relaxed", restarts, t_ref, budget)})
        elif r["valid"] is None:
            stats["unknown"].append({"topic": topic, "check": "relaxed", "explored": r["explored"]})
        if strict:
            entry["strict"] = search(tops, "strict", restarts, budget // 4, time_limit_s=min(15.0, limit()))
        stats["topics"][topic] = {k: (v if not isinstance(v, dict) else
                                      {"valid": v["valid"], "explored": v["explored"],
                                       "writes": v["writes"], "reads": v["reads"]})
                                  for k, v in entry.items()}
    return anomalies, stats


def restarts_from_faults(faults, crashes=()):
    """{node: [times a new process of it began]} from run.py's fault records (kill, power:
    the fault's stop, when the node was started again) and crashes (when the crash was
    seen). Not the fault's start: the kill itself comes a little after it (a kill of two
    nodes, one after the other), and what the old process answered meanwhile is still
    its own (CI, seed 1: node 1 acknowledged a delete 1 s after its kill's start, 10 ms
    before it died)."""
    out = {}
    for f in faults:
        if f.get("nemesis") in ("kill", "power"):
            for n in f.get("nodes") or []:
                out.setdefault(n, []).append(f["stop"] if f.get("stop") is not None else f["start"])
    for c in crashes:
        out.setdefault(c["node"], []).append(c["t"])
    return out


# ---- the workload, for run.py -----------------------------------------------------------

class Workload:
    name = "metadata"

    def __init__(self, run, clients=4, topics=3):
        self.run = run
        self.clients = clients
        self.topics = topics
        self.proc = None
        self.stopped = False
        self.timeline_data = None
        self.t0 = None
        self.hist = os.path.join(run.hist_dir, "metadata")

    def start(self):
        import topology
        os.makedirs(self.hist, exist_ok=True)
        topo, a = self.run.topo, self.run.a
        admins = ",".join(f"{nid}={n.admin}" for nid, n in topo.nodes.items())
        argv = [sys.executable, os.path.join(HERE, "metadata.py"), "client", "--admins", admins, "--topics",
                str(self.topics), "--clients", str(self.clients), "--seed", str(a.seed), "--id", "meta",
                "--out", os.path.join(self.hist, "meta.jsonl")]
        log = open(os.path.join(self.run.dir, "workers", "meta.log"), "ab")
        self.proc = subprocess_popen(argv, log, topology._die_with_parent)
        log.close()
        self.run.say(f"workload metadata: {self.clients} admin-API clients on topics {PREFIX}0..{self.topics - 1} "
                     f"(create/delete/patch {CONFIG_KEY}/read through random nodes)")

    def begin(self, t0):
        self.t0 = t0

    def heal(self):
        pass

    def check_alive(self):
        if self.proc is not None and self.proc.poll() is not None and not self.stopped:
            raise RuntimeError(f"the metadata client exited ({self.proc.returncode}); see "
                               f"{self.run.dir}/workers/meta.log")

    def stop_load(self):
        self.stopped = True
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=WRITE_TIMEOUT_S + 10)
        except Exception:  # noqa: BLE001
            self.proc.kill()
            self.proc.wait()

    def finish(self, faults, crashes):
        self.stop_load()
        ops, events = load(self.hist)
        anomalies, stats = check(ops, restarts_from_faults(faults, crashes), t_ref=self.t0)
        self.timeline_data = {"ops": [(o["t1"], o["k"], o["res"]) for o in ops]}
        for u in stats["unknown"]:
            self.run.say(f"WARNING: metadata check of {u['topic']} ({u['check']}) gave up after {u['explored']} "
                         f"states: not decided")
        strict = {t: s.get("strict", {}).get("valid") for t, s in stats["topics"].items()}
        self.run.say(f"metadata: {stats['invoked']} ops {stats['by_result']}; writes linearizable and reads "
                     f"sequential per topic: "
                     + ", ".join(f"{t}: {s['writes']['valid']}/{s['relaxed']['valid']}"
                                 for t, s in stats["topics"].items())
                     + f"; strictly linearizable reads (informational): {strict}")
        # A record the controller proposed that did not apply means it decided against an
        # image that missed an earlier committed change (informational: the checker judges
        # what clients saw).
        warnings = []
        for node in self.run.topo.nodes.values():
            try:
                with open(node.log, errors="replace") as f:
                    warnings += [{"node": node.id, "line": line.strip()[:300]} for line in f
                                 if "metadata record changed nothing" in line]
            except OSError:
                pass
        stats["apply_warnings"] = len(warnings)
        if warnings:
            self.run.say(f"WARNING: metadata: {len(warnings)} 'metadata record changed nothing' line(s) in the node "
                         f"logs: the controller committed records decided against an image that missed an earlier "
                         f"write still pending in the log (first: {warnings[0]['line'][:200]})")
        return anomalies, stats, {"metadata_events": events[:50], "metadata_apply_warnings": warnings[:50]}

    def cleanup(self):
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.kill()
                self.proc.wait(timeout=10)
            except Exception:  # noqa: BLE001
                pass


def subprocess_popen(argv, log, preexec):
    import subprocess
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, preexec_fn=preexec)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["client"])
    ap.add_argument("--admins", required=True, help="ID=URL,... of every node's admin API")
    ap.add_argument("--topics", type=int, default=3)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--id", default="meta")
    ap.add_argument("--out", required=True)
    client_main(ap.parse_args())


if __name__ == "__main__":
    sys.exit(main())
