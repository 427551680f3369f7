#!/usr/bin/env bash
# A real single-node Apache Kafka broker (KRaft: broker and controller in one JVM) for ubik's
# integration tests, listening on 127.0.0.1 only. No Docker: the jars come from Maven Central
# through pom.xml beside this script, and are cached outside the repo.
#
#   broker.sh install   fetch the jars once into $UBIK_CACHE_DIR/kafka-<version>/lib
#   broker.sh start     install if needed, start (or reuse) the broker, print its address
#   broker.sh stop | status | address | clean   (clean = stop and delete the broker's data)
#   broker.sh check-format   self-check: storage formats whatever the cluster id begins with
#
# Env: UBIK_CACHE_DIR (default $HOME/.cache/ubik), UBIK_KAFKA_PORT (default 39092; the
# controller listens on PORT+1), UBIK_KAFKA_START_TIMEOUT (seconds, default 60),
# UBIK_KAFKA_JAVA_OPTS (extra JVM flags, appended).
# Needs Java 17+, Maven 3.6.3+ (first install only), flock. selfcheck.py shows what works.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${UBIK_CACHE_DIR:-$HOME/.cache/ubik}
VERSION=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$HERE/pom.xml")
LIB=$CACHE/kafka-$VERSION/lib
MARKER=$CACHE/kafka-$VERSION/installed # written last; holds the hash of the pom it came from
JSA=$CACHE/kafka-$VERSION/classes.jsa   # class-data-sharing archive of the broker's classes
PORT=${UBIK_KAFKA_PORT:-39092}
CPORT=$((PORT + 1))
STATE=$CACHE/kafka-run/$PORT # config, data, log and pid of the broker on this port
PIDFILE=$STATE/kafka.pid
LOG=$STATE/server.log
TIMEOUT=${UBIK_KAFKA_START_TIMEOUT:-60}

die() { echo "broker.sh: $*" >&2; exit 1; }

# Serialise install/start/stop: parallel test jobs may share the cache and the broker.
lock() { mkdir -p "$CACHE"; exec 9>"$CACHE/kafka.lock"; flock 9; }

# Whether pid $1 is our broker on $PORT. Not `kill -0`: that is true for a zombie (and the pid
# may have been reused); a zombie's cmdline is empty.
alive() { tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline" | grep -qF "kafka.Kafka $STATE/server.properties"; }

# shellcheck source=../jvm-service.sh
source "$HERE/../jvm-service.sh"

install() {
  local sum
  sum=$(sha256sum "$HERE/pom.xml" | cut -d' ' -f1)
  [[ $(cat "$MARKER" 2>/dev/null) == "$sum" ]] && return 0
  command -v mvn >/dev/null || die "mvn not found: Maven is needed to fetch Kafka $VERSION"
  echo "broker.sh: installing Apache Kafka $VERSION into $LIB" >&2
  rm -rf "$MARKER" "$JSA" "$LIB" "$LIB.tmp"
  mkdir -p "$LIB.tmp"
  mvn -B -q -f "$HERE/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
    -DoutputDirectory="$LIB.tmp" >"$LIB.tmp/../mvn.log" 2>&1 ||
    { cat "$LIB.tmp/../mvn.log" >&2; die "fetching Kafka $VERSION with Maven failed"; }
  mv "$LIB.tmp" "$LIB"
  echo "$sum" >"$MARKER"
}

server_properties() {
  cat <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$CPORT
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CPORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CPORT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
log.dirs=$STATE/data
num.partitions=1
auto.create.topics.enable=true
group.initial.rebalance.delay.ms=0
# Lets the group tests' members use a 2.5 s session timeout (default floor 6 s), so a killed
# member's tasks move sooner.
group.min.session.timeout.ms=1000
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
# Fewer internal partitions (default 50) make the first group / transaction quicker to set up.
offsets.topic.num.partitions=4
transaction.state.log.num.partitions=4
# Abort transactions that exceeded their transaction.timeout.ms within ~1 s (default 10 s).
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
EOF
}

write_config() {
  server_properties >"$STATE/server.properties"
  cat >"$STATE/log4j2.properties" <<'EOF'
rootLogger.level=INFO
rootLogger.appenderRef.out.ref=out
appender.out.type=Console
appender.out.name=out
appender.out.layout.type=PatternLayout
appender.out.layout.pattern=[%d] %p %m (%c)%n
EOF
}

# Java flags: a modest heap (2-core CI machines); C1 only starts ~0.6 s quicker (measured; set
# UBIK_KAFKA_JAVA_OPTS=-XX:TieredStopAtLevel=4 for full JIT in benchmarks). SerialGC gained nothing.
# shellcheck disable=SC2206 # UBIK_KAFKA_JAVA_OPTS is a space-separated list of flags
JAVA_OPTS=(-Xmx1g -Xms256m -XX:TieredStopAtLevel=1 -XX:+ExitOnOutOfMemoryError
  -Djava.awt.headless=true "-Dlog4j2.configurationFile=$STATE/log4j2.properties"
  -Dlog4j2.shutdownHookEnabled=false # else logging stops before the broker's shutdown is logged
  "-XX:ErrorFile=$STATE/hs_err_%p.log" # not in the caller's working directory
  ${UBIK_KAFKA_JAVA_OPTS:-})

# A random Kafka Uuid: 16 bytes in URL-safe base64 without padding. Like Kafka's own
# Uuid.randomUuid, never one that begins with '-' (1 in 64 would), which command-line tools
# would read as an option.
new_cluster_id() {
  local id
  while :; do
    id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')
    [[ $id == -* ]] || break
  done
  echo "$id"
}

# Formats the log.dirs of config $1 for cluster id $2. Kafka 4.x: --standalone makes this node
# the single voter of a dynamic quorum; it requires controller.quorum.bootstrap.servers and
# refuses controller.quorum.voters. `--cluster-id=ID` in one word, so that no id can be taken
# for an option, whatever new_cluster_id makes.
format_storage() {
  java "${JAVA_OPTS[@]}" -cp "$LIB/*" kafka.tools.StorageTool format --standalone \
    --config "$1" --cluster-id="$2"
}

# Self-check of format_storage and new_cluster_id: formats a throwaway copy of the broker's
# storage with an id that begins with '-', and checks the generator never makes one.
check_format() {
  install
  local dir id i
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' RETURN
  id=-abcdefghijklmnopqrstu
  STATE=$dir write_config
  format_storage "$dir/server.properties" "$id" >"$dir/format.log" 2>&1 ||
    { cat "$dir/format.log" >&2; die "check-format: formatting with cluster id $id failed"; }
  grep -qx "cluster.id=$id" "$dir/data/meta.properties" ||
    die "check-format: $dir/data/meta.properties does not hold cluster.id=$id"
  for ((i = 0; i < 256; i++)); do
    id=$(new_cluster_id)
    [[ $id =~ ^[A-Za-z0-9_][A-Za-z0-9_-]{21}$ ]] || die "check-format: bad generated cluster id '$id'"
  done
  echo "broker.sh: check-format passed (an id beginning with '-' formats; 256 generated ids are valid)"
}

fail_start() {
  echo "broker.sh: $1; last lines of $LOG:" >&2
  tail -n 40 "$LOG" >&2 || true
  exit 1
}

# Whether the running broker's server.properties is the one write_config writes now.
config_matches() { [[ $(server_properties) == "$(cat "$STATE/server.properties" 2>/dev/null)" ]]; }

# Ready = the port accepts connections and the broker logged that startup finished, which
# KafkaRaftServer does only once the broker is caught up with the metadata log and unfenced.
wait_ready() {
  local pid=$1 deadline=$((SECONDS + TIMEOUT))
  until port_open "$PORT" && grep -q 'Kafka Server started' "$LOG"; do
    # Not alive(): right after the fork the child's cmdline is still this script's.
    # A corrupt class-data archive can crash the JVM: drop it, a later stop() makes a new one.
    running "$pid" || { rm -f "$JSA"; fail_start "the broker exited"; }
    if ((SECONDS >= deadline)); then
      kill "$pid" 2>/dev/null || true
      fail_start "the broker was not ready after ${TIMEOUT}s (stopped it)"
    fi
    sleep 0.1
  done
}

start() {
  install
  local pid p
  # A broker started with other settings (an older checkout's) is restarted with these.
  if pid=$(our_pid) && ! config_matches; then
    echo "broker.sh: the running broker's settings differ from this script's: restarting it" >&2
    stop
  fi
  if ! pid=$(our_pid); then
    for p in "$PORT" "$CPORT"; do
      ! port_open "$p" || die "127.0.0.1:$p is in use by another program (not a broker started" \
        "by this script); stop it or choose other ports with UBIK_KAFKA_PORT"
    done
    mkdir -p "$STATE"
    write_config
    # Data formatted by another Kafka version may not load: start afresh when it changes.
    [[ $(cat "$STATE/version" 2>/dev/null) == "$VERSION" ]] || rm -rf "$STATE/data"
    if [[ ! -f $STATE/data/meta.properties ]]; then
      format_storage "$STATE/server.properties" "$(new_cluster_id)" >"$STATE/format.log" 2>&1 ||
        { cat "$STATE/format.log" >&2; die "formatting $STATE/data failed"; }
      echo "$VERSION" >"$STATE/version"
    fi
    [[ ! -f $LOG ]] || mv "$LOG" "$LOG.1"
    # Class-data sharing cuts the start from ~2.2 s to ~1.3 s: the first broker dumps its loaded
    # classes when it exits, and stop() keeps that archive if the exit was clean.
    rm -f "$STATE/classes.jsa"
    local cds=(-XX:ArchiveClassesAtExit="$STATE/classes.jsa")
    [[ ! -f $JSA ]] || cds=(-XX:SharedArchiveFile="$JSA")
    # setsid: the broker outlives this script and ignores Ctrl-C meant for the test run.
    # 9>&-: it must not inherit (and so hold) the lock.
    setsid java "${JAVA_OPTS[@]}" "${cds[@]}" -cp "$LIB/*" kafka.Kafka "$STATE/server.properties" \
      </dev/null >"$LOG" 2>&1 9>&- &
    pid=$!
    echo "$pid" >"$PIDFILE"
  fi
  wait_ready "$pid"
  # The JVM ignores (with a [cds] warning) an archive made by another JDK build: remake it.
  ! grep -q '\]\[cds' "$LOG" || rm -f "$JSA"
  echo "127.0.0.1:$PORT"
}

stop() {
  # A clean shutdown takes ~0.4 s (~3 s when it dumps the class archive); give it 30 s.
  stop_server 30
}

case ${1:-} in
install) lock && install ;;
# One retry: a port still held by a broker that is just exiting fails the first bind.
start) lock && { (start) || { echo "broker.sh: retrying the start once" >&2; sleep 3; (start); }; } ;;
stop) lock && stop ;;
check-format) lock && check_format ;;
clean) lock && stop && rm -rf "$STATE" ;;
status)
  if pid=$(our_pid) && port_open "$PORT"; then
    echo "running: pid $pid, 127.0.0.1:$PORT, Kafka $VERSION, log $LOG"
  else
    echo "not running (port $PORT)"
    exit 1
  fi
  ;;
address) echo "127.0.0.1:$PORT" ;;
*) die "usage: broker.sh install|start|stop|status|address|clean|check-format" ;;
esac
