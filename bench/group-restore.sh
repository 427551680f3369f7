#!/usr/bin/env bash
# Restore time of a consumer-group task from the group's state topic: one
# member aggregates KEYS distinct keys (continuous GROUP BY) on a
# one-partition topic, checkpoints and stops; a second member with an empty
# local directory takes the task over and restores it from Kafka. Prints the
# state bytes, the replica read + install time and the whole task start
# (replica, engine state decode, source and producer).
#
#   bench/group-restore.sh [KEYS=1000000]
# UBIK=... BENCH=... use given binaries instead of building release.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
KEYS=${1:-1000000}
if [[ -z ${UBIK:-} ]]; then
  cargo build --release --quiet -p ubik-cli -p ubik-bench
  UBIK=target/release/ubik BENCH=target/release/ubik-bench
fi
B=$(testing/kafka/broker.sh start | tail -1)
RUN=$(date +%s)-$$
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
python3 -c "
import sys
for i in range($KEYS):
    sys.stdout.write('{\"k\":\"key-%07d\",\"v\":%d}\n' % (i, i % 1000))
" > "$WORK/in.jsonl"
"$BENCH" kafka-load "$B" "restore-in-$RUN" "$WORK/in.jsonl" 1 >/dev/null
member() {
  RUST_LOG=info "$UBIK" run "SELECT k, count(*) AS n, sum(v) AS total FROM t GROUP BY k" \
    --from "kafka://$B/restore-in-$RUN?end=latest" --table t --schema "k VARCHAR, v BIGINT" \
    --to "kafka://$B/restore-out-$RUN" --group "restore-$RUN" --partitioned-by k \
    --checkpoint "$1" -q 2>"$2"
}
member "$WORK/ck-a" "$WORK/a.log"
member "$WORK/ck-b" "$WORK/b.log"
restored=$(grep "restored the checkpoint from its replica" "$WORK/b.log" || true)
started=$(grep "task started" "$WORK/b.log" || true)
[[ -n $restored ]] || { echo "the second member did not restore from the state topic:"; cat "$WORK/b.log"; exit 1; }
bytes=$(sed -E 's/.*bytes=([0-9]+).*/\1/' <<<"$restored")
read_ms=$(sed -E 's/.* ms=([0-9]+).*/\1/' <<<"$restored")
start_ms=$(sed -E 's/.* ms=([0-9]+).*/\1/' <<<"$started")
echo "keys=$KEYS state_bytes=$bytes replica_read_install_ms=$read_ms task_start_ms=$start_ms"
