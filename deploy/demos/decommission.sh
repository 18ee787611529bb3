#!/usr/bin/env bash
# Decommissioning a node that is also a quorum voter, under load: 4 nodes
# (voters 1-3, node 4 an observer), a topic of 12 partitions with RF 3, an
# acks=all producer writing steadily. Promote node 4 to voter, take the node
# to be retired out of the voters, then drain it: its leaderships move first,
# then its replicas; once it holds nothing it is unregistered, and its process
# is stopped. Leaderships go back to the preferred replicas the balancer
# evened out (leader.imbalance.check.interval.seconds, 5 s here, 300 by
# default). Then everything acknowledged is read back.
source "$(dirname "$0")/lib.sh"
TOPIC=orders PARTITIONS=12

say "starting a 4-node cluster (voters 1-3, node 4 an observer)"
start_cluster 4 --set broker.heartbeat.interval.ms=200 --set broker.session.timeout.ms=1500 \
  --set leader.imbalance.check.interval.seconds=5
CONTROLLER=$(controller 1)
say "cluster up, bootstrap $BOOTSTRAP; controller is broker $CONTROLLER"
topic_under_load

# The node to retire: a voter that is not the controller (broker 3, or 2 when 3
# is the controller), so that taking it out of the voters moves no quorum
# leadership. (Retiring the controller works the same way; its removal from
# the voters makes another voter the controller first.)
CONTROLLER=$(controller 1)
GONE=3; [ "$CONTROLLER" != 3 ] || GONE=2
WATCH=$CONTROLLER
say "retiring broker $GONE (a voter); the quorum before: strom quorum describe"
strom_cli "$WATCH" quorum describe | sed 's/^/            /'
say "replicas and leaders per broker:"
broker_table "$WATCH"

caught_up() { api "$WATCH" /v1/quorum | jq -e '.observers[] | select(.id == 4) | .lag <= 100'; }
wait_until "node 4 caught up with the metadata log" 15 caught_up
strom_cli "$WATCH" quorum add-voter 4 >/dev/null || fail "could not promote node 4 to voter"
voter() { api "$WATCH" /v1/quorum | jq -e "any(.voters[]; .id == $1)"; }
wait_until "node 4 a voter" 15 voter 4
say "strom quorum add-voter 4: voters now $(api "$WATCH" /v1/quorum | jq -c '[.voters[].id]')"
strom_cli "$WATCH" quorum remove-voter "$GONE" >/dev/null || fail "could not remove voter $GONE"
not_voter() { ! voter "$1"; }
wait_until "node $GONE out of the voters" 15 not_voter "$GONE"
say "strom quorum remove-voter $GONE: voters now $(api "$WATCH" /v1/quorum | jq -c '[.voters[].id]'), observers $(api "$WATCH" /v1/quorum | jq -c '[.observers[].id]')"

LEADS=$(api "$WATCH" /v1/brokers/"$GONE" | jq .leaders)
DRAIN_AT=$(date +%s.%N)
since_drain() { echo "$(date +%s.%N) - $DRAIN_AT" | bc | xargs printf '%.2f'; }
strom_cli "$WATCH" broker decommission "$GONE" >/dev/null || fail "could not decommission broker $GONE"
say "strom broker decommission $GONE (it led $LEADS partitions): $(api "$WATCH" /v1/brokers/"$GONE" | jq -c '.decommission')"

# Watch the drain: leaderships first, then replicas_left falling to 0, then
# the broker gone from the brokers' list (unregistered).
deadline=$(echo "$(date +%s.%N) + 60" | bc)
last="" leads_gone=0
while :; do
  b=$(api "$WATCH" /v1/brokers | jq -c ".[] | select(.id == $GONE)") || b="?"
  [ -z "$b" ] && break
  if [ "$b" != "?" ]; then
    leaders=$(jq -r .leaders <<< "$b") left=$(jq -r '.decommission.replicas_left // .replicas' <<< "$b")
    if [ "$leads_gone" = 0 ] && [ "$leaders" = 0 ]; then
      leads_gone=1
      say "broker $GONE leads nothing any more ($(since_drain) s); replicas left: $left"
    elif [ "$leads_gone" = 1 ] && [ "$left" != "$last" ]; then
      say "  replicas_left $left ($(since_drain) s; state $(jq -r '.decommission.state // "-"' <<< "$b"))"
    fi
    [ "$leads_gone" = 0 ] || last=$left
  fi
  [ "$(echo "$(date +%s.%N) > $deadline" | bc)" -eq 1 ] && fail "timed out waiting for broker $GONE to be drained and unregistered"
  sleep 0.1
done
[ "$leads_gone" = 1 ] || say "broker $GONE drained before its leaderships were seen gone"
say "broker $GONE drained and unregistered, $(since_drain) s after the decommission: brokers now $(api "$WATCH" /v1/brokers | jq -c '[.[].id]')"

# Its partitions: every one at RF 3 with every replica in sync, none on it.
api "$WATCH" /v1/topics/$TOPIC | jq -e "[.partitions[] | (.replicas | length) == 3 and (.replicas | index($GONE)) == null
  and (.isr | sort) == (.replicas | sort)] | all" >/dev/null || fail "a partition is not at RF 3 in sync without broker $GONE"
say "every partition at RF 3 with ISR = replicas, none on broker $GONE"
wait_until "the balancer to even out leaderships" 30 balanced "$WATCH" 3
say "leaderships evened out (preferred leaders, leader.imbalance.check.interval.seconds=5 here); replicas and leaders per broker:"
broker_table "$WATCH"

PID=$(node_pid "$GONE")
kill -TERM "$PID"
exited() { ! kill -0 "$PID"; }
wait_until "broker $GONE's process to exit" 15 exited
say "stopped broker $GONE's process (SIGTERM to pid $PID); the quorum after: strom quorum describe"
strom_cli "$WATCH" quorum describe | sed 's/^/            /'

sleep 1
stop_producer 5
verify_acked "$TOPIC" "$PARTITIONS"
say "OK: broker $GONE (a voter) retired under load: out of the quorum, drained and unregistered, every acknowledged record read back exactly once"
