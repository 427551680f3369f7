#!/usr/bin/env bash
# Webhook ingest benchmark: events acknowledged durably (fsynced to the Arrow
# IPC buffer before the 2xx), with wrk over loopback, while a pass-through
# pipeline drains the buffer to /dev/null. Builds release; needs wrk.
#
#   bench/webhook.sh [SECONDS=15] [CONNECTIONS=64]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SECS=${1:-15}
CONNS=${2:-64}
command -v wrk >/dev/null || { echo "wrk is needed (apt-get install wrk)"; exit 1; }
cargo build --release --quiet -p ubik-cli
DIR=$(mktemp -d)
PORT=$((20000 + RANDOM % 20000))
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$DIR"' EXIT
target/release/ubik run "SELECT * FROM hooks" \
  --from "webhook://127.0.0.1:$PORT/hooks?buffer=$DIR/buf&max_rows=20000&max_interval=200ms&max_buffer_bytes=4GiB" \
  --schema "id VARCHAR, type VARCHAR, ts TIMESTAMP, amount BIGINT, currency VARCHAR" \
  --checkpoint "$DIR/ck" --checkpoint-interval 1s -q > /dev/null &
PID=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null && break; sleep 0.1; done

echo "== 1 event per request, $CONNS connections, ${SECS}s"
wrk -t2 -c"$CONNS" -d"${SECS}s" --latency -s bench/wrk_one.lua "http://127.0.0.1:$PORT/hooks" | tee "$DIR/one.txt"
echo "== 100 NDJSON events per request, $CONNS connections, ${SECS}s"
wrk -t2 -c"$CONNS" -d"${SECS}s" --latency -s bench/wrk_ndjson.lua "http://127.0.0.1:$PORT/hooks" | tee "$DIR/ndjson.txt"
echo "== endpoint metrics"
curl -s "http://127.0.0.1:$PORT/metrics" | grep -E "^ubik_webhook_(events_total|group_commits_total|fsync_seconds_(sum|count)|requests_total)"
one=$(awk '/Requests\/sec/ {print $2}' "$DIR/one.txt")
nd=$(awk '/Requests\/sec/ {print $2}' "$DIR/ndjson.txt")
p99=$(awk '$1=="99%" {print $2}' "$DIR/one.txt")
echo "summary: 1-event requests: ${one} events/s acknowledged, p99 ${p99}; 100-event requests: $(echo "$nd * 100" | bc) events/s"
