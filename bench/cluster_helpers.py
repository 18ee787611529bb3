"""Helpers shared by bench/heal_bench.py and bench/balancer_bench.py: a harness.Cluster
whose later nodes start on demand, a fast acks=all fill, waits on the controller's view,
counts read back with a consumer, on-disk partition sizes, and counting controller log
lines."""
import math
import os
import re
import sys
import time

import confluent_kafka as ck

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "kafka"))
import harness  # noqa: E402

MB = 1_000_000
# Broker log filter: warnings, plus the controller's info lines (fencing, moves started
# and completed), which the scripts count.
RUST_LOG = "warn,strom::controller=info"


def default_binary():
    return os.path.abspath(os.environ.get("STROM_BIN") or os.path.join(REPO, "target", "release", "strom"))


def add_common_args(ap, limits=False):
    ap.add_argument("--binary", "--bin", dest="binary", default=default_binary(),
                    help="strom binary (default: $STROM_BIN, else target/release/strom)")
    ap.add_argument("--record-size", type=int, default=1024, help="value bytes per record of the fill")
    ap.add_argument("--max-moves", type=int, default=4, help="balancer.max.concurrent.moves")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra broker setting (repeatable)")
    ap.add_argument("--timeout", type=float, default=3600, help="deadline of each wait, s")
    if limits:
        ap.add_argument("--disk-mb", type=int, default=512, help="size of the disk write probe, MB")
        ap.add_argument("--loopback-mb", type=int, default=2048, help="bytes pushed by the loopback probe, MB")
    ap.add_argument("--rust-log", default=RUST_LOG)
    ap.add_argument("--keep", action="store_true", help="keep the data directories and logs")


class Cluster(harness.Cluster):
    """harness.Cluster whose nodes in `later` the constructor does not launch (they are
    never registered until `launch(nid)` is called)."""

    def __init__(self, directory, n, later=(), **kw):
        self._later = set(later)
        super().__init__(directory, n=n, **kw)
        self._later = set()

    def launch(self, nid):
        if nid in self._later:
            return
        super().launch(nid)

    @property
    def bootstrap(self):
        """The Kafka listeners of the running nodes only."""
        return ",".join(self.nodes[nid].kafka for nid in self.running())


def start(directory, n, settings, binary, rust_log, later=(), timeout=120):
    """A cluster of n nodes (the first 3 voters) of which those not in `later` are up:
    ready, one controller, that many active brokers, Kafka listeners answering."""
    c = Cluster(directory, n, later=later, settings=tuple(settings), binary=binary, rust_log=rust_log)
    try:
        c.wait_active(n=n - len(later), timeout=timeout)
        c.wait_kafka()
    except BaseException as e:
        tails = c.log_tails()
        c.close()
        raise RuntimeError(f"cluster in {directory} did not come up: {e}\n{tails}") from None
    return c


def controller_id(cluster, avoid=()):
    """The controller id as the first running node (not in `avoid`) that answers sees it."""
    for nid in cluster.running():
        if nid in avoid:
            continue
        view = cluster.cluster_view(nid)
        if view and view.get("controller_id") is not None:
            return view["controller_id"]
    return None


def partitions(cluster, topic, via):
    """{partition: partition json} as node `via` sees topic, or None."""
    t = cluster.topic(topic, via=via)
    return {p["partition"]: p for p in t["partitions"]} if t else None


def fully_replicated(ps, rf, count, excluded=()):
    """Every one of `count` partitions has rf replicas, none in `excluded`, ISR == replicas,
    a leader, and no reassignment."""
    return (ps is not None and len(ps) == count and all(
        len(p["replicas"]) == rf and sorted(p["isr"]) == sorted(p["replicas"]) and p["leader"] is not None
        and p["reassignment"] is None and not set(p["replicas"]) & set(excluded) for p in ps.values()))


def wait_fully_replicated(cluster, topic, rf, count, timeout, records=None, excluded=()):
    """Waits until fully_replicated holds on the controller and every high watermark is
    known (leaders answer the controller within a second), and equals `records` when
    given; returns {partition: partition json}."""
    def check():
        cluster.check_alive()
        via = controller_id(cluster, avoid=excluded)
        ps = partitions(cluster, topic, via) if via else None
        if not fully_replicated(ps, rf, count, excluded):
            return None
        hwms = [p["high_watermark"] for p in ps.values()]
        if any(h is None for h in hwms) or (records is not None and any(h != records for h in hwms)):
            return None
        return ps
    return harness.wait_for(f"every ISR of {topic} full ({rf} replicas) and every high watermark known",
                            timeout, check, interval=0.2)


def fill(bootstrap, topic, partitions, per_partition, record_size, timeout):
    """per_partition records of record_size random bytes into each partition, round
    robin, acks=all, large batches; seconds taken."""
    p = ck.Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 50, "batch.size": 1_000_000,
                     "batch.num.messages": 100_000, "queue.buffering.max.kbytes": 1_048_576,
                     "queue.buffering.max.messages": 2_000_000, "enable.idempotence": False,
                     "compression.type": "none", "message.timeout.ms": int(timeout * 1000),
                     "delivery.report.only.error": True, "log_level": 0})
    values = [os.urandom(record_size) for _ in range(16)]
    errors = []

    def on_delivery(err, _msg):
        if err is not None:
            errors.append(err)

    deadline = time.monotonic() + timeout
    t = time.perf_counter()
    for i in range(partitions * per_partition):
        while True:
            try:
                p.produce(topic, values[i & 15], partition=i % partitions, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.01)
                if time.monotonic() > deadline:
                    raise SystemExit("fill: the producer queue stayed full past the deadline")
        if i & 4095 == 0:
            p.poll(0)
    left = p.flush(max(1.0, deadline - time.monotonic()))
    if left or errors:
        raise SystemExit(f"fill failed: {left} undelivered, {len(errors)} errors, first {errors[:3]}")
    return time.perf_counter() - t


def create_filled(cluster, topic, args, rf):
    """Creates `topic` (args.partitions partitions, RF rf), fills it with args.mb MB of
    args.record_size records, the same count in every partition, and waits until every
    ISR is full: (records per partition, payload bytes, the partitions as then)."""
    count = args.partitions
    cluster.create_topic(topic, partitions=count, rf=rf)
    cluster.wait_topic(topic, count, timeout=120)
    per_partition = max(1, args.mb * MB // args.record_size // count)
    took = fill(cluster.bootstrap, topic, count, per_partition, args.record_size, args.timeout)
    payload = per_partition * count * args.record_size
    print(f"filled: {count} partitions x {per_partition} records of {args.record_size} B = {payload / MB:.0f} MB "
          f"in {took:.1f} s ({payload / MB / took:.0f} MB/s, acks=all)", flush=True)
    before = wait_fully_replicated(cluster, topic, rf, count, args.timeout, records=per_partition)
    return per_partition, payload, before


def read_counts(bootstrap, topic, expected, timeout):
    """Reads partitions `expected` ({partition: records}) from offset 0 with one consumer
    until each has given its count or the deadline passes; {partition: records read}."""
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-verify-{time.time_ns()}",
                     "enable.auto.commit": False, "enable.partition.eof": False, "log_level": 0,
                     "fetch.max.bytes": 52_428_800, "max.partition.fetch.bytes": 10_485_760,
                     "queued.max.messages.kbytes": 262_144})
    got = {p: 0 for p in expected}
    try:
        c.assign([ck.TopicPartition(topic, p, 0) for p in expected])
        deadline = time.monotonic() + timeout
        while any(got[p] < n for p, n in expected.items()) and time.monotonic() < deadline:
            for m in c.consume(num_messages=10_000, timeout=0.5):
                if m.error():
                    raise SystemExit(f"consumer error: {m.error()}")
                got[m.partition()] += 1
        # Anything beyond the expected count would show up right after it.
        end = time.monotonic() + 1
        while time.monotonic() < end:
            for m in c.consume(num_messages=10_000, timeout=0.2):
                if not m.error():
                    got[m.partition()] += 1
    finally:
        c.close()
    return got


def log_bytes(node, topic, partition):
    """Bytes of the segment files (*.log) of topic-partition in node's data directory;
    None when the directory is missing."""
    d = os.path.join(node.data_dir, "logs", f"{topic}-{partition}")
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return None
    return sum(os.path.getsize(os.path.join(d, f)) for f in names if f.endswith(".log"))


def log_marks(cluster):
    """The current size of every node's log file, to count lines written after it."""
    return {nid: (os.path.getsize(n.log) if os.path.exists(n.log) else 0) for nid, n in cluster.nodes.items()}


def sum_log_field(cluster, marks, message, field):
    """Sum over every node's log lines written since `marks` that contain `message` of
    the integer `field=N` on them, and the number of such lines."""
    pattern = re.compile(rf"\b{re.escape(field)}=(\d+)")
    total = lines = 0
    for nid, node in cluster.nodes.items():
        if not os.path.exists(node.log):
            continue
        with open(node.log, "rb") as f:
            f.seek(marks.get(nid, 0))
            for raw in f:
                line = raw.decode(errors="replace")
                if message in line:
                    m = pattern.search(line)
                    lines += 1
                    total += int(m.group(1)) if m else 0
    return total, lines


def min_moves(counts, total=None, brokers=None):
    """The fewest items that must leave the brokers of `counts` ({broker: items}) for every
    one of `brokers` (default: the keys) to hold floor or ceil of total/len(brokers): the
    most loaded get the ceilings."""
    brokers = sorted(brokers if brokers is not None else counts)
    total = sum(counts.values()) if total is None else total
    q, r = divmod(total, len(brokers))
    ordered = sorted(brokers, key=lambda b: -counts.get(b, 0))
    targets = {b: q + (1 if i < r else 0) for i, b in enumerate(ordered)}
    return sum(max(0, counts.get(b, 0) - targets[b]) for b in brokers), targets


def ceil_div(a, b):
    return -(-a // b) if b else math.nan
