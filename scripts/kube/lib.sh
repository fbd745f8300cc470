# Helpers shared by start and stop (sourced).

# Every program start may run, in the order stop ends them (dependents first).
COMPONENTS=(watch jobset kwok kube-scheduler kube-controller-manager kube-apiserver etcd)

# running_in DIR NAME: DIR/NAME.pid names a live NAME process started for DIR (its command line
# mentions DIR/), so a recycled pid is never taken for ours.
running_in() {
  local pid cmd
  pid=$(cat "$1/$2.pid" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ && -r /proc/$pid/cmdline ]] || return 1
  cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
  [[ $cmd == *"/$2 "* && $cmd == *"$1/"* ]]
}

# spawn DIR NAME CMD...: start CMD detached (own session, stdin /dev/null, output in DIR/NAME.log),
# its pid in DIR/NAME.pid (the wrapper writes its own pid and execs, so the pid is the program's).
spawn() {
  local dir=$1 name=$2 _; shift 2
  rm -f "$dir/$name.pid"
  # shellcheck disable=SC2016  # expanded by the inner bash
  setsid bash -c 'echo $$ >"$0"; exec "$@"' "$dir/$name.pid" "$@" </dev/null >"$dir/$name.log" 2>&1 &
  for _ in $(seq 50); do [[ -s $dir/$name.pid ]] && return 0; sleep 0.1; done
  return 1
}

# stop_one DIR NAME: SIGTERM, then SIGKILL after 10 s; fails only if it still runs.
stop_one() {
  local dir=$1 name=$2 pid _
  [[ -f $dir/$name.pid ]] || return 0
  pid=$(cat "$dir/$name.pid" 2>/dev/null || true)
  if running_in "$dir" "$name"; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do running_in "$dir" "$name" || break; sleep 0.1; done
    if running_in "$dir" "$name"; then
      echo "[kube stop] $name (pid $pid) ignored SIGTERM for 10 s; sending SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
      for _ in $(seq 50); do running_in "$dir" "$name" || break; sleep 0.1; done
    fi
    if running_in "$dir" "$name"; then
      echo "[kube stop] ERROR: $name (pid $pid) is still running" >&2
      return 1
    fi
  fi
  rm -f "$dir/$name.pid"
}

# free_port VAR: a random loopback port below the ephemeral range with no socket on it, not handed
# out before by this script (a lost race is caught by the caller, which retries).
TAKEN_PORTS=" "
free_port() {
  local p _ hex
  for _ in $(seq 200); do
    p=$(( 20000 + (RANDOM * 32768 + RANDOM) % 12000 ))
    [[ $TAKEN_PORTS == *" $p "* ]] && continue
    hex=$(printf ':%04X ' "$p")
    grep -qi "$hex" /proc/net/tcp /proc/net/tcp6 2>/dev/null && continue
    TAKEN_PORTS+="$p "
    printf -v "$1" '%s' "$p"
    return 0
  done
  return 1
}
