#!/usr/bin/env bash
# Issue 28 item 4, measured with release binaries on a machine as loaded as it is: three
# replicas of one build share a sliding log of 25 on one Redis at the default REDIS_TIMEOUT_MS
# (50 ms) and FAIL_MODE=open, and take 300 requests at once (h2load, 100 per replica) from one
# client. Prints, per run, how many were admitted (the budget is 25) and how many store calls
# timed out (the replicas' WARN lines). Builds are taken in turn, run by run, so each sees the
# same load; the load average is printed with each run (docs/benchmarks.md, part 30).
# Needs redis-server, nginx and h2load.
#
# Usage: scripts/loaded_budget.sh [--runs N] [--hogs N] BINARY...
#   --runs N   runs per binary (default 8), in turn
#   --hogs N   busy loops kept running meanwhile (default 0: the machine as it is), so a quiet
#              machine can be loaded alike for every build
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/scripts/lib.sh"

runs=8 hogs=0
binaries=()
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --hogs) hogs=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) binaries+=("$1"); shift ;;
  esac
done
[ ${#binaries[@]} -gt 0 ] || { echo "loaded_budget.sh: name at least one binary" >&2; exit 2; }
for binary in "${binaries[@]}"; do
  [ -x "$binary" ] || { echo "loaded_budget.sh: $binary is not an executable" >&2; exit 2; }
done
for tool in redis-server nginx h2load; do
  command -v "$tool" >/dev/null || { echo "loaded_budget.sh: $tool is missing" >&2; exit 2; }
done

work=$(mktemp -d /tmp/loaded_budget.XXXXXX)
pids=()
cleanup() {
  kill "${pids[@]}" 2>/dev/null || true
  [ -f "$work/nginx.pid" ] && kill "$(cat "$work/nginx.pid")" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

redis_port=$(free_port)
redis-server --port "$redis_port" --save '' --appendonly no >"$work/redis.log" 2>&1 &
pids+=($!)
backend_port=$(free_port "$redis_port")
cat >"$work/nginx.conf" <<EOF
daemon on; pid $work/nginx.pid; error_log $work/nginx.err; worker_processes 1;
events { worker_connections 2048; }
http { access_log off; server { listen 127.0.0.1:$backend_port; location / { return 200 "ok\n"; } } }
EOF
nginx -c "$work/nginx.conf" -p "$work"
wait_for_port "$redis_port" redis
wait_for_port "$backend_port" nginx
for _ in $(seq 1 "$hogs"); do
  sh -c 'while :; do :; done' &
  pids+=($!)
done

echo "run  binary  admitted/25  timeouts  load"
for run in $(seq 1 "$runs"); do
  for binary in "${binaries[@]}"; do
    replicas=() ports=() taken=("$redis_port" "$backend_port")
    # One prefix for the three: one budget, fresh for each run.
    prefix="run$run-$(basename "$binary")-$RANDOM:"
    for i in 1 2 3; do
      port=$(free_port "${taken[@]}"); taken+=("$port")
      admin=$(free_port "${taken[@]}"); taken+=("$admin")
      BACKEND_URL=http://127.0.0.1:$backend_port BIND=127.0.0.1 PORT=$port ADMIN_PORT=$admin \
        REDIS_URL=redis://127.0.0.1:$redis_port KEY_PREFIX="$prefix" \
        ALGORITHM=sliding_log LIMIT=25 WINDOW_SIZE=3600 LOG_LEVEL=warn \
        "$binary" >"$work/replica$i.log" 2>&1 &
      replicas+=($!) ports+=("$port")
    done
    pids+=("${replicas[@]}")
    for i in 1 2 3; do wait_for_port "${ports[$((i - 1))]}" "replica$i"; done
    floods=()
    for port in "${ports[@]}"; do
      h2load --h1 -n100 -c100 "http://127.0.0.1:$port/x" >"$work/h2load.$port" 2>&1 &
      floods+=($!)
    done
    wait "${floods[@]}" || true
    admitted=0
    for port in "${ports[@]}"; do
      n=$(sed -n 's/^status codes: \([0-9]*\) 2xx.*/\1/p' "$work/h2load.$port")
      admitted=$((admitted + ${n:-0}))
    done
    kill "${replicas[@]}" 2>/dev/null || true
    wait "${replicas[@]}" 2>/dev/null || true
    timeouts=$(cat "$work"/replica*.log | grep -c "did not answer" || true)
    printf '%-4s %-7s %-12s %-9s %s\n' "$run" "$(basename "$binary")" "$admitted" "$timeouts" "$(loadavg | cut -d' ' -f1)"
  done
done
