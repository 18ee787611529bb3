#!/usr/bin/env bash
# The whole test suite: unit tests, openraft's storage suite, and the
# cluster tests in tests/ (real `strom` processes on loopback ports).
# Does its own set-up, so it works on a fresh machine with a Rust toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== building"
cargo build --workspace --all-targets

echo "== cargo test"
# Cluster tests start several processes each; two at a time fit 2 cores.
cargo test --workspace -- --test-threads=2
