#!/usr/bin/env bash
# Instructions redis-server spends per decision a tollgate binary asks of it, exact (callgrind
# counts instructions, whatever else the machine does): redis-server under valgrind, tollgate
# (not under valgrind) in front of examples/echo_backend deciding in it; N1 requests in one
# run and N2 in another, and the difference of redis-server's two totals over N2 - N1 removes
# its startup and shutdown (docs/benchmarks.md, parts 17 and 21).
#
# usage: scripts/redis_instructions_per_decision.sh BINARY|pair [N1 N2]   (default 2000 12000)
# BINARY   a tollgate binary: h2load sends the requests, 8 at once
# pair     the floor instead: examples/redis_pair, INCRBY + PEXPIRE NX pipelined, one round trip
#          per decision, 8 callers on one multiplexed connection
# BENCH_KEYS=hot (default): one client, one key; cold: a new client (key) every request
#          (KEY_BY=query:k, one h2load connection with 8 streams walking distinct URIs)
# BENCH_LIMITS=LIST gives the general rule that limit list (LIMITS) instead of a token bucket
# no request exhausts.
# BENCH_CALLGRIND_OUT=DIR keeps the second run's callgrind dump there (for callgrind_annotate).
set -euo pipefail
cd "$(dirname "$0")/.."
binary=${1:?usage: scripts/redis_instructions_per_decision.sh BINARY|pair [N1 N2]}
n1=${2:-2000} n2=${3:-12000}
keys=${BENCH_KEYS:-hot}
case $keys in hot|cold) ;; *) echo "BENCH_KEYS is hot or cold, not $keys" >&2; exit 2 ;; esac
cargo build --release --quiet --example echo_backend --example redis_pair
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
seq "$n2" | sed 's|^|http://127.0.0.1:18091/?k=|' >"$work/uris"
total() { # requests
  valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" \
    redis-server --port 18093 --save '' --appendonly no --daemonize no >/dev/null 2>&1 &
  local redis=$!
  for _ in $(seq 100); do redis-cli -p 18093 ping >/dev/null 2>&1 && break; sleep 0.3; done
  if [ "$binary" = pair ]; then
    REDIS_URL=redis://127.0.0.1:18093 target/release/examples/redis_pair "$1" "$keys"
  else
    PORT=18090 target/release/examples/echo_backend >/dev/null 2>&1 &
    local backend=$!
    local limits=(MAX_TOKENS=1000000000 REFILL_RATE=1000000)
    [ -n "${BENCH_LIMITS:-}" ] && limits=(LIMITS="$BENCH_LIMITS")
    local keyed=()
    [ "$keys" = cold ] && keyed=(KEY_BY=query:k KEY_HASH_SECRET=0123456789abcdef0123456789abcdef)
    env BACKEND_URL=http://127.0.0.1:18090 PORT=18091 ADMIN_PORT=18092 REDIS_ADDR=127.0.0.1:18093 \
      REDIS_TIMEOUT_MS=5000 "${limits[@]}" "${keyed[@]}" RUST_LOG=warn "$binary" >/dev/null 2>&1 &
    local gateway=$!
    for _ in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:18091/ && break; sleep 0.3; done
    if [ "$keys" = cold ]; then
      # One connection of 8 streams walks the URIs once: every request a key never seen.
      h2load -n "$1" -c 1 -m 8 -i "$work/uris" >"$work/h2load.out" || true
    else
      h2load --h1 -n "$1" -c 8 http://127.0.0.1:18091/ >"$work/h2load.out" || true
    fi
    grep -q "$1 succeeded" "$work/h2load.out" || { echo "not every request succeeded:" >&2; grep requests: "$work/h2load.out" >&2; }
    kill -TERM "$gateway"; wait "$gateway" 2>/dev/null || true
    kill "$backend"; wait "$backend" 2>/dev/null || true
  fi
  redis-cli -p 18093 shutdown nosave >/dev/null 2>&1 || kill "$redis"
  wait "$redis" 2>/dev/null || true
  awk '/^(summary|totals):/ {print $2; exit}' "$work/cg.out"
}
first=$(total "$n1")
second=$(total "$n2")
[ -n "${BENCH_CALLGRIND_OUT:-}" ] && mkdir -p "$BENCH_CALLGRIND_OUT" && cp "$work/cg.out" "$BENCH_CALLGRIND_OUT/"
echo "redis-server for $binary${BENCH_LIMITS:+ (LIMITS=$BENCH_LIMITS)}, $keys keys: $first instructions at $n1 requests, $second at $n2: $(( (second - first) / (n2 - n1) )) per decision"
