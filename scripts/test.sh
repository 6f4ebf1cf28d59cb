#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit, property and integration tests.
# Integration tests start their own redis-server processes on free ports (never one left
# running by hand), so redis-server and redis-cli must be installed; on Debian this script
# installs them when they are missing, and so python3 (a backend that reads targets as Python
# does), promtool and Python's prometheus_client.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" -eq 0 ]; then
    echo "test.sh: installing redis-server and redis-tools" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null
  else
    echo "test.sh: redis-server and redis-cli are required: apt-get install redis-server redis-tools" >&2
    exit 1
  fi
fi
redis-server --version
# tests/it/tls_listener.rs puts a real HAProxy (send-proxy-v2) in front of the binary.
if ! command -v haproxy >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" -eq 0 ]; then
    echo "test.sh: installing haproxy" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null
  else
    echo "test.sh: haproxy is required: apt-get install haproxy" >&2
    exit 1
  fi
fi
haproxy -v | sed -n 1p  # sed reads it all: head would end the pipe early (SIGPIPE under pipefail)
# tests/it/bypass.rs reads request targets with the URL parsers backends use (Python's).
if ! command -v python3 >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" -eq 0 ]; then
    echo "test.sh: installing python3" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 >/dev/null
  else
    echo "test.sh: python3 is required: apt-get install python3" >&2
    exit 1
  fi
fi
# tests/it/sentinel.rs runs Sentinels as `redis-server --sentinel` (Debian's redis-sentinel
# package only adds a service around the same binary). A build without Sentinel would fail
# those tests obscurely: say so here. Without a config file a Sentinel exits at once, naming
# itself.
sentinel_check=$(timeout 10 redis-server --sentinel </dev/null 2>&1 || true)
if [[ "$sentinel_check" != *Sentinel* ]]; then
  echo "test.sh: this redis-server cannot run as a Sentinel (redis-server --sentinel)" >&2
  exit 1
fi

# The /metrics tests check both exposition formats with the real readers: promtool (Debian's
# `prometheus` package) lints the Prometheus text format and parses OpenMetrics, and Python's
# prometheus_client parses each with its own parser.
if ! command -v promtool >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" -eq 0 ]; then
    echo "test.sh: installing promtool (the prometheus package)" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  else
    echo "test.sh: promtool is required: apt-get install prometheus" >&2
    exit 1
  fi
fi
if ! python3 -c 'import prometheus_client' 2>/dev/null; then
  echo "test.sh: installing Python's prometheus_client" >&2
  # pip where python3 is one of its own (pyenv, a venv); Debian's package for the system's.
  python3 -m pip install --quiet prometheus-client 2>/dev/null ||
    { command -v apt-get >/dev/null && [ "$(id -u)" -eq 0 ] &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-prometheus-client >/dev/null; } ||
    true
  if ! python3 -c 'import prometheus_client' 2>/dev/null; then
    echo "test.sh: Python's prometheus_client is required: python3 -m pip install prometheus-client" >&2
    exit 1
  fi
fi
promtool --version 2>&1 | sed -n 1p

started=$SECONDS
cargo fmt --check
cargo clippy --all-targets -- -D warnings
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test 2>&1 | tee "$log"
passed=$(grep -Eo '[0-9]+ passed' "$log" | awk '{n += $1} END {print n + 0}')
echo "test.sh: fmt, clippy and $passed tests passed in $((SECONDS - started)) s"
