#!/usr/bin/env bash
# A real Confluent-compatible schema registry (Apicurio Registry 2.x, in-memory storage) for
# ubik's integration tests, listening on 127.0.0.1 only. No Docker: the distribution comes from
# Maven Central and is cached outside the repo. Clients use its Confluent API (ccompat v7), see
# `address`.
#
#   registry.sh install   fetch and unpack Apicurio once into $UBIK_CACHE_DIR/apicurio-<version>
#   registry.sh start     install if needed, start (or reuse) the registry, print its address
#   registry.sh stop | status | address | clean   (clean = stop and delete its run directory;
#                                                  storage is in memory, a restart is empty)
#
# Env: UBIK_CACHE_DIR (default $HOME/.cache/ubik), UBIK_REGISTRY_PORT (default 38081; the
# management interface listens on PORT+1), UBIK_REGISTRY_START_TIMEOUT (seconds, default 90),
# UBIK_REGISTRY_JAVA_OPTS (extra JVM flags, appended).
# Needs Java 17+, Maven 3.6.3+ (first install only), curl, flock.
#
# Unlike Confluent's server, compatibility is NONE until set, through the same API:
# PUT <address>/config or <address>/config/<subject> with {"compatibility":"BACKWARD"}.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VERSION=2.6.13.Final
CACHE=${UBIK_CACHE_DIR:-$HOME/.cache/ubik}
INST=$CACHE/apicurio-$VERSION       # the installation
APP=$INST/app                       # the unpacked distribution: the runner jar and lib/
JAR=$APP/apicurio-registry-app-$VERSION-runner.jar
MARKER=$INST/installed              # written last
JSA=$INST/classes.jsa               # class-data-sharing archive of the registry's classes
PORT=${UBIK_REGISTRY_PORT:-38081}
MPORT=$((PORT + 1))
STATE=$CACHE/registry-run/$PORT     # log and pid of the registry on this port
PIDFILE=$STATE/registry.pid
LOG=$STATE/registry.log
TIMEOUT=${UBIK_REGISTRY_START_TIMEOUT:-90}
ADDRESS=http://127.0.0.1:$PORT/apis/ccompat/v7

die() { echo "registry.sh: $*" >&2; exit 1; }

# Serialise install/start/stop: parallel test jobs may share the cache and the registry.
lock() { mkdir -p "$CACHE"; exec 9>"$CACHE/registry.lock"; flock 9; }

# Whether pid $1 is our registry on $PORT (it carries -Dubik.registry.state=$STATE). Not
# `kill -0`: that is true for a zombie (and the pid may have been reused); a zombie's cmdline
# is empty.
alive() { tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline" | grep -qF -- "-Dubik.registry.state=$STATE "; }

# shellcheck source=../jvm-service.sh
source "$HERE/../jvm-service.sh"

install() {
  [[ -f $MARKER && -f $JAR ]] && return 0
  command -v mvn >/dev/null || die "mvn not found: Maven is needed to fetch Apicurio Registry $VERSION"
  command -v java >/dev/null || die "java not found: Apicurio Registry $VERSION needs Java 17+"
  echo "registry.sh: installing Apicurio Registry $VERSION into $APP" >&2
  rm -rf "$MARKER" "$JSA" "$APP" "$INST/download" "$APP.tmp"
  mkdir -p "$INST/download" "$APP.tmp"
  mvn -B -q org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy \
    "-Dartifact=io.apicurio:apicurio-registry-app:$VERSION:tar.gz:all" \
    -DoutputDirectory="$INST/download" >"$INST/mvn.log" 2>&1 ||
    { cat "$INST/mvn.log" >&2; die "fetching Apicurio Registry $VERSION with Maven failed"; }
  tar --no-same-owner -xzf "$INST/download/apicurio-registry-app-$VERSION-all.tar.gz" -C "$APP.tmp" ||
    die "unpacking $INST/download/apicurio-registry-app-$VERSION-all.tar.gz failed"
  # The runner jar may sit in a top directory of the archive: make it $APP's top.
  local jar
  jar=$(find "$APP.tmp" -name "apicurio-registry-app-$VERSION-runner.jar" -print -quit)
  [[ -n $jar ]] || die "the archive holds no apicurio-registry-app-$VERSION-runner.jar"
  mv "$(dirname "$jar")" "$APP"
  rm -rf "$APP.tmp" "$INST/download" "$INST/mvn.log" # Maven keeps its own copy in ~/.m2
  echo "$VERSION" >"$MARKER"
}

# Java flags: a modest heap (2-core CI machines) and C1 only: the registry serves a few requests
# per test; with full JIT it starts ~0.5 s slower and takes ~30 MB more (measured; SerialGC
# gained nothing and took ~40 MB more). Quarkus binds both the HTTP and the management interface
# to loopback. use-canonical-hash: a schema re-registered with other whitespace or key order is
# the same schema (same id and version), as with Confluent.
# shellcheck disable=SC2206 # UBIK_REGISTRY_JAVA_OPTS is a space-separated list of flags
JAVA_OPTS=(-Xmx512m -XX:TieredStopAtLevel=1 -XX:+ExitOnOutOfMemoryError
  -Djava.awt.headless=true "-XX:ErrorFile=$STATE/hs_err_%p.log"
  "-Dubik.registry.state=$STATE" # how alive() recognises our registry
  -Dquarkus.http.host=127.0.0.1 "-Dquarkus.http.port=$PORT"
  -Dquarkus.management.host=127.0.0.1 "-Dquarkus.management.port=$MPORT"
  -Dregistry.ccompat.use-canonical-hash=true
  ${UBIK_REGISTRY_JAVA_OPTS:-})

fail_start() {
  echo "registry.sh: $1; last lines of $LOG:" >&2
  tail -n 40 "$LOG" >&2 || true
  exit 1
}

# Ready = the Confluent API lists subjects (200).
ready() {
  [[ $(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$ADDRESS/subjects" 2>/dev/null) == 200 ]]
}

wait_ready() {
  local pid=$1 deadline=$((SECONDS + TIMEOUT))
  until port_open "$PORT" && ready; do
    # Not alive(): right after the fork the child's cmdline is still this script's.
    # A corrupt class-data archive can crash the JVM: drop it, a later stop() makes a new one.
    running "$pid" || { rm -f "$JSA"; fail_start "the registry exited"; }
    if ((SECONDS >= deadline)); then
      kill "$pid" 2>/dev/null || true
      fail_start "the registry was not ready after ${TIMEOUT}s (stopped it)"
    fi
    sleep 0.2
  done
}

start() {
  install
  command -v curl >/dev/null || die "curl not found: it checks that the registry is ready"
  local pid p
  if ! pid=$(our_pid); then
    for p in "$PORT" "$MPORT"; do
      ! port_open "$p" || die "127.0.0.1:$p is in use by another program (not a registry" \
        "started by this script); stop it or choose other ports with UBIK_REGISTRY_PORT"
    done
    mkdir -p "$STATE"
    [[ ! -f $LOG ]] || mv "$LOG" "$LOG.1"
    # Class-data sharing cuts the start from ~3.5 s to ~1.2 s and the RSS from ~200 to ~150 MB:
    # the first registry dumps its loaded classes when it exits (which then takes ~3.5 s instead
    # of ~0.1 s), and stop() keeps that archive if the exit was clean; later starts map it.
    rm -f "$STATE/classes.jsa"
    local cds=(-XX:ArchiveClassesAtExit="$STATE/classes.jsa")
    [[ ! -f $JSA ]] || cds=(-XX:SharedArchiveFile="$JSA")
    # setsid: the registry outlives this script and ignores Ctrl-C meant for the test run.
    # 9>&-: it must not inherit (and so hold) the lock. Its working directory is $STATE, so
    # whatever it writes there stays out of the caller's.
    (cd "$STATE" && exec setsid java "${JAVA_OPTS[@]}" "${cds[@]}" -jar "$JAR" \
      </dev/null >"$LOG" 2>&1 9>&-) &
    pid=$!
    echo "$pid" >"$PIDFILE"
  fi
  wait_ready "$pid"
  # The JVM ignores (with a [cds] warning) an archive made by another JDK build: remake it.
  ! grep -q '\]\[cds' "$LOG" || rm -f "$JSA"
  echo "$ADDRESS"
}

stop() {
  # A clean shutdown takes a few seconds (more when it dumps the class archive); give it 15 s.
  stop_server 15
}

case ${1:-} in
install) lock && install ;;
# One retry: a port still held by a registry that is just exiting fails the first bind.
start) lock && { (start) || { echo "registry.sh: retrying the start once" >&2; sleep 3; (start); }; } ;;
stop) lock && stop ;;
clean) lock && stop && rm -rf "$STATE" ;;
status)
  if pid=$(our_pid) && port_open "$PORT"; then
    echo "running: pid $pid, $ADDRESS, Apicurio Registry $VERSION, log $LOG"
  else
    echo "not running (port $PORT)"
    exit 1
  fi
  ;;
address) echo "$ADDRESS" ;;
*) die "usage: registry.sh install|start|stop|status|address|clean" ;;
esac
