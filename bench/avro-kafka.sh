#!/usr/bin/env bash
# Avro against JSON input, Kafka to Kafka: one Nexmark bid stream written into two topics, as
# JSON and as Confluent-framed Avro (through the test schema registry), then each query over
# each topic, one after the other in one run. The figure is CPU (user + system of the whole
# process) per million input records; the output (JSON, the same for both) is counted and must
# be equal. Flink SQL (bench/flink) runs each query over the same two topics beside it: JSON,
# and Avro through its avro-confluent format against the same registry; its figure is the CPU of
# its whole JVM (start and planning included: about ten CPU-seconds whatever the input), and its
# outputs must equal ubik's in count.
#
#   bench/avro-kafka.sh [EVENTS=2000000] [QUERIES="q0 q1 q2 q5 q7"]
#
# Env: PARTITIONS (4), INTERVAL (checkpoint interval, 1s), UBIK (a ubik binary instead of
# building the release), FLINK=0 (ubik alone).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
EVENTS=${1:-2000000}
QUERIES=${2:-"q0 q1 q2 q5 q7"}
PARTS=${PARTITIONS:-4}
source bench/common.sh
B=$(testing/kafka/broker.sh start | tail -1)
R=$(testing/registry/registry.sh start | tail -1)
RUN=$(date +%s)-$$
WORK=$(mktemp -d)
trap 'drop_topics "$B" "$RUN"; rm -rf "$WORK"' EXIT
SCHEMA="auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR, date_time TIMESTAMP, extra VARCHAR"
BASE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
declare -A TOPIC=([json]=nx-bid-json-$RUN [avro]=nx-bid-avro-$RUN)
declare -A FORMAT=([json]="" [avro]="&format=avro&registry=$R")

count() { # topic: its committed records
  "$PY" - "$B" "$1" <<'PY'
import sys
from confluent_kafka import Consumer, TopicPartition
b, topic = sys.argv[1:]
c = Consumer({"bootstrap.servers": b, "group.id": "count", "isolation.level": "read_committed",
              "enable.auto.commit": False})
n = 0
for p in c.list_topics(topic, timeout=30).topics[topic].partitions:
    lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
    c.assign([TopicPartition(topic, p, lo)])
    while True:
        msgs = c.consume(10000, 2)
        if not msgs:
            break
        n += sum(1 for m in msgs if not m.error())
        if msgs[-1].offset() >= hi - 2:
            break
print(n)
PY
}

for f in json avro; do
  echo "== nexmark://bid?events=$EVENTS -> ${TOPIC[$f]} ($f, $PARTS partitions)" >&2
  "$UBIK" run "SELECT * FROM bid" --from "nexmark://bid?events=$EVENTS&base=$BASE" \
    --to "kafka://$B/${TOPIC[$f]}?partitions=$PARTS${FORMAT[$f]}" --emit idempotent -q 2>"$WORK/load-$f.log" ||
    { cat "$WORK/load-$f.log" >&2; exit 1; }
done
INPUT=$(count "${TOPIC[json]}")
echo "   $INPUT bids per topic; bytes: $(du -sb "${UBIK_CACHE_DIR:-$HOME/.cache/ubik}/kafka-run/${UBIK_KAFKA_PORT:-39092}/data/${TOPIC[json]}-"* | awk '{s+=$1} END {print s}') JSON, $(du -sb "${UBIK_CACHE_DIR:-$HOME/.cache/ubik}/kafka-run/${UBIK_KAFKA_PORT:-39092}/data/${TOPIC[avro]}-"* | awk '{s+=$1} END {print s}') Avro" >&2

for q in $QUERIES; do
  declare -A CPU=() OUT=()
  for f in json avro; do
    from=(--from "bid=kafka://$B/${TOPIC[$f]}?start=earliest&end=latest${FORMAT[$f]}")
    [[ $f == avro ]] || from+=(--schema "bid=$SCHEMA")
    out=nx-out-$q-$f-$RUN
    /usr/bin/time -f '%e %U %S' -o "$WORK/$q-$f.time" "$UBIK" run -f "bench/nexmark/$q.sql" "${from[@]}" \
      --to "kafka://$B/$out?partitions=$PARTS" --lateness 5s --checkpoint "$WORK/ck-$q-$f" \
      --checkpoint-interval "${INTERVAL:-1s}" -q 2>"$WORK/$q-$f.log" ||
      { echo "$q over $f failed:" >&2; tail -20 "$WORK/$q-$f.log" >&2; exit 1; }
    read -r wall user sys < <(tail -1 "$WORK/$q-$f.time")
    CPU[$f]=$(awk -v u="$user" -v s="$sys" 'BEGIN { print u + s }')
    OUT[$f]=$(count "$out")
    awk -v q="$q" -v f="$f" -v n="$INPUT" -v w="$wall" -v c="${CPU[$f]}" -v o="${OUT[$f]}" \
      'BEGIN { printf "{\"query\":\"%s\",\"input\":\"%s\",\"records\":%d,\"seconds\":%.3f,\"cpu\":%.3f,\"cpu_s_per_m\":%.3f,\"output\":%d}\n", q, f, n, w, c, c / n * 1e6, o }'
  done
  [[ ${OUT[json]} == "${OUT[avro]}" ]] || { echo "$q: outputs differ: ${OUT[json]} JSON, ${OUT[avro]} Avro" >&2; exit 1; }
  awk -v q="$q" -v j="${CPU[json]}" -v a="${CPU[avro]}" \
    'BEGIN { printf "{\"query\":\"%s\",\"cpu_json_over_avro\":%.2f}\n", q, j / a }'
  [[ ${FLINK:-1} != 0 ]] || continue
  declare -A FCPU=()
  for f in json avro; do
    out=nx-out-flink-$q-$f-$RUN
    extra=()
    [[ $f == json ]] || extra=(registry="$R")
    line=$(bench/flink/run.sh nexmark "$q" "$B" "$out" bid="${TOPIC[$f]}" lateness_ms=5000 \
      out_partitions="$PARTS" "${extra[@]}" 2>"$WORK/flink-$q-$f.log") ||
      { echo "flink $q over $f failed:" >&2; tail -40 "$WORK/flink-$q-$f.log" >&2; exit 1; }
    FCPU[$f]=$("$PY" -c 'import json,sys; print(json.loads(sys.argv[1])["process_cpu_seconds"])' "$line")
    got=$(count "$out")
    wall=$("$PY" -c 'import json,sys; print(json.loads(sys.argv[1])["process_seconds"])' "$line")
    awk -v q="$q" -v f="$f" -v n="$INPUT" -v w="$wall" -v c="${FCPU[$f]}" -v o="$got" \
      'BEGIN { printf "{\"query\":\"%s\",\"engine\":\"flink\",\"input\":\"%s\",\"records\":%d,\"seconds\":%.3f,\"cpu\":%.3f,\"cpu_s_per_m\":%.3f,\"output\":%d}\n", q, f, n, w, c, c / n * 1e6, o }'
    [[ $got == "${OUT[$f]}" ]] || echo "$q: Flink over $f wrote $got records, ubik ${OUT[$f]}" >&2
  done
  awk -v q="$q" -v j="${FCPU[json]}" -v a="${FCPU[avro]}" -v u="${CPU[avro]}" \
    'BEGIN { printf "{\"query\":\"%s\",\"flink_cpu_json_over_avro\":%.2f,\"avro_cpu_flink_over_ubik\":%.2f}\n", q, j / a, a / u }'
done
