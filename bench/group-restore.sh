#!/usr/bin/env bash
# A consumer-group task's state on the group's state topic, continuous GROUP BY over KEYS
# distinct keys on a one-partition topic:
#
# 1. Restore: one member aggregates the keys, checkpoints and stops; a second member with an
#    empty local directory takes the task over and restores it from Kafka. Prints the bytes
#    restored, the replica read + install time and the whole task start.
# 2. Bytes per checkpoint when 1% of the keys change: a member loads the keys and stops; then
#    ROUNDS x KEYS/100 updates (each round touches 1% of the keys) are appended and the member
#    resumes, checkpointing every KEYS/100 records. Prints the bytes each checkpoint of that
#    second run sent to the state topic, for this build and, side by side, for BEFORE (an
#    earlier `ubik`) if given. This build's first
#    checkpoint after a restart uploads the state whole (a new writer owns only its own files),
#    so the later checkpoints are reported apart.
#
#   [BEFORE=/path/to/old/ubik] bench/group-restore.sh [KEYS=1000000] [ROUNDS=10]
# UBIK=... BENCH=... use given binaries instead of building release.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
KEYS=${1:-1000000}
ROUNDS=${2:-10}
source bench/common.sh
B=$(testing/kafka/broker.sh start | tail -1)
RUN=$(date +%s)-$$
WORK=$(mktemp -d)
trap 'drop_topics "$B" "$RUN"; rm -rf "$WORK"' EXIT
STEP=$((KEYS / 100))
python3 -c "
import sys
for i in range($KEYS):
    sys.stdout.write('{\"k\":\"key-%07d\",\"v\":%d}\n' % (i, i % 1000))
" > "$WORK/in.jsonl"
# Round r touches keys r*STEP .. (r+1)*STEP-1 (spread over the key space by a stride).
python3 -c "
import sys
keys, step, rounds = $KEYS, $STEP, $ROUNDS
for r in range(rounds):
    for j in range(step):
        sys.stdout.write('{\"k\":\"key-%07d\",\"v\":%d}\n' % ((j * 100 + r) % keys, r))
" > "$WORK/updates.jsonl"
"$BENCH" kafka-load "$B" "restore-in-$RUN" "$WORK/in.jsonl" 1 >/dev/null
member() { # BINARY GROUP CHECKPOINT_DIR LOG [FLAGS...]
  local bin=$1 group=$2 ck=$3 log=$4
  shift 4
  UBIK_LOG=info,ubik_runtime::pipeline=debug,ubik_kafka::state=debug \
    "$bin" run "SELECT k, count(*) AS n, sum(v) AS total FROM t GROUP BY k" \
    --from "kafka://$B/restore-in-$RUN?end=latest" --table t --schema "k VARCHAR, v BIGINT" \
    --to "kafka://$B/restore-out-$group" --group "$group" --partitioned-by k \
    --checkpoint "$ck" -q "$@" 2>"$log"
}

# 1. Restore.
member "$UBIK" "restore-$RUN" "$WORK/ck-a" "$WORK/a.log"
member "$UBIK" "restore-$RUN" "$WORK/ck-b" "$WORK/b.log"
restored=$(grep "restored the checkpoint from its replica" "$WORK/b.log" || true)
started=$(grep "task started" "$WORK/b.log" || true)
[[ -n $restored ]] || { echo "the second member did not restore from the state topic:"; cat "$WORK/b.log"; exit 1; }
bytes=$(sed -E 's/.*bytes=([0-9]+).*/\1/' <<<"$restored")
read_ms=$(sed -E 's/.* ms=([0-9]+).*/\1/' <<<"$restored")
start_ms=$(sed -E 's/.* ms=([0-9]+).*/\1/' <<<"$started")
echo "restore: keys=$KEYS state_bytes=$bytes replica_read_install_ms=$read_ms task_start_ms=$start_ms"

# 2. Bytes per checkpoint: the base load for each build, then the updates, then the resumes.
builds=(after)
[[ -n ${BEFORE:-} ]] && builds=(before after)
bin_of() { if [[ $1 == before ]]; then echo "$BEFORE"; else echo "$UBIK"; fi; }
for b in "${builds[@]}"; do
  member "$(bin_of "$b")" "delta-$b-$RUN" "$WORK/ck-$b" "$WORK/$b-base.log"
done
# Appended by a pass-through query (kafka-load makes new topics only).
"$UBIK" run "SELECT k, v FROM t" --from "$WORK/updates.jsonl" --table t --schema "k VARCHAR, v BIGINT" \
  --to "kafka://$B/restore-in-$RUN" -q 2>/dev/null
# Bytes sent to the state topic per checkpoint, from the debug logs: this build logs each
# replication; a build that replicated whole snapshots sent its engine state each time.
sent() { # LOG
  if grep -q "checkpoint replicated" "$1"; then
    grep "checkpoint replicated" "$1"
  else
    grep "checkpoint written" "$1"
  fi | sed -E 's/.* bytes=([0-9]+).*/\1/'
}
echo "state topic bytes per checkpoint, keys=$KEYS, updates=$((STEP * ROUNDS)) (each round of $STEP touches 1% of the keys):"
echo "| build | checkpoints | updates per checkpoint | first checkpoint | later checkpoints (median) |"
echo "|---|---|---|---|---|"
for b in "${builds[@]}"; do
  member "$(bin_of "$b")" "delta-$b-$RUN" "$WORK/ck-$b" "$WORK/$b.log" --checkpoint-every "$STEP" --batch-size 1000
  saves=$(sent "$WORK/$b.log")
  n=$(wc -l <<<"$saves")
  first=$(head -1 <<<"$saves")
  later=$(tail -n +2 <<<"$saves" | sort -g | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]}')
  echo "| $b | $n | $((STEP * ROUNDS / n)) | $first | ${later:--} |"
done
