"""Committed offsets never go backwards. One consumer sends 10,000 asynchronous
OffsetCommits for increasing offsets of one partition, back to back, so librdkafka
pipelines them on its coordinator connection, while another group commits to the same
__consumer_offsets partition in a loop. The broker must append a connection's commits
in the order they arrived (Kafka handles a connection's requests in order): a watcher
polling OffsetFetch never sees the committed offset decrease, and once the last commit
callback has fired OffsetFetch answers the last offset committed.

STROM_COMMIT_ORDER_COMMITS sets the number of commits (default 10,000)."""
import os
import threading
import time

from confluent_kafka import Consumer, TopicPartition

import wire
from harness import FAST, wait_for

COMMITS = int(os.environ.get("STROM_COMMIT_ORDER_COMMITS", "10000"))
TOPIC = "commit-order"
# One partition of __consumer_offsets: every group, the loaded ones included, shares it.
SETTINGS = FAST + ("offsets.topic.num.partitions=1", "group.initial.rebalance.delay.ms=0")
# How long all the commits may take to be answered; the whole test stays under ~60 s.
ANSWERED_WITHIN_S = 45


def consumer(bootstrap, group, **conf):
    return Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                     "enable.auto.offset.store": False, "socket.timeout.ms": 30000, **conf})


class Watcher(threading.Thread):
    """Polls OffsetFetch of (TOPIC, 0) until stopped; records every decrease it sees."""

    def __init__(self, addr, group, stop):
        super().__init__(daemon=True)
        self.addr, self.group, self.stop = addr, group, stop
        self.seen = 0
        self.last = -1
        self.decreases = []  # (earlier offset, later offset)
        self.errors = []

    def run(self):
        while not self.stop.is_set():
            try:
                err, got = wire.offset_fetch(self.addr, self.group, [(TOPIC, 0)], timeout=10)
            except (OSError, ValueError) as e:
                self.errors.append(repr(e))
                time.sleep(0.01)
                continue
            if err not in (0, None):
                self.errors.append(wire.error_name(err))
                continue
            offset = got[(TOPIC, 0)][0]
            self.seen += 1
            if offset < self.last:
                self.decreases.append((self.last, offset))
            self.last = max(self.last, offset)


class Load(threading.Thread):
    """Another group committing asynchronously to the same __consumer_offsets partition,
    with at most OUTSTANDING commits unanswered."""

    OUTSTANDING = 100

    def __init__(self, bootstrap, group, stop):
        super().__init__(daemon=True)
        self.stop = stop
        self.commits = 0
        self.answered = 0
        self.k = consumer(bootstrap, group, on_commit=self.on_commit)

    def on_commit(self, err, partitions):
        self.answered += 1

    def run(self):
        try:
            while not self.stop.is_set():
                if self.commits - self.answered >= self.OUTSTANDING:
                    self.k.poll(0.01)
                    continue
                self.commits += 1
                self.k.commit(offsets=[TopicPartition(TOPIC, 1, self.commits)], asynchronous=True)
        finally:
            self.k.close()


def test_pipelined_async_commits_are_applied_in_order(make_cluster):
    c = make_cluster(1, settings=SETTINGS)
    c.create_topic(TOPIC, partitions=2)
    c.wait_topic(TOPIC, 2)
    group = "commit-order-main"
    addr = c.node(1).kafka_addr
    # The first ask creates __consumer_offsets; wait until its partition is loaded.
    wait_for("the coordinator of the group", 30, lambda: wire.find_coordinator(addr, group)[0] == 0
             and wire.offset_fetch(addr, group, [(TOPIC, 0)])[0] == 0, interval=0.1)

    answered = []  # (error, offset) per callback, in callback order
    lock = threading.Lock()

    def on_commit(err, partitions):
        with lock:
            answered.append((err, max((p.offset for p in partitions if p.partition == 0), default=None)))

    k = consumer(c.bootstrap, group, on_commit=on_commit)
    stop = threading.Event()
    watcher = Watcher(addr, group, stop)
    load = Load(c.bootstrap, "commit-order-load", stop)
    try:
        # One synchronous commit first: the coordinator is known before the pipelined ones.
        k.commit(offsets=[TopicPartition(TOPIC, 0, 0)], asynchronous=False)
        load.start()
        watcher.start()
        started = time.monotonic()
        for offset in range(1, COMMITS + 1):
            k.commit(offsets=[TopicPartition(TOPIC, 0, offset)], asynchronous=True)
            if offset % 200 == 0:
                k.poll(0)
        deadline = started + ANSWERED_WITHIN_S
        while True:
            with lock:
                done = len(answered)
            if done >= COMMITS:
                break
            assert time.monotonic() < deadline, f"{done} of {COMMITS} commits answered in {ANSWERED_WITHIN_S} s"
            k.poll(0.05)
        took = time.monotonic() - started
        failed = [(e, o) for e, o in answered if e is not None]
        assert not failed, f"{len(failed)} commits failed, first: {failed[:3]}"
        confirmed = [o for _, o in answered]
        assert confirmed[-1] == COMMITS, f"the last callback confirmed {confirmed[-1]}, not {COMMITS}"

        # The last callback has fired: OffsetFetch answers the last offset committed.
        committed = k.committed([TopicPartition(TOPIC, 0)], timeout=10)[0].offset
        err, got = wire.offset_fetch(addr, group, [(TOPIC, 0)])
        assert (committed, got[(TOPIC, 0)][0]) == (COMMITS, COMMITS), (
            f"committed {COMMITS} (confirmed by its callback), but OffsetFetch answers "
            f"{committed} (librdkafka) / {got[(TOPIC, 0)][0]} (wire) after {took:.1f} s")
    finally:
        stop.set()
        watcher.join(timeout=15)
        load.join(timeout=15)
        k.close()
    assert not load.is_alive() and not watcher.is_alive(), "the load and watcher threads did not stop"
    assert load.answered > 0, "the load thread's commits were never answered"
    assert watcher.seen > 0, f"the watcher never read an offset (errors: {watcher.errors[:3]})"
    assert not watcher.decreases, (
        f"OffsetFetch saw the committed offset go backwards {len(watcher.decreases)} times "
        f"in {watcher.seen} reads, first: {watcher.decreases[:5]}")
