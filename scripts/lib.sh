# Helpers shared by scripts/bench.sh, scripts/bench_decide.sh, scripts/chaos.sh and
# scripts/demo.sh (sourced, not run). Callers set `work` (a directory holding NAME.log for each
# process they start) before using them.

# Is something listening on 127.0.0.1:$1? (bash's /dev/tcp: connects, sends nothing.)
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# free_port [TAKEN...]: a loopback port below the ephemeral range (so no outgoing connection
# takes it in the meantime) that nothing listens on and is none of TAKEN: the ports picked
# before it that nothing listens on yet (it runs in a subshell, so it cannot remember them).
free_port() {
  local port
  while :; do
    port=$((20000 + RANDOM % 12000))
    case " $* " in *" $port "*) continue ;; esac
    if ! listening "$port"; then
      echo "$port"
      return
    fi
  done
}

# wait_for_port PORT NAME [TENTHS]: until something listens on PORT (default 10 s), else print
# NAME's log and exit.
wait_for_port() {
  local i
  for i in $(seq 1 "${3:-100}"); do
    if listening "$1"; then return 0; fi
    sleep 0.1
  done
  echo "$(basename "$0"): $2 did not start listening on 127.0.0.1:$1; its log:" >&2
  cat "$work/$2.log" >&2 || true
  exit 1
}


# install_missing PACKAGE...: install Debian's packages (as root with apt-get), else exit naming
# them. No-op without arguments.
install_missing() {
  [ $# -gt 0 ] || return 0
  if command -v apt-get >/dev/null && [ "$(id -u)" -eq 0 ]; then
    echo "$(basename "$0"): installing $*"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    echo "$(basename "$0"): missing $*: apt-get install $*" >&2
    exit 1
  fi
}

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

# run_header ARGUMENTS...: the first lines of a benchmark's output: what ran, at which commit,
# on which machine.
run_header() {
  echo "$(basename "$0") $* -- $(date -Is), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- src 2>/dev/null || echo ' (src/ modified)')"
  echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), load average $(loadavg)"
}

# pin_cpus WHAT-ON-PROXY-CPU WHAT-ON-LOAD-CPU: with two cores or more, the processes under test
# on one (BENCH_PROXY_CPU, default 0) and the load on another (BENCH_LOAD_CPU, default 1):
# sets on_proxy_cpu and on_load_cpu, the taskset prefixes (empty on one core).
pin_cpus() {
  if [ "$(nproc)" -ge 2 ]; then
    proxy_cpu=${BENCH_PROXY_CPU:-0} load_cpu=${BENCH_LOAD_CPU:-1}
    on_proxy_cpu=(taskset -c "$proxy_cpu") on_load_cpu=(taskset -c "$load_cpu")
    echo "pinning: $1 on CPU $proxy_cpu; $2 on CPU $load_cpu"
  else
    on_proxy_cpu=() on_load_cpu=()
    echo "$(basename "$0"): one CPU only: nothing pinned, CPU per request includes the load generator's interference"
  fi
}

# form_cluster TRIES PAUSE PORT...: wait until each redis-server on PORT answers PING, then,
# for more than one, form them into a Cluster of masters (redis-cli --cluster create) and wait
# until every node says cluster_state:ok; TRIES checks PAUSE seconds apart for each wait, else
# exit naming the node (`work` holds create.log).
form_cluster() {
  local tries=$1 pause=$2 port
  shift 2
  for port in "$@"; do
    for _ in $(seq "$tries"); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep "$pause"; done
  done
  [ $# -gt 1 ] || return 0
  redis-cli --cluster create $(printf '127.0.0.1:%s ' "$@") --cluster-replicas 0 \
    --cluster-yes >"$work/create.log" 2>&1 || { cat "$work/create.log" >&2; exit 1; }
  for port in "$@"; do
    for _ in $(seq "$tries"); do
      redis-cli -p "$port" CLUSTER INFO 2>/dev/null | grep -q cluster_state:ok && break
      sleep "$pause"
    done
    redis-cli -p "$port" CLUSTER INFO | grep -q cluster_state:ok ||
      { echo "the Cluster's node $port is not ok" >&2; exit 1; }
  done
}
