#!/usr/bin/env bash
# Shared helpers for the failover demonstrations: narrated steps with
# timestamps, a cluster started with `strom cluster`, admin API reads, and
# cleanup of everything started, also on failure.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# The newer of the release and debug builds, unless STROM names one.
if [ -z "${STROM:-}" ]; then
  STROM=$ROOT/target/release/strom
  if [ ! -x "$STROM" ] || [ "$ROOT/target/debug/strom" -nt "$STROM" ]; then STROM=$ROOT/target/debug/strom; fi
fi
[ -x "$STROM" ] || { echo "build strom first: cargo build --release" >&2; exit 1; }
PYTHON=${PYTHON:-$ROOT/target/pyenv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python3
DEMO_DIR=$(mktemp -d /tmp/strom-demo.XXXXXX)
T0=$(date +%s.%N)
CLUSTER_PID=""

say() { printf '[%7.2fs] %s\n' "$(echo "$(date +%s.%N) - $T0" | bc)" "$*"; }
fail() { say "FAILED: $*"; exit 1; }

cleanup() {
  local rc=$?
  if [ -n "$CLUSTER_PID" ] && kill -0 "$CLUSTER_PID" 2>/dev/null; then
    kill -TERM "$CLUSTER_PID" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$CLUSTER_PID" 2>/dev/null || break; sleep 0.1; done
  fi
  # Nodes restarted by the demo itself are not the supervisor's children.
  if [ -f "$DEMO_DIR/cluster/cluster.json" ]; then
    for pid in $(jq -r '.nodes[].pid' "$DEMO_DIR/cluster/cluster.json") $(cat "$DEMO_DIR"/restarted.pids 2>/dev/null); do
      kill -KILL "$pid" 2>/dev/null || true
    done
  fi
  [ "$rc" -eq 0 ] && rm -rf "$DEMO_DIR" || echo "logs kept in $DEMO_DIR"
  exit "$rc"
}
trap cleanup EXIT INT TERM

free_base() {  # a base port with N free consecutive ports
  # Below the kernel's ephemeral range (32768+ here), so no client
  # connection holds one of them unseen by the probe, which sees listeners only.
  local n=$1 base
  for _ in $(seq 1 50); do
    base=$(( (RANDOM % 20000) + 10000 ))
    local ok=1
    for i in $(seq 0 $((n - 1))); do
      if (exec 3<>/dev/tcp/127.0.0.1/$((base + i))) 2>/dev/null; then ok=0; break; fi
    done
    [ $ok -eq 1 ] && { echo "$base"; return; }
  done
  fail "no free ports"
}

start_cluster() {  # start_cluster N [extra strom cluster args]
  local n=$1; shift
  # One range for all three listeners, so they cannot overlap each other.
  KAFKA_BASE=$(free_base $((3 * n))); ADMIN_BASE=$((KAFKA_BASE + n)); RAFT_BASE=$((KAFKA_BASE + 2 * n))
  "$STROM" cluster --nodes "$n" --dir "$DEMO_DIR/cluster" --kafka-base "$KAFKA_BASE" \
    --admin-base "$ADMIN_BASE" --raft-base "$RAFT_BASE" "$@" > "$DEMO_DIR/cluster.out" 2>&1 &
  CLUSTER_PID=$!
  for _ in $(seq 1 600); do
    [ -f "$DEMO_DIR/cluster/cluster.json" ] && break
    kill -0 "$CLUSTER_PID" 2>/dev/null || fail "strom cluster exited: $(tail -3 "$DEMO_DIR/cluster.out")"
    sleep 0.1
  done
  [ -f "$DEMO_DIR/cluster/cluster.json" ] || fail "cluster did not come up"
  BOOTSTRAP=$(jq -r .bootstrap "$DEMO_DIR/cluster/cluster.json")
}

admin() { echo "127.0.0.1:$((ADMIN_BASE + $1 - 1))"; }
api() { curl -sf --max-time 5 "http://$(admin "$1")$2" "${@:3}"; }
node_pid() { jq -r ".nodes[] | select(.id == $1) | .pid" "$DEMO_DIR/cluster/cluster.json"; }

restart_node() {
  local id=$1
  mapfile -t argv < <(jq -r ".nodes[] | select(.id == $id) | .argv[]" "$DEMO_DIR/cluster/cluster.json")
  "${argv[@]}" >> "$DEMO_DIR/cluster/node-$id.log" 2>&1 &
  echo $! >> "$DEMO_DIR/restarted.pids"
}

# wait_until DESCRIPTION TIMEOUT_S COMMAND...: polls COMMAND until it succeeds.
wait_until() {
  local what=$1 timeout=$2; shift 2
  local deadline; deadline=$(echo "$(date +%s.%N) + $timeout" | bc)
  until "$@" >/dev/null 2>&1; do
    [ "$(echo "$(date +%s.%N) > $deadline" | bc)" -eq 1 ] && fail "timed out waiting for $what"
    sleep 0.05
  done
}
