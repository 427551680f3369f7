#!/usr/bin/env bash
# Issue benchmarks of the engine, measured side by side in one run (ratios,
# not absolute times: the machine is shared and noisy). Builds release.
#
#   bench/engine.sh [EVENTS_ARROW=10000000] [EVENTS_JSONL=1000000] [KEYS=1000000] [ROUNDS=3]
#
# 1. Arrow in memory -> aggregated changelog rows: ubik's engine vs DuckDB's
#    GROUP BY over the same Arrow table (per-merchant per-minute count/sum/avg).
# 2. JSONL file -> changelog on stdout (to /dev/null): `ubik run` vs DuckDB
#    read_json + the same GROUP BY.
# 3. Checkpoint of KEYS open (group, window) keys: time and bytes per key.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
N_ARROW=${1:-10000000}
N_JSONL=${2:-1000000}
KEYS=${3:-1000000}
ROUNDS=${4:-3}
source bench/common.sh

ARROW=$CACHE/events-$N_ARROW.arrow
JSONL=$CACHE/events-$N_JSONL.jsonl
[[ -s $ARROW ]] || "$PY" bench/peers.py make-arrow "$N_ARROW" "$ARROW"
[[ -s $JSONL ]] || "$PY" bench/peers.py make-jsonl "$N_JSONL" "$JSONL"

Q="SELECT merchant, TUMBLE(ts, INTERVAL '1 MINUTE') AS w, count(*) AS n, sum(amount) AS total, avg(amount) AS mean FROM events GROUP BY merchant, TUMBLE(ts, INTERVAL '1 MINUTE')"
field() { "$PY" -c "import json,sys; print(json.loads(sys.stdin.readline())['$1'])"; }

echo "== 1. Arrow in memory -> changelog rows ($N_ARROW events, per-merchant per-minute count/sum/avg)"
: > "$CACHE/r1.ubik"; : > "$CACHE/r1.duck"
for _ in $(seq "$ROUNDS"); do
  "$BENCH" arrow-agg "$ARROW" "$Q" | tee -a /dev/stderr | field seconds >> "$CACHE/r1.ubik"
  "$PY" bench/peers.py duckdb-arrow "$ARROW" | tee -a /dev/stderr | field seconds >> "$CACHE/r1.duck"
done
U=$(median < "$CACHE/r1.ubik"); D=$(median < "$CACHE/r1.duck")
"$PY" -c "n=$N_ARROW; u=$U; d=$D; print(f'ubik {n/u/1e6:.1f} M ev/s, duckdb {n/d/1e6:.1f} M ev/s, ubik/duckdb speed ratio {d/u:.2f}x (median of $ROUNDS)')"

echo "== 2. JSONL file -> changelog to /dev/null ($N_JSONL events)"
: > "$CACHE/r2.ubik"; : > "$CACHE/r2.duck"
for _ in $(seq "$ROUNDS"); do
  s=$(date +%s.%N)
  "$UBIK" run "$Q" --from "file://$JSONL" --schema "merchant VARCHAR, ts TIMESTAMP, amount DOUBLE" --lateness 0s -q > /dev/null
  e=$(date +%s.%N)
  echo "$e - $s" | bc -l | tee -a /dev/stderr >> "$CACHE/r2.ubik"
  "$PY" bench/peers.py duckdb-jsonl "$JSONL" | tee -a /dev/stderr | field seconds >> "$CACHE/r2.duck"
done
U=$(median < "$CACHE/r2.ubik"); D=$(median < "$CACHE/r2.duck")
"$PY" -c "n=$N_JSONL; u=$U; d=$D; print(f'ubik {n/u/1e6:.2f} M ev/s (whole process), duckdb {n/d/1e6:.2f} M ev/s, ubik/duckdb speed ratio {d/u:.2f}x (median of $ROUNDS)')"

echo "== 3. Checkpoint of $KEYS open (group, window) keys"
"$BENCH" checkpoint "$KEYS"
