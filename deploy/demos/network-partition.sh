#!/usr/bin/env bash
# Network partition (root; Linux network namespaces and veth): cut the leader
# of a partition off from the other two while a client on its side keeps
# writing with acks=all. Those writes are not acknowledged; the majority side
# elects a new leader and goes on; after healing, the old leader truncates its
# divergent suffix and rejoins. Every node runs in its own namespace; traffic
# goes only to the addresses of the namespaces this script creates.
source "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || fail "needs root (network namespaces)"
command -v ip >/dev/null || fail "needs iproute2 (ip)"
NETNS="$(dirname "$0")/netns.sh"
# A tag whose subnet no interface uses yet (netns.sh refuses one in use).
for try in 0 1 2 3 4 5 6 7 8 9; do
  TAG=p$$$try
  SUBNET=$("$NETNS" up "$TAG" 3 2>/dev/null) && break
  SUBNET=
done
[ -n "$SUBNET" ] || fail "no free subnet for the namespaces"
PIDS=()
on_exit() {
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  "$NETNS" down "$TAG" 3
}
# Then lib.sh's cleanup, with this script's exit status.
trap 'rc=$?; on_exit; (exit $rc); cleanup' EXIT INT TERM

host() { echo "$SUBNET.$1"; }
napi() { curl -sf --max-time 3 "http://$(host "$1"):9644$2" "${@:3}"; }
QUORUM="1@$(host 1):9093,2@$(host 2):9093,3@$(host 3):9093"
for i in 1 2 3; do
  ip netns exec "strom-$TAG-$i" "$STROM" serve --node-id "$i" --data-dir "$DEMO_DIR/node-$i" \
    --kafka "$(host "$i"):9092" --admin "$(host "$i"):9644" --raft "$(host "$i"):9093" --quorum "$QUORUM" \
    > "$DEMO_DIR/node-$i.log" 2>&1 &
  PIDS+=($!)
done
say "3 nodes started, each in its own network namespace ($SUBNET.1-3)"
wait_until "3 active brokers" 30 json_ok "http://$(host 1):9644/v1/cluster" "[.brokers[] | select(.state == \"active\")] | length == 3"
ALL="$(host 1):9092,$(host 2):9092,$(host 3):9092"
create_topic "$(host 1):9644" ledger 1
wait_until "a leader" 10 json_ok "http://$(host 1):9644/v1/topics/ledger" ".partitions[0].high_watermark != null"
LEADER=$(napi 1 /v1/topics/ledger | jq -r '.partitions[0].leader')
OTHER=$(( LEADER % 3 + 1 ))
say "topic ledger: RF 3, min.insync.replicas 2; leader is broker $LEADER"

ip netns exec "strom-$TAG-$LEADER" "$PYTHON" "$(dirname "$0")/client.py" produce "$(host "$LEADER"):9092" ledger 12 500 \
  "$DEMO_DIR/acked-cut-side.txt" cut- > "$DEMO_DIR/producer-cut-side.out" 2>&1 &
CUT_PRODUCER=$!
say "a client inside broker $LEADER's namespace writes with acks=all (500 records/s for 12 s)"
# Cut only once it is writing (its start, imports included, can take seconds on a busy machine).
wait_until "the client's first 200 records" 30 json_ok "http://$(host "$LEADER"):9644/v1/topics/ledger" ".partitions[0].high_watermark >= 200"
CUT_AT=$(date +%s.%N)
"$NETNS" cut "$TAG" "$LEADER"
say "network cut: broker $LEADER (leader) can reach no other broker"
wait_until "a new leader on the majority side" 20 json_ok "http://$(host "$OTHER"):9644/v1/topics/ledger" ".partitions[0].leader != null and .partitions[0].leader != $LEADER"
NEW=$(napi "$OTHER" /v1/topics/ledger | jq -r '.partitions[0].leader')
say "majority side: broker $NEW leads, $(echo "$(date +%s.%N) - $CUT_AT" | bc | xargs printf '%.2f') s after the cut; ISR $(napi "$OTHER" /v1/topics/ledger | jq -c '.partitions[0].isr')"
MAJORITY="$(host "$NEW"):9092"
"$PYTHON" "$(dirname "$0")/client.py" produce "$MAJORITY" ledger 4 500 "$DEMO_DIR/acked-majority.txt" majority- > "$DEMO_DIR/producer-majority.out" 2>&1 \
  || fail "majority-side producer: $(tail -2 "$DEMO_DIR/producer-majority.out")"
say "majority side: $(tail -1 "$DEMO_DIR/producer-majority.out")"
sleep 3
# Whether the old leader has a divergent suffix: records it appended past the log end the
# new leader was elected with. It has none when every request it appended before the cut had
# reached the majority and its client, with its in-flight limit (5) used up by requests
# waiting for acks=all, sent no more: then there is nothing to truncate.
OLD_END=$(ip netns exec "strom-$TAG-$LEADER" curl -sf --max-time 3 "http://$(host "$LEADER"):9644/v1/topics/ledger" \
  | jq -r '.partitions[0].log_end_offset // empty' || true)
NEW_START=$(grep -o "became leader topic=ledger partition=0 leader_epoch=[0-9]* high_watermark=[0-9]* log_end_offset=[0-9]*" \
  "$DEMO_DIR/node-$NEW.log" | tail -1 | sed 's/.*log_end_offset=//')
say "broker $LEADER's log ends at ${OLD_END:-?}; broker $NEW's epoch began at ${NEW_START:-?}"
HEAL_AT=$(date +%s.%N)
"$NETNS" heal "$TAG" "$LEADER"
say "network healed"
wait_until "broker $LEADER back in the ISR" 60 json_ok "http://$(host "$OTHER"):9644/v1/topics/ledger" ".partitions[0].isr | index($LEADER) != null"
say "broker $LEADER rejoined: ISR $(napi "$OTHER" /v1/topics/ledger | jq -c '.partitions[0].isr')"
if [ -n "$OLD_END" ] && [ -n "$NEW_START" ] && [ "$OLD_END" -le "$NEW_START" ]; then
  grep -q "truncated a divergent suffix" "$DEMO_DIR/node-$LEADER.log" && fail "the old leader truncated a log that had not diverged"
  say "old leader's log: nothing past offset $NEW_START, where the new leader's epoch began: nothing to truncate"
else
  grep -q "truncated a divergent suffix" "$DEMO_DIR/node-$LEADER.log" || fail "the old leader did not truncate"
  say "old leader's log: $(grep -o 'truncated a divergent suffix.*' "$DEMO_DIR/node-$LEADER.log" | head -1)"
fi

wait "$CUT_PRODUCER" || true
say "cut-side client: $(tail -1 "$DEMO_DIR/producer-cut-side.out")"
LATE=$(awk -v a="$CUT_AT" -v b="$HEAL_AT" '$4 > a + 1 && $4 < b' "$DEMO_DIR/acked-cut-side.txt" | wc -l)
say "cut-side writes acknowledged while cut off: $LATE"
[ "$LATE" -eq 0 ] || fail "writes were acknowledged by a leader cut off from its ISR"
cat "$DEMO_DIR/acked-cut-side.txt" "$DEMO_DIR/acked-majority.txt" > "$DEMO_DIR/acked.txt"
ok=1
"$PYTHON" "$(dirname "$0")/client.py" verify "$ALL" ledger 1 "$DEMO_DIR/acked.txt" > "$DEMO_DIR/verify.out" 2>&1 || ok=0
say "$(tail -1 "$DEMO_DIR/verify.out")"
[ "$ok" = 1 ] || fail "acknowledged records lost or duplicated"
say "OK: nothing acknowledged lost; nothing acknowledged while cut off; the old leader truncated what had diverged and rejoined"
