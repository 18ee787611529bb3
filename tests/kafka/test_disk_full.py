"""A data directory that runs out of space (a small tmpfs): below storage.min.free.bytes the
broker refuses produce requests with KAFKA_STORAGE_ERROR instead of filling the disk, keeps
serving reads and metadata changes, takes writes again once retention frees space, and
restarts with every segment intact."""
import os
import subprocess

import pytest

import harness
import wire
from harness import FAST, wait_for

MB = 1_000_000


@pytest.fixture
def small_fs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    path = tmp_path / "fs"
    path.mkdir()
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m", "tmpfs", str(path)], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {out.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_full_data_directory_refuses_writes_serves_reads_and_recovers(small_fs):
    settings = FAST + ("storage.min.free.bytes=33554432", "log.retention.check.interval.ms=500")
    (small_fs / "c").mkdir()
    cluster = harness.start(small_fs / "c", 1, settings)
    try:
        cluster.create_topic("filled", partitions=1, rf=1, configs={"segment.bytes": "2000000"})
        cluster.create_topic("other", partitions=1, rf=1)
        cluster.wait_topic("filled", 1)
        cluster.wait_topic("other", 1)
        addr = cluster.node(1).kafka_addr
        batch = wire.record_batch([(b"k", os.urandom(MB))])
        codes = []
        for _ in range(120):
            codes.append(wire.produce(addr, "filled", 0, batch, acks=-1)[0])
            if codes[-1] != 0:
                break
        assert codes[-1] == 56 and codes.count(0) >= 5, codes  # KAFKA_STORAGE_ERROR
        written = codes.count(0)
        assert wire.produce(addr, "other", 0, wire.record_batch([(b"k", b"v")]), acks=-1)[0] == 56

        # Reads and metadata go on.
        assert cluster.node(1).alive()
        err, hw, records = wire.fetch(addr, "filled", 0, 0)
        assert (err, hw) == (0, written) and records, (err, hw)
        status, body = cluster.send(1, "POST", "/v1/topics", {"name": "created-while-full", "partitions": 1})
        assert status == 201, body

        # Retention frees space: writes resume by themselves.
        status, body = cluster.send(1, "PATCH", "/v1/topics/filled/configs", {"retention.bytes": str(4 * MB)})
        assert status == 200, body
        wait_for("writes taken again", 30, lambda: wire.produce(
            addr, "other", 0, wire.record_batch([(b"k", b"v")]), acks=-1, timeout_ms=2000)[0] == 0, interval=0.2)
        start = cluster.topic("filled")["partitions"][0]["log_start_offset"]
        assert start > 0

        # Every segment is intact: a restart recovers the same log.
        cluster.kill(1)
        cluster.launch(1)
        cluster.wait_ready()

        def leader_view():
            p = cluster.topic("filled")["partitions"][0]
            return p if p["high_watermark"] is not None else None

        p = wait_for("the restarted leader's view of its log", 30, leader_view)
        assert (p["log_start_offset"], p["high_watermark"]) == (start, written), p
        err, hw, records = wire.fetch(cluster.node(1).kafka_addr, "filled", 0, start)
        assert (err, hw) == (0, written) and records
        log = open(cluster.node(1).log).read()
        assert "below storage.min.free.bytes" in log and "free space is back" in log
    finally:
        cluster.close()
