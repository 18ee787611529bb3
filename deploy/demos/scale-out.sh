#!/usr/bin/env bash
# Scale out: 3 nodes, a topic of 12 partitions with RF 3, an acks=all producer
# writing steadily; add nodes 4 and 5 to the running cluster and watch the
# balancer give them their share of replicas and leaderships, as partition
# moves under load; then read everything back and count.
source "$(dirname "$0")/lib.sh"
TOPIC=orders PARTITIONS=12

say "starting a 3-node cluster"
start_cluster 3 --set broker.heartbeat.interval.ms=200 --set broker.session.timeout.ms=1500
say "cluster up, bootstrap $BOOTSTRAP; controller is broker $(controller 1)"
topic_under_load
say "replicas and leaders per broker:"
broker_table 1
api 1 /v1/topics/$TOPIC | jq -c '[.partitions[] | {p: .partition, r: .replicas}]' > "$DEMO_DIR/before.json"

brokers_active() {  # brokers_active N: the controller sees N active brokers
  local c; c=$(controller 1); [ -n "$c" ] || return 1
  api "$c" /v1/brokers | jq -e "[.[] | select(.state == \"active\")] | length == $1"
}
ADDED_AT=$(date +%s.%N)
add_node 4
add_node 5
say "started nodes 4 and 5 with the cluster's --quorum and settings (strom serve --node-id 4|5 ...)"
wait_until "brokers 4 and 5 active" 30 brokers_active 5
say "brokers 4 and 5 registered and active, $(echo "$(date +%s.%N) - $ADDED_AT" | bc | xargs printf '%.2f') s after start; quorum observers $(api 1 /v1/quorum | jq -c '[.observers[].id]')"
say "the balancer is moving replicas and leaderships onto them"
wait_until "the balancer to spread replicas and leaders over 5 brokers" 90 balanced 1 5
say "balanced $(echo "$(date +%s.%N) - $ADDED_AT" | bc | xargs printf '%.2f') s after adding the nodes: replicas and leaders per broker:"
broker_table "$(controller 1)"
api 1 /v1/topics/$TOPIC | jq -e '[.partitions[] | (.replicas | length) == 3 and (.isr | sort) == (.replicas | sort)] | all' >/dev/null \
  || fail "a partition is not at full RF with every replica in sync"
MOVED=$(api 1 /v1/topics/$TOPIC | jq --slurpfile before "$DEMO_DIR/before.json" \
  '[.partitions[] as $p | $before[0][] | select(.p == $p.partition) | ($p.replicas - .r) | length] | add')
say "$MOVED replicas moved, $(api 1 /v1/topics/$TOPIC | jq '[.partitions[].replicas[] | select(. >= 4)] | length') of them now on brokers 4 and 5; every partition at RF 3 with ISR = replicas"
say "strom balancer status (on the controller):"
strom_cli "$(controller 1)" balancer status | sed 's/^/            /'

sleep 2
stop_producer 5
verify_acked "$TOPIC" "$PARTITIONS"
say "OK: scaled out from 3 to 5 brokers under load, balanced, every acknowledged record read back exactly once"
