#!/usr/bin/env bash
# Instructions per allowed request of a tollgate binary, exact (callgrind counts instructions,
# whatever else the machine does): the binary under valgrind in front of examples/echo_backend
# serves N1 requests in one run and N2 in another (h2load --h1 -c 8), and the difference of the
# two totals over N2 - N1 removes startup and shutdown. Run it for two builds to compare them
# (docs/benchmarks.md, part 11).
#
# usage: scripts/instructions_per_request.sh BINARY [N1 N2]   (default 2000 12000)
# With BENCH_REFUSED=1 every request but the first is refused (429): the cost of a refusal.
# BENCH_HEADER="name: value" adds a header to every request (e.g. "accept: */*"); the gateway's
# other settings (DENY_FORMAT, FORWARD_RATELIMIT_HEADERS, ...) come from the environment.
# BENCH_LIMITS=LIST gives the general rule that limit list (LIMITS) instead of a token bucket
# no request exhausts: e.g. two limits, token_bucket:1000000000:1000000+fixed_window:1000000000:86400.
# BENCH_REDIS=host:port decides in that Redis (REDIS_ADDR, with a KEY_HASH_SECRET).
set -euo pipefail
cd "$(dirname "$0")/.."
binary=${1:?usage: scripts/instructions_per_request.sh BINARY [N1 N2]}
n1=${2:-2000} n2=${3:-12000}
cargo build --release --quiet --example echo_backend
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
total() { # requests
  PORT=18090 target/release/examples/echo_backend >/dev/null 2>&1 &
  local backend=$!
  sleep 0.5
  local budget=(MAX_TOKENS=1000000000 REFILL_RATE=1000000)
  [ "${BENCH_REFUSED:-0}" = 1 ] && budget=(MAX_TOKENS=1 REFILL_RATE=0.001)
  [ -n "${BENCH_LIMITS:-}" ] && budget=(LIMITS="$BENCH_LIMITS")
  [ -n "${BENCH_REDIS:-}" ] && budget+=(REDIS_ADDR="$BENCH_REDIS" REDIS_TIMEOUT_MS=5000)
  env BACKEND_URL=http://127.0.0.1:18090 PORT=18091 ADMIN_PORT=18092 "${budget[@]}" RUST_LOG=warn \
    valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" "$binary" >/dev/null 2>&1 &
  local gateway=$!
  for _ in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:18091/ && break; sleep 0.3; done
  local header=()
  [ -n "${BENCH_HEADER:-}" ] && header=(-H "$BENCH_HEADER")
  h2load --h1 -n "$1" -c 8 "${header[@]}" http://127.0.0.1:18091/ >/dev/null || true
  kill -TERM "$gateway"; wait "$gateway" 2>/dev/null || true
  kill "$backend"; wait "$backend" 2>/dev/null || true
  awk '/^(summary|totals):/ {print $2; exit}' "$work/cg.out"
}
first=$(total "$n1")
second=$(total "$n2")
echo "$binary$([ "${BENCH_REFUSED:-0}" = 1 ] && echo " (refused)")${BENCH_HEADER:+ ($BENCH_HEADER)}${BENCH_LIMITS:+ (LIMITS=$BENCH_LIMITS)}${BENCH_REDIS:+ (Redis)}: $first instructions at $n1 requests, $second at $n2: $(( (second - first) / (n2 - n1) )) per request"
