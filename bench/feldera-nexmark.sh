#!/usr/bin/env bash
# Nexmark in process, ubik beside Feldera (issue: Nexmark, 3c): Feldera's own benchmark
# (feldera/feldera, crates/nexmark, on dbsp) and ubik's engine bench (bench/nexmark.sh's), each
# with its own generator, the same queries over the same number of events, interleaved in one run.
#
#   FELDERA_SRC=path/to/feldera/checkout bench/feldera-nexmark.sh [EVENTS=10000000] \
#       [QUERIES="q0 q1 q2 q3 q5 q7 q8"] [ROUNDS=3]
#
# Feldera's workspace lists crates with git dependencies (its forks of delta-rs and iceberg-rust)
# that a machine without GitHub access cannot fetch, so the crates its benchmark needs are copied
# into $CACHE/feldera with a workspace trimmed to them and built there (release, its own target
# directory: the first build takes ~13 min here). Feldera runs with --cpu-cores 1 and one event
# generator thread (two threads); ubik-bench generates and runs on one thread. Reported: events/s
# (wall) and events per CPU-second (user + system of the whole process), medians of ROUNDS; the
# per-CPU ratio is the per-core comparison.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
EVENTS=${1:-10000000}
QUERIES=${2:-"q0 q1 q2 q3 q5 q7 q8"}
ROUNDS=${3:-3}
[[ -n ${FELDERA_SRC:-} ]] || { echo "set FELDERA_SRC to a checkout of github.com/feldera/feldera" >&2; exit 2; }
source bench/common.sh

WORK=$CACHE/feldera
CRATES="dbsp nexmark feldera-types feldera-macros feldera-observability samply buffer-cache storage fxp ir"
if [[ ! -f $WORK/Cargo.toml ]]; then
  mkdir -p "$WORK/crates"
  cp "$FELDERA_SRC/Cargo.toml" "$FELDERA_SRC/Cargo.lock" "$WORK/"
  for c in $CRATES; do cp -r "$FELDERA_SRC/crates/$c" "$WORK/crates/"; done
  "$PY" - "$WORK/Cargo.toml" "$CRATES" <<'PY'
import sys
path, crates = sys.argv[1], sys.argv[2].split()
text = open(path).read()
start = text.index("members = [")
end = text.index("]", start)
members = "".join(f'  "crates/{c}",\n' for c in crates)
text = text[:start] + "members = [\n" + members + text[end:]
# Workspace dependencies fetched from git are used only by the crates left out.
text = "\n".join(l for l in text.split("\n") if 'git = "https://' not in l)
open(path, "w").write(text)
PY
fi
(cd "$WORK" && cargo bench --bench nexmark -p dbsp_nexmark --no-run 2> build.log) ||
  { tail -20 "$WORK/build.log" >&2; exit 1; }
# cargo names the bench executable on stderr: "Executable benches/... (target/release/deps/...)".
FELDERA=$WORK/$(grep -o 'target/release/deps/nexmark-[0-9a-f]*' "$WORK/build.log" | tail -1 || true)
[[ -f $FELDERA && -x $FELDERA ]] || { echo "Feldera's nexmark bench not found (see $WORK/build.log)" >&2; exit 1; }

RESULTS=$(mktemp)
trap 'rm -f "$RESULTS"' EXIT
for _ in $(seq "$ROUNDS"); do
  for q in $QUERIES; do
    "$BENCH" nexmark "bench/nexmark/$q.sql" "$EVENTS" |
      "$PY" -c 'import json,sys; r=json.load(sys.stdin); print(json.dumps({"q": sys.argv[1], "engine": "ubik",
        "seconds": r["seconds"] + r["generate_seconds"], "cpu": r["seconds"] + r["generate_seconds"]}))' "$q" >> "$RESULTS"
    (cd "$WORK" && /usr/bin/time -f '%e %U %S' -o time.txt "$FELDERA" --bench --query "$q" \
      --max-events "$EVENTS" --cpu-cores 1 --num-event-generators 1 --no-progress > run.log 2>&1) ||
      { tail -20 "$WORK/run.log" >&2; exit 1; }
    read -r wall user sys < "$WORK/time.txt"
    echo "{\"q\": \"$q\", \"engine\": \"feldera\", \"seconds\": $wall, \"cpu\": $(awk -v u="$user" -v s="$sys" 'BEGIN { print u + s }')}" >> "$RESULTS"
  done
done
"$PY" - "$RESULTS" "$EVENTS" <<'PY'
import collections, json, statistics, sys
events = int(sys.argv[2])
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    runs[(r["q"], r["engine"])].append(r)
def fmt(n):
    return f"{n / 1e6:.2f} M" if n >= 1e6 else f"{n / 1e3:.0f} K"
print(f"== Nexmark in process, {events} events; ubik one thread, Feldera --cpu-cores 1 + 1 generator thread")
print("| query | ubik ev/s | Feldera ev/s | ubik ev/CPU-s | Feldera ev/CPU-s | per-CPU ratio |")
print("|---|---|---|---|---|---|")
for q in dict.fromkeys(k[0] for k in runs):
    u, f = runs[(q, "ubik")], runs[(q, "feldera")]
    us = events / statistics.median(r["seconds"] for r in u)
    fs = events / statistics.median(r["seconds"] for r in f)
    uc = events / statistics.median(r["cpu"] for r in u)
    fc = events / statistics.median(r["cpu"] for r in f)
    print(f"| {q} | {fmt(us)} | {fmt(fs)} | {fmt(uc)} | {fmt(fc)} | {uc / fc:.1f}x |")
PY
