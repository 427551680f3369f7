#!/usr/bin/env bash
# The profile `pip install ./crates/python` builds with (`dist`: no LTO, 16
# codegen units) against `release` (thin LTO): bench/python_arrow.py on the
# extension built with each, rounds interleaved in one run, medians compared.
#
#   bench/python-profiles.sh [N=10000000] [ROUNDS=5]
#
# DIST_SO / RELEASE_SO: use an extension built elsewhere (e.g. the one a
# fresh `pip install` left in a virtualenv) instead of building it here.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
N=${1:-10000000}
ROUNDS=${2:-5}
CACHE=${UBIK_CACHE_DIR:-$HOME/.cache/ubik}/bench
PY=$(scripts/python-env.sh)
for profile in dist release; do
  var=${profile^^}_SO
  so=${!var:-}
  if [[ -z $so ]]; then
    cargo build --profile "$profile" --quiet -p ubik-python
    so=target/$profile/lib_ubik.so
  fi
  PKG=$CACHE/python-$profile
  rm -rf "$PKG" && mkdir -p "$PKG/ubik"
  cp crates/python/python/ubik/*.py crates/python/python/ubik/*.pyi "$PKG/ubik/"
  cp "$so" "$PKG/ubik/_ubik.abi3.so"
done
declare -A secs
for ((r = 1; r <= ROUNDS; r++)); do
  for profile in dist release; do
    s=$(PYTHONPATH=$CACHE/python-$profile "$PY" bench/python_arrow.py "$N" 1 |
      awk '/ubik.stream/ { print $2 }')
    echo "round $r  $profile  ubik.stream(...).arrow() ${s} s"
    secs[$profile]+="$s "
  done
done
median() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
d=$(median "${secs[dist]}")
r=$(median "${secs[release]}")
echo "median of $ROUNDS over $N events: dist ${d} s, release ${r} s; dist/release time ratio $(awk -v d="$d" -v r="$r" 'BEGIN { printf "%.3f", d / r }')"
