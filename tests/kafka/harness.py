"""Real `strom serve` processes on free loopback ports, driven over the HTTP admin API.

Mirrors tests/common/mod.rs: one process per node, logs to files in the cluster's
directory, every process killed when the cluster is closed (also when a test fails).
Standard library only, so bench scripts could use it too.
"""
import ctypes
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEFAULT_BIN = os.path.join(REPO, "target", "debug", "strom")

# Settings that make failure detection quick in tests (as tests/common/mod.rs FAST).
FAST = ("broker.heartbeat.interval.ms=200", "broker.session.timeout.ms=1500")


def strom_bin():
    return os.path.abspath(os.environ.get("STROM_BIN", DEFAULT_BIN))


_HANDED_OUT = set()  # every port free_ports() has returned in this process


def _ephemeral_low():
    """The lowest port of the kernel's ephemeral range (ip_local_port_range)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(n):
    """Free loopback ports: bound once to learn them, then released. Chosen at random
    below the kernel's ephemeral range: a port from that range, once its node is killed,
    can be taken by the local end of any outgoing connection before the node restarts on
    it ("Address already in use", seen in CI). Never one it returned before in this
    process: two calls in a row (a cluster's main ports, then its extra listeners) would
    otherwise risk the same port."""
    import random
    low, high = 10000, max(_ephemeral_low(), 11000)
    socks, ports = [], []
    try:
        while len(ports) < n:
            port = random.randrange(low, high)
            if port in _HANDED_OUT:
                continue
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            socks.append(s)
            _HANDED_OUT.add(port)
            ports.append(port)
        return ports
    finally:
        for s in socks:
            s.close()


def wait_for(what, timeout, f, interval=0.05):
    """Polls f() until it returns something truthy, which is returned; raises
    TimeoutError naming `what` (and the last value/exception seen) after `timeout` s."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            v = f()
            if v:
                return v
            last = v
        except Exception as e:  # noqa: BLE001 - reported on timeout
            last = e
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")
        time.sleep(interval)


def http(method, url, body=None, timeout=20, auth=None, cafile=None):
    """(status, json body) or (None, None) when the server could not be reached.
    auth: (user, password) for HTTP Basic; cafile: the CA of an https URL."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"content-type": "application/json"}
    if auth is not None:
        import base64
        headers["authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    context = None
    if cafile is not None:
        import ssl
        context = ssl.create_default_context(cafile=cafile)
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
            text = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        text = e.read()
        status = e.code
    except OSError:
        return None, None
    try:
        return status, json.loads(text) if text else None
    except ValueError:
        return status, text.decode(errors="replace")


def _die_with_parent():
    # SIGKILL the node if the test process dies without tearing down.
    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class Node:
    def __init__(self, nid, kafka, admin, raft, data_dir, log, argv, listeners=None):
        self.id = nid
        self.kafka = kafka  # "127.0.0.1:port"
        # Every Kafka listener by name, PLAINTEXT (the `kafka` address) included.
        self.listeners = dict(listeners or {"PLAINTEXT": kafka})
        self.admin = admin
        self.raft = raft
        self.data_dir = data_dir
        self.log = log
        self.argv = argv
        self.proc = None

    @property
    def pid(self):
        assert self.proc is not None, f"node {self.id} is not running"
        return self.proc.pid

    @property
    def kafka_addr(self):
        host, port = self.kafka.rsplit(":", 1)
        return host, int(port)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines=60):
        try:
            with open(self.log, "rb") as f:
                text = f.read().decode(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


class Cluster:
    """n nodes, the first `voters` of them quorum voters, all started at once."""

    def __init__(self, directory, n=1, voters=None, settings=(), binary=None, rust_log=None, node_settings=None,
                 listeners=(), admin_access=None):
        """listeners: extra Kafka listener names besides PLAINTEXT (the `kafka` address),
        each mapped to the security protocol of the same name, on ports of their own.
        admin_access: {"scheme": "https", "auth": (user, password), "ca": path} for an
        admin API with TLS or authentication on."""
        self.admin_access = dict(admin_access or {})
        self.dir = str(directory)
        self.rust_log = rust_log or os.environ.get("STROM_TEST_RUST_LOG", "info,openraft=off")
        self.binary = binary or strom_bin()
        if not os.access(self.binary, os.X_OK):
            raise RuntimeError(f"strom binary {self.binary} is missing (cargo build first, or set STROM_BIN)")
        voters = min(n, 3) if voters is None else voters
        extra = tuple(listeners)
        ports = free_ports(3 * n)
        extra_ports = free_ports(len(extra) * n) if extra else []
        raft = [f"127.0.0.1:{ports[3 * i + 2]}" for i in range(n)]
        quorum = ",".join(f"{i + 1}@{raft[i]}" for i in range(voters))
        self.nodes = {}
        for i in range(n):
            nid = i + 1
            data_dir = os.path.join(self.dir, f"node-{nid}")
            kafka = f"127.0.0.1:{ports[3 * i]}"
            admin = f"127.0.0.1:{ports[3 * i + 1]}"
            named = {"PLAINTEXT": kafka}
            named.update({name: f"127.0.0.1:{extra_ports[len(extra) * i + j]}" for j, name in enumerate(extra)})
            argv = [self.binary, "serve", "--node-id", str(nid), "--data-dir", data_dir]
            if extra:
                argv += ["--set", "listeners=" + ",".join(f"{k}://{v}" for k, v in named.items())]
            else:
                argv += ["--kafka", kafka]
            argv += ["--admin", admin, "--raft", raft[i], "--quorum", quorum]
            for s in tuple(settings) + tuple((node_settings or {}).get(nid, ())):
                argv += ["--set", s]
            log = os.path.join(self.dir, f"node-{nid}.log")
            self.nodes[nid] = Node(nid, kafka, admin, raft[i], data_dir, log, argv, listeners=named)
        self.closed = False
        try:
            for nid in self.nodes:
                self.launch(nid)
        except BaseException:
            self.close()
            raise

    # ---- processes -------------------------------------------------------------------

    def node(self, nid):
        return self.nodes[nid]

    @property
    def bootstrap(self):
        return ",".join(n.kafka for n in self.nodes.values())

    def launch(self, nid):
        """Starts node nid from its argv (again), appending to its log."""
        node = self.nodes[nid]
        assert not node.alive(), f"node {nid} is already running"
        env = dict(os.environ, RUST_LOG=self.rust_log)
        with open(node.log, "ab") as log:
            log.write(f"----- launch {' '.join(node.argv)}\n".encode())
            log.flush()
            node.proc = subprocess.Popen(node.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                         preexec_fn=_die_with_parent)

    def kill(self, nid):
        """SIGKILL, and reap."""
        node = self.nodes[nid]
        if node.proc is not None:
            if node.proc.poll() is None:
                node.proc.send_signal(signal.SIGKILL)
            node.proc.wait(timeout=30)
            node.proc = None

    def signal(self, nid, sig):
        self.nodes[nid].proc.send_signal(sig)

    def running(self):
        return [nid for nid, n in self.nodes.items() if n.proc is not None]

    def close(self):
        if self.closed:
            return
        self.closed = True
        for nid in list(self.nodes):
            try:
                self.kill(nid)
            except Exception:  # noqa: BLE001 - keep killing the others
                pass

    def log_tails(self, lines=60):
        out = []
        for node in self.nodes.values():
            state = "running" if node.alive() else (
                f"exited {node.proc.returncode}" if node.proc is not None else "not running")
            out.append(f"----- node {node.id} ({state}) log tail: {node.log} -----\n{node.log_tail(lines)}")
        return "\n".join(out)

    def check_alive(self):
        dead = [n.id for n in self.nodes.values() if n.proc is not None and n.proc.poll() is not None]
        assert not dead, f"node(s) {dead} exited unexpectedly:\n{self.log_tails()}"

    # ---- admin API -------------------------------------------------------------------

    def admin_url(self, nid, path):
        return f"{self.admin_access.get('scheme', 'http')}://{self.nodes[nid].admin}{path}"

    def get(self, nid, path, timeout=20):
        return http("GET", self.admin_url(nid, path), timeout=timeout, auth=self.admin_access.get("auth"),
                    cafile=self.admin_access.get("ca"))

    def send(self, nid, method, path, body=None, timeout=20):
        return http(method, self.admin_url(nid, path), body, timeout=timeout, auth=self.admin_access.get("auth"),
                    cafile=self.admin_access.get("ca"))

    def cluster_view(self, nid):
        status, body = self.get(nid, "/v1/cluster", timeout=5)
        return body if status == 200 else None

    def wait_active(self, n=None, timeout=60):
        """Waits until every running node is ready, sees one controller and n active
        brokers; returns the controller id."""
        n = len(self.nodes) if n is None else n

        def check():
            self.check_alive()
            controllers = set()
            for nid in self.running():
                if self.get(nid, "/ready", timeout=5)[0] != 200:
                    return None
                view = self.cluster_view(nid)
                if not view or view.get("controller_id") is None:
                    return None
                if sum(b["state"] == "active" for b in view["brokers"]) != n:
                    return None
                controllers.add(view["controller_id"])
            return controllers.pop() if len(controllers) == 1 else None

        return wait_for(f"{n} active brokers and one controller on every node", timeout, check)

    def wait_kafka(self, timeout=20):
        """Waits until every running node's Kafka listener answers ApiVersions."""
        from wire import api_versions  # local import: wire has no third-party deps either

        for nid in self.running():
            node = self.nodes[nid]

            def answers():
                self.check_alive()
                return api_versions(node.kafka_addr, timeout=5)

            wait_for(f"node {nid}'s Kafka listener {node.kafka} to answer ApiVersions", timeout, answers,
                     interval=0.1)

    def wait_ready(self, timeout=60):
        controller = self.wait_active(timeout=timeout)
        self.wait_kafka()
        return controller

    def create_topic(self, name, partitions=1, rf=1, configs=None, via=1):
        status, body = self.send(via, "POST", "/v1/topics", {
            "name": name, "partitions": partitions, "replication_factor": rf, "configs": configs or {}})
        assert status == 201, f"create topic {name}: {status} {body}"
        return body

    def topic(self, name, via=1):
        status, body = self.get(via, f"/v1/topics/{name}", timeout=5)
        return body if status == 200 else None

    def wait_topic(self, name, partitions, timeout=30):
        """Waits until every running node reports `partitions` online partitions with
        a leader for topic `name`; returns the topic as the first running node sees it."""
        def check():
            self.check_alive()
            seen = None
            for nid in self.running():
                t = self.topic(name, via=nid)
                if not t or len(t["partitions"]) != partitions:
                    return None
                if any(p["leader"] is None or p["state"] != "online" for p in t["partitions"]):
                    return None
                seen = seen or t
            return seen

        return wait_for(f"topic {name} with {partitions} online partitions on every node", timeout, check)

    def leaders(self, name, via=1):
        t = self.topic(name, via=via)
        return {p["partition"]: p["leader"] for p in t["partitions"]}


def start(directory, n=1, settings=(), voters=None, timeout=60, binary=None, rust_log=None, node_settings=None,
          listeners=(), admin_access=None):
    """A Cluster that is up: every node ready, one controller, n active brokers, and every
    Kafka listener answering ApiVersions. On failure everything is killed and the error
    carries the tail of each node's log."""
    c = Cluster(directory, n=n, voters=voters, settings=tuple(settings), binary=binary, rust_log=rust_log,
                node_settings=node_settings, listeners=listeners, admin_access=admin_access)
    try:
        c.wait_ready(timeout=timeout)
    except BaseException as e:
        tails = c.log_tails()
        c.close()
        raise RuntimeError(f"cluster of {n} in {directory} did not come up: {e}\n{tails}") from None
    return c
