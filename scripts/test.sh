#!/usr/bin/env bash
# Runs every check and test of ubik: formatting, clippy, the Rust unit,
# golden SQL, oracle-property, crash and Kafka tests (against a real Apache
# Kafka broker, a real Confluent-compatible schema registry, Apicurio, and
# real Debezium change events from PostgreSQL through Kafka Connect), and
# the Python package's tests (pytest, pyarrow, deltalake, DuckDB as the
# oracle), and the status page in headless Chromium. The broker, the registry,
# the Python environment and Chromium (Debian's package) are installed and
# started by this script, idempotently; a broker or registry it started is
# stopped when it exits.
#
#   scripts/test.sh                               everything
#   UBIK_TEST_SKIP=kafka,registry,debezium,python,browser scripts/test.sh   skip suites (comma-separated)
#
# The tests find the broker in UBIK_TEST_KAFKA (host:port), the registry in
# UBIK_TEST_REGISTRY (its Confluent API's base URL) and Debezium in
# UBIK_TEST_DEBEZIUM (Kafka Connect's REST URL and PostgreSQL's DSN).
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

# A fresh run needs about 5 GiB (target/ 4, the broker, the registry and the
# Python environment 1). Running out mid-build fails as a linker crash, so say it first.
free_kib=$(df -Pk . | awk 'NR == 2 { print $4 }')
if ((free_kib < 6 * 1024 * 1024)); then
  echo "test.sh: only $((free_kib / 1024)) MiB free on $(df -P . | awk 'NR == 2 { print $6 }'); a fresh run needs about 6 GiB (free some, e.g. old target/ directories)" >&2
  exit 1
fi

step "cargo fmt --check"
cargo fmt --all -- --check

step "build every target, linted by clippy -D warnings"
cargo build "${WORKSPACE[@]}" --all-targets --quiet

# Servers (their scripts) this run started: one EXIT trap stops them all, the
# last started first, however the run ends.
started_servers=()
stop_started_servers() {
  local i
  for ((i = ${#started_servers[@]} - 1; i >= 0; i--)); do
    "${started_servers[i]}" stop || true
  done
}
trap stop_started_servers EXIT

if ! skip kafka; then
  step "Kafka broker (Apache Kafka 4.x, KRaft, loopback)"
  # A broker this run starts begins empty: topics of earlier runs (thousands
  # of partitions) would only slow its start, and the broker-restart test.
  if ! testing/kafka/broker.sh status >/dev/null 2>&1; then
    started_servers+=(testing/kafka/broker.sh)
    testing/kafka/broker.sh clean
  fi
  testing/kafka/broker.sh start
  # Formatting must work whatever the random cluster id begins with (one in 64 began with '-').
  testing/kafka/broker.sh check-format
  UBIK_TEST_KAFKA=$(testing/kafka/broker.sh address)
  export UBIK_TEST_KAFKA
fi

if ! skip registry; then
  step "Schema registry (Apicurio Registry 2.x, Confluent API, in memory, loopback)"
  # A registry this run starts begins empty (its storage is in memory); one
  # already running may hold subjects of earlier runs, so tests use subject
  # names of their own.
  if ! testing/registry/registry.sh status >/dev/null 2>&1; then
    started_servers+=(testing/registry/registry.sh)
  fi
  testing/registry/registry.sh start
  UBIK_TEST_REGISTRY=$(testing/registry/registry.sh address)
  export UBIK_TEST_REGISTRY
fi

if ! skip debezium && ! skip kafka; then
  step "Change data capture (PostgreSQL from Debian, Kafka Connect with Debezium, loopback)"
  # Connect keeps its state in topics of the broker above; tests add their
  # own connectors (and replication slots) and remove them.
  if ! testing/debezium/debezium.sh status >/dev/null 2>&1; then
    started_servers+=(testing/debezium/debezium.sh)
  fi
  UBIK_TEST_DEBEZIUM=$(testing/debezium/debezium.sh start | tr '\n' ' ')
  export UBIK_TEST_DEBEZIUM
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
