#!/usr/bin/env bash
# Kafka -> ubik -> Kafka throughput, both emit modes, side by side with the
# broker's own produce+consume rate on the same messages (ubik-bench
# kafka-copy: librdkafka consume + produce with ubik's producer settings).
# The Flink SQL peer (bench/flink: same query, Kafka to Kafka, local mini-cluster)
# runs in the same rounds unless FLINK=0. Broker and clients share this machine.
# Builds release; starts the test broker.
#
#   [INTERVAL=1s] bench/kafka.sh [EVENTS=2000000] [ROUNDS=3] [PARTITIONS=4]
# INTERVAL is the checkpoint (= transaction) interval: it bounds emit-to-commit latency.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
N=${1:-2000000}
ROUNDS=${2:-3}
PARTS=${3:-4}
source bench/common.sh
B=$(testing/kafka/broker.sh start | tail -1)
JSONL=$(events_jsonl "$N")
RUN=$(date +%s)-$$
IN=bench-in-$RUN
WORK=$(mktemp -d)
trap 'drop_topics "$B" "$RUN"; rm -rf "$WORK"' EXIT
echo "== loading $N events into $IN ($PARTS partitions)"
"$BENCH" kafka-load "$B" "$IN" "$JSONL" "$PARTS"

Q="SELECT merchant, TUMBLE(ts, INTERVAL '1 MINUTE') AS w, count(*) AS n, sum(amount) AS total, avg(amount) AS mean FROM orders GROUP BY merchant, TUMBLE(ts, INTERVAL '1 MINUTE')"
now() { date +%s.%N; }

ubik_run() { # mode round
  local log=$WORK/$1-$2.log s e
  s=$(now)
  "$UBIK" run "$Q" --table orders --from "kafka://$B/$IN?start=earliest&end=latest" \
    --to "kafka://$B/bench-out-$1-$RUN-$2" --emit "$1" --checkpoint "$WORK/ck-$1-$2" --checkpoint-interval "${INTERVAL:-1s}" \
    --schema "merchant VARCHAR, ts TIMESTAMP, amount DOUBLE" --lateness 0s 2>"$log" >/dev/null
  e=$(now)
  echo "$e - $s" | bc -l >> "$WORK/$1.secs"
  grep -o 'commit_latency_max_ms="[0-9.]*"' "$log" | tr -dc '0-9.\n' >> "$WORK/$1.lat" || true
  echo "  ubik --emit $1: $(tail -1 "$WORK/$1.secs") s, max emit-to-commit $(tail -1 "$WORK/$1.lat" 2>/dev/null) ms" >&2
}

for r in $(seq "$ROUNDS"); do
  "$BENCH" kafka-copy "$B" "$IN" "bench-copy-$RUN-$r" | tee -a /dev/stderr |
    "$PY" -c "import json,sys; print(json.loads(sys.stdin.readline())['seconds'])" >> "$WORK/copy.secs"
  ubik_run transactional "$r"
  ubik_run idempotent "$r"
  if [[ ${FLINK:-1} != 0 ]]; then
    bench/flink/run.sh "$B" "$IN" "bench-out-flink-$RUN-$r" 2>"$WORK/flink-$r.log" | tee -a /dev/stderr |
      "$PY" -c "import json,sys; print(json.loads(sys.stdin.readline())['process_seconds'])" >> "$WORK/flink.secs"
  fi
done

C=$(median < "$WORK/copy.secs")
T=$(median < "$WORK/transactional.secs")
I=$(median < "$WORK/idempotent.secs")
TL=$(median < "$WORK/transactional.lat")
IL=$(median < "$WORK/idempotent.lat")
"$PY" - <<PY
n, c, t, i = $N, $C, $T, $I
print(f"== {n} events, median of $ROUNDS (whole ubik process, startup included)")
print(f"broker produce+consume (kafka-copy): {n/c/1e6:.2f} M msg/s")
print(f"ubik transactional: {n/t/1e6:.2f} M ev/s = {c/t*100:.0f}% of the broker's rate; max emit-to-commit {float('$TL'):.0f} ms")
print(f"ubik idempotent:    {n/i/1e6:.2f} M ev/s = {c/i*100:.0f}% of the broker's rate; max emit-to-commit {float('$IL'):.0f} ms")
PY
if [[ -s $WORK/flink.secs ]]; then
  F=$(median < "$WORK/flink.secs")
  "$PY" -c "n, f, t = $N, $F, $T; print(f'flink sql (whole JVM process): {n/f/1e6:.2f} M ev/s; ubik transactional / flink speed ratio {f/t:.2f}x')"
fi
