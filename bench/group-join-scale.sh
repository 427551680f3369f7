#!/usr/bin/env bash
# Scale-out of Nexmark joins over a consumer group: 1, 2 and 4 ubik processes (each --threads 1)
# share the bid and auction topics (PARTITIONS partitions each, records spread with no key), Kafka
# to Kafka, transactional, 1 s checkpoints. Every input partition has a first-stage task (decode,
# WHERE, stamp, route by the join key through the repartition topic); keyed tasks join. Against
# the same query run by one plain process (`ubik run`, no group): the ratio of the two is the
# exchange's cost. A group run's time is from starting the members until `ubik status` shows every
# task's last checkpoint at the end of its partition (both inputs' first stages and the keyed
# tasks), joining and rebalancing included. Prints events/s, CPU per event and the ratios, and
# the bytes each topic holds per input event.
# Builds release; starts the test broker.
#
#   bench/group-join-scale.sh [EVENTS=4000000] [PROCESSES="1 2 4"] [QUERIES="q9 q20"]
#   Env: PARTITIONS (8)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
N=${1:-4000000}
PROCS=${2:-"1 2 4"}
QUERIES=${3:-"q9 q20"}
PARTS=${PARTITIONS:-8}
source bench/common.sh
B=$(testing/kafka/broker.sh start | tail -1)
RUN=$(date +%s)-$$
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
declare -A SCHEMA=(
  [bid]="auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR, date_time TIMESTAMP, extra VARCHAR"
  [auction]="id BIGINT, item_name VARCHAR, description VARCHAR, initial_bid BIGINT, reserve BIGINT, date_time TIMESTAMP, expires TIMESTAMP, seller BIGINT, category BIGINT, extra VARCHAR"
)
topic() { echo "gj-$1-$RUN"; }
BASE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
for t in auction bid; do
  echo "== nexmark://$t?events=$N -> $(topic "$t") ($PARTS partitions, no key)" >&2
  "$UBIK" run "SELECT * FROM $t" --from "nexmark://$t?events=$N&base=$BASE" \
    --to "kafka://$B/$(topic "$t")?partitions=$PARTS" --emit idempotent -q
done
# The inputs in the query's source order (status lists the first's tasks, the keyed tasks, then
# the second's first stages).
from=()
for t in auction bid; do
  from+=(--from "$t=kafka://$B/$(topic "$t")?start=earliest&end=latest" --schema "$t=${SCHEMA[$t]}")
done
flags=(--event-time date_time --lateness 5s --checkpoint-interval 1s --threads 1 -q)
# Every task checkpointed at its end: lag 0 in the first input's table (column 6), the keyed
# tasks' (column 5) and the second input's (column 6).
done_all() { # group
  "$UBIK" status --group "$1" --from "kafka://$B/$(topic auction)" --from "kafka://$B/$(topic bid)" 2>/dev/null |
    awk -v parts="$PARTS" '/^task /{t++; next} $1 !~ /^[0-9]+$/ {next}
      t==1 || t==3 {n++; if ($6 != "0") behind++}
      t==2 {k++; if ($5 != "0") behind++}
      END {exit !(n == 2 * parts && k == parts && behind == 0)}'
}
cpu() { awk -v hz="$(getconf CLK_TCK)" '{printf "%.2f", ($14 + $15) / hz}' "/proc/$1/stat" 2>/dev/null || echo 0; }
BROKER_PID=$(cat "${UBIK_CACHE_DIR:-$HOME/.cache/ubik}/kafka-run/${UBIK_KAFKA_PORT:-39092}/kafka.pid")
for q in $QUERIES; do
  # One plain process: no group, no exchange.
  s=$(date +%s.%N)
  /usr/bin/time -f '%U %S' -o "$WORK/plain-$q.time" "$UBIK" run -f "bench/nexmark/$q.sql" "${from[@]}" \
    --to "kafka://$B/gj-out-$RUN-$q-plain?partitions=$PARTS" --checkpoint "$WORK/ck-$q-plain" "${flags[@]}"
  e=$(date +%s.%N)
  read -r u sy <"$WORK/plain-$q.time"
  echo "$q plain $(echo "$e - $s" | bc -l) $(echo "$u + $sy" | bc -l) 0" >>"$WORK/times"
  echo "  $q, plain: $(echo "$e - $s" | bc -l) s" >&2
  for p in $PROCS; do
    G=gj-$RUN-$q-$p
    s=$(date +%s.%N)
    broker0=$(cpu "$BROKER_PID")
    pids=()
    for i in $(seq "$p"); do
      "$UBIK" run -f "bench/nexmark/$q.sql" "${from[@]}" --to "kafka://$B/gj-out-$RUN-$q-$p?partitions=$PARTS" \
        --group "$G" --checkpoint "$WORK/ck-$q-$p-$i" "${flags[@]}" 2>"$WORK/$q-$p-$i.log" &
      pids+=($!)
    done
    until done_all "$G"; do sleep 0.3; done
    e=$(date +%s.%N)
    ubik_cpu=0
    for pid in "${pids[@]}"; do ubik_cpu=$(echo "$ubik_cpu + $(cpu "$pid")" | bc -l); done
    broker_cpu=$(echo "$(cpu "$BROKER_PID") - $broker0" | bc -l)
    kill $(jobs -p) 2>/dev/null || true
    wait || true
    echo "$q $p $(echo "$e - $s" | bc -l) $ubik_cpu $broker_cpu" >>"$WORK/times"
    echo "  $q, $p process(es): $(echo "$e - $s" | bc -l) s, ubik $ubik_cpu CPU-s, broker $broker_cpu CPU-s" >&2
  done
done
# Bytes per input event each topic of the largest run holds (on disk, compressed).
DATA=${UBIK_CACHE_DIR:-$HOME/.cache/ubik}/kafka-run/${UBIK_KAFKA_PORT:-39092}/data
p=${PROCS##* }
for q in $QUERIES; do
  G=gj-$RUN-$q-$p
  for t in "$(topic auction):input-auction" "$(topic bid):input-bid" "$G-ubik-repartition:repartition" \
    "gj-out-$RUN-$q-$p:output" "$G-ubik-checkpoints:checkpoints"; do
    bytes=$( (du -scb "$DATA/${t%%:*}"-[0-9]* 2>/dev/null || true) | tail -1 | cut -f1)
    echo "$q ${t##*:} ${bytes:-0}" >>"$WORK/bytes"
  done
done
"$PY" - "$N" "$WORK/times" "$WORK/bytes" "$PARTS" <<'PY'
import sys
n = int(sys.argv[1])
rows = [l.split() for l in open(sys.argv[2])]
rate = {(q, p): n / float(s) for q, p, s, _, _ in rows}
print(f"== {n} Nexmark events (auction and bid topics, {sys.argv[4]} partitions each, spread), Kafka to Kafka, transactional, 1 s checkpoints")
print("| query | processes | seconds | events/s | ratio to 1 process | ratio to plain | ubik CPU-µs per event | broker CPU-µs per event |")
print("|---|---|---|---|---|---|---|---|")
for q, p, s, u, b in rows:
    r = rate[(q, p)]
    one, plain = rate.get((q, "1")), rate.get((q, "plain"))
    ratios = f"{r/one:.2f} | {r/plain:.2f}" if one and plain else "- | -"
    print(f"| {q} | {p} | {float(s):.1f} | {r/1e3:.0f} K | {ratios} | {float(u) / n * 1e6:.2f} | {float(b) / n * 1e6:.2f} |")
print("\n| query | topic | bytes per event (on disk, compressed) |")
print("|---|---|---|")
for l in open(sys.argv[3]):
    q, t, b = l.split()
    if int(b):
        print(f"| {q} | {t} | {int(b) / n:.1f} |")
PY
