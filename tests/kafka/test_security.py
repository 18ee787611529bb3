"""Listeners, TLS and SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) with real clients.

One 3-node cluster with four Kafka listeners per node: PLAINTEXT (also the
inter-broker listener), SSL, SASL_PLAINTEXT and SASL_SSL. Certificates come
from `strom certs`; users are made through the admin API and through Kafka's
AlterUserScramCredentials. What is refused (a wrong password, an unknown user,
plaintext to a TLS port, a certificate from another CA, requests before
authentication, malformed SASL messages) leaves the broker serving others.
"""
import base64
import hashlib
import hmac
import json
import os
import socket
import ssl
import subprocess
import time
import uuid

import confluent_kafka as ck
from confluent_kafka.admin import (AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialDeletion,
                                   UserScramCredentialUpsertion)
import pytest

import clients
import harness
import wire

API_SASL_HANDSHAKE, API_SASL_AUTHENTICATE = 17, 36
UNSUPPORTED_SASL_MECHANISM, ILLEGAL_SASL_STATE, SASL_AUTHENTICATION_FAILED = 33, 34, 58
PASSWORD = "s3cret-pw"
LISTENERS = ("SSL", "SASL_PLAINTEXT", "SASL_SSL")


def make_certs(directory, clients_=()):
    argv = [harness.strom_bin(), "certs", "--dir", str(directory)]
    for c in clients_:
        argv += ["--client", c]
    subprocess.run(argv, check=True, capture_output=True, timeout=30)
    return directory


def tls_settings(certs, client_auth="requested"):
    return (f"ssl.keystore.location={certs}/server.pem", f"ssl.truststore.location={certs}/ca.pem",
            f"ssl.client.auth={client_auth}", "connection.failed.authentication.delay.ms=50")


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"), clients_=("alice",))


@pytest.fixture(scope="module")
def secure(tmp_path_factory, certs):
    c = harness.start(tmp_path_factory.mktemp("strom"), 3, harness.FAST + tls_settings(certs), listeners=LISTENERS)
    try:
        status, body = c.send(1, "POST", "/v1/users", {"name": "alice", "password": PASSWORD})
        assert status == 201, (status, body)
        c.create_topic("secure", partitions=3, rf=3)
        c.wait_topic("secure", 3)
        yield c
    finally:
        c.close()


def bootstrap(cluster, listener):
    return ",".join(n.listeners[listener] for n in cluster.nodes.values())


def client_conf(certs, listener, mechanism="SCRAM-SHA-256", user="alice", password=PASSWORD):
    """librdkafka settings (Python keyword style, see clients._librdkafka_conf) for `listener`."""
    conf = {"security_protocol": listener}
    if "SSL" in listener:
        conf["ssl_ca_location"] = f"{certs}/ca.pem"
    if listener.startswith("SASL"):
        conf.update(sasl_mechanism=mechanism, sasl_username=user, sasl_password=password)
    return conf


def counts(records):
    out = {}
    for r in records:
        out[r.partition] = out.get(r.partition, 0) + 1
    return out


def admin(cluster, certs, listener, **kw):
    conf = {"bootstrap.servers": bootstrap(cluster, listener), "socket.timeout.ms": 15000}
    conf.update(clients._librdkafka_conf(client_conf(certs, listener, **kw)))
    return AdminClient(conf)


# ---- raw SASL on the wire ---------------------------------------------------------------------

def sasl_handshake(sock, mechanism, correlation_id=1):
    sock.sendall(wire.request(API_SASL_HANDSHAKE, 1, correlation_id, wire.string(mechanism)))
    r = wire.recv_response(sock, correlation_id)
    err = r.i16()
    return err, [r.string() for _ in range(r.i32())]


def sasl_authenticate(sock, auth_bytes, correlation_id=2):
    """SaslAuthenticate v1: (error code, message, server bytes)."""
    sock.sendall(wire.request(API_SASL_AUTHENTICATE, 1, correlation_id, wire.nbytes(auth_bytes)))
    r = wire.recv_response(sock, correlation_id)
    return r.i16(), r.string(), r.nbytes()


def closed(sock, timeout=10):
    """True once the broker has closed `sock` without sending anything more."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def scram_final(mechanism, password, client_first_bare, server_first, nonce=None):
    """The client-final message for a server-first message (RFC 5802), optionally with a forged nonce."""
    h = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]
    attrs = dict(kv.split("=", 1) for kv in server_first.split(","))
    salted = hashlib.pbkdf2_hmac(h, password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"]))
    client_key = hmac.new(salted, b"Client Key", h).digest()
    stored_key = hashlib.new(h, client_key).digest()
    without_proof = f"c=biws,r={nonce or attrs['r']}"
    auth_message = f"{client_first_bare},{server_first},{without_proof}".encode()
    signature = hmac.new(stored_key, auth_message, h).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature))
    server_key = hmac.new(salted, b"Server Key", h).digest()
    expected_server_final = "v=" + base64.b64encode(hmac.new(server_key, auth_message, h).digest()).decode()
    return f"{without_proof},p={base64.b64encode(proof).decode()}", expected_server_final


def connect(addr, timeout=10):
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=timeout)
    s.settimeout(timeout)
    return s


def scram_login(addr, mechanism, user, password):
    """A whole SCRAM exchange by hand; returns (error code of the last step, socket)."""
    s = connect(addr)
    err, _ = sasl_handshake(s, mechanism)
    assert err == 0
    bare = f"n={user},r=clientnonce{uuid.uuid4().hex}"
    err, msg, server_first = sasl_authenticate(s, ("n,," + bare).encode())
    assert err == 0, (err, msg)
    final, expected = scram_final(mechanism, password, bare, server_first.decode())
    err, msg, server_final = sasl_authenticate(s, final.encode(), correlation_id=3)
    if err == 0:
        assert server_final.decode() == expected, "the server proved it knows the credential"
    return err, s


def login_result(addr, mechanism, user, password, want, timeout=20):
    """Logs in again until the broker at addr answers `want`: a credential change reaches a
    broker when it applies the metadata record, a moment after the controller commits it."""
    def attempt():
        err, s = scram_login(addr, mechanism, user, password)
        s.close()
        return err == want or None

    harness.wait_for(f"{mechanism} login of {user} at {addr} to answer error {want}", timeout, attempt)


def assert_still_serving(cluster, certs):
    """A good SASL_SSL client still produces and reads back after whatever was refused."""
    records = clients.make_records(20, partitions=3, seed=int(time.time()))
    conf = client_conf(certs, "SASL_SSL", "SCRAM-SHA-512")
    clients.produce_confluent(bootstrap(cluster, "SASL_SSL"), "secure", records, **conf)


# ---- tests --------------------------------------------------------------------------------------

def test_metadata_advertises_the_listener_the_client_came_in_on(secure, certs):
    for listener in ("PLAINTEXT",) + LISTENERS:
        md = admin(secure, certs, listener).list_topics(timeout=20)
        advertised = {b.id: f"{b.host}:{b.port}" for b in md.brokers.values()}
        assert advertised == {n.id: n.listeners[listener] for n in secure.nodes.values()}, listener
        assert "secure" in md.topics


@pytest.mark.parametrize("listener,mechanism", [
    ("SSL", None),
    ("SASL_SSL", "PLAIN"),
    ("SASL_SSL", "SCRAM-SHA-256"),
    ("SASL_SSL", "SCRAM-SHA-512"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-256"),
    ("SASL_PLAINTEXT", "PLAIN"),
])
def test_confluent_produces_and_consumes(secure, certs, listener, mechanism):
    topic = f"sec-ck-{listener}-{mechanism}".lower()
    secure.create_topic(topic, partitions=3, rf=3)
    secure.wait_topic(topic, 3)
    records = clients.make_records(300, partitions=3, seed=7)
    conf = client_conf(certs, listener, mechanism)
    boot = bootstrap(secure, listener)
    delivered = clients.produce_confluent(boot, topic, records, **conf)
    got = clients.consume_confluent(boot, topic, counts(records), **conf)
    clients.assert_same(records, got, delivered)


@pytest.mark.parametrize("listener,mechanism", [
    ("SSL", None),
    ("SASL_SSL", "SCRAM-SHA-512"),
    ("SASL_SSL", "SCRAM-SHA-256"),
    ("SASL_SSL", "PLAIN"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-256"),
])
def test_kafka_python_produces_and_consumes(secure, certs, listener, mechanism):
    topic = f"sec-kp-{listener}-{mechanism}".lower()
    secure.create_topic(topic, partitions=3, rf=3)
    secure.wait_topic(topic, 3)
    conf = {"security_protocol": listener}
    if "SSL" in listener:
        conf["ssl_cafile"] = f"{certs}/ca.pem"
    if mechanism:
        conf.update(sasl_mechanism=mechanism, sasl_plain_username="alice", sasl_plain_password=PASSWORD)
    records = clients.make_records(200, partitions=3, seed=11)
    boot = bootstrap(secure, listener)
    delivered = clients.produce_kafka_python(boot, topic, records, **conf)
    got = clients.consume_kafka_python(boot, topic, counts(records), **conf)
    clients.assert_same(records, got, delivered)


@pytest.mark.parametrize("listener,mechanism", [
    ("SSL", None),
    ("SASL_SSL", "PLAIN"),
    ("SASL_SSL", "SCRAM-SHA-256"),
    ("SASL_SSL", "SCRAM-SHA-512"),
])
def test_kcat_produces_and_consumes(secure, certs, kcat, listener, mechanism):
    topic = f"sec-kcat-{listener}-{mechanism}".lower()
    secure.create_topic(topic, partitions=1, rf=3)
    secure.wait_topic(topic, 1)
    common = [kcat, "-b", bootstrap(secure, listener), "-X", f"security.protocol={listener}",
              "-X", f"ssl.ca.location={certs}/ca.pem", "-t", topic]
    if mechanism:
        common += ["-X", f"sasl.mechanisms={mechanism}", "-X", "sasl.username=alice",
                   "-X", f"sasl.password={PASSWORD}"]
    lines = [f"line-{i}" for i in range(50)]
    p = subprocess.run(common + ["-P"], input="\n".join(lines).encode() + b"\n", capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    p = subprocess.run(common + ["-C", "-o", "beginning", "-e", "-c", "50"], capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    assert p.stdout.decode().split() == lines


def test_wrong_passwords_unknown_users_and_strangers_are_refused(secure, certs, tmp_path):
    boot = bootstrap(secure, "SASL_SSL")
    for user, password, mechanism in [("alice", "wrong", "SCRAM-SHA-256"), ("alice", "wrong", "PLAIN"),
                                      ("mallory", PASSWORD, "SCRAM-SHA-512"), ("mallory", PASSWORD, "PLAIN")]:
        errors = []
        conf = clients._librdkafka_conf(client_conf(certs, "SASL_SSL", mechanism, user, password))
        p = ck.Producer(dict(conf, **{"bootstrap.servers": boot, "error_cb": errors.append}))
        failed = lambda: any(e.code() == ck.KafkaError._AUTHENTICATION for e in errors)
        deadline = time.monotonic() + 20
        while not failed() and time.monotonic() < deadline:
            p.poll(0.2)
        assert failed(), (user, mechanism, errors)
        with pytest.raises(ck.KafkaException):
            p.list_topics(timeout=2)

    # The same by hand: the broker says why, then closes the connection.
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        err, s = scram_login(secure.node(1).listeners["SASL_PLAINTEXT"], mechanism, "alice", "wrong")
        assert err == SASL_AUTHENTICATION_FAILED
        assert closed(s)
        # An unknown user gets a well-formed challenge, and fails only at the end.
        err, s = scram_login(secure.node(1).listeners["SASL_PLAINTEXT"], mechanism, "nobody", "x")
        assert err == SASL_AUTHENTICATION_FAILED
        assert closed(s)
        err, s = scram_login(secure.node(1).listeners["SASL_PLAINTEXT"], mechanism, "alice", PASSWORD)
        assert err == 0
        s.close()

    # Plaintext Kafka to a TLS port: no answer, the connection is closed.
    for listener in ("SSL", "SASL_SSL"):
        s = connect(secure.node(2).listeners[listener])
        s.sendall(wire.request(wire.API_API_VERSIONS, 0, 1, b""))
        data = b""
        try:
            while chunk := s.recv(4096):
                data += chunk
        except (ConnectionResetError, socket.timeout):
            pass
        assert not data.startswith(b"\x00\x00"), f"{listener} answered plaintext ApiVersions: {data[:16]!r}"
        s.close()

    # A client certificate from another CA is refused (ssl.client.auth=requested checks
    # any certificate sent); one from the cluster's CA is taken.
    other = make_certs(tmp_path / "other", clients_=("eve",))
    for ca_dir, name, ok in [(other, "eve", False), (certs, "alice", True)]:
        ctx = ssl.create_default_context(cafile=f"{certs}/ca.pem")
        ctx.load_cert_chain(f"{ca_dir}/client-{name}.pem", f"{ca_dir}/client-{name}.key")
        raw = connect(secure.node(1).listeners["SSL"])
        try:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                versions = wire.api_versions_on(s)
                assert ok, "a certificate from another CA was accepted"
                assert API_SASL_HANDSHAKE in versions
        except (ssl.SSLError, ConnectionResetError, ConnectionError):
            assert not ok, f"the cluster CA's client certificate was refused"
    assert_still_serving(secure, certs)


def test_requests_before_authentication_close_the_connection_and_write_nothing(secure, certs):
    before = {p["partition"]: p["high_watermark"] for p in secure.topic("secure")["partitions"]}
    batch = wire.record_batch([(b"k", b"never written")])
    for listener in ("SASL_PLAINTEXT",):
        addr = secure.node(1).listeners[listener]
        # Metadata v1: all topics.
        s = connect(addr)
        s.sendall(wire.request(wire.API_METADATA, 1, 1, wire.i32(-1)))
        assert closed(s), "Metadata before authentication was answered"
        s.close()
        # Produce to every partition; even after a handshake, until SaslAuthenticate succeeds.
        for handshake in (False, True):
            s = connect(addr)
            if handshake:
                assert sasl_handshake(s, "PLAIN")[0] == 0
            for p in range(3):
                body = (wire.string(None) + wire.i16(-1) + wire.i32(5000) + wire.i32(1) + wire.string("secure")
                        + wire.i32(1) + wire.i32(p) + wire.nbytes(batch))
                try:
                    s.sendall(wire.request(wire.API_PRODUCE, 3, 10 + p, body))
                except (BrokenPipeError, ConnectionResetError):
                    break
            assert closed(s), "Produce before authentication was answered"
            s.close()
    after = {p["partition"]: p["high_watermark"] for p in secure.topic("secure")["partitions"]}
    assert after == before, "records were written by an unauthenticated client"
    # ApiVersions is allowed first, and answers with the SASL APIs in it.
    s = connect(secure.node(1).listeners["SASL_PLAINTEXT"])
    versions = wire.api_versions_on(s)
    assert versions[API_SASL_HANDSHAKE] == (0, 1) and versions[API_SASL_AUTHENTICATE][1] >= 1
    s.close()


def bare_token(sock, token):
    """After a v0 handshake: a SASL token as a bare frame, and the server's bare answer."""
    sock.sendall(wire.i32(len(token)) + token)
    (size,) = wire.struct.unpack(">i", wire.recv_exact(sock, 4))
    return wire.recv_exact(sock, size)


def test_a_v0_handshake_takes_bare_sasl_tokens(secure):
    """SaslHandshake v0 (older clients): the tokens follow as bare frames, then Kafka requests."""
    addr = secure.node(2).listeners["SASL_PLAINTEXT"]
    s = connect(addr)
    s.sendall(wire.request(API_SASL_HANDSHAKE, 0, 1, wire.string("PLAIN")))
    assert wire.recv_response(s, 1).i16() == 0
    assert bare_token(s, b"\x00alice\x00" + PASSWORD.encode()) == b""
    assert wire.api_versions_on(s, correlation_id=2)
    s.close()

    s = connect(addr)
    s.sendall(wire.request(API_SASL_HANDSHAKE, 0, 1, wire.string("SCRAM-SHA-512")))
    assert wire.recv_response(s, 1).i16() == 0
    bare = "n=alice,r=v0nonce"
    server_first = bare_token(s, ("n,," + bare).encode()).decode()
    final, expected = scram_final("SCRAM-SHA-512", PASSWORD, bare, server_first)
    assert bare_token(s, final.encode()).decode() == expected
    assert wire.api_versions_on(s, correlation_id=2)
    s.close()

    # A wrong password over v0: the connection is closed unanswered.
    s = connect(addr)
    s.sendall(wire.request(API_SASL_HANDSHAKE, 0, 1, wire.string("PLAIN")))
    assert wire.recv_response(s, 1).i16() == 0
    s.sendall(wire.i32(12) + b"\x00alice\x00wrong")
    assert closed(s)


def test_malformed_sasl_exchanges_are_refused_without_harm(secure, certs):
    addr = secure.node(3).listeners["SASL_PLAINTEXT"]

    s = connect(addr)
    err, mechanisms = sasl_handshake(s, "GSSAPI")
    assert err == UNSUPPORTED_SASL_MECHANISM and set(mechanisms) == {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}
    assert closed(s)

    s = connect(addr)
    assert sasl_authenticate(s, b"n,,n=alice,r=abc")[0] == ILLEGAL_SASL_STATE, "SaslAuthenticate before handshake"
    assert closed(s)

    s = connect(addr)
    assert sasl_handshake(s, "PLAIN")[0] == 0
    assert sasl_handshake(s, "PLAIN", correlation_id=2)[0] == ILLEGAL_SASL_STATE, "a second handshake"
    assert closed(s)

    cases = [
        ("PLAIN", b"no separators"),
        ("PLAIN", b"\x00alice"),
        ("SCRAM-SHA-256", b"garbage"),
        ("SCRAM-SHA-256", b"p=tls-unique,,n=alice,r=abc"),
        ("SCRAM-SHA-512", b"\xff\xfe\x00 not utf-8"),
        ("SCRAM-SHA-512", b"n,,n=alice,r=" + b"x" * (100 << 10)),  # past the 64 KiB a SCRAM message may have
    ]
    for mechanism, payload in cases:
        s = connect(addr)
        assert sasl_handshake(s, mechanism)[0] == 0
        err, msg, _ = sasl_authenticate(s, payload)
        assert err == SASL_AUTHENTICATION_FAILED, (mechanism, payload[:40], err, msg)
        assert closed(s)

    # A 2 MB SaslAuthenticate: past sasl.server.max.receive.size (512 KiB) before
    # authentication, so the frame is not even read; the connection is closed.
    s = connect(addr)
    assert sasl_handshake(s, "SCRAM-SHA-512")[0] == 0
    try:
        s.sendall(wire.request(API_SASL_AUTHENTICATE, 1, 2, wire.nbytes(b"n,,n=alice,r=" + b"x" * (2 << 20))))
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert closed(s)
    harness.wait_for("the refusal in the log", 10,
                     lambda: any("sasl.server.max.receive.size" in n.log_tail(200) for n in secure.nodes.values()))

    # A final message with a nonce other than the server's.
    s = connect(addr)
    assert sasl_handshake(s, "SCRAM-SHA-256")[0] == 0
    bare = "n=alice,r=clientnonce"
    err, _, server_first = sasl_authenticate(s, ("n,," + bare).encode())
    assert err == 0 and server_first.decode().startswith("r=clientnonce")
    final, _ = scram_final("SCRAM-SHA-256", PASSWORD, bare, server_first.decode(), nonce="clientnonceFORGED")
    assert sasl_authenticate(s, final.encode(), correlation_id=3)[0] == SASL_AUTHENTICATION_FAILED
    assert closed(s)

    # SASL on a listener without it: ILLEGAL_SASL_STATE, as Kafka answers.
    s = connect(secure.node(3).listeners["PLAINTEXT"])
    assert sasl_handshake(s, "PLAIN")[0] == ILLEGAL_SASL_STATE
    s.close()
    assert_still_serving(secure, certs)


def test_scram_credentials_through_the_kafka_apis(secure, certs):
    a = admin(secure, certs, "SASL_SSL", mechanism="SCRAM-SHA-512")
    upserts = [UserScramCredentialUpsertion("bob", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192),
                                            b"bobs-password")]
    for f in a.alter_user_scram_credentials(upserts).values():
        f.result(timeout=30)
    # A list of users gives a future per user.
    described = {u: f.result(timeout=30) for u, f in a.describe_user_scram_credentials(["bob"]).items()}
    infos = described["bob"].scram_credential_infos
    assert [(i.mechanism, i.iterations) for i in infos] == [(ScramMechanism.SCRAM_SHA_256, 8192)]

    # Bob can log in with SCRAM-SHA-256 and PLAIN, not with SCRAM-SHA-512 (no such credential).
    # The change is committed when the call returns; node 2 sees it once it has applied the
    # metadata record (as in Kafka, other brokers follow the log), so wait for that.
    addr = secure.node(2).listeners["SASL_PLAINTEXT"]
    login_result(addr, "SCRAM-SHA-256", "bob", "bobs-password", want=0)
    err, s = scram_login(addr, "SCRAM-SHA-512", "bob", "bobs-password")
    assert err == SASL_AUTHENTICATION_FAILED
    s.close()

    # Errors per user: unknown mechanism is refused by the client library itself, so a
    # duplicate and a deletion of what does not exist are what the broker answers.
    results = a.alter_user_scram_credentials([
        UserScramCredentialDeletion("nobody", ScramMechanism.SCRAM_SHA_512)])
    with pytest.raises(ck.KafkaException) as e:
        results["nobody"].result(timeout=30)
    assert "RESOURCE_NOT_FOUND" in str(e.value) or "does not exist" in str(e.value), str(e.value)

    for f in a.alter_user_scram_credentials([UserScramCredentialDeletion("bob", ScramMechanism.SCRAM_SHA_256)]).values():
        f.result(timeout=30)
    login_result(addr, "SCRAM-SHA-256", "bob", "bobs-password", want=SASL_AUTHENTICATION_FAILED)
    status, users = secure.get(1, "/v1/users")
    assert status == 200 and [u["name"] for u in users] == ["alice"], users


def test_users_through_the_admin_api_and_cli(secure):
    status, body = secure.send(2, "POST", "/v1/users", {"name": "carol", "password": "pw", "mechanism": "SCRAM-SHA-512"})
    assert status == 201 and body == {"name": "carol", "mechanisms": ["SCRAM-SHA-512"]}, body
    # Node 3 lists carol once it has applied the record that made her.
    def carol_on_node_3():
        status, users = secure.get(3, "/v1/users")
        return status == 200 and {"name": "carol", "mechanisms": ["SCRAM-SHA-512"]} in users and users

    users = harness.wait_for("node 3 to list carol", 20, carol_on_node_3)
    assert "password" not in json.dumps(users) and "key" not in json.dumps(users)
    for bad, code in [({"name": "", "password": "x"}, "UNACCEPTABLE_CREDENTIAL"),
                      ({"name": "dave", "password": ""}, "UNACCEPTABLE_CREDENTIAL"),
                      ({"name": "dave", "password": "x", "mechanism": "MD5"}, "UNSUPPORTED_SASL_MECHANISM"),
                      ({"name": "dave", "password": "x", "iterations": 100}, "UNACCEPTABLE_CREDENTIAL"),
                      ({"name": "dave"}, "INVALID_REQUEST")]:
        status, body = secure.send(1, "POST", "/v1/users", bad)
        assert (status, body["error"]) == (400, code), (bad, status, body)
    login_result(secure.node(1).listeners["SASL_PLAINTEXT"], "SCRAM-SHA-512", "carol", "pw", want=0)
    status, _ = secure.send(1, "DELETE", "/v1/users/carol")
    assert status == 204
    status, body = secure.send(1, "DELETE", "/v1/users/carol")
    assert (status, body["error"]) == (404, "RESOURCE_NOT_FOUND")

    # The CLI, with the password from the environment.
    admin_url = f"http://{secure.node(1).admin}"
    env = dict(os.environ, STROM_USER_PASSWORD="from-env")
    run = lambda *a: subprocess.run([harness.strom_bin(), *a, "--admin-url", admin_url], capture_output=True,
                                    timeout=30, env=env)
    p = run("user", "create", "erin", "--mechanism", "SCRAM-SHA-256")
    assert p.returncode == 0, p.stderr.decode()
    p = run("user", "list")
    assert p.returncode == 0 and "erin" in p.stdout.decode() and "SCRAM-SHA-256" in p.stdout.decode()
    login_result(secure.node(2).listeners["SASL_PLAINTEXT"], "SCRAM-SHA-256", "erin", "from-env", want=0)
    assert run("user", "delete", "erin").returncode == 0
    p = run("user", "delete", "erin")
    assert p.returncode == 1 and "RESOURCE_NOT_FOUND" in p.stderr.decode()


def test_a_renewed_certificate_is_used_by_new_connections(make_cluster, tmp_path):
    first = make_certs(tmp_path / "first")
    c = make_cluster(1, harness.FAST + tls_settings(first, client_auth="none"), listeners=("SSL",))
    addr = c.node(1).listeners["SSL"]

    def handshake(ca):
        ctx = ssl.create_default_context(cafile=f"{ca}/ca.pem")
        with ctx.wrap_socket(connect(addr), server_hostname="127.0.0.1") as s:
            return wire.api_versions_on(s)

    assert handshake(first)
    second = make_certs(tmp_path / "second")
    # Renew in place, as a certificate manager does (write, then rename over).
    with open(f"{second}/server.pem", "rb") as f:
        renewed = f.read()
    tmp = f"{first}/server.pem.tmp"
    with open(tmp, "wb") as f:
        f.write(renewed)
    os.replace(tmp, f"{first}/server.pem")
    assert handshake(second), "the renewed certificate was not served"
    with pytest.raises(ssl.SSLError):
        handshake(first)


@pytest.mark.parametrize("args,reason", [
    (["--set", "listeners=SASL_SSL://127.0.0.1:{p}"], "not SASL"),
    (["--set", "listeners=CLIENTS://127.0.0.1:{p}"], "no security protocol"),
    (["--set", "listeners=PLAINTEXT://127.0.0.1:{p}", "--kafka", "127.0.0.1:{q}"], "use one"),
    (["--set", "listeners=PLAINTEXT:127.0.0.1:{p}"], "NAME://HOST:PORT"),
    (["--set", "sasl.enabled.mechanisms=GSSAPI"], "sasl.enabled.mechanisms"),
])
def test_listener_settings_that_do_not_fit_are_refused_at_start(tmp_path, args, reason):
    p, q, a, r = harness.free_ports(4)
    argv = [harness.strom_bin(), "serve", "--node-id", "1", "--data-dir", str(tmp_path / "d"),
            "--admin", f"127.0.0.1:{a}", "--raft", f"127.0.0.1:{r}"] + [x.format(p=p, q=q) for x in args]
    out = subprocess.run(argv, capture_output=True, timeout=30)
    assert out.returncode == 2, (out.returncode, out.stderr.decode())
    assert reason in out.stderr.decode(), out.stderr.decode()


def test_a_tls_listener_without_a_keystore_does_not_start(tmp_path):
    p, q, a, r = harness.free_ports(4)
    argv = [harness.strom_bin(), "serve", "--node-id", "1", "--data-dir", str(tmp_path / "d"),
            "--admin", f"127.0.0.1:{a}", "--raft", f"127.0.0.1:{r}",
            "--set", f"listeners=PLAINTEXT://127.0.0.1:{p},SSL://127.0.0.1:{q}"]
    out = subprocess.run(argv, capture_output=True, timeout=30)
    assert out.returncode != 0 and "ssl.keystore.location" in out.stderr.decode(), out.stderr.decode()
    out = subprocess.run(argv + ["--set", f"ssl.keystore.location={tmp_path}/missing.pem"], capture_output=True,
                         timeout=30)
    assert out.returncode != 0 and "missing.pem" in out.stderr.decode(), out.stderr.decode()


def test_large_fetches_over_tls_arrive_whole_at_once(secure, certs):
    """Fetch answers larger than the socket buffer, over TLS: their ends must be
    flushed with them (they were once left in the TLS buffer until the
    consumer's request timed out, 60 s later; bench/security_bench.py)."""
    topic = "sec-large"
    secure.create_topic(topic, partitions=3, rf=1)
    secure.wait_topic(topic, 3)
    plain = ",".join(n.listeners["PLAINTEXT"] for n in secure.nodes.values())
    p = ck.Producer({"bootstrap.servers": plain, "linger.ms": 20, "acks": 1})
    payload = os.urandom(1000)
    for i in range(60_000):
        while True:
            try:
                p.produce(topic, value=payload, partition=i % 3)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0
    conf = dict(client_conf(certs, "SSL"), max_partition_fetch_bytes=10 << 20, fetch_max_bytes=50 << 20)
    for round_ in range(3):
        started = time.monotonic()
        got = clients.consume_confluent(bootstrap(secure, "SSL"), topic, {0: 20_000, 1: 20_000, 2: 20_000},
                                        timeout=30, **conf)
        assert sum(len(v) for v in got.values()) == 60_000
        assert time.monotonic() - started < 30, f"round {round_}: {time.monotonic() - started:.1f} s"

