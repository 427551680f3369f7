#!/usr/bin/env bash
# Real Debezium change events for ubik's integration tests: a PostgreSQL server (Debian's
# packages, wal_level=logical) and one Kafka Connect worker (distributed mode, its config,
# offset and status topics on the test broker) with Debezium's PostgreSQL connector and
# Apicurio's Avro converter on its plugin.path. Both listen on 127.0.0.1 only. No Docker: the
# jars come from Maven Central through pom.xml beside this script, cached outside the repo.
# Tests add connectors through Connect's REST API; selfcheck.py shows how, and what comes out.
#
#   debezium.sh install   PostgreSQL via apt-get if missing (root), the jars once into
#                         $UBIK_CACHE_DIR/debezium-<version>/{lib,plugins}
#   debezium.sh start     install if needed, start (or reuse) Postgres and Connect, print address
#   debezium.sh stop | status | address | clean   (clean = stop and delete the Postgres data
#                         and Connect's state; the worker's topics then get new names, the old
#                         three stay on the broker)
#
# Connectors need plugin.name=pgoutput (the default, decoderbufs, is not installed), a slot.name
# and publication.name of their own, and skipped.operations=none to emit TRUNCATE (op "t"; the
# default skips it). Delete them (DELETE /connectors/NAME) and drop their slot after the test:
# a slot left behind keeps WAL, and the worker restarts its connectors when it starts.
#
# `address` (and `start`) print two lines, Connect's REST URL and a libpq DSN for psql:
#   http://127.0.0.1:38083
#   postgresql://postgres@127.0.0.1:35432/postgres
# Postgres trusts any loopback connection (user postgres, a superuser; replication too).
#
# Env: UBIK_CACHE_DIR (default $HOME/.cache/ubik), UBIK_PG_PORT (default 35432),
# UBIK_CONNECT_PORT (default 38083), UBIK_TEST_KAFKA (bootstrap servers; default the address
# of testing/kafka/broker.sh, which must be started first), UBIK_DEBEZIUM_START_TIMEOUT
# (seconds, default 90), UBIK_CONNECT_JAVA_OPTS (extra JVM flags, appended).
# Needs Java 17+, Maven 3.6.3+ (first install only), curl, flock; root or the postgresql
# package already installed. As root the server runs as the `postgres` OS user; its data then
# lives under ~postgres/ubik-debezium-run/ when that user cannot reach $UBIK_CACHE_DIR.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${UBIK_CACHE_DIR:-$HOME/.cache/ubik}
VERSION=$(sed -n 's:.*<debezium.version>\(.*\)</debezium.version>.*:\1:p' "$HERE/pom.xml")
INST=$CACHE/debezium-$VERSION
LIB=$INST/lib                  # the Connect worker's classpath
PLUGINS=$INST/plugins          # its plugin.path: one directory per plugin
MARKER=$INST/installed         # written last; holds the hash of the pom it came from
JSA=$INST/classes.jsa          # class-data-sharing archive of the worker's classes
PORT=${UBIK_CONNECT_PORT:-38083}
PGPORT=${UBIK_PG_PORT:-35432}
STATE=$CACHE/debezium-run/$PORT # Connect's config, log and pid; Postgres's data (see pg_dir)
PIDFILE=$STATE/connect.pid
LOG=$STATE/connect.log
TIMEOUT=${UBIK_DEBEZIUM_START_TIMEOUT:-90}
URL=http://127.0.0.1:$PORT
DSN=postgresql://postgres@127.0.0.1:$PGPORT/postgres

die() { echo "debezium.sh: $*" >&2; exit 1; }

# Serialise install/start/stop: parallel test jobs may share the cache and the servers.
lock() { mkdir -p "$CACHE"; exec 9>"$CACHE/debezium.lock"; flock 9; }

# Whether pid $1 is our Connect worker (it carries -Dubik.connect.state=$STATE). Not `kill -0`:
# that is true for a zombie (and the pid may have been reused); a zombie's cmdline is empty.
alive() { tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline" | grep -qF -- "-Dubik.connect.state=$STATE "; }

# shellcheck source=../jvm-service.sh
source "$HERE/../jvm-service.sh"

# --- PostgreSQL -------------------------------------------------------------------------------

# The newest installed server's bin directory (Debian: /usr/lib/postgresql/<major>/bin).
pg_bin() {
  local ctls=(/usr/lib/postgresql/*/bin/pg_ctl)
  [[ -x ${ctls[0]} ]] || return 1
  dirname "$(printf '%s\n' "${ctls[@]}" | sort -V | tail -n 1)"
}

# Runs a server program as the server's OS user: Postgres refuses to run as root. From /, as
# that user may not reach the caller's working directory.
pg() {
  if ((EUID == 0)); then
    (cd / && runuser -u postgres -- "$PGBIN/$1" "${@:2}")
  else
    "$PGBIN/$1" "${@:2}"
  fi
}

# The directory of our server's data and log: $STATE/postgres-$PGPORT, or, when we are root and
# the postgres user cannot reach the cache (e.g. it is under /root, mode 700), the same path
# under that user's home.
pg_dir() {
  if ((EUID == 0)) && ! (cd / && runuser -u postgres -- test -x "$CACHE") 2>/dev/null; then
    echo "$(getent passwd postgres | cut -d: -f6)/ubik-debezium-run/$PORT/postgres-$PGPORT"
  else
    echo "$STATE/postgres-$PGPORT"
  fi
}

install_postgres() {
  PGBIN=$(pg_bin) && return 0
  ((EUID == 0)) || die "PostgreSQL is not installed; as root: apt-get install -y postgresql"
  echo "debezium.sh: installing PostgreSQL from Debian's packages" >&2
  local before
  before=$(pg_lsclusters -h 2>/dev/null | awk '$4 == "online" {print $1 "/" $2}' || true)
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >"$CACHE/apt.log" 2>&1 ||
    { cat "$CACHE/apt.log" >&2; die "apt-get install postgresql failed"; }
  # The package creates and (where an init system runs) starts a "main" cluster on 5432; we
  # run our own server, so stop any cluster that the install started.
  local c
  for c in $(pg_lsclusters -h 2>/dev/null | awk '$4 == "online" {print $1 "/" $2}'); do
    grep -qxF "$c" <<<"$before" || pg_ctlcluster "${c%/*}" "${c#*/}" stop || true
  done
  PGBIN=$(pg_bin) || die "apt-get installed postgresql, yet no /usr/lib/postgresql/*/bin/pg_ctl"
}

pg_running() { [[ -f $PGDATA/PG_VERSION ]] && pg pg_ctl status -D "$PGDATA" >/dev/null 2>&1; }

start_postgres() {
  local dir
  dir=$(pg_dir)
  PGDATA=$dir/data
  pg_running && return 0
  ! port_open "$PGPORT" || die "127.0.0.1:$PGPORT is in use by another program (not a" \
    "Postgres started by this script); stop it or choose another port with UBIK_PG_PORT"
  if [[ ! -f $PGDATA/PG_VERSION ]]; then
    mkdir -p "$dir" || die "cannot create $dir"
    ((EUID != 0)) || chown postgres: "$dir" || die "cannot give $dir to the postgres user"
    # trust: any loopback connection may log in (as postgres, a superuser), replication too.
    pg initdb -D "$PGDATA" -U postgres -A trust -E UTF8 --no-locale --no-sync \
      >"$STATE/initdb.log" 2>&1 || { cat "$STATE/initdb.log" >&2; die "initdb $PGDATA failed"; }
  fi
  # Settings on the command line (not in postgresql.conf), so that this script shows them all.
  # TCP only (no Unix socket: psql and Debezium use 127.0.0.1). wal_level=logical for Debezium;
  # slots and senders for many connectors at once. fsync=off: test data, only an OS crash could
  # lose it, and clean starts afresh.
  local opts="-c listen_addresses=127.0.0.1 -p $PGPORT -c unix_socket_directories=''"
  opts+=" -c wal_level=logical -c max_replication_slots=32 -c max_wal_senders=32"
  opts+=" -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
  # 9>&-: the server must not inherit (and so hold) the lock.
  pg pg_ctl start -D "$PGDATA" -l "$dir/postgres.log" -w -t "$TIMEOUT" -o "$opts" \
    >"$STATE/pg_ctl.log" 2>&1 9>&- ||
    { cat "$STATE/pg_ctl.log" >&2; tail -n 20 "$dir/postgres.log" >&2 || true
      die "Postgres did not start (data $PGDATA)"; }
  local deadline=$((SECONDS + TIMEOUT))
  until "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$PGPORT"; do
    ((SECONDS < deadline)) || die "Postgres on 127.0.0.1:$PGPORT not ready after ${TIMEOUT}s"
    sleep 0.1
  done
}

stop_postgres() {
  PGBIN=$(pg_bin) || return 0
  PGDATA=$(pg_dir)/data
  pg_running || return 0
  pg pg_ctl stop -D "$PGDATA" -m fast -w -t 60 >/dev/null
}

# --- Kafka Connect ----------------------------------------------------------------------------

install_jars() {
  local sum p
  sum=$(sha256sum "$HERE/pom.xml" | cut -d' ' -f1)
  [[ $(cat "$MARKER" 2>/dev/null) == "$sum" ]] && return 0
  command -v mvn >/dev/null || die "mvn not found: Maven is needed to fetch Connect and Debezium"
  command -v jar >/dev/null || die "jar not found: it comes with a JDK (17+)"
  echo "debezium.sh: installing Kafka Connect and Debezium $VERSION into $INST" >&2
  rm -rf "$MARKER" "$JSA" "$LIB" "$PLUGINS" "$INST/tmp"
  mkdir -p "$INST/tmp"
  # One Maven run per profile of the pom: the worker's classpath, then each plugin's directory.
  for p in worker:lib postgres:plugins/debezium-connector-postgres \
    apicurio:plugins/apicurio-registry-converter; do
    mvn -B -q -f "$HERE/pom.xml" -P"${p%%:*}" dependency:copy-dependencies -DincludeScope=runtime \
      -DoutputDirectory="$INST/tmp/${p#*:}" >"$INST/mvn.log" 2>&1 ||
      { cat "$INST/mvn.log" >&2; die "fetching the jars of profile ${p%%:*} with Maven failed"; }
  done
  # Apicurio's jars lack the ServiceLoader manifest that lets the worker find its converters
  # without scanning every class (plugin.discovery=service_load: ~0.3 s instead of ~7 s).
  mkdir -p "$INST/tmp/manifest/META-INF/services"
  printf '%s\n' io.apicurio.registry.utils.converter.AvroConverter \
    io.apicurio.registry.utils.converter.ExtJsonConverter \
    >"$INST/tmp/manifest/META-INF/services/org.apache.kafka.connect.storage.Converter"
  jar --create --file "$INST/tmp/plugins/apicurio-registry-converter/ubik-service-manifest.jar" \
    -C "$INST/tmp/manifest" META-INF || die "writing the converters' manifest with jar failed"
  { mv "$INST/tmp/lib" "$LIB" && mv "$INST/tmp/plugins" "$PLUGINS"; } || die "moving the jars into $INST failed"
  rm -rf "$INST/tmp" "$INST/mvn.log" # Maven keeps its own copy in ~/.m2
  echo "$sum" >"$MARKER"
}

# The broker: $UBIK_TEST_KAFKA, else the test broker's address. Its first host:port must accept
# connections.
bootstrap() {
  local b=${UBIK_TEST_KAFKA:-} first
  [[ -n $b ]] || b=$("$HERE/../kafka/broker.sh" address)
  first=${b%%,*}
  (exec 3<>"/dev/tcp/${first%:*}/${first##*:}") 2>/dev/null ||
    die "no Kafka broker at $first; start one (testing/kafka/broker.sh start) or set UBIK_TEST_KAFKA"
  echo "$b"
}

# $1: the bootstrap servers. Topic and group names carry an id made at the first start and
# dropped by clean, so that a fresh Postgres never meets connectors of an earlier one.
write_config() {
  local id
  [[ -s $STATE/connect-id ]] || head -c 4 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$STATE/connect-id"
  id=ubik-connect-$PORT-$(cat "$STATE/connect-id")
  cat >"$STATE/worker.properties" <<EOF
bootstrap.servers=$1
group.id=$id
config.storage.topic=$id-configs
offset.storage.topic=$id-offsets
status.storage.topic=$id-status
config.storage.replication.factor=1
offset.storage.replication.factor=1
status.storage.replication.factor=1
# One partition each (defaults 25 and 5): quicker to create and to read back at a start.
offset.storage.partitions=1
status.storage.partitions=1
listeners=http://127.0.0.1:$PORT
rest.advertised.host.name=127.0.0.1
rest.advertised.port=$PORT
plugin.path=$PLUGINS
# Find plugins by their ServiceLoader manifests only, not by scanning all their classes.
plugin.discovery=service_load
# Defaults for connectors that set none; tests usually set their own converters.
key.converter=org.apache.kafka.connect.json.JsonConverter
value.converter=org.apache.kafka.connect.json.JsonConverter
# Commit source offsets every second (default 60 s), so a restarted connector resumes nearby.
offset.flush.interval.ms=1000
# Reassign a departed worker's connectors at once (default 5 min) and stop tasks quicker.
scheduled.rebalance.max.delay.ms=0
task.shutdown.graceful.timeout.ms=2000
# Tests may set producer.override.* / consumer.override.* per connector.
connector.client.config.override.policy=All
EOF
  cat >"$STATE/log4j2.properties" <<'EOF'
rootLogger.level=INFO
rootLogger.appenderRef.out.ref=out
appender.out.type=Console
appender.out.name=out
appender.out.layout.type=PatternLayout
appender.out.layout.pattern=[%d] %p %m (%c)%n
# The worker's clients log every config they create at INFO: pages of it per connector.
logger.cfg.name=org.apache.kafka.common.config.AbstractConfig
logger.cfg.level=WARN
EOF
}

# Java flags: a modest heap (2-core CI machines); C1 only, as for the broker and the registry.
# shellcheck disable=SC2206 # UBIK_CONNECT_JAVA_OPTS is a space-separated list of flags
JAVA_OPTS=(-Xmx512m -XX:TieredStopAtLevel=1 -XX:+ExitOnOutOfMemoryError
  -Djava.awt.headless=true "-XX:ErrorFile=$STATE/hs_err_%p.log"
  "-Dlog4j2.configurationFile=$STATE/log4j2.properties"
  -Dlog4j2.shutdownHookEnabled=false # else logging stops before the shutdown is logged
  "-Dubik.connect.state=$STATE"      # how alive() recognises our worker
  ${UBIK_CONNECT_JAVA_OPTS:-})

fail_start() {
  echo "debezium.sh: $1; last lines of $LOG:" >&2
  tail -n 40 "$LOG" >&2 || true
  exit 1
}

# Ready = the REST API lists connectors (200; the worker has joined its group and read its
# config topic) and Debezium's connector is among the plugins it found.
ready() {
  [[ $(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$URL/connectors" 2>/dev/null) == 200 ]] &&
    curl -s --max-time 2 "$URL/connector-plugins" | grep -qF io.debezium.connector.postgresql.PostgresConnector
}

wait_ready() {
  local pid=$1 deadline=$((SECONDS + TIMEOUT))
  until port_open "$PORT" && ready; do
    # Not alive(): right after the fork the child's cmdline is still this script's.
    # A corrupt class-data archive can crash the JVM: drop it, a later stop() makes a new one.
    running "$pid" || { rm -f "$JSA"; fail_start "the Connect worker exited"; }
    if ((SECONDS >= deadline)); then
      kill "$pid" 2>/dev/null || true
      fail_start "the Connect worker was not ready after ${TIMEOUT}s (stopped it)"
    fi
    sleep 0.2
  done
}

start_connect() {
  local pid
  if ! pid=$(our_pid); then
    ! port_open "$PORT" || die "127.0.0.1:$PORT is in use by another program (not a Connect" \
      "worker started by this script); stop it or choose another port with UBIK_CONNECT_PORT"
    # start runs as `(start) || retry`, where set -e does not apply: check each step.
    local servers
    servers=$(bootstrap) || exit 1
    write_config "$servers" || die "writing $STATE/worker.properties failed"
    [[ ! -f $LOG ]] || mv "$LOG" "$LOG.1"
    # Class-data sharing (as in broker.sh): the first worker dumps its loaded classes when it
    # exits, and stop_server keeps that archive if the exit was clean; later starts map it.
    rm -f "$STATE/classes.jsa"
    local cds=(-XX:ArchiveClassesAtExit="$STATE/classes.jsa")
    [[ ! -f $JSA ]] || cds=(-XX:SharedArchiveFile="$JSA")
    # setsid: the worker outlives this script and ignores Ctrl-C meant for the test run.
    # 9>&-: it must not inherit (and so hold) the lock. Working directory $STATE: whatever it
    # writes there stays out of the caller's.
    (cd "$STATE" && exec setsid java "${JAVA_OPTS[@]}" "${cds[@]}" -cp "$LIB/*" \
      org.apache.kafka.connect.cli.ConnectDistributed "$STATE/worker.properties" \
      </dev/null >"$LOG" 2>&1 9>&-) &
    pid=$!
    echo "$pid" >"$PIDFILE"
  fi
  wait_ready "$pid"
  # The JVM ignores (with a [cds] warning) an archive made by another JDK build: remake it.
  ! grep -q '\]\[cds' "$LOG" || rm -f "$JSA"
}

# --- Commands ---------------------------------------------------------------------------------

install() {
  install_postgres
  install_jars
}

start() {
  install
  command -v curl >/dev/null || die "curl not found: it checks that Connect is ready"
  mkdir -p "$STATE" || die "cannot create $STATE"
  start_postgres
  start_connect
  echo "$URL"
  echo "$DSN"
}

stop() {
  # Connect first: its tasks hold replication connections to Postgres. A clean shutdown takes a
  # few seconds (more when it dumps the class archive); give it 30 s.
  stop_server 30
  stop_postgres
}

case ${1:-} in
install) lock && install ;;
# One retry: a port still held by a worker that is just exiting fails the first bind.
start) lock && { (start) || { echo "debezium.sh: retrying the start once" >&2; sleep 3; (start); }; } ;;
stop) lock && stop ;;
clean)
  lock && stop
  d=$(pg_dir)
  rm -rf "$d" "$STATE"
  rmdir "$(dirname "$d")" 2>/dev/null || true # the per-port directory under ~postgres, if empty
  ;;
status)
  PGBIN=$(pg_bin) || true
  PGDATA=$(pg_dir)/data
  rc=0
  if pid=$(our_pid) && port_open "$PORT"; then
    echo "Connect running: pid $pid, $URL, Debezium $VERSION, log $LOG"
  else
    echo "Connect not running (port $PORT)"
    rc=1
  fi
  if [[ -n $PGBIN ]] && pg_running; then
    echo "Postgres running: $DSN, data $PGDATA, log $(dirname "$PGDATA")/postgres.log"
  else
    echo "Postgres not running (port $PGPORT)"
    rc=1
  fi
  exit $rc
  ;;
address) echo "$URL" && echo "$DSN" ;;
*) die "usage: debezium.sh install|start|stop|status|address|clean" ;;
esac
