#!/usr/bin/env bash
# How long a consumer group stalls when a member dies. Two ubik processes (each --threads 1)
# share an 8-partition topic keyed by merchant (--partitioned-by merchant), Kafka to Kafka,
# transactional, 1 s checkpoints, the per-merchant per-minute aggregation of bench/group-scale.sh.
# Once every task has checkpointed and both members own tasks, one member is killed -9. The stall
# is the time from the kill until each task the dead member owned that still had input then has
# checkpointed past where it stood: the dead
# member's tasks are reassigned when the broker gives up on it (session.timeout.ms), and their
# new owner restores them from the state topic and reads on. Measured with the client's default
# session timeout, and with the shorter one the docs recommend (SHORT_FLAGS).
# Builds release; starts the test broker.
#
#   bench/group-failover.sh [EVENTS=4000000]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
N=${1:-4000000}
source bench/common.sh
B=$(testing/kafka/broker.sh start | tail -1)
JSONL=$(events_jsonl "$N")
RUN=$(date +%s)-$$
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; drop_topics "$B" "$RUN"; rm -rf "$WORK"' EXIT
IN=group-failover-$RUN
echo "== loading $N events into $IN (8 partitions, keyed by merchant)" >&2
"$BENCH" kafka-load "$B" "$IN" "$JSONL" 8 merchant >/dev/null
Q="SELECT merchant, TUMBLE(ts, INTERVAL '1 MINUTE') AS w, count(*) AS n, sum(amount) AS total FROM orders GROUP BY merchant, TUMBLE(ts, INTERVAL '1 MINUTE')"
# "task owner position end" of every task that has checkpointed (the first table of `ubik
# status`; a member's client id is ubik-PID).
positions() { # group
  "$UBIK" status --group "$1" --from "kafka://$B/$IN" 2>/dev/null |
    awk '/^task /{t++; next} t==1 && $1 ~ /^[0-9]+$/ && $4 ~ /^[0-9]+$/ {print $1, $2, $4, $5}'
}
SHORT_FLAGS=(-X session.timeout.ms=6000 -X heartbeat.interval.ms=500)
now() { date +%s.%N; }
echo "| session timeout | stall after kill -9 (s) | tasks waited for |"
echo "|---|---|---|"
for setting in default short; do
  G=group-failover-$RUN-$setting
  extra=()
  [[ $setting == short ]] && extra=("${SHORT_FLAGS[@]}")
  pids=()
  for i in 1 2; do
    "$UBIK" run "$Q" --table orders --from "kafka://$B/$IN?end=latest" \
      --to "kafka://$B/$G-out" --group "$G" --partitioned-by merchant \
      --checkpoint "$WORK/ck-$setting-$i" --checkpoint-interval 1s --threads 1 \
      --schema "merchant VARCHAR, ts TIMESTAMP, amount DOUBLE" --lateness 0s -q \
      "${extra[@]}" 2>"$WORK/$setting-$i.log" &
    pids+=($!)
  done
  # Every task has checkpointed, and the member to kill owns tasks with input left.
  victim=ubik-${pids[1]}
  until positions "$G" >"$WORK/at-kill" && [[ $(wc -l <"$WORK/at-kill") -eq 8 ]] &&
    awk -v v="$victim" '$2 == v && $3 < $4 {n++} END {exit !n}' "$WORK/at-kill"; do
    sleep 0.2
  done
  kill -9 "${pids[1]}"
  killed=$(now)
  wait "${pids[1]}" 2>/dev/null || true
  # The dead member's tasks that still had input, and where each had checkpointed.
  awk -v v="$victim" '$2 == v && $3 < $4 {print $1, $3}' "$WORK/at-kill" >"$WORK/waiting"
  waiting=$(wc -l <"$WORK/waiting")
  while :; do
    positions "$G" >"$WORK/now"
    behind=$(awk 'NR == FNR {at[$1] = $2; next} ($1 in at) && $3 <= at[$1] {n++} END {print n + 0}' \
      "$WORK/waiting" "$WORK/now")
    [[ $behind -eq 0 ]] && break
    sleep 0.2
  done
  stall=$(echo "$(now) - $killed" | bc -l)
  kill "${pids[0]}" 2>/dev/null || true
  wait 2>/dev/null || true
  label=$([[ $setting == default ]] && echo "client default (45 s)" || echo "${SHORT_FLAGS[*]}")
  printf "| %s | %.1f | %d of 8 |\n" "$label" "$stall" "$waiting"
done
