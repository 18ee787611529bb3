#!/usr/bin/env python3
"""Metadata-plane benchmark: runs real `strom serve` processes on loopback and prints
controller failover time (median of 5 SIGKILLs), topic-create latency p50/p99 over
200 creates, idle RSS per node, and the time for a restarted node to catch up with
1,000 topics. Standard library only.

    cargo build --release && python3 bench/metadata.py [--bin target/release/strom]
"""
import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.error
import urllib.request


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def http(method, url, body=None, timeout=10):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read()
            return r.status, json.loads(text) if text else None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")
    except OSError:
        return None, None


class Cluster:
    def __init__(self, binary, n, voters, settings=()):
        self.dir = tempfile.mkdtemp(prefix="strom-bench-")
        ports = free_ports(3 * n)
        self.nodes = {}
        quorum = ",".join(f"{i + 1}@127.0.0.1:{ports[3 * i + 2]}" for i in range(voters))
        for i in range(n):
            nid = i + 1
            argv = [binary, "serve", "--node-id", str(nid), "--data-dir", f"{self.dir}/node-{nid}",
                    "--kafka", f"127.0.0.1:{ports[3 * i]}", "--admin", f"127.0.0.1:{ports[3 * i + 1]}",
                    "--raft", f"127.0.0.1:{ports[3 * i + 2]}", "--quorum", quorum]
            for s in settings:
                argv += ["--set", s]
            self.nodes[nid] = {"argv": argv, "admin": f"http://127.0.0.1:{ports[3 * i + 1]}", "proc": None}
        for nid in self.nodes:
            self.launch(nid)

    def launch(self, nid):
        log = open(f"{self.dir}/node-{nid}.log", "ab")
        env = dict(os.environ, RUST_LOG="warn")
        self.nodes[nid]["proc"] = subprocess.Popen(self.nodes[nid]["argv"], stdout=log, stderr=log, env=env)

    def kill(self, nid):
        p = self.nodes[nid]["proc"]
        p.send_signal(signal.SIGKILL)
        p.wait()
        self.nodes[nid]["proc"] = None

    def running(self):
        return [n for n, v in self.nodes.items() if v["proc"] is not None]

    def view(self, nid):
        return http("GET", self.nodes[nid]["admin"] + "/v1/cluster", timeout=2)[1]

    def wait(self, what, pred, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            v = pred()
            if v:
                return v
            time.sleep(0.01)
        raise SystemExit(f"timed out waiting for {what}")

    def wait_active(self, n):
        def ok():
            ids = set()
            for nid in self.running():
                v = self.view(nid)
                if not v or v["controller_id"] is None:
                    return None
                if sum(b["state"] == "active" for b in v["brokers"]) != n:
                    return None
                ids.add(v["controller_id"])
            return ids.pop() if len(ids) == 1 else None
        return self.wait(f"{n} active brokers", ok)

    def stop(self):
        for v in self.nodes.values():
            if v["proc"]:
                v["proc"].send_signal(signal.SIGKILL)
                v["proc"].wait()


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def failover(c):
    times = []
    for _ in range(5):
        old = c.wait_active(3)
        other = next(n for n in c.nodes if n != old)
        t = time.perf_counter()
        c.kill(old)
        def new_controller():
            v = c.view(other)
            return v and v["controller_id"] not in (None, old)
        c.wait("new controller", new_controller)
        times.append((time.perf_counter() - t) * 1000)
        c.launch(old)
    print(f"controller failover after SIGKILL (5 runs): median {statistics.median(times):.0f} ms, "
          f"all {[round(x) for x in times]}")




def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/strom")
    ap.add_argument("--only-failover", action="store_true")
    args = ap.parse_args()
    binary = os.path.abspath(args.bin)

    c = Cluster(binary, 3, 3)
    try:
        c.wait_active(3)
        time.sleep(2)
        rss = [rss_mb(c.nodes[n]["proc"].pid) for n in c.nodes]
        print(f"idle RSS per node: {', '.join(f'{r:.1f} MB' for r in rss)}")

        if args.only_failover:
            return failover(c)
        lat = []
        for i in range(200):
            t = time.perf_counter()
            st, body = http("POST", c.nodes[1 + i % 3]["admin"] + "/v1/topics",
                            {"name": f"lat-{i}", "partitions": 1, "replication_factor": 3})
            lat.append((time.perf_counter() - t) * 1000)
            assert st == 201, (st, body)
        print(f"topic create latency over 200 (RF=3, any node): p50 {pct(lat, 50):.1f} ms, p99 {pct(lat, 99):.1f} ms")

        failover(c)

        c.wait_active(3)
        c.wait_active(3)
        victim = next(n for n in c.nodes if n != c.wait_active(3))
        c.kill(victim)
        writer = next(n for n in c.running())
        for i in range(1000):
            st, body = http("POST", c.nodes[writer]["admin"] + "/v1/topics",
                            {"name": f"catch-{i}", "partitions": 1, "replication_factor": 1})
            assert st == 201, (st, body)
        t = time.perf_counter()
        c.launch(victim)
        def caught_up():
            st, topics = http("GET", c.nodes[victim]["admin"] + "/v1/topics", timeout=2)
            return st == 200 and len(topics) >= 1200
        c.wait("catch-up", caught_up, timeout=120)
        print(f"restarted node caught up with 1,200 topics (1,000 created while down) in "
              f"{(time.perf_counter() - t) * 1000:.0f} ms (from process start)")
        rss = [rss_mb(c.nodes[n]["proc"].pid) for n in c.nodes]
        print(f"RSS per node with 1,200 topics: {', '.join(f'{r:.1f} MB' for r in rss)}")
    finally:
        c.stop()


if __name__ == "__main__":
    main()
