"""A Kafka Streams 4.4 application with processing.guarantee=exactly_once_v2 against a
three-node cluster (tests/jvm/StromStreams.java, a separate JVM): a word count reads lines,
repartitions them by word through an internal topic, counts in a RocksDB store backed by a
compacted changelog topic, and writes every count update to an output topic. Streams
creates its internal topics itself (CreateTopics with configs), and commits through the
transaction coordinator (one transactional producer per stream thread,
sendOffsetsToTransaction with the group's metadata).

The broker leading every input partition is SIGKILLed while the application is
processing, the second half of the input is produced to the new leaders, and the broker
is launched again. A read_committed consumer then sees, for every word, the counts
1, 2, ..., n (the record cache is off, so each occurrence emits one update): strictly
increasing, none skipped, none repeated, and the last one the count a model computes from
the input. Any duplicate or lost update from a transaction that was not atomic, or an
aborted transaction read, breaks that sequence.

STROM_STREAMS_ROUNDS=5 repeats it five times (a fresh cluster each round; the broker
killed changes from round to round); the default is one round."""
import os
import random
import re
import struct
import subprocess
import time
import uuid
from collections import Counter

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

import harness
import jvm

SOURCE = os.path.join(jvm.REPO, "tests", "jvm", "StromStreams.java")
ROUNDS = int(os.environ.get("STROM_STREAMS_ROUNDS", "1"))
SETTINGS = harness.FAST + ("balancer.mode=off",)  # the input's leaders stay where the test put them
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliett", "kilo",
         "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor",
         "whiskey", "xray", "yankee", "zulu"]
LINES, PARTITIONS = 3000, 3
SENTINEL = b"end-of-partition"


@pytest.fixture(scope="module")
def classes(tmp_path_factory):
    jvm.require()
    out = str(tmp_path_factory.mktemp("strom-streams-classes"))
    p = subprocess.run(["javac", "-d", out, "-cp", os.path.join(jvm.LIB, "*"), SOURCE], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, f"javac {SOURCE}:\n{p.stderr[-4000:]}"
    return out


def lines_of(seed):
    """LINES lines of 1-8 words, with capitals and punctuation the splitter removes."""
    rng = random.Random(seed)
    out = []
    for _ in range(LINES):
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 8))]
        if rng.random() < 0.3:
            words[0] = words[0].capitalize()
        out.append(rng.choice(["", "- "]) + " ".join(words) + rng.choice(["", ".", "!", " ?"]))
    return out


def model(lines):
    return Counter(w for line in lines for w in re.split(r"\W+", line.lower(), flags=re.ASCII) if w)


class Output:
    """A read_committed consumer of the output topic that keeps, for every word, the counts
    it read in order."""

    def __init__(self, bootstrap, topic):
        self.consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex[:8]}",
                                     "isolation.level": "read_committed", "enable.auto.commit": False})
        self.consumer.assign([ck.TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        self.counts = {}  # word -> [count, ...]
        self.ended = set()  # partitions whose sentinel was read

    def poll(self):
        for m in self.consumer.consume(num_messages=1000, timeout=0.2):
            assert not m.error(), f"output consumer: {m.error()}"
            assert m.partition() not in self.ended, f"partition {m.partition()}: a record after the sentinel"
            if m.value() == SENTINEL:
                self.ended.add(m.partition())
                continue
            (count,) = struct.unpack(">q", m.value())
            self.counts.setdefault(m.key().decode(), []).append(count)

    def last(self):
        return {w: counts[-1] for w, counts in self.counts.items()}

    def close(self):
        self.consumer.close()


def produce(bootstrap, topic, lines, first):
    p = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i, line in enumerate(lines):
        n = first + i
        p.produce(topic, key=str(n).encode(), value=line.encode(), partition=n % PARTITIONS)
    assert p.flush(60) == 0, "input lines undelivered after 60 s"


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_streams_word_count_exactly_once_across_a_leader_kill(classes, make_cluster, tmp_path, round_):
    c = make_cluster(3, SETTINGS)
    victim = 1 + round_ % 3
    others = [n for n in (1, 2, 3) if n != victim]
    tag = uuid.uuid4().hex[:8]
    app, src, dst = f"wordcount-{tag}", f"lines-{tag}", f"counts-{tag}"
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    assignment = [[victim, *others], [victim, *reversed(others)], [victim, *others]]
    isr = {"min.insync.replicas": "2"}
    futures = admin.create_topics([
        NewTopic(src, num_partitions=PARTITIONS, replica_assignment=assignment, config=isr),
        NewTopic(dst, num_partitions=PARTITIONS, replication_factor=3, config=isr)])
    for f in futures.values():
        f.result(30)
    c.wait_topic(src, PARTITIONS)
    c.wait_topic(dst, PARTITIONS)
    assert set(c.leaders(src).values()) == {victim}, c.leaders(src)

    lines = lines_of(seed=round_)
    want = model(lines)
    total = sum(want.values())
    half = LINES // 2
    produce(c.bootstrap, src, lines[:half], 0)
    first_half_words = sum(model(lines[:half]).values())

    # The application's output, kept in the test's tmp dir.
    stdout, errors = open(tmp_path / "streams.out", "w"), open(tmp_path / "streams.err", "w+")
    cmd = ["java", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp",
           classes + os.pathsep + os.path.join(jvm.LIB, "*"), "StromStreams", c.bootstrap, app, src, dst,
           str(tmp_path / "state"), "2"]
    streams = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=stdout, stderr=errors, text=True)
    out = Output(c.bootstrap, dst)

    def app_output():
        stdout.flush()
        errors.flush()
        with open(tmp_path / "streams.out") as f:
            text = f.read()
        errors.seek(0)
        return f"stdout:\n{text[-3000:]}\nstderr:\n{errors.read()[-6000:]}"

    def counted():
        return sum(out.last().values())

    def until(what, timeout, done):
        """Reads the output until done() (the application must keep running meanwhile)."""
        deadline = time.monotonic() + timeout
        while True:
            assert streams.poll() is None, f"the Streams application exited {streams.returncode}:\n{app_output()}"
            out.poll()
            if done():
                return
            assert time.monotonic() < deadline, (
                f"timed out after {timeout} s waiting for {what}: {counted()} of {total} words counted\n"
                f"{app_output()}")

    try:
        until("a quarter of the words counted", 120, lambda: counted() >= first_half_words // 2)
        c.kill(victim)
        harness.wait_for("every input partition led by a live broker", 30,
                         lambda: all(l in others for l in c.leaders(src, via=others[0]).values()))
        produce(",".join(c.node(n).kafka for n in others), src, lines[half:], half)
        until("three quarters of the words counted", 120, lambda: counted() >= total * 3 // 4)
        c.launch(victim)
        c.wait_ready()
        # Every word counted, or one counted past the model (the checks below say how).
        until("every word counted", 120, lambda: out.last() == want or any(
            n > want.get(w, 0) for w, n in out.last().items()))

        # A clean stop (its last transaction committed), then a sentinel ends each partition:
        # the consumer has then read everything the application ever committed.
        streams.stdin.close()
        code = streams.wait(90)
        assert code == 0, f"the Streams application's stop (exit 3: its close timed out):\n{app_output()}"
        p = ck.Producer({"bootstrap.servers": c.bootstrap})
        for part in range(PARTITIONS):
            p.produce(dst, value=SENTINEL, partition=part)
        assert p.flush(30) == 0
        deadline = time.monotonic() + 60
        while len(out.ended) < PARTITIONS:
            assert time.monotonic() < deadline, f"the sentinels of {sorted(out.ended)} only after 60 s"
            out.poll()
    finally:
        out.close()
        if streams.poll() is None:
            streams.kill()
            streams.wait()
        errors.close()
        stdout.close()

    for word, counts in out.counts.items():
        assert all(a < b for a, b in zip(counts, counts[1:])), (
            f"{word}: the counts went backwards or repeated: {counts}")
        assert counts == list(range(1, want.get(word, 0) + 1)), (
            f"{word}: with the cache off each occurrence emits one update; a count was skipped: {counts}")
    assert out.last() == want, "the last count of each word is the model's"
