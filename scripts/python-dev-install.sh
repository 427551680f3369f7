#!/usr/bin/env bash
# Installs this checkout's `ubik` Python package into the environment of
# PYTHON in development mode, from an extension cargo already built:
#
#   scripts/python-dev-install.sh PYTHON [TARGET_PROFILE_DIR]   (default target/debug)
#
# It does what `maturin develop` does for a mixed Rust/Python project (the
# library beside the package's Python files, the package on the path), but
# takes the library from the workspace build instead of compiling the
# dependencies again with another feature set.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${1:?usage: python-dev-install.sh PYTHON [TARGET_PROFILE_DIR]}
DIR=${2:-target/debug}
LIB=$DIR/lib_ubik.so
[[ -f $LIB ]] || { echo "python-dev-install.sh: $LIB not found: cargo build -p ubik-python first" >&2; exit 1; }
PKG=crates/python/python
# Copied, not linked: a later build must not swap the library under a running interpreter.
cp "$LIB" "$PKG/ubik/_ubik.abi3.so.tmp"
mv "$PKG/ubik/_ubik.abi3.so.tmp" "$PKG/ubik/_ubik.abi3.so"
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$PWD/$PKG" >"$SITE/ubik-dev.pth"
"$PY" -c 'import ubik; print("ubik", ubik.__version__, "from", ubik.__file__)'
