#!/usr/bin/env bash
# Runs every check and test of ubik: formatting, clippy, the Rust unit,
# golden SQL, oracle-property and crash tests, the Kafka suite against a real
# Apache Kafka broker, and the Python package's tests (pytest, pyarrow,
# deltalake, DuckDB as the oracle). The broker and the Python environment are
# installed and started by this script, idempotently.
#
#   scripts/test.sh                          everything
#   UBIK_TEST_SKIP=kafka,python scripts/test.sh   skip suites (comma-separated)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

skip() { [[ ",${UBIK_TEST_SKIP:-}," == *",$1,"* ]]; }
step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --features ubik-cli/broker-tests --quiet -- -D warnings

step "cargo test: unit, golden SQL (.slt), oracle properties, CLI, crash/resume"
cargo test --workspace --quiet

if ! skip kafka; then
  step "Kafka broker (Apache Kafka 4.x, KRaft, loopback)"
  started_broker=
  if ! testing/kafka/broker.sh status >/dev/null 2>&1; then started_broker=1; fi
  testing/kafka/broker.sh start
  UBIK_TEST_KAFKA=$(testing/kafka/broker.sh address)
  export UBIK_TEST_KAFKA
  [[ -n $started_broker ]] && trap 'testing/kafka/broker.sh stop' EXIT
  step "cargo test: Kafka round trip, crash suite, isolation, DLQ, broker restart, fencing"
  # One at a time: one test restarts the broker.
  cargo test -p ubik-cli --features broker-tests --test kafka --quiet -- --test-threads 1
fi

if ! skip python; then
  step "Python package: build (maturin develop) and pytest"
  PY=$(scripts/python-env.sh)
  VENV=$(dirname "$(dirname "$PY")")
  VIRTUAL_ENV=$VENV PATH="$VENV/bin:$PATH" maturin develop --quiet -m crates/python/Cargo.toml
  UBIK_BIN=$PWD/target/debug/ubik "$PY" -m pytest python/tests -q -p no:cacheprovider
fi

echo
echo "all tests passed"
