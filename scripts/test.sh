#!/usr/bin/env bash
# Runs every check and test of ubik: formatting, clippy, the Rust unit,
# golden SQL, oracle-property, crash and Kafka tests (against a real Apache
# Kafka broker), and the Python package's tests (pytest, pyarrow, deltalake,
# DuckDB as the oracle), and the status page in headless Chromium. The broker,
# the Python environment and Chromium (Debian's package) are installed and
# started by this script, idempotently.
#
#   scripts/test.sh                               everything
#   UBIK_TEST_SKIP=kafka,python,browser scripts/test.sh   skip suites (comma-separated)
#
# One compilation serves everything: every cargo command selects the whole
# workspace with the same features (so dependencies are built once, with one
# feature set), clippy lints our crates while they compile for the tests
# (it is their compiler, not a second `cargo check` of every dependency), and
# the Python extension is that same build's library.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

skip() { [[ ",${UBIK_TEST_SKIP:-}," == *",$1,"* ]]; }
started=$SECONDS
step() { printf '\n==> [%dm%02ds] %s\n' $(((SECONDS - started) / 60)) $(((SECONDS - started) % 60)) "$*"; }

WORKSPACE=(--workspace --features ubik-cli/broker-tests)
# clippy-driver as the compiler of the workspace's own crates, with -D warnings.
RUSTC_WORKSPACE_WRAPPER=$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver) ||
  { echo "test.sh: clippy is not installed (rustup component add clippy)" >&2; exit 1; }
export RUSTC_WORKSPACE_WRAPPER
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"

# A fresh run needs about 5 GiB (target/ 4, the broker and the Python
# environment 1). Running out mid-build fails as a linker crash, so say it first.
free_kib=$(df -Pk . | awk 'NR == 2 { print $4 }')
if ((free_kib < 6 * 1024 * 1024)); then
  echo "test.sh: only $((free_kib / 1024)) MiB free on $(df -P . | awk 'NR == 2 { print $6 }'); a fresh run needs about 6 GiB (free some, e.g. old target/ directories)" >&2
  exit 1
fi

step "cargo fmt --check"
cargo fmt --all -- --check

step "build every target, linted by clippy -D warnings"
cargo build "${WORKSPACE[@]}" --all-targets --quiet

if ! skip kafka; then
  step "Kafka broker (Apache Kafka 4.x, KRaft, loopback)"
  started_broker=
  # A broker this run starts begins empty: topics of earlier runs (thousands
  # of partitions) would only slow its start, and the broker-restart test.
  if ! testing/kafka/broker.sh status >/dev/null 2>&1; then
    started_broker=1
    testing/kafka/broker.sh clean
  fi
  testing/kafka/broker.sh start
  # Formatting must work whatever the random cluster id begins with (one in 64 began with '-').
  testing/kafka/broker.sh check-format
  UBIK_TEST_KAFKA=$(testing/kafka/broker.sh address)
  export UBIK_TEST_KAFKA
  [[ -n $started_broker ]] && trap 'testing/kafka/broker.sh stop' EXIT
fi

if ! skip browser; then
  step "Chromium (Debian's package, headless) for the status page's browser test"
  UBIK_CHROMIUM=$(testing/chromium.sh)
  export UBIK_CHROMIUM
fi

step "cargo test: unit, golden SQL (.slt), oracle properties, CLI, crash/resume, Kafka"
cargo test "${WORKSPACE[@]}" --quiet

if ! skip python; then
  step "Python package: the extension from the same build, and pytest"
  PY=$(scripts/python-env.sh)
  scripts/python-dev-install.sh "$PY" target/debug
  UBIK_BIN=$PWD/target/debug/ubik "$PY" -m pytest python/tests -q -p no:cacheprovider
fi

step "all tests passed"
