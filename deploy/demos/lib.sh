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
# fail REASON: says why and what each node logged last (on stderr), then exits;
# cleanup keeps the logs.
fail() {
  say "FAILED: $*"
  local f
  while IFS= read -r f; do
    echo "--- the last lines of ${f#"$DEMO_DIR"/}" >&2
    tail -n 20 "$f" >&2
  done < <(find "$DEMO_DIR" -maxdepth 3 -name '*.log' 2>/dev/null | sort)
  exit 1
}

# create_topic ADMIN NAME PARTITIONS: RF 3, min.insync.replicas 2, through the
# admin API at ADMIN (host:port) with the operator's CLI, which says why if the
# API refuses.
create_topic() {
  "$STROM" topic create --admin-url "http://$1" "$2" --partitions "$3" --replication-factor 3 \
    --config min.insync.replicas=2 > /dev/null || fail "could not create topic $2"
}

BACKGROUND_PIDS=()  # helpers the demo started (producers, ...): stopped on exit

cleanup() {
  local rc=$?
  for pid in ${BACKGROUND_PIDS[@]+"${BACKGROUND_PIDS[@]}"}; do
    kill -KILL "$pid" 2>/dev/null && { wait "$pid" 2>/dev/null || true; }
  done
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

# Nodes a demo added to the running cluster (add_node), one line each: ID PID KAFKA ADMIN RAFT.
ADDED_NODES=$DEMO_DIR/added-nodes
added() { [ -f "$ADDED_NODES" ] && awk -v id="$1" -v col="$2" '$1 == id {v = $col} END {if (v != "") print v}' "$ADDED_NODES" || true; }

admin() { local a; a=$(added "$1" 4); echo "${a:-127.0.0.1:$((ADMIN_BASE + $1 - 1))}"; }
api() { curl -sf --max-time 5 "http://$(admin "$1")$2" "${@:3}"; }
node_pid() { local p; p=$(added "$1" 2); [ -n "$p" ] && echo "$p" || jq -r ".nodes[] | select(.id == $1) | .pid" "$DEMO_DIR/cluster/cluster.json"; }
# strom_cli NODE ARGS...: the operator's CLI, pointed at NODE's admin API.
strom_cli() { local node=$1; shift; STROM_ADMIN="http://$(admin "$node")" "$STROM" "$@"; }

restart_node() {
  local id=$1
  if [ -f "$DEMO_DIR/cluster/node-$id.argv" ]; then
    mapfile -t argv < "$DEMO_DIR/cluster/node-$id.argv"
  else
    mapfile -t argv < <(jq -r ".nodes[] | select(.id == $id) | .argv[]" "$DEMO_DIR/cluster/cluster.json")
  fi
  "${argv[@]}" >> "$DEMO_DIR/cluster/node-$id.log" 2>&1 &
  echo $! >> "$DEMO_DIR/restarted.pids"
}

# json_ok URL FILTER: true when URL answers with JSON on which the jq FILTER
# holds. (Not `curl | jq -e`: jq 1.6 exits 0 on no input, so a node not yet
# listening would pass.)
json_ok() {
  local body
  body=$(curl -sf --max-time 3 "$1") && [ -n "$body" ] && jq -e "$2" <<< "$body" > /dev/null
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

# add_node ID: starts a new node that joins the running cluster: node 1's argv
# from cluster.json (the same --quorum and --set pairs) with its own id, data
# directory and free ports. It joins the quorum as an observer and registers
# as a broker; admin, api, node_pid and restart_node work for it, and cleanup
# stops it.
add_node() {
  local id=$1 base prev="" a
  base=$(free_base 3)
  mapfile -t argv < <(jq -r '.nodes[] | select(.id == 1) | .argv[]' "$DEMO_DIR/cluster/cluster.json")
  local new=()
  for a in "${argv[@]}"; do
    case $prev in
      --node-id) new+=("$id") ;;
      --data-dir) new+=("$DEMO_DIR/cluster/node-$id") ;;
      --kafka) new+=("127.0.0.1:$base") ;;
      --admin) new+=("127.0.0.1:$((base + 1))") ;;
      --raft) new+=("127.0.0.1:$((base + 2))") ;;
      *) new+=("$a") ;;
    esac
    prev=$a
  done
  printf '%s\n' "${new[@]}" > "$DEMO_DIR/cluster/node-$id.argv"
  "${new[@]}" >> "$DEMO_DIR/cluster/node-$id.log" 2>&1 &
  echo $! >> "$DEMO_DIR/restarted.pids"
  echo "$id $! 127.0.0.1:$base 127.0.0.1:$((base + 1)) 127.0.0.1:$((base + 2))" >> "$ADDED_NODES"
  disown "$!"  # cleanup kills it; no job report for that
}

# start_producer SECONDS RATE TOPIC: the demo's idempotent acks=all producer, in
# the background, writing acknowledged records to $DEMO_DIR/acked.txt; it runs
# until stop_producer (or SECONDS, a cap).
# topic_under_load: creates $TOPIC ($PARTITIONS partitions, RF 3,
# min.insync.replicas 2), waits for its leaders, and starts the demo's producer
# (acks=all, idempotent, 500 records/s) for a couple of seconds of load first.
topic_under_load() {
  create_topic "$(admin 1)" "$TOPIC" "$PARTITIONS"
  wait_until "leaders for every partition" 10 json_ok "http://$(admin 1)/v1/topics/$TOPIC" "[.partitions[].high_watermark] | all(. != null)"
  say "topic $TOPIC: $PARTITIONS partitions, RF 3, min.insync.replicas 2"
  start_producer 300 500 "$TOPIC"
  say "producer started: acks=all, idempotent, 500 records/s until the end"
  sleep 2
}

start_producer() {
  "$PYTHON" "$(dirname "${BASH_SOURCE[0]}")/client.py" produce "$BOOTSTRAP" "$3" "$1" "$2" "$DEMO_DIR/acked.txt" \
    > "$DEMO_DIR/producer.out" 2>&1 &
  PRODUCER=$!
  BACKGROUND_PIDS+=("$PRODUCER")
}

# stop_producer MAX_PAUSE_S: SIGTERM (the client stops producing, flushes and
# writes what was acknowledged). The demo's producer is expected to have every
# record it produced acknowledged, with no pause between acknowledgements
# longer than MAX_PAUSE_S seconds; verify_acked fails if not.
stop_producer() {
  kill -TERM "$PRODUCER" 2>/dev/null || true
  wait "$PRODUCER" || fail "producer failed: $(tail -3 "$DEMO_DIR/producer.out")"
  local line pause part
  line=$(grep '^produced ' "$DEMO_DIR/producer.out" | tail -1)
  # The longest time one partition went without an acknowledged write.
  read -r pause part < <(sort -k2,2n -k4,4n "$DEMO_DIR/acked.txt" \
    | awk 'NR > 1 && $2 == p && $4 - t > g {g = $4 - t; gp = p} {p = $2; t = $4} END {printf "%.2f %s\n", g, gp}')
  say "producer: $line"
  say "longest pause between acknowledged writes to one partition: $pause s (partition $part)"
  PRODUCER_PROBLEM=""
  [[ $line == *"not acknowledged 0" ]] || PRODUCER_PROBLEM="records not acknowledged: $line"
  [ "$(echo "$pause > $1" | bc)" -eq 0 ] || PRODUCER_PROBLEM="${PRODUCER_PROBLEM:+$PRODUCER_PROBLEM; }acknowledged writes paused for $pause s (more than $1 s)"
}

# verify_acked TOPIC PARTITIONS: reads everything back; fails unless every
# acknowledged record is there exactly once, at its offset, in order (and on
# what stop_producer found).
verify_acked() {
  say "reading everything back"
  local ok=1
  "$PYTHON" "$(dirname "${BASH_SOURCE[0]}")/client.py" verify "$BOOTSTRAP" "$1" "$2" "$DEMO_DIR/acked.txt" \
    > "$DEMO_DIR/verify.out" 2>&1 || ok=0
  say "$(tail -1 "$DEMO_DIR/verify.out")"
  [ "$ok" = 1 ] || fail "acknowledged records lost or duplicated"
  [ -z "${PRODUCER_PROBLEM:-}" ] || fail "producer: $PRODUCER_PROBLEM"
}

# controller NODE: the controller's id, as NODE sees it.
controller() { api "$1" /v1/cluster | jq -r '.controller_id // empty'; }

# broker_table NODE: replicas and leaders per broker, as NODE sees them.
broker_table() {
  api "$1" /v1/brokers | jq -r '(["BROKER", "STATE", "REPLICAS", "LEADERS"] | @tsv),
    (.[] | [.id, .state, .replicas, .leaders] | @tsv)' | awk -F'\t' '{printf "            %-7s %-8s %-9s %s\n", $1, $2, $3, $4}'
}

# balanced NODE COUNT: the controller (found through NODE) sees COUNT active
# brokers, their replica counts and leader counts each within one of each
# other, no partition moving and an empty balancer plan.
balanced() {
  local c; c=$(controller "$1"); [ -n "$c" ] || return 1
  api "$c" /v1/brokers | jq -e "[.[] | select(.state == \"active\")] as \$b
    | (\$b | length) == $2
    and ([\$b[].replicas] | max) - ([\$b[].replicas] | min) <= 1
    and ([\$b[].leaders] | max) - ([\$b[].leaders] | min) <= 1" >/dev/null || return 1
  quiet "$c"
}

# quiet NODE: on the controller (found through NODE), no partition moving and
# an empty balancer plan.
quiet() {
  local c; c=$(controller "$1"); [ -n "$c" ] || return 1
  api "$c" /v1/reassignments | jq -e 'length == 0' >/dev/null || return 1
  api "$c" /v1/balancer | jq -e '.moves | length == 0' >/dev/null
}
