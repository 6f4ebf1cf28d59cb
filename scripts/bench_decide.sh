#!/usr/bin/env bash
# The decision endpoints under load, each beside a floor of its own kind, in one run (results,
# the command and how to read them: docs/benchmarks.md, part 10). On loopback, rounds
# interleaved (A B C, A B C, ...), medians reported. As in scripts/bench.sh, on a machine with
# two cores or more the server under test runs alone on one core (BENCH_PROXY_CPU, default 0),
# where tokio gives it one worker, and the load generator on another (BENCH_LOAD_CPU, default
# 1); CPU per decision is the server's utime+stime (/proc/PID/stat) over the decisions served.
#
# Targets, all started once and idle but for their turn:
#   floor          examples/decide_floor: hyper-util's auto server (HTTP/1.1 and h2c) answering
#                  a constant: 200 with an empty body (forward-auth's), and for /v1/check,
#                  after reading the body, a constant JSON answer of tollgate's size and type;
#   tollgate       DECIDE_PORT alone (no BACKEND_URL), every decision allowed (the headline);
#   tollgate-deny  the same with a budget of one request per 1000 s: 429 from forward-auth,
#                  200 {"allowed":false,...} from /v1/check.
# Scenarios (each: floor, tollgate, tollgate-deny):
#   fa        GET /v1/forward-auth with X-Forwarded-Uri and X-Forwarded-For (wrk, HTTP/1.1);
#   check     POST /v1/check {"rule":"general","key":"tenant-1"} (wrk and a Lua script);
#   fa-h2     the same as fa over h2c with prior knowledge (h2load);
#   check-h2  the same as check over h2c (h2load -d);
#   grpc      Envoy's ShouldRateLimit over h2c (h2load -d, a fixed gRPC frame built below),
#             tollgate with RLS_CONFIG; beside a tonic floor once examples/rls_floor.rs exists
#             (see scenario_grpc).
# With --callgrind, also instructions per decision (exact, whatever else the machine does):
# tollgate and the floor under valgrind --tool=callgrind, warmed up, counters zeroed, exactly N
# requests (h2load --h1 -n N), counters dumped; scripts/callgrind_top.py then lists where
# tollgate's instructions go that the floor's do not. Builds an unstripped copy for symbols.
# Quote the ratios, not the absolute numbers: the machine matters more than the code.
#
# usage: scripts/bench_decide.sh [--rounds N] [--duration D] [--scenarios LIST] [--log FILE]
#                                [--callgrind] [--no-load]
#   --rounds N        interleaved rounds per scenario (default 5)
#   --duration D      measured seconds per target and round, wrk -d syntax (default 10s)
#   --scenarios LIST  comma-separated subset of fa,check,fa-h2,check-h2,grpc
#                     (default all: fa,check,fa-h2,check-h2,grpc)
#   --log FILE        raw output here, one row per measurement in FILE.tsv
#                     (default $TMPDIR/bench-decide-DATE.log)
#   --callgrind       add instructions per decision; --no-load: only that
# Environment: BENCH_CONNECTIONS (wrk -c, default 32), BENCH_H2_CLIENTS and BENCH_H2_STREAMS
#   (h2load -c and -m, default 8 and 4), BENCH_PROXY_CPU, BENCH_LOAD_CPU, CARGO_TARGET_DIR,
#   BENCH_CALLGRIND_REQUESTS (default 20000).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# free_port, wait_for_port, install_missing, run_header, pin_cpus
. "$ROOT/scripts/lib.sh"

arguments=$*
rounds=5 duration=10s scenarios=fa,check,fa-h2,check-h2,grpc callgrind=0 load=1
log=${TMPDIR:-/tmp}/bench-decide-$(date +%Y%m%d-%H%M%S).log
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=${2:?--rounds needs a number}; shift ;;
    --duration) duration=${2:?--duration needs a time such as 10s}; shift ;;
    --scenarios) scenarios=${2:?--scenarios needs a list}; shift ;;
    --log) log=${2:?--log needs a file}; shift ;;
    --callgrind) callgrind=1 ;;
    --no-load) load=0 ;;
    -h | --help) sed -n '2,41p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench_decide.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case $rounds in '' | *[!0-9]* | 0) echo "bench_decide.sh: --rounds needs a positive number" >&2; exit 2 ;; esac
case $duration in *[!0-9smh]* | '') echo "bench_decide.sh: --duration takes wrk syntax (10s, 1m)" >&2; exit 2 ;; esac
duration_s=$(awk -v d="$duration" 'BEGIN { n = d + 0; if (d ~ /m$/) n *= 60; if (d ~ /h$/) n *= 3600; print n }')
warmup=2s warmup_s=2
connections=${BENCH_CONNECTIONS:-32}
h2_clients=${BENCH_H2_CLIENTS:-8} h2_streams=${BENCH_H2_STREAMS:-4}
target_dir=${CARGO_TARGET_DIR:-$ROOT/target}
results=$log.tsv

mkdir -p "$(dirname "$log")"
: >"$log"
exec > >(tee -a "$log") 2>&1

# --- tools -------------------------------------------------------------------------------
missing=()
command -v wrk >/dev/null || missing+=(wrk)
command -v h2load >/dev/null || missing+=(nghttp2-client)
command -v curl >/dev/null || missing+=(curl)
command -v taskset >/dev/null || missing+=(util-linux)
command -v python3 >/dev/null || missing+=(python3)
[ "$callgrind" = 0 ] || command -v callgrind_control >/dev/null || missing+=(valgrind)
install_missing "${missing[@]}"

run_header "$arguments"
echo "log: $log  results: $results"

echo "== building tollgate and the decision floor (release)"
cargo build --release --quiet --bin tollgate --examples
TOLLGATE=$target_dir/release/tollgate
FLOOR=$target_dir/release/examples/decide_floor

pin_cpus "servers under test" "wrk and h2load"

work=$(mktemp -d)
# start, stop, all_alive for the processes under test
. "$ROOT/scripts/supervise.sh"
trap supervision_cleanup EXIT
trap 'exit 130' INT TERM

allow=(MAX_TOKENS=1000000000 REFILL_RATE=1000000) # a billion tokens, a million more per second
deny=(MAX_TOKENS=1 REFILL_RATE=0.001)             # one request, then one per 1000 s

# A decision service alone: DECIDE_PORT, no BACKEND_URL; the load generator is a trusted proxy.
tollgate() { # name VAR=value... [-- command prefix, e.g. valgrind]
  local name=$1 port admin_port vars=() prefix=()
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do vars+=("$1"); shift; done
  [ $# -gt 0 ] && { shift; prefix=("$@"); }
  port=$(free_port) admin_port=$(free_port "$port")
  start "$name" "$port" "${on_proxy_cpu[@]}" -- env -i PATH="$PATH" BIND=127.0.0.1 DECIDE_PORT="$port" \
    ADMIN_BIND=127.0.0.1 ADMIN_PORT="$admin_port" TRUSTED_PROXIES=127.0.0.1 RUST_LOG=warn \
    "${vars[@]}" "${prefix[@]}" "${binary:-$TOLLGATE}"
}

floor() { # name [command prefix...]
  local name=$1 port
  shift
  port=$(free_port)
  local binary=${floor_binary:-$FLOOR}
  [ "$name" = floor-grpc ] && binary=$target_dir/release/examples/rls_floor
  start "$name" "$port" "${on_proxy_cpu[@]}" -- env -i PORT="$port" "$@" "$binary"
}

# The requests, one definition for every tool.
fa_path=/v1/forward-auth
fa_headers=(-H 'X-Forwarded-Uri: /api/x' -H 'X-Forwarded-For: 203.0.113.7')
check_path=/v1/check
check_body='{"rule":"general","key":"tenant-1"}'
printf '%s' "$check_body" >"$work/check.json"
cat >"$work/check.lua" <<EOF
wrk.method = "POST"
wrk.body = '$check_body'
wrk.headers["Content-Type"] = "application/json"
EOF

# Envoy's ShouldRateLimit: one gRPC message frame (a 0 byte, a 4-byte big-endian length, the
# protobuf) of RateLimitRequest{domain: "bench", descriptors: [{entries: [{key: "tenant",
# value: "tenant-1"}]}], hits_addend: 1}, encoded by hand (field numbers from
# envoy/service/ratelimit/v3/rls.proto and envoy/extensions/common/ratelimit/v3/ratelimit.proto).
python3 - "$work/grpc.bin" <<'EOF'
import struct, sys
def varint(n):
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return out
def field(number, payload):  # a length-delimited field (wire type 2)
    return varint(number << 3 | 2) + varint(len(payload)) + payload
entry = field(1, b"tenant") + field(2, b"tenant-1")                  # RateLimitDescriptor.Entry
descriptor = field(1, entry)                                        # RateLimitDescriptor
request = field(1, b"bench") + field(2, descriptor) + varint(3 << 3 | 0) + varint(1)  # hits_addend
open(sys.argv[1], "wb").write(b"\0" + struct.pack(">I", len(request)) + request)
EOF
grpc_path=/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit
grpc_headers=(-H 'content-type: application/grpc' -H 'te: trailers')

# CPU time (clock ticks) of a process.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
hz=$(getconf CLK_TCK)

to_us() { # wrk latency such as 512.00us, 1.23ms, 1.01s -> microseconds
  awk -v v="$1" 'BEGIN {
    if (v ~ /us$/) printf "%.0f", v; else if (v ~ /ms$/) printf "%.0f", v * 1000;
    else if (v ~ /m$/) printf "%.0f", v * 6e7; else printf "%.0f", v * 1e6 }'
}

echo -e "scenario\tround\ttarget\treq_s\tp50_us\tp99_us\trequests\tnon2xx\terrors\tcpu_ticks\tcpu_us_per_req" >"$results"

# The load of a scenario, as arguments of its tool (wrk or h2load), after the tool's own.
scenario_tool() { case $1 in fa | check) echo wrk ;; *) echo h2load ;; esac; }
scenario_path() { case $1 in fa*) echo "$fa_path" ;; check*) echo "$check_path" ;; grpc) echo "$grpc_path" ;; esac; }
scenario_args() { # scenario: sets the array args
  case $1 in
    fa | fa-h2) args=("${fa_headers[@]}") ;;
    check) args=(-s "$work/check.lua") ;;
    check-h2) args=(-d "$work/check.json" -H 'content-type: application/json') ;;
    grpc) args=(-d "$work/grpc.bin" "${grpc_headers[@]}") ;;
  esac
}

# One measurement: warm up, then load the target for $duration, recording one results row.
measure() { # scenario round target
  local scenario=$1 round=$2 name=$3 tool url pid out c0 c1 rps requests p50 p99 non2xx errors args
  tool=$(scenario_tool "$scenario")
  url=http://127.0.0.1:${port_of[$name]}$(scenario_path "$scenario")
  pid=${pid_of[$name]}
  scenario_args "$scenario"
  all_alive
  if [ "$tool" = wrk ]; then
    timeout 60 "${on_load_cpu[@]}" wrk -t1 -c"$connections" -d"$warmup" "${args[@]}" "$url" >/dev/null
    c0=$(cpu_ticks "$pid")
    out=$(timeout $((duration_s + 60)) "${on_load_cpu[@]}" wrk -t1 -c"$connections" -d"$duration" --latency "${args[@]}" "$url")
    c1=$(cpu_ticks "$pid")
    rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
    requests=$(awk '/requests in/ {print $1}' <<<"$out")
    p50=$(to_us "$(awk '$1 == "50%" {print $2}' <<<"$out")")
    p99=$(to_us "$(awk '$1 == "99%" {print $2}' <<<"$out")")
    non2xx=$(awk -F: '/Non-2xx/ {gsub(/ /, "", $2); print $2}' <<<"$out")
    errors=$(awk '/Socket errors/ {gsub(/,/, ""); print $4 + $6 + $8 + $10}' <<<"$out")
  else
    timeout 60 "${on_load_cpu[@]}" h2load -t1 -c"$h2_clients" -m"$h2_streams" -D "$warmup_s" "${args[@]}" "$url" >/dev/null
    c0=$(cpu_ticks "$pid")
    # h2load prints no percentiles: they come from its per-request log (elapsed microseconds).
    out=$(timeout $((duration_s + 60)) "${on_load_cpu[@]}" h2load -t1 -c"$h2_clients" -m"$h2_streams" \
      -D "$duration_s" --log-file="$work/h2load.tsv" "${args[@]}" "$url")
    c1=$(cpu_ticks "$pid")
    rps=$(awk '/^finished in/ {gsub(/,/, ""); print $4}' <<<"$out")
    # "done" counts every answered request (h2load's "failed" includes non-2xx answers).
    requests=$(awk '/^requests:/ {print $6}' <<<"$out")
    non2xx=$(awk '/^status codes:/ {gsub(/,/, ""); print $5 + $7 + $9}' <<<"$out")
    errors=$(awk '/^requests:/ {gsub(/,/, ""); print $12 + $14}' <<<"$out")
    read -r p50 p99 < <(cut -f3 "$work/h2load.tsv" | sort -n |
      awk '{v[NR] = $1} END {printf "%d %d\n", v[int(NR * 0.5) + 1], v[int(NR * 0.99) + 1]}')
  fi
  all_alive
  printf '%s\n' "--- $scenario round $round $name ($tool ${args[*]} $url)" "$out" >>"$log"
  local ticks=$((c1 - c0)) cpu
  cpu=$(awk -v t="$ticks" -v hz="$hz" -v n="${requests:-0}" 'BEGIN { printf "%.2f", n ? t * 1e6 / hz / n : 0 }')
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$scenario" "$round" "$name" "${rps:-0}" \
    "${p50:-0}" "${p99:-0}" "${requests:-0}" "${non2xx:-0}" "${errors:-0}" "$ticks" "$cpu" >>"$results"
  printf '  %-8s r%-2s %-14s %9.0f dec/s  p50 %6s us  p99 %7s us  CPU %6s us/dec  (%s requests, %s non-2xx, %s errors)\n' \
    "$scenario" "$round" "$name" "${rps:-0}" "${p50:-0}" "${p99:-0}" "$cpu" "${requests:-0}" "${non2xx:-0}" "${errors:-0}"
}

# The target answers one request of the scenario as expected: status, and a body matching.
expect() { # name scenario status [body-regex]
  local name=$1 scenario=$2 want=$3 pattern=${4:-} got url args=()
  url=http://127.0.0.1:${port_of[$name]}$(scenario_path "$scenario")
  case $scenario in
    fa*) args=("${fa_headers[@]}") ;;
    check*) args=(-X POST -H 'Content-Type: application/json' --data-binary "$check_body") ;;
  esac
  case $scenario in *-h2) args+=(--http2-prior-knowledge) ;; esac
  got=$(curl -s -o "$work/answer" -w '%{http_code}' --max-time 5 "${args[@]}" "$url") || true
  # shellcheck disable=SC2053 # $want may be a pattern
  if [[ $got != $want ]] || { [ -n "$pattern" ] && ! grep -Eq "$pattern" "$work/answer"; }; then
    echo "bench_decide.sh: $name answered $scenario with $got $(head -c 300 "$work/answer"), expected $want ${pattern:+matching $pattern}" >&2
    exit 1
  fi
}

run_rounds() { # scenario "target..."
  local scenario=$1 targets=$2 round name
  for round in $(seq 1 "$rounds"); do
    echo "  -- $scenario round $round/$rounds, $(date +%T), load average $(loadavg)"
    for name in $targets; do measure "$scenario" "$round" "$name"; done
  done
}

# Envoy's ShouldRateLimit, when this tollgate serves it (RLS_CONFIG): domain "bench", one
# descriptor {key: tenant} of any value, as a fixed window: a billion a second for tollgate, one
# a day for tollgate-deny. gRPC is routed on `content-type: application/grpc` on DECIDE_PORT,
# so the same targets serve it. Its floor, examples/rls_floor.rs (a tonic RateLimitService
# answering a constant RateLimitResponse{overall_code: OK} on hyper-util's auto server), is
# not written yet: tollgate's generated types (`rls::proto`) are crate-private. Until it is,
# the scenario measures tollgate alone, and its ratios are "-".
rls=0
if grep -q RLS_CONFIG "$ROOT/src/config/mod.rs"; then
  rls=1
  for budget in allow:1000000000:second deny:1:day; do
    IFS=: read -r kind per unit <<<"$budget"
    printf 'domain: bench\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: %s, requests_per_unit: %s}\n' \
      "$unit" "$per" >"$work/rls-$kind.yaml"
  done
  allow+=(RLS_CONFIG="$work/rls-allow.yaml") deny+=(RLS_CONFIG="$work/rls-deny.yaml")
fi

# One gRPC call: HTTP 200 with grpc-status 0, and the answer's overall_code (field 1, a
# varint right after the 5-byte frame header: 1 OK, 2 OVER_LIMIT).
expect_grpc() { # name overall-code
  local name=$1 want=$2 code
  curl -s --http2-prior-knowledge --max-time 5 -D "$work/grpc.head" -o "$work/grpc.answer" \
    "${grpc_headers[@]}" --data-binary @"$work/grpc.bin" "http://127.0.0.1:${port_of[$name]}$grpc_path" || true
  code=$(od -An -tu1 -j5 -N2 "$work/grpc.answer" | tr -s ' ' | sed 's/^ //')
  if ! grep -qi '^grpc-status: 0' "$work/grpc.head" || [ "$code" != "8 $want" ]; then
    echo "bench_decide.sh: $name answered ShouldRateLimit with $(tr -d '\r' <"$work/grpc.head" | tr '\n' ' ')" \
      "and $(od -An -tx1 "$work/grpc.answer" | head -c 120), expected grpc-status 0, overall_code $want" >&2
    exit 1
  fi
}

scenario_grpc() {
  if [ "$rls" = 0 ]; then
    echo "  grpc: skipped: this tollgate does not serve ShouldRateLimit (no RLS_CONFIG)"
    return 0
  fi
  echo "  grpc: the request is $(wc -c <"$work/grpc.bin") bytes ($(od -An -tx1 "$work/grpc.bin" | tr -s ' \n' ' '))"
  local targets="tollgate tollgate-deny"
  if [ -x "$target_dir/release/examples/rls_floor" ]; then
    floor floor-grpc
    expect_grpc floor-grpc 1
    targets="floor-grpc $targets"
  else
    echo "  grpc: no floor (examples/rls_floor.rs is not written yet): tollgate alone"
  fi
  expect_grpc tollgate 1
  # tollgate-deny's one call a day, spent.
  curl -s --http2-prior-knowledge --max-time 5 -o /dev/null "${grpc_headers[@]}" --data-binary @"$work/grpc.bin" \
    "http://127.0.0.1:${port_of[tollgate-deny]}$grpc_path" || true
  expect_grpc tollgate-deny 2
  run_rounds grpc "$targets"
}

if [ "$load" = 1 ]; then
  echo "== the decision endpoints under load: $rounds round(s) of $duration per target after a $warmup warm-up;" \
    "wrk -t1 -c$connections (HTTP/1.1), h2load -t1 -c$h2_clients -m$h2_streams (h2c)"
  floor floor
  tollgate tollgate "${allow[@]}"
  tollgate tollgate-deny "${deny[@]}"
  for scenario in ${scenarios//,/ }; do
    case $scenario in
      fa | fa-h2 | check | check-h2)
        expect floor "$scenario" 200
        # tollgate-deny's one token, spent (a later scenario finds it spent already).
        expect tollgate-deny "$scenario" '[0-9]*'
        expect tollgate "$scenario" 200
        case $scenario in
          fa*) expect tollgate-deny "$scenario" 429 ;;
          check*)
            expect tollgate "$scenario" 200 '"allowed":true'
            echo "  $scenario: answer bodies: floor $(curl -s -X POST --data-binary "$check_body" \
              "http://127.0.0.1:${port_of[floor]}$check_path" | wc -c) bytes, tollgate $(wc -c <"$work/answer") bytes"
            expect tollgate-deny "$scenario" 200 '"allowed":false'
            ;;
        esac
        run_rounds "$scenario" "floor tollgate tollgate-deny"
        ;;
      grpc) scenario_grpc ;;
      *) echo "bench_decide.sh: unknown scenario $scenario (fa, check, fa-h2, check-h2, grpc)" >&2; exit 2 ;;
    esac
  done
  stop floor tollgate tollgate-deny
  [ -z "${pid_of[floor-grpc]:-}" ] || stop floor-grpc

  echo
  echo "== summary: medians over $rounds round(s) [min-max]; \"vs floor\": tollgate's median / the floor's median"
  echo "   (dec/s: decisions per second, higher is better; CPU us/dec: the server's own process per decision)"
  awk -F'\t' '
    function sorted(list, a,   n, i, j, t) {
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
      refused[k] += $8; bad[k] += $9
      # per-round ratios against the floor of the same round
      if ($3 ~ /^floor/) { frps[$1, $2] = $4; fcpu[$1, $2] = $11 }
      else if (fcpu[$1, $2] > 0) { rr[k] = rr[k] " " $4 / frps[$1, $2]; rc[k] = rc[k] " " $11 / fcpu[$1, $2] }
    }
    END {
      for (s = 1; s <= ns; s++) {
        S = order[s]
        printf "\nscenario %s\n", S
        printf "| %-14s | %-24s | %-6s | %-7s | %-22s | %-11s | %-11s | %-19s | %-8s | %s |\n", "target", "dec/s median [min-max]",
          "p50 us", "p99 us", "CPU us/dec [min-max]", "dec/s vs floor", "CPU vs floor", "CPU per round vs floor", "non-2xx", "errors"
        printf "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n"
        for (t = 1; t <= nt[S]; t++) { T = target[S, t]; k = S SUBSEP T; f = S SUBSEP (S == "grpc" ? "floor-grpc" : "floor")
          r = med(rps[k]); c = med(cpu[k])
          per = T ~ /^floor/ || rc[k] == "" ? "-" : sprintf("%.2f [%.2f-%.2f]", med(rc[k]), lo(rc[k]), hi(rc[k]))
          printf "| %-14s | %7.0f [%6.0f-%6.0f] | %6.0f | %7.0f | %6.2f [%5.2f-%5.2f] | %11s | %11s | %19s | %8d | %d |\n", T,
            r, lo(rps[k]), hi(rps[k]), med(p50[k]), med(p99[k]), c, lo(cpu[k]), hi(cpu[k]),
            ratio(r, med(rps[f])), ratio(c, med(cpu[f])), per, refused[k], bad[k] }
      }
    }' "$results"
  echo "load average at the end: $(loadavg); $(uptime)"
  echo "raw output: $log  results: $results"
fi

# --- instructions per decision under callgrind ------------------------------------------------
[ "$callgrind" = 1 ] || exit 0
requests=${BENCH_CALLGRIND_REQUESTS:-20000}
cg_dir=$log.callgrind
mkdir -p "$cg_dir"
echo
build_unstripped --bin tollgate --example decide_floor
wait_tenths=600 # valgrind starts slowly
count_requests() { # name scenario expected-status-class
  local name=$1 scenario=$2 class=$3 out pid url args
  pid=${pid_of[$name]}
  url=http://127.0.0.1:${port_of[$name]}$(scenario_path "$scenario")
  case $scenario in
    fa) args=("${fa_headers[@]}") ;;
    check) args=(-d "$work/check.json" -H 'content-type: application/json') ;;
  esac
  "${on_load_cpu[@]}" h2load --h1 -c "$connections" -n 2000 "${args[@]}" "$url" >/dev/null
  callgrind_control --zero "$pid" >/dev/null 2>&1
  out=$("${on_load_cpu[@]}" h2load --h1 -c "$connections" -n "$requests" "${args[@]}" "$url")
  callgrind_control --dump="$scenario" "$pid" >/dev/null 2>&1
  printf '%s\n' "--- callgrind $name $scenario" "$out" >>"$log"
  grep -q "^status codes: .*$requests $class" <<<"$out" || {
    echo "bench_decide.sh: $name did not answer $requests x $class:" >&2
    grep -E '^(requests|status codes):' <<<"$out" >&2
    exit 1
  }
  local dump
  dump=$(ls -t "$cg_dir/$name.out".* | head -n 1)
  cp "$dump" "$cg_dir/$name-$scenario.out"
  printf '  %-14s %-6s %12s instructions per decision (%s requests, all %s)\n' "$name" "$scenario" \
    "$(awk -v n="$requests" '/^totals:/ {printf "%\047.0f", $2 / n}' "$dump")" "$requests" "$class"
}
echo "== callgrind: $requests requests each, h2load --h1 -c$connections, after 2000 warm-up requests"
floor_binary=$target_dir/callgrind/release/examples/decide_floor floor floor-cg $(valgrind_cmd floor-cg)
binary=$target_dir/callgrind/release/tollgate tollgate tollgate-cg "${allow[@]}" -- $(valgrind_cmd tollgate-cg)
binary=$target_dir/callgrind/release/tollgate tollgate tollgate-deny-cg "${deny[@]}" -- $(valgrind_cmd tollgate-deny-cg)
for scenario in fa check; do
  count_requests floor-cg "$scenario" 2xx
  count_requests tollgate-cg "$scenario" 2xx
  if [ "$scenario" = fa ]; then count_requests tollgate-deny-cg fa 4xx; else count_requests tollgate-deny-cg check 2xx; fi
done
stop floor-cg tollgate-cg tollgate-deny-cg
for scenario in fa check; do
  echo
  echo "-- $scenario, every decision allowed: tollgate against the floor"
  python3 "$ROOT/scripts/callgrind_top.py" "$cg_dir/tollgate-cg-$scenario.out" "$requests" --match tollgate:: \
    --baseline "$cg_dir/floor-cg-$scenario.out" "$requests" --top 20
done
echo "callgrind dumps: $cg_dir (callgrind_annotate --inclusive=yes FILE)"
