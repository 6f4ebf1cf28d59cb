#!/usr/bin/env bash
# Instructions redis-server spends per decision a tollgate binary asks of it, exact (callgrind
# counts instructions, whatever else the machine does): redis-server under valgrind, tollgate
# (not under valgrind) in front of examples/echo_backend deciding in it (docs/benchmarks.md,
# parts 17, 24 and 28). Two ways to take out what is not the decisions':
#   window (the default): one run; after N1 requests of warm-up (the library loaded, the
#     connections made), redis-server's counters are zeroed, it idles for BENCH_IDLE seconds
#     (default 5) and is dumped: its background (serverCron, and a Cluster's bus) per second;
#     then zeroed again, N2 - N1 requests are decided, and it is dumped. The figure is the
#     second window's instructions less the background for its length, over N2 - N1.
#   difference (BENCH_METHOD=difference, parts 17-24): N1 requests in one run and N2 in
#     another, and the difference of the two totals over N2 - N1 (startup and shutdown cancel;
#     the background of the longer run's extra seconds, about 1.1 million instructions a second
#     and a node under valgrind, does not; on a Cluster nor does forming it).
#
# usage: scripts/redis_instructions_per_decision.sh BINARY|pair [N1 N2]   (default 2000 12000)
# BINARY   a tollgate binary: h2load sends the requests, 8 at once
# pair     the floor instead: examples/redis_pair, INCRBY + PEXPIRE NX pipelined, one round trip
#          per decision, 8 callers on one multiplexed connection
# BENCH_KEYS=hot (default): one client, one key; cold: a new client (key) every request
#          (KEY_BY=query:k, one h2load connection with 8 streams walking distinct URIs)
# BENCH_LIMITS=LIST gives the general rule that limit list (LIMITS) instead of a token bucket
# no request exhausts.
# REDIS_CLUSTER=N (3 or more): a Redis Cluster of N masters (no replicas), each under callgrind,
#          formed with `redis-cli --cluster create`; the gateway gets REDIS_CLUSTER_NODES, the
#          pair the same; the figure is summed over the masters (each master's share printed).
# BENCH_CALLGRIND_OUT=DIR keeps the measured dump(s) there (for callgrind_annotate).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh # free_port, form_cluster
binary=${1:?usage: scripts/redis_instructions_per_decision.sh BINARY|pair [N1 N2]}
n1=${2:-2000} n2=${3:-12000}
(( n2 > n1 )) || { echo "N2 ($n2) is more than N1 ($n1)" >&2; exit 2; }
keys=${BENCH_KEYS:-hot}
case $keys in hot|cold) ;; *) echo "BENCH_KEYS is hot or cold, not $keys" >&2; exit 2 ;; esac
method=${BENCH_METHOD:-window} idle=${BENCH_IDLE:-5}
case $method in window|difference) ;; *) echo "BENCH_METHOD is window or difference, not $method" >&2; exit 2 ;; esac
masters=${REDIS_CLUSTER:-1}
case $masters in
  1) ;;
  *[!0-9]* | '' | 0 | 2) echo "REDIS_CLUSTER is a number of masters, 3 or more, not $masters" >&2; exit 2 ;;
esac
cargo build --release --quiet --example echo_backend --example redis_pair
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
# Free ports (not fixed ones: another engineer's run of this script may be going on): the
# backend, the gateway, its admin listener, then each master's port and cluster bus port.
ports=()
for _ in $(seq $((3 + 2 * masters))); do ports+=("$(free_port "${ports[@]}")"); done
backend_port=${ports[0]} gateway_port=${ports[1]} admin_port=${ports[2]}
redis_ports=() bus_ports=()
for i in $(seq 0 $((masters - 1))); do
  redis_ports+=("${ports[3 + 2 * i]}") bus_ports+=("${ports[4 + 2 * i]}")
done
nodes=$(printf '127.0.0.1:%s,' "${redis_ports[@]}")
nodes=${nodes%,}
# Distinct URIs for cold keys: the warm-up's (w...) apart from the measured ones.
seq "$n2" | sed "s|^|http://127.0.0.1:$gateway_port/?k=|" >"$work/uris"
seq "$n1" | sed "s|^|http://127.0.0.1:$gateway_port/?k=w|" >"$work/warmup-uris"
tail -n +"$((n1 + 1))" "$work/uris" >"$work/measured-uris"

start_redis() { # the masters under callgrind, formed into a Cluster if there are several
  local i cluster=()
  redis_pids=()
  rm -f "$work"/cg.*
  for i in $(seq 0 $((masters - 1))); do
    rm -rf "$work/node$i" && mkdir -p "$work/node$i"
    # A node under valgrind is slow to answer the bus's pings: a long node timeout keeps its
    # peers from marking it failed (and the Cluster down) while it decides.
    [ "$masters" = 1 ] || cluster=(--cluster-enabled yes --cluster-config-file nodes.conf
      --cluster-port "${bus_ports[$i]}" --cluster-node-timeout 120000)
    (cd "$work/node$i" && exec valgrind --tool=callgrind --callgrind-out-file="$work/cg.$i.out" \
      redis-server --port "${redis_ports[$i]}" --bind 127.0.0.1 --save '' --appendonly no \
      --daemonize no "${cluster[@]}") >"$work/node$i.log" 2>&1 &
    redis_pids+=($!)
  done
  form_cluster 300 0.3 "${redis_ports[@]}"
}

stop_redis() { # prints each master's total instructions since its start or last dump, a line each
  local i
  for i in $(seq 0 $((masters - 1))); do
    redis-cli -p "${redis_ports[$i]}" shutdown nosave >/dev/null 2>&1 || kill "${redis_pids[$i]}"
  done
  for i in $(seq 0 $((masters - 1))); do wait "${redis_pids[$i]}" 2>/dev/null || true; done
  for i in $(seq 0 $((masters - 1))); do awk '/^(summary|totals):/ {print $2; exit}' "$work/cg.$i.out"; done
}

start_gateway() {
  [ "$binary" = pair ] && return
  local redis_env=(REDIS_ADDR="127.0.0.1:${redis_ports[0]}")
  [ "$masters" = 1 ] || redis_env=(REDIS_CLUSTER_NODES="$nodes")
  PORT=$backend_port target/release/examples/echo_backend >/dev/null 2>&1 &
  backend=$!
  local limits=(MAX_TOKENS=1000000000 REFILL_RATE=1000000)
  [ -n "${BENCH_LIMITS:-}" ] && limits=(LIMITS="$BENCH_LIMITS")
  local keyed=()
  [ "$keys" = cold ] && keyed=(KEY_BY=query:k KEY_HASH_SECRET=0123456789abcdef0123456789abcdef)
  env BACKEND_URL=http://127.0.0.1:$backend_port PORT=$gateway_port ADMIN_PORT=$admin_port "${redis_env[@]}" \
    REDIS_TIMEOUT_MS=5000 "${limits[@]}" "${keyed[@]}" RUST_LOG=warn "$binary" >"$work/gateway.log" 2>&1 &
  gateway=$!
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$gateway_port/?k=w0" && break; sleep 0.3; done
}

stop_gateway() {
  [ "$binary" = pair ] && return
  kill -TERM "$gateway"; wait "$gateway" 2>/dev/null || true
  kill "$backend"; wait "$backend" 2>/dev/null || true
}

decide() { # N URI-FILE [pair's keys]: N decisions
  local n=$1 uris=$2 pair_keys=${3:-$keys}
  if [ "$binary" = pair ]; then
    if [ "$masters" = 1 ]; then
      REDIS_URL=redis://127.0.0.1:${redis_ports[0]} target/release/examples/redis_pair "$n" "$pair_keys"
    else
      REDIS_CLUSTER_NODES=$nodes target/release/examples/redis_pair "$n" "$pair_keys"
    fi
    return
  fi
  if [ "$keys" = cold ]; then
    # One connection of 8 streams walks the URIs once: every request a key never seen.
    h2load -n "$n" -c 1 -m 8 -i "$uris" >"$work/h2load.out" || true
  else
    h2load --h1 -n "$n" -c 8 "http://127.0.0.1:$gateway_port/" >"$work/h2load.out" || true
  fi
  grep -q "^status codes: $n 2xx" "$work/h2load.out" ||
    { echo "not every request was answered 2xx:" >&2; grep -E '^(requests|status codes):' "$work/h2load.out" >&2; }
}

# window COMMAND...: zero every master's counters, run COMMAND, dump them; prints the window's
# seconds, then each master's instructions in it.
window() {
  local t0 t1 pid i
  t0=$(date +%s.%N)
  for pid in "${redis_pids[@]}"; do callgrind_control --zero "$pid" >/dev/null 2>&1; done
  "$@"
  for pid in "${redis_pids[@]}"; do callgrind_control --dump "$pid" >/dev/null 2>&1; done
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f\n", b - a}'
  for i in $(seq 0 $((masters - 1))); do
    awk '/^(summary|totals):/ {print $2; exit}' "$(ls -t "$work/cg.$i.out".* | head -n 1)"
  done
}

measured=$((n2 - n1))
if [ "$method" = difference ]; then
  total() { # N: each master's total instructions for a run of N decisions
    start_redis >&2
    start_gateway
    decide "$1" "$work/uris"
    stop_gateway
    stop_redis
  }
  mapfile -t first < <(total "$n1")
  mapfile -t second < <(total "$n2")
  [ "${#first[@]}" = "$masters" ] && [ "${#second[@]}" = "$masters" ] ||
    { echo "callgrind wrote no total for every master" >&2; exit 1; }
  per=() background=()
  for i in $(seq 0 $((masters - 1))); do per+=($((second[i] - first[i]))) background+=(0); done
  detail="${first[*]} at $n1 requests, ${second[*]} at $n2"
else
  start_redis
  start_gateway
  decide "$n1" "$work/warmup-uris" hot # the pair's warm-up on a key apart from the measured ones
  mapfile -t idle_window < <(window sleep "$idle")
  mapfile -t load_window < <(window decide "$measured" "$work/measured-uris")
  stop_gateway
  stop_redis >/dev/null
  [ "${#idle_window[@]}" = $((masters + 1)) ] && [ "${#load_window[@]}" = $((masters + 1)) ] ||
    { echo "callgrind dumped no total for every master" >&2; exit 1; }
  per=() background=()
  for i in $(seq 0 $((masters - 1))); do
    # The background's instructions a second, for the load window's length.
    background+=("$(awk -v b="${idle_window[i + 1]}" -v s="${idle_window[0]}" -v l="${load_window[0]}" 'BEGIN {printf "%.0f", b / s * l}')")
    per+=($((load_window[i + 1] - background[i])))
  done
  detail="${load_window[*]:1} in ${load_window[0]} s of $measured decisions, less ${background[*]} of background (${idle_window[*]:1} in ${idle_window[0]} s idle)"
fi
if [ -n "${BENCH_CALLGRIND_OUT:-}" ]; then
  mkdir -p "$BENCH_CALLGRIND_OUT"
  cp "$work"/cg.*.out* "$BENCH_CALLGRIND_OUT/"
fi
sum=0 shares=
for i in $(seq 0 $((masters - 1))); do
  sum=$((sum + per[i]))
  shares="$shares $((per[i] / measured))"
done
where="redis-server"
[ "$masters" = 1 ] || where="a Cluster of $masters masters (per master:$shares)"
echo "$where for $binary${BENCH_LIMITS:+ (LIMITS=$BENCH_LIMITS)}, $keys keys, $method: $detail: $((sum / measured)) per decision"
