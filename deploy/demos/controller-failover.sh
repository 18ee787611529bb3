#!/usr/bin/env bash
# Controller failover: kill the controller (the metadata quorum's leader)
# while topics are being created; show the new controller and that nothing
# acknowledged was forgotten, on the survivors and on the restarted node.
source "$(dirname "$0")/lib.sh"

say "starting a 3-node cluster"
start_cluster 3
CONTROLLER=$(api 1 /v1/cluster | jq -r .controller_id)
say "cluster up; controller is broker $CONTROLLER"
OTHERS=$(for i in 1 2 3; do if [ "$i" != "$CONTROLLER" ]; then echo "$i"; fi; done | tr "\n" " ")

create_topics() {  # creates t-0000.. through any surviving node for $1 seconds; logs the 201s
  local end; end=$(echo "$(date +%s.%N) + $1" | bc) i=0
  while [ "$(echo "$(date +%s.%N) < $end" | bc)" -eq 1 ]; do
    for node in $OTHERS; do
      name=$(printf 't-%04d' "$i")
      code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 8 -X POST "http://$(admin "$node")/v1/topics" \
        -d "{\"name\":\"$name\",\"partitions\":1,\"replication_factor\":1}" || true)
      [ "$code" = 201 ] && echo "$name" >> "$DEMO_DIR/created.txt"
      i=$((i + 1))
      sleep 0.05
    done
  done
}
: > "$DEMO_DIR/created.txt"
create_topics 8 &
CREATOR=$!
say "creating topics through brokers $OTHERS for 8 s"
sleep 2

KILLED_AT=$(date +%s.%N)
kill -9 "$(node_pid "$CONTROLLER")"
say "kill -9 broker $CONTROLLER (the controller); $(wc -l < "$DEMO_DIR/created.txt") topics created so far"
WATCH=${OTHERS%% *}
wait_until "a new controller" 15 json_ok "http://$(admin "$WATCH")/v1/cluster" ".controller_id != null and .controller_id != $CONTROLLER"
NEW=$(api "$WATCH" /v1/cluster | jq -r .controller_id)
say "new controller: broker $NEW, $(echo "$(date +%s.%N) - $KILLED_AT" | bc | xargs printf '%.2f') s after the kill"

wait "$CREATOR"
CREATED=$(wc -l < "$DEMO_DIR/created.txt")
say "$CREATED topic creations acknowledged (HTTP 201)"
for node in $OTHERS; do
  api "$node" /v1/topics | jq -r '.[].name' | sort > "$DEMO_DIR/have-$node.txt"
  missing=$(comm -23 <(sort "$DEMO_DIR/created.txt") "$DEMO_DIR/have-$node.txt" | wc -l)
  [ "$missing" -eq 0 ] || fail "broker $node is missing $missing acknowledged topics"
  say "broker $node has all $CREATED topics"
done

restart_node "$CONTROLLER"
say "restarted broker $CONTROLLER"
wait_until "broker $CONTROLLER to catch up" 30 json_ok "http://$(admin "$CONTROLLER")/v1/topics" "length >= $CREATED"
api "$CONTROLLER" /v1/topics | jq -r '.[].name' | sort > "$DEMO_DIR/have-$CONTROLLER.txt"
missing=$(comm -23 <(sort "$DEMO_DIR/created.txt") "$DEMO_DIR/have-$CONTROLLER.txt" | wc -l)
[ "$missing" -eq 0 ] || fail "the restarted broker is missing $missing topics"
say "broker $CONTROLLER caught up: all $CREATED topics; controller is $(api "$CONTROLLER" /v1/cluster | jq -r .controller_id)"
say "OK: nothing acknowledged was forgotten"
