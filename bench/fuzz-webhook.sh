#!/usr/bin/env bash
# Long-running property fuzzing of the webhook request-body path (content
# type, gzip, NDJSON/array splitting, decode at the door) and of the JSON
# decoder, the Avro decoder and the Debezium envelope, one target after the other (one core). Each prints its
# executions and findings (each finding with its shrunk input); the exit
# status is non-zero if any target found something.
#
#   bench/fuzz-webhook.sh [SECONDS_PER_TARGET=600] [TARGETS="body decoder avro debezium debezium_avro"]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SECS=${1:-600}
TARGETS=${2:-"body decoder avro debezium debezium_avro"}
cargo build --quiet -p ubik-fuzz
BIN=${CARGO_TARGET_DIR:-target}/debug
status=0
for t in $TARGETS; do
  echo "== fuzz_$t for ${SECS}s"
  # Panics inside a case are caught and reported as findings; their
  # default messages would only repeat them.
  RUST_BACKTRACE=0 "$BIN/fuzz_$t" "$SECS" 2> >(grep -v -e "^thread '" -e "^note:" >&2) || status=1
done
exit $status
