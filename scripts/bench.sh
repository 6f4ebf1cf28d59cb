#!/usr/bin/env bash
# Benchmarks, all on loopback. Results, the commands and how to read them: docs/benchmarks.md.
#  1. criterion: the in-memory decision hot path (benches/decision.rs) and the Redis store
#     against redis-benchmark on the same server (benches/redis.rs);
#  2. the whole gateway under load, every target side by side in one run, rounds interleaved
#     (A B C D E, A B C D E, ...), medians reported. On a machine with two cores or more the
#     proxy under test runs alone on one core (BENCH_PROXY_CPU, default 0) and the backend
#     and the load generator on another (BENCH_LOAD_CPU, default 1); a process pinned to one
#     core sees one CPU, so tokio gives tollgate, the bare floor and the backend one worker each,
#     and nginx runs `worker_processes 1`. Reported per target: req/s, p50/p99 latency, and the
#     CPU time the proxy's process(es) used per request (utime+stime from /proc/PID/stat; for
#     tollgate with Redis, redis-server's CPU is added, as it shares the proxy's core).
#     Targets: the backend alone (examples/echo_backend), the lean floor (examples/lean_floor:
#     hyper's plain http1 server and client and a keyed token bucket, no header work at all),
#     the bare floor (examples/bare_proxy: hyper + hyper-util's pooled client + a keyed token
#     bucket, as most would write it), tollgate (memory store), tollgate (Redis store) and nginx
#     with limit_req; with BENCH_BASELINE=path/to/tollgate, that build too (tollgate-base, memory
#     store), so a change is measured before and after in one run. Scenarios:
#       allow  every request allowed: the cost of deciding and forwarding (the headline);
#       deny   a budget of one request per 1000 s, so nearly every request is refused (429);
#              for tollgate with Redis, Redis calls per refused request (the denial cache);
#       many   every request allowed, from 100,000 distinct clients (X-Forwarded-For rotated by
#              a wrk Lua script; tollgate with TRUSTED_PROXIES=127.0.0.1, nginx with realip);
#       h2     HTTP/2 cleartext with prior knowledge, under h2load.
#       tls    the cost of TLS, every request allowed, tollgate and nginx each three ways: plain
#              listener to a plain backend (the reference), TLS listener (wrk over https,
#              kept-alive connections) to a plain backend, and plain listener to an https
#              backend (kept-alive pooled TLS connections: tollgate's pool, nginx's upstream
#              keepalive with proxy_ssl_session_reuse). The https backend is one nginx
#              terminating TLS in front of the echo backend, on the load generator's core, the
#              same for both proxies. A throwaway CA and certificates (ECDSA P-256) are made
#              with openssl. With BENCH_TLS_HANDSHAKES=1 also the handshake: one request per
#              connection (`openssl s_time`), full handshakes and resumed ones, each listener.
#  3. with --callgrind: instructions per request, exact whatever else the machine is doing, of
#     the bare floor and tollgate (memory store), every request allowed and every request
#     refused: each runs under `valgrind --tool=callgrind`, is warmed up, its counters are
#     zeroed, it serves exactly N requests (h2load --h1 -n N), and its counters are dumped.
#     Then scripts/callgrind_top.py lists tollgate's costliest functions and where its
#     instructions differ from the floor's. Builds a second, unstripped copy for the symbols.
#     Also Redis mode: tollgate and redis-server both under callgrind for the same requests,
#     and redis-server under redis-benchmark sending the same EVALSHA (Redis's own floor).
#  4. with --perf: where the CPU of a request goes on the real CPU, kernel included (callgrind
#     sees user space only), for the bare floor, tollgate (memory store) and nginx, every
#     request allowed: system calls per request by kind (`perf stat` on the syscall
#     tracepoints), then the proxy's CPU per request split into kernel, the proxy's own code,
#     libc and the vDSO (`perf record -e cpu-clock`, samples by shared object), each over
#     exactly N requests (h2load --h1 -n N) after a warm-up. Needs perf (linux-perf) and
#     permission to read tracepoints (root, or kernel.perf_event_paranoid <= -1).
# Quote the ratios, not the absolute req/s: the machine matters more than the code.
#
# usage: scripts/bench.sh [--quick] [--no-criterion] [--no-load] [--callgrind] [--perf]
#                         [--rounds N] [--duration D] [--scenarios LIST] [--log FILE]
#   --quick           short criterion runs, one round of 3 s per target (a smoke test)
#   --no-criterion    skip part 1;  --no-load  skip part 2;  --callgrind  add part 3
#   --perf            add part 4
#   --rounds N        interleaved rounds per scenario (default 5)
#   --duration D      measured seconds per target and round, wrk -d syntax (default 10s)
#   --scenarios LIST  comma-separated subset of allow,deny,many,h2,redis,tls (default all but
#                     redis and tls); redis: the Redis store beside the memory store, a hot key
#                     (one client; with Redis also REDIS_LEASES=on) and cold keys (100,000
#                     clients), and BENCH_BASELINE's binary with Redis on both too; a second
#                     table gives redis-server's own CPU per request, decisions per Redis core
#                     and each Redis target against memory in the same round
#   --log FILE        raw output (every wrk/h2load report) goes here, results to FILE.tsv
#                     (default bench-<date>.log in $TMPDIR); scripts/bench_plot.py draws FILE.tsv
# Environment: BENCH_CONNECTIONS (wrk -c, default 32), BENCH_BACKEND (echo: examples/echo_backend,
#   the default; nginx: nginx answering 200 with a 2-byte body, the leanest backend to measure
#   against), BENCH_BASELINE (another tollgate binary, see above), BENCH_H2_CLIENTS and BENCH_H2_STREAMS
#   (h2load -c and -m, default 8 and 4), BENCH_PROXY_CPU, BENCH_LOAD_CPU, CARGO_TARGET_DIR,
#   BENCH_CALLGRIND_REQUESTS (default 20000), BENCH_PERF_REQUESTS (default 100000),
#   BENCH_TLS_HANDSHAKES (1: the tls scenario measures handshakes too).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# free_port, wait_for_port, install_missing, run_header, pin_cpus
. "$ROOT/scripts/lib.sh"

arguments=$*
quick=0 criterion=1 load=1 callgrind=0 perf=0 rounds=5 duration=10s scenarios=allow,deny,many,h2
log=${TMPDIR:-/tmp}/bench-$(date +%Y%m%d-%H%M%S).log
rounds_set=0 duration_set=0
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --no-criterion) criterion=0 ;;
    --no-load) load=0 ;;
    --callgrind) callgrind=1 ;;
    --perf) perf=1 ;;
    --rounds) rounds=${2:?--rounds needs a number}; rounds_set=1; shift ;;
    --duration) duration=${2:?--duration needs a time such as 10s}; duration_set=1; shift ;;
    --scenarios) scenarios=${2:?--scenarios needs a list}; shift ;;
    --log) log=${2:?--log needs a file}; shift ;;
    -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ "$quick" = 1 ]; then
  [ "$rounds_set" = 1 ] || rounds=1
  [ "$duration_set" = 1 ] || duration=3s
  warmup=1s
else
  warmup=2s
fi
case $rounds in '' | *[!0-9]* | 0) echo "bench.sh: --rounds needs a positive number" >&2; exit 2 ;; esac
case $duration in *[!0-9smh]* | '') echo "bench.sh: --duration takes wrk syntax (10s, 1m)" >&2; exit 2 ;; esac
duration_s=$(awk -v d="$duration" 'BEGIN { n = d + 0; if (d ~ /m$/) n *= 60; if (d ~ /h$/) n *= 3600; print n }')
warmup_s=${warmup%s}
connections=${BENCH_CONNECTIONS:-32}
h2_clients=${BENCH_H2_CLIENTS:-8} h2_streams=${BENCH_H2_STREAMS:-4}
target_dir=${CARGO_TARGET_DIR:-$ROOT/target}
results=$log.tsv

# Everything printed goes to the terminal and to the log; raw tool output only to the log.
mkdir -p "$(dirname "$log")"
: >"$log"
exec > >(tee -a "$log") 2>&1

# --- tools -------------------------------------------------------------------------------
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null && command -v redis-benchmark >/dev/null || missing+=(redis-tools)
if [ "$load" = 1 ]; then
  command -v wrk >/dev/null || missing+=(wrk)
  command -v nginx >/dev/null || missing+=(nginx-light)
  command -v curl >/dev/null || missing+=(curl)
  command -v h2load >/dev/null || missing+=(nghttp2-client)
  command -v taskset >/dev/null || missing+=(util-linux)
  case ",$scenarios," in *,tls,*) command -v openssl >/dev/null || missing+=(openssl) ;; esac
fi
if [ "$callgrind" = 1 ]; then
  command -v h2load >/dev/null || missing+=(nghttp2-client)
  command -v callgrind_control >/dev/null || missing+=(valgrind)
fi
if [ "$perf" = 1 ]; then
  command -v h2load >/dev/null || missing+=(nghttp2-client)
  command -v nginx >/dev/null || missing+=(nginx-light)
  command -v curl >/dev/null || missing+=(curl)
  command -v perf >/dev/null || missing+=(linux-perf)
fi
install_missing "${missing[@]}"

run_header "$arguments"
echo "log: $log  results: $results"

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
  find "$target_dir/criterion" -path '*/new/benchmark.json' -newer "$marker" | sort | while read -r meta; do
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
[ "$load" = 1 ] || [ "$callgrind" = 1 ] || [ "$perf" = 1 ] || exit 0

# --- 2. the whole gateway under load ---------------------------------------------------------
echo "== building tollgate, the echo backend and the bare floor (release)"
cargo build --release --quiet --bin tollgate --example echo_backend --example bare_proxy --example lean_floor
TOLLGATE=$target_dir/release/tollgate
ECHO_BACKEND=$target_dir/release/examples/echo_backend
BARE=$target_dir/release/examples/bare_proxy
LEAN=$target_dir/release/examples/lean_floor
BASELINE=${BENCH_BASELINE:-}
if [ -n "$BASELINE" ] && [ ! -x "$BASELINE" ]; then
  echo "bench.sh: BENCH_BASELINE=$BASELINE is not an executable" >&2
  exit 2
fi

pin_cpus "proxies (and redis-server)" "backend, wrk and h2load"

work=$(mktemp -d)
chmod 755 "$work" # nginx workers may run as another user
# start, stop, all_alive for the processes under test
. "$ROOT/scripts/supervise.sh"
trap supervision_cleanup EXIT
trap 'exit 130' INT TERM

declare -A admin_of scheme_of

backend_port=$(free_port)
case ${BENCH_BACKEND:-echo} in
  echo) start backend "$backend_port" "${on_load_cpu[@]}" -- env PORT="$backend_port" "$ECHO_BACKEND" ;;
  nginx)
    mkdir -p "$work/backend-nginx"
    cat >"$work/backend-nginx.conf" <<EOF
# The backend: nginx answering every request itself, one worker, on the load generator's core.
worker_processes 1;
pid $work/backend-nginx.pid;
error_log $work/backend-nginx-error.log warn;
daemon off;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  client_body_temp_path $work/backend-nginx/body;
  server {
    listen 127.0.0.1:$backend_port;
    location / { return 200 "ok"; }
  }
}
EOF
    start backend "$backend_port" "${on_load_cpu[@]}" -- nginx -p "$work/backend-nginx" -c "$work/backend-nginx.conf" ;;
  *) echo "bench.sh: BENCH_BACKEND=${BENCH_BACKEND} is not echo or nginx" >&2; exit 2 ;;
esac
backend=http://127.0.0.1:$backend_port
redis_port=$(free_port)
start redis "$redis_port" "${on_proxy_cpu[@]}" -- \
  redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no

# A tollgate reads only the variables given here (env -i), plus what a scenario adds.
tollgate() { # name store(memory|redis) VAR=value...
  local name=$1 store=$2 port admin_port
  shift 2
  port=$(free_port) admin_port=$(free_port "$port")
  admin_of[$name]=$admin_port
  local extra=()
  [ "$store" = redis ] && extra=(REDIS_URL="redis://127.0.0.1:$redis_port" KEY_PREFIX="bench-$name:")
  start "$name" "$port" "${on_proxy_cpu[@]}" -- env -i PATH="$PATH" BACKEND_URL="$backend" \
    BIND=127.0.0.1 PORT="$port" ADMIN_BIND=127.0.0.1 ADMIN_PORT="$admin_port" RUST_LOG=warn \
    "${extra[@]}" "$@" "${binary:-$TOLLGATE}"
}

baseline() { # name VAR=value...: BENCH_BASELINE's tollgate, memory store
  local name=$1
  shift
  binary=$BASELINE tollgate "$name" memory "$@"
}

lean() { # name VAR=value...
  local name=$1 port
  shift
  port=$(free_port)
  start "$name" "$port" "${on_proxy_cpu[@]}" -- env -i PORT="$port" BACKEND_URL="$backend" "$@" "$LEAN"
}

bare() { # name VAR=value...
  local name=$1 port
  shift
  port=$(free_port)
  start "$name" "$port" "${on_proxy_cpu[@]}" -- env -i PORT="$port" BACKEND_URL="$backend" "$@" "$BARE"
}

nginx_target() { # name listen-suffix limit_req_zone-rate limit_req-args [extra server directives]
  local name=$1 listen=$2 rate=$3 limit=$4 extra=${5:-} port
  port=$(free_port)
  mkdir -p "$work/$name"
  cat >"$work/$name.conf" <<EOF
# Reference: nginx limiting by client address, in front of the same backend.
worker_processes 1;
pid $work/$name.pid;
error_log $work/$name-error.log warn;
daemon off;
events { worker_connections 4096; }
http {
  access_log off;
  # nginx closes a client connection after 1000 requests by default (HTTP/2 too, which h2load
  # does not survive); tollgate and the floor have no such limit.
  keepalive_requests 1000000;
  client_body_temp_path $work/$name/body;
  proxy_temp_path $work/$name/proxy;
  fastcgi_temp_path $work/$name/fastcgi;
  uwsgi_temp_path $work/$name/uwsgi;
  scgi_temp_path $work/$name/scgi;
  limit_req_zone \$binary_remote_addr zone=clients:16m rate=$rate;
  # Refusals are logged at info, below error_log's level: tollgate runs with RUST_LOG=warn.
  limit_req_log_level info;
  limit_req_status 429;
  upstream backend {
    server 127.0.0.1:${NGINX_UPSTREAM_PORT:-$backend_port};
    keepalive 64;
    keepalive_requests 1000000;
  }
  server {
    listen 127.0.0.1:$port$listen;
    $extra
    location / {
      limit_req zone=clients $limit;
      proxy_pass ${NGINX_UPSTREAM_SCHEME:-http}://backend;
      ${NGINX_LOCATION_EXTRA:-}
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
  start "$name" "$port" "${on_proxy_cpu[@]}" -- nginx -p "$work/$name" -c "$work/$name.conf"
}

# CPU time (clock ticks) of a process and its children (nginx's master and worker).
cpu_ticks() {
  local total=0 pid
  for pid in "$1" $(pgrep -P "$1" || true); do
    total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)))
  done
  echo "$total"
}
hz=$(getconf CLK_TCK)

# Script calls (EVAL/EVALSHA: one round trip each) Redis has run so far. commandstats also
# counts the commands a script runs (TIME, GET, SET), which are not round trips.
redis_calls() {
  redis-cli -p "$redis_port" INFO commandstats | tr -d '\r' |
    awk -F'[=,:]' '/^cmdstat_(eval|fcall)/ {n += $3} END {print n + 0}'
}

to_us() { # wrk latency such as 512.00us, 1.23ms, 1.01s -> microseconds
  awk -v v="$1" 'BEGIN {
    if (v ~ /us$/) printf "%.0f", v; else if (v ~ /ms$/) printf "%.0f", v * 1000;
    else if (v ~ /m$/) printf "%.0f", v * 6e7; else printf "%.0f", v * 1e6 }'
}

cat >"$work/many.lua" <<'EOF'
-- 100,000 distinct clients: each request comes "from" the next address of 10.0.0.0/8,
-- through a trusted proxy (the gateway believes X-Forwarded-For from 127.0.0.1).
local clients, n, offset = 100000, 0, 0
local thread_count = 0
function setup(thread) thread:set("offset", thread_count * 7919); thread_count = thread_count + 1 end
function init() n = offset end
function request()
  n = (n + 1) % clients
  return wrk.format(nil, nil, { ["X-Forwarded-For"] = string.format("10.%d.%d.%d", math.floor(n / 65536), math.floor(n / 256) % 256, n % 256) })
end
EOF

echo -e "scenario\tround\ttarget\treq_s\tp50_us\tp99_us\trequests\tnon2xx\terrors\tcpu_ticks\tcpu_us_per_req\tredis_calls\tredis_cpu_us_per_req" >"$results"

# One measurement: warm up, then load the target for $duration, recording one results row.
measure() { # scenario round target tool(wrk|h2load) [wrk args...]
  local scenario=$1 round=$2 name=$3 tool=$4
  shift 4
  local url=${scheme_of[$name]:-http}://127.0.0.1:${port_of[$name]}/ pid=${pid_of[$name]} out c0 c1 r0=0 r1=0 rc0=0 rc1=0
  local rps requests p50 p99 non2xx errors billed=$pid
  all_alive
  if [ "$tool" = wrk ]; then
    timeout 60 "${on_load_cpu[@]}" wrk -t1 -c"$connections" -d"$warmup" "$@" "$url" >/dev/null
  else
    timeout 60 "${on_load_cpu[@]}" h2load -t1 -c"$h2_clients" -m"$h2_streams" -D "$warmup_s" "$url" >/dev/null
  fi
  c0=$(cpu_ticks "$pid")
  case $name in *redis*) rc0=$(cpu_ticks "${pid_of[redis]}") c0=$((c0 + rc0)) r0=$(redis_calls) ;; esac
  if [ "$tool" = wrk ]; then
    out=$(timeout $((duration_s + 60)) "${on_load_cpu[@]}" wrk -t1 -c"$connections" -d"$duration" --latency "$@" "$url")
    rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
    requests=$(awk '/requests in/ {print $1}' <<<"$out")
    p50=$(to_us "$(awk '$1 == "50%" {print $2}' <<<"$out")")
    p99=$(to_us "$(awk '$1 == "99%" {print $2}' <<<"$out")")
    non2xx=$(awk -F: '/Non-2xx/ {gsub(/ /, "", $2); print $2}' <<<"$out")
    errors=$(awk '/Socket errors/ {gsub(/,/, ""); print $4 + $6 + $8 + $10}' <<<"$out")
  else
    # h2load prints no percentiles: they come from its per-request log (elapsed microseconds).
    out=$(timeout $((duration_s + 60)) "${on_load_cpu[@]}" h2load -t1 -c"$h2_clients" -m"$h2_streams" \
      -D "$duration_s" --log-file="$work/h2load.tsv" "$url")
    rps=$(awk '/^finished in/ {gsub(/,/, ""); print $4}' <<<"$out")
    requests=$(awk '/^requests:/ {print $8}' <<<"$out")
    non2xx=$(awk '/^status codes:/ {gsub(/,/, ""); print $5 + $7 + $9}' <<<"$out")
    errors=$(awk '/^requests:/ {gsub(/,/, ""); print $10 + $12 + $14}' <<<"$out")
    read -r p50 p99 < <(cut -f3 "$work/h2load.tsv" | sort -n |
      awk '{v[NR] = $1} END {printf "%d %d\n", v[int(NR * 0.5) + 1], v[int(NR * 0.99) + 1]}')
  fi
  c1=$(cpu_ticks "$pid")
  case $name in *redis*) rc1=$(cpu_ticks "${pid_of[redis]}") c1=$((c1 + rc1)) r1=$(redis_calls) ;; esac
  all_alive
  printf '%s\n' "--- $scenario round $round $name ($tool $*)" "$out" >>"$log"
  local ticks=$((c1 - c0))
  local cpu=$(awk -v t="$ticks" -v hz="$hz" -v n="${requests:-0}" 'BEGIN { printf "%.2f", n ? t * 1e6 / hz / n : 0 }')
  # redis-server's own share (0 for a target without Redis).
  local redis_cpu=$(awk -v t=$((rc1 - rc0)) -v hz="$hz" -v n="${requests:-0}" 'BEGIN { printf "%.2f", n ? t * 1e6 / hz / n : 0 }')
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$scenario" "$round" "$name" "${rps:-0}" \
    "${p50:-0}" "${p99:-0}" "${requests:-0}" "${non2xx:-0}" "${errors:-0}" "$ticks" "$cpu" $((r1 - r0)) "$redis_cpu" >>"$results"
  printf '  %-5s r%-2s %-16s %9.0f req/s  p50 %6s us  p99 %7s us  CPU %6s us/req  (%s requests, %s non-2xx, %s errors%s)\n' \
    "$scenario" "$round" "$name" "${rps:-0}" "${p50:-0}" "${p99:-0}" "$cpu" "${requests:-0}" "${non2xx:-0}" "${errors:-0}" \
    "$(case $name in *redis*) echo ", $((r1 - r0)) redis script calls, redis-server $redis_cpu us/req" ;; esac)"
}

check() { # name expected-status [curl args...]: the target answers as the scenario expects
  local name=$1 want=$2 got
  shift 2
  got=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$@" "${scheme_of[$name]:-http}://127.0.0.1:${port_of[$name]}/") || true
  if [ "$got" != "$want" ]; then
    echo "bench.sh: $name answered $got, expected $want" >&2
    exit 1
  fi
}

run_rounds() { # scenario tool "target..." [tool args...]
  local scenario=$1 tool=$2 targets=$3 round name
  shift 3
  for round in $(seq 1 "$rounds"); do
    echo "  -- $scenario round $round/$rounds, $(date +%T), load average $(loadavg)"
    for name in $targets; do measure "$scenario" "$round" "$name" "$tool" "$@"; done
  done
}

allow=(MAX_TOKENS=1000000000 REFILL_RATE=1000000) # a billion tokens, a million more per second
deny=(MAX_TOKENS=1 REFILL_RATE=0.001)             # one request, then one per 1000 s
# Many clients, each allowed every request (a client gets a few hundred at most) but refilled
# so slowly (one token per 100 s) that no client's budget is whole again during the run: every
# client stays held in the store (and in Redis) instead of being purged as idle.
many=(MAX_TOKENS=1000000 REFILL_RATE=0.01)

# A throwaway CA and a server certificate for localhost and 127.0.0.1 (ECDSA P-256), and the
# server directives of an nginx TLS listener: the same files and settings tollgate gets.
tls_certificates() {
  local d=$work/tls
  mkdir -p "$d"
  openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -keyout "$d/ca.key" \
    -out "$d/ca.pem" -days 2 -subj "/CN=tollgate bench CA" 2>/dev/null
  openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -keyout "$d/server.key" \
    -out "$d/server.csr" -subj "/CN=localhost" 2>/dev/null
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >"$d/ext"
  openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
    -out "$d/server.pem" -days 2 -extfile "$d/ext" 2>/dev/null
  chmod 755 "$d" && chmod 644 "$d"/*
  tls_server_directives="ssl_certificate $d/server.pem;
    ssl_certificate_key $d/server.key;
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_session_cache shared:SSL:10m;
    ssl_session_tickets on;"
}

# One request per connection, each a GET through the proxy to the backend: on a TLS listener
# openssl s_time's sequential connections, full handshakes (-new) and resumed ones (-reuse);
# on a plain listener wrk with one connection and Connection: close. Each for $duration, in
# interleaved rounds (at most 3); reported: the proxy's CPU per connection, medians and ratios.
tls_handshakes() { # name...
  local name mode pid out c0 c1 conns cpu round hs_rounds=$((rounds < 3 ? rounds : 3)) hs=$log.handshakes.tsv
  echo "  -- handshakes: one GET per connection, $duration_s s each, $hs_rounds interleaved round(s)"
  echo -e "round\tmode\ttarget\tconnections\tcpu_ticks\tcpu_us_per_connection" >"$hs"
  for round in $(seq 1 "$hs_rounds"); do
    for mode in new reuse; do
      for name in "$@"; do
        [ "${scheme_of[$name]:-http}" = http ] && [ "$mode" = reuse ] && continue
        all_alive
        pid=${pid_of[$name]}
        c0=$(cpu_ticks "$pid")
        if [ "${scheme_of[$name]:-http}" = https ]; then
          out=$(timeout $((duration_s + 30)) "${on_load_cpu[@]}" openssl s_time -connect "127.0.0.1:${port_of[$name]}" \
            -"$mode" -time "$duration_s" -www / 2>&1)
          conns=$(awk '/connections in [0-9.]+ real seconds/ {print $1; exit}' <<<"$out")
        else
          out=$(timeout $((duration_s + 30)) "${on_load_cpu[@]}" wrk -t1 -c1 -d"$duration" -H 'Connection: close' \
            "http://127.0.0.1:${port_of[$name]}/")
          conns=$(awk '/requests in/ {print $1}' <<<"$out")
        fi
        c1=$(cpu_ticks "$pid")
        printf '%s\n' "--- tls handshakes round $round $mode $name" "$out" >>"$log"
        cpu=$(awk -v t=$((c1 - c0)) -v hz="$hz" -v n="${conns:-0}" 'BEGIN { printf "%.2f", n ? t * 1e6 / hz / n : 0 }')
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$mode" "$name" "${conns:-0}" $((c1 - c0)) "$cpu" >>"$hs"
        printf '  r%-2s %-6s %-16s %8s connections  CPU %8s us/connection\n' "$round" "$mode" "$name" "${conns:-0}" "$cpu"
      done
    done
  done
  echo "  handshakes: CPU us per connection, median [min-max] over rounds; ratios of the medians"
  awk -F'\t' '
    function sorted(list, a,   n, i, j, t) {
      n = split(list, a, " ")
      for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]; a[j + 1] = t }
      return n }
    function med(list,   a, n) { n = sorted(list, a); return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
    function lo(list,   a) { sorted(list, a); return a[1] }
    function hi(list,   a, n) { n = sorted(list, a); return a[n] }
    NR > 1 { k = $3 " " $2; if (!(k in cpu)) order[++n] = k; cpu[k] = cpu[k] " " $6 }
    END {
      for (i = 1; i <= n; i++) printf "  | %-24s | %8.1f [%.1f-%.1f] |\n", order[i], med(cpu[order[i]]), lo(cpu[order[i]]), hi(cpu[order[i]])
      for (p = 0; p < 2; p++) { P = p ? "nginx" : "tollgate"
        printf "  %s: full handshake / plain connection %.2f, resumed / plain %.2f, resumed / full %.2f\n", P,
          med(cpu[P "-tls-in new"]) / med(cpu[P "-plain new"]), med(cpu[P "-tls-in reuse"]) / med(cpu[P "-plain new"]),
          med(cpu[P "-tls-in reuse"]) / med(cpu[P "-tls-in new"]) }
      printf "  tollgate / nginx: plain connection %.2f, full handshake %.2f, resumed %.2f\n",
        med(cpu["tollgate-plain new"]) / med(cpu["nginx-plain new"]), med(cpu["tollgate-tls-in new"]) / med(cpu["nginx-tls-in new"]),
        med(cpu["tollgate-tls-in reuse"]) / med(cpu["nginx-tls-in reuse"])
    }' "$hs"
}

if [ "$load" = 1 ]; then
  echo "== wrk -t1 -c$connections -d$duration --latency / h2load -t1 -c$h2_clients -m$h2_streams -D $duration_s;" \
    "$warmup warm-up before each; $rounds interleaved round(s)"
  for scenario in ${scenarios//,/ }; do
    case $scenario in
      allow)
        echo "== allow: every request allowed"
        lean lean "${allow[@]}"
        bare bare "${allow[@]}"
        tollgate tollgate-memory memory "${allow[@]}"
        [ -z "$BASELINE" ] || baseline tollgate-base "${allow[@]}"
        tollgate tollgate-redis redis "${allow[@]}"
        nginx_target nginx "" 1000000r/s "burst=1000000 nodelay"
        allow_targets="lean bare tollgate-memory${BASELINE:+ tollgate-base} tollgate-redis nginx"
        for name in $allow_targets; do check "$name" 200; done
        curl -s -D - -o /dev/null "http://127.0.0.1:${port_of[tollgate-memory]}/" | grep -qi '^x-ratelimit-remaining:' ||
          { echo "bench.sh: tollgate answered without X-RateLimit-Remaining" >&2; exit 1; }
        # The direct target's "proxy CPU" is the backend's own (on the load generator's core).
        pid_of[direct]=${pid_of[backend]} port_of[direct]=$backend_port
        run_rounds allow wrk "direct $allow_targets"
        failed=$(grep -c 'store call failed' "$work/tollgate-redis.log" || true)
        echo "  tollgate-redis failed store calls (a request waved through by the fail mode): $failed"
        stop $allow_targets
        ;;
      deny)
        echo "== deny: one request per 1000 s per client, so nearly every request is refused"
        lean lean-deny "${deny[@]}"
        bare bare-deny "${deny[@]}"
        tollgate tollgate-memory-deny memory "${deny[@]}"
        [ -z "$BASELINE" ] || baseline tollgate-base-deny "${deny[@]}"
        tollgate tollgate-redis-deny redis "${deny[@]}"
        nginx_target nginx-deny "" 1r/m ""
        deny_targets="lean-deny bare-deny tollgate-memory-deny${BASELINE:+ tollgate-base-deny} tollgate-redis-deny nginx-deny"
        for name in $deny_targets; do
          curl -s -o /dev/null "http://127.0.0.1:${port_of[$name]}/"
          check "$name" 429
        done
        run_rounds deny wrk "$deny_targets"
        stop $deny_targets
        ;;
      many)
        echo "== many: every request allowed, 100,000 distinct clients by X-Forwarded-For"
        bare bare-many "${many[@]}" BARE_KEY_BY_XFF=1
        tollgate tollgate-memory-many memory "${many[@]}" TRUSTED_PROXIES=127.0.0.1 MAX_KEYS=200000
        tollgate tollgate-redis-many redis "${many[@]}" TRUSTED_PROXIES=127.0.0.1 MAX_KEYS=200000
        nginx_target nginx-many "" 1000000r/s "burst=1000000 nodelay" \
          "set_real_ip_from 127.0.0.1; real_ip_header X-Forwarded-For;"
        for name in bare-many tollgate-memory-many tollgate-redis-many nginx-many; do
          check "$name" 200 -H 'X-Forwarded-For: 10.0.0.1'
        done
        run_rounds many wrk "bare-many tollgate-memory-many tollgate-redis-many nginx-many" -s "$work/many.lua"
        echo "  clients held by tollgate-memory-many: $(curl -s "http://127.0.0.1:${admin_of[tollgate-memory-many]}/metrics" |
          awk '/^tollgate_memory_clients/ {print $2}'); Redis keys: $(redis-cli -p "$redis_port" DBSIZE)"
        stop bare-many tollgate-memory-many tollgate-redis-many nginx-many
        ;;
      redis)
        echo "== redis: the Redis store beside memory, a hot key (one client: X-Forwarded-For untrusted) and" \
          "cold keys (100,000 clients by X-Forwarded-For); CPU per request includes redis-server's"
        tollgate tollgate-memory-hot memory "${allow[@]}"
        tollgate tollgate-redis-hot redis "${allow[@]}"
        tollgate tollgate-redis-hot-leases redis "${allow[@]}" REDIS_LEASES=on
        tollgate tollgate-memory-cold memory "${many[@]}" TRUSTED_PROXIES=127.0.0.1 MAX_KEYS=200000
        tollgate tollgate-redis-cold redis "${many[@]}" TRUSTED_PROXIES=127.0.0.1 MAX_KEYS=200000
        redis_targets="tollgate-memory-hot tollgate-redis-hot tollgate-redis-hot-leases tollgate-memory-cold tollgate-redis-cold"
        if [ -n "$BASELINE" ]; then
          binary=$BASELINE tollgate tollgate-base-redis-hot redis "${allow[@]}"
          binary=$BASELINE tollgate tollgate-base-redis-cold redis "${many[@]}" TRUSTED_PROXIES=127.0.0.1 MAX_KEYS=200000
          redis_targets="$redis_targets tollgate-base-redis-hot tollgate-base-redis-cold"
        fi
        for name in $redis_targets; do check "$name" 200 -H 'X-Forwarded-For: 10.0.0.1'; done
        run_rounds redis wrk "$redis_targets" -s "$work/many.lua"
        echo "  Redis keys: $(redis-cli -p "$redis_port" DBSIZE)"
        stop $redis_targets
        ;;
      h2)
        echo "== h2: HTTP/2 cleartext with prior knowledge (the backend stays HTTP/1.1)"
        bare bare-h2 "${allow[@]}" BARE_H2=1
        tollgate tollgate-memory-h2 memory "${allow[@]}"
        tollgate tollgate-redis-h2 redis "${allow[@]}"
        # nginx 1.22 speaks h2c with prior knowledge on a listen ... http2 port (no HTTP/1 there).
        nginx_target nginx-h2 " http2" 1000000r/s "burst=1000000 nodelay"
        for name in bare-h2 tollgate-memory-h2 tollgate-redis-h2 nginx-h2; do check "$name" 200 --http2-prior-knowledge; done
        run_rounds h2 h2load "bare-h2 tollgate-memory-h2 tollgate-redis-h2 nginx-h2"
        stop bare-h2 tollgate-memory-h2 tollgate-redis-h2 nginx-h2
        ;;
      tls)
        echo "== tls: every request allowed; plain, TLS listener, https backend; tollgate and nginx"
        tls_certificates
        # The https backend: nginx terminating TLS in front of the echo backend, on the load
        # generator's core, shared by both proxies (session cache and tickets, keep-alive).
        tls_backend_port=$(free_port)
        mkdir -p "$work/tls-backend"
        cat >"$work/tls-backend.conf" <<EOF
worker_processes 1;
pid $work/tls-backend.pid;
error_log $work/tls-backend-error.log warn;
daemon off;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  client_body_temp_path $work/tls-backend/body;
  proxy_temp_path $work/tls-backend/proxy;
  fastcgi_temp_path $work/tls-backend/fastcgi;
  uwsgi_temp_path $work/tls-backend/uwsgi;
  scgi_temp_path $work/tls-backend/scgi;
  upstream echo { server 127.0.0.1:$backend_port; keepalive 64; keepalive_requests 1000000; }
  server {
    listen 127.0.0.1:$tls_backend_port ssl;
    $tls_server_directives
    location / {
      proxy_pass http://echo;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
EOF
        start tls-backend "$tls_backend_port" "${on_load_cpu[@]}" -- nginx -p "$work/tls-backend" -c "$work/tls-backend.conf"
        # Both proxies send SNI localhost and check the certificate against the throwaway CA.
        tollgate tollgate-plain memory "${allow[@]}"
        tollgate tollgate-tls-in memory "${allow[@]}" TLS_CERT_FILE="$work/tls/server.pem" TLS_KEY_FILE="$work/tls/server.key"
        tollgate tollgate-tls-out memory "${allow[@]}" BACKEND_URL="https://127.0.0.1:$tls_backend_port" \
          BACKEND_TLS_SERVER_NAME=localhost BACKEND_CA_FILE="$work/tls/ca.pem"
        nginx_target nginx-plain "" 1000000r/s "burst=1000000 nodelay"
        nginx_target nginx-tls-in " ssl http2" 1000000r/s "burst=1000000 nodelay" "$tls_server_directives"
        NGINX_UPSTREAM_PORT=$tls_backend_port NGINX_UPSTREAM_SCHEME=https NGINX_LOCATION_EXTRA="
      proxy_ssl_session_reuse on;
      proxy_ssl_verify on;
      proxy_ssl_trusted_certificate $work/tls/ca.pem;
      proxy_ssl_server_name on;
      proxy_ssl_name localhost;
      proxy_ssl_protocols TLSv1.2 TLSv1.3;" \
          nginx_target nginx-tls-out "" 1000000r/s "burst=1000000 nodelay"
        scheme_of[tollgate-tls-in]=https scheme_of[nginx-tls-in]=https
        tls_targets="tollgate-plain nginx-plain tollgate-tls-in nginx-tls-in tollgate-tls-out nginx-tls-out"
        for name in $tls_targets; do check "$name" 200 --cacert "$work/tls/ca.pem"; done
        # What wrk's OpenSSL negotiates with each TLS listener.
        for name in tollgate-tls-in nginx-tls-in; do
          echo "  $name negotiates: $(openssl s_client -connect "127.0.0.1:${port_of[$name]}" -servername localhost \
            -CAfile "$work/tls/ca.pem" </dev/null 2>/dev/null | awk '/^New,/ {sub(/^New, /, ""); print}')"
        done
        run_rounds tls wrk "$tls_targets"
        echo "  backend connections opened by tollgate-tls-out: $(curl -s "http://127.0.0.1:${admin_of[tollgate-tls-out]}/metrics" |
          awk '/^tollgate_backend_connections_total/ {print $2}') (for $(awk -F'\t' '$1 == "tls" && $3 == "tollgate-tls-out" {n += $7} END {print n + 0}' "$results") measured requests)"
        [ "${BENCH_TLS_HANDSHAKES:-0}" != 1 ] || tls_handshakes tollgate-plain nginx-plain tollgate-tls-in nginx-tls-in
        stop $tls_targets tls-backend
        ;;
      *) echo "bench.sh: unknown scenario $scenario (allow, deny, many, h2, tls)" >&2; exit 2 ;;
    esac
  done

  echo
  echo "== summary: medians over $rounds round(s) [min-max]; ratios are of the medians"
  echo "   (req/s: higher is better; CPU us/req: the proxy's own process(es), plus redis-server for *-redis)"
  awk -F'\t' '
    function sorted(list, a,   n, i, j, t) { # split list into a, sorted numerically; returns n
      n = split(list, a, " ")
      for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]; a[j + 1] = t }
      return n }
    function med(list,   a, n) { n = sorted(list, a); return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
    function lo(list,   a) { sorted(list, a); return a[1] }
    function hi(list,   a, n) { n = sorted(list, a); return a[n] }
    function ratio(x, y) { return y > 0 ? sprintf("%.2f", x / y) : "-" }
    NR > 1 {
      k = $1 SUBSEP $3
      if (!($1 in nt)) order[++ns] = $1
      if (!(k in seen)) { seen[k] = 1; target[$1, ++nt[$1]] = $3 }
      rps[k] = rps[k] " " $4; p50[k] = p50[k] " " $5; p99[k] = p99[k] " " $6; cpu[k] = cpu[k] " " $11
      reqs[k] += $7; refused[k] += $8; bad[k] += $9; calls[k] += $12
    }
    END {
      for (s = 1; s <= ns; s++) {
        S = order[s]; ref_nginx = ref_bare = ref_lean = ""
        for (t = 1; t <= nt[S]; t++) { T = target[S, t]
          if (T ~ /^nginx/ && ref_nginx == "") ref_nginx = T; if (T ~ /^bare/ && ref_bare == "") ref_bare = T
          if (T ~ /^lean/ && ref_lean == "") ref_lean = T }
        printf "\nscenario %s\n", S
        printf "| %-20s | %-24s | %-7s | %-8s | %-20s | %-8s | %-8s | %-8s | %-8s | %-8s | %-11s | %s |\n", "target", "req/s median [min-max]",
          "p50 us", "p99 us", "CPU us/req [min-max]", "req/s vs nginx", "req/s vs floor", "CPU vs nginx", "CPU vs floor", "CPU vs lean", "non-2xx", "errors" (S == "deny" ? " | redis script calls per refusal" : " | redis script calls per request")
        printf "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n"
        for (t = 1; t <= nt[S]; t++) { T = target[S, t]; k = S SUBSEP T
          r = med(rps[k]); c = med(cpu[k])
          rn = med(rps[S SUBSEP ref_nginx]); rb = med(rps[S SUBSEP ref_bare]); cn = med(cpu[S SUBSEP ref_nginx]); cb = med(cpu[S SUBSEP ref_bare])
          cl = ref_lean == "" ? 0 : med(cpu[S SUBSEP ref_lean])
          per = T ~ /redis/ ? sprintf("%.4f", calls[k] / (S == "deny" ? (refused[k] ? refused[k] : 1) : (reqs[k] ? reqs[k] : 1))) : "-"
          printf "| %-20s | %7.0f [%6.0f-%6.0f] | %7.0f | %8.0f | %6.2f [%5.2f-%5.2f] | %8s | %8s | %8s | %8s | %8s | %11d | %d | %s |\n", T,
            r, lo(rps[k]), hi(rps[k]), med(p50[k]), med(p99[k]), c, lo(cpu[k]), hi(cpu[k]),
            ratio(r, rn), ratio(r, rb), ratio(c, cn), ratio(c, cb), ratio(c, cl), refused[k], bad[k], per }
      }
    }' "$results"
  if grep -q '^tls	' "$results"; then
    echo
    echo "scenario tls: ratios per round (the two targets of one round, measured within a minute), median [min-max]"
    awk -F'\t' '
      function sorted(list, a,   n, i, j, t) {
        n = split(list, a, " ")
        for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]; a[j + 1] = t }
        return n }
      function spread(list,   a, n, m) { n = sorted(list, a); m = n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
        return sprintf("%.2f [%.2f-%.2f]", m, a[1], a[n]) }
      $1 == "tls" { rps[$3, $2] = $4; cpu[$3, $2] = $11; if ($2 > rounds) rounds = $2 }
      END {
        n = split("tollgate-tls-in tollgate-plain|tollgate-tls-out tollgate-plain|nginx-tls-in nginx-plain|nginx-tls-out nginx-plain|tollgate-plain nginx-plain|tollgate-tls-in nginx-tls-in|tollgate-tls-out nginx-tls-out", pairs, "|")
        printf "| %-34s | %-20s | %-20s |\n", "ratio", "CPU us/req", "req/s"
        printf "|---|--:|--:|\n"
        for (i = 1; i <= n; i++) { split(pairs[i], ab, " "); rc = rr = ""
          for (r = 1; r <= rounds; r++) if (cpu[ab[2], r] > 0 && rps[ab[2], r] > 0) {
            rc = rc " " cpu[ab[1], r] / cpu[ab[2], r]; rr = rr " " rps[ab[1], r] / rps[ab[2], r] }
          printf "| %-34s | %-20s | %-20s |\n", ab[1] " / " ab[2], spread(rc), spread(rr) }
      }' "$results"
  fi
  if grep -q '^redis	' "$results"; then
    echo
    echo "scenario redis: redis-server's own CPU per request (median [min-max] over rounds) and requests per"
    echo "Redis core (1 s over that median); against memory with the same keys, the ratios of each round's"
    echo "two figures (CPU: the gateway's process plus redis-server's), median [min-max]"
    awk -F'\t' '
      function sorted(list, a,   n, i, j, t) {
        n = split(list, a, " ")
        for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]; a[j + 1] = t }
        return n }
      function med(list,   a, n) { n = sorted(list, a); return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
      function spread(list,   a, n) { if (list == "") return "-"; n = sorted(list, a)
        return sprintf("%.2f [%.2f-%.2f]", med(list), a[1], a[n]) }
      $1 == "redis" {
        if (!($3 in seen)) { seen[$3] = 1; order[++n] = $3 }
        rps[$3, $2] = $4; cpu[$3, $2] = $11; rcpu[$3] = rcpu[$3] " " $13; reqs[$3] += $7; calls[$3] += $12
        if ($2 > rounds) rounds = $2 }
      END {
        printf "| %-26s | %-24s | %-22s | %-23s | %-20s | %-20s |\n", "target", "redis-server CPU us/req", "requests per Redis core",
          "script calls per request", "req/s vs memory", "CPU vs memory"
        printf "|---|--:|--:|--:|--:|--:|\n"
        for (i = 1; i <= n; i++) { T = order[i]
          if (T !~ /redis/) continue
          ref = T ~ /hot/ ? "tollgate-memory-hot" : "tollgate-memory-cold"; rc = rr = ""
          for (r = 1; r <= rounds; r++) if (cpu[ref, r] > 0 && rps[ref, r] > 0) {
            rc = rc " " cpu[T, r] / cpu[ref, r]; rr = rr " " rps[T, r] / rps[ref, r] }
          m = med(rcpu[T])
          printf "| %-26s | %-24s | %22s | %23.4f | %-20s | %-20s |\n", T, spread(rcpu[T]), (m > 0 ? sprintf("%.0f", 1e6 / m) : "-"),
            (reqs[T] ? calls[T] / reqs[T] : 0), spread(rr), spread(rc) }
      }' "$results"
  fi
  echo "load average at the end: $(loadavg)"
  echo "raw output: $log  results: $results  (plot: python3 scripts/bench_plot.py $results docs/bench.png)"
fi

# --- 4. kernel and user CPU, system calls (perf) ---------------------------------------------
# Runs before part 3, whose end is the script's.
if [ "$perf" = 1 ]; then
  perf_requests=${BENCH_PERF_REQUESTS:-100000}
  [ "$load" = 1 ] || [ "$rounds_set" = 1 ] || rounds=3
  perf_dir=$log.perf
  mkdir -p "$perf_dir"
  echo
  echo "== perf: $perf_requests requests each, h2load --h1 -c$connections, after 4000 warm-up requests; every request allowed"
  # Attached to a running process, as below (this shell, for a tenth of a second).
  if ! perf stat -e raw_syscalls:sys_enter -p $$ -o /dev/null -- sleep 0.1 2>/dev/null; then
    echo "bench.sh: perf cannot read the syscall tracepoints here (run as root, or sysctl kernel.perf_event_paranoid=-1)" >&2
    exit 1
  fi
  # Every system call, and each kind on its own (kinds under 0.01 per request not printed).
  perf_events='raw_syscalls:sys_enter,syscalls:sys_enter_*'
  bare bare-perf "${allow[@]}"
  tollgate tollgate-memory-perf memory "${allow[@]}"
  nginx_target nginx-perf "" 1000000r/s "burst=1000000 nodelay"
  perf_target() { # name: the pid serving its requests, and its URL
    local pid=${pid_of[$1]}
    # nginx's requests are served by its one worker, not its master.
    [ "$1" = nginx-perf ] && pid=$(pgrep -P "$pid" | head -n 1)
    echo "$pid http://127.0.0.1:${port_of[$1]}/"
  }
  perf_during_requests() { # url perf-arguments...: perf runs while exactly $perf_requests are served
    local url=$1 perf_pid
    shift
    perf "$@" &
    perf_pid=$!
    sleep 0.5 # perf attaches
    "${on_load_cpu[@]}" h2load --h1 -c "$connections" -n "$perf_requests" "$url" >>"$log"
    kill -INT "$perf_pid"
    wait "$perf_pid" || true
  }
  echo "-- system calls per request (perf stat; kinds under 0.01 per request not listed)"
  for name in bare-perf tollgate-memory-perf nginx-perf; do
    check "$name" 200
    read -r pid url < <(perf_target "$name")
    "${on_load_cpu[@]}" h2load --h1 -c "$connections" -n 4000 "$url" >/dev/null
    perf_during_requests "$url" stat -x, -e "$perf_events" -p "$pid" -o "$perf_dir/$name.stat"
    [ -s "$perf_dir/$name.stat" ] || { echo "bench.sh: perf stat wrote nothing for $name (see $log)" >&2; exit 1; }
    awk -F, -v n="$perf_requests" -v name="$name" '
      $1 ~ /^[0-9]+$/ {
        kind = $3; sub(/.*sys_enter_?/, "", kind)
        if (kind == "") all = $1; else if ($1 / n >= 0.01) kinds = kinds sprintf(", %s %.2f", kind, $1 / n)
      }
      END { printf "  %-22s %5.2f%s\n", name, all / n, kinds }' "$perf_dir/$name.stat"
  done
  echo "-- CPU per request by where it runs (perf record -e cpu-clock -F 10000: a sample is 100 us), $rounds interleaved round(s)"
  printf '| %-20s | %5s | %10s | %14s | %14s | %14s | %14s |\n' target round "CPU us/req" kernel "own code" libc vDSO
  printf '|%s|\n' "---|--:|--:|--:|--:|--:|--:"
  for round in $(seq 1 "$rounds"); do
    for name in bare-perf tollgate-memory-perf nginx-perf; do
      read -r pid url < <(perf_target "$name")
      "${on_load_cpu[@]}" h2load --h1 -c "$connections" -n 4000 "$url" >/dev/null
      perf_during_requests "$url" record -q -e cpu-clock -F 10000 -p "$pid" -o "$perf_dir/$name.$round.data"
      [ -s "$perf_dir/$name.$round.data" ] || { echo "bench.sh: perf record wrote nothing for $name (see $log)" >&2; exit 1; }
      # Samples by shared object: the kernel, the proxy's binary, libc, the vDSO (clock reads).
      perf report -i "$perf_dir/$name.$round.data" --stdio --sort dso -F sample,dso 2>/dev/null |
        awk -v n="$perf_requests" -v name="$name" -v round="$round" '
          /^#/ || !/[0-9]/ { next }
          { total += $1 }
          $2 ~ /kernel/ { kernel += $1 }
          $2 ~ /^libc/ { libc += $1 }
          $2 ~ /vdso/ { vdso += $1 }
          $2 ~ /^(tollgate|bare_proxy|nginx)$/ { own += $1 }
          END {
            us = 1e6 / 10000 / n
            printf "| %-20s | %5d | %10.2f | %5.2f (%4.1f%%) | %5.2f (%4.1f%%) | %5.2f (%4.1f%%) | %5.2f (%4.1f%%) |\n", name, round,
              total * us, kernel * us, 100 * kernel / total, own * us, 100 * own / total, libc * us, 100 * libc / total,
              vdso * us, 100 * vdso / total
          }'
    done
  done
  stop bare-perf tollgate-memory-perf nginx-perf
  echo "perf data: $perf_dir (perf report -i NAME.data)"
fi

# --- 3. instructions per request under callgrind ---------------------------------------------
[ "$callgrind" = 1 ] || exit 0
requests=${BENCH_CALLGRIND_REQUESTS:-20000}
cg_dir=$log.callgrind
mkdir -p "$cg_dir"
echo
build_unstripped --bin tollgate --example bare_proxy
TOLLGATE=$target_dir/callgrind/release/tollgate BARE=$target_dir/callgrind/release/examples/bare_proxy
# Under valgrind (valgrind_cmd): one thread at a time, output in $cg_dir/NAME.out.1 at the dump.
wait_tenths=600 # valgrind starts slowly
bare_cg() { # name VAR=value...
  local name=$1 port
  shift
  port=$(free_port)
  start "$name" "$port" "${on_proxy_cpu[@]}" -- env -i PORT="$port" BACKEND_URL="$backend" "$@" $(valgrind_cmd "$name") "$BARE"
}
tollgate_cg() { # name VAR=value...
  local name=$1 port admin_port
  shift
  port=$(free_port) admin_port=$(free_port "$port")
  start "$name" "$port" "${on_proxy_cpu[@]}" -- env -i PATH="$PATH" BACKEND_URL="$backend" \
    BIND=127.0.0.1 PORT="$port" ADMIN_BIND=127.0.0.1 ADMIN_PORT="$admin_port" RUST_LOG=warn \
    "$@" $(valgrind_cmd "$name") "$TOLLGATE"
}
count_requests() { # name expected-status-class
  local name=$1 class=$2 out pid
  pid=${pid_of[$name]}
  "${on_load_cpu[@]}" h2load --h1 -c "$connections" -n 2000 "http://127.0.0.1:${port_of[$name]}/" >/dev/null
  callgrind_control --zero "$pid" >/dev/null 2>&1
  [ -z "${also_zero:-}" ] || callgrind_control --zero "$also_zero" >/dev/null 2>&1
  out=$("${on_load_cpu[@]}" h2load --h1 -c "$connections" -n "$requests" "http://127.0.0.1:${port_of[$name]}/")
  callgrind_control --dump=requests "$pid" >/dev/null 2>&1
  printf '%s\n' "--- callgrind $name" "$out" >>"$log"
  grep -q "^status codes: .*$requests $class" <<<"$out" || {
    echo "bench.sh: $name did not answer $requests x $class:" >&2
    grep -E '^(requests|status codes):' <<<"$out" >&2
    exit 1
  }
  stop "$name"
  printf '  %-22s %12s instructions per request (%s requests, all %s)\n' "$name" \
    "$(awk -v n="$requests" '/^totals:/ {printf "%\047.0f", $2 / n}' "$cg_dir/$name.out.1")" "$requests" "$class"
}
echo "== callgrind: $requests requests each, h2load --h1 -c$connections, after 2000 warm-up requests"
bare_cg bare-cg "${allow[@]}"
count_requests bare-cg 2xx
tollgate_cg tollgate-memory-cg "${allow[@]}"
count_requests tollgate-memory-cg 2xx
bare_cg bare-deny-cg "${deny[@]}"
count_requests bare-deny-cg 4xx
tollgate_cg tollgate-memory-deny-cg "${deny[@]}"
count_requests tollgate-memory-deny-cg 4xx
echo
echo "-- every request allowed: tollgate (memory) against the floor"
python3 "$ROOT/scripts/callgrind_top.py" "$cg_dir/tollgate-memory-cg.out.1" "$requests" --match tollgate:: \
  --baseline "$cg_dir/bare-cg.out.1" "$requests"
echo
echo "-- every request refused: tollgate (memory) against the floor"
python3 "$ROOT/scripts/callgrind_top.py" "$cg_dir/tollgate-memory-deny-cg.out.1" "$requests" --match tollgate:: \
  --baseline "$cg_dir/bare-deny-cg.out.1" "$requests" --top 15

# Redis mode: tollgate and redis-server each under callgrind, for the same requests; then
# redis-server alone under redis-benchmark sending the same EVALSHA (the floor of what one
# decision costs Redis, whoever asks), and a plain GET for scale.
echo
echo "== callgrind, Redis mode: tollgate and redis-server, $requests requests, every request allowed"
redis_cg_port=$(free_port)
start redis-cg "$redis_cg_port" "${on_proxy_cpu[@]}" -- $(valgrind_cmd redis-cg) \
  redis-server --port "$redis_cg_port" --bind 127.0.0.1 --save "" --appendonly no
redis_cg_pid=${pid_of[redis-cg]}
redis_cg_count() { # label dump-name: instructions per request of redis-server since its last zeroing
  callgrind_control --dump="$2" "$redis_cg_pid" >/dev/null 2>&1
  local dump
  dump=$(ls -t "$cg_dir"/redis-cg.out.* | head -n 1)
  printf '  %-44s %12s instructions per request\n' "$1" \
    "$(awk -v n="$requests" '/^totals:/ {printf "%\047.0f", $2 / n}' "$dump")"
}
tollgate_cg tollgate-redis-cg "${allow[@]}" REDIS_URL="redis://127.0.0.1:$redis_cg_port" REDIS_TIMEOUT_MS=5000
also_zero=$redis_cg_pid count_requests tollgate-redis-cg 2xx
redis_cg_count "redis-server, for tollgate's requests" tollgate
sha=$(redis-cli -p "$redis_cg_port" SCRIPT LOAD "$(cat "$ROOT/scripts/token_bucket.lua")")
redis_floor() { # label dump-name redis-benchmark command...
  local label=$1 name=$2
  shift 2
  "${on_load_cpu[@]}" redis-benchmark -p "$redis_cg_port" -c "$connections" -n 2000 -r 100000 "$@" >/dev/null
  callgrind_control --zero "$redis_cg_pid" >/dev/null 2>&1
  "${on_load_cpu[@]}" redis-benchmark -p "$redis_cg_port" -c "$connections" -n "$requests" -r 100000 "$@" >/dev/null
  redis_cg_count "$label" "$name"
}
redis_floor "redis-server, redis-benchmark EVALSHA (floor)" evalsha \
  EVALSHA "$sha" 1 "bench:{__rand_int__}:tb" 1000000000 1 1 "" ""
redis_floor "redis-server, redis-benchmark GET (for scale)" get GET "bench:__rand_int__"
stop redis-cg
echo
echo "-- every request allowed: tollgate (Redis) against tollgate (memory), tollgate's process only"
python3 "$ROOT/scripts/callgrind_top.py" "$cg_dir/tollgate-redis-cg.out.1" "$requests" --match tollgate:: \
  --baseline "$cg_dir/tollgate-memory-cg.out.1" "$requests" --top 15
echo "callgrind dumps: $cg_dir (callgrind_annotate --inclusive=yes FILE)"
