#!/usr/bin/env bash
# Nexmark engine only, two builds side by side: BEFORE (an ubik-bench binary built from an
# earlier commit) and this checkout's release build, interleaved query by query and round by
# round so both see the same machine. Prints each build's median events/s (engine alone and
# with the generator), the ratio, the state at the end of the run, and whether both gave the
# same number of result rows (a change that alters results shows here first).
#
#   bench/nexmark-ab.sh BEFORE [EVENTS=5000000] [QUERIES="q3 q4 q6 q7 q8 q9 q18 q19 q20"] [ROUNDS=3]
#
# BEFORE: e.g. `git worktree add /tmp/old <commit> && cargo build --release -p ubik-bench
# --manifest-path /tmp/old/Cargo.toml`, then /tmp/old/target/release/ubik-bench.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BEFORE=${1:?usage: bench/nexmark-ab.sh BEFORE_UBIK_BENCH [EVENTS] [QUERIES] [ROUNDS]}
EVENTS=${2:-5000000}
QUERIES=${3:-"q3 q4 q6 q7 q8 q9 q18 q19 q20"}
ROUNDS=${4:-3}
source bench/common.sh

RUNS=$CACHE/nexmark-ab.jsonl
: > "$RUNS"
for _ in $(seq "$ROUNDS"); do
  for q in $QUERIES; do
    for build in before after; do
      bin=$BENCH
      [[ $build == before ]] && bin=$BEFORE
      "$bin" nexmark "bench/nexmark/$q.sql" "$EVENTS" |
        "$PY" -c 'import json, sys; r = json.loads(sys.stdin.readline()); r["q"], r["build"] = sys.argv[1:]; print(json.dumps(r))' "$q" "$build" >> "$RUNS"
    done
  done
done

"$PY" - "$RUNS" "$QUERIES" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
def pick(q, build):
    return [r for r in runs if r["q"] == q and r["build"] == build]
def end_state(r):
    return r["state_curve"][-1][1] if r["state_curve"] else 0
print("| query | before ev/s (with generator) | after ev/s (with generator) | engine ratio | state at end, before / after | rows out equal |")
print("|---|---|---|---|---|---|")
for q in sys.argv[2].split():
    b, a = pick(q, "before"), pick(q, "after")
    med = lambda rs, k: statistics.median(r[k] for r in rs)
    be, ae = med(b, "events_per_s"), med(a, "events_per_s")
    same = {r["rows_out"] for r in b} == {r["rows_out"] for r in a}
    print(f"| {q} | {be / 1e6:.2f} M ({med(b, 'events_per_s_with_generation') / 1e6:.2f} M) "
          f"| {ae / 1e6:.2f} M ({med(a, 'events_per_s_with_generation') / 1e6:.2f} M) | {ae / be:.2f}x "
          f"| {end_state(b[0]) / 1e6:.0f} / {end_state(a[0]) / 1e6:.0f} MB | {'yes' if same else 'NO'} |")
PY
