# The processes a benchmark starts, supervised: scripts/bench.sh and scripts/bench_decide.sh
# source this after scripts/lib.sh, with `work` (a directory for NAME.log of each process) and
# `log` (the raw output file) set, and trap EXIT with supervision_cleanup.
# `pids` and `pnames` hold every process still running; `pid_of` and `port_of` find one by name.
pids=() pnames=()
declare -A pid_of port_of

# On exit: stop them all, and after a failure show the end of each one's log.
supervision_cleanup() {
  local status=$? pid f
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "$status" -ne 0 ]; then
    for f in "$work"/*.log; do
      if [ -s "$f" ]; then { echo "--- last lines of $(basename "$f")"; tail -n 20 "$f"; } >&2; fi
    done
  fi
  rm -rf "$work"
}

# start NAME PORT CPU-PREFIX... -- COMMAND...: run COMMAND in $work (so no .env of the repo is
# read) under the prefix (taskset), its output in $work/NAME.log, until it listens on PORT; its
# pid, CPUs and threads go to $log.
start() {
  local name=$1 port=$2 prefix=()
  shift 2
  while [ "$1" != -- ]; do prefix+=("$1"); shift; done
  shift
  (cd "$work" && exec "${prefix[@]}" "$@") >"$work/$name.log" 2>&1 &
  pids+=($!) pnames+=("$name")
  pid_of[$name]=$! port_of[$name]=$port
  wait_for_port "$port" "$name" "${wait_tenths:-100}"
  local pid
  for pid in "${pid_of[$name]}" $(pgrep -P "${pid_of[$name]}" || true); do
    echo "  started $name on port $port: pid $pid ($(cat "/proc/$pid/comm")), CPUs $(taskset -pc "$pid" | sed 's/.*: //')," \
      "$(ls "/proc/$pid/task" | wc -l) threads: $(cat /proc/"$pid"/task/*/comm | sort | uniq -c | tr -s ' \n' ' ')"
  done >>"$log"
}

# stop NAME...: end targets a scenario no longer needs, so they cannot disturb the next.
stop() {
  local name i
  for name in "$@"; do
    kill "${pid_of[$name]}" 2>/dev/null || true
    wait "${pid_of[$name]}" 2>/dev/null || true
    # `if`, not `&&`: a last comparison that fails must not fail the function (set -e).
    for i in "${!pids[@]}"; do
      if [ "${pids[$i]}" = "${pid_of[$name]}" ]; then unset 'pids[i]' 'pnames[i]'; fi
    done
  done
}

# all_alive: exit, naming it, if any started process has died.
all_alive() {
  local i status
  for i in "${!pids[@]}"; do
    if ! kill -0 "${pids[$i]}" 2>/dev/null; then
      wait "${pids[$i]}" && status=0 || status=$?
      echo "$(basename "$0"): ${pnames[$i]} (pid ${pids[$i]}) has exited with status $status" >&2
      exit 1
    fi
  done
}

# build_unstripped CARGO-ARGS...: a release build that keeps symbols and line tables, for
# callgrind's function names, in $target_dir/callgrind (the measured builds stay stripped).
build_unstripped() {
  echo "== callgrind: building an unstripped copy with line tables in $target_dir/callgrind"
  CARGO_TARGET_DIR=$target_dir/callgrind CARGO_PROFILE_RELEASE_STRIP=false \
    CARGO_PROFILE_RELEASE_DEBUG=line-tables-only \
    cargo build --release --quiet "$@"
}

# valgrind_cmd NAME: the prefix that runs a process under callgrind, its counts in
# $cg_dir/NAME.out.
valgrind_cmd() {
  echo valgrind --tool=callgrind --callgrind-out-file="$cg_dir/$1.out" --dump-instr=no
}
