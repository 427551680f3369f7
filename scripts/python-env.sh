#!/usr/bin/env bash
# Creates (once) and updates (when the requirements change) the Python
# environment of the tests and benchmarks, outside the checkout so CI runs on
# the same machine reuse it. Prints the path of its python.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
CACHE=${UBIK_CACHE_DIR:-$HOME/.cache/ubik}
VENV=$CACHE/venv
REQ=python/requirements-dev.txt
SUM=$(sha256sum "$REQ" | cut -d' ' -f1)
if [[ ! -x $VENV/bin/python ]]; then
  python3 -m venv "$VENV" >&2
fi
if [[ $(cat "$VENV/.requirements" 2>/dev/null) != "$SUM" ]]; then
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQ" >&2
  echo "$SUM" > "$VENV/.requirements"
fi
echo "$VENV/bin/python"
