"""Mutual TLS between nodes: the quorum port and an SSL inter-broker listener.

3 nodes with `quorum.security.protocol=SSL` and `inter.broker.listener.name=SSL`:
the metadata quorum and replication run over TLS, each node showing its
certificate. Replication and the quorum keep working through a leader kill;
a node, or a client, with a certificate from another CA gets nowhere.
"""
import signal
import socket
import ssl
import subprocess

import pytest

import clients
import harness
import wire
from test_security import make_certs

NODE_PRINCIPAL = "User:CN=127.0.0.1,O=Strom"


def tls_between_nodes(certs):
    return (f"ssl.keystore.location={certs}/server.pem", f"ssl.truststore.location={certs}/ca.pem",
            "ssl.client.auth=required", "quorum.security.protocol=SSL", "inter.broker.listener.name=SSL")


def test_replication_and_quorum_over_tls_survive_a_leader_kill(make_cluster, tmp_path):
    certs = make_certs(tmp_path / "certs")
    c = make_cluster(3, harness.FAST + tls_between_nodes(certs), listeners=("SSL",))
    c.create_topic("tls-rep", partitions=2, rf=3, configs={"min.insync.replicas": "2"})
    c.wait_topic("tls-rep", 2)
    boot = ",".join(n.listeners["PLAINTEXT"] for n in c.nodes.values())
    first = clients.make_records(400, partitions=2, seed=5)
    delivered = clients.produce_confluent(boot, "tls-rep", first)

    # Kill the leader of partition 0 (and with it, maybe the quorum leader).
    leader = c.leaders("tls-rep")[0]
    c.kill(leader)
    survivor = next(n for n in c.nodes if n != leader)

    def moved():
        t = c.topic("tls-rep", via=survivor)
        return t and all(p["leader"] not in (None, leader) for p in t["partitions"])

    harness.wait_for("partitions led by the survivors", 60, moved, interval=0.2)
    boot = ",".join(n.listeners["PLAINTEXT"] for nid, n in c.nodes.items() if nid != leader)
    second = clients.make_records(400, partitions=2, seed=6)
    delivered += clients.produce_confluent(boot, "tls-rep", second)
    got = clients.consume_confluent(boot, "tls-rep", {0: 400, 1: 400})
    clients.assert_same(first + second, got, delivered)

    # The killed node comes back, catches up over TLS and rejoins the ISR.
    c.launch(leader)
    c.wait_active()

    def in_sync():
        t = c.topic("tls-rep", via=leader)
        return t and all(sorted(p["isr"]) == [1, 2, 3] for p in t["partitions"])

    harness.wait_for("the restarted node back in every ISR", 60, in_sync, interval=0.2)


def test_a_node_or_client_from_another_ca_gets_nowhere(make_cluster, tmp_path):
    certs = make_certs(tmp_path / "certs")
    c = make_cluster(3, harness.FAST + tls_between_nodes(certs), listeners=("SSL",))
    other = make_certs(tmp_path / "other", clients_=("mallory",))

    # A fourth node whose certificate another CA signed asks to join.
    p, a, r, s = harness.free_ports(4)
    voters = ",".join(f"{nid}@{n.raft}" for nid, n in c.nodes.items())
    log = tmp_path / "rogue.log"
    with open(log, "wb") as out:
        rogue = subprocess.Popen(
            [harness.strom_bin(), "serve", "--node-id", "4", "--data-dir", str(tmp_path / "rogue"),
             "--admin", f"127.0.0.1:{a}", "--raft", f"127.0.0.1:{r}", "--quorum", voters,
             "--set", f"listeners=PLAINTEXT://127.0.0.1:{p},SSL://127.0.0.1:{s}"]
            + [f"--set={x}" for x in tls_between_nodes(other)],
            stdout=out, stderr=out, stdin=subprocess.DEVNULL)
    try:
        # Node 4 dials the voters; each refuses the handshake.
        harness.wait_for("every node refusing the rogue node's handshake", 30,
                         lambda: any("TLS handshake failed" in n.log_tail(400) for n in c.nodes.values()))
        status, brokers = c.get(1, "/v1/brokers")
        assert status == 200 and 4 not in [b["id"] for b in brokers], brokers
    finally:
        rogue.send_signal(signal.SIGKILL)
        rogue.wait(timeout=10)

    # A client with another CA's certificate cannot open the inter-broker listener
    # (so it cannot fetch as a follower), while the cluster CA's certificate can.
    for ca_dir, name in [(other, "mallory")]:
        ctx = ssl.create_default_context(cafile=f"{certs}/ca.pem")
        ctx.load_cert_chain(f"{ca_dir}/client-{name}.pem", f"{ca_dir}/client-{name}.key")
        raw = socket.create_connection(tuple_addr(c.node(1).listeners["SSL"]), timeout=10)
        with pytest.raises((ssl.SSLError, ConnectionResetError, ConnectionError)):
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                wire.api_versions_on(tls)
    # Without any certificate: ssl.client.auth=required refuses too.
    ctx = ssl.create_default_context(cafile=f"{certs}/ca.pem")
    raw = socket.create_connection(tuple_addr(c.node(2).listeners["SSL"]), timeout=10)
    with pytest.raises((ssl.SSLError, ConnectionResetError, ConnectionError)):
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            wire.api_versions_on(tls)
    # The cluster is unharmed.
    c.create_topic("after-rogue", partitions=1, rf=3)
    c.wait_topic("after-rogue", 1)


def tuple_addr(addr):
    host, port = addr.rsplit(":", 1)
    return host, int(port)
