"""The failover demonstrations in deploy/demos, run as tests: each is self-checking
and exits non-zero on any lost or duplicated acknowledged record."""
import os
import shutil
import subprocess

import pytest

from harness import REPO, strom_bin

DEMOS = os.path.join(REPO, "deploy", "demos")


def run_demo(name, timeout=240):
    env = dict(os.environ, STROM=strom_bin(), PYTHON=os.path.join(REPO, "target", "pyenv", "bin", "python"))
    out = subprocess.run(["bash", os.path.join(DEMOS, name)], capture_output=True, text=True, timeout=timeout, env=env)
    text = out.stdout + out.stderr
    assert out.returncode == 0, f"{name} failed:\n{text}"
    return text


@pytest.mark.skipif(not shutil.which("jq"), reason="the demos need jq")
def test_leader_failover_demo():
    text = run_demo("leader-failover.sh")
    assert "OK: every acknowledged record read back exactly once" in text
    assert "new leader of partition 0" in text and "ISR grown back" in text


@pytest.mark.skipif(not shutil.which("jq"), reason="the demos need jq")
def test_controller_failover_demo():
    text = run_demo("controller-failover.sh")
    assert "OK: nothing acknowledged was forgotten" in text
    assert "new controller: broker" in text


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("jq"),
                    reason="network namespaces need root, iproute2 and jq")
def test_network_partition_demo():
    text = run_demo("network-partition.sh")
    assert "cut-side writes acknowledged while cut off: 0" in text
    assert "truncated a divergent suffix" in text
    assert "OK: nothing acknowledged lost" in text
