# Sourced by the bench scripts: the data cache, the Python environment, the
# release binaries, the median of a column of numbers, and cached demo events.
CACHE=${UBIK_CACHE_DIR:-$HOME/.cache/ubik}/bench
mkdir -p "$CACHE"
PY=$(scripts/python-env.sh)
# A script that runs only the ubik command sets RELEASE_PACKAGES=ubik-cli first (the
# ubik-bench link alone takes minutes). UBIK set beforehand: that ubik binary, nothing built.
if [[ -z ${UBIK:-} ]]; then
  read -ra packages <<< "${RELEASE_PACKAGES:-ubik-cli ubik-bench}"
  cargo build --release --quiet "${packages[@]/#/-p=}"
  UBIK=target/release/ubik
fi
BENCH=${BENCH:-target/release/ubik-bench}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# events_jsonl N: the path of N cached demo events as JSON lines, made on first use.
events_jsonl() {
  local file=$CACHE/events-$1.jsonl
  [[ -s $file ]] || "$PY" bench/peers.py make-jsonl "$1" "$file"
  echo "$file"
}
# drop_topics BOOTSTRAP TEXT: deletes the broker's topics whose names hold TEXT (a run's id, so
# its inputs, outputs and a group's internal topics), unless KEEP=1. A one-node test broker
# left with thousands of partitions by earlier runs stalls its controller and fences itself.
drop_topics() {
  [[ ${KEEP:-0} == 1 ]] && return 0
  "$PY" - "$1" "$2" <<'PY' || echo "could not delete the run's topics" >&2
import sys
from confluent_kafka.admin import AdminClient
admin = AdminClient({"bootstrap.servers": sys.argv[1]})
names = [t for t in admin.list_topics(timeout=10).topics if sys.argv[2] in t]
for name, done in (admin.delete_topics(names, operation_timeout=60) if names else {}).items():
    try:
        done.result()
    except Exception as e:
        print(f"deleting {name}: {e}", file=sys.stderr)
PY
}
