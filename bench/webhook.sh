#!/usr/bin/env bash
# Webhook benchmark, the current tree against a baseline build side by side
# in one run (same machine, same minute):
#
# - acknowledged rate: events acknowledged durably (decoded at the door and
#   fsynced to the Arrow IPC buffer before the 2xx), with wrk over loopback,
#   1 event per request and 100 NDJSON events per request, while a
#   pass-through pipeline drains the buffer to /dev/null;
# - read side: events/s from a filled buffer to the changelog (a pipeline
#   replaying a buffer it did not read yet, to stdout, until every event is out).
#
#   bench/webhook.sh [SECONDS=15] [CONNECTIONS=64]
#   BASE=<git ref> (default main; BASE=none skips the baseline)
#   PROFILE=release|dev (default release; dev compiles far faster, and the
#   ratio of the two builds is still meaningful)
# Needs wrk and curl.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SECS=${1:-15}
CONNS=${2:-64}
BASE=${BASE:-main}
PROFILE=${PROFILE:-release}
command -v wrk >/dev/null || { echo "wrk is needed (apt-get install wrk)"; exit 1; }
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
DIR=$(mktemp -d)
PID=
cleanup() {
  [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
  [ -d "$DIR/base-src" ] && git worktree remove --force "$DIR/base-src" >/dev/null 2>&1
  rm -rf "$DIR"
}
trap cleanup EXIT
flag=(); [ "$PROFILE" = release ] && flag=(--release)
out=$([ "$PROFILE" = release ] && echo release || echo debug)

# Both builds share the target directory (dependencies compile once); each
# binary is copied out before the other is built. The current tree builds
# first: the workspace's own crates get the same artifact names in both
# trees, and cargo judges a path crate by source mtimes, so a baseline
# artifact newer than this tree's sources would be taken for fresh.
builds=()
# Touched, this tree's crates are newer than any baseline artifact left in
# the shared target directory by an earlier run.
find crates -name '*.rs' -exec touch {} +
CARGO_TARGET_DIR=$TARGET cargo build "${flag[@]}" --quiet -p ubik-cli
cp "$TARGET/$out/ubik" "$DIR/ubik-new"
if [ "$BASE" != none ]; then
  git worktree add --detach "$DIR/base-src" "$BASE" >/dev/null 2>&1
  (cd "$DIR/base-src" && CARGO_TARGET_DIR=$TARGET cargo build "${flag[@]}" --quiet -p ubik-cli)
  cp "$TARGET/$out/ubik" "$DIR/ubik-base"
  builds+=(base)
fi
builds+=(new)

SCHEMA="id VARCHAR, type VARCHAR, ts TIMESTAMP, amount BIGINT, currency VARCHAR"
start() { # build port url-options [extra args...]
  local b=$1 port=$2 opts=$3; shift 3
  "$DIR/ubik-$b" run "SELECT * FROM hooks" \
    --from "webhook://127.0.0.1:$port/hooks?buffer=$DIR/buf-$b-$port&$opts" \
    --schema "$SCHEMA" "$@" -q > /dev/null 2>&1 &
  PID=$!
  for _ in $(seq 200); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && return; sleep 0.1; done
  echo "the $b build did not come up"; exit 1
}
stop() { kill -9 "$PID" 2>/dev/null; wait "$PID" 2>/dev/null || true; PID=; }
rate() { awk '/Requests\/sec/ {print $2}' "$1"; }

declare -A ONE ND P99 READ
acked() { # build: one run of both request shapes, rates added to the totals
  local b=$1 port=$((20000 + RANDOM % 20000))
  start "$b" "$port" "max_rows=20000&max_interval=200ms&max_buffer_bytes=4GiB" \
    --checkpoint "$DIR/ck-$b-$port" --checkpoint-interval 1s
  echo "== $b: 1 event per request, $CONNS connections, ${SECS}s"
  wrk -t2 -c"$CONNS" -d"${SECS}s" --latency -s bench/wrk_one.lua "http://127.0.0.1:$port/hooks" > "$DIR/one.txt"
  grep -E "Requests/sec|Non-2xx|99%" "$DIR/one.txt" || true
  echo "== $b: 100 NDJSON events per request, $CONNS connections, ${SECS}s"
  wrk -t2 -c"$CONNS" -d"${SECS}s" --latency -s bench/wrk_ndjson.lua "http://127.0.0.1:$port/hooks" > "$DIR/nd.txt"
  grep -E "Requests/sec|Non-2xx|99%" "$DIR/nd.txt" || true
  stop
  ONE[$b]=$(echo "${ONE[$b]:-0} + $(rate "$DIR/one.txt") / ${#builds[@]}" | bc -l)
  ND[$b]=$(echo "${ND[$b]:-0} + $(rate "$DIR/nd.txt") * 100 / ${#builds[@]}" | bc -l)
  P99[$b]="${P99[$b]:-}$(awk '$1=="99%" {print $2}' "$DIR/one.txt") "
}
# With a baseline each build runs twice, in the order
# base new new base: a drift of the machine's load hits both alike.
order=("${builds[@]}")
[ ${#builds[@]} -eq 2 ] && order=(base new new base)
for b in "${order[@]}"; do acked "$b"; done

for b in "${builds[@]}"; do
  # Read side: fill a buffer no flush drains (no checkpoint, so nothing is
  # truncated), kill it, then time a replay of all of it to the changelog.
  port=$((20000 + RANDOM % 20000))
  opts="max_rows=10000000&max_bytes=64GiB&max_interval=1h&max_buffer_bytes=64GiB"
  start "$b" "$port" "$opts"
  wrk -t2 -c"$CONNS" -d"$((SECS / 3 + 1))s" -s bench/wrk_ndjson.lua "http://127.0.0.1:$port/hooks" > /dev/null
  n=$(curl -s "http://127.0.0.1:$port/metrics" | awk '/^ubik_webhook_events_total/ {print $2}')
  stop
  # Counted through a FIFO: the clock stops at the last event out, and
  # the pipeline (still serving its endpoint) is stopped after.
  rm -f "$DIR/fifo"; mkfifo "$DIR/fifo"
  t0=$(date +%s.%N)
  "$DIR/ubik-$b" run "SELECT * FROM hooks" \
    --from "webhook://127.0.0.1:$port/hooks?buffer=$DIR/buf-$b-$port&max_rows=20000&max_interval=10ms" \
    --schema "$SCHEMA" -q 2>/dev/null > "$DIR/fifo" &
  PID=$!
  got=$(head -n "$n" "$DIR/fifo" | wc -l)
  t1=$(date +%s.%N)
  stop
  READ[$b]=$(echo "$got / ($t1 - $t0)" | bc)
  echo "== $b: read side: $got of $n buffered events to the changelog in $(echo "$t1 - $t0" | bc) s"
done

echo
echo "summary ($PROFILE build, $CONNS connections, ${SECS}s per run; events/s):"
printf "%-6s %14s %18s %16s %16s\n" build "1-event acked" "p99 (each run)" "100-event acked" "read side"
for b in "${builds[@]}"; do
  printf "%-6s %14.0f %18s %16.0f %16.0f\n" "$b" "${ONE[$b]}" "${P99[$b]}" "${ND[$b]}" "${READ[$b]}"
done
if [ "$BASE" != none ]; then
  echo "new/base: 1-event $(echo "scale=3; ${ONE[new]} / ${ONE[base]}" | bc), 100-event $(echo "scale=3; ${ND[new]} / ${ND[base]}" | bc), read side $(echo "scale=3; ${READ[new]} / ${READ[base]}" | bc)"
fi
