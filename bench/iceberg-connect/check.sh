#!/usr/bin/env bash
# Downstream check: Apache Iceberg's Kafka Connect sink (1.11.0; 1.12 fails on Kafka 4.4)
# reads ubik's changelog and auto-creates its table from the records' Connect schema. For each
# output format (json-connect: JsonConverter with schemas.enable=true; avro: Confluent-framed
# through the test registry, read by Apicurio's AvroConverter) it runs one bounded query into a
# fresh topic, registers an Iceberg sink (append mode: the Apache sink has no upsert/CDC mode)
# writing to a Hadoop catalog on the local filesystem, waits for its commit, then reads the
# table with pyiceberg (check.py) and prints the table's schema and PASS/FAIL: w a timestamp,
# n a long, total a double; the rows equal the topic's records, and the latest row per key
# equals the topic's latest value per key.
#
#   bench/iceberg-connect/check.sh [FORMATS="json-connect avro"] [COUNT=5000]
#
# The sink runs in a Connect worker of its own (standalone mode, REST on $UBIK_ICEBERG_PORT,
# default 38093): debezium.sh's worker has a fixed plugin.path. It uses that worker's jars
# (testing/debezium/debezium.sh install) as classpath, and as plugin.path the Iceberg plugin
# fetched by pom.xml beside this script plus debezium.sh's plugins (Apicurio's converter).
# Everything lands under $UBIK_CACHE_DIR (default $HOME/.cache/ubik): the plugin in
# iceberg-connect-<version>/, the worker's state and the warehouse in iceberg-connect-run/.
# The worker is stopped at the end; broker and registry stay up (their scripts stop them).
#
# Env: UBIK (a ubik binary; default target/debug/ubik, copied first), KEEP=1 keeps the run's
# directory (worker log and warehouse; kept anyway when a check fails), UBIK_ICEBERG_TIMEOUT
# (seconds to wait for the commit, default 120), UBIK_ICEBERG_PORT.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
FORMATS=${1:-"json-connect avro"}
COUNT=${2:-5000}
CACHE=${UBIK_CACHE_DIR:-$HOME/.cache/ubik}
VERSION=$(sed -n 's:.*<iceberg.version>\(.*\)</iceberg.version>.*:\1:p' "$HERE/pom.xml")
DBZ_VERSION=$(sed -n 's:.*<debezium.version>\(.*\)</debezium.version>.*:\1:p' "$ROOT/testing/debezium/pom.xml")
INST=$CACHE/iceberg-connect-$VERSION
PLUGINS=$INST/plugins
MARKER=$INST/installed
DBZ=$CACHE/debezium-$DBZ_VERSION
PORT=${UBIK_ICEBERG_PORT:-38093}
URL=http://127.0.0.1:$PORT
TIMEOUT=${UBIK_ICEBERG_TIMEOUT:-120}
RUN=$(date +%s)-$$
STATE=$CACHE/iceberg-connect-run/$RUN
WAREHOUSE=$STATE/warehouse
LOG=$STATE/connect.log
T0=$SECONDS

die() { echo "check.sh: $*" >&2; exit 1; }
stamp() { echo "[$((SECONDS - T0))s] $*"; }

# --- the plugin ---------------------------------------------------------------------------------
install_plugin() {
  local sum
  sum=$(sha256sum "$HERE/pom.xml" | cut -d' ' -f1)
  [[ $(cat "$MARKER" 2>/dev/null) == "$sum" ]] && return 0
  stamp "fetching the Iceberg sink $VERSION into $PLUGINS"
  rm -rf "$MARKER" "$PLUGINS" "$INST/tmp"
  mkdir -p "$INST/tmp"
  mvn -B -q -f "$HERE/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
    -DoutputDirectory="$INST/tmp/iceberg-kafka-connect" >"$INST/mvn.log" 2>&1 ||
    { cat "$INST/mvn.log" >&2; die "fetching the Iceberg sink's jars with Maven failed"; }
  mkdir -p "$PLUGINS" && mv "$INST/tmp/iceberg-kafka-connect" "$PLUGINS/" && rm -rf "$INST/tmp" "$INST/mvn.log"
  echo "$sum" >"$MARKER"
}

# --- servers ------------------------------------------------------------------------------------
B=$("$ROOT/testing/kafka/broker.sh" start | tail -1)
CCOMPAT=$("$ROOT/testing/registry/registry.sh" start | tail -1)
"$ROOT/testing/debezium/debezium.sh" install # the worker's jars ($DBZ/lib) and Apicurio's plugin
install_plugin
PY=$("$ROOT/scripts/python-env.sh") # pyiceberg, pyarrow, confluent-kafka
stamp "broker $B, registry $CCOMPAT, plugin $PLUGINS"

WORK=$(mktemp -d)
UBIK_SRC=${UBIK:-$ROOT/target/debug/ubik}
cp "$UBIK_SRC" "$WORK/ubik" # the tree's binary may be rebuilt meanwhile
mkdir -p "$STATE"
WPID=
rc=1 # until the checks set it
cleanup() {
  if [[ -n $WPID ]]; then
    kill "$WPID" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$WPID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$WPID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
  if [[ ${KEEP:-} == 1 || $rc != 0 ]]; then echo "kept $STATE"; else rm -rf "$STATE"; fi
}
trap cleanup EXIT

# --- our Connect worker (standalone) ------------------------------------------------------------
(exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && die "127.0.0.1:$PORT is in use (UBIK_ICEBERG_PORT)"
cat >"$STATE/worker.properties" <<EOF
bootstrap.servers=$B
offset.storage.file.filename=$STATE/offsets
listeners=http://127.0.0.1:$PORT
rest.advertised.host.name=127.0.0.1
rest.advertised.port=$PORT
plugin.path=$PLUGINS,$DBZ/plugins
plugin.discovery=service_load
key.converter=org.apache.kafka.connect.json.JsonConverter
value.converter=org.apache.kafka.connect.json.JsonConverter
connector.client.config.override.policy=All
task.shutdown.graceful.timeout.ms=2000
# Sink tasks answer the Iceberg coordinator's commit requests at an offset flush (default 60s).
offset.flush.interval.ms=1000
EOF
cat >"$STATE/log4j2.properties" <<'EOF'
rootLogger.level=INFO
rootLogger.appenderRef.out.ref=out
appender.out.type=Console
appender.out.name=out
appender.out.layout.type=PatternLayout
appender.out.layout.pattern=[%d] %p %m (%c)%n
logger.cfg.name=org.apache.kafka.common.config.AbstractConfig
logger.cfg.level=WARN
logger.hadoop.name=org.apache.hadoop
logger.hadoop.level=WARN
EOF
(cd "$STATE" && exec setsid java -Xmx768m -XX:TieredStopAtLevel=1 -XX:+ExitOnOutOfMemoryError \
  -Djava.awt.headless=true "-Dlog4j2.configurationFile=$STATE/log4j2.properties" \
  -cp "$DBZ/lib/*" org.apache.kafka.connect.cli.ConnectStandalone "$STATE/worker.properties" \
  </dev/null >"$LOG" 2>&1) &
WPID=$!
deadline=$((SECONDS + 90))
until curl -s --max-time 2 "$URL/connector-plugins" | grep -qF org.apache.iceberg.connect.IcebergSinkConnector; do
  kill -0 "$WPID" 2>/dev/null || { tail -n 40 "$LOG" >&2; die "the Connect worker exited"; }
  ((SECONDS < deadline)) || { tail -n 40 "$LOG" >&2; die "the Connect worker was not ready after 90s"; }
  sleep 0.3
done
stamp "Connect worker up at $URL (log $LOG)"

SQL="SELECT merchant, TUMBLE(ts, INTERVAL '1' MINUTE) AS w, count(*) AS n, sum(amount) AS total FROM orders GROUP BY merchant, TUMBLE(ts, INTERVAL '1' MINUTE)"
# late=: some rows arrive after their window first closed, so keys get updated (upserts).
SRC="demo://orders?count=$COUNT&keys=50&late=0.05"
rc=0
for fmt in $FORMATS; do
  tag=${fmt//-/_}
  topic=ice-$tag-$RUN
  table=ubik.${tag}_${RUN//-/_}
  case $fmt in
  json-connect) dest="kafka://$B/$topic?format=json-connect" ;;
  # timestamp_unit=ms: `w` as timestamp-millis, the one timestamp Connect's Avro converters
  # (Apicurio's, Confluent's) read as a Connect Timestamp; timestamp-micros becomes a long.
  avro) dest="kafka://$B/$topic?format=avro&registry=$CCOMPAT&timestamp_unit=ms" ;;
  *) die "unknown format $fmt" ;;
  esac
  echo
  stamp "=== $fmt: ubik -> $topic"
  t=$SECONDS
  "$WORK/ubik" run "$SQL" --from "$SRC" --to "$dest" --log warn </dev/null
  stamp "ubik done in $((SECONDS - t))s"
  conf=$(BOOTSTRAP=$B "$PY" "$HERE/check.py" config "$fmt" "$topic" "$table" "$WAREHOUSE" "$CCOMPAT" "$RUN")
  t=$SECONDS
  code=$(curl -s -o "$STATE/put.out" -w '%{http_code}' -X PUT -H 'Content-Type: application/json' \
    --data "$conf" "$URL/connectors/iceberg-$tag-$RUN/config")
  [[ $code == 20? ]] || { cat "$STATE/put.out" >&2; die "registering the sink failed ($code)"; }
  stamp "sink iceberg-$tag-$RUN registered, table $table"
  if BOOTSTRAP=$B CONNECT=$URL TIMEOUT=$TIMEOUT "$PY" "$HERE/check.py" verify "$fmt" "$topic" \
    "$table" "$WAREHOUSE" "$CCOMPAT" "iceberg-$tag-$RUN"; then
    stamp "$fmt: PASS (sink to verified table $((SECONDS - t))s)"
  else
    stamp "$fmt: FAIL ($((SECONDS - t))s)"
    rc=1
  fi
  curl -s -o /dev/null -X DELETE "$URL/connectors/iceberg-$tag-$RUN" || true
done
exit $rc
