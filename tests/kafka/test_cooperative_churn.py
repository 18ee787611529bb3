"""A cooperative-sticky group under subscription churn settles every time. Eight
confluent-kafka consumers (partition.assignment.strategy=cooperative-sticky, no
rebalance callbacks) subscribe, unsubscribe and resubscribe to subsets of four topics
of 8 partitions each, in rounds. After the last change of each round the group must
reach, within 10 s, a stable assignment that covers every subscribed partition exactly
once, with each consumer holding what the coordinator says it was given.

A join a client abandons must not leave a member behind that the rebalance waits for
(KIP-394: JoinGroup v4+ answers MEMBER_ID_REQUIRED first).

Each consumer lives in a child process that polls all the time (cooperative rebalances
only progress while consumers poll) and takes commands over a pipe. librdkafka's sticky
assignor has a use-after-free (PartitionMovements_getTheActualPartitionToBeMoved hands
processPartitionMovement an element it then deletes) that now and then kills the
group leader's process with SIGSEGV under this churn, whatever the broker. A consumer
that dies so is restarted and reported; that round may take up to the dead member's
session timeout longer to settle, counted from when the crash is seen, and the test
fails if clients crash in most rounds.

STROM_CHURN_SECONDS sets how long the rounds go on (default 20 s when CI=true, else
60 s); STROM_CHURN_SEED the random seed."""
import multiprocessing
import os
import random
import signal
import time

from harness import FAST

TOPICS = {f"churn-{name}": 8 for name in "abcd"}  # 32 partitions in all
MEMBERS = 8
DURATION_S = float(os.environ.get("STROM_CHURN_SECONDS", "20" if os.environ.get("CI") == "true" else "60"))
SEED = int(os.environ.get("STROM_CHURN_SEED", "394"))
# How long one round changes subscriptions before it waits for the group to settle.
CHURN_S = 6.0
SETTLE_WITHIN_S = 10.0
# librdkafka's default session timeout: how long a crashed client's member stays.
SESSION_S = 45.0
SETTINGS = FAST + ("group.initial.rebalance.delay.ms=300", "offsets.topic.num.partitions=4")


def run_member(bootstrap, group, i, conn, log_path):
    """A child process: one consumer, polling, doing what the pipe says. Its
    librdkafka group log (debug=cgrp) goes to `log_path`, for a failure to show."""
    import logging

    from confluent_kafka import Consumer

    logger = logging.getLogger(f"churner-{i}")
    handler = logging.FileHandler(log_path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    k = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "client.id": f"churner-{i}",
        "partition.assignment.strategy": "cooperative-sticky",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        # librdkafka's defaults otherwise (session 45 s, max.poll.interval 300 s); a
        # quicker heartbeat only shortens how long members take to notice a rebalance.
        "heartbeat.interval.ms": 1000,
        "socket.timeout.ms": 30000,
        "debug": "cgrp",
    }, logger=logger)
    try:
        while True:
            while conn.poll(0):
                command, arg = conn.recv()
                if command == "subscribe":
                    k.subscribe(arg)
                elif command == "unsubscribe":
                    k.unsubscribe()
                elif command == "assignment":
                    conn.send(sorted((tp.topic, tp.partition) for tp in k.assignment()))
                elif command == "close":
                    return
            m = k.poll(0.02)
            if m is not None and m.error() and not m.error().retriable():
                conn.send(("error", str(m.error())))
    finally:
        k.close()


class Member:
    """The parent's handle on one consumer process."""

    def __init__(self, ctx, bootstrap, group, i, log_dir):
        self.i = i
        self.log_path = os.path.join(log_dir, f"churner-{i}.{time.monotonic_ns()}.log")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=run_member, args=(bootstrap, group, i, child, self.log_path), daemon=True)
        self.proc.start()

    def send(self, command, arg=None):
        try:
            self.conn.send((command, arg))
        except OSError:
            # A crashed child: check() restarts it and subscribes it again.
            assert not self.proc.is_alive(), f"churner-{self.i}: pipe broken"

    def log_tail(self, lines=60):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError as e:
            return f"(no log: {e})"

    def crashed(self):
        return self.proc.exitcode == -signal.SIGSEGV

    def assignment(self):
        self.send("assignment")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if not self.conn.poll(0.1):
                continue
            got = self.conn.recv()
            if isinstance(got, tuple):
                raise AssertionError(f"churner-{self.i}: consumer error {got[1]}")
            return {tuple(tp) for tp in got}
        raise AssertionError(f"churner-{self.i} did not answer (exit code {self.proc.exitcode})")

    def close(self):
        if self.proc.is_alive():
            try:
                self.send("close")
            except OSError:
                pass
            self.proc.join(timeout=15)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=5)


def pick(rng, names):
    return set(rng.sample(names, rng.randint(1, len(names))))


def group_view(cluster, group):
    status, body = cluster.get(1, f"/v1/groups/{group}", timeout=10)
    return body if status == 200 else None


def settled(cluster, group, members, subs):
    """The admin view when the group is Stable and its assignment is what `subs`
    ({member index: set of topics, empty when unsubscribed}) calls for; else None."""
    view = group_view(cluster, group)
    subscribed = {f"churner-{i}": topics for i, topics in subs.items() if topics}
    if not subscribed:
        return view if view is None or not view["members"] else None
    if not view or view["state"] != "Stable":
        return None
    by_client = {m["client_id"]: m for m in view["members"]}
    if len(view["members"]) != len(subscribed) or set(by_client) != set(subscribed):
        return None
    expected = {(t, p) for topics in subscribed.values() for t in topics for p in range(TOPICS[t])}
    given = []
    for client, m in by_client.items():
        owned = {(a["topic"], p) for a in m["assignment"] for p in a["partitions"]}
        if any(t not in subscribed[client] for t, _ in owned):
            return None
        if members[int(client.rsplit("-", 1)[1])].assignment() != owned:
            return None
        given.extend(owned)
    if len(given) != len(set(given)) or set(given) != expected:
        return None
    return view


def describe(view, subs):
    if not view:
        return "no group view"
    lines = [f"state {view['state']} generation {view['generation']}"]
    for m in view["members"]:
        owned = sum(len(a["partitions"]) for a in m["assignment"])
        lines.append(f"  {m['client_id']} {m['member_id']}: {owned} partitions")
    lines.append(f"  subscriptions: { {i: sorted(t) for i, t in subs.items() if t} }")
    return "\n".join(lines)


def missing_members(cluster, view, members, subs):
    """For each subscribed consumer the group does not list: its librdkafka log, and what
    the broker's group debug log says of its requests."""
    listed = {m["client_id"] for m in view["members"]} if view else set()
    try:
        with open(cluster.node(1).log, errors="replace") as f:
            broker = [line for line in f if "strom::group" in line]
    except OSError:
        broker = []
    out = []
    for i, topics in subs.items():
        if topics and f"churner-{i}" not in listed:
            mine = "".join([line for line in broker if f"churner-{i}" in line][-30:])
            out.append(f"\n--- churner-{i}'s librdkafka log (debug=cgrp), last lines:\n{members[i].log_tail()}"
                       f"\n--- the broker's group log of churner-{i}, last lines:\n{mine}")
    return "".join(out)


def test_cooperative_sticky_group_settles_after_every_round_of_churn(make_cluster, tmp_path):
    c = make_cluster(1, settings=SETTINGS, rust_log="info,openraft=off,strom::group=debug")
    for topic, partitions in TOPICS.items():
        c.create_topic(topic, partitions=partitions)
    for topic, partitions in TOPICS.items():
        c.wait_topic(topic, partitions)
    group = "cooperative-churn"
    rng = random.Random(SEED)
    names = sorted(TOPICS)
    ctx = multiprocessing.get_context("spawn")
    members = [Member(ctx, c.bootstrap, group, i, tmp_path) for i in range(MEMBERS)]
    subs = {i: set() for i in range(MEMBERS)}
    last = {i: set(names) for i in range(MEMBERS)}
    settle_times, crashed_rounds = [], []
    try:
        for i, m in enumerate(members):
            subs[i] = pick(rng, names)
            m.send("subscribe", sorted(subs[i]))
        started = time.monotonic()
        rounds = 0
        while rounds == 0 or time.monotonic() - started < DURATION_S:
            rounds += 1
            churn_until = time.monotonic() + CHURN_S
            changes = 0
            while time.monotonic() < churn_until:
                i = rng.randrange(MEMBERS)
                action = rng.choice(["change", "unsubscribe", "resubscribe"])
                if action == "unsubscribe" and subs[i]:
                    last[i], subs[i] = subs[i], set()
                    members[i].send("unsubscribe")
                elif action == "resubscribe" and not subs[i]:
                    subs[i] = set(last[i])
                    members[i].send("subscribe", sorted(subs[i]))
                else:
                    subs[i] = pick(rng, names)
                    members[i].send("subscribe", sorted(subs[i]))
                changes += 1
                # A random while between changes: some joins finish, some are
                # abandoned half way by the next change.
                time.sleep(rng.uniform(0.05, 0.6))
            if not any(subs.values()):
                subs[0] = pick(rng, names)
                members[0].send("subscribe", sorted(subs[0]))
            changed_at = time.monotonic()
            deadline = changed_at + SETTLE_WITHIN_S
            while True:
                for j, m in enumerate(members):
                    if m.crashed():
                        # The client, not the broker (see the module doc): restart it;
                        # its dead member stays until its session times out.
                        crashed_rounds.append(rounds)
                        # Its member's session runs from its last heartbeat, before
                        # now: a crash in the middle of the wait gets its own time.
                        deadline = max(deadline, time.monotonic() + SESSION_S + SETTLE_WITHIN_S)
                        members[j] = Member(ctx, c.bootstrap, group, j, tmp_path)
                        if subs[j]:
                            members[j].send("subscribe", sorted(subs[j]))
                    elif not m.proc.is_alive():
                        raise AssertionError(f"churner-{j} exited with {m.proc.exitcode}")
                try:
                    if settled(c, group, members, subs):
                        break
                except AssertionError:
                    if not any(m.crashed() for m in members):
                        raise
                if time.monotonic() > deadline:
                    view = group_view(c, group)
                    raise AssertionError(f"round {rounds} ({changes} changes): not settled within "
                                         f"{deadline - changed_at:.0f} s\n"
                                         f"{describe(view, subs)}{missing_members(c, view, members, subs)}")
                time.sleep(0.05)
            settle_times.append(round(time.monotonic() - changed_at, 1))
        print(f"{rounds} rounds, settled after {settle_times} s; librdkafka crashed in rounds {crashed_rounds}")
        assert len(set(crashed_rounds)) <= rounds // 2, f"librdkafka crashed in rounds {crashed_rounds} of {rounds}"
    finally:
        for m in members:
            m.close()
