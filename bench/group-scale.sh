#!/usr/bin/env bash
# Scale-out over a consumer group: 1, 2 and 4 ubik processes (each
# --threads 1) share an 8-partition topic, Kafka to Kafka, transactional,
# the per-merchant per-minute aggregation of bench/kafka.sh. Two inputs:
# `keyed` by merchant (--partitioned-by merchant: each task runs the whole
# query) and `spread` (no key: the group repartitions by merchant through
# its internal topic), so the ratio of the two is the repartition step's cost.
# A run's time is from starting the members until `ubik status` shows every
# task's last checkpoint at the end of its partition (and, repartitioned,
# every keyed task's at the end of the repartition topic), joining and
# rebalancing included. Prints events/s and the ratios.
# Builds release; starts the test broker.
#
#   bench/group-scale.sh [EVENTS=2000000] [PROCESSES="1 2 4"] [MODES="keyed spread"]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
N=${1:-2000000}
PROCS=${2:-"1 2 4"}
MODES=${3:-"keyed spread"}
source bench/common.sh
B=$(testing/kafka/broker.sh start | tail -1)
JSONL=$(events_jsonl "$N")
RUN=$(date +%s)-$$
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; drop_topics "$B" "$RUN"; rm -rf "$WORK"' EXIT
for mode in $MODES; do
  echo "== loading $N events into group-scale-$mode-$RUN (8 partitions, $mode)"
  case $mode in
  keyed) "$BENCH" kafka-load "$B" "group-scale-$mode-$RUN" "$JSONL" 8 merchant >/dev/null ;;
  spread) "$BENCH" kafka-load "$B" "group-scale-$mode-$RUN" "$JSONL" 8 >/dev/null ;;
  *) echo "unknown mode $mode (keyed, spread)" >&2; exit 2 ;;
  esac
done
Q="SELECT merchant, TUMBLE(ts, INTERVAL '1 MINUTE') AS w, count(*) AS n, sum(amount) AS total, avg(amount) AS mean FROM orders GROUP BY merchant, TUMBLE(ts, INTERVAL '1 MINUTE')"
# Every task checkpointed at its end: the input tasks' lag (column 6 of
# the first table) and, repartitioned, the keyed tasks' (column 5 of the
# second) are 0.
done_all() { # group input
  "$UBIK" status --group "$1" --from "kafka://$B/$2" 2>/dev/null |
    awk -v keyed="$3" '/^task /{t++; next} $1 !~ /^[0-9]+$/ {next} t==1 {n++; if ($6 != "0") behind++}
      t==2 {k++; if ($5 != "0") behind++}
      END {exit !(n == 8 && behind == 0 && (keyed == 0 || k == 8))}'
}
# CPU seconds a process has used (user + system).
cpu() { awk -v hz="$(getconf CLK_TCK)" '{printf "%.2f", ($14 + $15) / hz}' "/proc/$1/stat" 2>/dev/null || echo 0; }
BROKER_PID=$(cat "${UBIK_CACHE_DIR:-$HOME/.cache/ubik}/kafka-run/${UBIK_KAFKA_PORT:-39092}/kafka.pid")
for mode in $MODES; do
  for p in $PROCS; do
    G=group-scale-$RUN-$mode-$p
    IN=group-scale-$mode-$RUN
    partitioning=(--partitioned-by merchant)
    [[ $mode == spread ]] && partitioning=()
    s=$(date +%s.%N)
    broker0=$(cpu "$BROKER_PID")
    pids=()
    for i in $(seq "$p"); do
      "$UBIK" run "$Q" --table orders --from "kafka://$B/$IN?end=latest" \
        --to "kafka://$B/group-scale-out-$RUN-$mode-$p" --group "$G" "${partitioning[@]}" \
        --checkpoint "$WORK/ck-$mode-$p-$i" --checkpoint-interval 1s --threads 1 \
        --schema "merchant VARCHAR, ts TIMESTAMP, amount DOUBLE" --lateness 0s -q 2>"$WORK/$mode-$p-$i.log" &
      pids+=($!)
    done
    until done_all "$G" "$IN" "$([[ $mode == spread ]] && echo 1 || echo 0)"; do sleep 0.3; done
    e=$(date +%s.%N)
    ubik_cpu=0
    for pid in "${pids[@]}"; do ubik_cpu=$(echo "$ubik_cpu + $(cpu "$pid")" | bc -l); done
    broker_cpu=$(echo "$(cpu "$BROKER_PID") - $broker0" | bc -l)
    kill $(jobs -p) 2>/dev/null || true
    wait || true
    secs=$(echo "$e - $s" | bc -l)
    echo "$mode $p $secs $ubik_cpu $broker_cpu" >>"$WORK/times"
    echo "  $mode, $p process(es): $secs s, ubik $ubik_cpu CPU-s, broker $broker_cpu CPU-s" >&2
  done
done
# Bytes per event through the broker (on disk, as the producers compressed
# them) of each topic of the largest run: for the capacity model.
DATA=${UBIK_CACHE_DIR:-$HOME/.cache/ubik}/kafka-run/${UBIK_KAFKA_PORT:-39092}/data
p=${PROCS##* }
for mode in $MODES; do
  G=group-scale-$RUN-$mode-$p
  for t in "group-scale-$mode-$RUN:input" "$G-ubik-repartition:repartition" \
    "group-scale-out-$RUN-$mode-$p:output" "$G-ubik-checkpoints:checkpoints"; do
    bytes=$( (du -scb "$DATA/${t%%:*}"-[0-9]* 2>/dev/null || true) | tail -1 | cut -f1)
    echo "$mode ${t##*:} ${bytes:-0}" >>"$WORK/bytes"
  done
done
"$PY" - "$N" "$WORK/times" "$WORK/bytes" <<'PY'
import sys
n = int(sys.argv[1])
rows = [l.split() for l in open(sys.argv[2])]
rate = {(m, p): n / float(s) for m, p, s, _, _ in rows}
print(f"== {n} events, 8 partitions, Kafka to Kafka, transactional, 1 s checkpoints")
print("| input | processes | seconds | events/s | ratio to 1 process | ratio to keyed | ubik events per CPU-s | broker events per CPU-s |")
print("|---|---|---|---|---|---|---|---|")
for m, p, s, u, b in rows:
    r = rate[(m, p)]
    one = rate.get((m, "1"))
    keyed = rate.get(("keyed", p))
    ratios = f"{r/one:.2f} | {r/keyed:.2f}" if one and keyed else "- | -"
    per = lambda cpu: f"{n / float(cpu) / 1e3:.0f} K" if float(cpu) > 0 else "-"
    print(f"| {m} | {p} | {float(s):.1f} | {r/1e3:.0f} K | {ratios} | {per(u)} | {per(b)} |")
print("\n| input | topic | bytes per event (on disk, compressed) |")
print("|---|---|---|")
for l in open(sys.argv[3]):
    m, t, b = l.split()
    if int(b):
        print(f"| {m} | {t} | {int(b) / n:.1f} |")
PY
