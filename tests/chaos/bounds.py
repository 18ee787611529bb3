"""Availability bounds for single faults, measured per partition.

A fault counts as single when no other fault was on within `settle` seconds either side
of it (the cluster had settled before it, and nothing else happened while it healed).
The bounds (issue 9, "Availability bounds to meet"):

- kill -9 or SIGSTOP of one node: every partition acknowledges again within
  broker.session.timeout.ms + 1.5 s, except, for a pause, the partitions the paused
  node itself led (clients hold their requests on its open connection until it
  resumes); those are reported apart, as `own_partitions_worst_s`.
- one node isolated from the others (clients still reach it): within
  broker.session.timeout.ms + 2 s (the cut-off leader fences itself and answers
  NOT_LEADER_OR_FOLLOWER; clients find the new leader).

Other faults (two nodes at once, halves, bridges, one-way cuts, overlapping faults)
have no bound here: their gaps are in the per-fault unavailability list.
"""

KILL_PAUSE_SLACK_S = 1.5
ISOLATE_SLACK_S = 2.0


def session_timeout_s(settings, default_ms=9000):
    """broker.session.timeout.ms from `KEY=VALUE` settings (the last one wins), in seconds."""
    ms = default_ms
    for s in settings:
        key, _, value = s.partition("=")
        if key.strip() == "broker.session.timeout.ms":
            ms = int(value)
    return ms / 1000.0


def _kind(fault):
    """'kill', 'pause' or 'isolate' for a fault of one node that has a bound, else None."""
    name = fault["nemesis"]
    if name in ("kill", "pause") and len(fault.get("nodes") or []) == 1:
        return name
    groups = fault.get("groups") or []
    what = fault.get("what") or ""
    one_cut_off = what.startswith(("partition isolate", "partition halves")) and len(groups) == 2 \
        and min(len(g) for g in groups) == 1
    if name == "partition" and one_cut_off:
        return "isolate"
    return None


def evaluate(per_fault, faults, session_s, t_end, settle_s=None):
    """{kind: {"bound_s", "faults", "worst_s", "worst_fault", "exceeded": [...]}} for the
    single faults of each bounded kind, from checker.unavailability's per-fault list."""
    settle = session_s + 2.0 if settle_s is None else settle_s
    windows = {f["id"]: (f["start"], f["stop"] if f["stop"] is not None else t_end) for f in faults}
    by_id = {f["id"]: f for f in faults}
    bounds = {"kill": session_s + KILL_PAUSE_SLACK_S, "pause": session_s + KILL_PAUSE_SLACK_S,
              "isolate": session_s + ISOLATE_SLACK_S}
    out = {k: {"bound_s": round(b, 3), "faults": 0, "worst_s": None, "worst_fault": None, "exceeded": []}
           for k, b in bounds.items()}
    out["pause"]["own_partitions_worst_s"] = None
    for pf in per_fault:
        fault = by_id.get(pf["id"])
        kind = fault and _kind(fault)
        if not kind:
            continue
        start, stop = windows[pf["id"]]
        if any(i != pf["id"] and s < stop + settle and e > start - settle for i, (s, e) in windows.items()):
            continue  # not single
        entry = out[kind]
        entry["faults"] += 1
        own = {str(p) for p in fault.get("led") or []} if kind == "pause" else set()
        for p, gap in pf["per_partition_s"].items():
            if p in own:
                prev = entry["own_partitions_worst_s"]
                entry["own_partitions_worst_s"] = max(prev or 0.0, gap)
                continue
            if entry["worst_s"] is None or gap > entry["worst_s"]:
                entry["worst_s"], entry["worst_fault"] = gap, pf["id"]
            if gap > entry["bound_s"]:
                entry["exceeded"].append({"id": pf["id"], "partition": int(p), "gap_s": gap, "what": pf["what"]})
    return out


def describe(result):
    """One line per bounded kind, for the run's output."""
    lines = []
    for kind, e in result.items():
        if not e["faults"]:
            lines.append(f"bound {kind}: no single fault of this kind in the run")
            continue
        own = ""
        if e.get("own_partitions_worst_s") is not None:
            own = f"; the paused node's own partitions {e['own_partitions_worst_s']:.2f} s"
        verdict = "met" if not e["exceeded"] else f"EXCEEDED {len(e['exceeded'])} time(s)"
        lines.append(f"bound {kind} ≤ {e['bound_s']:.2f} s: {verdict} over {e['faults']} single fault(s), "
                     f"worst {e['worst_s']:.2f} s (#{e['worst_fault']}){own}")
    return lines
