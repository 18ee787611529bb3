"""Fixtures for the Kafka client tests: real `strom serve` clusters on loopback.

- `make_cluster(n=1, settings=(), voters=None)`: starts an n-node cluster in a fresh
  tmp dir, waits until every node is ready, sees one controller and n active brokers,
  and answers ApiVersions on its Kafka port; returns a harness.Cluster
  (bootstrap, nodes[id].kafka/.admin, kill(id), launch(id), create_topic, topic, ...).
  Every process it started is SIGKILLed at teardown, also when the test fails.
- `cluster` / `cluster3`: a 1-node / 3-node cluster shared by a test module.
- `kcat`: path of kcat (or kafkacat); the test is skipped, saying why, when missing.

On a failed test, the tail of every node's log of the clusters it used is attached to
the report ("strom node logs" section).
"""
import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import harness  # noqa: E402

# The clusters make_cluster started for each test, so that failures can attach their logs.
_CLUSTERS_OF_ITEM = {}


def _start(tmp_path_factory, n, settings=(), voters=None, node_settings=None, listeners=(), rust_log=None):
    return harness.start(tmp_path_factory.mktemp("strom"), n, settings, voters, node_settings=node_settings,
                         listeners=listeners, rust_log=rust_log)


@pytest.fixture
def make_cluster(tmp_path_factory, request):
    started = []
    _CLUSTERS_OF_ITEM.setdefault(request.node.nodeid, []).append(started)

    def make(n=1, settings=(), voters=None, node_settings=None, listeners=(), rust_log=None):
        """node_settings: {node id: ("key=value", ...)} on top of settings; listeners: extra
        Kafka listener names (see harness.Cluster); rust_log: the nodes' RUST_LOG, when not
        the default (STROM_TEST_RUST_LOG, else info)."""
        c = _start(tmp_path_factory, n, settings, voters, node_settings, listeners, rust_log)
        started.append(c)
        return c

    yield make
    for c in started:
        c.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = _start(tmp_path_factory, 1, harness.FAST)
    yield c
    c.close()


@pytest.fixture(scope="module")
def cluster3(tmp_path_factory):
    c = _start(tmp_path_factory, 3, harness.FAST)
    yield c
    c.close()


@pytest.fixture(scope="session")
def kcat():
    path = shutil.which("kcat") or shutil.which("kafkacat")
    if path is None:
        pytest.skip("kcat is not installed (tests/setup_python.sh installs it with apt-get when run as root)")
    return path


def _clusters_for(item):
    found = []
    for value in getattr(item, "funcargs", {}).values():
        if isinstance(value, harness.Cluster):
            found.append(value)
    for started in _CLUSTERS_OF_ITEM.get(item.nodeid, []):
        found.extend(started)
    seen = set()
    return [c for c in found if not (id(c) in seen or seen.add(id(c)))]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for c in _clusters_for(item):
            report.sections.append((f"strom node logs ({c.dir})", c.log_tails()))
    if report.when == "teardown":
        _CLUSTERS_OF_ITEM.pop(item.nodeid, None)
