"""`strom topic produce` and `strom topic consume`, the CLI's own Kafka clients (as
kcat -P/-C and rpk do), checked against confluent-kafka: what one writes the other
reads, keys land where Kafka's partitioner puts them, and a `--group` consumer is a
real group member (range assignor, committed offsets, leaves on SIGTERM)."""
import os
import signal
import subprocess
import time

import confluent_kafka as ck

import harness
from harness import FAST, wait_for


def strom(cluster, *args, stdin=None, timeout=60):
    env = dict(os.environ, STROM_ADMIN=f"http://{cluster.nodes[1].admin}")
    return subprocess.run([harness.strom_bin(), *args], input=stdin, capture_output=True, timeout=timeout, env=env)


def read_all(cluster, topic, n):
    c = ck.Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"check-{topic}",
                     "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    got = []
    deadline = time.monotonic() + 60
    while len(got) < n and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m)
    c.close()
    return got


def test_produce_from_stdin_is_read_by_a_kafka_client(make_cluster):
    cluster = make_cluster(3, FAST)
    cluster.create_topic("lines", partitions=6, rf=3)
    cluster.wait_topic("lines", 6)
    keyed = [f"user-{i}:event {i}" for i in range(60)]
    r = strom(cluster, "topic", "produce", "lines", "--key-separator", ":", "--header", "source=cli",
              stdin=("\n".join(keyed + ["no key here"]) + "\n").encode())
    assert r.returncode == 0, r.stderr.decode()
    assert b"produced 61 records to lines" in r.stderr

    got = read_all(cluster, "lines", 61)
    assert len(got) == 61
    by_value = {m.value().decode(): m for m in got}
    assert by_value["no key here"].key() is None
    # Keyed records are where Kafka's default partitioner (murmur2) puts them:
    # confluent-kafka's murmur2 partitioner picks the same partition for each key.
    p = ck.Producer({"bootstrap.servers": cluster.bootstrap, "partitioner": "murmur2"})
    for line in keyed:
        key, value = line.split(":", 1)
        m = by_value[value]
        assert m.key() == key.encode() and m.headers() == [("source", b"cli")]
        p.produce("lines", key=key, value=b"twin")
    assert p.flush(30) == 0
    twins = {m.key(): m.partition() for m in read_all(cluster, "lines", 121) if m.value() == b"twin"}
    assert len(twins) == 60
    assert all(by_value[line.split(":", 1)[1]].partition() == twins[line.split(":", 1)[0].encode()]
               for line in keyed)
    assert len({m.partition() for m in got}) > 3  # keys spread


def test_consume_prints_what_a_kafka_client_wrote_in_the_asked_format(make_cluster):
    cluster = make_cluster(3, FAST)
    cluster.create_topic("orders", partitions=3, rf=3)
    cluster.wait_topic("orders", 3)
    p = ck.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    sent = set()
    for i in range(30):
        p.produce("orders", key=f"k{i}", value=f"v{i}", partition=i % 3, headers=[("h", b"x")])
        sent.add((i % 3, f"k{i}", f"v{i}"))
    assert p.flush(30) == 0
    r = strom(cluster, "topic", "consume", "orders", "--from-beginning", "--count", "30",
              "--format", r"%t|%p|%o|%k|%s|%h|%T\n")
    assert r.returncode == 0, r.stderr.decode()
    rows = [line.split("|") for line in r.stdout.decode().splitlines()]
    assert len(rows) == 30
    assert {(int(p), k, v) for _, p, _, k, v, _, _ in rows} == sent
    assert all(t == "orders" and h == "h=x" and int(ts) > 1_700_000_000_000 for t, _, _, _, _, h, ts in rows)
    # Offsets run 0..9 in each partition, in order.
    for part in range(3):
        assert [int(o) for _, p, o, *_ in rows if int(p) == part] == list(range(10))
    # One partition only; without --from-beginning only new records come.
    r = strom(cluster, "topic", "consume", "orders", "--partition", "2", "--from-beginning", "--count", "10")
    assert r.returncode == 0 and r.stdout.decode().splitlines() == [f"v{i}" for i in range(2, 30, 3)], r


def test_a_group_consumer_commits_and_shares_partitions(make_cluster):
    cluster = make_cluster(3, FAST)
    cluster.create_topic("work", partitions=8, rf=3)
    cluster.wait_topic("work", 8)
    p = ck.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(80):
        p.produce("work", value=f"w{i}", partition=i % 8)
    assert p.flush(30) == 0

    # A lone member gets all 8 partitions; what it printed is committed.
    r = strom(cluster, "topic", "consume", "work", "--group", "g", "--from-beginning", "--count", "50")
    assert r.returncode == 0, r.stderr.decode()
    assert len(r.stdout.decode().splitlines()) == 50
    assert b"partitions [0, 1, 2, 3, 4, 5, 6, 7] of work" in r.stderr
    # What it printed is committed, and every partition it was given has a position
    # (those it did not reach at their beginning), as a Kafka consumer commits.
    status, g = cluster.get(1, "/v1/groups/g")
    assert status == 200 and sum(o["committed"] for o in g["offsets"]) == 50, g
    assert len(g["offsets"]) == 8, g
    # It left the group when done: no member stays behind.
    assert g["members"] == [], g

    # The next member starts at the committed offsets: the other 30, none twice.
    r2 = strom(cluster, "topic", "consume", "work", "--group", "g", "--count", "30")
    assert r2.returncode == 0, r2.stderr.decode()
    assert sorted(r.stdout.decode().splitlines() + r2.stdout.decode().splitlines()) == sorted(
        f"w{i}" for i in range(80))

    # Three members share 8 partitions 3/3/2 (the range assignor); SIGTERM makes one
    # leave cleanly (commit, LeaveGroup), and the two left take its partitions.
    env = dict(os.environ, STROM_ADMIN=f"http://{cluster.nodes[1].admin}")
    procs = [subprocess.Popen([harness.strom_bin(), "topic", "consume", "work", "--group", "three"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env) for _ in range(3)]
    try:
        def members():
            status, g = cluster.get(1, "/v1/groups/three", timeout=5)
            if status != 200 or g["state"] != "Stable":
                return None
            return sorted(len(p) for m in g["members"] for a in m["assignment"] for p in [a["partitions"]])
        assert wait_for("three members sharing 8 partitions", 60, lambda: members() == [2, 3, 3])
        procs[0].send_signal(signal.SIGTERM)
        assert procs[0].wait(30) == 0, procs[0].stderr.read().decode()
        assert wait_for("two members after one left", 60, lambda: members() == [4, 4])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_bad_requests_get_clear_errors(make_cluster):
    cluster = make_cluster(1)
    cluster.create_topic("t", partitions=2, rf=1)
    cluster.wait_topic("t", 2)
    r = strom(cluster, "topic", "produce", "missing", stdin=b"x\n")
    assert r.returncode == 1 and b"UnknownTopicOrPartition" in r.stderr, r.stderr
    r = strom(cluster, "topic", "produce", "t", "--partition", "5", stdin=b"x\n")
    assert r.returncode == 1 and b"no partition 5" in r.stderr, r.stderr
    r = strom(cluster, "topic", "produce", "t", "--acks", "0", stdin=b"x\n")
    assert r.returncode == 2 and b"--acks" in r.stderr, r.stderr
    r = strom(cluster, "topic", "consume", "t", "--format", "%q")
    assert r.returncode == 1 and b"unknown token %q" in r.stderr, r.stderr
    r = strom(cluster, "topic", "consume", "t", "--group", "g", "--partition", "0")
    assert r.returncode == 1 and b"do not go together" in r.stderr, r.stderr
    r = strom(cluster, "topic", "consume", "t", "--bootstrap", "127.0.0.1:1", "--count", "1")
    assert r.returncode == 1 and b"cannot connect" in r.stderr, r.stderr
