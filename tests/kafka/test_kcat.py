"""kcat (librdkafka's command-line client) against a 3-node strom cluster."""
import json
import re
import subprocess

import pytest

import clients

TIMEOUT = 60


def run(argv, input=None):
    try:
        p = subprocess.run(argv, input=input, capture_output=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{' '.join(argv)} did not exit within {TIMEOUT} s; stderr: "
                             f"{(e.stderr or b'').decode(errors='replace')[-2000:]}") from None
    assert p.returncode == 0, (f"{' '.join(argv)} exited {p.returncode}; stderr: "
                               f"{p.stderr.decode(errors='replace')[-2000:]}")
    return p.stdout.decode()


@pytest.fixture(scope="module")
def spread(cluster3):
    cluster3.create_topic("kcat-spread", partitions=6, rf=1)
    return cluster3.wait_topic("kcat-spread", 6)


def test_list_metadata(kcat, cluster3, spread):
    leaders = {p["partition"]: p["leader"] for p in spread["partitions"]}
    for nid, node in cluster3.nodes.items():
        md = json.loads(run([kcat, "-b", node.kafka, "-L", "-J", "-m", "30"]))
        brokers = {b["id"]: b["name"] for b in md["brokers"]}
        assert brokers == {n.id: n.kafka for n in cluster3.nodes.values()}, f"via node {nid}: {brokers}"
        topics = {t["topic"]: t for t in md["topics"]}
        assert "kcat-spread" in topics, f"via node {nid}: topics {sorted(topics)}"
        t = topics["kcat-spread"]
        assert "error" not in t or not t["error"], t
        assert {p["partition"]: p["leader"] for p in t["partitions"]} == leaders
        for p in t["partitions"]:
            assert [r["id"] for r in p["replicas"]] == [leaders[p["partition"]]]
            assert [r["id"] for r in p["isrs"]] == [leaders[p["partition"]]]
        assert md.get("controllerid") in cluster3.nodes, f"controller id {md.get('controllerid')}"

    # The human-readable form too.
    text = run([kcat, "-b", cluster3.node(1).kafka, "-L", "-t", "kcat-spread", "-m", "30"])
    assert " 3 brokers:" in text, text
    for n in cluster3.nodes.values():
        assert re.search(rf"broker {n.id} at {re.escape(n.kafka)}", text), text
    assert 'topic "kcat-spread" with 6 partitions:' in text, text
    for p, leader in leaders.items():
        assert f"partition {p}, leader {leader}, replicas: {leader}, isrs: {leader}" in text, text


@pytest.mark.parametrize("codec", ["none", "snappy", "zstd"])
def test_produce_consume_round_trip(kcat, cluster3, spread, codec):
    topic = f"kcat-rt-{codec}"
    cluster3.create_topic(topic, partitions=3, rf=1)
    cluster3.wait_topic(topic, 3)
    lines = [f"key{i}:value {i} " + "x" * (i % 50) for i in range(1000)]
    # Produce to partition 1 through node 2 only.
    run([kcat, "-b", cluster3.node(2).kafka, "-P", "-t", topic, "-p", "1", "-K", ":", "-z", codec,
         "-X", "acks=all", "-H", "origin=kcat"], input=("\n".join(lines) + "\n").encode())
    hw = cluster3.topic(topic)["partitions"][1]["high_watermark"]
    assert hw == 1000, f"high watermark {hw} after 1000 kcat records"

    # -e: exit at the end of the partition; it must exit.
    out = run([kcat, "-b", cluster3.node(3).kafka, "-C", "-t", topic, "-p", "1", "-o", "beginning", "-e",
               "-f", "%p|%o|%k|%s|%h\n"])
    got = out.splitlines()
    assert len(got) == 1000, f"kcat read {len(got)} records, first: {got[:3]}"
    for i, (line, sent) in enumerate(zip(got, lines)):
        key, value = sent.split(":", 1)
        assert line == f"1|{i}|{key}|{value}|origin=kcat", f"record {i}: {line!r}"

    # And with confluent-kafka, the same bytes.
    recs = clients.consume_confluent(cluster3.bootstrap, topic, {1: 1000})[1]
    assert [(r.key, r.value, r.headers) for r in recs] == [
        (s.split(":", 1)[0].encode(), s.split(":", 1)[1].encode(), [("origin", b"kcat")]) for s in lines]

    # -e on a partition with nothing in it exits too, printing nothing.
    assert run([kcat, "-b", cluster3.node(1).kafka, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e"]) == ""
