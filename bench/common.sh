# Sourced by the bench scripts: the data cache, the Python environment, the
# release binaries, and the median of a column of numbers.
CACHE=${UBIK_CACHE_DIR:-$HOME/.cache/ubik}/bench
mkdir -p "$CACHE"
PY=$(scripts/python-env.sh)
cargo build --release --quiet -p ubik-cli -p ubik-bench
UBIK=target/release/ubik
BENCH=target/release/ubik-bench
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
