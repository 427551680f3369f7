#!/usr/bin/env bash
# The Python Arrow-leg benchmark (bench/python_arrow.py) on a release build
# of the extension, without touching the test environment's debug install.
#
#   bench/python_arrow.sh [N=10000000] [ROUNDS=5]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
CACHE=${UBIK_CACHE_DIR:-$HOME/.cache/ubik}/bench
mkdir -p "$CACHE"
PY=$(scripts/python-env.sh)
# Built together with the binaries: one feature set, so the release
# dependencies are shared and only the extension itself is compiled.
cargo build --release --quiet -p ubik-cli -p ubik-bench -p ubik-python
PKG=$CACHE/python-release
rm -rf "$PKG" && mkdir -p "$PKG/ubik"
cp crates/python/python/ubik/*.py crates/python/python/ubik/*.pyi "$PKG/ubik/"
cp target/release/lib_ubik.so "$PKG/ubik/_ubik.abi3.so"
PYTHONPATH=$PKG "$PY" bench/python_arrow.py "${1:-10000000}" "${2:-5}"
