#!/usr/bin/env bash
# State beyond memory, side by side with an earlier build (BEFORE: its `ubik` binary, e.g. built
# from a worktree of the commit before the state store; without it only this build runs).
# The query is the seed's continuous GROUP BY over the demo source, keys uniform unless said.
#
#   BEFORE=/path/to/old/ubik bench/state-scale.sh [SECTIONS="oracle checkpoint held tick budget skew ranks regroup windows joins over interval sessions"]
#
# oracle      spilling run (--state-memory 16MiB) == run in memory, byte for byte; its latest row
#             per key == DuckDB's GROUP BY over the same events (ORACLE_EVENTS, default 2 M, 1 M keys)
# checkpoint  bytes written and milliseconds per checkpoint when 1% of the keys changed since the
#             previous one, for CKPT_KEYS (default "1000000 5000000"): load 3 events per key,
#             checkpoint, then resume and checkpoint every keys/100 events, 5 times
# held        rows held for the watermark: a 1-minute emit interval (the rows of a minute wait for
#             their emit) with a checkpoint every 5 s of event time, HELD_EVENTS (default 4 M)
#             events over HELD_KEYS (default 100 000) keys at 20 000 events per second: wall, peak
#             RSS, bytes and ms per checkpoint against the build before, the same changelog bytes
# tick        one emit tick per 100 events (rate=100) against one per 100 000, TICK_KEYS
#             (default 5 M) keys, TICK_EVENTS (default 10 M)
# large       (named only, not run by default) LARGE_EVENTS (default 200 M) events over LARGE_KEYS
#             (default 100 M) keys, about three times this machine's memory if held in memory,
#             under --state-memory LARGE_BUDGET (default 2GiB): wall, events/s, peak RSS; the
#             changelog of one key in 10 000 against DuckDB; then a resume reading 100 000 more
#             events: how long a restore of that state takes before it processes
# budget      BUDGET_EVENTS (default 60 M) events over BUDGET_KEYS (default 30 M) keys with
#             --state-memory BUDGET (default 1GiB): wall time and peak RSS, against the build
#             before (which holds everything in memory) and this build without a budget
# skew        10x more state than the budget (SKEW_KEYS, default 10 M keys, --state-memory
#             SKEW_BUDGET, default 256MiB): uniform keys against skew=0.9 (1% of the keys get
#             63% of the events), against the same without a budget
# interval    an interval join that holds every bid an hour of event time (longer than the run)
#             and Nexmark q9, INTERVAL_EVENTS (default 5 M) events, in memory and under
#             --state-memory INTERVAL_BUDGET (default 256MiB): wall, peak RSS, the same bytes
# ranks       Nexmark q18 (the latest bid per bidder and auction: a top-1 whose state grows with
#             every pair seen) over RANK_EVENTS (default 10 M) bids, in memory against
#             --state-memory RANK_BUDGET (default 64MiB): wall, peak RSS, the same changelog bytes
# regroup     an aggregation over the continuous GROUP BY (how many merchants have each count:
#             Nexmark q4's shape) over REGROUP_EVENTS (default 10 M) events of REGROUP_KEYS
#             (default 5 M) keys, in memory against --state-memory REGROUP_BUDGET (default
#             256MiB): wall, peak RSS, the same changelog bytes
# windows     10-minute HOP windows sliding by a minute (ten open windows per key) over
#             WINDOW_EVENTS (default 10 M) events, WINDOW_KEYS (default 2 M) keys, 10 000 events
#             per second of event time: wall and peak RSS in memory against --state-memory
#             WINDOW_BUDGET (default 512MiB), the same changelog bytes; then one 1-hour window
#             over CKPT_WINDOW_KEYS (default 1 M) keys, checkpointed every 5% of the keys' worth
#             of events: bytes and ms per checkpoint against the build before
# joins       Nexmark q9 (an interval join holding every open auction and its bids) and q20 (each
#             bid joined with its auction as of the bid: a versioned table holding every auction
#             seen) over JOIN_EVENTS (default 20 M) events, a checkpoint every 5% of them: wall,
#             peak RSS, bytes and ms per checkpoint against the build before, the same changelog
#             bytes; then q20 under --state-memory VERSION_BUDGET (default 64MiB): the same bytes
# over        Nexmark q6 (a moving average over each seller's auctions' winning bids: window
#             functions over a top-1 per auction, both growing with every auction seen) over
#             OVER_EVENTS (default 10 M) events, a checkpoint every 5% of them: wall, peak RSS,
#             bytes and ms per checkpoint against the build before, the same changelog bytes; then
#             under --state-memory OVER_BUDGET (default 32MiB): the same bytes
# sessions    1-minute SESSION windows over SESSION_EVENTS (default 10 M) events of SESSION_KEYS
#             (default 1 M) keys, 50 minutes of event time, kept the default 10 minutes after
#             they close, a checkpoint every 5% of the events: wall, peak RSS, bytes and ms per
#             checkpoint against the build before, the same changelog bytes
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SECTIONS=${1:-"oracle checkpoint held tick budget skew ranks regroup windows joins over interval sessions"}
RELEASE_PACKAGES=ubik-cli
source bench/common.sh
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
Q="SELECT merchant, count(*) AS n, sum(amount) AS total, max(amount) AS mx FROM orders GROUP BY merchant"
# No disorder or late rows: every event counts, so totals can be checked.
demo() { echo "demo://orders?count=$1&keys=$2&rate=${3:-100000}&disorder=0&late=0${4:+&$4}"; }

# run BIN OUT ARGS...: runs `BIN run Q ARGS...` (QUERY_FILE's query if set) with stdout to OUT;
# prints "seconds peak_rss_mb".
run() {
  local bin=$1 out=$2
  shift 2
  local query=(run "$Q")
  [[ -n ${QUERY_FILE:-} ]] && query=(run -f "$QUERY_FILE")
  /usr/bin/time -f "%e %M" -o "$WORK/time" "$bin" "${query[@]}" -q "$@" > "$out"
  awk '{printf "%s %.0f\n", $1, $2 / 1024}' "$WORK/time"
}
# checkpoint_medians LOG [FIRST]: "bytes ms pause_ms freeze_ms", the medians over the debug log's
# "checkpoint written" lines (its first FIRST only, when given): bytes written, ms until the
# checkpoint was current, ms it held the pipeline, and of those the freeze's (the rest waited
# for the previous checkpoint). Builds before the state store log only the checkpoint's bytes
# (the whole state), later ones the bytes it wrote; builds before checkpoints completed in the
# background held the pipeline for the whole checkpoint (builds before 2026-12-06 do not log the
# freeze: "-").
checkpoint_medians() {
  "$PY" - "$1" "${2:-0}" <<'PY'
import re, statistics, sys
fields = [dict(re.findall(r"(\w+)=([0-9.]+)", re.sub(r"\x1b\[[0-9;]*m", "", l)))
          for l in open(sys.argv[1]) if "checkpoint written" in l]
first = int(sys.argv[2])
fields = fields[:first] if first else fields
written = statistics.median(int(f.get("written", f["bytes"])) for f in fields)
ms = statistics.median(float(f["ms"]) for f in fields)
pause = statistics.median(float(f.get("pause_ms", f["ms"])) for f in fields)
freeze = (f"{statistics.median(float(f['freeze_ms']) for f in fields):.1f}"
          if all("freeze_ms" in f for f in fields) else "-")
print(f"{written:.0f} {ms:.0f} {pause:.1f} {freeze}")
PY
}
# fold_equals_duckdb CHANGELOG EVENTS: the latest row per key of the changelog CHANGELOG equals
# DuckDB's GROUP BY over EVENTS (the demo's events as `ubik run` prints them), key for key.
fold_equals_duckdb() {
  "$PY" - "$1" "$2" <<'PY'
import json, sys, duckdb
import pyarrow as pa
latest = {}
for line in open(sys.argv[1]):
    rec = json.loads(line)
    key, value = rec["key"]["merchant"], rec["value"]
    if value is None:
        latest.pop(key, None)
    else:
        latest[key] = (value["n"], value["total"], value["mx"])
events = [json.loads(line)["value"] for line in open(sys.argv[2])]
orders = pa.table({
    "merchant": [e["merchant"] for e in events],
    "amount": pa.array([e["amount"] for e in events], pa.float64()),
})
db = duckdb.sql("SELECT merchant, count(*), sum(amount), max(amount) FROM orders GROUP BY merchant").fetchall()
assert len(db) == len(latest), (len(db), len(latest))
for m, n, total, mx in db:
    got = latest[m]
    assert got[0] == n and got[2] == mx and abs(got[1] - total) <= 1e-9 * max(1.0, abs(total)), (m, got, n, total, mx)
print(f"DuckDB oracle: {len(db)} keys, latest row per key equal (count, max exact; sum within 1e-9)")
PY
}
builds() { if [[ -n ${BEFORE:-} ]]; then echo "before after"; else echo after; fi; }
bin_of() { if [[ $1 == before ]]; then echo "$BEFORE"; else echo "$UBIK"; fi; }

for section in $SECTIONS; do
  case $section in
  oracle)
    N=${ORACLE_EVENTS:-2000000}
    K=$((N / 2))
    echo "== oracle: $N events, $K keys; spilled (16MiB) vs in memory vs DuckDB"
    run "$UBIK" "$WORK/mem.jsonl" --from "$(demo "$N" "$K")" > /dev/null
    read -r s rss < <(run "$UBIK" "$WORK/spill.jsonl" --from "$(demo "$N" "$K")" --state-memory 16MiB)
    cmp "$WORK/mem.jsonl" "$WORK/spill.jsonl"
    echo "spilling run: ${s}s, peak ${rss} MB; its changelog equals the in-memory run's, byte for byte"
    "$UBIK" run "SELECT merchant, ts, amount FROM orders" -q --from "$(demo "$N" "$K")" > "$WORK/events.jsonl"
    fold_equals_duckdb "$WORK/spill.jsonl" "$WORK/events.jsonl"
    ;;
  checkpoint)
    echo "== checkpoint cost when 1% of the keys changed"
    echo "| keys | build | state on disk | written per checkpoint (median of 5) | ms until current | ms the pipeline waited | of which the freeze |"
    echo "|---|---|---|---|---|---|---|"
    for K in ${CKPT_KEYS:-1000000 5000000}; do
      for build in $(builds); do
        bin=$(bin_of "$build")
        rm -rf "$WORK/ck"
        LOAD=$((3 * K))
        STEP=$((K / 100))
        # A 10 ms emit grid: the events between two checkpoints (0.1 s of event time at 1 M
        # keys) are folded into the groups, not held as pending rows. The load runs unbounded
        # (the end of a bounded input would close event time) and is killed after its first
        # checkpoint, at LOAD events; the measured run resumes from it.
        "$bin" run "$Q" -q --from "$(demo 0 "$K")" --checkpoint "$WORK/ck" --checkpoint-every "$LOAD" \
          --checkpoint-interval 1h --emit-interval 10ms --lateness 0s > /dev/null 2>&1 &
        pid=$!
        until [[ -s $WORK/ck/CURRENT ]]; do sleep 0.2; done
        kill -9 "$pid"
        wait "$pid" 2> /dev/null || true
        # The first checkpoint came at a batch boundary at or after LOAD.
        at=$("$PY" -c "import json,sys; d=sys.argv[1]; print(json.load(open(d + '/' + open(d + '/CURRENT').read().strip() + '/manifest.json'))['source']['next'])" "$WORK/ck")
        UBIK_LOG=ubik_runtime::pipeline=debug "$bin" run "$Q" -q --from "$(demo $((at + 5 * STEP)) "$K")" \
          --checkpoint "$WORK/ck" --checkpoint-every "$STEP" --batch-size "$STEP" --checkpoint-interval 1h --emit-interval 10ms --lateness 0s \
          2> "$WORK/ck.log" > /dev/null
        # The first 5: the checkpoint at the end of input changed nothing more.
        read -r w ms pause freeze < <(checkpoint_medians "$WORK/ck.log" 5)
        awk -v k="$K" -v b="$build" -v d="$(du -sb "$WORK/ck" | cut -f1)" -v w="$w" -v ms="$ms" -v p="$pause" -v f="$freeze" \
          'BEGIN { printf "| %d | %s | %.0f MB | %.1f MB | %d | %.1f | %s |\n", k, b, d / 1e6, w / 1e6, ms, p, f }'
      done
    done
    ;;
  tick)
    N=${TICK_EVENTS:-10000000}
    K=${TICK_KEYS:-5000000}
    echo "== emit ticks: $N events over $K keys, one tick per 100 events (rate=100) vs per 100 000"
    echo "| build | rate=100000 | rate=100 | ratio |"
    echo "|---|---|---|---|"
    for build in $(builds); do
      bin=$(bin_of "$build")
      read -r fast _ < <(run "$bin" /dev/null --from "$(demo "$N" "$K")")
      read -r slow _ < <(run "$bin" /dev/null --from "$(demo "$N" "$K" 100)")
      echo "| $build | ${fast}s | ${slow}s | $(echo "$slow / $fast" | bc -l | cut -c1-4)x |"
    done
    ;;
  ranks)
    N=${RANK_EVENTS:-10000000}
    B=${RANK_BUDGET:-64MiB}
    echo "== Nexmark q18 (top-1 per bidder and auction), $N events, in memory against --state-memory $B"
    echo "| run | wall | peak RSS |"
    echo "|---|---|---|"
    for build in $(builds); do
      read -r s rss < <(QUERY_FILE=bench/nexmark/q18.sql run "$(bin_of "$build")" "$WORK/q18-$build.jsonl" \
        --from "nexmark://bid?events=$N")
      echo "| $build, no budget | ${s}s | ${rss} MB |"
    done
    read -r s rss < <(QUERY_FILE=bench/nexmark/q18.sql run "$UBIK" "$WORK/q18-spill.jsonl" \
      --from "nexmark://bid?events=$N" --state-memory "$B")
    echo "| after, --state-memory $B | ${s}s | ${rss} MB |"
    cmp "$WORK/q18-after.jsonl" "$WORK/q18-spill.jsonl"
    echo "the spilling run's changelog equals the in-memory run's, byte for byte ($(wc -l < "$WORK/q18-spill.jsonl") records)"
    ;;
  regroup)
    N=${REGROUP_EVENTS:-10000000}
    K=${REGROUP_KEYS:-5000000}
    B=${REGROUP_BUDGET:-256MiB}
    R="SELECT n, count(*) AS merchants, sum(total) AS spent FROM ($Q) per_merchant GROUP BY n"
    echo "== an aggregation over a continuous GROUP BY, $N events over $K keys, in memory against --state-memory $B"
    echo "| run | wall | peak RSS |"
    echo "|---|---|---|"
    echo "$R" > "$WORK/regroup.sql"
    for budget in "" "$B"; do
      read -r s rss < <(QUERY_FILE=$WORK/regroup.sql run "$UBIK" "$WORK/regroup-${budget:-memory}.jsonl" \
        --from "$(demo "$N" "$K")" ${budget:+--state-memory "$budget"})
      label="no budget"
      [[ -n $budget ]] && label="--state-memory $budget"
      echo "| $label | ${s}s | ${rss} MB |"
    done
    cmp "$WORK/regroup-memory.jsonl" "$WORK/regroup-$B.jsonl"
    echo "the spilling run's changelog equals the in-memory run's, byte for byte ($(wc -l < "$WORK/regroup-$B.jsonl") records)"
    ;;
  joins)
    N=${JOIN_EVENTS:-20000000}
    B=${VERSION_BUDGET:-64MiB}
    STEP=$((N / 20))
    nexmark=(--from "nexmark://bid?events=$N" --from "nexmark://auction?events=$N")
    echo "== Nexmark q9 (interval join) and q20 (a versioned table of every auction), $N events, a checkpoint every $STEP events"
    echo "| query | run | wall | peak RSS | written per checkpoint (median) | ms per checkpoint (median) |"
    echo "|---|---|---|---|---|---|"
    for q in q9 q20; do
      for build in $(builds); do
        rm -rf "$WORK/jck"
        read -r s rss < <(UBIK_LOG=ubik_runtime::pipeline=debug QUERY_FILE=bench/nexmark/$q.sql \
          run "$(bin_of "$build")" "$WORK/$q-$build.jsonl" "${nexmark[@]}" --checkpoint "$WORK/jck" \
          --checkpoint-every "$STEP" --checkpoint-interval 1h 2> "$WORK/jck-$build.log")
        read -r w ms _ < <(checkpoint_medians "$WORK/jck-$build.log")
        awk -v q="$q" -v b="$build" -v s="$s" -v rss="$rss" -v w="$w" -v ms="$ms" \
          'BEGIN { printf "| %s | %s | %ss | %s MB | %.1f MB | %d |\n", q, b, s, rss, w / 1e6, ms }'
      done
      [[ -f $WORK/$q-before.jsonl ]] && cmp "$WORK/$q-before.jsonl" "$WORK/$q-after.jsonl"
    done
    rm -rf "$WORK/jck"
    read -r s rss < <(QUERY_FILE=bench/nexmark/q20.sql run "$UBIK" "$WORK/q20-spill.jsonl" "${nexmark[@]}" \
      --state-memory "$B" --checkpoint "$WORK/jck" --checkpoint-every "$STEP" --checkpoint-interval 1h 2> /dev/null)
    echo "| q20 | after, --state-memory $B | ${s}s | ${rss} MB | | |"
    cmp "$WORK/q20-after.jsonl" "$WORK/q20-spill.jsonl"
    echo "the spilling run's changelog equals the in-memory run's, byte for byte ($(wc -l < "$WORK/q20-spill.jsonl") records)"
    ;;
  over)
    N=${OVER_EVENTS:-10000000}
    B=${OVER_BUDGET:-32MiB}
    STEP=$((N / 20))
    nexmark=(--from "nexmark://bid?events=$N" --from "nexmark://auction?events=$N")
    echo "== Nexmark q6 (window functions over a top-1 per auction), $N events, a checkpoint every $STEP events"
    echo "| run | wall | peak RSS | written per checkpoint (median) | ms per checkpoint (median) |"
    echo "|---|---|---|---|---|"
    for build in $(builds) spill; do
      rm -rf "$WORK/ock"
      bin=$UBIK
      [[ $build == before ]] && bin=$BEFORE
      budget=()
      [[ $build == spill ]] && budget=(--state-memory "$B")
      read -r s rss < <(UBIK_LOG=ubik_runtime::pipeline=debug QUERY_FILE=bench/nexmark/q6.sql \
        run "$bin" "$WORK/q6-$build.jsonl" "${nexmark[@]}" --checkpoint "$WORK/ock" \
        --checkpoint-every "$STEP" --checkpoint-interval 1h "${budget[@]}" 2> "$WORK/ock-$build.log")
      read -r w ms _ < <(checkpoint_medians "$WORK/ock-$build.log")
      label=$build
      [[ $build == spill ]] && label="after, --state-memory $B"
      awk -v b="$label" -v s="$s" -v rss="$rss" -v w="$w" -v ms="$ms" \
        'BEGIN { printf "| %s | %ss | %s MB | %.1f MB | %d |\n", b, s, rss, w / 1e6, ms }'
    done
    [[ -f $WORK/q6-before.jsonl ]] && cmp "$WORK/q6-before.jsonl" "$WORK/q6-after.jsonl"
    cmp "$WORK/q6-after.jsonl" "$WORK/q6-spill.jsonl"
    echo "the spilling run's changelog equals the in-memory run's, byte for byte ($(wc -l < "$WORK/q6-spill.jsonl") records)"
    rm -rf "$WORK/ock"
    ;;
  interval)
    N=${INTERVAL_EVENTS:-5000000}
    B=${INTERVAL_BUDGET:-256MiB}
    STEP=$((N / 10))
    nexmark=(--from "nexmark://bid?events=$N" --from "nexmark://auction?events=$N")
    # Each bid joins its auction when made within an hour around the auction's start: every bid
    # is held an hour of event time (the whole run) for an auction that might still come.
    cat > "$WORK/interval.sql" <<'SQL'
SELECT A.category, TUMBLE(B.date_time, INTERVAL '10' SECOND) AS w, count(*) AS n, sum(B.price) AS total
FROM auction A JOIN bid B ON A.id = B.auction
  AND B.date_time BETWEEN A.date_time - INTERVAL '1' HOUR AND A.date_time + INTERVAL '1' HOUR
GROUP BY A.category, TUMBLE(B.date_time, INTERVAL '10' SECOND)
SQL
    echo "== an interval join holding every row an hour (the whole run), $N Nexmark events, a checkpoint every $STEP events"
    echo "| query | run | wall | peak RSS |"
    echo "|---|---|---|---|"
    for q in "$WORK/interval.sql" bench/nexmark/q9.sql; do
      name=$(basename "$q" .sql)
      for build in $(builds) spill; do
        rm -rf "$WORK/ick"
        bin=$UBIK
        [[ $build == before ]] && bin=$BEFORE
        budget=()
        [[ $build == spill ]] && budget=(--state-memory "$B")
        read -r s rss < <(QUERY_FILE=$q run "$bin" "$WORK/$name-$build.jsonl" "${nexmark[@]}" \
          --checkpoint "$WORK/ick" --checkpoint-every "$STEP" --checkpoint-interval 1h "${budget[@]}")
        label=$build
        [[ $build == spill ]] && label="after, --state-memory $B"
        echo "| $name | $label | ${s}s | ${rss} MB |"
      done
      [[ -f $WORK/$name-before.jsonl ]] && cmp "$WORK/$name-before.jsonl" "$WORK/$name-after.jsonl"
      cmp "$WORK/$name-after.jsonl" "$WORK/$name-spill.jsonl"
      echo "$name: the spilling run's changelog equals the in-memory run's, byte for byte ($(wc -l < "$WORK/$name-spill.jsonl") records)"
    done
    rm -rf "$WORK/ick"
    ;;
  held)
    N=${HELD_EVENTS:-4000000}
    K=${HELD_KEYS:-100000}
    STEP=$((N / 40))
    echo "== rows held for a 1-minute emit interval, a checkpoint every $STEP events (5 s of event time); $N events, $K keys"
    echo "| build | wall | peak RSS | written per checkpoint (median) | ms until current | ms the pipeline waited |"
    echo "|---|---|---|---|---|---|"
    for build in $(builds); do
      rm -rf "$WORK/hck"
      read -r s rss < <(UBIK_LOG=ubik_runtime::pipeline=debug run "$(bin_of "$build")" "$WORK/held-$build.jsonl" \
        --from "$(demo "$N" "$K" 20000)" --checkpoint "$WORK/hck" --checkpoint-every "$STEP" \
        --checkpoint-interval 1h --emit-interval 1m 2> "$WORK/hck-$build.log")
      read -r w ms pause _ < <(checkpoint_medians "$WORK/hck-$build.log")
      awk -v b="$build" -v s="$s" -v rss="$rss" -v w="$w" -v ms="$ms" -v p="$pause" \
        'BEGIN { printf "| %s | %ss | %s MB | %.1f MB | %d | %.1f |\n", b, s, rss, w / 1e6, ms, p }'
    done
    [[ -f $WORK/held-before.jsonl ]] && cmp "$WORK/held-before.jsonl" "$WORK/held-after.jsonl"
    echo "the same changelog bytes ($(wc -l < "$WORK/held-after.jsonl") records)"
    ;;
  sessions)
    N=${SESSION_EVENTS:-10000000}
    K=${SESSION_KEYS:-1000000}
    STEP=$((N / 20))
    SQ="SELECT merchant, SESSION(ts, INTERVAL '1' MINUTE) AS s, count(*) AS n, sum(amount) AS total FROM orders GROUP BY merchant, SESSION(ts, INTERVAL '1' MINUTE)"
    echo "== 1-minute sessions, $K keys, $N events over 50 minutes, a checkpoint every $STEP events"
    echo "| run | wall | peak RSS | written per checkpoint (median) | ms per checkpoint (median) |"
    echo "|---|---|---|---|---|"
    for build in $(builds); do
      rm -rf "$WORK/sck"
      read -r s rss < <(UBIK_LOG=ubik_runtime::pipeline=debug Q=$SQ run "$(bin_of "$build")" "$WORK/sessions-$build.jsonl" \
        --from "$(demo "$N" "$K" $((N / 3000)))" --checkpoint "$WORK/sck" --checkpoint-every "$STEP" \
        --checkpoint-interval 1h 2> "$WORK/sck-$build.log")
      read -r w ms _ < <(checkpoint_medians "$WORK/sck-$build.log")
      awk -v b="$build" -v s="$s" -v rss="$rss" -v w="$w" -v ms="$ms" \
        'BEGIN { printf "| %s | %ss | %s MB | %.1f MB | %d |\n", b, s, rss, w / 1e6, ms }'
    done
    [[ -f $WORK/sessions-before.jsonl ]] && cmp "$WORK/sessions-before.jsonl" "$WORK/sessions-after.jsonl"
    ;;
  large)
    N=${LARGE_EVENTS:-200000000}
    K=${LARGE_KEYS:-100000000}
    B=${LARGE_BUDGET:-2GiB}
    echo "== larger than memory: $N events over $K keys under --state-memory $B, with checkpoints"
    # The changelog of the keys ending in 0000 (one in 10 000) is kept for the oracle.
    /usr/bin/time -f "%e %M" -o "$WORK/time" "$UBIK" run "$Q" -q --from "$(demo "$N" "$K")" \
      --state-memory "$B" --checkpoint "$WORK/large" | grep -F '0000"},"value"' > "$WORK/large.jsonl"
    read -r s rss < <(awk '{printf "%s %.0f\n", $1, $2 / 1024}' "$WORK/time")
    echo "wall ${s}s ($(echo "$N / $s" | bc) events/s), peak RSS ${rss} MB, $(du -sb "$WORK/large" | awk '{printf "%.1f", $1 / 1e9}') GB on disk"
    "$UBIK" run "SELECT merchant, ts, amount FROM orders WHERE merchant LIKE '%0000'" -q --from "$(demo "$N" "$K")" > "$WORK/events.jsonl"
    fold_equals_duckdb "$WORK/large.jsonl" "$WORK/events.jsonl"
    # Restore: resume from the last checkpoint (at the end of input) and read 100 000 more events.
    start=$(date +%s.%N)
    read -r s rss < <(run "$UBIK" /dev/null --from "$(demo $((N + 100000)) "$K")" --state-memory "$B" \
      --checkpoint "$WORK/large" 2> "$WORK/resume.log")
    restored=$("$PY" - "$start" "$WORK/resume.log" <<'PY'
import datetime, re, sys
line = next(l for l in open(sys.argv[2]) if "resumed from checkpoint" in l)
at = re.search(r"\d{4}-\d\d-\d\dT[0-9:.]+Z", line).group(0)
at = datetime.datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()
print(f"{at - float(sys.argv[1]):.2f}")
PY
)
    echo "resume: restored and processing after ${restored}s; 100 000 more events read in ${s}s (peak RSS ${rss} MB)"
    ;;
  budget)
    N=${BUDGET_EVENTS:-60000000}
    K=${BUDGET_KEYS:-30000000}
    B=${BUDGET:-1GiB}
    echo "== larger than the budget: $N events, $K keys, --state-memory $B"
    echo "| run | wall | peak RSS |"
    echo "|---|---|---|"
    for build in $(builds); do
      bin=$(bin_of "$build")
      read -r s rss < <(run "$bin" /dev/null --from "$(demo "$N" "$K")")
      echo "| $build, no budget | ${s}s | ${rss} MB |"
    done
    read -r s rss < <(run "$UBIK" /dev/null --from "$(demo "$N" "$K")" --state-memory "$B" --checkpoint "$WORK/big")
    echo "| after, --state-memory $B, with checkpoints | ${s}s | ${rss} MB |"
    ;;
  skew)
    K=${SKEW_KEYS:-10000000}
    N=$((2 * K))
    B=${SKEW_BUDGET:-256MiB}
    echo "== skew: $N events over $K keys, budget $B (about a tenth of the state)"
    echo "| keys | no budget | --state-memory $B | ratio | peak RSS with budget |"
    echo "|---|---|---|---|---|"
    for skew in 0 0.9; do
      read -r free _ < <(run "$UBIK" /dev/null --from "$(demo "$N" "$K" 100000 "skew=$skew")")
      read -r tight rss < <(run "$UBIK" /dev/null --from "$(demo "$N" "$K" 100000 "skew=$skew")" --state-memory "$B")
      echo "| skew=$skew | ${free}s | ${tight}s | $(echo "$tight / $free" | bc -l | cut -c1-4)x | ${rss} MB |"
    done
    ;;
  windows)
    N=${WINDOW_EVENTS:-10000000}
    K=${WINDOW_KEYS:-2000000}
    B=${WINDOW_BUDGET:-512MiB}
    HOP="HOP(ts, INTERVAL '1 MINUTE', INTERVAL '10 MINUTES')"
    echo "SELECT merchant, $HOP AS w, count(*) AS n, sum(amount) AS total FROM orders GROUP BY merchant, $HOP" > "$WORK/hop.sql"
    echo "== HOP windows (10 open per key): $N events, $K keys, 10 000 events per second of event time"
    echo "| run | wall | peak RSS |"
    echo "|---|---|---|"
    for build in $(builds); do
      read -r s rss < <(QUERY_FILE=$WORK/hop.sql run "$(bin_of "$build")" "$WORK/hop-$build.jsonl" --from "$(demo "$N" "$K" 10000)")
      echo "| $build, no budget | ${s}s | ${rss} MB |"
    done
    read -r s rss < <(QUERY_FILE=$WORK/hop.sql run "$UBIK" "$WORK/hop-spill.jsonl" --from "$(demo "$N" "$K" 10000)" --state-memory "$B")
    echo "| after, --state-memory $B | ${s}s | ${rss} MB |"
    cmp "$WORK/hop-after.jsonl" "$WORK/hop-spill.jsonl"
    [[ -z ${BEFORE:-} ]] || cmp "$WORK/hop-before.jsonl" "$WORK/hop-after.jsonl"
    echo "the changelogs are equal, byte for byte ($(wc -l < "$WORK/hop-spill.jsonl") records)"

    # One 1-hour window over CKPT_WINDOW_KEYS keys (3 events per key, all in the hour),
    # a checkpoint every 5% of the keys' worth of events: each touches at most 5% of the groups.
    K=${CKPT_WINDOW_KEYS:-1000000}
    N=$((3 * K))
    STEP=$((K / 20))
    TUMBLE="TUMBLE(ts, INTERVAL '1 HOUR')"
    echo "SELECT merchant, $TUMBLE AS w, count(*) AS n, sum(amount) AS total FROM orders GROUP BY merchant, $TUMBLE" > "$WORK/tumble.sql"
    echo "== one 1-hour window, $K keys, $N events, a checkpoint every $STEP events"
    echo "| build | written per checkpoint (median) | ms per checkpoint (median) | wall |"
    echo "|---|---|---|---|"
    for build in $(builds); do
      rm -rf "$WORK/wck"
      read -r s _ < <(UBIK_LOG=ubik_runtime::pipeline=debug QUERY_FILE=$WORK/tumble.sql run "$(bin_of "$build")" "$WORK/tumble-$build.jsonl" \
        --from "$(demo "$N" "$K" $((N / 3000)))" --checkpoint "$WORK/wck" --checkpoint-every "$STEP" \
        --batch-size "$STEP" --checkpoint-interval 1h 2> "$WORK/wck.log")
      read -r w ms _ < <(checkpoint_medians "$WORK/wck.log")
      awk -v b="$build" -v w="$w" -v ms="$ms" -v s="$s" 'BEGIN { printf "| %s | %.1f MB | %d | %ss |\n", b, w / 1e6, ms, s }'
    done
    [[ -z ${BEFORE:-} ]] || cmp "$WORK/tumble-before.jsonl" "$WORK/tumble-after.jsonl"
    ;;
  *) echo "unknown section $section" >&2; exit 2 ;;
  esac
done
