"""The fault harness (tests/chaos) in the suite: a fixed-seed mixed kill/pause/partition run
that must find no anomaly, and the early-ack negative control, which must find lost
records. Both need root (network namespaces, nftables); skipped with the reason otherwise.
"""
import json
import os
import subprocess
import sys

import pytest

from harness import REPO, strom_bin

RUN = os.path.join(REPO, "tests", "chaos", "run.py")


def chaos(*args, timeout=280):
    env = dict(os.environ, STROM_BIN=strom_bin())
    return subprocess.run([sys.executable, RUN, *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def chaos_env():
    if os.geteuid() != 0:
        pytest.skip("the fault harness needs root (network namespaces, nftables, tc)")
    out = chaos("--check-env", timeout=400)
    if out.returncode != 0:
        pytest.skip(f"the fault harness cannot run here: {(out.stderr or out.stdout).strip()[-300:]}")


def test_schedule_is_a_pure_function_of_the_seed():
    a = chaos("--print-schedule", "--seed", "11", "--minutes", "2", "--nemesis", "kill,pause,partition")
    b = chaos("--print-schedule", "--seed", "11", "--minutes", "2", "--nemesis", "partition,kill,pause")
    c = chaos("--print-schedule", "--seed", "12", "--minutes", "2", "--nemesis", "kill,pause,partition")
    assert a.returncode == b.returncode == c.returncode == 0, a.stderr + b.stderr + c.stderr
    assert a.stdout == b.stdout and a.stdout != c.stdout
    assert "partition" in a.stdout and "kill" in a.stdout and "pause" in a.stdout


@pytest.mark.parametrize("args,why", [
    (["--nemesis", "clock"], "not implemented yet"),
    (["--nemesis", "bogus"], "unknown nemesis"),
    (["--workload", "groups"], "not implemented yet"),
    (["--negative-control", "power-loss-no-flush"], "not implemented yet"),
])
def test_usage_errors_exit_2(args, why):
    out = chaos(*args, "--report", "/nonexistent/never-made")
    assert out.returncode == 2 and why in out.stderr, out.stderr


def run_report(tmp_path, name, *args):
    """A run writing its report under tmp_path/name: (exit code, output, report.json)."""
    report = tmp_path / name
    out = chaos(*args, "--report", str(report))
    text = out.stdout + out.stderr
    path = report / "report.json"
    return out.returncode, text, json.loads(path.read_text()) if path.exists() else None


def test_mixed_faults_fixed_seed_no_anomaly(chaos_env, tmp_path):
    code, text, r = run_report(tmp_path, "mixed", "--seed", "1", "--minutes", "1.5", "--nemesis",
                               "kill,pause,partition", "--nodes", "5")
    assert code == 0, f"chaos run found anomalies or failed (exit {code}):\n{text[-6000:]}"
    assert r["seed"] == 1 and r["valid"] and r["schedule"] and r["acked"] > 1000
    assert all(not v for v in r["anomalies"].values())
    assert set(r["unavailable_s"]) <= {"kill", "pause", "partition"}
    assert (tmp_path / "mixed" / "timeline.png").stat().st_size > 10000
    assert "VALID: no anomaly" in text


def test_early_ack_negative_control_loses_records(chaos_env, tmp_path):
    code, text, r = run_report(tmp_path, "early-ack", "--seed", "3", "--minutes", "0.75", "--nemesis",
                               "kill,partition", "--negative-control", "early-ack")
    assert code == 1, f"early-ack must lose acknowledged records (exit {code}):\n{text[-6000:]}"
    assert r["anomalies"]["lost"], r["anomaly_counts"]
    assert "ANOMALY lost" in text
