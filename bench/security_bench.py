#!/usr/bin/env python3
"""SASL_SSL against PLAINTEXT, side by side on one node.

One `strom serve` (the release build) with a PLAINTEXT and a SASL_SSL
listener (SCRAM-SHA-512, TLS with the certificates of `strom certs`; rustls
negotiates TLS 1.3 with AES-GCM). Each round produces then consumes
--mb megabytes of 1 KiB records (acks=all, 3 partitions) through one
listener, then the other (the order alternating from round to round), each
on a fresh topic deleted after it; the broker's CPU (utime + stime from
/proc) is read around each phase. Prints the median of --rounds rounds:
throughput of each, SASL_SSL as a share of PLAINTEXT, and broker CPU per GB.

    target/pyenv/bin/python bench/security_bench.py [--rounds 3] [--mb 300]

With --acls, the authorizer is on (the client is a super user for PLAINTEXT
and allowed by 200 prefixed ACLs for SASL_SSL), to show what the checks cost
end to end; `cargo run --release --example acl_bench` gives the cost of one
decision.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))

import kafka_bench as kb  # noqa: E402
from kafka_bench import MB, GB, REPO, harness  # noqa: E402

PASSWORD = "bench-password"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(REPO, "target", "release", "strom"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mb", type=int, default=300, help="payload per phase, MB")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--acls", action="store_true", help="turn the authorizer on")
    ap.add_argument("--only", choices=("PLAINTEXT", "SASL_SSL"),
                    help="run one listener's phases only (to profile the broker under it)")
    args = ap.parse_args()

    directory = tempfile.mkdtemp(prefix="strom-secbench-")
    certs = os.path.join(directory, "certs")
    subprocess.run([args.bin, "certs", "--dir", certs], check=True, capture_output=True)
    settings = [f"ssl.keystore.location={certs}/server.pem", "log.segment.bytes=268435456"]
    if args.acls:
        settings += ["authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                     "super.users=User:ANONYMOUS"]
    cluster = harness.start(directory, 1, settings=settings, binary=args.bin, rust_log="warn",
                            listeners=("SASL_SSL",))
    try:
        node = cluster.node(1)
        status, body = cluster.send(1, "POST", "/v1/users", {"name": "bench", "password": PASSWORD})
        assert status == 201, body
        if args.acls:
            for i in range(200):
                acl = {"principal": "User:bench" if i == 199 else f"User:other-{i}", "resource_type": "topic",
                       "resource_name": "sec-" if i == 199 else f"team-{i}-", "pattern_type": "prefixed",
                       "operation": "all", "permission": "allow"}
                assert cluster.send(1, "POST", "/v1/acls", acl)[0] == 201
        listeners = {
            "PLAINTEXT": (node.listeners["PLAINTEXT"], {}),
            "SASL_SSL": (node.listeners["SASL_SSL"], {
                "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "bench",
                "sasl.password": PASSWORD, "ssl.ca.location": f"{certs}/ca.pem"}),
        }
        n = args.mb * MB // args.size
        rows = {name: [] for name in listeners}
        for r in range(args.rounds):
            # The order alternates round by round (P S, S P, ...) and every
            # topic is deleted after its phase: the page cache a phase fills
            # makes the next phase's writes dearer, which would otherwise be
            # charged to the second listener every time.
            order = [(k, v) for k, v in listeners.items() if args.only in (None, k)]
            if r % 2:
                order.reverse()
            for name, (boot, conf) in order:
                topic = f"sec-{name.lower()}-{r}"
                cluster.create_topic(topic, partitions=args.partitions, rf=1)
                cluster.wait_topic(topic, args.partitions)
                cpu0 = kb.cpu_seconds(node.pid)
                produce_s, _ = kb.produce(boot, topic, args.partitions, n, args.size, "all", 600, conf=conf)
                cpu1 = kb.cpu_seconds(node.pid)
                consume_s, nbytes = kb.consume(boot, topic, args.partitions, n, 600, conf=conf)
                cpu2 = kb.cpu_seconds(node.pid)
                payload = n * args.size
                row = {"produce_mb_s": payload / MB / produce_s, "consume_mb_s": nbytes / MB / consume_s,
                       "cpu_s_per_gb": (cpu2 - cpu0) / (2 * payload / GB),
                       "produce_cpu_s": cpu1 - cpu0, "consume_cpu_s": cpu2 - cpu1}
                rows[name].append(row)
                status, body = cluster.send(1, "DELETE", f"/v1/topics/{topic}")
                assert status in (200, 202, 204), (status, body)
                print(f"round {r + 1} {name:>9}: produce {row['produce_mb_s']:6.0f} MB/s, consume "
                      f"{row['consume_mb_s']:6.0f} MB/s, broker CPU {row['cpu_s_per_gb']:.2f} s per GB in+out",
                      flush=True)
        med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in rows.items() if rs}
        if args.only:
            m = med[args.only]
            print(f"median of {args.rounds} rounds: produce CPU {m['produce_cpu_s']:.2f} s, consume CPU "
                  f"{m['consume_cpu_s']:.2f} s")
            return
        plain, sasl = med["PLAINTEXT"], med["SASL_SSL"]
        print(f"\nmedian of {args.rounds} rounds, {args.mb} MB of {args.size}-byte records per phase, acks=all, "
              f"{args.partitions} partitions{', ACLs on' if args.acls else ''}:")
        for name, m in med.items():
            print(f"  {name:>9}: produce {m['produce_mb_s']:6.0f} MB/s, consume {m['consume_mb_s']:6.0f} MB/s, "
                  f"CPU {m['cpu_s_per_gb']:.2f} s/GB")
        print(f"  SASL_SSL / PLAINTEXT: produce {sasl['produce_mb_s'] / plain['produce_mb_s']:.2f}, consume "
              f"{sasl['consume_mb_s'] / plain['consume_mb_s']:.2f}, CPU per GB "
              f"{sasl['cpu_s_per_gb'] / plain['cpu_s_per_gb']:.2f}x")
    finally:
        cluster.close()


if __name__ == "__main__":
    main()
