"""`strom cluster --nodes 3 --dir D --secure`, then the commands it prints, as printed.

The cluster comes up with SASL_SSL listeners, TLS between nodes, ACLs and an
HTTPS admin API with authentication; D holds ca.pem, credentials.json (0600),
client.properties and librdkafka.conf. kcat with librdkafka.conf, the CLI
with the credentials file and curl with the admin password all work, and
nothing gets in without credentials.
"""
import json
import os
import random
import re
import shlex
import signal
import socket
import stat
import subprocess
import threading
import time

import confluent_kafka as ck
import pytest

import clients
import harness


def free_range(n, avoid):
    """A base port with n free consecutive ports, clear of the ranges in `avoid`."""
    rng = random.Random()
    for _ in range(200):
        # Below the ephemeral range (32768+), where no client connection takes one unseen.
        base = rng.randrange(10000, 32000 - n)
        if any(abs(base - a) < n + 1 for a in avoid):
            continue
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                s.bind(("127.0.0.1", p))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


@pytest.fixture
def secure_cluster(tmp_path):
    d = tmp_path / "secure"
    bases = []
    for _ in range(4):
        bases.append(free_range(3, bases))
    kafka, admin, raft, internal = bases
    argv = [harness.strom_bin(), "cluster", "--nodes", "3", "--dir", str(d), "--secure",
            "--kafka-base", str(kafka), "--admin-base", str(admin), "--raft-base", str(raft),
            "--inter-broker-base", str(internal), "--set", "broker.session.timeout.ms=1500"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=dict(os.environ, RUST_LOG="info,openraft=off"))
    lines = []
    threading.Thread(target=lambda: lines.extend(l.decode(errors="replace") for l in proc.stdout), daemon=True).start()
    try:
        def up():
            assert proc.poll() is None, f"strom cluster exited {proc.returncode}: {''.join(lines)[-3000:]}"
            return any("kcat -F" in l for l in lines)

        harness.wait_for("the secure cluster to come up", 90, up, interval=0.2)
        yield d, lines, admin
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=45)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        # No node left behind.
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if " serve " in cmd and str(d) in cmd:
                    os.kill(int(pid), signal.SIGKILL)


def printed(lines, needle):
    """The printed command line that contains `needle`."""
    for l in lines:
        if needle in l:
            return l.strip()
    raise AssertionError(f"no printed line with {needle!r}: {''.join(lines)[-2000:]}")


def test_secure_in_one_step_and_the_printed_commands_work(secure_cluster, kcat):
    d, lines, admin_base = secure_cluster
    cluster = json.loads((d / "cluster.json").read_text())
    assert cluster["secure"] is True
    for f in ("credentials.json", "node.pem", "client.properties", "librdkafka.conf"):
        assert stat.S_IMODE(os.stat(d / f).st_mode) == 0o600, f
    creds = json.loads((d / "credentials.json").read_text())
    assert creds["user"] == "admin" and len(creds["password"]) >= 16 and creds["mechanism"] == "SCRAM-SHA-512"

    # kcat, as printed.
    line = printed(lines, "kcat -F")
    p = subprocess.run(shlex.split(line.replace("kcat", kcat, 1)) + ["-J", "-m", "30"], capture_output=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    md = json.loads(p.stdout)
    assert len(md["brokers"]) == 3
    assert {b["name"] for b in md["brokers"]} == {n["kafka"] for n in cluster["nodes"]}

    # The CLI, as printed (with this build's binary).
    line = printed(lines, "strom cluster-info")
    env_part, rest = line.split(" ", 1)
    key, value = env_part.split("=", 1)
    p = subprocess.run([harness.strom_bin()] + shlex.split(rest)[1:], capture_output=True, timeout=60,
                       env=dict(os.environ, **{key: value}))
    assert p.returncode == 0, p.stderr.decode()
    # curl, as printed (run by a shell: it reads the password with jq).
    line = printed(lines, "curl --cacert")
    p = subprocess.run(["bash", "-c", line], capture_output=True, timeout=60)
    assert p.returncode == 0 and json.loads(p.stdout)["controller_id"] is not None, p.stdout[:500]

    # A topic and records with librdkafka's settings from librdkafka.conf (RF 3, over TLS between nodes).
    conf = dict(l.split("=", 1) for l in (d / "librdkafka.conf").read_text().splitlines() if "=" in l)
    a = ck.admin.AdminClient(conf)
    a.create_topics([ck.admin.NewTopic("secure-t", 3, 3)])["secure-t"].result(timeout=30)
    kw = {k.replace(".", "_"): v for k, v in conf.items() if k != "bootstrap.servers"}
    records = clients.make_records(300, partitions=3, seed=9)
    delivered = clients.produce_confluent(conf["bootstrap.servers"], "secure-t", records, **kw)
    got = clients.consume_confluent(conf["bootstrap.servers"], "secure-t",
                                    {p: sum(1 for r in records if r.partition == p) for p in range(3)}, **kw)
    clients.assert_same(records, got, delivered)

    # Nothing without credentials: plaintext Kafka, SASL with a wrong password, the admin API.
    boot = conf["bootstrap.servers"]
    errors = []
    bad = ck.Producer({"bootstrap.servers": boot, "security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512",
                       "sasl.username": "admin", "sasl.password": "wrong", "ssl.ca.location": conf["ssl.ca.location"],
                       "error_cb": errors.append})
    deadline = time.monotonic() + 20
    while not any(e.code() == ck.KafkaError._AUTHENTICATION for e in errors) and time.monotonic() < deadline:
        bad.poll(0.2)
    assert any(e.code() == ck.KafkaError._AUTHENTICATION for e in errors), errors
    admin = cluster["nodes"][0]["admin"]
    status, body = harness.http("GET", f"https://{admin}/v1/cluster", cafile=str(d / "ca.pem"))
    assert (status, body["error"]) == (401, "SASL_AUTHENTICATION_FAILED")
