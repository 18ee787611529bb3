"""Fault schedules (a pure function of the seed and options) and the nemeses that carry
them out.

A schedule is a list of operations, each {"id", "nemesis", "at", "duration", ...}: the
fault starts `at` seconds after the workload started and is healed `duration` seconds
later. Every nemesis draws its own faults from its own random stream (seeded with
"SEED/NAME"), one at a time with quiet gaps between them; faults of different nemeses
overlap, as Jepsen's composed nemeses do. Targets that depend on the cluster's state
("the controller", "the leader of partition 3") are resolved when the fault starts, and
the run records which nodes they were.
"""
import random

IMPLEMENTED = ("kill", "pause", "partition", "netem")
NOT_IMPLEMENTED = ("clock", "disk", "power")

# (shortest, longest) fault, in seconds.
FAULT_S = {"kill": (2.0, 10.0), "pause": (2.0, 10.0), "partition": (3.0, 12.0), "netem": (5.0, 15.0)}
QUIET_S = (3.0, 10.0)

PARTITION_FLAVORS = ("isolate", "halves", "bridge", "one-way")
NETEM_SPECS = (
    "delay 100ms 50ms distribution normal",
    "delay 20ms 10ms reorder 25% 50%",
    "loss 20%",
    "duplicate 20%",
    "delay 200ms 100ms loss 5% duplicate 5% reorder 10%",
)


def _anchor(rng, n, partitions):
    """Whom a fault is aimed at: a node, the controller or a partition's leader."""
    kind = rng.choices(["node", "controller", "leader"], weights=[3, 3, 4])[0]
    if kind == "node":
        return {"kind": "node", "node": rng.randint(1, n)}
    if kind == "leader":
        return {"kind": "leader", "partition": rng.randrange(partitions)}
    return {"kind": "controller"}


def make_schedule(seed, minutes, nemeses, n, partitions, warmup_s=5.0):
    """The fault schedule: a pure function of its arguments."""
    horizon = minutes * 60.0
    ops = []
    for name in sorted(set(nemeses)):
        rng = random.Random(f"{seed}/{name}")
        t = warmup_s + rng.uniform(0, QUIET_S[0])
        lo, hi = FAULT_S[name]
        while True:
            dur = rng.uniform(lo, hi)
            if t + dur > horizon - 2.0:
                break
            op = {"nemesis": name, "at": round(t, 2), "duration": round(dur, 2), "target": _anchor(rng, n, partitions)}
            order = list(range(1, n + 1))
            rng.shuffle(order)
            op["order"] = order  # the other nodes, in the order groups are drawn from
            if name in ("kill", "pause"):
                # One node, or (5+ nodes) sometimes a minority of two.
                op["count"] = 2 if n >= 5 and rng.random() < 0.25 else 1
            elif name == "partition":
                op["flavor"] = rng.choice(PARTITION_FLAVORS)
                if op["flavor"] == "one-way":
                    op["direction"] = rng.choice(["in", "out"])
            elif name == "netem":
                op["spec"] = rng.choice(NETEM_SPECS)
            ops.append(op)
            t += dur + rng.uniform(*QUIET_S)
    ops.sort(key=lambda o: (o["at"], o["nemesis"]))
    for i, op in enumerate(ops):
        op["id"] = i
    return ops


def describe(op):
    t = op["target"]
    who = {"node": lambda: f"node {t['node']}", "controller": lambda: "the controller",
           "leader": lambda: f"the leader of partition {t['partition']}"}[t["kind"]]()
    extra = ""
    if op["nemesis"] in ("kill", "pause") and op.get("count", 1) > 1:
        extra = f" and {op['count'] - 1} more"
    elif op["nemesis"] == "partition":
        extra = f" ({op['flavor']}{' ' + op['direction'] if 'direction' in op else ''})"
    elif op["nemesis"] == "netem":
        extra = f" ({op['spec']})"
    return f"#{op['id']:<3} {op['at']:7.2f}s +{op['duration']:5.2f}s {op['nemesis']:<9} {who}{extra}"


def partition_drops(flavor, order, n, direction=None):
    """{node: set of nodes it stops receiving from}, order[0] being the anchor."""
    nodes = list(order)
    k = max(1, (n - 1) // 2)
    drops = {i: set() for i in nodes}

    def cut(a, b):
        for x in a:
            for y in b:
                drops[x].add(y)
                drops[y].add(x)

    if flavor == "isolate":
        cut(nodes[:1], nodes[1:])
        groups = [nodes[:1], nodes[1:]]
    elif flavor == "halves":
        cut(nodes[:k], nodes[k:])
        groups = [nodes[:k], nodes[k:]]
    elif flavor == "bridge":
        # order[:k] and order[k+1:] cannot reach each other; order[k] reaches both.
        cut(nodes[:k], nodes[k + 1:])
        groups = [nodes[:k], [nodes[k]], nodes[k + 1:]]
    elif flavor == "one-way":
        a, rest = nodes[0], nodes[1:]
        if direction == "in":  # the anchor hears no one; the others hear it
            drops[a] |= set(rest)
        else:  # no one hears the anchor; it hears them
            for y in rest:
                drops[y].add(a)
        groups = [[a], rest]
    else:
        raise ValueError(flavor)
    return {i: s for i, s in drops.items() if s}, groups


class Nemeses:
    """Starts and stops schedule operations on a Topology; records what it did."""

    def __init__(self, topo, topic, log):
        self.topo = topo
        self.topic = topic
        self.say = log
        self.active = {}  # op id -> runtime record

    def _resolve(self, op):
        t = op["target"]
        node, how = None, None
        if t["kind"] == "node":
            node, how = t["node"], "fixed"
        elif t["kind"] == "controller":
            node, how = self.topo.controller(), "controller"
        else:
            node, how = self.topo.leader_of(self.topic, t["partition"]), f"leader of partition {t['partition']}"
        if node is None:
            node, how = op["order"][0], f"{how} unknown: fallback"
        order = [node] + [i for i in op["order"] if i != node]
        return node, how, order

    def start(self, op, now):
        node, how, order = self._resolve(op)
        rec = {"id": op["id"], "nemesis": op["nemesis"], "start": now, "stop": None, "anchor": node,
               "anchor_was": how}
        name = op["nemesis"]
        if name == "kill":
            victims = order[:op.get("count", 1)]
            for v in victims:
                self.topo.kill(v)
            rec["nodes"] = victims
            rec["what"] = f"kill -9 node(s) {victims} ({how})"
        elif name == "pause":
            victims = [v for v in order[:op.get("count", 1)] if self.topo.nodes[v].alive()]
            for v in victims:
                self.topo.pause(v)
            rec["nodes"] = victims
            rec["what"] = f"SIGSTOP node(s) {victims} ({how})"
        elif name == "partition":
            drops, groups = partition_drops(op["flavor"], order, self.topo.n, op.get("direction"))
            for i, peers in drops.items():
                self.topo.drop(i, peers)
            rec["nodes"] = sorted(drops)
            rec["groups"] = groups
            rec["drops"] = {str(i): sorted(p) for i, p in drops.items()}
            kind = op["flavor"] + (f" {op['direction']}" if "direction" in op else "")
            rec["what"] = f"partition {kind}: {' | '.join(str(g) for g in groups)} (anchor {node}: {how})"
        elif name == "netem":
            self.topo.netem(node, op["spec"])
            rec["nodes"] = [node]
            rec["what"] = f"netem on node {node} ({how}): {op['spec']}"
        self.active[op["id"]] = rec
        return rec

    def stop(self, op, now):
        rec = self.active.pop(op["id"], None)
        if rec is None:
            return None
        name = op["nemesis"]
        if name == "kill":
            for v in rec["nodes"]:
                if not self.topo.nodes[v].alive():
                    self.topo.launch(v)
        elif name == "pause":
            for v in rec["nodes"]:
                self.topo.resume(v)
        elif name == "partition":
            for i in rec["nodes"]:
                self.topo.undrop(i)
        elif name == "netem":
            for v in rec["nodes"]:
                self.topo.unnetem(v)
        rec["stop"] = now
        return rec

    def heal_all(self):
        """Everything back: every node running and resumed, the network whole."""
        for nid, node in self.topo.nodes.items():
            if not node.alive():
                self.topo.launch(nid)
            elif node.paused:
                self.topo.resume(nid)
        self.topo.heal_network()
