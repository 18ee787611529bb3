"""Strom nodes, each in its own Linux network namespace on a bridge
(deploy/demos/netns.sh), driven as processes (kill -9, SIGSTOP/SIGCONT, restart with
the same argv and data dir) and over the admin API.

Node i listens on 10.77.x.i (Kafka 9092, admin 9644, quorum 9093); the root namespace
reaches every node through the bridge (10.77.x.254), and nftables rules inside the
namespaces cut the network between nodes without touching the clients in the root
namespace. Every process started here and every namespace created is removed by
close(), which run.py calls on every exit path.

Storage and clocks for the clock, disk and power nemeses (made only when they are on):
- clock: every node runs with libfaketime preloaded from its first start (so any node
  can be skewed without a restart), reading its offset from its own file
  (FAKETIME_TIMESTAMP_FILE, re-read on every call: FAKETIME_NO_CACHE=1); only the
  realtime clock is faked (FAKETIME_DONT_FAKE_MONOTONIC=1), as an NTP step would.
- disk: every node's data lives on its own small tmpfs (DISK_FS_BYTES), which a ballast
  file fills up to below storage.min.free.bytes.
- power: every node's data dir is a lossyfs mount (lossyfs.py) over a backing dir, which
  loses every write not fsynced when the power fails.
close() unmounts all of it (lossyfs first, which writes back what it held) and leaves
each node's final data in its data dir.
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
import lossyfs  # noqa: E402  (its control client; the file system runs as its own process)
NETNS = os.path.join(REPO, "deploy", "demos", "netns.sh")
POWER_CANARY = ".power-canary"  # beside the broker's data, which ignores it
CANARY_BYTES = 8192
LOSSYFS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lossyfs.py")
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
# The disk nemesis: each node's data on a tmpfs this large, the broker refusing writes
# below MIN_FREE_BYTES free (storage.min.free.bytes, unless --set says otherwise), and a
# fault leaving half of that free. The workload writes a few MB a minute, so it cannot
# fill the tmpfs by itself.
DISK_FS_BYTES = 256 * 1024 * 1024
MIN_FREE_BYTES = 32 * 1024 * 1024
BALLAST = "chaos-ballast"

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


def popen_logged(argv, log_path):
    """A client process of a workload, its output appended to log_path; it dies with the
    harness."""
    log = open(log_path, "ab")
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, preexec_fn=_die_with_parent)
    log.close()
    return proc


def wait_or_stop(proc, timeout_s=90):
    """Waits for a process to end on its own, then SIGTERMs it, then SIGKILLs it (a stalled
    consumer can hang in close(); its history is written by then)."""
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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


def _apt_install(package, present, log=print):
    """Installs a Debian package with apt-get unless present() already holds (the
    environment checks' installs, Debian's registry only). Raises EnvError."""
    if present():
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise EnvError(f"{package} is not installed and cannot be installed here (needs root and apt-get)")
    log(f"{package} is missing: installing it with apt-get")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    r = subprocess.run(["apt-get", "install", "-y", "-qq", package], capture_output=True, text=True, env=env,
                       timeout=300)
    if r.returncode != 0 or not present():
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, env=env, timeout=300)
        r = subprocess.run(["apt-get", "install", "-y", "-qq", package], capture_output=True, text=True, env=env,
                           timeout=300)
    if r.returncode != 0 or not present():
        raise EnvError(f"could not install {package} with apt-get: {r.stderr.strip()[-300:]}")


def ensure_nft(log=print):
    """nft on PATH, installed with apt-get when missing (Debian's registry). Raises EnvError."""
    _apt_install("nftables", lambda: shutil.which("nft"), log)


def ensure_faketime(log=print):
    """libfaketime (Debian's `faketime`), and proof that a preloaded process sees the
    offset its timestamp file names. Raises EnvError."""
    _apt_install("faketime", lambda: os.path.exists(FAKETIME_LIB), log)
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".faketime") as f:
        f.write("+86400\n")
        f.flush()
        env = dict(os.environ, LD_PRELOAD=FAKETIME_LIB, FAKETIME_TIMESTAMP_FILE=f.name, FAKETIME_NO_CACHE="1",
                   FAKETIME_DONT_FAKE_MONOTONIC="1")
        r = subprocess.run(["date", "+%s"], capture_output=True, text=True, env=env, timeout=10)
    try:
        skew = int(r.stdout.strip()) - time.time()
    except ValueError:
        skew = None
    if skew is None or abs(skew - 86400) > 60:
        raise EnvError(f"libfaketime does not shift the clock here (date said {r.stdout.strip()!r} "
                       f"{r.stderr.strip()[-200:]})")


def _mounted(path):
    """Whether path is a mount point (from /proc/self/mounts, which, unlike
    os.path.ismount, also sees a FUSE mount whose daemon died)."""
    path = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        for line in f:
            if line.split()[1].replace("\\040", " ") == path:
                return True
    return False


def _umount(path):
    """Unmounts path (lazily when busy or dead); True when it is no longer mounted."""
    if not _mounted(path):
        return True
    subprocess.run(["umount", path], capture_output=True, timeout=30)
    if _mounted(path):
        subprocess.run(["umount", "-l", path], capture_output=True, timeout=30)
    return not _mounted(path)


def ensure_tmpfs():
    """A small tmpfs can be mounted (the disk nemesis). Raises EnvError."""
    import tempfile
    d = tempfile.mkdtemp(prefix="strom-tmpfs-probe.")
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "strom-chaos-probe", d], capture_output=True,
                           text=True, timeout=30)
        if r.returncode != 0:
            raise EnvError(f"the disk nemesis cannot mount a tmpfs: {r.stderr.strip()}")
    finally:
        _umount(d)
        os.rmdir(d)


def ensure_fuse(log=print):
    """What the power nemesis's lossyfs needs: /dev/fuse, libfuse 2 (Debian's `libfuse2`,
    installed when missing), fusepy in this Python (tests/setup_python.sh), and a probe
    mount that really loses an unsynced write. Raises EnvError."""
    if not os.path.exists("/dev/fuse"):
        raise EnvError("the power nemesis needs FUSE: /dev/fuse is missing")
    libdirs = ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib", "/usr/lib64")
    _apt_install("libfuse2", lambda: any(os.path.exists(os.path.join(d, "libfuse.so.2")) for d in libdirs), log)
    r = subprocess.run([sys.executable, "-c", "import fuse"], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise EnvError(f"the power nemesis needs fusepy in {sys.executable} (tests/setup_python.sh installs it): "
                       f"{r.stderr.strip()[-200:]}")
    import tempfile
    d = tempfile.mkdtemp(prefix="strom-lossyfs-probe.")
    fs = None
    try:
        os.makedirs(os.path.join(d, "b"))
        os.makedirs(os.path.join(d, "m"))
        fs = LossyMount(os.path.join(d, "b"), os.path.join(d, "m"), f"strom-lossyfs-probe-{os.getpid()}",
                        os.path.join(d, "log"))
        fs.wait_mounted()
        with open(os.path.join(d, "m", "f"), "wb") as f:
            f.write(b"unsynced")
        fs.command("drop")
        if os.path.getsize(os.path.join(d, "m", "f")) != 0:
            raise EnvError("lossyfs kept an unsynced write through a power loss")
    except (OSError, RuntimeError, TimeoutError) as e:
        try:
            with open(os.path.join(d, "log")) as f:
                tail = f.read()[-300:]
        except OSError:
            tail = ""
        raise EnvError(f"the power nemesis cannot mount lossyfs (FUSE): {e} {tail}".strip()) from None
    finally:
        if fs is not None:
            fs.stop()
        shutil.rmtree(d, ignore_errors=True)


class LossyMount:
    """A running lossyfs: BACKING mounted at MOUNTPOINT by its own process (see lossyfs.py)."""

    def __init__(self, backing, mountpoint, control, log_path):
        self.backing = backing
        self.mountpoint = mountpoint
        self.control = control
        with open(log_path, "ab") as log:
            # Its own session: a Ctrl-C reaches the harness, which unmounts in order.
            self.proc = subprocess.Popen([sys.executable, LOSSYFS, backing, mountpoint, "--control", control],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         preexec_fn=_die_with_parent, start_new_session=True)
        self.log_path = log_path

    def wait_mounted(self, timeout=20):
        def up():
            if self.proc.poll() is not None:
                raise RuntimeError(f"lossyfs exited ({self.proc.returncode}); see {self.log_path}")
            return _mounted(self.mountpoint) and self.command("ping")

        wait_for(f"lossyfs mounted on {self.mountpoint}", timeout, up, interval=0.1)
        return self

    def command(self, cmd):
        """drop | sync | stats | ping: lossyfs's answer (a dict)."""
        return lossyfs.control(self.control, cmd)

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        """Unmounts (lossyfs writes back what it held first, as a clean shutdown would);
        True when nothing is left mounted."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # libfuse unmounts and runs destroy()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                kill_quietly(self.proc)
        return _umount(self.mountpoint)


def check_env(need_nft=True, need_netem=False, need_faketime=False, need_tmpfs=False, need_fuse=False, log=print):
    """Raises EnvError saying why this machine cannot run the harness (or the nemeses asked for)."""
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
    if need_faketime:
        ensure_faketime(log)
    if need_tmpfs:
        ensure_tmpfs()
    if need_fuse:
        ensure_fuse(log)


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
        self.disk_dir = data_dir  # where its bytes are (a lossyfs's backing dir under power)
        self.tmpfs = False        # disk_dir is a small tmpfs (the disk nemesis)
        self.lossy = None         # the LossyMount of data_dir (the power nemesis)
        self.clock_file = None    # its libfaketime offset file (the clock nemesis)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None


class Topology:
    def __init__(self, workdir, binary, n=5, voters=3, settings=(), rust_log="info,openraft=off", log=print,
                 clock=False, disk=False, power=False):
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
        self.clock = clock  # libfaketime preloaded into every node
        self.disk = disk    # every node's data on a small tmpfs
        self.power = power  # every node's data dir on lossyfs
        floors = [int(x.split("=", 1)[1]) for x in self.settings if x.split("=", 1)[0] == "storage.min.free.bytes"]
        self.ballast_leaves = (floors[-1] if floors else MIN_FREE_BYTES) // 2  # the disk nemesis's free space

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
        for node in self.nodes.values():
            self._make_storage(node)
        for i in self.nodes:
            self.launch(i)

    def _make_storage(self, node):
        """The node's data dir, its tmpfs (disk), its lossyfs (power) and its clock file
        (clock). Each mount is recorded on the node before it is waited for, so that
        close() undoes whatever was made."""
        os.makedirs(node.data_dir, exist_ok=True)
        if self.power:
            node.disk_dir = node.data_dir + ".disk"
            os.makedirs(node.disk_dir, exist_ok=True)
        if self.disk:
            _run(["mount", "-t", "tmpfs", "-o", f"size={DISK_FS_BYTES},mode=0755", f"strom-chaos-{self.tag}",
                  node.disk_dir])
            node.tmpfs = True
        if self.power:
            node.lossy = LossyMount(node.disk_dir, node.data_dir, f"strom-lossyfs-{self.tag}-{node.id}-{os.getpid()}",
                                    os.path.join(self.dir, "nodes", f"node-{node.id}.lossyfs.log"))
            node.lossy.wait_mounted()
        if self.clock:
            os.makedirs(os.path.join(self.dir, "clock"), exist_ok=True)
            node.clock_file = os.path.join(self.dir, "clock", f"node-{node.id}.faketime")
            self.set_clock(node.id, 0)

    def _remove_storage(self, node):
        """Unmounts the node's lossyfs (which writes back what it held) and tmpfs, leaving
        its final data in its data dir (a tmpfs's is copied out first, less the ballast)."""
        if node.lossy is not None:
            if not node.lossy.stop():
                self.say(f"node {node.id}: could not unmount lossyfs on {node.data_dir}")
                return
            node.lossy = None
        final = node.disk_dir
        if node.tmpfs:
            final = node.data_dir + ".saved"
            try:
                shutil.copytree(node.disk_dir, final, symlinks=True, ignore=shutil.ignore_patterns(BALLAST))
            except (OSError, shutil.Error) as e:
                self.say(f"node {node.id}: its data could not be copied off its tmpfs: {e}")
                final = None
            if not _umount(node.disk_dir):
                self.say(f"node {node.id}: could not unmount the tmpfs on {node.disk_dir}")
                return
            node.tmpfs = False
        if final and final != node.data_dir:
            for d in {node.data_dir, node.disk_dir} - {final}:
                if os.path.isdir(d):
                    os.rmdir(d)  # an emptied mount point
            os.rename(final, node.data_dir)
        node.disk_dir = node.data_dir

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
        for node in self.nodes.values():
            try:
                self._remove_storage(node)
            except Exception as e:  # noqa: BLE001 - keep cleaning
                self.say(f"node {node.id}: storage clean-up failed: {e}")
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
        if node.clock_file:
            # Only CLOCK_REALTIME moves (as an NTP step would); the file is re-read on
            # every call, so the offset changes without a restart.
            env.update(LD_PRELOAD=FAKETIME_LIB, FAKETIME_TIMESTAMP_FILE=node.clock_file, FAKETIME_NO_CACHE="1",
                       FAKETIME_DONT_FAKE_MONOTONIC="1")
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

    def degrade(self, nid, spec):
        self.netns("degrade", nid, *spec.split())

    def undegrade(self, nid):
        self.netns("undegrade", nid)

    def heal_network(self):
        self.netns("heal-all", self.n)

    # ---- clocks, disks, power ----------------------------------------------------------

    def set_clock(self, nid, offset_s):
        """Node nid's realtime clock runs offset_s (whole seconds) from the true time from
        now on: its libfaketime file, replaced atomically (it is read on every call)."""
        path = self.nodes[nid].clock_file
        if path is None:
            raise RuntimeError("the nodes run without libfaketime (the clock nemesis is off)")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{int(offset_s):+d}\n")
        os.replace(tmp, path)

    def disk_free(self, nid):
        """Bytes free to the broker in node nid's data file system."""
        st = os.statvfs(self.nodes[nid].disk_dir)
        return st.f_bavail * st.f_frsize

    def fill_disk(self, nid):
        """Fills node nid's tmpfs with a ballast file until half of storage.min.free.bytes
        is free. Written beside the data on the tmpfs itself, never through lossyfs, so it
        takes the space at once."""
        node = self.nodes[nid]
        if not node.tmpfs:
            raise RuntimeError("the nodes' data is not on a tmpfs (the disk nemesis is off)")
        path = os.path.join(node.disk_dir, BALLAST)
        before = self.disk_free(nid)
        for _ in range(3):  # the broker may write meanwhile: top up
            free = self.disk_free(nid)
            if free <= self.ballast_leaves:
                break
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, os.fstat(fd).st_size, free - self.ballast_leaves)
            finally:
                os.close(fd)
        return {"free_before": before, "ballast_bytes": os.path.getsize(path), "free_after": self.disk_free(nid)}

    def free_disk(self, nid):
        """Deletes node nid's ballast (if any): the space is back at once."""
        try:
            os.unlink(os.path.join(self.nodes[nid].disk_dir, BALLAST))
        except FileNotFoundError:
            pass

    def power_off(self):
        """Power loss: every node SIGKILLed at the same instant (all signals sent before
        any is waited for), then every node's writes not yet fsynced dropped. Returns
        {node: what lossyfs dropped}."""
        if not self.power:
            raise RuntimeError("the nodes' data is not on lossyfs (the power nemesis is off)")
        running = [n for n in self.nodes.values() if n.proc is not None and n.proc.poll() is None]
        for node in running:
            node.proc.send_signal(signal.SIGKILL)
        for node in running:  # (one that had exited by itself is left for the crash check)
            node.proc.wait(timeout=30)
            node.proc = None
            node.paused = False
        # A canary per node, written and never fsynced: proof that the drop took effect even
        # when the broker had fsynced everything it wrote (log.flush.interval.messages=1).
        canaries = {}
        for node in self.nodes.values():
            path = os.path.join(node.data_dir, POWER_CANARY)
            try:
                with open(path, "wb") as f:
                    f.write(b"\xa5" * CANARY_BYTES)
                canaries[node.id] = path
            except OSError as e:
                self.say(f"node {node.id}: could not write the power canary: {e}")
        dropped = {}
        for node in self.nodes.values():
            try:
                dropped[node.id] = node.lossy.command("drop")
            except (OSError, RuntimeError, ValueError) as e:  # a dead lossyfs: check_storage() reports it
                dropped[node.id] = {"files": 0, "bytes": 0, "error": str(e)}
        for nid, path in canaries.items():
            d = dropped[nid]  # the canary is the harness's, not the broker's: out of the counts
            held = {k: v for k, v in d.get("paths", {}).items() if k and k.endswith(POWER_CANARY)}
            for k, v in held.items():
                del d["paths"][k]
                d["bytes"] -= v
                d["files"] -= 1
            try:
                d["canary_lost"] = bool(held) and os.path.getsize(path) == 0
                os.unlink(path)
            except OSError as e:
                dropped[nid]["canary_lost"] = None
                self.say(f"node {nid}: could not read the power canary: {e}")
        return dropped

    def sync_storage(self):
        """Every lossyfs writes back what it holds (a page cache flushed): {node: files}."""
        return {node.id: node.lossy.command("sync")["files"] for node in self.nodes.values() if node.lossy}

    def check_storage(self):
        """Raises RuntimeError when a lossyfs died (its node would see a dead mount)."""
        for node in self.nodes.values():
            if node.lossy is not None and not node.lossy.alive():
                raise RuntimeError(f"lossyfs of node {node.id} exited ({node.lossy.proc.returncode}); "
                                   f"see {node.lossy.log_path}")

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

    def leaders(self, topic):
        """{partition: leader} as the controller sees it ({} when unknown)."""
        t = self.topic(topic, via=self.controller())
        return {p["partition"]: p["leader"] for p in t["partitions"]} if t else {}

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
