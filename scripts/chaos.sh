#!/usr/bin/env bash
# Chaos and soak runs, all on loopback, bounded in time, against the release binary:
#  1. Redis killed (SIGKILL) under wrk load in fail-open mode, then restarted empty on the same
#     port: how many answers were neither 200 nor 429 (must be 0), and the time from the new
#     Redis accepting connections to a fresh client getting exactly its budget again;
#  2. Redis frozen (SIGSTOP) for 5 s under a latency-recording client: p50/p99 latency before
#     the freeze, while frozen before the breaker opened (about REDIS_TIMEOUT_MS added), with
#     the breaker open (about nothing added), and after SIGCONT;
#  3. soak: N minutes at moderate load across 100,000 client identities (rotating
#     X-Forwarded-For from a trusted proxy), Redis store: RSS and open file descriptors of
#     tollgate every 10 s, warm-up against final;
#  4. key flood: 1,000,000 distinct identities into the memory store with MAX_KEYS=100000:
#     RSS before, at peak and after, and whether a client limited before the flood, idle
#     during it, is still limited after it.
# The short versions of 1 and 2 (and the backend, cluster and Redis-error faults) are tests:
# `cargo test --test it faults::`. Results and how to read them: docs/reliability.md.
#
# usage: scripts/chaos.sh [--soak-minutes N] [--only LIST]
#   --soak-minutes N  length of part 3 (default 10; 1 for a quick run)
#   --only LIST       run only these parts, e.g. --only 1,2
# Environment: CHAOS_CONNECTIONS (wrk -c of parts 1 and 4, default 32), SOAK_CONNECTIONS
#   (default 16), SOAK_DELAY_MS (pause per connection between requests in part 3, default 2:
#   moderate load, not saturation).
# Prints a summary; everything raw (wrk output, samples, tollgate logs) goes to the log file
# whose name is printed first.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

soak_minutes=10 only=1,2,3,4
while [ $# -gt 0 ]; do
  case $1 in
    --soak-minutes) soak_minutes=${2:?--soak-minutes needs a number}; shift ;;
    --only) only=${2:?--only needs a list such as 1,3}; shift ;;
    -h | --help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "chaos.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case $soak_minutes in '' | *[!0-9]* | 0) echo "chaos.sh: --soak-minutes wants a whole number >= 1" >&2; exit 2 ;; esac
connections=${CHAOS_CONNECTIONS:-32}
soak_connections=${SOAK_CONNECTIONS:-16}
soak_delay_ms=${SOAK_DELAY_MS:-2}
part() { case ",$only," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

mkdir -p target/chaos
log=$ROOT/target/chaos/chaos-$(date -u +%Y%m%dT%H%M%SZ).log
: >"$log"
echo "chaos.sh: raw output in $log"
say() { echo "$*" | tee -a "$log"; }   # summary: stdout and the log
raw() { cat >>"$log"; }               # raw: the log only
fail() { echo "chaos.sh: $*" | tee -a "$log" >&2; exit 1; }

# --- tools -------------------------------------------------------------------------------
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
command -v wrk >/dev/null || missing+=(wrk)
command -v curl >/dev/null || missing+=(curl)
command -v python3 >/dev/null || missing+=(python3)
if [ ${#missing[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null && [ "$(id -u)" -eq 0 ]; then
    echo "chaos.sh: installing ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "chaos.sh: missing ${missing[*]}: apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi

say "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
say "command: scripts/chaos.sh --soak-minutes $soak_minutes --only $only (CHAOS_CONNECTIONS=$connections SOAK_CONNECTIONS=$soak_connections SOAK_DELAY_MS=$soak_delay_ms)"

echo "== building tollgate and the echo backend (release)"
cargo build --release --quiet --bin tollgate --example echo_backend
TOLLGATE=$ROOT/target/release/tollgate
ECHO_BACKEND=$ROOT/target/release/examples/echo_backend

work=$(mktemp -d)
pids=() pnames=()
cleanup() {
  local status=$? pid
  for pid in "${pids[@]}"; do kill -CONT "$pid" 2>/dev/null || true; kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "$status" -ne 0 ]; then
    echo "chaos.sh: failed (status $status); see $log" >&2
  fi
  for f in "$work"/*.log; do
    [ -s "$f" ] && { echo "--- $(basename "$f") (last 50 lines)"; tail -n 50 "$f"; } >>"$log"
  done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# free_port, wait_for_port
. "$ROOT/scripts/lib.sh"

last_pid=
start() { # name port command... (runs in $work, so no .env of the repo is read)
  local name=$1 port=$2
  shift 2
  (cd "$work" && exec "$@") >>"$work/$name.log" 2>&1 &
  last_pid=$!
  pids+=("$last_pid") pnames+=("$name")
  wait_for_port "$port" "$name"
}

stop() { # pid: end one process started above and wait for it
  kill -CONT "$1" 2>/dev/null || true
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }

start_redis() { # name port
  start "$1" "$2" redis-server --port "$2" --bind 127.0.0.1 --save "" --appendonly no
  until [ "$(redis-cli -p "$2" PING 2>/dev/null)" = PONG ]; do sleep 0.01; done
}

gateway_env=(env -u REDIS_URL -u REDIS_ADDR -u REDIS_CLUSTER_NODES -u ALGORITHM -u ROUTES -u RUST_LOG
  BIND=127.0.0.1 ADMIN_BIND=127.0.0.1 TRUSTED_PROXIES=127.0.0.1 ACCESS_LOG=off RUST_LOG=info)

start_gateway() { # name port admin_port VAR=value...
  local name=$1 port=$2 admin=$3
  shift 3
  start "$name" "$port" "${gateway_env[@]}" PORT="$port" ADMIN_PORT="$admin" "$@" "$TOLLGATE"
}

metric() { # admin_port series -> value (empty if unreachable)
  curl -s --max-time 2 "http://127.0.0.1:$1/metrics" | awk -v s="$2" '$1 == s { print $2 }'
}

wait_metric() { # admin_port series value: poll every 10 ms, up to 30 s
  local i
  for i in $(seq 1 3000); do
    [ "$(metric "$1" "$2")" = "$3" ] && return 0
    sleep 0.01
  done
  fail "$2 never read $3"
}

# One request through the gateway as client `ip` (X-Forwarded-For, the gateway trusts
# 127.0.0.1): "status remaining" (remaining "-" when the request was not decided).
as_client() { # port ip
  curl -s -o /dev/null -D - --max-time 5 -H "X-Forwarded-For: $2" "http://127.0.0.1:$1/" |
    tr -d '\r' | awk 'NR == 1 { s = $2 } tolower($1) == "x-ratelimit-remaining:" { r = $2 }
      END { print s, (r == "" ? "-" : r) }'
}

# A client that has sent nothing: poll until decided, then exactly `budget` allowed counting
# down, then 429. Prints the time the first decision arrived; exits on any deviation.
exact_budget() { # port ip budget
  local port=$1 ip=$2 budget=$3 reply status remaining decided_at deadline n
  deadline=$(($(date +%s) + 30))
  while :; do
    reply=$(as_client "$port" "$ip")
    read -r status remaining <<<"$reply"
    [ "$remaining" != - ] && break
    [ "$(date +%s)" -lt "$deadline" ] || fail "$ip never decided again (last: $reply)"
    sleep 0.01
  done
  decided_at=$(now)
  [ "$reply" = "200 $((budget - 1))" ] || fail "$ip: first decision '$reply', wanted '200 $((budget - 1))'"
  for n in $(seq $((budget - 2)) -1 0); do
    reply=$(as_client "$port" "$ip")
    [ "$reply" = "200 $n" ] || fail "$ip got '$reply', wanted '200 $n'"
  done
  reply=$(as_client "$port" "$ip")
  [ "${reply%% *}" = 429 ] || fail "$ip got '$reply' past its budget, wanted 429"
  echo "$decided_at"
}

rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
fds() { find "/proc/$1/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l; }

# wrk script: every request from a client identity of its own, 10.a.b.c, rotating over
# CHAOS_CLIENTS identities (or, with CHAOS_ONCE=1, each of CHAOS_CLIENTS once, then the thread
# stops); counts statuses; CHAOS_DELAY_MS pauses each connection between requests.
cat >"$work/clients.lua" <<'EOF'
local threads, next_id = {}, 0
function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end
function init(args)
  clients = tonumber(os.getenv("CHAOS_CLIENTS")) or 1000
  nthreads = tonumber(os.getenv("CHAOS_THREADS")) or 1
  once = os.getenv("CHAOS_ONCE") == "1"
  pause = tonumber(os.getenv("CHAOS_DELAY_MS")) or 0
  path = os.getenv("CHAOS_PATH") or "/"
  sent, answered, statuses = 0, 0, {}
  quota = math.ceil(clients / nthreads)
end
function request()
  local c = id + sent * nthreads
  sent = sent + 1
  if not once then c = c % clients end
  local ip = string.format("10.%d.%d.%d", math.floor(c / 65536) % 256, math.floor(c / 256) % 256, c % 256)
  return wrk.format("GET", path, { ["X-Forwarded-For"] = ip })
end
function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
  answered = answered + 1
  if once and answered >= quota then wrk.thread:stop() end
end
if (tonumber(os.getenv("CHAOS_DELAY_MS")) or 0) > 0 then
  function delay() return pause end
end
function done(summary, latency, requests)
  local total = {}
  for _, thread in ipairs(threads) do
    for status, n in pairs(thread:get("statuses")) do total[status] = (total[status] or 0) + n end
  end
  for status, n in pairs(total) do io.write(string.format("status %d %d\n", status, n)) end
end
EOF

# Latency client for part 2: THREADS keep-alive connections for DURATION seconds; one line per
# request: send time (epoch s), latency (ms), status, decided (1 when X-RateLimit-Remaining).
cat >"$work/latency.py" <<'EOF'
import http.client, sys, threading, time
port, threads, duration, out = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
end = time.time() + duration
lines, lock = [], threading.Lock()
def worker():
    mine = []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    while time.time() < end:
        sent = time.time()
        try:
            conn.request("GET", "/", headers={"X-Forwarded-For": "192.0.2.77"})
            r = conn.getresponse()
            r.read()
            took = (time.time() - sent) * 1000
            mine.append(f"{sent:.6f} {took:.3f} {r.status} {int(r.getheader('x-ratelimit-remaining') is not None)}")
        except Exception as e:
            mine.append(f"{sent:.6f} {(time.time() - sent) * 1000:.3f} error 0")
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    with lock:
        lines.extend(mine)
ts = [threading.Thread(target=worker) for _ in range(threads)]
for t in ts: t.start()
for t in ts: t.join()
with open(out, "w") as f:
    f.write("\n".join(sorted(lines)) + "\n")
EOF

cat >"$work/phases.py" <<'EOF'
import sys
# samples, REDIS_TIMEOUT_MS, then a start and an end (epoch seconds) for each phase, by send time
samples, timeout, bounds = sys.argv[1], float(sys.argv[2]), [float(x) for x in sys.argv[3:]]
names = ["before the freeze", "frozen, breaker closed", "frozen, breaker open", "after the breaker closed"]
rows = [[] for _ in names]
statuses = {}
for line in open(samples):
    sent, took, status, decided = line.split()
    statuses[status] = statuses.get(status, 0) + 1
    sent, took = float(sent), float(took)
    for i in range(len(names)):
        if bounds[2 * i] <= sent < bounds[2 * i + 1]:
            rows[i].append(took)
def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")
base = pct(rows[0], 0.99)
print(f"| {'phase':28} | {'requests':>8} | {'p50 ms':>8} | {'p99 ms':>8} | {'max ms':>8} | {'p99 added ms':>12} | {'waited >= timeout':>17} |")
print(f"|{'-' * 30}|{'-' * 10}|{'-' * 10}|{'-' * 10}|{'-' * 10}|{'-' * 14}|{'-' * 19}|")
for name, xs in zip(names, rows):
    waited = sum(1 for x in xs if x >= timeout)
    print(f"| {name:28} | {len(xs):8} | {pct(xs, .5):8.2f} | {pct(xs, .99):8.2f} | {max(xs) if xs else float('nan'):8.2f} | {pct(xs, .99) - base:12.2f} | {waited:17} |")
print("statuses: " + ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items())))
EOF

backend_port=$(free_port)
start backend "$backend_port" env PORT="$backend_port" "$ECHO_BACKEND"
backend=http://127.0.0.1:$backend_port
gateway_env+=(BACKEND_URL="$backend")

panics() { grep -c 'panicked' "$work/$1.log" || true; }

# --- 1. Redis SIGKILL and restart under load ----------------------------------------------
if part 1; then
  say
  say "== 1. redis SIGKILL under load (fail open), restarted empty on the same port"
  redis_port=$(free_port) port=$(free_port "$redis_port") admin=$(free_port "$redis_port" "$port")
  start_redis redis1 "$redis_port"
  redis_pid=$last_pid
  # The load has a route of its own (a burst of 5, then 50/s per client, 100 clients: a mix
  # of 200 and 429, and Redis asked all the time); the fresh client probing for exactness
  # uses the general rule (5, refilled at one per 100 s), which the load never touches.
  start_gateway tollgate1 "$port" "$admin" REDIS_URL="redis://127.0.0.1:$redis_port" FAIL_MODE=open \
    MAX_TOKENS=5 REFILL_RATE=0.01 ROUTES='/load/*=token_bucket:5:50,name=load' \
    RUST_LOG=info,tollgate::stores::guard=debug
  gateway_pid=$last_pid
  duration=16
  CHAOS_CLIENTS=100 CHAOS_THREADS=2 CHAOS_PATH=/load/x \
    timeout 60 wrk -t2 -c"$connections" -d"${duration}s" -s "$work/clients.lua" "http://127.0.0.1:$port/" >"$work/wrk1.out" 2>&1 &
  wrk_pid=$!
  sleep 4
  killed=$(now)
  kill -9 "$redis_pid"
  wait "$redis_pid" 2>/dev/null || true
  wait_metric "$admin" tollgate_breaker_open 1
  opened=$(now)
  sleep 3
  start_redis redis1b "$redis_port"
  accepting=$(now)
  decided=$(exact_budget "$port" 192.0.2.1 5)
  breaker_after=$(metric "$admin" tollgate_breaker_open)
  wait "$wrk_pid"
  raw <"$work/wrk1.out"
  total=$(awk '/^status/ { n += $3 } END { print n + 0 }' "$work/wrk1.out")
  ok=$(awk '$1 == "status" && $2 == 200 { print $3 }' "$work/wrk1.out")
  limited=$(awk '$1 == "status" && $2 == 429 { print $3 }' "$work/wrk1.out")
  other=$(awk '$1 == "status" && $2 != 200 && $2 != 429 { n += $3 } END { print n + 0 }' "$work/wrk1.out")
  socket_errors=$(awk '/Socket errors/ { gsub(/,/, ""); print $4 + $6 + $8 + $10 }' "$work/wrk1.out")
  fail_open=$(metric "$admin" 'tollgate_requests_total{rule="load",decision="fail_open"}')
  say "wrk -t2 -c$connections -d${duration}s over 100 clients: $total answers: ${ok:-0} x 200, ${limited:-0} x 429, $other other, ${socket_errors:-0} socket errors"
  say "answered by fail open during the outage: $fail_open; breaker open $(since "$killed" "$opened") s after the kill; breaker after recovery: $breaker_after"
  say "redis accepting again -> a fresh client decided and exact (5 allowed, then 429): $(since "$accepting" "$decided") s (REDIS_PROBE_INTERVAL_MS default 500)"
  say "probes that failed after redis was back: $(awk -v a="$(date -u -d @"$accepting" +%Y-%m-%dT%H:%M:%S.%N)" '$1 >= a && /redis probe failed/' "$work/tollgate1.log" | wc -l)"
  say "panics in tollgate's log: $(panics tollgate1)"
  stop "$gateway_pid"
fi

# --- 2. Redis SIGSTOP for 5 s ----------------------------------------------------------------
if part 2; then
  say
  say "== 2. redis frozen (SIGSTOP) for 5 s, REDIS_TIMEOUT_MS=50, REDIS_BREAKER_THRESHOLD=3"
  redis_port=$(free_port) port=$(free_port "$redis_port") admin=$(free_port "$redis_port" "$port")
  start_redis redis2 "$redis_port"
  redis_pid=$last_pid
  # Every request allowed, so every one asks Redis (no denial is cached).
  start_gateway tollgate2 "$port" "$admin" REDIS_URL="redis://127.0.0.1:$redis_port" FAIL_MODE=open \
    MAX_TOKENS=1000000000 REFILL_RATE=1000000 REDIS_TIMEOUT_MS=50 REDIS_BREAKER_THRESHOLD=3
  gateway_pid=$last_pid
  started=$(now)
  python3 "$work/latency.py" "$port" 8 14 "$work/latency.txt" &
  client_pid=$!
  sleep 4
  frozen=$(now)
  kill -STOP "$redis_pid"
  wait_metric "$admin" tollgate_breaker_open 1
  open_seen=$(now)
  sleep "$(awk -v f="$frozen" -v n="$(now)" 'BEGIN { s = f + 5 - n; print (s > 0 ? s : 0) }')"
  thawed=$(now)
  kill -CONT "$redis_pid"
  wait_metric "$admin" tollgate_breaker_open 0
  closed=$(now)
  wait "$client_pid"
  # The breaker's own log line says when it opened; the metric poll above is a fallback.
  opened=$(grep -m1 'circuit breaker open' "$work/tollgate2.log" | awk '{ print $1 }' |
    xargs -r -I{} date -d {} +%s.%N 2>/dev/null || true)
  opened=${opened:-$open_seen}
  raw <"$work/latency.txt"
  # Phases by send time; the first second (connections warming up) and the gap between
  # SIGCONT and the probe's next PING (breaker still open, redis back) are left out.
  python3 "$work/phases.py" "$work/latency.txt" 50 \
    "$(awk -v s="$started" 'BEGIN { printf "%.6f", s + 1 }')" "$frozen" \
    "$frozen" "$opened" "$opened" "$thawed" "$closed" 1e12 | tee -a "$log"
  say "breaker opened $(since "$frozen" "$opened") s after SIGSTOP; closed $(since "$thawed" "$closed") s after SIGCONT"
  say "redis errors: timeout $(metric "$admin" 'tollgate_redis_errors_total{kind="timeout"}'), connection $(metric "$admin" 'tollgate_redis_errors_total{kind="connection"}'); fail_open answers $(metric "$admin" 'tollgate_requests_total{rule="general",decision="fail_open"}')"
  say "panics in tollgate's log: $(panics tollgate2)"
  stop "$gateway_pid"
fi

# --- 3. soak ----------------------------------------------------------------------------------
if part 3; then
  say
  say "== 3. soak: $soak_minutes min, 100,000 client identities, Redis store, wrk -t1 -c$soak_connections with ${soak_delay_ms} ms between requests per connection"
  redis_port=$(free_port) port=$(free_port "$redis_port") admin=$(free_port "$redis_port" "$port")
  start_redis redis3 "$redis_port"
  start_gateway tollgate3 "$port" "$admin" REDIS_URL="redis://127.0.0.1:$redis_port" RUST_LOG=warn
  gateway_pid=$last_pid
  CHAOS_CLIENTS=100000 CHAOS_THREADS=1 CHAOS_DELAY_MS="$soak_delay_ms" \
    timeout $((soak_minutes * 60 + 60)) wrk -t1 -c"$soak_connections" -d"${soak_minutes}m" --latency \
    -s "$work/clients.lua" "http://127.0.0.1:$port/" >"$work/wrk3.out" 2>&1 &
  wrk_pid=$!
  echo "seconds rss_kb fds redis_keys" >"$work/soak.txt"
  echo "0 $(rss_kb "$gateway_pid") $(fds "$gateway_pid") 0" >>"$work/soak.txt"
  # Samples while the load runs only: the last one, the "final" value, is taken under load.
  for t in $(seq 10 10 $((soak_minutes * 60))); do
    sleep 10
    kill -0 "$gateway_pid" 2>/dev/null || fail "tollgate exited during the soak"
    kill -0 "$wrk_pid" 2>/dev/null || break
    echo "$t $(rss_kb "$gateway_pid") $(fds "$gateway_pid") $(redis-cli -p "$redis_port" DBSIZE)" >>"$work/soak.txt"
  done
  wait "$wrk_pid"
  raw <"$work/wrk3.out"
  raw <"$work/soak.txt"
  warm=$(((soak_minutes * 60 / 5 + 9) / 10 * 10)); [ "$warm" -lt 10 ] && warm=10
  awk -v warm="$warm" 'NR > 1 {
      if ($1 == 0) { r0 = $2; f0 = $3 }
      if ($1 == warm) { rw = $2; fw = $3 }
      rl = $2; fl = $3; tl = $1; kl = $4
      if ($2 > rmax) rmax = $2; if ($3 > fmax) fmax = $3
    } END {
      printf "RSS: start %.1f MiB, warm-up (%d s) %.1f MiB, final (%d s) %.1f MiB, max %.1f MiB; final/warm-up %.3f\n", r0 / 1024, warm, rw / 1024, tl, rl / 1024, rmax / 1024, rl / rw
      printf "open fds: start %d, warm-up %d, final %d, max %d\n", f0, fw, fl, fmax
      printf "redis keys at the end: %d\n", kl
    }' "$work/soak.txt" | tee -a "$log"
  requests=$(awk '/requests in/ { print $1 }' "$work/wrk3.out")
  rps=$(awk '/^Requests\/sec:/ { print $2 }' "$work/wrk3.out")
  p99=$(awk '$1 == "99%" { print $2 }' "$work/wrk3.out")
  statuses=$(awk '$1 == "status" { printf "%s%s x %s", sep, $3, $2; sep = ", " }' "$work/wrk3.out")
  socket_errors=$(awk '/Socket errors/ { gsub(/,/, ""); print $4 + $6 + $8 + $10 }' "$work/wrk3.out")
  say "load: $requests requests ($rps req/s, p99 $p99): $statuses; ${socket_errors:-0} socket errors"
  say "redis calls failed: timeout $(metric "$admin" 'tollgate_redis_errors_total{kind="timeout"}'), connection $(metric "$admin" 'tollgate_redis_errors_total{kind="connection"}'); answered by fail open: $(metric "$admin" 'tollgate_requests_total{rule="general",decision="fail_open"}')"
  say "panics in tollgate's log: $(panics tollgate3)"
  stop "$gateway_pid"
fi

# --- 4. key flood -----------------------------------------------------------------------------
if part 4; then
  say
  say "== 4. key flood: 1,000,000 identities, memory store, MAX_KEYS=100000"
  port=$(free_port) admin=$(free_port "$port")
  # 5 requests, then one per 1000 s: nothing refills during the run.
  start_gateway tollgate4 "$port" "$admin" MAX_KEYS=100000 MAX_TOKENS=5 REFILL_RATE=0.001 RUST_LOG=warn
  gateway_pid=$last_pid
  exact_budget "$port" 192.0.2.200 5 >/dev/null
  rss_before=$(rss_kb "$gateway_pid")
  # Each wrk thread stops after its share of identities, but wrk itself waits out -d: once
  # the gateway has counted them all, SIGINT makes it print its summary and exit.
  CHAOS_CLIENTS=1000000 CHAOS_THREADS=2 CHAOS_ONCE=1 \
    wrk -t2 -c"$connections" -d15m -s "$work/clients.lua" "http://127.0.0.1:$port/" >"$work/wrk4.out" 2>&1 &
  wrk_pid=$!
  flood_started=$(now)
  rss_peak=$rss_before
  counted='tollgate_requests_total{rule="general",decision="allowed"}'
  while kill -0 "$wrk_pid" 2>/dev/null; do
    r=$(rss_kb "$gateway_pid"); [ "$r" -gt "$rss_peak" ] && rss_peak=$r
    n=$(metric "$admin" "$counted"); [ "${n:-0}" -ge $((1000000 + 5)) ] && break
    sleep 1
  done
  flood_took=$(since "$flood_started" "$(now)")
  kill -INT "$wrk_pid" 2>/dev/null || true
  wait "$wrk_pid" || true
  raw <"$work/wrk4.out"
  rss_after=$(rss_kb "$gateway_pid")
  sent=$(awk '/requests in/ { print $1 }' "$work/wrk4.out")
  statuses=$(awk '$1 == "status" { printf "%s%s x %s", sep, $3, $2; sep = ", " }' "$work/wrk4.out")
  after=$(as_client "$port" 192.0.2.200)
  say "flood: $sent requests from distinct identities in $flood_took s: $statuses"
  say "RSS: before $((rss_before / 1024)) MiB, peak $((rss_peak / 1024)) MiB, after $((rss_after / 1024)) MiB; memory clients $(metric "$admin" tollgate_memory_clients), evictions $(metric "$admin" tollgate_memory_evictions_total)"
  case $after in
    "429 "*) say "the client limited before the flood and idle during it: still limited after it ($after)" ;;
    *) say "the client limited before the flood and idle during it: NOT limited after it ($after): its budget was evicted" ;;
  esac
  say "panics in tollgate's log: $(panics tollgate4)"
  stop "$gateway_pid"
fi

say
say "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
