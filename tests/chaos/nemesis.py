"""Fault schedules (a pure function of the seed and options) and the nemeses that carry
them out.

A schedule is a list of operations, each {"id", "nemesis", "at", "duration", ...}: the
fault starts `at` seconds after the workload started and is healed `duration` seconds
later. Every nemesis draws its own faults from its own random stream (seeded with
"SEED/NAME"), one at a time with quiet gaps between them; faults of different nemeses
overlap, as Jepsen's composed nemeses do. Targets that depend on the cluster's state
("the controller", "the leader of partition 3") are resolved when the fault starts, and
the run records which nodes they were.

clock, disk and power need the topology made for them (Topology(clock=, disk=, power=)):
libfaketime preloaded into every node, every node's data on a small tmpfs, every node's
data dir on lossyfs.
"""
import random
import threading
import time

IMPLEMENTED = ("kill", "pause", "partition", "netem", "degrade", "clock", "disk", "power")
NOT_IMPLEMENTED = ()

# (shortest, longest) fault, in seconds. A power fault's duration is how long the
# cluster stays dark before every node is restarted.
FAULT_S = {"kill": (2.0, 10.0), "pause": (2.0, 10.0), "partition": (3.0, 12.0), "netem": (5.0, 15.0),
           "degrade": (5.0, 15.0),            "clock": (5.0, 20.0), "disk": (5.0, 15.0), "power": (1.0, 4.0)}
QUIET_S = (3.0, 10.0)
# A whole cluster restarting needs longer between power losses to show it recovered.
QUIET_OF = {"power": (20.0, 40.0)}

# The clock nemesis: one node's realtime clock jumps by OFFSET (either sign) and is held
# there (`bump`), or flips between the true time and the offset every PERIOD (`strobe`);
# at the heal it jumps back.
CLOCK_MODES = ("bump", "strobe")
CLOCK_OFFSETS_S = (2, 10, 60, 300)
CLOCK_STROBE_PERIODS_S = (0.2, 0.5, 1.0)

PARTITION_FLAVORS = ("isolate", "halves", "bridge", "one-way")
NETEM_SPECS = (
    "delay 100ms 50ms distribution normal",
    "delay 20ms 10ms reorder 25% 50%",
    "loss 20%",
    "duplicate 20%",
    "delay 200ms 100ms loss 5% duplicate 5% reorder 10%",
)
# What degrades a link without the kernel's netem: random loss (nftables) and a slow
# link (tbf, whose queue adds up to 400 ms of delay under load), both ways on one node.
DEGRADE_SPECS = (
    "loss 5%",
    "loss 20%",
    "rate 2mbit",
    "rate 20mbit loss 2%",
    "rate 1mbit loss 10%",
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
            if name == "power":  # every node at once
                ops.append({"nemesis": name, "at": round(t, 2), "duration": round(dur, 2), "target": {"kind": "all"}})
                t += dur + rng.uniform(*QUIET_OF[name])
                continue
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
            elif name == "degrade":
                op["spec"] = rng.choice(DEGRADE_SPECS)
            elif name == "clock":
                op["mode"] = rng.choice(CLOCK_MODES)
                op["offset_s"] = rng.choice(CLOCK_OFFSETS_S) * rng.choice([-1, 1])
                if op["mode"] == "strobe":
                    op["period_s"] = rng.choice(CLOCK_STROBE_PERIODS_S)
            ops.append(op)
            t += dur + rng.uniform(*QUIET_OF.get(name, QUIET_S))
    ops.sort(key=lambda o: (o["at"], o["nemesis"]))
    for i, op in enumerate(ops):
        op["id"] = i
    return ops


def describe(op):
    t = op["target"]
    who = {"node": lambda: f"node {t['node']}", "controller": lambda: "the controller",
           "leader": lambda: f"the leader of partition {t['partition']}", "all": lambda: "every node"}[t["kind"]]()
    extra = ""
    if op["nemesis"] in ("kill", "pause") and op.get("count", 1) > 1:
        extra = f" and {op['count'] - 1} more"
    elif op["nemesis"] == "partition":
        extra = f" ({op['flavor']}{' ' + op['direction'] if 'direction' in op else ''})"
    elif op["nemesis"] in ("netem", "degrade"):
        extra = f" ({op['spec']})"
    elif op["nemesis"] == "clock":
        extra = f" ({op['mode']} {op['offset_s']:+d} s" + (f" every {op['period_s']:g} s)" if "period_s" in op else ")")
    elif op["nemesis"] == "disk":
        extra = " (disk full)"
    elif op["nemesis"] == "power":
        extra = " (power loss: unsynced writes dropped)"
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
        self.held_down = {}  # node -> kill faults on that node still on (a power restore leaves it down)
        self.dark = False  # a power loss is on: nothing is restarted until it ends
        self.threads = []  # (stop event, thread) of strobes and probes
        self.strobes = {}  # op id -> (stop event, thread) of its clock strobe

    def _resolve(self, op):
        t = op["target"]
        node, how = None, None
        if t["kind"] == "all":
            return None, "every node", sorted(self.topo.nodes)
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
                self.held_down[v] = self.held_down.get(v, 0) + 1
            rec["nodes"] = victims
            rec["what"] = f"kill -9 node(s) {victims} ({how})"
        elif name == "pause":
            victims = [v for v in order[:op.get("count", 1)] if self.topo.nodes[v].alive()]
            # The partitions the paused nodes lead: their clients wait out the pause (bounds.py).
            rec["led"] = sorted(p for p, leader in self.topo.leaders(self.topic).items() if leader in victims)
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
        elif name == "degrade":
            self.topo.degrade(node, op["spec"])
            rec["nodes"] = [node]
            rec["what"] = f"degraded link of node {node} ({how}): {op['spec']}"
        elif name == "clock":
            self._start_clock(op, node, how, rec)
        elif name == "disk":
            self._start_disk(node, how, rec)
        elif name == "power":
            self._start_power(rec)
        self.active[op["id"]] = rec
        return rec

    def _background(self, target, *args):
        """Runs target(stop_event, *args) on a thread; returns (the event that stops it, the thread)."""
        stop = threading.Event()
        th = threading.Thread(target=target, args=(stop,) + args, daemon=True)
        th.start()
        self.threads.append((stop, th))
        return stop, th

    def _start_clock(self, op, node, how, rec):
        """One node's realtime clock jumps (its libfaketime file); a strobe flips it on a thread."""
        offset = op["offset_s"]
        self.topo.set_clock(node, offset)
        if op["mode"] == "strobe":
            self.strobes[op["id"]] = self._background(self._strobe, node, offset, op["period_s"])
        rec["nodes"] = [node]
        rec["offset_s"] = offset
        every = f" every {op['period_s']:g} s" if op["mode"] == "strobe" else ""
        rec["what"] = f"clock of node {node} ({how}): {op['mode']} {offset:+d} s{every}"

    def _strobe(self, stop, node, offset, period):
        """Flips the node's clock between the offset (set at the start) and the true time."""
        on = True
        while not stop.wait(period):
            on = not on
            self.topo.set_clock(node, offset if on else 0)

    def _start_disk(self, node, how, rec):
        """One node's tmpfs filled to below storage.min.free.bytes; records the partitions
        it leads and replicates (the ones whose writes it refuses or stops following)."""
        t = self.topo.topic(self.topic, via=self.topo.controller()) or {"partitions": []}
        rec["partitions_led"] = sorted(p["partition"] for p in t["partitions"] if p["leader"] == node)
        rec["partitions_replicated"] = sorted(p["partition"] for p in t["partitions"] if node in p["replicas"])
        rec["disk"] = self.topo.fill_disk(node)
        rec["nodes"] = [node]
        rec["what"] = (f"disk full on node {node} ({how}): {rec['disk']['free_after'] // 1024 // 1024} MiB free; "
                       f"leads partitions {rec['partitions_led']}, replicates {rec['partitions_replicated']}")
        rec["probe"] = {"what": "produce to a partition that does not exist: KAFKA_STORAGE_ERROR (56) while full"}
        self._background(self._probe_refusal, node, rec["probe"])

    def _probe_refusal(self, stop, node, out, within_s=10.0):
        """Proof that the full node answers produce requests with an error rather than
        holding them: a produce to a partition that cannot exist is refused with
        KAFKA_STORAGE_ERROR (56) while the disk is full (the broker checks the disk before
        the partition), UNKNOWN_TOPIC_OR_PARTITION (3) otherwise; nothing is ever written."""
        import wire  # tests/kafka, on the path through topology
        batch = wire.record_batch([(b"chaos-disk-probe", b"")])
        t0 = time.monotonic()
        codes = []
        while not stop.is_set() and time.monotonic() - t0 < within_s:
            t = time.monotonic()
            try:
                code, _ = wire.produce((self.topo.nodes[node].addr, 9092), self.topic, 1_000_000, batch, acks=-1,
                                       timeout_ms=2000)
            except Exception as e:  # noqa: BLE001 - a dead or paused node: try again
                code = f"{type(e).__name__}: {e}"[:100]
            out["answered_in_s"] = round(time.monotonic() - t, 3)
            codes.append(code)
            if code == 56:
                out["refused_after_s"] = round(t - t0, 3)
                break
            stop.wait(0.2)
        out["codes"] = codes[-10:]
        out["refused"] = bool(codes) and codes[-1] == 56

    def _isr_rejoin(self, stop, node, out, partitions, within_s=60.0):
        """After a disk heal: how long until the node is back in the ISR of every
        partition it replicates."""
        t0 = time.monotonic()
        while not stop.is_set() and time.monotonic() - t0 < within_s:
            t = self.topo.topic(self.topic, via=self.topo.controller())
            if t and all(node in p["isr"] for p in t["partitions"] if p["partition"] in partitions):
                out["isr_rejoined_after_s"] = round(time.monotonic() - t0, 2)
                return
            stop.wait(0.5)
        if not stop.is_set():  # (stopped: the run's final heal came first; its health check decides)
            out["isr_rejoined_after_s"] = None

    def _start_power(self, rec):
        """Every node killed at once and its unsynced writes dropped; restarted at the stop."""
        dropped = self.topo.power_off()
        self.dark = True
        rec["nodes"] = sorted(self.topo.nodes)
        rec["dropped"] = {str(i): d for i, d in dropped.items()}
        total = sum(d["bytes"] for d in dropped.values())
        each = ", ".join(f"node {i}: {d['bytes'] // 1024} KiB" for i, d in dropped.items())
        rec["what"] = f"power loss of every node: all killed at once, {total // 1024} KiB not fsynced dropped ({each})"

    def stop(self, op, now):
        rec = self.active.pop(op["id"], None)
        if rec is None:
            return None
        name = op["nemesis"]
        if name == "kill":
            for v in rec["nodes"]:
                self.held_down[v] -= 1
                if not self.held_down[v]:
                    del self.held_down[v]
                # In the dark, the power's restore brings it back.
                if not self.dark and not self.topo.nodes[v].alive():
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
        elif name == "degrade":
            for v in rec["nodes"]:
                self.topo.undegrade(v)
        elif name == "clock":
            if op["id"] in self.strobes:
                stop, th = self.strobes.pop(op["id"])
                stop.set()
                th.join(timeout=5)  # its last flip must not land after the reset
            self.topo.set_clock(rec["nodes"][0], 0)
        elif name == "disk":
            self.topo.free_disk(rec["nodes"][0])
            self._background(self._isr_rejoin, rec["nodes"][0], rec, set(rec["partitions_replicated"]))
        elif name == "power":
            self.dark = False
            rec["restarted"] = [i for i, node in self.topo.nodes.items()
                                if not node.alive() and i not in self.held_down]
            for i in rec["restarted"]:
                self.topo.launch(i)
        rec["stop"] = now
        return rec

    def heal_all(self):
        """Everything back: every node running and resumed, the network whole, clocks
        true, disks with room."""
        for stop, _ in self.threads:
            stop.set()
        for _, th in self.strobes.values():
            th.join(timeout=5)
        for nid, node in self.topo.nodes.items():
            if node.clock_file:
                self.topo.set_clock(nid, 0)
            if node.tmpfs:
                self.topo.free_disk(nid)
        self.strobes.clear()
        self.dark = False
        self.held_down.clear()
        for nid, node in self.topo.nodes.items():
            if not node.alive():
                self.topo.launch(nid)
            elif node.paused:
                self.topo.resume(nid)
        self.topo.heal_network()
