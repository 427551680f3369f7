#!/usr/bin/env bash
# Scale-out over a consumer group: 1, 2 and 4 ubik processes (each
# --threads 1) share an 8-partition topic keyed by merchant, Kafka to Kafka,
# transactional, the per-merchant per-minute aggregation of bench/kafka.sh.
# A run's time is from starting the members until `ubik status` shows every
# task's last checkpoint at the end of its partition (joining and
# rebalancing included). Prints events/s and the ratio to one process.
# Builds release; starts the test broker.
#
#   bench/group-scale.sh [EVENTS=2000000] [PROCESSES="1 2 4"]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
N=${1:-2000000}
PROCS=${2:-"1 2 4"}
source bench/common.sh
B=$(testing/kafka/broker.sh start | tail -1)
JSONL=$CACHE/events-$N.jsonl
[[ -s $JSONL ]] || "$PY" bench/peers.py make-jsonl "$N" "$JSONL"
RUN=$(date +%s)-$$
IN=group-scale-in-$RUN
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
echo "== loading $N events into $IN (8 partitions, keyed by merchant)"
"$BENCH" kafka-load "$B" "$IN" "$JSONL" 8 merchant >/dev/null
Q="SELECT merchant, TUMBLE(ts, INTERVAL '1 MINUTE') AS w, count(*) AS n, sum(amount) AS total, avg(amount) AS mean FROM orders GROUP BY merchant, TUMBLE(ts, INTERVAL '1 MINUTE')"
done_all() { # group: every task checkpointed at its end
  "$UBIK" status --group "$1" --from "kafka://$B/$IN" 2>/dev/null |
    awk '/^task /{t=1; next} t && NF==0 {t=0} t {n++; if ($6 != "0") behind++} END {exit !(n == 8 && behind == 0)}'
}
for p in $PROCS; do
  G=group-scale-$RUN-$p
  s=$(date +%s.%N)
  for i in $(seq "$p"); do
    "$UBIK" run "$Q" --table orders --from "kafka://$B/$IN?end=latest" \
      --to "kafka://$B/group-scale-out-$RUN-$p" --group "$G" --partitioned-by merchant \
      --checkpoint "$WORK/ck-$p-$i" --checkpoint-interval 1s --threads 1 \
      --schema "merchant VARCHAR, ts TIMESTAMP, amount DOUBLE" --lateness 0s -q 2>"$WORK/$p-$i.log" &
  done
  until done_all "$G"; do sleep 0.3; done
  e=$(date +%s.%N)
  kill $(jobs -p) 2>/dev/null || true
  wait || true
  secs=$(echo "$e - $s" | bc -l)
  echo "$p $secs" >> "$WORK/times"
  echo "  $p process(es): $secs s" >&2
done
"$PY" - "$N" "$WORK/times" <<'PY'
import sys
n = int(sys.argv[1])
rows = [l.split() for l in open(sys.argv[2])]
base = None
print(f"== {n} events, 8 partitions, Kafka to Kafka, transactional, 1 s checkpoints")
print("| processes | seconds | events/s | ratio to 1 |")
print("|---|---|---|---|")
for p, s in rows:
    rate = n / float(s)
    base = base or rate
    print(f"| {p} | {float(s):.1f} | {rate/1e3:.0f} K | {rate/base:.2f} |")
PY
