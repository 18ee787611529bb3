#!/usr/bin/env bash
# Secure in one step: `strom cluster --nodes 3 --secure`, then what it prints
# to connect, as printed; a user who may write only to `orders-*`; and what
# is refused: the wrong topic, a wrong password, plaintext Kafka, and the
# admin API without credentials.
source "$(dirname "$0")/lib.sh"
n=3
BASE=$(free_base $((4 * n)))
KAFKA_BASE=$BASE ADMIN_BASE=$((BASE + n)) RAFT_BASE=$((BASE + 2 * n)) INTERNAL_BASE=$((BASE + 3 * n))
D=$DEMO_DIR/cluster

say "strom cluster --nodes 3 --dir D --secure"
"$STROM" cluster --nodes "$n" --dir "$D" --secure --kafka-base "$KAFKA_BASE" --admin-base "$ADMIN_BASE" \
  --raft-base "$RAFT_BASE" --inter-broker-base "$INTERNAL_BASE" > "$DEMO_DIR/cluster.out" 2>&1 &
CLUSTER_PID=$!
wait_until "the secure cluster to come up" 60 grep -q "kcat -F" "$DEMO_DIR/cluster.out"
sed -n '/^secure:/,$p' "$DEMO_DIR/cluster.out" | sed 's/^/            /'
say "D holds: $(cd "$D" && ls ca.pem node.pem credentials.json client.properties librdkafka.conf | tr '\n' ' ')(modes: $(stat -c '%n %a' "$D"/credentials.json "$D"/node.pem | xargs))"

ADMIN=https://127.0.0.1:$ADMIN_BASE
export STROM_ADMIN_CREDENTIALS=$D/credentials.json STROM_ADMIN=$ADMIN
say "the printed commands:"
kcat -F "$D/librdkafka.conf" -L -m 30 | head -5 | sed 's/^/            /' || fail "kcat -F librdkafka.conf -L"
"$STROM" cluster-info | head -6 | sed 's/^/            /' || fail "strom cluster-info with the credentials file"
PW=$(jq -r .password "$D/credentials.json")
curl -sf --cacert "$D/ca.pem" -u "admin:$PW" "$ADMIN/v1/cluster" | jq -c '{controller_id, brokers: [.brokers[].id]}' \
  | sed 's/^/            /' || fail "curl with the admin password"

say "a user alice, who may write to orders-* and nothing else"
"$STROM" user create alice --password alice-pw >/dev/null || fail "strom user create"
"$STROM" topic create orders-eu --partitions 3 --replication-factor 3 >/dev/null || fail "topic create"
"$STROM" topic create payments --partitions 1 --replication-factor 3 >/dev/null || fail "topic create"
"$STROM" acl add --principal User:alice --resource-type topic --resource-name orders- --pattern prefixed \
  --operation write --permission allow >/dev/null || fail "strom acl add"
"$STROM" acl list | sed 's/^/            /'
sed -e 's/^sasl.username=.*/sasl.username=alice/' -e 's/^sasl.password=.*/sasl.password=alice-pw/' \
  "$D/librdkafka.conf" > "$DEMO_DIR/alice.conf"

seq 1 100 | kcat -F "$DEMO_DIR/alice.conf" -P -t orders-eu 2> "$DEMO_DIR/alice-ok.err" \
  || fail "alice could not write to orders-eu: $(tail -2 "$DEMO_DIR/alice-ok.err")"
got=$(kcat -F "$D/librdkafka.conf" -C -t orders-eu -o beginning -e -q 2>/dev/null | sort -n | uniq | wc -l)
[ "$got" -eq 100 ] || fail "read back $got of 100 records from orders-eu"
say "alice wrote 100 records to orders-eu over SASL_SSL; admin read them back: $got"

echo x | kcat -F "$DEMO_DIR/alice.conf" -P -t payments > "$DEMO_DIR/alice-denied.out" 2>&1 || true
grep -qi "authoriz" "$DEMO_DIR/alice-denied.out" || fail "alice wrote to payments: $(cat "$DEMO_DIR/alice-denied.out")"
say "alice to payments: $(grep -i -m1 'authoriz' "$DEMO_DIR/alice-denied.out" | sed 's/.*: //')"
[ "$(kcat -F "$D/librdkafka.conf" -C -t payments -o beginning -e -q 2>/dev/null | wc -l)" -eq 0 ] \
  || fail "a record reached payments"

sed -e 's/^sasl.password=.*/sasl.password=wrong/' "$DEMO_DIR/alice.conf" > "$DEMO_DIR/wrong.conf"
kcat -F "$DEMO_DIR/wrong.conf" -L -m 5 > "$DEMO_DIR/wrong.out" 2>&1 && fail "a wrong password was let in"
say "a wrong password: $(grep -i -m1 'authentication' "$DEMO_DIR/wrong.out" | sed 's/.*: SASL/SASL/')"
kcat -b "127.0.0.1:$KAFKA_BASE" -L -m 5 > "$DEMO_DIR/plain.out" 2>&1 && fail "plaintext Kafka was let in"
say "plaintext Kafka to the SASL_SSL port: refused"
code=$(curl -s -o /dev/null -w '%{http_code}' --cacert "$D/ca.pem" "$ADMIN/v1/topics")
[ "$code" = 401 ] || fail "the admin API answered $code without credentials"
say "the admin API without credentials: HTTP $code"
say "OK: secure in one step, and only who may gets in"
