#!/usr/bin/env bash
# Nexmark, engine only (issue: Nexmark), release build: each query over a
# stream of EVENTS events (all kinds) from the in-process generator, through
# the engine on one thread into a counting sink. Prints events/s (engine
# alone, and with the generator's time, as the peers' figures include
# theirs), next to Feldera's published per-core figure.
#
#   bench/nexmark.sh [EVENTS=10000000] [QUERIES="q0 ... q22": every bench/nexmark query] [ROUNDS=3]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
EVENTS=${1:-10000000}
QUERIES=${2:-"q0 q1 q2 q3 q4 q5 q6 q7 q8 q9 q11 q14 q15 q16 q17 q18 q19 q20 q21 q22"}
ROUNDS=${3:-3}
source bench/common.sh

# Feldera, benchmark/README (16 cores), divided by 16: events/s per core.
declare -A FELDERA=([q0]=436000 [q1]=412000 [q2]=422000 [q5]=412000 [q7]=196000 [q8]=415000)
printf '%-4s %14s %18s %16s %12s %14s\n' query "engine ev/s" "with generator" "Feldera/core" "ratio" "peak state"
for q in $QUERIES; do
  : > "$CACHE/nx.$q"
  for _ in $(seq "$ROUNDS"); do
    "$BENCH" nexmark "bench/nexmark/$q.sql" "$EVENTS" >> "$CACHE/nx.$q"
  done
  "$PY" - "$CACHE/nx.$q" "${FELDERA[$q]:-0}" "$q" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
engine = statistics.median(r["events_per_s"] for r in runs)
full = statistics.median(r["events_per_s_with_generation"] for r in runs)
state = max(r["peak_state_bytes"] for r in runs)
peer = int(sys.argv[2])
ratio = f"{full / peer:.2f}x" if peer else "-"
print(f"{sys.argv[3]:<4} {engine:>14,.0f} {full:>18,.0f} {peer:>16,} {ratio:>12} {state:>14,}")
PY
done
