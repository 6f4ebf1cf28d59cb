#!/usr/bin/env bash
# Instructions redis-server spends per decision a tollgate binary asks of it, exact (callgrind
# counts instructions, whatever else the machine does): redis-server under valgrind, tollgate
# (not under valgrind) in front of examples/echo_backend deciding in it; N1 requests in one
# run and N2 in another (h2load --h1 -c 8, one client), and the difference of redis-server's
# two totals over N2 - N1 removes its startup and shutdown (docs/benchmarks.md, part 17).
#
# usage: scripts/redis_instructions_per_decision.sh BINARY [N1 N2]   (default 2000 12000)
# BENCH_LIMITS=LIST gives the general rule that limit list (LIMITS) instead of a token bucket
# no request exhausts.
set -euo pipefail
cd "$(dirname "$0")/.."
binary=${1:?usage: scripts/redis_instructions_per_decision.sh BINARY [N1 N2]}
n1=${2:-2000} n2=${3:-12000}
cargo build --release --quiet --example echo_backend
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
total() { # requests
  valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" \
    redis-server --port 18093 --save '' --appendonly no --daemonize no >/dev/null 2>&1 &
  local redis=$!
  for _ in $(seq 100); do redis-cli -p 18093 ping >/dev/null 2>&1 && break; sleep 0.3; done
  PORT=18090 target/release/examples/echo_backend >/dev/null 2>&1 &
  local backend=$!
  local limits=(MAX_TOKENS=1000000000 REFILL_RATE=1000000)
  [ -n "${BENCH_LIMITS:-}" ] && limits=(LIMITS="$BENCH_LIMITS")
  env BACKEND_URL=http://127.0.0.1:18090 PORT=18091 ADMIN_PORT=18092 REDIS_ADDR=127.0.0.1:18093 \
    REDIS_TIMEOUT_MS=5000 "${limits[@]}" RUST_LOG=warn "$binary" >/dev/null 2>&1 &
  local gateway=$!
  for _ in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:18091/ && break; sleep 0.3; done
  h2load --h1 -n "$1" -c 8 http://127.0.0.1:18091/ >/dev/null || true
  kill -TERM "$gateway"; wait "$gateway" 2>/dev/null || true
  kill "$backend"; wait "$backend" 2>/dev/null || true
  redis-cli -p 18093 shutdown nosave >/dev/null 2>&1 || kill "$redis"
  wait "$redis" 2>/dev/null || true
  awk '/^(summary|totals):/ {print $2; exit}' "$work/cg.out"
}
first=$(total "$n1")
second=$(total "$n2")
echo "redis-server for $binary${BENCH_LIMITS:+ (LIMITS=$BENCH_LIMITS)}: $first instructions at $n1 requests, $second at $n2: $(( (second - first) / (n2 - n1) )) per decision"
