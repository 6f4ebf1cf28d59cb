#!/usr/bin/env bash
# Key floods against the memory store: can invented identities buy a refused client a fresh
# budget? For each key mode (ip via a trusted X-Forwarded-For, header, ip+header), a victim is
# refused on the auth rule (/login) and on the general rule (/api), then wrk sends a flood of
# fresh identities, each twice, of 10x and then 100x MAX_KEYS, on the general rule and on the
# auth rule in turn; after each flood the victim asks again. Prints one row per flood: requests
# sent, how long they took, the clients held and the evictions (from /metrics), and what the
# victim got on both rules afterwards (429: still refused; 200: the flood freed it).
#
# usage: scripts/flood.sh [TOLLGATE_BINARY ...]   (default target/release/tollgate, built)
# Environment: FLOOD_MAX_KEYS (default 1000).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
max_keys=${FLOOD_MAX_KEYS:-1000}
for tool in wrk curl; do
  command -v "$tool" >/dev/null || { echo "flood.sh: $tool is required (apt-get install $tool)" >&2; exit 1; }
done
if [ $# -eq 0 ]; then
  cargo build --release --quiet --bin tollgate
  set -- "${CARGO_TARGET_DIR:-$ROOT/target}/release/tollgate"
fi

work=$(mktemp -d)
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
. "$ROOT/scripts/lib.sh"

# A backend: nginx answering 200 itself.
backend_port=$(free_port)
mkdir -p "$work/nginx"
cat >"$work/nginx.conf" <<EOF
worker_processes 1;
pid $work/nginx.pid;
error_log $work/nginx-error.log warn;
daemon off;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $work/nginx/body;
  server { listen 127.0.0.1:$backend_port; location / { return 200 "ok"; } }
}
EOF
(cd "$work" && exec nginx -p "$work/nginx" -c "$work/nginx.conf") >"$work/backend.log" 2>&1 &
pids+=($!)
wait_for_port "$backend_port" backend

# wrk script: each request a fresh identity (the key mode's headers), each identity twice.
cat >"$work/flood.lua" <<'EOF'
local mode, path, first = os.getenv("FLOOD_MODE"), os.getenv("FLOOD_PATH"), tonumber(os.getenv("FLOOD_FIRST"))
local n = 0
function request()
  local id = first + math.floor(n / 2)
  n = n + 1
  local ip = string.format("10.%d.%d.%d", math.floor(id / 65536) % 256, math.floor(id / 256) % 256, id % 256)
  local headers = {}
  if mode == "ip" then headers["X-Forwarded-For"] = ip
  elseif mode == "header" then headers["X-API-Key"] = "flood-" .. id
  else headers["X-Forwarded-For"] = "10.0.0.1"; headers["X-API-Key"] = "flood-" .. id end
  return wrk.format("GET", path, headers)
end
EOF

victim_headers() { # mode
  case $1 in
    ip) echo "-H X-Forwarded-For:203.0.113.7" ;;
    header) echo "-H X-API-Key:victim" ;;
    *) echo "-H X-Forwarded-For:203.0.113.7 -H X-API-Key:victim" ;;
  esac
}
status() { # port path mode
  # shellcheck disable=SC2046
  curl -s -o /dev/null -w '%{http_code}' $(victim_headers "$3") "http://127.0.0.1:$1$2"
}
metric() { # admin-port name
  curl -s "http://127.0.0.1:$1/metrics" | awk -v m="$2" '$1 == m || index($1, m "{") == 1 {s += $2} END {print s + 0}'
}

printf '| binary | key mode | flood | on | requests | seconds | clients held | evictions | victim /login | victim /api |\n'
printf '|---|---|---|---|--:|--:|--:|--:|--:|--:|\n'
for binary in "$@"; do
  for mode in ip header ip+header; do
    case $mode in
      ip) key_by=ip flood_mode=ip ;;
      header) key_by=header:X-API-Key flood_mode=header ;;
      *) key_by=ip+header:X-API-Key flood_mode=both ;;
    esac
    port=$(free_port) admin=$(free_port "$port")
    env -i BACKEND_URL="http://127.0.0.1:$backend_port" BIND=127.0.0.1 PORT="$port" ADMIN_BIND=127.0.0.1 \
      ADMIN_PORT="$admin" RUST_LOG=warn TRUSTED_PROXIES=127.0.0.1 MAX_KEYS="$max_keys" \
      KEY_BY="$key_by" AUTH_KEY_BY="$key_by" AUTH_PATHS=/login MAX_TOKENS=3 REFILL_RATE=0.001 \
      AUTH_MAX_TOKENS=2 AUTH_REFILL_RATE=0.001 "$binary" >"$work/tollgate.log" 2>&1 &
    pid=$!
    pids+=($pid)
    wait_for_port "$port" tollgate
    for _ in 1 2 3; do status "$port" /login "$mode" >/dev/null; done
    for _ in 1 2 3 4; do status "$port" /api "$mode" >/dev/null; done
    [ "$(status "$port" /login "$mode")$(status "$port" /api "$mode")" = 429429 ] ||
      { echo "flood.sh: the victim is not refused to begin with" >&2; exit 1; }
    first=1
    for factor in 10 100; do
      for path in /api /login; do
        requests=$((2 * factor * max_keys))
        started=$(date +%s.%N)
        before=$(metric "$admin" tollgate_requests_total)
        # One connection, so requests go one at a time: wrk is stopped once tollgate has counted
        # them all (at most one more may be sent).
        FLOOD_MODE=$flood_mode FLOOD_PATH=$path FLOOD_FIRST=$first \
          wrk -t1 -c1 -d600s -s "$work/flood.lua" "http://127.0.0.1:$port" >/dev/null &
        wrk_pid=$!
        while [ $(($(metric "$admin" tollgate_requests_total) - before)) -lt "$requests" ]; do
          kill -0 "$wrk_pid" 2>/dev/null || { echo "flood.sh: wrk ended early" >&2; exit 1; }
          sleep 0.05
        done
        kill "$wrk_pid"
        wait "$wrk_pid" 2>/dev/null || true
        requests=$(($(metric "$admin" tollgate_requests_total) - before))
        seconds=$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
        first=$((first + factor * max_keys))
        printf '| %s | %s | %sx MAX_KEYS | %s | %s | %s | %s | %s | %s | %s |\n' "$(basename "$binary")" "$mode" \
          "$factor" "$path" "$requests" "$seconds" "$(metric "$admin" tollgate_memory_clients)" \
          "$(metric "$admin" tollgate_memory_evictions_total)" "$(status "$port" /login "$mode")" "$(status "$port" /api "$mode")"
      done
    done
    kill "$pid"
    wait "$pid" 2>/dev/null || true
  done
done
