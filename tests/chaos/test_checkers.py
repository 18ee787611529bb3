"""The groups, metadata and txn checkers' pure logic, on hand-made histories (no cluster, a
second or two):

  target/pyenv/bin/python -m pytest tests/chaos/test_checkers.py -q
"""
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import groups  # noqa: E402
import metadata  # noqa: E402
import txn  # noqa: E402

INF = float("inf")


# ---- metadata: the linearizability search ------------------------------------------------

def op(k, t0, t1, res="ok", v=None, obs=None, node=1, proc="c0"):
    """One normalized metadata op (as metadata.prepare makes them)."""
    return {"id": None, "proc": proc, "k": k, "v": v, "res": res, "t0": t0, "t1": INF if res == "info" else t1,
            "node": node, "obs": obs, "st": None}


def valid(ops, mode="relaxed", restarts=None):
    return metadata.search(ops, mode, restarts)["valid"]


def test_sequential_history_is_linearizable():
    h = [op("read", 0, 1, obs=None), op("create", 2, 3, v="a"), op("read", 4, 5, obs="a"),
         op("patch", 6, 7, v="b"), op("read", 8, 9, obs="b"), op("create", 10, 11, "fail", v="c"),
         op("delete", 12, 13), op("delete", 14, 15, "fail"), op("patch", 16, 17, "fail", v="d"),
         op("read", 18, 19, obs=None), op("create", 20, 21, v="e"), op("read", 22, 23, obs="e")]
    for mode in ("writes", "relaxed", "strict"):
        assert valid(h, mode) is True, mode


def test_two_successful_creates_without_a_delete_are_not_linearizable():
    h = [op("create", 0, 1, v="a", proc="c0"), op("create", 2, 3, v="b", proc="c1")]
    r = metadata.search(h, "writes")
    assert r["valid"] is False
    assert r["stuck"]["cannot_linearize_writes"][0]["v"] == "b"


def test_concurrent_creates_one_wins():
    h = [op("create", 0, 5, v="a", proc="c0"), op("create", 1, 4, "fail", v="b", proc="c1"),
         op("read", 6, 7, obs="a")]
    assert valid(h, "strict") is True
    # The loser's value can never be read.
    assert valid(h + [op("read", 8, 9, obs="b", proc="c2")], "relaxed") is False


def test_failed_create_needs_an_existing_topic():
    # 409 while nothing ever created the topic: not linearizable.
    assert valid([op("create", 0, 1, "fail", v="a")], "writes") is False
    # ... unless an indeterminate create may have taken effect before it.
    assert valid([op("create", 0, None, "info", v="x", proc="c1"), op("create", 1, 2, "fail", v="a")],
                 "writes") is True
    # ... but not one sent after the 409 was answered.
    assert valid([op("create", 1, 2, "fail", v="a"), op("create", 3, None, "info", v="x", proc="c1")],
                 "writes") is False


def test_indeterminate_write_may_take_effect_late():
    # A timed-out patch takes effect long after it was sent: fine.
    h = [op("create", 0, 1, v="a"), op("patch", 2, None, "info", v="b", proc="c1"),
         op("read", 10, 11, obs="a", proc="c2"), op("read", 20, 21, obs="b", proc="c2")]
    assert valid(h, "strict") is True
    # ... but once seen, it cannot be unseen by a linearizable read.
    h2 = h + [op("read", 30, 31, obs="a", proc="c2")]
    assert valid(h2, "strict") is False


def test_delete_404_then_read_of_the_value_is_not_linearizable():
    h = [op("create", 0, 1, v="a"), op("delete", 2, 3, "fail", proc="c1")]
    assert valid(h, "writes") is False


def test_stale_read_from_a_lagging_node_is_sequential_but_not_linearizable():
    # Node 2 answers the old value after node 1 acknowledged the patch: allowed for
    # local-image reads (relaxed), not linearizable (strict).
    h = [op("create", 0, 1, v="a", node=1), op("patch", 2, 3, v="b", node=1),
         op("read", 4, 5, obs="a", node=2, proc="c1")]
    assert valid(h, "relaxed") is True
    assert valid(h, "strict") is False


def test_read_your_writes_on_the_answering_node():
    # Node 1 acknowledged the patch, then answers the old value: not allowed.
    h = [op("create", 0, 1, v="a", node=1), op("patch", 2, 3, v="b", node=1),
         op("read", 4, 5, obs="a", node=1, proc="c1")]
    assert valid(h, "relaxed") is False
    # ... unless node 1 was restarted in between (its chain starts over).
    assert valid(h, "relaxed", restarts={1: [3.5]}) is True


def test_monotonic_reads_per_node():
    h = [op("create", 0, 1, v="a", node=1), op("patch", 2, 3, v="b", node=1),
         op("read", 4, 5, obs="b", node=2, proc="c1"), op("read", 6, 7, obs="a", node=2, proc="c2")]
    assert valid(h, "relaxed") is False
    # The same two reads from different nodes: fine (node 3 lags).
    h[3] = op("read", 6, 7, obs="a", node=3, proc="c2")
    assert valid(h, "relaxed") is True


def test_no_read_from_the_future():
    # A read cannot see a write sent after the read was answered.
    h = [op("read", 0, 1, obs="a", node=2), op("create", 2, 3, v="a", node=1)]
    assert valid(h, "relaxed") is False


def test_one_log_order_for_every_node():
    # Node 2 sees a then b, node 3 sees b then a: no single order of the writes explains both.
    h = [op("create", 0, 1, v="x"),
         op("patch", 2, 10, v="a", proc="w1"), op("patch", 2, 10, v="b", proc="w2"),
         op("read", 11, 12, obs="a", node=2, proc="r1"), op("read", 13, 14, obs="b", node=2, proc="r1"),
         op("read", 11, 12, obs="b", node=3, proc="r2"), op("read", 13, 14, obs="a", node=3, proc="r2")]
    assert valid(h, "relaxed") is False
    h2 = h[:5] + [op("read", 11, 12, obs="a", node=3, proc="r2"), op("read", 13, 14, obs="b", node=3, proc="r2")]
    assert valid(h2, "relaxed") is True


def test_check_reports_per_kind():
    raw = [
        {"f": "op", "w": "m.0", "k": "create", "topic": "t1", "v": "1", "node": 1, "t0": 0, "t1": 1, "st": 201,
         "res": "ok"},
        {"f": "op", "w": "m.1", "k": "create", "topic": "t1", "v": "2", "node": 2, "t0": 2, "t1": 3, "st": 201,
         "res": "ok"},
        {"f": "op", "w": "m.0", "k": "create", "topic": "t2", "v": "3", "node": 1, "t0": 0, "t1": 1, "st": 201,
         "res": "ok"},
        {"f": "op", "w": "m.0", "k": "read", "topic": "t2", "node": 1, "t0": 2, "t1": 3, "st": 404, "res": "ok",
         "obs": None},
        {"f": "op", "w": "m.0", "k": "read", "topic": "t2", "node": 1, "t0": 4, "t1": 5, "st": None, "res": "error"},
        {"f": "op", "w": "m.0", "k": "delete", "topic": "t2", "node": 3, "t0": 4, "t1": 5, "st": None,
         "res": "refused"},
    ]
    an, stats = metadata.check(raw)
    assert [a["topic"] for a in an["metadata_nonlinearizable"]] == ["t1"]
    assert [a["topic"] for a in an["metadata_nonsequential_read"]] == ["t2"]
    assert stats["by_result"] == {"ok": 4, "error": 1, "refused": 1}


def test_classify_answers():
    c = metadata.classify
    assert c("create", 201, {}, None) == ("ok", None)
    assert c("create", 409, {}, None) == ("fail", None)
    assert c("create", 404, {}, None) == ("info", None)
    assert c("create", 503, {}, None) == ("info", None)
    assert c("create", None, None, "timeout") == ("info", None)
    assert c("create", None, None, "refused") == ("refused", None)
    assert c("create", 400, {}, None) == ("error", None)
    assert c("delete", 204, None, None) == ("ok", None)
    assert c("delete", 404, {}, None) == ("fail", None)
    assert c("patch", 200, {}, None) == ("ok", None)
    assert c("patch", 404, {}, None) == ("fail", None)
    assert c("read", 200, {"retention.ms": "5"}, None) == ("ok", "5")
    assert c("read", 404, {}, None) == ("ok", None)
    assert c("read", None, None, "timeout") == ("error", None)


def simulate(seed, n_ops=600, procs=4, nodes=3, lag=0.3, timeouts=0.03):
    """A correct register behind a log, read from lagging local copies: a linearizable
    write history with sequentially consistent reads (and some indeterminate writes)."""
    rng = random.Random(seed)
    log = []  # (commit time, state after)
    state = None
    t = 0.0
    busy = [0.0] * procs
    ops = []
    seq = 0
    last_tc = 0.0
    applied = {n: 0.0 for n in range(1, nodes + 1)}  # how far behind each node's copy is
    for _ in range(n_ops):
        p = min(range(procs), key=lambda i: busy[i])
        t = busy[p] + rng.uniform(0, 0.05)
        node = rng.randint(1, nodes)
        kind = rng.choice(["create", "delete", "patch", "read", "read"])
        seq += 1
        t0 = t
        tc = max(t0 + rng.uniform(0.001, 0.02), last_tc + 0.0001)  # the commit point, in generation order
        last_tc = tc
        t1 = tc + rng.uniform(0.001, 0.02)
        if kind == "read":
            # A stale state: as of some time between the node's last view and now.
            view = max(applied[node], tc - rng.uniform(0, lag))
            applied[node] = view
            past = [s for (ct, s) in log if ct <= view]
            obs = past[-1] if past else None
            ops.append(op("read", t0, t1, obs=obs, node=node, proc=f"c{p}"))
        else:
            v = str(seq)
            if kind == "create":
                res = "ok" if state is None else "fail"
                if state is None:
                    state = v
            elif kind == "delete":
                res = "ok" if state is not None else "fail"
                state = None
            else:
                res = "ok" if state is not None else "fail"
                if state is not None:
                    state = v
            if res == "ok":
                log.append((tc, state))
                applied[node] = max(applied[node], tc)  # answered once the node applied it
            if rng.random() < timeouts:
                res = "info"
            ops.append(op(kind, t0, t1, res=res, v=v, node=node, proc=f"c{p}"))
        busy[p] = t1
    return ops


def test_simulated_correct_histories_pass_quickly():
    start = time.time()
    for seed in range(3):
        h = simulate(seed)
        assert metadata.search(h, "writes")["valid"] is True, seed
        assert metadata.search(h, "relaxed")["valid"] is True, seed
    assert time.time() - start < 20


def test_simulated_history_with_a_lost_write_fails():
    h = simulate(7, n_ops=300, timeouts=0)
    # Flip one acknowledged create to "fail": the state it made is then unexplained.
    for o in h:
        if o["k"] == "create" and o["res"] == "ok":
            later_reads = [r for r in h if r["k"] == "read" and r["obs"] == o["v"]]
            if later_reads:
                o["res"] = "fail"
                break
    assert metadata.search(h, "relaxed")["valid"] is False


# ---- groups ---------------------------------------------------------------------------------

def assign(w, t, gen, parts, inc=0, mid=None):
    return {"f": "assign", "w": w, "inc": inc, "gen": gen, "mid": mid or f"{w}/{inc}", "parts": parts, "t": t}


def revoke(w, t, gen, parts, inc=0, mid=None):
    return {"f": "revoke", "w": w, "inc": inc, "gen": gen, "mid": mid or f"{w}/{inc}", "parts": parts, "t": t}


def poll(w, t, p, o, inc=0):
    return {"f": "poll", "w": w, "inc": inc, "p": p, "o": o, "v": f"v{p}-{o}", "t": t}


def commit(w, t0, t1, gen, offsets, ok=True, inc=0, mid=None):
    return {"f": "commit", "w": w, "inc": inc, "gen": gen, "gen_after": gen, "mid": mid or f"{w}/{inc}",
            "offsets": {str(p): o for p, o in offsets.items()}, "t0": t0, "t1": t1, "ok": ok}


def final(n0, n1):
    return {0: [(o, f"v0-{o}") for o in range(n0)], 1: [(o, f"v1-{o}") for o in range(n1)]}


def sends_for(log):
    return [{"f": "send", "w": "gproducer", "v": v, "p": p, "o": o, "t0": 0, "t1": 0, "ok": True}
            for p, recs in log.items() for o, v in recs]


def good_history():
    return [
        assign("m0", 1, 1, [0, 1]),
        poll("m0", 2, 0, 0), poll("m0", 2, 0, 1), poll("m0", 2, 1, 0),
        commit("m0", 3, 3.1, 1, {0: 2, 1: 1}),
        revoke("m0", 4, 1, [0, 1]),
        assign("m0", 5, 2, [0]), assign("m1", 5, 2, [1]),
        poll("m0", 6, 0, 2), poll("m1", 6, 1, 1), poll("m1", 6, 1, 2),
        commit("m0", 7, 7.1, 2, {0: 3}), commit("m1", 7, 7.1, 2, {1: 3}, mid="m1/0"),
    ]


def test_groups_good_history_is_clean():
    log = final(3, 3)
    an, stats = groups.check(good_history(), [{"t0": 8, "t1": 8.1, "offsets": {"0": 3, "1": 3}}], sends_for(log),
                             log, {0: 3, 1: 3})
    assert not any(an.values()), {k: v for k, v in an.items() if v}
    assert stats["checked_below_committed"] == 6 and stats["commits"]["ok"] == 3


def test_groups_commit_regression():
    h = good_history() + [commit("m1", 8, 8.1, 2, {1: 1}, mid="m1/0")]
    log = final(3, 3)
    an, _ = groups.check(h, [], sends_for(log), log, {0: 3, 1: 3})
    assert len(an["group_offset_regression"]) == 1
    assert an["group_offset_regression"][0]["partition"] == 1 and an["group_offset_regression"][0]["previous"] == 3


def test_groups_fetch_regressions():
    log = final(3, 3)
    fetches = [{"t0": 8, "t1": 8.1, "offsets": {"0": 3, "1": 3}}, {"t0": 9, "t1": 9.1, "offsets": {"0": 2, "1": 3}},
               {"t0": 10, "t1": 10.1, "offsets": {"0": 3, "1": -1001}}]
    an, _ = groups.check(good_history(), fetches, sends_for(log), log, {0: 3, 1: 3})
    whats = sorted((a["partition"], a["what"].split(" ")[1]) for a in an["group_offset_regression"])
    # partition 0: down between fetches and below the acknowledged 3; partition 1: nothing committed.
    assert (0, "committed") in whats and (0, "fetch") in whats and (1, "committed") in whats and (1, "fetch") in whats


def test_groups_unconsumed_below_the_committed_offset():
    h = [r for r in good_history() if not (r["f"] == "poll" and r["p"] == 1 and r["o"] == 2)]
    log = final(3, 3)
    an, _ = groups.check(h, [], sends_for(log), log, {0: 3, 1: 3})
    assert [(a["partition"], a["offset"]) for a in an["group_unconsumed"]] == [(1, 2)]
    # Above the committed offset nothing is claimed.
    an, _ = groups.check(h, [], sends_for(log), log, {0: 3, 1: 2})
    assert not an["group_unconsumed"]


def test_groups_foreign_reads():
    # m0 reads partition 1 after it was revoked.
    h = good_history()
    h.insert(6, poll("m0", 4.5, 1, 1))
    log = final(3, 3)
    an, _ = groups.check(h, [], sends_for(log), log, {0: 3, 1: 3})
    assert [(a["member"], a["partition"]) for a in an["group_foreign_read"]] == [("m0", 1)]
    # Two members with partition 0 in generation 2.
    h = good_history() + [assign("m2", 5.5, 2, [0])]
    an, _ = groups.check(h, [], sends_for(log), log, {0: 3, 1: 3})
    assert any(a.get("generation") == 2 and a["partition"] == 0 for a in an["group_foreign_read"])


def test_groups_zombie_commit():
    # m0 commits with generation 1 after m1 was assigned in generation 2, and the
    # coordinator says yes.
    h = good_history() + [commit("m0", 5.5, 5.6, 1, {0: 3})]
    log = final(3, 3)
    an, _ = groups.check(h, [], sends_for(log), log, {0: 3, 1: 3})
    assert len(an["group_zombie_commit"]) == 1 and an["group_zombie_commit"][0]["newer_generation"] == 2
    # Refused: fine.
    h = good_history() + [commit("m0", 5.5, 5.6, 1, {0: 3}, ok=False)]
    an, _ = groups.check(h, [], sends_for(log), log, {0: 3, 1: 3})
    assert not an["group_zombie_commit"]


def test_groups_lost_and_inconsistent():
    log = final(3, 3)
    sends = sends_for(log) + [{"f": "send", "w": "gproducer", "v": "gone", "p": 0, "o": 9, "t0": 0, "t1": 0,
                               "ok": True}]
    h = good_history() + [dict(poll("m0", 6.5, 0, 1), v="other")]
    an, _ = groups.check(h, [], sends, log, {0: 3, 1: 3})
    assert [a["value"] for a in an["group_lost"]] == ["gone"]
    assert any(a.get("polled") == "other" for a in an["group_inconsistent_offset"])


def test_generation_from_group_metadata():
    import struct
    assert groups.parse_generation(b"CGMDv2:" + struct.pack("=i", 7) + b"g\x00m\x00\x00") == 7
    assert groups.parse_generation(b"CGMDv2:\xff\xff\xff\xffx\x00\x00\x01") == -1
    assert groups.parse_generation(b"junk") is None


def test_member_schedule_is_a_pure_function_of_the_seed():
    a = groups.member_schedule(5, 2, 3)
    assert a == groups.member_schedule(5, 2, 3) and a != groups.member_schedule(6, 2, 3)
    assert a and all(e["member"] in (0, 1, 2) and e["action"] in ("crash", "leave") for e in a)
    assert all(e["at"] + e["down"] < 120 for e in a)


def test_explain_finds_the_first_failing_op():
    h = [op("create", 0, 1, v="a", proc="c0"), op("patch", 2, 3, v="b", proc="c0"),
         op("read", 4, 5, obs="b", node=2, proc="c1"), op("create", 6, 7, v="c", proc="c2"),
         op("read", 8, 9, obs="c", node=2, proc="c1")]
    e = metadata.explain(h, "writes", {}, 0.0)
    assert [o["value"] for o in e["first_failing_op"]] == ["c"] and e["minimal"]
    assert {o.get("value") for o in e["before_and_concurrent"]} == {"a", "b"}


def test_classify_describes_value_and_partitions():
    body = {"name": "t", "configs": {"retention.ms": "7", "x": "y"}, "partitions": [{"partition": 0}, {}]}
    assert metadata.classify("read", 200, body, None) == ("ok", "7:2")
    assert metadata.classify("create", 201, body, None) == ("ok", "7:2")
    assert metadata.classify("read", 200, {"name": "t"}, None) == ("error", None)


def test_patch_keeps_the_partition_count():
    h = [op("create", 0, 1, v="a:2"), op("patch", 2, 3, v="b"), op("read", 4, 5, obs="b:2", proc="c1")]
    assert valid(h, "strict") is True
    h[2] = op("read", 4, 5, obs="b:1", proc="c1")
    assert valid(h, "relaxed") is False


def test_a_create_committed_on_top_of_an_existing_topic_is_caught():
    # The race the harness saw in the node logs ("metadata record changed nothing ... topic
    # already exists"): create A times out while its entry is still pending, create B is
    # decided against an image without A and answered 201, both commit; B's Topic and
    # Partition records are rejected on apply, its Config record lands on A's topic. B's
    # own answer (and any read) then shows B's retention.ms with A's partition count.
    raw = [
        {"f": "op", "w": "m.0", "k": "create", "topic": "t", "v": "1", "n": 1, "node": 1, "t0": 0, "t1": 5,
         "st": 503, "res": "info"},
        {"f": "op", "w": "m.1", "k": "create", "topic": "t", "v": "2", "n": 2, "node": 2, "t0": 4, "t1": 6,
         "st": 201, "res": "ok", "obs": "2:1"},
        {"f": "op", "w": "m.2", "k": "read", "topic": "t", "node": 3, "t0": 7, "t1": 8, "st": 200, "res": "ok",
         "obs": "2:1"},
    ]
    an, _ = metadata.check(raw)
    assert not an["metadata_nonlinearizable"]
    assert [a["topic"] for a in an["metadata_nonsequential_read"]] == ["t"]
    # B's answer is the first thing that cannot be explained.
    assert any(o.get("saw") == "2:1" for o in an["metadata_nonsequential_read"][0]["first_failing_op"])
    # The same history with B's answer and read showing its own partition count is fine.
    for r in raw[1:]:
        r["obs"] = "2:2"
    an, _ = metadata.check(raw)
    assert not any(an.values())


def test_restarts_from_faults():
    faults = [{"nemesis": "kill", "nodes": [2], "start": 10.0}, {"nemesis": "pause", "nodes": [1], "start": 11.0},
              {"nemesis": "power", "nodes": [1, 2, 3], "start": 20.0},
              {"nemesis": "kill", "nodes": [4], "start": 30.0, "stop": 38.0}]
    assert metadata.restarts_from_faults(faults, [{"node": 3, "t": 5.0}]) == {2: [10.0, 20.0], 1: [20.0],
                                                                              3: [20.0, 5.0], 4: [38.0]}


def test_a_write_the_old_process_acknowledged_after_its_kill_began_binds_only_that_process():
    # CI, seed 1: the kill of node 1 began at 3.0, node 1 acknowledged a delete at 3.5 and
    # died just after; restarted at 6.0, it answered from its older image. Valid: the new
    # process's chain starts over. Before the restart, the old one must still show it.
    h = [op("create", 0, 1, v="a", node=1), op("patch", 3.2, 3.5, v="b", node=1),
         op("read", 7, 8, obs="a", node=1, proc="c1")]
    restarts = metadata.restarts_from_faults([{"nemesis": "kill", "nodes": [1], "start": 3.0, "stop": 6.0}])
    assert valid(h, "relaxed", restarts=restarts) is True
    stale_before_restart = h[:2] + [op("read", 4, 5, obs="a", node=1, proc="c1")]
    assert valid(stale_before_restart, "relaxed", restarts=restarts) is False


# ---- txn ------------------------------------------------------------------------------------

def tx(w, n, vals, res, intent="commit", commit_sent=None, t=0.0):
    """A transaction's begin and end records (res None: no end record)."""
    vals = [[v, p] for v, p in vals]
    recs = [{"f": "begin", "w": w, "txn": n, "pinc": 0, "vals": vals, "intent": intent, "t": t}]
    if res is not None:
        if commit_sent is None:
            commit_sent = intent == "commit"
        recs.append({"f": "end", "w": w, "txn": n, "pinc": 0, "res": res, "commit_sent": commit_sent,
                     "stage": "commit" if commit_sent else "abort", "t0": t, "t1": t + 0.1})
    return recs


def tpoll(p, o, v, w="txn-consumer-0", s=0, t=1.0):
    return {"f": "poll", "w": w, "s": s, "p": p, "o": o, "v": v, "t": t}


def txn_good():
    """Producer 0: txn 1 committed (2 values), txn 2 aborted, txn 3 committed, txn 4
    unknown after its commit was sent (it committed). Producer 1: txn 1 committed, txn 2
    unknown before any commit (never committed), txn 3 unknown with no end record (it did
    not commit). The final read as read_committed returns it: the gaps are aborted
    records and transaction markers."""
    recs = (tx("p0", 1, [("t0-1-0", 0), ("t0-1-1", 1)], "committed")
            + tx("p0", 2, [("t0-2-0", 0)], "aborted", intent="abort")
            + tx("p0", 3, [("t0-3-0", 1)], "committed")
            + tx("p0", 4, [("t0-4-0", 0), ("t0-4-1", 1)], "unknown")
            + tx("p1", 1, [("t1-1-0", 1)], "committed")
            + tx("p1", 2, [("t1-2-0", 0), ("t1-2-1", 1)], "unknown", commit_sent=False)
            + tx("p1", 3, [("t1-3-0", 0)], None))
    final_log = {0: [(0, "t0-1-0"), (4, "t0-4-0")],
                 1: [(0, "t0-1-1"), (2, "t0-3-0"), (4, "t0-4-1"), (6, "t1-1-0")]}
    polls = [tpoll(0, 0, "t0-1-0"), tpoll(1, 0, "t0-1-1"), tpoll(1, 2, "t0-3-0"), tpoll(0, 4, "t0-4-0"),
             # a second session starts from the beginning again: fine
             tpoll(1, 0, "t0-1-1", s=1), tpoll(1, 2, "t0-3-0", s=1)]
    return recs, polls, final_log


def txn_check(recs, polls, final_log, complete=True):
    return txn.check(txn.merge(recs), polls, final_log, final_complete=complete)


def test_txn_good_history_is_clean():
    recs, polls, final_log = txn_good()
    an, stats = txn_check(recs, polls, final_log)
    assert set(an) == set(txn.KINDS)
    assert not any(an.values()), {k: v for k, v in an.items() if v}
    assert (stats["begun"], stats["committed"], stats["aborted"], stats["unknown"]) == (7, 3, 1, 3)
    assert stats["unknown_commit_sent"] == 2  # p0/4 (sent) and p1/3 (no end record: not known)
    assert stats["final_read"] == 6 and stats["polled"] == 6 and stats["values_read"] == 6
    assert stats["unknown_in_final"] == {"all": 1, "none": 2}


def test_txn_merge_and_load(tmp_path):
    recs, polls, _ = txn_good()
    with open(tmp_path / "txn-producer-0.jsonl", "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
        f.write('{"f":"begin","w":"p9"')  # a torn last line
    with open(tmp_path / "txn-consumer-0.jsonl", "w") as f:
        for r in polls:
            f.write(json.dumps(r) + "\n")
        f.write(json.dumps({"f": "event", "w": "txn-consumer-0", "t": 2, "what": "drained"}) + "\n")
    txns, ps, events = txn.load(str(tmp_path))
    assert len(txns) == 7 and len(ps) == 6 and len(events) == 1
    by = {(t["w"], t["txn"]): t for t in txns}
    assert by[("p1", 3)]["res"] == "unknown" and by[("p1", 3)]["commit_sent"] is None
    assert by[("p1", 2)]["commit_sent"] is False and txn.never_committed(by[("p1", 2)])
    assert not txn.never_committed(by[("p0", 4)]) and txn.never_committed(by[("p0", 2)])


def test_txn_lost():
    recs, polls, final_log = txn_good()
    # The committed t0-3-0 is missing from the final read.
    final_log[1] = [(o, v) for o, v in final_log[1] if v != "t0-3-0"]
    an, _ = txn_check(recs, polls, final_log)
    assert [(a["value"], a["why"]) for a in an["txn_lost"]] == [("t0-3-0", ["commit returned", "read during the run"])]
    # Not judged against an incomplete final read.
    an, _ = txn_check(recs, polls, final_log, complete=False)
    assert not an["txn_lost"]
    # An unknown transaction read during the run and then gone is lost too (and partial here).
    recs, polls, final_log = txn_good()
    final_log[0] = [(0, "t0-1-0")]
    an, _ = txn_check(recs, polls, final_log)
    assert [(a["value"], a["why"]) for a in an["txn_lost"]] == [("t0-4-0", ["read during the run"])]
    assert [a["txn"] for a in an["txn_partial"]] == [4]


def test_txn_aborted_read():
    recs, polls, final_log = txn_good()
    # A consumer read the aborted t0-2-0; the final read holds p1's never-committed t1-2-*.
    polls.insert(1, tpoll(0, 1, "t0-2-0"))
    final_log[0] = final_log[0] + [(8, "t1-2-0")]
    final_log[1] = final_log[1] + [(8, "t1-2-1")]
    an, _ = txn_check(recs, polls, final_log)
    got = sorted((a["value"], a["reader"], a["res"]) for a in an["txn_aborted_read"])
    assert got == [("t0-2-0", "txn-consumer-0", "aborted"), ("t1-2-0", "final", "unknown"),
                   ("t1-2-1", "final", "unknown")]
    assert not an["txn_partial"] and not an["txn_lost"]
    # An unknown transaction whose commit may have been sent may show up: not an anomaly.
    recs, polls, final_log = txn_good()
    final_log[0] = final_log[0] + [(8, "t1-3-0")]
    an, _ = txn_check(recs, polls, final_log)
    assert not any(an.values())


def test_txn_partial():
    recs, polls, final_log = txn_good()
    # Only one of the committed txn 1's two values, and one of the unknown txn 4's.
    final_log[1] = [(o, v) for o, v in final_log[1] if v not in ("t0-1-1", "t0-4-1")]
    polls = [r for r in polls if r["v"] != "t0-1-1"]
    an, _ = txn_check(recs, polls, final_log)
    got = sorted((a["producer"], a["txn"], a["res"], tuple(a["present"]), tuple(a["missing"]))
                 for a in an["txn_partial"])
    assert got == [("p0", 1, "committed", ("t0-1-0",), ("t0-1-1",)),
                   ("p0", 4, "unknown", ("t0-4-0",), ("t0-4-1",))]
    assert [a["value"] for a in an["txn_lost"]] == ["t0-1-1"]  # the committed one is also lost
    # An aborted transaction partly visible is partial (and an aborted read).
    recs, polls, final_log = txn_good()
    recs += tx("p0", 5, [("t0-5-0", 0), ("t0-5-1", 1)], "aborted", intent="abort")
    final_log[0] = final_log[0] + [(9, "t0-5-0")]
    an, _ = txn_check(recs, polls, final_log)
    assert [a["txn"] for a in an["txn_partial"]] == [5]
    assert [a["value"] for a in an["txn_aborted_read"]] == ["t0-5-0"]


def test_txn_duplicate():
    recs, polls, final_log = txn_good()
    final_log[1] = final_log[1] + [(9, "t1-1-0")]
    an, _ = txn_check(recs, polls, final_log)
    assert [(a["value"], a["at"], a["txn"]) for a in an["txn_duplicate"]] == [("t1-1-0", [(1, 6), (1, 9)], 1)]
    assert not an["txn_partial"] and not an["txn_lost"]


def test_txn_order():
    recs, polls, final_log = txn_good()
    # Within session 0 partition 1 goes back from 2 to 0, then repeats 0.
    polls += [tpoll(1, 0, "t0-1-1"), tpoll(1, 0, "t0-1-1")]
    an, _ = txn_check(recs, polls, final_log)
    assert [(a["session"], a["partition"], a["prev"], a["offset"]) for a in an["txn_order"]] == \
        [(0, 1, 2, 0), (0, 1, 0, 0)]
    # Other consumers and other sessions are separate streams.
    recs, polls, final_log = txn_good()
    polls += [tpoll(1, 0, "t0-1-1", w="txn-consumer-1"), tpoll(1, 0, "t0-1-1", s=2)]
    an, _ = txn_check(recs, polls, final_log)
    assert not an["txn_order"]


def test_txn_values_are_a_pure_function_of_the_seed():
    import random as _r
    a = [txn.txn_values(0, n, r, 6) for r in [_r.Random("1/txn/0")] for n in range(1, 200)]
    b = [txn.txn_values(0, n, r, 6) for r in [_r.Random("1/txn/0")] for n in range(1, 200)]
    assert a == b
    assert all(1 <= len(vals) <= 5 and all(0 <= p < 6 for _, p in vals) for vals, _ in a)
    aborts = sum(intent == "abort" for _, intent in a)
    assert 20 <= aborts <= 60  # about 0.2 of 199
    values = [v for vals, _ in a for v, _ in vals]
    assert len(values) == len(set(values))
