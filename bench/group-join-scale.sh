#!/usr/bin/env bash
# Scale-out of Nexmark's stateful queries over a consumer group: 1, 2 and 4 ubik processes (each
# --threads 1) share the person, auction and bid topics (PARTITIONS partitions each, records
# spread with no key), Kafka to Kafka, transactional, 1 s checkpoints. Every input partition has
# a first-stage task (decode, WHERE, stamp, route by the key through the repartition topic);
# keyed tasks run the rest. Against the same query run by one plain process (`ubik run`, no
# group): the ratio of the two is the exchange's cost. A group run's time is from starting the
# members until `ubik status` shows every task's last checkpoint at the end of its partition
# (every input's first stages and the keyed tasks), joining and rebalancing included. Prints
# events/s, CPU per event (per stage, from each member's status page: the first stages', the
# keyed tasks', and the rest of the process: librdkafka's threads, the store's merges) and the
# ratios, and the bytes each topic holds per input event.
# Builds release (UBIK=path runs another build instead); starts the test broker.
#
#   bench/group-join-scale.sh [EVENTS=4000000] [PROCESSES="1 2 4"] [QUERIES="q4 q5 q7 q8 q9 q20"]
#   Env: PARTITIONS (8)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
N=${1:-4000000}
PROCS=${2:-"1 2 4"}
QUERIES=${3:-"q4 q5 q7 q8 q9 q20"}
PARTS=${PARTITIONS:-8}
source bench/common.sh
B=$(testing/kafka/broker.sh start | tail -1)
RUN=$(date +%s)-$$
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; drop_topics "$B" "$RUN"; rm -rf "$WORK"' EXIT
declare -A SCHEMA=(
  [person]="id BIGINT, name VARCHAR, email_address VARCHAR, credit_card VARCHAR, city VARCHAR, state VARCHAR, date_time TIMESTAMP, extra VARCHAR"
  [bid]="auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR, date_time TIMESTAMP, extra VARCHAR"
  [auction]="id BIGINT, item_name VARCHAR, description VARCHAR, initial_bid BIGINT, reserve BIGINT, date_time TIMESTAMP, expires TIMESTAMP, seller BIGINT, category BIGINT, extra VARCHAR"
)
# The tables each query reads, in the order given to --from.
declare -A TABLES=([q3]="auction person" [q4]="auction bid" [q5]="bid" [q6]="auction bid"
  [q7]="bid" [q8]="person auction" [q9]="auction bid" [q18]="bid" [q19]="bid" [q20]="auction bid")
topic() { echo "gj-$1-$RUN"; }
BASE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
for t in person auction bid; do
  echo "== nexmark://$t?events=$N -> $(topic "$t") ($PARTS partitions, no key)" >&2
  "$UBIK" run "SELECT * FROM $t" --from "nexmark://$t?events=$N&base=$BASE" \
    --to "kafka://$B/$(topic "$t")?partitions=$PARTS" --emit idempotent -q
done
from_of() { # query: its --from and --schema flags
  local t
  for t in ${TABLES[$1]}; do
    printf '%s\n' --from "$t=kafka://$B/$(topic "$t")?start=earliest&end=latest" --schema "$t=${SCHEMA[$t]}"
  done
  # An auction has two TIMESTAMP columns: say which is the event time.
  [[ " ${TABLES[$1]} " != *" auction "* ]] || printf '%s\n' --event-time date_time
}
flags=(--lateness 5s --checkpoint-interval 1s --threads 1 -q)
# Every task checkpointed at its end. `ubik status` lists the first input's tasks (lag in column
# 6), the keyed tasks (column 5), then each further input's tasks (column 6).
done_all() { # group query
  local status=() t
  for t in ${TABLES[$2]}; do status+=(--from "kafka://$B/$(topic "$t")"); done
  "$UBIK" status --group "$1" "${status[@]}" 2>/dev/null |
    awk -v parts="$PARTS" -v inputs="$(wc -w <<<"${TABLES[$2]}")" '/^task /{t++; next} $1 !~ /^[0-9]+$/ {next}
      t != 2 {n++; if ($6 != "0") behind++}
      t == 2 {k++; if ($5 != "0") behind++}
      END {exit !(n == inputs * parts && k == parts && behind == 0)}'
}
# CPU seconds of each stage over a group's members, from their status pages: "first keyed".
stage_cpu() { # ports...
  "$PY" - "$@" <<'PY'
import json, sys, urllib.request
cpu = [0.0, 0.0]
for port in sys.argv[1:]:
    try:
        s = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/status.json", timeout=5))
    except Exception:
        continue
    for i, g in enumerate(s.get("stages", [])[:2]):
        cpu[i] += g.get("cpu_s", 0.0)
print(f"{cpu[0]:.3f} {cpu[1]:.3f}")
PY
}
cpu() { awk -v hz="$(getconf CLK_TCK)" '{printf "%.2f", ($14 + $15) / hz}' "/proc/$1/stat" 2>/dev/null || echo 0; }
BROKER_PID=$(cat "${UBIK_CACHE_DIR:-$HOME/.cache/ubik}/kafka-run/${UBIK_KAFKA_PORT:-39092}/kafka.pid")
for q in $QUERIES; do
  mapfile -t from < <(from_of "$q")
  # One plain process: no group, no exchange.
  s=$(date +%s.%N)
  /usr/bin/time -f '%U %S' -o "$WORK/plain-$q.time" "$UBIK" run -f "bench/nexmark/$q.sql" "${from[@]}" \
    --to "kafka://$B/gj-out-$RUN-$q-plain?partitions=$PARTS" --checkpoint "$WORK/ck-$q-plain" "${flags[@]}"
  e=$(date +%s.%N)
  read -r u sy <"$WORK/plain-$q.time"
  echo "$q plain $(echo "$e - $s" | bc -l) $(echo "$u + $sy" | bc -l) 0 0 0" >>"$WORK/times"
  echo "  $q, plain: $(echo "$e - $s" | bc -l) s" >&2
  for p in $PROCS; do
    G=gj-$RUN-$q-$p
    s=$(date +%s.%N)
    broker0=$(cpu "$BROKER_PID")
    pids=()
    ports=()
    for i in $(seq "$p"); do
      port=$((19870 + i))
      "$UBIK" run -f "bench/nexmark/$q.sql" "${from[@]}" --to "kafka://$B/gj-out-$RUN-$q-$p?partitions=$PARTS" \
        --group "$G" --checkpoint "$WORK/ck-$q-$p-$i" --metrics "127.0.0.1:$port" "${flags[@]}" \
        2>"$WORK/$q-$p-$i.log" &
      pids+=($!)
      ports+=("$port")
    done
    until done_all "$G" "$q"; do sleep 0.3; done
    e=$(date +%s.%N)
    ubik_cpu=0
    for pid in "${pids[@]}"; do ubik_cpu=$(echo "$ubik_cpu + $(cpu "$pid")" | bc -l); done
    broker_cpu=$(echo "$(cpu "$BROKER_PID") - $broker0" | bc -l)
    # A status page is refreshed every second: let it take in the last commits.
    sleep 1
    stages=$(stage_cpu "${ports[@]}")
    kill $(jobs -p) 2>/dev/null || true
    wait || true
    echo "$q $p $(echo "$e - $s" | bc -l) $ubik_cpu $broker_cpu $stages" >>"$WORK/times"
    echo "  $q, $p process(es): $(echo "$e - $s" | bc -l) s, ubik $ubik_cpu CPU-s (stages: $stages), broker $broker_cpu CPU-s" >&2
  done
done
# Bytes per input event each topic of the largest run holds (on disk, compressed).
DATA=${UBIK_CACHE_DIR:-$HOME/.cache/ubik}/kafka-run/${UBIK_KAFKA_PORT:-39092}/data
p=${PROCS##* }
for q in $QUERIES; do
  G=gj-$RUN-$q-$p
  topics=()
  for t in ${TABLES[$q]}; do topics+=("$(topic "$t"):input-$t"); done
  for t in "${topics[@]}" "$G-ubik-repartition:repartition" \
    "gj-out-$RUN-$q-$p:output" "$G-ubik-checkpoints:checkpoints"; do
    bytes=$( (du -scb "$DATA/${t%%:*}"-[0-9]* 2>/dev/null || true) | tail -1 | cut -f1)
    echo "$q ${t##*:} ${bytes:-0}" >>"$WORK/bytes"
  done
done
"$PY" - "$N" "$WORK/times" "$WORK/bytes" "$PARTS" <<'PY'
import sys
n = int(sys.argv[1])
rows = [l.split() for l in open(sys.argv[2])]
rate = {(q, p): n / float(s) for q, p, s, *_ in rows}
print(f"== {n} Nexmark events (person, auction and bid topics, {sys.argv[4]} partitions each, spread), Kafka to Kafka, transactional, 1 s checkpoints")
print("| query | processes | seconds | events/s | ratio to 1 process | ratio to plain | ubik CPU-µs per event | first stages | keyed stage | rest of ubik | broker CPU-µs per event |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
us = lambda cpu: f"{float(cpu) / n * 1e6:.2f}"
for q, p, s, u, b, first, keyed in rows:
    r = rate[(q, p)]
    one, plain = rate.get((q, "1")), rate.get((q, "plain"))
    ratios = f"{r/one:.2f} | {r/plain:.2f}" if one and plain else "- | -"
    staged = float(first) + float(keyed) > 0
    split = f"{us(first)} | {us(keyed)} | {us(float(u) - float(first) - float(keyed))}" if staged else "- | - | -"
    print(f"| {q} | {p} | {float(s):.1f} | {r/1e3:.0f} K | {ratios} | {us(u)} | {split} | {us(b)} |")
print("\n| query | topic | bytes per event (on disk, compressed) |")
print("|---|---|---|")
for l in open(sys.argv[3]):
    q, t, b = l.split()
    if int(b):
        print(f"| {q} | {t} | {int(b) / n:.1f} |")
PY
