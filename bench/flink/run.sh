#!/usr/bin/env bash
# Flink SQL peer of ubik's Kafka benchmarks, run by Flink SQL in a local mini-cluster (one JVM,
# no Flink install), Kafka topic to Kafka topic.
#
#   bench/flink/run.sh BROKER IN_TOPIC OUT_TOPIC
#       bench/kafka.sh's per-merchant per-minute tumbling-window query: an upsert changelog
#       keyed by (merchant, window start) to OUT_TOPIC.
#   bench/flink/run.sh nexmark QUERY BROKER OUT_TOPIC TABLE=TOPIC... [lateness_ms=5000] [out_partitions=N] [registry=URL]
#       bench/nexmark-kafka.sh: Nexmark q0, q1, q2, q7 or q8 (the published Flink SQL) over the
#       tables bid / person / auction as ubik writes them, e.g. bid=nx-bid; insert-only output.
#       registry=URL: the tables are Confluent-framed Avro (ubik's format=avro), read with
#       Flink's avro-confluent format against that registry (its Confluent API).
#   bench/flink/run.sh count BROKER TOPIC...
#       prints {"topic":TOPIC,"records":N} for each topic, N = its committed records.
#   bench/flink/run.sh delete BROKER TOPIC...
#       deletes the topics that exist.
#
# A query reads its topics from the earliest to the latest offsets at start (bounded) and prints
# one JSON line to stdout:
#   {"bench":"flink","seconds":S,"job_runtime_seconds":R,"output_records":N,"cpu_seconds":C,
#    "process_seconds":P,"process_cpu_seconds":PC}
# S: INSERT submitted (planning + mini-cluster start) until the job finished, output flushed;
# R: Flink's net runtime of the job; N: records appended to OUT_TOPIC; C: the JVM's CPU time
# (user + system, all threads) until the job finished; P and PC: wall and CPU (user + system)
# seconds of the whole java process, JVM start and exit included. Logs go to stderr.
# Env: FLINK_PARALLELISM (default 2), FLINK_LOG_LEVEL (default WARN), FLINK_JAVA_OPTS (extra
# JVM flags). Needs Java 17+ and Maven: the first run builds target/ (rebuilt when the pom or a
# source file changes).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
(($# >= 3)) || { echo "usage: $0 BROKER IN_TOPIC OUT_TOPIC | nexmark QUERY BROKER OUT_TOPIC TABLE=TOPIC... | count|delete BROKER TOPIC..." >&2; exit 2; }

JAR=$HERE/target/flink-peer.jar
if [[ ! -f $JAR || ! -d $HERE/target/lib ||
  -n $(find "$HERE/pom.xml" "$HERE/src" -newer "$JAR" -print -quit) ]]; then
  echo "flink/run.sh: building $JAR" >&2
  # clean: target/lib must not keep jars of other versions.
  log=$(mktemp)
  mvn -q -B -f "$HERE/pom.xml" clean package >"$log" 2>&1 || { cat "$log" >&2; rm -f "$log"; exit 1; }
  rm -f "$log"
fi

# Flink leaves files in the temp dir (an RPC jar of ~20 MB, mini-cluster dirs): give it its own.
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# shellcheck disable=SC2206 # FLINK_JAVA_OPTS is a space-separated list of flags
JAVA_OPTS=(-Xms1g -Xmx2g -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true "-Djava.io.tmpdir=$TMP"
  "-Dparallelism=${FLINK_PARALLELISM:-2}" "-Dpeer.log.level=${FLINK_LOG_LEVEL:-WARN}"
  ${FLINK_JAVA_OPTS:-})
start=$(date +%s.%N)
# The java process's user and system CPU seconds, from wait4's rusage.
line=$(/usr/bin/time -f '%U %S' -o "$TMP/cpu" java "${JAVA_OPTS[@]}" -cp "$JAR:$HERE/target/lib/*" \
  dev.ubik.bench.FlinkPeer "$@")
end=$(date +%s.%N)
process=$(awk -v s="$start" -v e="$end" 'BEGIN { printf "%.3f", e - s }')
cpu=$(awk '{ printf "%.3f", $1 + $2 }' "$TMP/cpu")
# The process's figures join the (last) result line; delete prints none.
[[ -z $line ]] || echo "${line%\}},\"process_seconds\":$process,\"process_cpu_seconds\":$cpu}"
