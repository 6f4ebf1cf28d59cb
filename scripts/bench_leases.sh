#!/usr/bin/env bash
# Leases under load (docs/benchmarks.md, "Leases"): one client on one hot key, side by side in
# one run, wrk on loopback against tollgate in memory, tollgate with Redis (leases off), and
# tollgate with Redis and REDIS_LEASES=on; for each Redis target, the Redis commands per request
# from INFO commandstats before and after (the calls the gateway made, EVALSHA/EVAL/FCALL, and
# every command counted, those the scripts ran included), and the CPU per request of tollgate's
# process plus, for the Redis targets, redis-server's (utime+stime from /proc/PID/stat, as
# scripts/bench.sh counts it): on a machine others load, requests per second follow the share of
# the core the benchmark's processes get (two processes, tollgate and redis-server, get more of
# a contended core than one), CPU per request far less.
#
# Usage: scripts/bench_leases.sh [--duration D] [--rounds N]
#   --duration D   measured seconds per target and round, wrk -d syntax (default 10s)
#   --rounds N     rounds, targets in turn (default 3); ratios from each round's own figures
# Environment: BENCH_CONNECTIONS (wrk -c, default 32), BENCH_LIMITS (the rule, default a
# token bucket of 10^6 refilling 10^6 a second: every request allowed, a budget in the millions).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
. "$ROOT/scripts/lib.sh"

duration=10s rounds=3
while [ $# -gt 0 ]; do
  case $1 in
    --duration) duration=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) echo "bench_leases.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
connections=${BENCH_CONNECTIONS:-32}
limits=${BENCH_LIMITS:-token_bucket:1000000:1000000}
missing=()
command -v wrk >/dev/null || missing+=(wrk)
command -v redis-server >/dev/null || missing+=(redis-server)
install_missing "${missing[@]}"

run_header "$@"
echo "== building tollgate and the echo backend (release)"
cargo build --release --quiet --bin tollgate --example echo_backend
target_dir=${CARGO_TARGET_DIR:-$ROOT/target}
TOLLGATE=$target_dir/release/tollgate
ECHO_BACKEND=$target_dir/release/examples/echo_backend
pin_cpus "tollgate and redis-server" "backend and wrk"

work=$(mktemp -d)
log=$work/raw.log
. "$ROOT/scripts/supervise.sh"
trap supervision_cleanup EXIT
trap 'exit 130' INT TERM

backend_port=$(free_port)
start backend "$backend_port" "${on_load_cpu[@]}" -- env PORT="$backend_port" "$ECHO_BACKEND"
redis_port=$(free_port "$backend_port")
start redis "$redis_port" "${on_proxy_cpu[@]}" -- \
  redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no

tollgate() { # name VAR=value...
  local name=$1 port admin_port
  shift
  port=$(free_port "$backend_port" "$redis_port")
  admin_port=$(free_port "$backend_port" "$redis_port" "$port")
  start "$name" "$port" "${on_proxy_cpu[@]}" -- env -i PATH="$PATH" \
    BACKEND_URL="http://127.0.0.1:$backend_port" BIND=127.0.0.1 PORT="$port" RUST_LOG=warn \
    ADMIN_BIND=127.0.0.1 ADMIN_PORT="$admin_port" \
    LIMITS="$limits" "$@" "$TOLLGATE"
}
tollgate memory
tollgate redis-plain REDIS_URL="redis://127.0.0.1:$redis_port" KEY_PREFIX="bench-redis:"
tollgate redis-leases REDIS_URL="redis://127.0.0.1:$redis_port" KEY_PREFIX="bench-leases:" REDIS_LEASES=on

# calls and commands: the gateway's calls (scripts) and every command Redis counted.
stats() {
  redis-cli -p "$redis_port" INFO commandstats | tr -d '\r' | awk -F'[:=,]' '
    /^cmdstat_(evalsha|eval|fcall):/ { calls += $3 }
    /^cmdstat_/ && !/^cmdstat_(info|config):/ { all += $3 }
    END { printf "%d %d\n", calls, all }'
}

# CPU time (clock ticks) of a process.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

printf '| %-5s | %-12s | %10s | %9s | %14s | %17s | %10s | %12s |\n' round target "req/s" "x memory" "calls/request" "commands/request" \
  "CPU us/req" "CPU x memory"
printf '|%s|%s|%s|%s|%s|%s|%s|%s|\n' "-------" "--------------" "------------" "-----------" "----------------" "-------------------" \
  "------------" "--------------"
for round in $(seq 1 "$rounds"); do
  memory_rps= memory_cpu=
  for name in memory redis-plain redis-leases; do
    url="http://127.0.0.1:${port_of[$name]}/"
    # Warm up (the key gets hot, shares are taken), then measure.
    "${on_load_cpu[@]}" wrk -t1 -c"$connections" -d2s "$url" >/dev/null
    all_alive
    redis-cli -p "$redis_port" CONFIG RESETSTAT >/dev/null
    billed=(${pid_of[$name]})
    [ "$name" = memory ] || billed+=(${pid_of[redis]})
    c0=0; for pid in "${billed[@]}"; do c0=$((c0 + $(cpu_ticks "$pid"))); done
    out=$("${on_load_cpu[@]}" wrk -t1 -c"$connections" -d"$duration" "$url")
    c1=0; for pid in "${billed[@]}"; do c1=$((c1 + $(cpu_ticks "$pid"))); done
    read -r calls commands < <(stats)
    echo "$out" >>"$log"
    rps=$(echo "$out" | awk '/^Requests\/sec/ { print $2 }')
    requests=$(echo "$out" | awk '/requests in/ { print $1 }')
    non2xx=$(echo "$out" | awk '/Non-2xx/ { print $4 }')
    [ -z "$non2xx" ] || echo "  $name: $non2xx responses not 2xx" >&2
    cpu=$(awk -v t=$((c1 - c0)) -v hz="$hz" -v q="$requests" 'BEGIN { printf "%.2f", t * 1e6 / hz / q }')
    [ -n "$memory_rps" ] || memory_rps=$rps memory_cpu=$cpu
    if [ "$name" = memory ]; then calls=0 commands=0; fi
    awk -v r="$round" -v n="$name" -v rps="$rps" -v m="$memory_rps" -v c="$calls" -v a="$commands" -v q="$requests" \
      -v cpu="$cpu" -v mc="$memory_cpu" \
      'BEGIN { printf "| %-5s | %-12s | %10.0f | %8.2fx | %14.4f | %17.4f | %10.2f | %11.2fx |\n", r, n, rps, rps / m, c / q, a / q, cpu, cpu / mc }'
  done
done
