"""The queue checker (after Jepsen's Kafka queue checker) and the unavailability windows.

Inputs: the producers' sends, the run-time consumers' polls and the final read (every
partition from the start to its high watermark, after every fault was healed).

Anomalies:
  lost                 acknowledged, or read by a consumer during the run, and not in the final read
  duplicate            one value at more than one (partition, offset), written twice under
                       the same producer id and epoch (a retry the broker did not recognise);
                       copies under different producer epochs are the client's re-sends after
                       an epoch bump and are reported apart (`client_duplicates`, see
                       classify_duplicates), not as anomalies
  inconsistent-offset  acknowledged at one offset and read at another, or one offset read
                       with different values
  non-monotonic        a consumer's offsets on a partition went backwards or repeated
                       (one per jump: consecutive polls compared)
  poll-skip            a consumer went from offset a to offset b of a partition while the
                       final read has records between them
  unseen               acknowledged and in the final read, below what the run-time consumers
                       reached, and read by none of them
"""
import bisect
import glob
import json
import os

KINDS = ("lost", "duplicate", "inconsistent-offset", "non-monotonic", "poll-skip", "unseen")
LIST_LIMIT = 500  # entries per kind written to the report (the counts are exact)


def load_history(history_dir):
    sends, polls, events = [], [], []
    for path in sorted(glob.glob(os.path.join(history_dir, "*.jsonl"))):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a torn last line of a killed worker
                kind = rec.get("f")
                if kind == "send":
                    sends.append(rec)
                elif kind == "poll":
                    polls.append(rec)
                else:
                    events.append(rec)
    # One record per value: a value re-recorded as indeterminate after its callback ran
    # keeps its callback's outcome.
    by_value = {}
    for s in sends:
        prev = by_value.get(s["v"])
        if prev is None or (prev.get("ok") is None and s.get("ok") is not None):
            by_value[s["v"]] = s
    return list(by_value.values()), polls, events


def check(sends, polls, final_log):
    """final_log: {partition: [(offset, value), ...]}. Returns (anomalies, stats)."""
    anomalies = {k: [] for k in KINDS}
    final_at = {}   # (p, o) -> value
    final_pos = {}  # value -> [(p, o), ...]
    offsets = {}    # p -> sorted offsets in the final read
    for p, recs in final_log.items():
        p = int(p)
        offs = []
        for o, v in recs:
            final_at[(p, o)] = v
            final_pos.setdefault(v, []).append((p, o))
            offs.append(o)
        offsets[p] = sorted(set(offs))

    acked = [s for s in sends if s.get("ok") is True]
    failed = [s for s in sends if s.get("ok") is False]
    indeterminate = [s for s in sends if s.get("ok") is None]

    # lost
    for s in sorted(acked, key=lambda s: s["t1"]):
        if s["v"] not in final_pos:
            anomalies["lost"].append({"value": s["v"], "partition": s["p"], "offset": s.get("o"),
                                      "acked_at": s["t1"], "invoked_at": s["t0"], "writer": s["w"]})
    lost_values = {a["value"] for a in anomalies["lost"]}
    seen_lost = set()
    for r in polls:
        if r["v"] not in final_pos and r["v"] not in lost_values and r["v"] not in seen_lost:
            seen_lost.add(r["v"])
            anomalies["lost"].append({"value": r["v"], "partition": r["p"], "offset": r["o"], "polled_at": r["t"],
                                      "reader": r["w"], "why": "read during the run, missing from the final read"})

    # duplicate: a value at more than one place, in the final read or in any poll
    places = {v: set(ps) for v, ps in final_pos.items()}
    for r in polls:
        places.setdefault(r["v"], set()).add((r["p"], r["o"]))
    for v, ps in places.items():
        if len(ps) > 1:
            anomalies["duplicate"].append({"value": v, "at": sorted([p, o] for p, o in ps),
                                           "in_final_read": sorted([p, o] for p, o in final_pos.get(v, []))})

    # inconsistent offsets
    def known(o):
        # librdkafka acknowledges a retry the broker recognised as a duplicate
        # (DUPLICATE_SEQUENCE_NUMBER) without an offset.
        return o is not None and o >= 0

    for s in acked:
        ps = final_pos.get(s["v"])
        if ps and known(s.get("o")) and (s["p"], s["o"]) not in ps:
            anomalies["inconsistent-offset"].append({"value": s["v"], "acked_at_offset": [s["p"], s.get("o")],
                                                     "read_at": sorted([p, o] for p, o in ps), "writer": s["w"]})
    by_offset = {}
    for s in acked:
        if known(s.get("o")):
            by_offset.setdefault((s["p"], s["o"]), set()).add(s["v"])
    for (p, o), vs in by_offset.items():
        if len(vs) > 1:
            anomalies["inconsistent-offset"].append({"partition": p, "offset": o, "acked_values": sorted(vs),
                                                     "final": final_at.get((p, o))})
    reported = set()
    for r in polls:
        key = (r["p"], r["o"], r["v"])
        fv = final_at.get((r["p"], r["o"]))
        if fv is not None and fv != r["v"] and key not in reported:
            reported.add(key)
            anomalies["inconsistent-offset"].append({"partition": r["p"], "offset": r["o"], "polled": r["v"],
                                                     "final": fv, "reader": r["w"], "polled_at": r["t"]})

    # per consumer session and partition: non-monotonic and poll-skip
    streams = {}
    for r in polls:  # polls are in each worker's file order, i.e. poll order
        streams.setdefault((r["w"], r.get("s", 0), r["p"]), []).append(r)
    polled_values = set()
    max_polled = {}
    for (w, sess, p), rs in streams.items():
        prev = None
        offs = offsets.get(p, [])
        for r in rs:
            polled_values.add(r["v"])
            max_polled[p] = max(max_polled.get(p, -1), r["o"])
            o = r["o"]
            if prev is None:
                # Assigned at offset 0: the first record read is the first in the log.
                if offs and o > offs[0]:
                    skipped = offs[:bisect.bisect_left(offs, o)]
                    if skipped:
                        anomalies["poll-skip"].append({"reader": w, "session": sess, "partition": p, "from": None,
                                                       "to": o, "skipped": len(skipped), "first_skipped": skipped[:10],
                                                       "polled_at": r["t"]})
            elif o <= prev["o"]:
                anomalies["non-monotonic"].append({"reader": w, "session": sess, "partition": p, "prev": prev["o"],
                                                   "offset": o, "polled_at": r["t"]})
            else:
                i = bisect.bisect_right(offs, prev["o"])
                j = bisect.bisect_left(offs, o)
                if j > i:
                    anomalies["poll-skip"].append({"reader": w, "session": sess, "partition": p, "from": prev["o"],
                                                   "to": o, "skipped": j - i, "first_skipped": offs[i:min(j, i + 10)],
                                                   "polled_at": r["t"]})
            prev = r

    # unseen: acknowledged, in the final read, below what the consumers reached, read by none
    for s in acked:
        ps = final_pos.get(s["v"])
        if not ps or s["v"] in polled_values:
            continue
        p, o = ps[0]
        if o <= max_polled.get(p, -1):
            anomalies["unseen"].append({"value": s["v"], "partition": p, "offset": o, "acked_at": s["t1"]})

    final_values = set(final_pos)
    stats = {
        "send": {"invoked": len(sends), "ok": len(acked), "fail": len(failed), "indeterminate": len(indeterminate),
                 "ok_without_offset": sum(not known(s.get("o")) for s in acked),
                 "fail_but_present": sum(s["v"] in final_values for s in failed),
                 "indeterminate_present": sum(s["v"] in final_values for s in indeterminate)},
        "poll": len(polls),
        "final_read": sum(len(v) for v in final_log.values()),
    }
    return anomalies, stats


def unavailability(sends, faults, partitions, t_end, slack_s=1.0):
    """Per fault and per partition, the longest gap between consecutive acknowledgements
    that began while the fault was on (or up to slack_s before it started: the last
    acknowledgement before the fault); a partition silent up to the end counts up to
    t_end. Overlapping faults share the gaps that began while both were on; the longest
    gap merely overlapping the window is reported too (`worst_overlapping_s`).
    Returns (per-fault list, {nemesis: worst gap}, {partition: longest gap outside every
    fault window})."""
    acks = {p: [] for p in range(partitions)}
    for s in sends:
        if s.get("ok") is True:
            acks.setdefault(s["p"], []).append(s["t1"])
    gaps = {}
    for p, ts in acks.items():
        ts.sort()
        gaps[p] = [(ts[i], ts[i + 1]) for i in range(len(ts) - 1)]
        if ts:
            gaps[p].append((ts[-1], max(t_end, ts[-1])))
    per_fault = []
    worst_by_nemesis = {}
    for f in faults:
        start, stop = f["start"], f["stop"] if f["stop"] is not None else t_end
        per_p = {}
        worst = (0.0, None, None, None)
        overlapping = 0.0
        for p, gs in gaps.items():
            best = (0.0, None, None)
            for a, b in gs:
                if b > start and a < stop:
                    overlapping = max(overlapping, b - a)
                    if a >= start - slack_s and b - a > best[0]:
                        best = (b - a, a, b)
            per_p[str(p)] = round(best[0], 3)
            if best[0] > worst[0]:
                worst = (best[0], p, best[1], best[2])
        per_fault.append({"id": f["id"], "nemesis": f["nemesis"], "what": f.get("what"), "start": start, "stop": stop,
                          "worst_s": round(worst[0], 3), "worst_partition": worst[1],
                          "worst_from": worst[2], "worst_to": worst[3], "per_partition_s": per_p,
                          "worst_overlapping_s": round(overlapping, 3)})
        worst_by_nemesis[f["nemesis"]] = max(worst_by_nemesis.get(f["nemesis"], 0.0), round(worst[0], 3))
    windows = [(f["start"], f["stop"] if f["stop"] is not None else t_end) for f in faults]
    baseline = {}
    for p, gs in gaps.items():
        best = 0.0
        for a, b in gs:
            if not any(b > s and a < e for s, e in windows):
                best = max(best, b - a)
        baseline[str(p)] = round(best, 3)
    return per_fault, worst_by_nemesis, baseline


def _batches(data_dir, topic, partition):
    """(base offset, last offset, producer id, producer epoch, base sequence) of every batch
    of the partition's log in a node's data dir (Kafka's v2 batch header), or []."""
    import struct
    d = os.path.join(data_dir, "logs", f"{topic}-{partition}")
    out = []
    for path in sorted(glob.glob(os.path.join(d, "*.log"))):
        with open(path, "rb") as f:
            data = f.read()
        pos = 0
        while pos + 61 <= len(data):
            base, length = struct.unpack(">qi", data[pos:pos + 12])
            if length <= 0:
                break
            (lod,) = struct.unpack(">i", data[pos + 23:pos + 27])
            pid, pepoch, bseq = struct.unpack(">qhi", data[pos + 43:pos + 57])
            out.append((base, base + lod, pid, pepoch, bseq))
            pos += 12 + length
    return out


def classify_duplicates(dups, data_dirs, topic):
    """Splits duplicates into (broker, client): a value written twice by the same producer id
    and epoch with the same sequence is the broker's failure to deduplicate a retry; a second
    copy under another producer epoch (or id) is the client re-sending a record whose first
    write it did not know about (librdkafka bumps the epoch after timeouts and some
    OUT_OF_ORDER_SEQUENCE_NUMBER answers, then re-sequences; issue 4953). Each entry gets the
    batches' producer id, epoch and sequence; undeterminable ones count as the broker's."""
    cache = {}
    broker, client = [], []
    for d in dups:
        places = d.get("in_final_read") or []
        metas = []
        for p, o in places:
            if p not in cache:
                cache[p] = []
                for dd in data_dirs:
                    b = _batches(dd, topic, p)
                    if b and (not cache[p] or b[-1][1] > cache[p][-1][1]):
                        cache[p] = b
            hit = next((b for b in cache[p] if b[0] <= o <= b[1]), None)
            metas.append(None if hit is None else {"partition": p, "offset": o, "producer_id": hit[2],
                                                   "producer_epoch": hit[3], "sequence": hit[4] + (o - hit[0])})
        d = dict(d, batches=metas)
        writers = {(m["producer_id"], m["producer_epoch"]) for m in metas if m}
        if len(metas) >= 2 and all(metas) and len(writers) == len(metas):
            client.append(d)
        else:
            broker.append(d)
    return broker, client
