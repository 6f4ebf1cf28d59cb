#!/usr/bin/env bash
# redis-server's CPU per decision at a fixed request rate (docs/benchmarks.md, part 28): a
# tollgate binary in front of examples/echo_backend is sent BENCH_RATE requests a second for
# BENCH_DURATION seconds (h2load --rps), and redis-server's CPU time is read before and after:
# utime+stime from /proc/PID/stat (clock ticks) and, finer, se.sum_exec_runtime of each of its
# threads from /proc/PID/task/*/sched (nanoseconds); summed over the masters of a Cluster. The
# figure is redis-server's CPU microseconds per decision and its inverse, decisions per Redis
# core (one second of one core over that). Unlike an instruction count it includes the kernel's
# share (the socket reads and writes), and it depends on the rate: batching (a single Redis
# coalesces decisions when more than REDIS_CALLS_IN_FLIGHT are out) and wake-ups do.
#
# usage: scripts/redis_cpu_at_rate.sh BINARY|pair
# BINARY   a tollgate binary: h2load sends the requests (hot: --h1, 32 connections each paced
#          at BENCH_RATE / 32; cold: one HTTP/2 connection of up to 32 streams paced at BENCH_RATE,
#          walking distinct URIs); room for 32 at once, so a slow moment does not lower the rate
#          (how many are out at once follows from the rate and the latency, not from this)
# pair     the floor instead: examples/redis_pair at the same rate, INCRBY + PEXPIRE NX
#          pipelined, one round trip per decision, 8 callers on one multiplexed connection
# BENCH_RATE      requests (decisions) a second, a multiple of 32, default 4000
# BENCH_DURATION  seconds measured, default 20 (after a warm-up of 2 s at the same rate)
# BENCH_IDLE      seconds redis-server's idle CPU is read over first (default 5): the "net"
#                 figure takes that rate times the measured seconds out
# BENCH_KEYS=hot (default): one client, one key; cold: a new client (key) every request
#          (KEY_BY=query:k)
# BENCH_LIMITS=LIST gives the general rule that limit list (LIMITS) instead of a token bucket
#          no request exhausts
# REDIS_CLUSTER=N (3 or more): a Redis Cluster of N masters (no replicas) instead of one Redis
# REDIS_LEASES=on passes leases on to the gateway (a hot key then decides mostly locally)
# redis-server runs on BENCH_PROXY_CPU (default 0), the gateway, backend and load generator on
# BENCH_LOAD_CPU (default 1), so Redis's CPU is its own (scripts/lib.sh pin_cpus).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
. scripts/lib.sh # free_port, loadavg, pin_cpus, form_cluster
binary=${1:?usage: scripts/redis_cpu_at_rate.sh BINARY|pair}
if [ "$binary" != pair ]; then
  [ -x "$binary" ] || { echo "redis_cpu_at_rate.sh: $binary is not an executable" >&2; exit 2; }
  binary=$(realpath "$binary") # the gateway runs in a directory of its own
fi
rate=${BENCH_RATE:-4000} duration=${BENCH_DURATION:-20}
keys=${BENCH_KEYS:-hot}
case $keys in hot|cold) ;; *) echo "BENCH_KEYS is hot or cold, not $keys" >&2; exit 2 ;; esac
case $rate in *[!0-9]* | '' | 0) echo "BENCH_RATE is a whole number of requests a second, not $rate" >&2; exit 2 ;; esac
case $duration in *[!0-9]* | '' | 0) echo "BENCH_DURATION is a whole number of seconds, not $duration" >&2; exit 2 ;; esac
(( rate % 32 == 0 )) || { echo "BENCH_RATE is a multiple of 32 (32 paced connections, 8 paced callers), not $rate" >&2; exit 2; }
masters=${REDIS_CLUSTER:-1}
case $masters in
  1) ;;
  *[!0-9]* | '' | 0 | 2) echo "REDIS_CLUSTER is a number of masters, 3 or more, not $masters" >&2; exit 2 ;;
esac
requests=$((rate * duration)) warmup=$((rate * 2))
cargo build --release --quiet --example echo_backend --example redis_pair
pin_cpus "redis-server" "the gateway, the backend and the load generator" >/dev/null
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
ports=()
for _ in $(seq $((3 + 2 * masters))); do ports+=("$(free_port "${ports[@]}")"); done
backend_port=${ports[0]} gateway_port=${ports[1]} admin_port=${ports[2]}
redis_ports=() bus_ports=() redis_pids=()
for i in $(seq 0 $((masters - 1))); do
  redis_ports+=("${ports[3 + 2 * i]}") bus_ports+=("${ports[4 + 2 * i]}")
done
nodes=$(printf '127.0.0.1:%s,' "${redis_ports[@]}")
nodes=${nodes%,}

# --- Redis: one server, or the masters formed into a Cluster ------------------------------
for i in $(seq 0 $((masters - 1))); do
  mkdir -p "$work/node$i"
  cluster=()
  [ "$masters" = 1 ] || cluster=(--cluster-enabled yes --cluster-config-file nodes.conf
    --cluster-port "${bus_ports[$i]}" --cluster-node-timeout 15000)
  (cd "$work/node$i" && exec "${on_proxy_cpu[@]}" redis-server --port "${redis_ports[$i]}" --bind 127.0.0.1 \
    --save '' --appendonly no --daemonize no "${cluster[@]}") >"$work/node$i.log" 2>&1 &
  redis_pids+=($!)
done
form_cluster 100 0.2 "${redis_ports[@]}"

# redis-server's CPU so far, summed over the masters: "ticks nanoseconds".
redis_cpu() {
  local pid ticks=0 ns=0
  for pid in "${redis_pids[@]}"; do
    ticks=$((ticks + $(awk '{printf "%.0f\n", $14 + $15}' "/proc/$pid/stat")))
    ns=$((ns + $(awk -F: '/^se.sum_exec_runtime/ {gsub(/ /, "", $2); split($2, a, "."); s += a[1] * 1000000 + substr(a[2] "000000", 1, 6)} END {printf "%.0f\n", s}' \
      /proc/"$pid"/task/*/sched)))
  done
  echo "$ticks $ns"
}
# Script calls (EVAL, EVALSHA, FCALL: a round trip each, several decisions when coalesced),
# summed over the masters.
redis_calls() {
  local port
  for port in "${redis_ports[@]}"; do redis-cli -p "$port" INFO commandstats; done | tr -d '\r' |
    awk -F'[:=,]' '/^cmdstat_(eval|evalsha|fcall|fcall_ro):/ {n += $3} END {printf "%.0f\n", n}'
}

# What redis-server spends idle (its cron, a Cluster's bus), over BENCH_IDLE seconds: reported
# as CPU a second, and taken out of the per-decision figure's "net" column.
idle=${BENCH_IDLE:-5}
read -r idle_ticks0 idle_ns0 < <(redis_cpu)
sleep "$idle"
read -r idle_ticks1 idle_ns1 < <(redis_cpu)
idle_ns_per_s=$(( (idle_ns1 - idle_ns0) / idle ))

# --- the load -------------------------------------------------------------------------------
redis_env=(REDIS_ADDR="127.0.0.1:${redis_ports[0]}")
[ "$masters" = 1 ] || redis_env=(REDIS_CLUSTER_NODES="$nodes")
if [ "$binary" = pair ]; then
  pair() { # N
    if [ "$masters" = 1 ]; then
      REDIS_URL=redis://127.0.0.1:${redis_ports[0]} "${on_load_cpu[@]}" target/release/examples/redis_pair "$1" "$keys" "$rate"
    else
      REDIS_CLUSTER_NODES=$nodes "${on_load_cpu[@]}" target/release/examples/redis_pair "$1" "$keys" "$rate"
    fi
  }
  pair "$warmup"
  for port in "${redis_ports[@]}"; do redis-cli -p "$port" CONFIG RESETSTAT >/dev/null; done
  read -r ticks0 ns0 < <(redis_cpu)
  start=$(date +%s.%N)
  pair "$requests"
  read -r ticks1 ns1 < <(redis_cpu)
  done_requests=$requests
  elapsed=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN {printf "%.2f", e - s}')
else
  (cd "$work" && exec env PORT="$backend_port" "${on_load_cpu[@]}" "$root/target/release/examples/echo_backend") >/dev/null 2>&1 &
  limits=(MAX_TOKENS=1000000000 REFILL_RATE=1000000)
  [ -n "${BENCH_LIMITS:-}" ] && limits=(LIMITS="$BENCH_LIMITS")
  keyed=()
  [ "$keys" = cold ] && keyed=(KEY_BY=query:k KEY_HASH_SECRET=0123456789abcdef0123456789abcdef)
  leases=()
  [ -n "${REDIS_LEASES:-}" ] && leases=(REDIS_LEASES="$REDIS_LEASES")
  (cd "$work" && exec env -i PATH="$PATH" BACKEND_URL="http://127.0.0.1:$backend_port" BIND=127.0.0.1 \
    PORT="$gateway_port" ADMIN_BIND=127.0.0.1 ADMIN_PORT="$admin_port" "${redis_env[@]}" \
    "${limits[@]}" "${keyed[@]}" "${leases[@]}" RUST_LOG=warn "${on_load_cpu[@]}" "$binary") >"$work/gateway.log" 2>&1 &
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$gateway_port/" && break; sleep 0.1; done
  # Distinct URIs for the cold keys, the warm-up's (w...) apart from the measured ones.
  seq "$warmup" | sed "s|^|http://127.0.0.1:$gateway_port/?k=w|" >"$work/warmup-uris"
  seq "$requests" | sed "s|^|http://127.0.0.1:$gateway_port/?k=|" >"$work/uris"
  load() { # N URI-FILE
    if [ "$keys" = cold ]; then
      "${on_load_cpu[@]}" h2load -n "$1" -c 1 -m 32 --rps "$rate" -i "$2"
    else
      "${on_load_cpu[@]}" h2load --h1 -n "$1" -c 32 --rps $((rate / 32)) "http://127.0.0.1:$gateway_port/"
    fi
  }
  load "$warmup" "$work/warmup-uris" >/dev/null
  for port in "${redis_ports[@]}"; do redis-cli -p "$port" CONFIG RESETSTAT >/dev/null; done
  read -r ticks0 ns0 < <(redis_cpu)
  start=$(date +%s.%N)
  out=$(load "$requests" "$work/uris")
  read -r ticks1 ns1 < <(redis_cpu)
  elapsed=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN {printf "%.2f", e - s}')
  done_requests=$(awk '/^requests:/ {print $8}' <<<"$out")
  grep -q "^status codes: $requests 2xx" <<<"$out" ||
    { echo "not every request was answered 2xx:" >&2; grep -E '^(requests|status codes):' <<<"$out" >&2; }
  if [ "${done_requests:-0}" = 0 ]; then
    echo "redis_cpu_at_rate.sh: no request succeeded; the gateway's log:" >&2
    tail -n 20 "$work/gateway.log" >&2
    exit 1
  fi
fi
calls=$(redis_calls)
where="one redis-server"
[ "$masters" = 1 ] || where="a Cluster of $masters masters"
awk -v w="$where" -v b="$binary" -v l="${BENCH_LIMITS:+ (LIMITS=$BENCH_LIMITS)}${REDIS_LEASES:+ REDIS_LEASES=$REDIS_LEASES}" -v k="$keys" \
  -v n="$done_requests" -v r="$rate" -v e="$elapsed" -v t=$((ticks1 - ticks0)) -v ns=$((ns1 - ns0)) -v c="$calls" \
  -v hz="$(getconf CLK_TCK)" -v la="$(loadavg)" -v idle="$idle_ns_per_s" 'BEGIN {
  us = ns / 1000 / n; net = (ns - idle * e) / 1000 / n
  printf "%s for %s%s, %s keys, %d decisions at %d/s (%.0f/s measured, %.1f s): redis-server CPU %.2f us per decision (%d ticks: %.2f us), %.0f decisions per Redis core; net of idle (%.0f us a second): %.2f us, %.0f per core; %.3f script calls per decision; load average %s\n",
    w, b, l, k, n, r, n / e, e, us, t, t * 1e6 / hz / n, 1e6 / us, idle / 1000, net, 1e6 / net, c / n, la }'
