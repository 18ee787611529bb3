#!/usr/bin/env bash
# The whole test suite: unit tests, openraft's storage suite, the cluster
# tests in tests/ (real `strom` processes on loopback ports), and the Kafka
# client tests in tests/kafka (confluent-kafka, kafka-python, kcat and the
# reference Java client against real `strom` processes; tests/setup_python.sh
# and tests/setup_jvm.sh install them).
# Does its own set-up, so it works on a fresh machine with a Rust toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== building"
cargo build --workspace --all-targets

echo "== cargo test"
# Cluster tests start several processes each; two at a time fit 2 cores.
cargo test --workspace -- --test-threads=2

echo "== Kafka client tests (confluent-kafka, kafka-python, kcat, the Java client)"
tests/setup_python.sh
tests/setup_jvm.sh
# pytest exits 5 when it collected no test: that is a failure here, not a pass.
rc=0
STROM_BIN="${STROM_BIN:-$PWD/target/debug/strom}" target/pyenv/bin/python -m pytest tests/kafka tests/chaos -v --durations=40 || rc=$?
if [ "$rc" = 5 ]; then
  echo "pytest collected no Kafka client tests" >&2
  exit 1
fi
exit "$rc"
