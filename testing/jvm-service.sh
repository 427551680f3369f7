# Process helpers shared by the test servers' scripts (broker.sh, registry.sh), which source
# this file after setting STATE, PIDFILE, JSA and defining alive PID (whether PID is their
# server, by its command line).

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Whether pid $1 has not finished exiting: its cmdline empties early in the exit, before its
# sockets and files are released; a zombie (state Z) holds nothing any more.
running() { local st; st=$(sed 's/.*) //' 2>/dev/null "/proc/$1/stat") && [[ ${st:0:1} != Z ]]; }

# Prints the pid of the server this script started, if it is alive. A stale pid file (reboot,
# kill -9, pid reused by another program) is removed.
our_pid() {
  local pid
  pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
  if [[ $pid =~ ^[0-9]+$ ]] && alive "$pid"; then
    echo "$pid"
  else
    rm -f "$PIDFILE"
    return 1
  fi
}

# Stops the server (SIGTERM, SIGKILL after $1 seconds) and keeps the class-data-sharing archive
# its JVM dumped at a clean exit.
stop_server() {
  local pid i
  pid=$(our_pid) || return 0
  kill "$pid"
  for ((i = 0; i < $1 * 10; i++)); do
    running "$pid" || break
    sleep 0.1
  done
  if running "$pid"; then
    kill -9 "$pid"
    while running "$pid"; do sleep 0.1; done
    rm -f "$STATE/classes.jsa" # possibly half written
  fi
  rm -f "$PIDFILE"
  [[ ! -f $STATE/classes.jsa ]] || mv "$STATE/classes.jsa" "$JSA"
}
