# Helpers shared by scripts/bench.sh, scripts/bench_decide.sh, scripts/chaos.sh and
# scripts/demo.sh (sourced, not run). Callers set `work` (a directory holding NAME.log for each
# process they start) before using them.

# Is something listening on 127.0.0.1:$1? (bash's /dev/tcp: connects, sends nothing.)
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# free_port [TAKEN...]: a loopback port below the ephemeral range (so no outgoing connection
# takes it in the meantime) that nothing listens on and is none of TAKEN: the ports picked
# before it that nothing listens on yet (it runs in a subshell, so it cannot remember them).
free_port() {
  local port
  while :; do
    port=$((20000 + RANDOM % 12000))
    case " $* " in *" $port "*) continue ;; esac
    if ! listening "$port"; then
      echo "$port"
      return
    fi
  done
}

# wait_for_port PORT NAME [TENTHS]: until something listens on PORT (default 10 s), else print
# NAME's log and exit.
wait_for_port() {
  local i
  for i in $(seq 1 "${3:-100}"); do
    if listening "$1"; then return 0; fi
    sleep 0.1
  done
  echo "$(basename "$0"): $2 did not start listening on 127.0.0.1:$1; its log:" >&2
  cat "$work/$2.log" >&2 || true
  exit 1
}

