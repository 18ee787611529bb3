"""The admin API with HTTPS, authentication and ACLs on.

3 nodes with `admin.tls.enabled`, `admin.authentication.enabled` and the
authorizer; `admin.client.credentials` names the user the nodes present to one
another (and that is created from it at start). Checks 401 without or with bad
credentials, 403 when the ACLs say no, 200 for the super user, client
certificates as principals, curl and the CLI, and that the views that ask
other nodes still work.
"""
import json
import os
import ssl
import subprocess
import urllib.request

import pytest

import harness
from test_security import make_certs

PASSWORD = "admin-pw-1"


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    certs = make_certs(tmp_path_factory.mktemp("certs"), clients_=("alice",))
    credentials = certs / "credentials.json"
    credentials.write_text(json.dumps({"user": "admin", "password": PASSWORD, "mechanism": "SCRAM-SHA-512",
                                       "ca": f"{certs}/ca.pem"}))
    os.chmod(credentials, 0o600)
    settings = harness.FAST + (
        "admin.tls.enabled=true", "admin.authentication.enabled=true",
        f"ssl.keystore.location={certs}/server.pem", f"ssl.truststore.location={certs}/ca.pem",
        "ssl.client.auth=requested", f"admin.client.credentials={credentials}",
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users=User:admin;User:ANONYMOUS", "connection.failed.authentication.delay.ms=10")
    access = {"scheme": "https", "auth": ("admin", PASSWORD), "ca": f"{certs}/ca.pem"}
    c = harness.start(tmp_path_factory.mktemp("strom"), 3, settings, admin_access=access)
    try:
        yield c, certs, credentials
    finally:
        c.close()


def call(c, certs, method, path, body=None, auth=None, nid=1):
    return harness.http(method, f"https://{c.node(nid).admin}{path}", body, auth=auth, cafile=f"{certs}/ca.pem")


def test_who_may_use_the_admin_api(secured):
    c, certs, _ = secured
    # Open paths.
    assert call(c, certs, "GET", "/health")[0] == 200
    assert call(c, certs, "GET", "/ready")[0] == 200
    # 401 without credentials, with a wrong password, for an unknown user.
    for auth in (None, ("admin", "wrong"), ("nobody", PASSWORD)):
        for path in ("/v1/cluster", "/metrics", "/v1/openapi.json"):
            status, body = call(c, certs, "GET", path, auth=auth)
            assert (status, body["error"]) == (401, "SASL_AUTHENTICATION_FAILED"), (auth, path, status, body)
    # The super user.
    status, body = call(c, certs, "GET", "/v1/cluster", auth=("admin", PASSWORD))
    assert status == 200 and len(body["brokers"]) == 3

    # A user the ACLs know nothing about: 403, per resource.
    assert c.send(1, "POST", "/v1/users", {"name": "viewer", "password": "vpw"})[0] == 201
    viewer = ("viewer", "vpw")
    status, body = call(c, certs, "GET", "/v1/cluster", auth=viewer)
    assert (status, body["error"]) == (403, "CLUSTER_AUTHORIZATION_FAILED"), body
    assert c.send(1, "POST", "/v1/acls", {"principal": "User:viewer", "resource_type": "cluster",
                                          "operation": "describe", "permission": "allow"})[0] == 201
    assert call(c, certs, "GET", "/v1/cluster", auth=viewer)[0] == 200
    status, body = call(c, certs, "POST", "/v1/topics", {"name": "v-1", "partitions": 3, "replication_factor": 1},
                        auth=viewer)
    assert (status, body["error"]) == (403, "CLUSTER_AUTHORIZATION_FAILED"), body
    c.create_topic("v-1", partitions=3, rf=1)
    c.wait_topic("v-1", 3)
    status, body = call(c, certs, "DELETE", "/v1/topics/v-1", auth=viewer)
    assert (status, body["error"]) == (403, "TOPIC_AUTHORIZATION_FAILED"), body
    status, body = call(c, certs, "GET", "/v1/groups/g", auth=viewer)
    assert (status, body["error"]) == (403, "GROUP_AUTHORIZATION_FAILED"), body
    assert c.send(1, "POST", "/v1/acls", {"principal": "User:viewer", "resource_type": "topic",
                                          "resource_name": "v-", "pattern_type": "prefixed", "operation": "all",
                                          "permission": "allow"})[0] == 201
    # Describing the topic asks the other leaders for their offsets, over
    # https with the nodes' credentials: every partition has its offsets.
    status, topic = call(c, certs, "GET", "/v1/topics/v-1", auth=viewer, nid=2)
    assert status == 200
    assert all(p["high_watermark"] is not None for p in topic["partitions"]), topic
    assert call(c, certs, "DELETE", "/v1/topics/v-1", auth=viewer)[0] == 204


def test_curl_the_cli_and_client_certificates(secured):
    c, certs, credentials = secured
    url = f"https://{c.node(2).admin}"
    p = subprocess.run(["curl", "-sk", "-u", f"admin:{PASSWORD}", f"{url}/v1/cluster"], capture_output=True,
                       timeout=30)
    assert p.returncode == 0 and json.loads(p.stdout)["controller_id"] is not None, p.stdout[:300]
    p = subprocess.run(["curl", "-sk", "-o", "/dev/null", "-w", "%{http_code}", f"{url}/v1/cluster"],
                       capture_output=True, timeout=30)
    assert p.stdout == b"401"
    # Plain HTTP to the HTTPS port gets no answer.
    p = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "5",
                        f"http://{c.node(2).admin}/health"], capture_output=True, timeout=30)
    assert p.stdout in (b"000", b"400"), p.stdout

    env = dict(os.environ, STROM_ADMIN_CREDENTIALS=str(credentials))
    p = subprocess.run([harness.strom_bin(), "cluster-info", "--admin-url", url], capture_output=True, timeout=30,
                       env=env)
    assert p.returncode == 0, p.stderr.decode()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STROM_ADMIN")}
    p = subprocess.run([harness.strom_bin(), "cluster-info", "--admin-url", url, "--admin-ca", f"{certs}/ca.pem"],
                       capture_output=True, timeout=30, env=env)
    assert p.returncode == 1 and "SASL_AUTHENTICATION_FAILED" in p.stderr.decode(), p.stderr.decode()

    # A client certificate names the principal: no password needed, the ACLs decide.
    ctx = ssl.create_default_context(cafile=f"{certs}/ca.pem")
    ctx.load_cert_chain(f"{certs}/client-alice.pem", f"{certs}/client-alice.key")

    def as_alice():
        try:
            with urllib.request.urlopen(f"{url}/v1/cluster", context=ctx, timeout=20) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    assert as_alice() == 403
    assert c.send(1, "POST", "/v1/acls", {"principal": "User:CN=alice,O=Strom", "resource_type": "cluster",
                                          "operation": "describe", "permission": "allow"})[0] == 201
    assert as_alice() == 200
