#!/usr/bin/env bash
# The fleet's figure in one command (docs/benchmarks.md, part 28): what a decision costs Redis,
# one Redis and a Cluster of 3 masters, one limit and two, a hot key and cold keys, beside the
# INCRBY + PEXPIRE NX pair on the same Redis in the same run, two ways:
#   instructions  redis-server's instructions per decision under callgrind, summed over the
#                 masters (scripts/redis_instructions_per_decision.sh, N1 N2 = 1000 5000);
#   CPU           redis-server's CPU per decision at a fixed rate, summed over the masters
#                 (scripts/redis_cpu_at_rate.sh, BENCH_RATE a second for BENCH_DURATION s),
#                 and decisions per Redis core, 1 s over that.
# Each row's "x pair" is over the pair's figure for the same Redis and keys, from this run.
#
# usage: scripts/redis_per_core.sh BINARY [--no-callgrind] [--no-cpu] [--single-only|--cluster-only]
# Environment: BENCH_RATE (default 4000), BENCH_DURATION (default 20), BENCH_N1/BENCH_N2
# (default 1000 and 5000), BENCH_TWO_LIMITS (default
# token_bucket:1000000000:1000000+fixed_window:10000000:86400, which no request exhausts).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh # loadavg, run_header
binary=${1:?usage: scripts/redis_per_core.sh BINARY [--no-callgrind] [--no-cpu] [--single-only|--cluster-only]}
arguments=$*
shift
callgrind=1 cpu=1 deployments="1 3"
while [ $# -gt 0 ]; do
  case $1 in
    --no-callgrind) callgrind=0 ;;
    --no-cpu) cpu=0 ;;
    --single-only) deployments=1 ;;
    --cluster-only) deployments=3 ;;
    *) echo "redis_per_core.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ -x "$binary" ] || { echo "redis_per_core.sh: $binary is not an executable" >&2; exit 2; }
two=${BENCH_TWO_LIMITS:-token_bucket:1000000000:1000000+fixed_window:10000000:86400}
n1=${BENCH_N1:-1000} n2=${BENCH_N2:-5000}
run_header "$arguments"
echo "rate ${BENCH_RATE:-4000}/s for ${BENCH_DURATION:-20} s; callgrind over $n1 and $n2 decisions; two limits: $two"

rows=()
measure() { # deployment(1|3) label target keys [limits]
  local masters=$1 label=$2 target=$3 keys=$4 limits=${5:-} env=() instr=- us=- line
  [ "$masters" = 1 ] || env+=(REDIS_CLUSTER="$masters")
  [ -z "$limits" ] || env+=(BENCH_LIMITS="$limits")
  env+=(BENCH_KEYS="$keys")
  if [ "$callgrind" = 1 ]; then
    line=$(env "${env[@]}" scripts/redis_instructions_per_decision.sh "$target" "$n1" "$n2")
    echo "  $line"
    instr=$(sed -E 's/.*: ([0-9-]+) per decision$/\1/' <<<"$line")
  fi
  if [ "$cpu" = 1 ]; then
    line=$(env "${env[@]}" scripts/redis_cpu_at_rate.sh "$target")
    echo "  $line"
    us=$(sed -E 's/.*redis-server CPU ([0-9.]+) us per decision.*/\1/' <<<"$line")
  fi
  rows+=("$masters|$label|$keys|$instr|$us")
}

for masters in $deployments; do
  where=$([ "$masters" = 1 ] && echo "one Redis" || echo "Cluster of $masters")
  for keys in hot cold; do
    echo "== $where, $keys keys ($(date +%T), load average $(loadavg))"
    measure "$masters" pair pair "$keys"
    measure "$masters" "one limit" "$binary" "$keys"
    measure "$masters" "two limits" "$binary" "$keys" "$two"
  done
done

echo
echo "| Redis | rule | keys | instructions per decision | x pair | CPU us per decision | decisions per Redis core | x pair (CPU) |"
echo "|---|---|---|--:|--:|--:|--:|--:|"
printf '%s\n' "${rows[@]}" | awk -F'|' '
  $2 == "pair" { pi[$1, $3] = $4; pc[$1, $3] = $5 }
  { row[NR] = $0 }
  function x(a, b) { return (a == "-" || b == "-" || b + 0 == 0) ? "-" : sprintf("%.2fx", a / b) }
  END {
    for (i = 1; i <= NR; i++) { split(row[i], f, "|")
      where = f[1] == 1 ? "one" : "Cluster of " f[1]
      core = f[5] == "-" ? "-" : sprintf("%.0f", 1e6 / f[5])
      printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", where, f[2], f[3], f[4], x(f[4], pi[f[1], f[3]]),
        f[5], core, x(f[5], pc[f[1], f[3]]) }
  }'
echo "load average at the end: $(loadavg)"
