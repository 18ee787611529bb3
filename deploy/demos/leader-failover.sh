#!/usr/bin/env bash
# Leader failover with nothing acknowledged lost: 3 nodes, RF=3,
# min.insync.replicas=2, an acks=all producer writing steadily; kill -9 the
# leader of partition 0; watch the new leader, the shrunk ISR, the restart and
# the ISR growing back; then read everything back and count.
source "$(dirname "$0")/lib.sh"

say "starting a 3-node cluster"
start_cluster 3
say "cluster up, bootstrap $BOOTSTRAP"
create_topic "$(admin 1)" orders 3
wait_until "leaders for every partition" 10 json_ok "http://$(admin 1)/v1/topics/orders" "[.partitions[].high_watermark] | all(. != null)"
say "topic orders: 3 partitions, RF 3, min.insync.replicas 2"

"$PYTHON" "$(dirname "$0")/client.py" produce "$BOOTSTRAP" orders 12 2000 "$DEMO_DIR/acked.txt" > "$DEMO_DIR/producer.out" 2>&1 &
PRODUCER=$!
say "producer started: acks=all, idempotent, 2000 records/s for 12 s"
sleep 3

LEADER=$(api 1 /v1/topics/orders | jq -r '.partitions[0].leader')
WATCH=$(( LEADER % 3 + 1 ))
say "partition 0: leader $LEADER, ISR $(api "$WATCH" /v1/topics/orders | jq -c '.partitions[0].isr')"
KILLED_AT=$(date +%s.%N)
kill -9 "$(node_pid "$LEADER")"
say "kill -9 broker $LEADER (the leader of partition 0)"
wait_until "a new leader" 15 json_ok "http://$(admin "$WATCH")/v1/topics/orders" ".partitions[0].leader != $LEADER and .partitions[0].leader != null"
NEW=$(api "$WATCH" /v1/topics/orders | jq -r '.partitions[0].leader')
say "new leader of partition 0: broker $NEW, $(echo "$(date +%s.%N) - $KILLED_AT" | bc | xargs printf '%.2f') s after the kill"
say "ISR now $(api "$WATCH" /v1/topics/orders | jq -c '.partitions[0].isr')"

sleep 2
restart_node "$LEADER"
say "restarted broker $LEADER from its argv in cluster.json"
wait_until "broker $LEADER back in every ISR" 30 json_ok "http://$(admin "$WATCH")/v1/topics/orders" "[.partitions[].isr | index($LEADER)] | all(. != null)"
say "ISR grown back: $(api "$WATCH" /v1/topics/orders | jq -c '[.partitions[].isr]')"

wait "$PRODUCER" || fail "producer failed: $(cat "$DEMO_DIR/producer.out")"
say "$(tail -1 "$DEMO_DIR/producer.out")"
STALL=$(awk -v k="$KILLED_AT" '$2 == 0 && $4 > k {print $4 - k; exit}' "$DEMO_DIR/acked.txt")
say "first acknowledged write to partition 0 after the kill: ${STALL:-none} s"
say "reading everything back"
ok=1
"$PYTHON" "$(dirname "$0")/client.py" verify "$BOOTSTRAP" orders 3 "$DEMO_DIR/acked.txt" > "$DEMO_DIR/verify.out" 2>&1 || ok=0
say "$(tail -1 "$DEMO_DIR/verify.out")"
[ "$ok" = 1 ] || fail "acknowledged records lost or duplicated"
say "OK: every acknowledged record read back exactly once"
