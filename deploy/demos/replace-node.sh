#!/usr/bin/env bash
# Replacing a dead node: 4 nodes, a topic of 12 partitions with RF 3, an
# acks=all producer writing steadily; kill -9 a broker for good. It is fenced
# within the session timeout; once it has been away for
# balancer.node.unavailable.timeout.ms (shortened to 5 s here, 15 minutes by
# default) the controller re-creates its replicas on the live brokers, which
# restores every partition's replication factor; leaderships go back to the
# preferred replicas the balancer evened out (leader.imbalance.check.interval.seconds,
# 5 s here, 300 by default). Then the operator takes the
# dead node out of the metadata quorum, promotes node 4 in its place and
# unregisters the dead broker; and everything acknowledged is read back.
source "$(dirname "$0")/lib.sh"
TOPIC=orders PARTITIONS=12 UNAVAILABLE_MS=5000

say "starting a 4-node cluster (voters 1-3, node 4 an observer), balancer.node.unavailable.timeout.ms=$UNAVAILABLE_MS"
start_cluster 4 --set broker.heartbeat.interval.ms=200 --set broker.session.timeout.ms=1500 \
  --set balancer.node.unavailable.timeout.ms=$UNAVAILABLE_MS --set leader.imbalance.check.interval.seconds=5
CONTROLLER=$(controller 1)
say "cluster up, bootstrap $BOOTSTRAP; controller is broker $CONTROLLER; quorum voters $(api 1 /v1/quorum | jq -c '[.voters[].id]')"
topic_under_load
say "replicas and leaders per broker:"
broker_table "$CONTROLLER"

# The victim: a voter that is not the controller (so the controller that
# times its absence stays the same one), and a leader of some partitions.
CONTROLLER=$(controller 1)
DEAD=3; [ "$CONTROLLER" != 3 ] || DEAD=2
WATCH=$CONTROLLER
REPLICAS=$(api "$WATCH" /v1/brokers | jq ".[] | select(.id == $DEAD) | .replicas")
LEADS=$(api "$WATCH" /v1/brokers | jq ".[] | select(.id == $DEAD) | .leaders")
[ "$REPLICAS" -gt 0 ] || fail "broker $DEAD holds no replica"
KILLED_AT=$(date +%s.%N)
kill -9 "$(node_pid "$DEAD")"
say "kill -9 broker $DEAD (a voter; $REPLICAS replicas, leader of $LEADS partitions); it does not come back"
since_kill() { echo "$(date +%s.%N) - $KILLED_AT" | bc | xargs printf '%.2f'; }

fenced() { api "$WATCH" /v1/brokers | jq -e ".[] | select(.id == $DEAD) | .state == \"fenced\""; }
wait_until "broker $DEAD fenced" 15 fenced
say "broker $DEAD fenced $(since_kill) s after the kill"
led_elsewhere() { api "$WATCH" /v1/topics/$TOPIC | jq -e "[.partitions[] | .leader != null and .leader != $DEAD] | all"; }
wait_until "new leaders for broker $DEAD's partitions" 15 led_elsewhere
say "its partitions have new leaders ($(since_kill) s after the kill); ISR now without it: \
$(api "$WATCH" /v1/topics/$TOPIC | jq -c "[.partitions[] | select(.replicas | index($DEAD)) | .isr]")"
say "waiting for balancer.node.unavailable.timeout.ms ($UNAVAILABLE_MS ms) to pass; then its replicas are re-created on the live brokers"

# Healed, as the controller sees it: every partition at RF 3 with every
# replica in the ISR, none on the dead broker, no partition moving.
healed() {
  api "$WATCH" /v1/topics/$TOPIC | jq -e "[.partitions[] | (.replicas | length) == 3 and (.replicas | index($DEAD)) == null
    and (.isr | sort) == (.replicas | sort)] | all" || return 1
  api "$WATCH" /v1/reassignments | jq -e 'length == 0'
}
recreating() {  # moves running, or already done
  api "$WATCH" /v1/reassignments | jq -e 'length > 0' && return
  api "$WATCH" /v1/topics/$TOPIC | jq -e "[.partitions[].replicas | index($DEAD)] | all(. == null)"
}
wait_until "the controller to start re-creating broker $DEAD's replicas" 30 recreating
say "re-creating broker $DEAD's replicas started $(since_kill) s after the kill: partition moves running: $(api "$WATCH" /v1/reassignments | jq -r 'length')"
wait_until "every partition back at RF 3 without broker $DEAD" 60 healed
HEALED_IN=$(since_kill)
say "every partition at RF 3 with ISR = replicas and none on broker $DEAD: $HEALED_IN s after the kill"
wait_until "the balancer to even out leaderships" 30 balanced "$WATCH" 3
say "the balancer evened out the preferred leaders and leaderships went back to them ($(since_kill) s after the kill):"
broker_table "$WATCH"

say "the operator replaces the dead voter in the metadata quorum: strom quorum remove-voter $DEAD; strom quorum add-voter 4"
strom_cli "$WATCH" quorum remove-voter "$DEAD" >/dev/null || fail "could not remove voter $DEAD"
wait_until "node 4 caught up" 15 json_ok "http://$(admin "$WATCH")/v1/quorum" ".observers[] | select(.id == 4) | .lag <= 100"
strom_cli "$WATCH" quorum add-voter 4 >/dev/null || fail "could not promote node 4"
strom_cli "$WATCH" broker unregister "$DEAD" >/dev/null || fail "could not unregister broker $DEAD"
gone() { api "$WATCH" /v1/brokers | jq -e "all(.id != $DEAD)"; }
wait_until "broker $DEAD unregistered" 10 gone
say "strom broker unregister $DEAD: brokers now $(api "$WATCH" /v1/brokers | jq -c '[.[] | "\(.id) \(.state)"]')"
say "strom quorum describe:"
strom_cli "$WATCH" quorum describe | sed 's/^/            /'

sleep 1
stop_producer 10
verify_acked "$TOPIC" "$PARTITIONS"
say "OK: broker $DEAD replaced: full RF on the 3 live brokers $HEALED_IN s after the kill, every acknowledged record read back exactly once"
