"""Kafka transactions (KIP-98, KIP-447) with the JVM ecosystem against a three-node
cluster: the reference Java client (kafka-clients 4.4, tests/jvm/StromTxn.java) commits
and aborts interleaved transactions that read_committed consumers read exactly once and
read_uncommitted ones read whole; its read-process-write loop (sendOffsetsToTransaction
with the consumer's group metadata) writes exactly one output record per input record
across the SIGKILL of a broker leading an input partition; a second producer instance
with the same transactional id fences the first one, whose records no read_committed
consumer ever sees. Kafka's kafka-transactions tool (list, describe, describe-producers,
find-hanging) shows an open transaction and then its commit.

StromTxn.java is compiled once per module (javac into the module's tmp dir) and run
as a class, one JVM per scenario."""
import concurrent.futures
import os
import queue
import subprocess
import tempfile
import threading
import time
import uuid

import confluent_kafka as ck
import pytest

import harness
import jvm
import wire

SOURCE = os.path.join(jvm.REPO, "tests", "jvm", "StromTxn.java")
NONE = 0
FENCED = ("org.apache.kafka.common.errors.ProducerFencedException",
          "org.apache.kafka.common.errors.InvalidProducerEpochException")


@pytest.fixture(scope="module")
def classes(tmp_path_factory):
    """The directory StromTxn.class is compiled into."""
    jvm.require()
    out = str(tmp_path_factory.mktemp("strom-txn-classes"))
    p = subprocess.run(["javac", "-d", out, "-cp", os.path.join(jvm.LIB, "*"), SOURCE], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, f"javac {SOURCE}:\n{p.stderr[-4000:]}"
    return out


def command(classes, *args):
    return ["java", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp",
            classes + os.pathsep + os.path.join(jvm.LIB, "*"), "StromTxn", *args]


def run(classes, *args, timeout=120):
    """Runs StromTxn with args to its end; its stdout lines, split into words."""
    p = subprocess.run(command(classes, *args), capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"StromTxn {args[0]} exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"
    return [line.split(" ") for line in p.stdout.splitlines()]


class Running:
    """StromTxn running in the background: its stdout lines (split into words) come through
    a queue filled by a reader thread; stderr goes to a file. Killed by close()."""

    def __init__(self, classes, *args, stdin=False):
        self.errors = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(command(classes, *args), stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=self.errors, text=True)
        self.lines = queue.Queue()
        self.seen = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n").split(" "))
        self.lines.put(None)

    def stderr_tail(self):
        self.errors.flush()
        self.errors.seek(0)
        return self.errors.read()[-4000:]

    def _next(self, deadline, what):
        """The next line's words, None at the end of the output; fails at the deadline."""
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"timed out waiting for {what}; stderr:\n{self.stderr_tail()}"
            try:
                words = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if words is not None:
                self.seen.append(words)
            return words

    def expect(self, what, timeout, match):
        """Reads lines until match(words) is true (returns those words); fails at the end of
        the output or after timeout s."""
        deadline = time.monotonic() + timeout
        while True:
            words = self._next(deadline, what)
            assert words is not None, (f"StromTxn ended (exit {self.proc.wait()}) before {what}; "
                                       f"stderr:\n{self.stderr_tail()}")
            if match(words):
                return words

    def finish(self, timeout):
        """Waits for the end of the process (exit 0); every line it printed."""
        deadline = time.monotonic() + timeout
        while self._next(deadline, "the end of StromTxn") is not None:
            pass
        code = self.proc.wait(timeout=30)
        assert code == 0, f"StromTxn exited {code}:\n{self.stderr_tail()}"
        return self.seen

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.errors.close()


def records(lines, tag):
    """{partition: [(offset, value)]} of the lines "<tag> <partition> <offset> <value>"."""
    out = {}
    for words in lines:
        if words[0] == tag:
            out.setdefault(int(words[1]), []).append((int(words[2]), words[3]))
    return out


def produced(lines, flag=None):
    """{partition: [(offset, value)]} of the "P <flag> ..." lines (any flag when None)."""
    out = {}
    for words in lines:
        if words[0] == "P" and flag in (None, words[1]):
            out.setdefault(int(words[2]), []).append((int(words[3]), words[4]))
    return out


def ends(lines, tag):
    return {int(w[2]): int(w[3]) for w in lines if w[0] == "END" and w[1] == tag}


def new_topic(cluster, prefix, partitions):
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(name, partitions=partitions, rf=3, configs={"min.insync.replicas": "2"})
    cluster.wait_topic(name, partitions)
    return name


def coordinator(cluster, key, key_type):
    """The node FindCoordinator names for key (key_type 0: group, 1: transactional id)."""
    def ask():
        err, node, _, _ = wire.find_coordinator(cluster.node(cluster.running()[0]).kafka_addr, key, key_type=key_type)
        return node if err == NONE else None

    return harness.wait_for(f"the coordinator of {key!r} (key type {key_type})", 30, ask)


# ---- the Java client ------------------------------------------------------------------------

def test_java_transactions_commit_and_abort_interleaved(classes, cluster3):
    """Two Java transactional producers interleave the records of concurrent transactions on
    three partitions and end them (commit, abort), (abort, commit), (commit, commit),
    (abort, abort)."""
    topic = new_topic(cluster3, "jtxn", 3)
    lines = run(classes, "commit-abort", cluster3.bootstrap, topic, "3", f"jtxn-{uuid.uuid4().hex[:6]}")
    committed, everything = produced(lines, "C"), produced(lines)
    rc, ru = records(lines, "RC"), records(lines, "RU")
    for part in range(3):
        assert len(everything[part]) == 80 and len(committed[part]) == 40, (part, len(everything[part]))
        assert everything[part] == sorted(everything[part]), f"partition {part}: not delivered in order"
        assert rc.get(part) == committed[part], (
            f"partition {part}: read_committed did not read exactly the committed records, once each, in order, "
            f"at their delivered offsets (read {len(rc.get(part, []))} of {len(committed[part])})")
        assert ru.get(part) == everything[part], f"partition {part}: read_uncommitted reads every record, no marker"
    # Each transaction ended with a marker in every partition: 8 of them past the 80 records;
    # with no transaction open, read_committed's end (the LSO) is the log's end.
    assert ends(lines, "RU") == {p: 88 for p in range(3)}, ends(lines, "RU")
    assert ends(lines, "RC") == ends(lines, "RU")


def test_java_zombie_producer_is_fenced(classes, cluster3):
    """Producer B's initTransactions with A's transactional id aborts A's open transaction
    before it returns and bumps the epoch: A's commitTransaction throws
    ProducerFencedException, A can do nothing more, and only B's records are committed."""
    topic = new_topic(cluster3, "jfence", 1)
    lines = run(classes, "fence", cluster3.bootstrap, topic, f"jfence-{uuid.uuid4().hex[:6]}")
    zombie, fresh = produced(lines, "A")[0], produced(lines, "B")[0]
    assert [v for _, v in zombie] == [f"zombie-{i}" for i in range(5)]
    assert ["END", "AFTER-INIT", "0", "6"] in lines, (
        "initTransactions returns once the previous instance's transaction is aborted (its marker at offset 5)")
    fenced = next(w for w in lines if w[0] in ("FENCED", "NOT-FENCED"))
    assert fenced[0] == "FENCED" and fenced[1] in FENCED, f"the zombie's commit: {fenced}"
    assert next(w[0] for w in lines if w[0] in ("FENCED-AGAIN", "NOT-FENCED-AGAIN")) == "FENCED-AGAIN"
    assert records(lines, "RC") == {0: fresh}, "read_committed reads B's records only"
    assert records(lines, "RU") == {0: zombie + fresh}, "the zombie's records were written, then aborted"


# ---- Kafka's kafka-transactions tool --------------------------------------------------------

def tool(*args, ok=True, timeout=60):
    """Runs kafka-transactions with args: its stdout (with ok=False: its exit code, stdout
    and stderr)."""
    p = subprocess.run(jvm.command("org.apache.kafka.tools.TransactionsCommand", *args), capture_output=True,
                       text=True, timeout=timeout)
    if not ok:
        return p.returncode, p.stdout, p.stderr
    assert p.returncode == 0, f"kafka-transactions {' '.join(args)} exited {p.returncode}:\n{p.stdout}\n{p.stderr[-4000:]}"
    return p.stdout


def tools(*runs):
    """Runs kafka-transactions once for each run, at the same time (each a JVM start-up of a
    few seconds); their results in order. A run: the arguments, or (arguments, {"ok": False})."""
    with concurrent.futures.ThreadPoolExecutor(len(runs)) as pool:
        futures = [pool.submit(tool, *run[0], **run[1]) if isinstance(run[-1], dict) else pool.submit(tool, *run)
                   for run in runs]
        return [f.result() for f in futures]


def table(out):
    """A kafka-transactions table as a list of {header: value} (an empty last column is left out)."""
    header, *rows = [line.split() for line in out.strip().splitlines()]
    return [dict(zip(header, row)) for row in rows]


def test_kafka_transactions_tool(classes, cluster3):
    """kafka-transactions list / describe / describe-producers / find-hanging while a Java
    producer holds a transaction open on partitions 0 and 1, and describe /
    describe-producers / list --transactional-id-pattern after it commits; describe of an
    unknown transactional id fails, and so does list with an invalid pattern."""
    b = ("--bootstrap-server", cluster3.bootstrap)
    topic = new_topic(cluster3, "jtool", 2)
    txn_id = f"jtool-{uuid.uuid4().hex[:6]}"
    describe = (*b, "describe", "--transactional-id", txn_id)
    producers = (*b, "describe-producers", "--topic", topic, "--partition", "1")
    holder = Running(classes, "hold", cluster3.bootstrap, topic, txn_id, stdin=True)
    try:
        holder.expect("the open transaction", 60, lambda w: w == ["OPEN"])
        held = produced(holder.seen)
        assert sorted(held) == [0, 1] and all(len(v) == 3 for v in held.values()), held
        node = coordinator(cluster3, txn_id, 1)

        described, listed, described_producers, hanging = tools(
            describe, (*b, "list"), producers, (*b, "find-hanging", "--topic", topic, "--max-transaction-timeout", "0"))
        [d] = table(described)
        assert d["CoordinatorId"] == str(node), d
        assert d["TransactionalId"] == txn_id and d["TransactionState"] == "Ongoing", d
        assert set(d["TopicPartitions"].split(",")) == {f"{topic}-0", f"{topic}-1"}, d
        assert d["TransactionTimeoutMs"] == "60000", d  # the Java client's default
        assert int(d["CurrentTransactionStartTimeMs"]) <= time.time() * 1000, d
        pid, epoch = d["ProducerId"], d["ProducerEpoch"]

        mine = [r for r in table(listed) if r["TransactionalId"] == txn_id]
        assert mine == [{"TransactionalId": txn_id, "Coordinator": str(node), "ProducerId": pid,
                         "TransactionState": "Ongoing"}], listed

        [r] = table(described_producers)
        assert (r["ProducerId"], r["ProducerEpoch"], r["LastSequence"]) == (pid, epoch, "2"), r
        assert r["CurrentTransactionStartOffset"] == str(held[1][0][0]), (r, held[1])

        # Open longer than 0 minutes, so a candidate; but its coordinator lists it (ListTransactions
        # by producer id) with both partitions (DescribeTransactions): not hanging.
        assert table(hanging) == [], hanging

        holder.proc.stdin.write("commit\n")
        holder.proc.stdin.flush()
        holder.expect("the commit", 60, lambda w: w == ["COMMITTED"])

        pattern = (*b, "list", "--transactional-id-pattern")
        described, described_producers, unknown, whole, part, bad = tools(
            describe, producers, ((*b, "describe", "--transactional-id", f"never-{txn_id}"), {"ok": False}),
            (*pattern, txn_id[:-1] + "."), (*pattern, txn_id[:-1]), ((*pattern, "jtool-("), {"ok": False}))
        # ListTransactions v2 (KIP-1152): the pattern must match the whole id.
        assert [r["TransactionalId"] for r in table(whole)] == [txn_id], whole
        assert table(part) == [], part
        code, _, err = bad
        assert code != 0 and "unexpected error INVALID_REGULAR_EXPRESSION" in err, (code, err[-2000:])
        [d] = table(described)
        assert d["TransactionState"] == "CompleteCommit", d
        assert (d["ProducerId"], d["ProducerEpoch"]) == (pid, epoch), d
        assert "TopicPartitions" not in d, d
        [r] = table(described_producers)
        assert r["ProducerId"] == pid and r["CurrentTransactionStartOffset"] == "None", r
        assert int(r["LatestCoordinatorEpoch"]) >= 0, f"the commit marker's coordinator epoch: {r}"
        # TRANSACTIONAL_ID_NOT_FOUND, as the tool words it.
        code, _, err = unknown
        assert code != 0 and "failed because the ID could not be found" in err, (code, err)
        holder.proc.stdin.close()
        holder.finish(30)
    finally:
        holder.close()


def test_kafka_transactions_describe_producers_on_a_follower(classes, cluster3):
    """describe-producers --broker-id asks one replica of its choice (KIP-664: DescribeProducers
    may go to any replica, and Kafka's brokers answer for followers from their own producer
    state): a follower shows the same open transaction as the leader. find-hanging
    --broker-id, which asks that broker about every partition it holds, finds nothing
    hanging."""
    b = ("--bootstrap-server", cluster3.bootstrap)
    topic = new_topic(cluster3, "jfollower", 2)
    txn_id = f"jfollower-{uuid.uuid4().hex[:6]}"
    holder = Running(classes, "hold", cluster3.bootstrap, topic, txn_id, stdin=True)
    try:
        holder.expect("the open transaction", 60, lambda w: w == ["OPEN"])
        partition = cluster3.topic(topic)["partitions"][1]
        follower = next(r for r in partition["replicas"] if r != partition["leader"])
        producers = (*b, "describe-producers", "--topic", topic, "--partition", "1")
        on_leader, on_follower, hanging = tools(
            producers, ((*producers, "--broker-id", str(follower)), {"ok": False}),
            ((*b, "find-hanging", "--broker-id", str(follower), "--max-transaction-timeout", "0"), {"ok": False}))
        holder.proc.stdin.write("commit\n")
        holder.proc.stdin.close()
        holder.finish(60)
    finally:
        holder.close()
    [r] = table(on_leader)
    assert r["CurrentTransactionStartOffset"] == "0", r
    code, out, err = on_follower
    assert code == 0, f"describe-producers on follower {follower} of {topic}-1 failed:\n{err}"
    assert table(out) == [r], f"the follower's producer state differs from the leader's:\n{out}"
    code, out, err = hanging
    assert code == 0 and table(out) == [], f"find-hanging --broker-id {follower}:\n{out}\n{err}"


# ---- read-process-write across a broker's death ------------------------------------------------

def test_java_read_process_write_across_a_leader_kill(classes, cluster3):
    """The loop runs over 3 input partitions (1200 records, produced in two halves), every
    7th transaction aborted on purpose (its records written, the member rewound); once it
    has committed a quarter, a broker leading an input partition (neither the transaction
    coordinator of its id nor its group's coordinator) is SIGKILLed, and the second half is
    produced to the new leaders. The output, read_committed, holds exactly one transformed
    record per input record, in input order, and the group's offsets are at the input's
    end."""
    c = cluster3
    per_partition, parts = 400, 3
    src, dst = new_topic(c, "jrpw-in", parts), new_topic(c, "jrpw-out", parts)
    # A transactional id and a group with the same coordinator: either other broker that
    # leads an input partition (when the kill comes) is a victim.
    for _ in range(100):
        tag = uuid.uuid4().hex[:8]
        txn_id, group = f"jrpw-{tag}", f"jrpw-group-{tag}"
        coordinators = {coordinator(c, txn_id, 1), coordinator(c, group, 0)}
        if len(coordinators) == 1:
            break
    else:
        pytest.fail("no transactional id found with its group's coordinator")

    inputs = {p: [f"in-{p}-{i}" for i in range(per_partition)] for p in range(parts)}

    def produce(half):
        p = ck.Producer({"bootstrap.servers": ",".join(c.node(n).kafka for n in c.running()),
                         "enable.idempotence": True, "linger.ms": 5})
        lo, hi = half * per_partition // 2, (half + 1) * per_partition // 2
        for part, values in inputs.items():
            for i in range(lo, hi):
                p.produce(src, key=f"k{i}".encode(), value=values[i].encode(), partition=part)
        assert p.flush(60) == 0, "input records undelivered after 60 s"

    produce(0)
    victim = None
    loop = Running(classes, "rpw", c.bootstrap, src, dst, str(parts), group, txn_id, str(per_partition * parts), "150")
    try:
        loop.expect("a quarter of the input committed", 90,
                    lambda w: w[0] == "COMMITTED" and int(w[1]) >= per_partition * parts // 4)
        leaders = c.leaders(src)
        victim = next((n for n in sorted(set(leaders.values())) if n not in coordinators), None)
        assert victim is not None, f"every input partition is led by the coordinator: {leaders} {coordinators}"
        c.kill(victim)
        survivor = next(n for n in c.running())
        harness.wait_for("every input partition led by a live broker", 30,
                         lambda: all(l not in (None, victim) for l in c.leaders(src, via=survivor).values()))
        produce(1)
        lines = loop.finish(150)
    finally:
        loop.close()
        if victim is not None and victim not in c.running():
            c.launch(victim)
            c.wait_ready()
    failed = [" ".join(w) for w in lines if w[0] == "ABORTED"]
    on_purpose = sum(int(w[1]) for w in lines if w[0] == "ABORTED-ON-PURPOSE")
    assert on_purpose > 0, "some transactions were aborted on purpose"
    assert {int(w[1]): int(w[2]) for w in lines if w[0] == "GROUP"} == {p: per_partition for p in range(parts)}
    got, everything = records(lines, "RC"), records(lines, "RU")
    for part in range(parts):
        assert [v for _, v in got.get(part, [])] == [f"out:{v}" for v in inputs[part]], (
            f"partition {part}: not exactly one output record per input record, in order "
            f"({len(got.get(part, []))} records; {len(failed)} failed transactions: {failed[:5]})")
    # The aborted transactions' records are in the log, and only read_uncommitted reads them.
    assert sum(map(len, everything.values())) >= parts * per_partition + on_purpose
