#!/usr/bin/env bash
# Debezium input against append-only input, Kafka to Kafka: the changes of `ubik-bench
# changelog` (EVENTS changes of KEYS rows in 1000 merchants, 10% deletes, updates that move a
# row to another merchant) written into two topics keyed by id: as Debezium's JSON change
# events (an update's `before` null, as under Postgres' default replica identity; a delete's
# `before` its key, followed by a tombstone), and as the rows alone (what an event topic of
# the same rows would hold); every record's Kafka timestamp is its change's time (`ts`, the
# events' `source.ts_ms`). Then the same continuous GROUP BY over each, one after the other,
# transactional output, checkpoint every second. The figure is input records per CPU-second of
# the whole ubik process (user + system) and per wall second, and their ratio; the Debezium
# run's latest value per merchant must equal the aggregate of the table's final rows
# (computed in Python from the same changes).
#
#   bench/changelog-kafka.sh [EVENTS=2000000] [KEYS=200000]
#
# Env: PARTITIONS (4), UBIK (a ubik binary instead of building the release), KEEP=1 (keep the
# topics).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
EVENTS=${1:-2000000}
KEYS=${2:-200000}
PARTS=${PARTITIONS:-4}
RELEASE_PACKAGES=ubik-cli
source bench/common.sh
B=$(testing/kafka/broker.sh start | tail -1)
RUN=$(date +%s)-$$
WORK=$(mktemp -d)
trap 'drop_topics "$B" "$RUN"; rm -rf "$WORK"' EXIT
SQL="SELECT merchant, count(*) AS n, sum(amount) AS total FROM orders GROUP BY merchant"
SCHEMA="id BIGINT PRIMARY KEY, merchant VARCHAR, amount DOUBLE, ts TIMESTAMP"
declare -A TOPIC=([append]=cl-rows-$RUN [debezium]=cl-cdc-$RUN)
declare -A FORMAT=([append]="" [debezium]="&format=debezium-json")

echo "== $EVENTS changes of $KEYS rows -> ${TOPIC[append]}, ${TOPIC[debezium]} ($PARTS partitions)" >&2
"$PY" - "$B" "${TOPIC[append]}" "${TOPIC[debezium]}" "$EVENTS" "$KEYS" "$PARTS" "$WORK/want.json" <<'PY'
import json, sys
from decimal import Decimal
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
b, rows_topic, cdc_topic, events, keys, parts, want = sys.argv[1:]
events, keys, parts = int(events), int(keys), int(parts)
admin = AdminClient({"bootstrap.servers": b})
# The records' times are of 2024: kept whatever their age.
keep = {"retention.ms": "-1"}
for f in admin.create_topics([NewTopic(t, parts, 1, config=keep) for t in (rows_topic, cdc_topic)]).values():
    f.result()
p = Producer({"bootstrap.servers": b, "linger.ms": 50, "batch.size": 1 << 20,
              "queue.buffering.max.messages": 1_000_000, "compression.type": "lz4"})
state = 0x9E3779B97F4A7C15
M = (1 << 64) - 1
def nxt():  # the xorshift of crates/bench/src/changelog.rs
    global state
    state ^= (state << 13) & M
    state ^= state >> 7
    state ^= (state << 17) & M
    return state
def send(topic, key, value, ts):
    while True:
        try:
            p.produce(topic, value, key, timestamp=ts)
            return
        except BufferError:
            p.poll(0.1)
table = {}
for i in range(events):
    id_ = nxt() % keys
    ts = 1_704_067_200_000 + i
    merchant, whole, cents = f"m{nxt() % 1000:03}", nxt() % 500, nxt() % 100
    row = f'{{"id":{id_},"merchant":"{merchant}","amount":{whole}.{cents:02},"ts":{ts}}}'
    key = str(id_).encode()
    source = f'"source":{{"ts_ms":{ts},"db":"shop","table":"orders"}}'
    if id_ in table and nxt() % 10 == 0:
        del table[id_]
        send(cdc_topic, key, f'{{"before":{{"id":{id_}}},"after":null,{source},"op":"d","ts_ms":{ts}}}'.encode(), ts)
        send(cdc_topic, key, None, ts)
    else:
        op = "u" if id_ in table else "c"
        table[id_] = (merchant, Decimal(f"{whole}.{cents:02}"))
        send(cdc_topic, key, f'{{"before":null,"after":{row},{source},"op":"{op}","ts_ms":{ts}}}'.encode(), ts)
    send(rows_topic, key, row.encode(), ts)
    if i % 10000 == 0:
        p.poll(0)
assert p.flush(120) == 0
groups = {}
for merchant, amount in table.values():
    n, total = groups.get(merchant, (0, Decimal(0)))
    groups[merchant] = (n + 1, total + amount)
json.dump({m: [n, float(t)] for m, (n, t) in groups.items()}, open(want, "w"))
PY

latest() { # topic [values]: its records, and with values its {merchant: [n, total]} per key
  "$PY" - "$B" "$@" <<'PY'
import json, sys
from confluent_kafka import Consumer, TopicPartition
b, topic, values = sys.argv[1], sys.argv[2], len(sys.argv) > 3
c = Consumer({"bootstrap.servers": b, "group.id": "latest", "isolation.level": "read_committed",
              "enable.auto.commit": False})
out, n = {}, 0
for p in c.list_topics(topic, timeout=30).topics[topic].partitions:
    lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
    if hi <= lo:
        continue
    c.assign([TopicPartition(topic, p, lo)])
    done = False
    while not done:
        for m in c.consume(10000, 5):
            if m.error():
                continue
            n += 1
            done = m.offset() >= hi - 2
            if not values:
                continue
            key = json.loads(m.key())["merchant"]
            v = m.value()
            out[key] = None if v is None else [json.loads(v)["n"], json.loads(v)["total"]]
print(json.dumps({"records": n, "latest": {k: v for k, v in out.items() if v is not None}}))
PY
}

declare -A CPU=() WALL=()
for f in append debezium; do
  out=cl-out-$f-$RUN
  /usr/bin/time -f '%e %U %S' -o "$WORK/$f.time" "$UBIK" run "$SQL" \
    --from "orders=kafka://$B/${TOPIC[$f]}?start=earliest&end=latest${FORMAT[$f]}" \
    --schema "orders=$SCHEMA" --to "kafka://$B/$out?partitions=$PARTS" \
    --checkpoint "$WORK/ck-$f" --checkpoint-interval 1s -q 2>"$WORK/$f.log" ||
    { echo "$f failed:" >&2; tail -20 "$WORK/$f.log" >&2; exit 1; }
  read -r wall user sys < <(tail -1 "$WORK/$f.time")
  CPU[$f]=$(awk -v u="$user" -v s="$sys" 'BEGIN { print u + s }')
  WALL[$f]=$wall
  # The Debezium run's values are checked below; the other's records are only counted.
  values=()
  [[ $f == append ]] || values=(values)
  latest "$out" "${values[@]}" >"$WORK/$f.out"
  records=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["records"])' "$WORK/$f.out")
  awk -v f="$f" -v n="$EVENTS" -v w="$wall" -v c="${CPU[$f]}" -v o="$records" \
    'BEGIN { printf "{\"input\":\"%s\",\"changes\":%d,\"seconds\":%.3f,\"cpu\":%.3f,\"changes_per_cpu_s\":%.0f,\"changes_per_s\":%.0f,\"output\":%d}\n", f, n, w, c, n / c, n / w, o }'
done
"$PY" - "$WORK/want.json" "$WORK/debezium.out" <<'PY'
import json, math, sys
want = json.load(open(sys.argv[1]))
got = json.load(open(sys.argv[2]))["latest"]
bad = [m for m in set(want) | set(got)
       if m not in want or m not in got or got[m][0] != want[m][0] or not math.isclose(got[m][1], want[m][1], rel_tol=1e-12)]
if bad:
    sys.exit(f"the Debezium run's latest per merchant differs from the final table's aggregate: {sorted(bad)[:5]}")
print(f"the Debezium run's latest per merchant equals the final table's aggregate ({len(want)} merchants)", file=sys.stderr)
PY
awk -v a="${CPU[append]}" -v d="${CPU[debezium]}" -v wa="${WALL[append]}" -v wd="${WALL[debezium]}" \
  'BEGIN { printf "{\"debezium_vs_append_only_cpu\":%.3f,\"debezium_vs_append_only_wall\":%.3f}\n", a / d, wa / wd }'
