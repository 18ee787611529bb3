"""franz-go's kgo test suite (unit and integration tests, tests/compat/franz_go.py) against a
3-node cluster: CI runs all of it but its longest group test, TestGroupETL (a minute; the
full run, which writes tests/compat/LEDGER.md, includes it). Its transactional twin,
TestTxnEtl (transactional producers, read_committed consumers in group transact sessions),
is run: 25-35 s on an otherwise idle 2-core machine, adding about 17 s to the run."""
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_franz_go_kgo_suite():
    if shutil.which("go") is None:
        pytest.skip("no go on PATH: franz-go's suite needs a Go toolchain")
    p = subprocess.run([sys.executable, os.path.join(REPO, "tests", "compat", "franz_go.py"), "--skip",
                        "TestGroupETL$"], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, f"franz-go's suite failed:\n{p.stdout[-20000:]}\n{p.stderr[-5000:]}"
    summary = [line for line in p.stdout.splitlines() if line.startswith("== ") and " passed, " in line]
    assert summary and " 0 failed" in summary[-1], p.stdout[-5000:]
