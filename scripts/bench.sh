#!/usr/bin/env bash
# Benchmarks, all on loopback:
#  1. criterion: the in-memory decision hot path (benches/decision.rs) and the Redis store
#     against redis-benchmark on the same server (benches/redis.rs);
#  2. the whole gateway under wrk, side by side in one run: the backend alone, tollgate with
#     the memory store, tollgate with the Redis store, and nginx with limit_req, all in front
#     of the same backend (examples/echo_backend.rs). Limits are set high enough that every
#     request is allowed, so what is measured is the cost of deciding and forwarding.
# Results and how to read them: docs/benchmarks.md. Quote the ratios, not the absolute req/s.
#
# usage: scripts/bench.sh [--quick] [--no-criterion] [--no-load] [--rounds N]
#   --quick         short criterion runs and 3 s load runs (a smoke test, not a measurement)
#   --no-criterion  skip part 1;  --no-load  skip part 2
#   --rounds N      repeat the four load runs N times and average them (default 1)
# Environment: BENCH_DURATION (wrk -d, default 10s), BENCH_CONNECTIONS (wrk -c, default 64),
#   BENCH_THREADS (wrk -t, default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

quick=0 criterion=1 load=1 rounds=1
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --no-criterion) criterion=0 ;;
    --no-load) load=0 ;;
    --rounds) rounds=${2:?--rounds needs a number}; shift ;;
    -h | --help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ "$quick" = 1 ]; then duration=${BENCH_DURATION:-3s} warmup=1s; else duration=${BENCH_DURATION:-10s} warmup=2s; fi
connections=${BENCH_CONNECTIONS:-64}
threads=${BENCH_THREADS:-2}

# --- tools -------------------------------------------------------------------------------
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null && command -v redis-benchmark >/dev/null || missing+=(redis-tools)
if [ "$load" = 1 ]; then
  command -v wrk >/dev/null || missing+=(wrk)
  command -v nginx >/dev/null || missing+=(nginx-light)
  command -v curl >/dev/null || missing+=(curl)
fi
if [ ${#missing[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null && [ "$(id -u)" -eq 0 ]; then
    echo "bench.sh: installing ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "bench.sh: missing ${missing[*]}: apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), load average $(cut -d' ' -f1-3 /proc/loadavg)"

# --- 1. criterion ----------------------------------------------------------------------------
if [ "$criterion" = 1 ]; then
  criterion_args=()
  [ "$quick" = 1 ] && criterion_args=(--warm-up-time 1 --measurement-time 2)
  echo "== cargo bench --bench decision --bench redis -- ${criterion_args[*]}"
  marker=$(mktemp)
  cargo bench --bench decision --bench redis -- "${criterion_args[@]}"
  # Summary of this run's criterion results: median time per iteration, and per decision
  # (the contended benches do one decision per thread per iteration).
  echo
  echo "criterion medians (this run)"
  printf '| %-34s | %14s | %14s | %16s |\n' benchmark "time/iteration" "ns/decision" "decisions/s"
  printf '|%s|%s|%s|%s|\n' "------------------------------------" "----------------" "----------------" "------------------"
  find target/criterion -path '*/new/benchmark.json' -newer "$marker" | sort | while read -r meta; do
    id=$(sed -E 's/.*"full_id":"([^"]*)".*/\1/' "$meta")
    elements=$(sed -nE 's/.*"Elements":([0-9]+).*/\1/p' "$meta")
    median=$(sed -E 's/.*"median":\{"confidence_interval":\{[^}]*\},"point_estimate":([0-9.eE+-]+).*/\1/' \
      "$(dirname "$meta")/estimates.json")
    awk -v id="$id" -v t="$median" -v e="${elements:-1}" 'BEGIN {
      unit = t >= 1e6 ? sprintf("%.2f ms", t / 1e6) : t >= 1e3 ? sprintf("%.2f us", t / 1e3) : sprintf("%.1f ns", t)
      printf "| %-34s | %14s | %14.1f | %16.0f |\n", id, unit, t / e, e * 1e9 / t }'
  done
  rm -f "$marker"
fi
[ "$load" = 1 ] || exit 0

# --- 2. the whole gateway under wrk --------------------------------------------------------
echo "== building tollgate and the echo backend (release)"
cargo build --release --quiet --bin tollgate --example echo_backend
TOLLGATE=$ROOT/target/release/tollgate
ECHO_BACKEND=$ROOT/target/release/examples/echo_backend

work=$(mktemp -d)
chmod 755 "$work" # nginx workers may run as another user
pids=() pnames=()
cleanup() {
  local status=$? pid log
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "$status" -ne 0 ]; then
    for log in "$work"/*.log; do
      [ -s "$log" ] && { echo "--- last lines of $(basename "$log")"; tail -n 20 "$log"; } >&2
    done
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

used_ports=" "
free_port() { # a loopback port nothing listens on, not handed out before in this run
  local port
  while :; do
    port=$((20000 + RANDOM % 40000))
    case $used_ports in *" $port "*) continue ;; esac
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      used_ports+="$port "
      echo "$port"
      return
    fi
  done
}

wait_for_port() { # port name
  local i
  for i in $(seq 1 200); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  echo "bench.sh: $2 did not start listening on 127.0.0.1:$1; its log:" >&2
  cat "$work/$2.log" >&2 || true
  exit 1
}

start() { # name port command... (runs in $work, so no .env of the repo is read)
  local name=$1 port=$2
  shift 2
  (cd "$work" && exec "$@") >"$work/$name.log" 2>&1 &
  pids+=($!) pnames+=("$name")
  wait_for_port "$port" "$name"
}

all_alive() { # every process started above is still running
  local i
  for i in "${!pids[@]}"; do
    if ! kill -0 "${pids[$i]}" 2>/dev/null; then
      wait "${pids[$i]}" && status=0 || status=$?
      echo "bench.sh: ${pnames[$i]} (pid ${pids[$i]}) has exited with status $status" >&2
      exit 1
    fi
  done
}

backend_port=$(free_port)
start backend "$backend_port" env PORT="$backend_port" "$ECHO_BACKEND"
backend=http://127.0.0.1:$backend_port

redis_port=$(free_port)
start redis "$redis_port" redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no

# Everything allowed: a billion tokens refilled at a million per second.
gateway_env=(env -u REDIS_URL -u REDIS_ADDR -u REDIS_CLUSTER_NODES -u ALGORITHM -u RUST_LOG
  BACKEND_URL="$backend" BIND=127.0.0.1 MAX_TOKENS=1000000000 REFILL_RATE=1000000 RUST_LOG=warn)
memory_port=$(free_port)
start tollgate-memory "$memory_port" "${gateway_env[@]}" PORT="$memory_port" "$TOLLGATE"
redis_gateway_port=$(free_port)
start tollgate-redis "$redis_gateway_port" "${gateway_env[@]}" PORT="$redis_gateway_port" \
  REDIS_URL="redis://127.0.0.1:$redis_port" KEY_PREFIX=bench: "$TOLLGATE"

nginx_port=$(free_port)
mkdir -p "$work/nginx"
cat >"$work/nginx.conf" <<EOF
# Reference: nginx limiting by client address, every request allowed, same backend.
worker_processes $(nproc);
pid $work/nginx.pid;
error_log $work/nginx-error.log warn;
daemon off;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $work/nginx/body;
  proxy_temp_path $work/nginx/proxy;
  fastcgi_temp_path $work/nginx/fastcgi;
  uwsgi_temp_path $work/nginx/uwsgi;
  scgi_temp_path $work/nginx/scgi;
  limit_req_zone \$binary_remote_addr zone=clients:10m rate=1000000r/s;
  upstream backend {
    server 127.0.0.1:$backend_port;
    keepalive 64;
  }
  server {
    listen 127.0.0.1:$nginx_port;
    location / {
      limit_req zone=clients burst=1000000 nodelay;
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      # What tollgate adds too.
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto \$scheme;
      proxy_set_header X-Forwarded-Host \$host;
    }
  }
}
EOF
start nginx "$nginx_port" nginx -p "$work/nginx" -c "$work/nginx.conf"

names=(direct tollgate-memory tollgate-redis nginx-limit_req)
urls=("$backend/" "http://127.0.0.1:$memory_port/" "http://127.0.0.1:$redis_gateway_port/" "http://127.0.0.1:$nginx_port/")

# Each target answers 200, and tollgate's answers carry its headers (so the limiter is in the path).
for i in "${!names[@]}"; do
  headers=$(curl -s -D - -o /dev/null --max-time 5 "${urls[$i]}") || true
  status=$(printf '%s' "$headers" | head -1 | tr -d '\r')
  case ${names[$i]} in
    tollgate-*) printf '%s' "$headers" | grep -qi '^x-ratelimit-remaining:' || {
      echo "bench.sh: ${names[$i]} answered without X-RateLimit-Remaining: $status" >&2
      exit 1
    } ;;
  esac
  case $status in *" 200"*) ;; *) echo "bench.sh: ${names[$i]} answered '$status'" >&2; exit 1 ;; esac
done

to_ms() { # wrk latency such as 512.00us, 1.23ms, 1.01s -> milliseconds
  awk -v v="$1" 'BEGIN {
    if (v ~ /us$/) printf "%.3f", v / 1000; else if (v ~ /ms$/) printf "%.3f", v + 0;
    else if (v ~ /m$/) printf "%.3f", v * 60000; else printf "%.3f", v * 1000 }'
}

echo "== wrk -t$threads -c$connections -d$duration --latency (after a $warmup warm-up each), $rounds round(s)"
results=$work/results # name rps p50_ms p99_ms requests non2xx errors
: >"$results"
for round in $(seq 1 "$rounds"); do
  for i in "${!names[@]}"; do
    name=${names[$i]} url=${urls[$i]}
    all_alive
    timeout 60 wrk -t"$threads" -c"$connections" -d"$warmup" "$url" >/dev/null
    [ "$name" = tollgate-redis ] && redis-cli -p "$redis_port" CONFIG RESETSTAT >/dev/null
    out=$(timeout 120 wrk -t"$threads" -c"$connections" -d"$duration" --latency "$url")
    rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
    p50=$(to_ms "$(awk '$1 == "50%" {print $2}' <<<"$out")")
    p99=$(to_ms "$(awk '$1 == "99%" {print $2}' <<<"$out")")
    requests=$(awk '/requests in/ {print $1}' <<<"$out")
    non2xx=$(awk -F: '/Non-2xx/ {gsub(/ /, "", $2); print $2}' <<<"$out")
    errors=$(awk '/Socket errors/ {gsub(/,/, ""); print $4 + $6 + $8 + $10}' <<<"$out")
    echo "$name ${rps:-0} $p50 $p99 ${requests:-0} ${non2xx:-0} ${errors:-0}" >>"$results"
    all_alive
    printf '  round %s  %-16s %10.0f req/s  p50 %7.3f ms  p99 %7.3f ms  (%s requests, %s non-2xx, %s socket errors)\n' \
      "$round" "$name" "${rps:-0}" "$p50" "$p99" "${requests:-0}" "${non2xx:-0}" "${errors:-0}"
    if [ "$name" = tollgate-redis ]; then
      # Every request must have been decided by Redis, not waved through by the fail mode.
      decided=$(redis-cli -p "$redis_port" INFO commandstats | tr -d '\r' |
        awk -F'[=,:]' '/^cmdstat_evalsha:/ {print $3}')
      failed=$(grep -c 'store call failed' "$work/tollgate-redis.log" || true)
      echo "                   redis EVALSHA calls during the run: ${decided:-0} (wrk counted ${requests:-0}; failed store calls so far: $failed)"
    fi
  done
done

echo
echo "whole gateway on loopback, wrk -t$threads -c$connections -d$duration, mean of $rounds round(s); backend: examples/echo_backend"
awk -v names="${names[*]}" '
  { n[$1]++; rps[$1] += $2; p50[$1] += $3; p99[$1] += $4; bad[$1] += $6 + $7 }
  END {
    split(names, order, " ")
    direct = rps["direct"] / n["direct"]
    printf "| %-16s | %10s | %9s | %9s | %15s | %11s |\n", "target", "req/s", "p50 ms", "p99 ms", "req/s vs direct", "non-2xx+err"
    printf "|%s|%s|%s|%s|%s|%s|\n", "------------------", "------------", "-----------", "-----------", "-----------------", "-------------"
    for (i = 1; i in order; i++) {
      t = order[i]; r = rps[t] / n[t]
      printf "| %-16s | %10.0f | %9.3f | %9.3f | %15.2f | %11d |\n", t, r, p50[t] / n[t], p99[t] / n[t], r / direct, bad[t]
    }
  }' "$results"
echo "load average after the load runs: $(cut -d' ' -f1-3 /proc/loadavg)"
