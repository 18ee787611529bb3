#!/usr/bin/env python3
"""rust-rdkafka's own integration tests against a 3-node Strom cluster.

The rdkafka crate, as published on crates.io at the pinned version (its tests/ directory
included), is fetched with cargo and copied into target/compat; its test binaries are
built there once (librdkafka is compiled from the source rdkafka-sys carries). A cluster
of the strom binary is started on loopback ports chosen at runtime, with what the tests
expect of a broker (topic auto-creation and 3 partitions per auto-created topic), and
every test binary runs with KAFKA_HOST pointing at it. Each test's outcome is recorded;
with --ledger the table is written as Markdown (tests/compat/LEDGER-rust-rdkafka.md is
generated so).

Exit status: 0 when no test failed except those listed in KNOWN_FAILURES, 1 otherwise.

    target/pyenv/bin/python tests/compat/rust_rdkafka.py --ledger tests/compat/LEDGER-rust-rdkafka.md
    target/pyenv/bin/python tests/compat/rust_rdkafka.py --only test_admin
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "kafka"))
import harness  # noqa: E402

CRATE = "rdkafka"
VERSION = "0.38.0"
WORK = os.path.join(REPO, "target", "compat")
SOURCE = os.path.join(WORK, f"{CRATE}-{VERSION}")
TARGET = os.path.join(WORK, "rdkafka-target")

# Test binaries (tests/*.rs) not run, and why.
NOT_RUN = {}
# Tests that fail for a reason that is not a Strom defect, and why. The suite is written
# for its own docker set-up: one broker, id 0, at localhost:9092.
BROKER_0 = "assumes a broker with id 0 (rust-rdkafka's docker set-up); Strom's node ids are positive"
KNOWN_FAILURES = {
    "test_admin::test_configs": BROKER_0 + ": DescribeConfigs for broker 0 never leaves librdkafka, which "
                                          "times out",
    "test_admin::test_topics": BROKER_0 + ": a replica assignment to broker 0 is refused with "
                                         "INVALID_REPLICA_ASSIGNMENT, as Kafka refuses one to an unknown broker",
    "test_metadata::test_metadata": BROKER_0 + ", and one broker at port 9092",
    "test_high_producers::test_future_producer_send": "its producer's bootstrap.servers is `localhost` "
                                                      "(port 9092), not KAFKA_HOST: nothing listens there",
    "test_high_producers::test_future_producer_send_fail": "the same producer, bootstrapped at localhost:9092",
    "test_low_producers::test_base_producer_timeout": "expects records to a topic created on first use to "
                                                      "time out after 100 ms; Strom's Metadata answer that "
                                                      "creates the topic already names its leaders (Kafka's "
                                                      "says LEADER_NOT_AVAILABLE first), so they are delivered",
}


def cargo(*args, cwd, env=None):
    return subprocess.run(["cargo", *args], cwd=cwd, env=env, capture_output=True, text=True)


def fetch_source():
    """Copies the published crate (fetched by cargo into its registry) into SOURCE."""
    if os.path.exists(os.path.join(SOURCE, "tests")):
        return
    probe = os.path.join(WORK, "rdkafka-fetch")
    os.makedirs(os.path.join(probe, "src"), exist_ok=True)
    with open(os.path.join(probe, "Cargo.toml"), "w") as f:
        f.write(f'[package]\nname = "rdkafka-fetch"\nversion = "0.0.0"\nedition = "2021"\n\n'
                f'[dependencies]\n{CRATE} = "={VERSION}"\n\n[workspace]\n')
    with open(os.path.join(probe, "src", "lib.rs"), "w") as f:
        f.write("")
    out = cargo("metadata", "--format-version", "1", cwd=probe)
    if out.returncode != 0:
        raise SystemExit(f"cargo metadata failed: {out.stderr[-3000:]}")
    package = next(p for p in json.loads(out.stdout)["packages"] if p["name"] == CRATE and p["version"] == VERSION)
    shutil.copytree(os.path.dirname(package["manifest_path"]), SOURCE)
    # Its own workspace, not Strom's (target/ is inside Strom's).
    with open(os.path.join(SOURCE, "Cargo.toml"), "a") as f:
        f.write("\n[workspace]\n")


def test_files():
    """The names of the suite's test files (tests/*.rs), each a test binary."""
    fetch_source()
    return sorted(f[:-3] for f in os.listdir(os.path.join(SOURCE, "tests")) if f.endswith(".rs"))


def build(names):
    """{test binary name: path} for `names`, building them if needed."""
    env = dict(os.environ, CARGO_TARGET_DIR=TARGET)
    print(f"== building {CRATE} {VERSION}'s tests {', '.join(names)} (once; librdkafka from source)", flush=True)
    targets = [a for n in names for a in ("--test", n)]
    out = cargo("test", *targets, "--no-run", "--message-format", "json", cwd=SOURCE, env=env)
    if out.returncode != 0:
        raise SystemExit(f"building {CRATE}'s tests failed:\n{out.stderr[-5000:]}")
    binaries = {}
    for line in out.stdout.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        target = msg.get("target", {})
        if msg.get("reason") == "compiler-artifact" and msg.get("executable") and "test" in target.get("kind", []):
            binaries[target["name"]] = msg["executable"]
    return binaries


def parse(output, binary):
    """{"binary::test": PASS|FAIL|SKIP} from libtest's output."""
    results = {}
    for line in output.splitlines():
        m = re.match(r"test (\S+) \.\.\. (ok|FAILED|ignored)", line)
        if m:
            results[f"{binary}::{m.group(1)}"] = {"ok": "PASS", "FAILED": "FAIL", "ignored": "SKIP"}[m.group(2)]
    return results


def ledger(results, elapsed, args):
    counts = {k: sum(v == k for v in results.values()) for k in ("PASS", "FAIL", "SKIP")}
    binary = os.path.relpath(args.binary, REPO) if args.binary.startswith(REPO) else args.binary
    lines = [
        "# rust-rdkafka compatibility ledger",
        "",
        f"Generated by `tests/compat/rust_rdkafka.py` on {time.strftime('%Y-%m-%d')}: the `{CRATE}` crate "
        f"{VERSION} (librdkafka from its rdkafka-sys), its integration tests (`tests/*.rs`), against a 3-node "
        f"Strom cluster with `auto.create.topics.enable=true` and `num.partitions=3` (`{binary}`), in "
        f"{elapsed:.0f} s.",
        "",
        f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped by the tests themselves, "
        f"{len(NOT_RUN)} test file(s) not run.",
        "",
    ]
    if NOT_RUN:
        lines += ["Not run:", ""]
        lines += [f"- `tests/{name}.rs`: {why}" for name, why in NOT_RUN.items()]
        lines += [""]
    lines += ["| test | outcome | why |", "|---|---|---|"]
    for name, outcome in sorted(results.items()):
        lines.append(f"| `{name}` | {outcome.lower()} | {KNOWN_FAILURES.get(name, '')} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.environ.get("STROM_BIN", os.path.join(REPO, "target", "debug", "strom")))
    ap.add_argument("--only", action="append", help="run only this test file (repeatable), e.g. test_admin")
    ap.add_argument("--ledger", help="write the Markdown ledger here")
    ap.add_argument("--timeout", type=int, default=600, help="seconds for each test file")
    ap.add_argument("--skip-known", action="store_true", help="do not run the tests in KNOWN_FAILURES")
    args = ap.parse_args()

    files = test_files()
    names = [n for n in files if n not in NOT_RUN and (not args.only or n in args.only)]
    if not names:
        raise SystemExit(f"no test files to run among {files}")
    binaries = build(names)
    chosen = {n: binaries[n] for n in names}
    directory = tempfile.mkdtemp(prefix="strom-rust-rdkafka-")
    c = harness.start(directory, 3, harness.FAST + ("auto.create.topics.enable=true", "num.partitions=3"),
                      binary=args.binary)
    results, outputs, exits = {}, {}, {}
    start = time.monotonic()
    try:
        env = dict(os.environ, KAFKA_HOST=c.bootstrap, RUST_LOG="off", RUST_BACKTRACE="1")
        for name, path in chosen.items():
            print(f"== {name} (KAFKA_HOST={c.bootstrap})", flush=True)
            cmd = [path, "--test-threads", "1"]
            if args.skip_known:
                cmd += ["--exact"] + [a for k in KNOWN_FAILURES if k.startswith(f"{name}::")
                                      for a in ("--skip", k.split("::", 1)[1])]
            p = subprocess.run(cmd, cwd=SOURCE, env=env, capture_output=True, text=True, timeout=args.timeout)
            results.update(parse(p.stdout, name))
            outputs[name], exits[name] = p.stdout + p.stderr, p.returncode
    finally:
        c.close()
    elapsed = time.monotonic() - start
    failed = [n for n, o in results.items() if o == "FAIL" and n not in KNOWN_FAILURES]
    for name, code in exits.items():
        # A binary exits 1 when any of its tests fails, known failures included.
        if code != 0 and not any(n.startswith(f"{name}::") and o == "FAIL" for n, o in results.items()):
            failed.append(f"{name} (the test binary exited {code})")
    for name in failed:
        print(f"FAILED {name}", flush=True)
    for name in {f.split("::")[0].split(" ")[0] for f in failed}:
        print(f"---- output of {name}\n{outputs[name][-15000:]}")
    known = sum(o == "FAIL" for n, o in results.items() if n in KNOWN_FAILURES)
    print(f"== {sum(o == 'PASS' for o in results.values())} passed, {len(failed)} failed "
          f"({known} known failures besides, not Strom's: see KNOWN_FAILURES), "
          f"{sum(o == 'SKIP' for o in results.values())} skipped in {elapsed:.0f} s", flush=True)
    if failed:
        print(f"== the nodes' data and logs are kept in {directory}", flush=True)
    else:
        shutil.rmtree(directory, ignore_errors=True)
    if args.ledger:
        with open(args.ledger, "w") as f:
            f.write(ledger(results, elapsed, args))
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main())
