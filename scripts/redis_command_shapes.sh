#!/usr/bin/env bash
# What a decision's commands cost redis-server, without tollgate: exact instructions per
# decision (callgrind) of a few shapes a decision without a script could take, beside the
# INCRBY + PEXPIRE NX pair, all sent the same way (redis-cli --pipe), so their ratios are
# comparable (docs/benchmarks.md, part 34). Each shape is run with N1 and with N2 decisions,
# each run on a fresh redis-server, and the difference of the two totals over N2 - N1 removes
# startup and shutdown.
#
# usage: scripts/redis_command_shapes.sh [N1 N2] [SHAPE...]   (default 2000 12000, every shape)
# Shapes (hot: one client's key each time; cold: a new client each decision):
#   pair      INCRBY k 1, PEXPIRE k 60000 NX: the floor (the fixed window without a script)
#   window    INCRBY k:<i> 1, PEXPIRE k:<i> 121000 NX, GET k:<i-1>: a sliding window's counters
#   zset      ZADD k GT now t, ZINCRBY k inc t: a token bucket's TAT raised to now and moved
#             on, on a key of its own, with no expiry
#   zset_ttl  the same and PEXPIRE k 61000: with the expiry a key of its own needs
#   zset_rule ZADD r GT now m, ZINCRBY r inc m on one sorted set per rule, the client a member
#             (m): no expiry per client, the set swept of full buckets instead
#   string    SET k now NX PX 61000, INCRBY k inc, PEXPIRE k 61000: a TAT in a string (not
#             exact: a stale TAT is not raised to now; for its cost only)
#   bitfield  BITFIELD k OVERFLOW SAT INCRBY u63 0 -now INCRBY u63 0 now OVERFLOW FAIL
#             INCRBY u63 0 K+inc INCRBY u63 0 -K, PEXPIREAT k now+61000: a token bucket's TAT
#             raised to now and moved on only if it fits (K = 2^63 - 1 - now - capacity
#             turns "over capacity" into an overflow, which FAIL refuses), and its expiry
#   bitfield_rel  the same with PEXPIRE k 61000 (relative: Redis rewrites it to propagate)
#   bitfield_gt   the same BITFIELD, then PEXPIREAT k t NX and PEXPIREAT k t GT: an expiry
#             set on a new key and only ever moved later (what tollgate sends)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh # free_port
n1=2000 n2=12000
if [[ ${1:-} =~ ^[0-9]+$ ]]; then
  n1=$1 n2=${2:?usage: scripts/redis_command_shapes.sh [N1 N2] [SHAPE...]}
  shift 2
fi
(( n2 > n1 )) || { echo "N2 ($n2) is more than N1 ($n1)" >&2; exit 2; }
shapes=("$@")
[ ${#shapes[@]} -gt 0 ] || shapes=(pair window zset zset_ttl zset_rule string bitfield bitfield_rel bitfield_gt)
for shape in "${shapes[@]}"; do
  case $shape in pair|window|zset|zset_ttl|zset_rule|string|bitfield|bitfield_rel|bitfield_gt) ;;
    *) echo "unknown shape $shape (pair, window, zset, zset_ttl, zset_rule, string, bitfield, bitfield_rel, bitfield_gt)" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

# SHAPE N hot|cold: the commands of N decisions, in Redis's protocol.
commands() {
  python3 - "$@" <<'EOF'
import sys
shape, n, keys = sys.argv[1], int(sys.argv[2]), sys.argv[3]
out = sys.stdout.buffer
def cmd(*args):
    args = [str(a).encode() for a in args]
    out.write(b"*%d\r\n" % len(args))
    for a in args:
        out.write(b"$%d\r\n%s\r\n" % (len(a), a))
now = 1764912345678901  # µs, as the TAT is kept
for i in range(n):
    client = "%032x" % i if keys == "cold" else "7f000001" * 4
    key = "tollgate:{general:%s}:tb" % client
    t = now + i * 100
    if shape == "pair":
        cmd("INCRBY", key, 1); cmd("PEXPIRE", key, 60000, "NX")
    elif shape == "window":
        cmd("INCRBY", key + ":5", 1); cmd("PEXPIRE", key + ":5", 121000, "NX"); cmd("GET", key + ":4")
    elif shape == "zset":
        cmd("ZADD", key, "GT", t, "t"); cmd("ZINCRBY", key, 1000, "t")
    elif shape == "zset_ttl":
        cmd("ZADD", key, "GT", t, "t"); cmd("ZINCRBY", key, 1000, "t"); cmd("PEXPIRE", key, 61000)
    elif shape == "zset_rule":
        cmd("ZADD", "tollgate:{general:7}:tb", "GT", t, client); cmd("ZINCRBY", "tollgate:{general:7}:tb", 1000, client)
    elif shape == "string":
        cmd("SET", key, t, "NX", "PX", 61000); cmd("INCRBY", key, 1000); cmd("PEXPIRE", key, 61000)
    elif shape in ("bitfield", "bitfield_rel", "bitfield_gt"):
        # A capacity of 60 s of TAT: the hot key is refused now and then, as in production.
        k = 2**63 - 1 - t - 60_000_000
        cmd("BITFIELD", key, "OVERFLOW", "SAT", "INCRBY", "u63", 0, -t, "INCRBY", "u63", 0, t,
            "OVERFLOW", "FAIL", "INCRBY", "u63", 0, k + 1000, "INCRBY", "u63", 0, -k)
        if shape == "bitfield":
            cmd("PEXPIREAT", key, t // 1000 + 61000)
        elif shape == "bitfield_gt":
            cmd("PEXPIREAT", key, t // 1000 + 61000, "NX")
            cmd("PEXPIREAT", key, t // 1000 + 61000, "GT")
        else:
            cmd("PEXPIRE", key, 61000)
EOF
}

# SHAPE N hot|cold: redis-server's total instructions, from its start to its shutdown.
total() {
  local port
  port=$(free_port)
  valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" \
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 &
  local pid=$!
  for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done
  commands "$@" | redis-cli -p "$port" --pipe >/dev/null
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || kill "$pid"
  wait "$pid" 2>/dev/null || true
  awk '/^(summary|totals):/ {print $2; exit}' "$work/cg.out"
}

echo "redis-server $(redis-server --version | grep -o 'v=[^ ]*'), $n1 and $n2 decisions a run"
for keys in hot cold; do
  for shape in "${shapes[@]}"; do
    first=$(total "$shape" "$n1" "$keys")
    second=$(total "$shape" "$n2" "$keys")
    echo "$shape $keys: $(( (second - first) / (n2 - n1) )) instructions a decision"
  done
done
