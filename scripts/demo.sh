#!/usr/bin/env bash
# The demo: build, start the echo backend (examples/echo_backend.rs) and tollgate on the
# in-memory store with small limits, send bursts, and print the 200s turning into 429s with
# their rate-limit headers. Both processes are stopped on exit. Needs cargo and curl only.
#
# usage: scripts/demo.sh
# Environment: DEMO_PORT (tollgate), DEMO_ADMIN_PORT (its admin listener) and
#   DEMO_BACKEND_PORT (the echo backend) pick the ports; each defaults to a free one.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x "${CARGO_TARGET_DIR:-target}/release/tollgate" ]; then
  echo "demo.sh: the first build compiles tollgate in release mode; that takes a few minutes." >&2
fi
cargo build --release --bin tollgate --example echo_backend
bin=$(cd "${CARGO_TARGET_DIR:-target}/release" && pwd)

workdir=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  rm -rf "$workdir"
}
trap cleanup EXIT

# listening, free_port (the readiness check sends no request, so it spends no token)
. scripts/lib.sh

wait_ready() { # port pid name
  for _ in $(seq 100); do
    listening "$1" && return
    if ! kill -0 "$2" 2>/dev/null; then
      echo "demo.sh: $3 exited; its log:" >&2
      cat "$workdir/$3.log" >&2
      exit 1
    fi
    sleep 0.1
  done
  echo "demo.sh: $3 is not listening on port $1 after 10 s" >&2
  exit 1
}

backend_port=${DEMO_BACKEND_PORT:-$(free_port)}
gateway_port=${DEMO_PORT:-$(free_port "$backend_port")}
admin_port=${DEMO_ADMIN_PORT:-$(free_port "$backend_port" "$gateway_port")}
for port in "$backend_port" "$gateway_port" "$admin_port"; do
  if listening "$port"; then
    echo "demo.sh: port $port is taken; choose others with DEMO_PORT, DEMO_ADMIN_PORT, DEMO_BACKEND_PORT" >&2
    exit 1
  fi
done

# env -i: only these variables, so neither the caller's environment nor a .env file (tollgate
# runs in an empty directory) can switch the demo to Redis or change its limits.
config=(
  "PATH=$PATH"
  "BACKEND_URL=http://127.0.0.1:$backend_port"
  BIND=127.0.0.1
  "PORT=$gateway_port"
  "ADMIN_PORT=$admin_port"
  ALGORITHM=token_bucket
  MAX_TOKENS=5
  REFILL_RATE=1
  AUTH_MAX_TOKENS=2
  RUST_LOG=info,tollgate=debug
  NO_COLOR=1
)

echo
echo "== tollgate --check-config"
(cd "$workdir" && env -i "${config[@]}" "$bin/tollgate" --check-config)

env -i "PORT=$backend_port" "$bin/examples/echo_backend" >"$workdir/backend.log" 2>&1 &
pids+=($!)
wait_ready "$backend_port" "$!" backend
(cd "$workdir" && exec env -i "${config[@]}" "$bin/tollgate") >"$workdir/tollgate.log" 2>&1 &
tollgate_pid=$!
pids+=("$tollgate_pid")
wait_ready "$gateway_port" "$tollgate_pid" tollgate

first_200=""
first_429=""
request() { # path
  local path=$1 status limit remaining reset retry
  status=$(curl -sS -o "$workdir/body" -D "$workdir/headers" -w '%{http_code}' \
    "http://127.0.0.1:$gateway_port$path")
  header() { grep -i "^$1:" "$workdir/headers" | cut -d' ' -f2- | tr -d '\r' || true; }
  limit=$(header x-ratelimit-limit)
  remaining=$(header x-ratelimit-remaining)
  reset=$(header x-ratelimit-reset)
  retry=$(header retry-after)
  if [ -n "$reset" ]; then reset="$reset (now+$((reset - $(date +%s)))s)"; fi
  printf 'GET %-8s -> %s   X-RateLimit-Limit: %-2s Remaining: %-2s Reset: %s   Retry-After: %s\n' \
    "$path" "$status" "${limit:--}" "${remaining:--}" "${reset:--}" "${retry:--}"
  if [ "$status" = 200 ] && [ -z "$first_200" ]; then first_200=$(cat "$workdir/body"); fi
  if [ "$status" = 429 ] && [ -z "$first_429" ]; then first_429=$(cat "$workdir/body"); fi
}

echo
echo "== 8 requests to / (general rule: 5 tokens, refill 1 per second)"
for _ in $(seq 8); do request /; done

echo
echo "== 3 requests to the auth path, spelled 3 ways (auth rule: 2 tokens, refill 0.01 per second)"
for path in /login /Login /login/; do request "$path"; done

echo
echo "== a 429 body"
echo "$first_429"
echo
echo "== what the backend answered to an allowed request (client = X-Forwarded-For it received)"
echo "$first_200"

echo
echo "== 1.1 s later, one general token is back"
sleep 1.1
request /

echo
echo "== tollgate's per-request log lines (RUST_LOG=tollgate=debug), last 3"
grep ' request' "$workdir/tollgate.log" | tail -n 3 || true

echo
echo "== the admin listener: GET /readyz and the request counters from GET /metrics"
curl -sS "http://127.0.0.1:$admin_port/readyz"
echo
curl -sS "http://127.0.0.1:$admin_port/metrics" | grep '^tollgate_requests_total' | grep -v ' 0$' || true

echo
echo "== SIGTERM: tollgate drains and exits"
kill -TERM "$tollgate_pid"
status=0
wait "$tollgate_pid" || status=$?
tail -n 2 "$workdir/tollgate.log"
echo "tollgate exited with status $status"
