# Sourced by the bench scripts: the data cache, the Python environment, the
# release binaries, the median of a column of numbers, and cached demo events.
CACHE=${UBIK_CACHE_DIR:-$HOME/.cache/ubik}/bench
mkdir -p "$CACHE"
PY=$(scripts/python-env.sh)
# A script that runs only the ubik command sets RELEASE_PACKAGES=ubik-cli first (the
# ubik-bench link alone takes minutes).
read -ra packages <<< "${RELEASE_PACKAGES:-ubik-cli ubik-bench}"
cargo build --release --quiet "${packages[@]/#/-p=}"
UBIK=target/release/ubik
BENCH=target/release/ubik-bench
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# events_jsonl N: the path of N cached demo events as JSON lines, made on first use.
events_jsonl() {
  local file=$CACHE/events-$1.jsonl
  [[ -s $file ]] || "$PY" bench/peers.py make-jsonl "$1" "$file"
  echo "$file"
}
