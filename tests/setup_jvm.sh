#!/usr/bin/env bash
# Set-up for the tests that drive Strom with the reference Java client, Kafka's
# tools and Kafka Streams (tests/kafka/test_java_client.py, test_kafka_tools.py,
# test_java_transactions.py, test_streams_eos.py): Maven copies kafka-clients,
# kafka-tools, kafka-streams and their dependencies, as pinned in
# tests/jvm/pom.xml, into target/jvm/lib, with its
# own repository cache in target/jvm/m2. Idempotent: does nothing when the
# jars for the current pom are there. Strom itself needs no JVM.
#
# Without a JDK (java) and Maven (mvn) it says so and stops without error;
# the Java client tests then skip, naming the reason. Only Maven Central is used.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v java > /dev/null || ! command -v mvn > /dev/null; then
  echo "== jvm: no java or mvn on PATH; the Java client tests will be skipped"
  exit 0
fi
LIB=target/jvm/lib
STAMP=target/jvm/pom.sha256
want=$(sha256sum tests/jvm/pom.xml | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -d "$LIB" ]; then
  echo "== jvm: $(ls "$LIB" | wc -l) jars in $LIB (up to date)"
  exit 0
fi
echo "== jvm: copying the Java clients into $LIB"
rm -rf "$LIB"
mkdir -p target/jvm
mvn -B -q -f tests/jvm/pom.xml -Dmaven.repo.local="$PWD/target/jvm/m2" \
  dependency:copy-dependencies -DoutputDirectory="$PWD/$LIB"
echo "$want" > "$STAMP"
echo "== jvm: $(ls "$LIB" | tr '\n' ' ')"
