"""Strom nodes, each in its own Linux network namespace on a bridge
(deploy/demos/netns.sh), driven as processes (kill -9, SIGSTOP/SIGCONT, restart with
the same argv and data dir) and over the admin API.

Node i listens on 10.77.x.i (Kafka 9092, admin 9644, quorum 9093); the root namespace
reaches every node through the bridge (10.77.x.254), and nftables rules inside the
namespaces cut the network between nodes without touching the clients in the root
namespace. Every process started here and every namespace created is removed by
close(), which run.py calls on every exit path.
"""
import concurrent.futures
import ctypes
import os
import random
import shutil
import signal
import subprocess
import sys
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "kafka"))
import harness  # noqa: E402  (polling and the admin API, shared with the Kafka client tests)
NETNS = os.path.join(REPO, "deploy", "demos", "netns.sh")

# Fast failure detection (as tests/kafka/harness.py FAST), and followers leave the ISR
# after 3 s behind rather than 10 s, so that faults of a few seconds move ISRs.
DEFAULT_SETTINGS = ("broker.heartbeat.interval.ms=200", "broker.session.timeout.ms=1500",
                    "replica.lag.time.max.ms=3000")


class EnvError(Exception):
    """The machine cannot run the harness (not root, no namespaces, no nft...)."""


wait_for = harness.wait_for


def http(method, url, body=None, timeout=3):
    """(status, json body) or (None, None) when the server could not be reached."""
    return harness.http(method, url, body, timeout=timeout)


def kill_quietly(proc):
    """SIGKILLs and reaps a process that may have exited already."""
    if proc.poll() is None:
        try:
            proc.kill()
            proc.wait(timeout=10)
        except Exception:  # noqa: BLE001 - keep cleaning
            pass


def _die_with_parent():
    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def _run(argv, check=True, timeout=30):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip() or r.stdout.strip()}")
    return r


def ensure_nft(log=print):
    """nft on PATH, installed with apt-get when missing (Debian's registry). Raises EnvError."""
    if shutil.which("nft"):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise EnvError("nftables (nft) is not installed and cannot be installed here (needs root and apt-get)")
    log("nft is missing: installing nftables with apt-get")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    r = subprocess.run(["apt-get", "install", "-y", "-qq", "nftables"], capture_output=True, text=True, env=env,
                       timeout=300)
    if r.returncode != 0 or not shutil.which("nft"):
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, env=env, timeout=300)
        r = subprocess.run(["apt-get", "install", "-y", "-qq", "nftables"], capture_output=True, text=True, env=env,
                           timeout=300)
    if r.returncode != 0 or not shutil.which("nft"):
        raise EnvError(f"could not install nftables with apt-get: {r.stderr.strip()[-300:]}")


def check_env(need_nft=True, need_netem=False, log=print):
    """Raises EnvError saying why this machine cannot run the harness."""
    if os.geteuid() != 0:
        raise EnvError("needs root (network namespaces, nftables, tc)")
    for tool in ("ip", "tc"):
        if not shutil.which(tool):
            raise EnvError(f"needs {tool} (iproute2)")
    probe = f"strom-probe-{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        raise EnvError(f"cannot create a network namespace: {r.stderr.strip()}")
    try:
        if need_netem:
            subprocess.run(["ip", "netns", "exec", probe, "ip", "link", "set", "lo", "up"], capture_output=True)
            r = subprocess.run(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root", "netem",
                                "delay", "1ms"], capture_output=True, text=True)
            if r.returncode != 0:
                raise EnvError(f"the netem nemesis needs the kernel's netem qdisc (sch_netem): tc says "
                               f"{r.stderr.strip() or r.returncode}")
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    if need_nft:
        ensure_nft(log)


def _free_tag():
    """A netns.sh tag whose bridge does not exist and whose subnet is not in use."""
    used = _run(["ip", "-o", "addr"], check=False).stdout
    links = _run(["ip", "-o", "link"], check=False).stdout
    rng = random.Random()
    for _ in range(200):
        tag = "c%03x" % rng.randrange(0x1000)
        subnet = subnet_of(tag)
        if f"stbr-{tag}:" in links or f" {subnet}." in used:
            continue
        return tag
    raise EnvError("no free netns tag/subnet")


def subnet_of(tag):
    import hashlib
    return f"10.77.{int(hashlib.md5(tag.encode()).hexdigest()[:2], 16) % 250 + 1}"


class Node:
    def __init__(self, nid, ns, addr, argv, data_dir, log):
        self.id = nid
        self.ns = ns
        self.addr = addr
        self.kafka = f"{addr}:9092"
        self.admin = f"http://{addr}:9644"
        self.raft = f"{addr}:9093"
        self.argv = argv
        self.data_dir = data_dir
        self.log = log
        self.proc = None
        self.paused = False

    def alive(self):
        return self.proc is not None and self.proc.poll() is None


class Topology:
    def __init__(self, workdir, binary, n=5, voters=3, settings=(), rust_log="info,openraft=off", log=print):
        self.dir = workdir
        self.binary = binary
        self.n = n
        self.voters = min(voters, n)
        self.rust_log = rust_log
        self.say = log
        self.tag = None
        self.nodes = {}
        self.helpers = []  # other processes started inside namespaces (stranded clients)
        self.closed = False
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(4, n))
        self.settings = tuple(settings)

    # ---- set-up / tear-down ------------------------------------------------------------

    def up(self):
        self.tag = _free_tag()
        out = _run(["bash", NETNS, "up", self.tag, str(self.n)]).stdout.strip()
        self.subnet = out.splitlines()[-1]
        quorum = ",".join(f"{i}@{self.subnet}.{i}:9093" for i in range(1, self.voters + 1))
        os.makedirs(os.path.join(self.dir, "nodes"), exist_ok=True)
        for i in range(1, self.n + 1):
            addr = f"{self.subnet}.{i}"
            data_dir = os.path.join(self.dir, "data", f"node-{i}")
            argv = [self.binary, "serve", "--node-id", str(i), "--data-dir", data_dir, "--kafka", f"{addr}:9092",
                    "--admin", f"{addr}:9644", "--raft", f"{addr}:9093", "--quorum", quorum]
            for s in self.settings:
                argv += ["--set", s]
            self.nodes[i] = Node(i, f"strom-{self.tag}-{i}", addr, argv,
                                 data_dir, os.path.join(self.dir, "nodes", f"node-{i}.log"))
        for i in self.nodes:
            self.launch(i)

    def close(self):
        if self.closed:
            return
        self.closed = True
        for node in self.nodes.values():
            if node.proc is not None and node.proc.poll() is None:
                try:
                    node.proc.send_signal(signal.SIGKILL)
                    node.proc.wait(timeout=10)
                except Exception:  # noqa: BLE001 - keep cleaning
                    pass
        for proc in self.helpers:
            kill_quietly(proc)
        if self.tag:
            subprocess.run(["bash", NETNS, "down", self.tag, str(self.n)], capture_output=True, timeout=60)
        self.pool.shutdown(wait=False, cancel_futures=True)

    # ---- processes ---------------------------------------------------------------------

    @property
    def bootstrap(self):
        return ",".join(n.kafka for n in self.nodes.values())

    def launch(self, nid):
        node = self.nodes[nid]
        assert not node.alive(), f"node {nid} is already running"
        env = dict(os.environ, RUST_LOG=self.rust_log)
        with open(node.log, "ab") as log:
            log.write(f"----- {time.strftime('%H:%M:%S')} launch {' '.join(node.argv)}\n".encode())
            log.flush()
            node.proc = subprocess.Popen(["ip", "netns", "exec", node.ns] + node.argv, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log, env=env, preexec_fn=_die_with_parent)
        node.paused = False

    def run_in_ns(self, nid, argv, stdout, stderr):
        """A helper process inside node nid's namespace (killed by close())."""
        proc = subprocess.Popen(["ip", "netns", "exec", self.nodes[nid].ns] + argv, stdin=subprocess.DEVNULL,
                                stdout=stdout, stderr=stderr, preexec_fn=_die_with_parent)
        self.helpers.append(proc)
        return proc

    def kill(self, nid):
        node = self.nodes[nid]
        if node.proc is not None:
            if node.proc.poll() is None:
                node.proc.send_signal(signal.SIGKILL)
            node.proc.wait(timeout=30)
            node.proc = None
        node.paused = False

    def pause(self, nid):
        node = self.nodes[nid]
        if node.alive():
            node.proc.send_signal(signal.SIGSTOP)
            node.paused = True

    def resume(self, nid):
        node = self.nodes[nid]
        if node.alive():
            node.proc.send_signal(signal.SIGCONT)
        node.paused = False

    def exited_unexpectedly(self):
        """Nodes whose process ended although no nemesis killed them."""
        return [(n.id, n.proc.returncode) for n in self.nodes.values()
                if n.proc is not None and n.proc.poll() is not None]

    # ---- network -----------------------------------------------------------------------

    def netns(self, *args):
        return _run(["bash", NETNS, args[0], self.tag] + [str(a) for a in args[1:]])

    def drop(self, nid, peers):
        """nid stops receiving from peers (one way)."""
        if peers:
            self.netns("drop", nid, *sorted(peers))

    def undrop(self, nid):
        self.netns("undrop", nid)

    def netem(self, nid, spec):
        self.netns("netem", nid, *spec.split())

    def unnetem(self, nid):
        self.netns("unnetem", nid)

    def heal_network(self):
        self.netns("heal-all", self.n)

    # ---- admin API ---------------------------------------------------------------------

    def get(self, nid, path, timeout=2):
        return http("GET", self.nodes[nid].admin + path, timeout=timeout)

    def post(self, nid, path, body, timeout=10):
        return http("POST", self.nodes[nid].admin + path, body, timeout=timeout)

    def reachable(self):
        """Nodes whose process runs and is not paused."""
        return [n.id for n in self.nodes.values() if n.alive() and not n.paused]

    def views(self, path, timeout=1.5):
        """{node id: body} of GET path from every running, unpaused node, in parallel."""
        ids = self.reachable()
        futs = {nid: self.pool.submit(self.get, nid, path, timeout) for nid in ids}
        out = {}
        for nid, fut in futs.items():
            try:
                status, body = fut.result(timeout=timeout + 2)
            except Exception:  # noqa: BLE001
                continue
            if status == 200:
                out[nid] = body
        return out

    def controller(self):
        """The controller, as the node that says it is the controller sees it (or the most
        common answer); None if unknown."""
        views = self.views("/v1/cluster")
        claims = {}
        for nid, v in views.items():
            c = v.get("controller_id")
            if c is not None:
                claims.setdefault(c, []).append(nid)
        # A node cut off from the quorum may still believe it leads: of the nodes that say
        # they are the controller, the one most others agree with.
        self_claimed = [c for c, seen_by in claims.items() if c in seen_by]
        if self_claimed:
            return max(self_claimed, key=lambda c: len(claims[c]))
        if claims:
            return max(claims, key=lambda c: len(claims[c]))
        return None

    def topic(self, name, via=None):
        order = ([via] if via else []) + [i for i in self.reachable() if i != via]
        for nid in order:
            if nid is None or nid not in self.reachable():
                continue
            status, body = self.get(nid, f"/v1/topics/{name}", timeout=2)
            if status == 200:
                return body
        return None

    def leader_of(self, topic, partition):
        c = self.controller()
        t = self.topic(topic, via=c)
        if not t:
            return None
        for p in t["partitions"]:
            if p["partition"] == partition:
                return p["leader"]
        return None

    def wait_ready(self, timeout=90):
        """Every node ready, one controller seen by all, every broker active."""
        def check():
            dead = self.exited_unexpectedly()
            if dead:
                raise RuntimeError(f"node(s) exited: {dead}")
            controllers = set()
            for nid in self.nodes:
                if self.get(nid, "/ready")[0] != 200:
                    return None
                status, view = self.get(nid, "/v1/cluster")
                if status != 200 or view.get("controller_id") is None:
                    return None
                if sum(b["state"] == "active" for b in view["brokers"]) != self.n:
                    return None
                controllers.add(view["controller_id"])
            return controllers.pop() if len(controllers) == 1 else None

        return wait_for(f"{self.n} active brokers and one controller on every node", timeout, check, interval=0.2)

    def create_topic(self, name, partitions, rf, configs):
        def create():
            c = self.controller() or 1
            status, body = self.post(c, "/v1/topics", {"name": name, "partitions": partitions,
                                                       "replication_factor": rf, "configs": configs})
            if status == 201:
                return body
            if status == 409:  # created by an earlier attempt that timed out
                return {"name": name}
            if status is not None and status < 500:
                raise RuntimeError(f"create topic {name}: {status} {body}")
            return None

        return wait_for(f"topic {name} created", 30, create, interval=0.5)

    def healthy(self, topic, partitions):
        """None, or the topic when every node runs, the controller sees every broker
        active, and every partition has a leader and a full ISR."""
        if any(not n.alive() or n.paused for n in self.nodes.values()):
            return None
        c = self.controller()
        if c is None:
            return None
        status, view = self.get(c, "/v1/cluster")
        if status != 200 or sum(b["state"] == "active" for b in view["brokers"]) != self.n:
            return None
        t = self.topic(topic, via=c)
        if not t or len(t["partitions"]) != partitions:
            return None
        for p in t["partitions"]:
            if p["leader"] is None or sorted(p["isr"]) != sorted(p["replicas"]):
                return None
        return t
