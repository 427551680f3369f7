#!/usr/bin/env bash
# Prints the path of a headless-capable Chromium, installing Debian's package
# (chromium) first if there is none. Used by the status page's browser test.
set -euo pipefail
for c in chromium chromium-browser google-chrome; do
  if command -v "$c" >/dev/null 2>&1; then
    command -v "$c"
    exit 0
  fi
done
if ! command -v apt-get >/dev/null 2>&1; then
  echo "testing/chromium.sh: no Chromium and no apt-get to install it; install Chromium, or skip with UBIK_TEST_SKIP=browser" >&2
  exit 1
fi
sudo=()
[[ $(id -u) == 0 ]] || sudo=(sudo)
echo "testing/chromium.sh: installing Debian's chromium package" >&2
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q chromium >&2 ||
  { "${sudo[@]}" apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q chromium >&2; }
command -v chromium
