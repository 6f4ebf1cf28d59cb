#!/usr/bin/env bash
# The image, built from the Dockerfile and run, as `docker build .` and `docker run` would, with
# no container engine: Debian's buildah (no daemon) builds it and runs its entrypoint.
#
#   scripts/test_image.sh            # as root, on Debian 12 (installs what it needs)
#   scripts/test_image.sh --no-build # the checks again, on the image the last run built
#   TOLLGATE_IMAGE_CACHE=DIR ...     # where the stand-in images and the layer cache live
#                                    # (default /var/tmp/tollgate-image; delete it to start cold)
#
# No registry is reachable here, so the Dockerfile's base images are replaced by stand-ins made
# once from Debian's packages (debootstrap) and kept in the cache:
#   - rust:<version>-bookworm: Debian 12 with gcc and libc6-dev (the linker), the Rust toolchain
#     of the version the FROM line names (taken from this machine's rustup) and this machine's
#     CA certificates (crates are fetched inside the build, through whatever this machine trusts);
#   - gcr.io/distroless/cc-debian12:nonroot: only what that image has: glibc, libgcc, libssl, CA
#     certificates, tzdata, netbase, /etc/passwd with nonroot (65532), no shell, no package manager.
# The build reads a copy of the Dockerfile whose FROM image names, and nothing else, point at the
# stand-ins (checked). Then, in a network namespace of its own (so 8080 and 9091 are the ports the
# image says, whatever else runs on this machine) with Redis and a backend beside it, the image's
# entrypoint runs as the image's user with the compose file's environment, and the script checks:
# it serves, it refuses past the budget, `tollgate healthcheck` passes inside and fails when the
# admin listener is not where its environment says, SIGTERM drains; the image's user, ports,
# stop signal, health check and entrypoint are the Dockerfile's; no shell is in the image; the
# compose and Kubernetes examples agree with the image (ports, user, probe paths, their
# environments validated by the image's own `tollgate --check-config`). Its size and build time are
# printed.
#
# Not part of scripts/test.sh: it needs root (chroot, mounts, a network namespace), Debian's
# archive and crates.io, a few GB of disk, and about 10 minutes cold on two cores (README.md,
# docs/deploy/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
build=1
case "${1:-}" in
  "") ;;
  --no-build) build=0 ;;
  *)
    echo "usage: $0 [--no-build]" >&2
    exit 2
    ;;
esac
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
me=$(basename "$0")

say() { echo "$me: $*"; }
fail() {
  echo "$me: FAILED: $*" >&2
  exit 1
}

# --- what this needs --------------------------------------------------------------------------

[ "$(uname -s)" = Linux ] || fail "Linux only (chroot, mounts, network namespaces)"
[ "$(id -u)" -eq 0 ] || fail "run as root: buildah's chroot isolation, debootstrap and the network namespace need it"
missing=()
for need in buildah:buildah debootstrap:debootstrap curl:curl python3:python3 redis-server:redis-server \
  redis-cli:redis-tools ip:iproute2 readelf:binutils; do
  command -v "${need%%:*}" >/dev/null || missing+=("${need#*:}")
done
install_missing "${missing[@]}"

cache=${TOLLGATE_IMAGE_CACHE:-/var/tmp/tollgate-image}
mkdir -p "$cache"
# One run at a time per cache: two would share the stand-ins' making, the container names and
# the network namespace.
exec 9>"$cache/lock"
flock -n 9 || fail "another run holds $cache/lock"
image=localhost/tollgate:image-test
container=tollgate-image-test
netns=tollgate-image-test

# overlay where the kernel mounts it (a fresh Debian machine as root): layers are shared, not
# copied. vfs otherwise (inside another container), slower and a full copy per layer. The store
# keeps the driver it was made with.
if [ ! -e "$cache/driver" ]; then
  probe=$(mktemp -d "$cache/probe.XXXXXX")
  mkdir "$probe"/{lower,upper,work,merged}
  if mount -t overlay overlay -o "lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work" \
    "$probe/merged" 2>/dev/null; then
    umount "$probe/merged"
    echo overlay >"$cache/driver"
  else
    echo vfs >"$cache/driver"
  fi
  rm -rf "$probe"
fi
driver=$(cat "$cache/driver")
# A store of its own under the cache: nothing shared with other users of buildah or podman.
buildah_args=(--root "$cache/storage" --runroot "$cache/run" --storage-driver "$driver")
bh() { buildah "${buildah_args[@]}" "$@"; }

# --- cleanup: ours only, on any exit; and what a killed earlier run left -----------------------

work=$(mktemp -d /tmp/tollgate-image.XXXXXX)
pids=()
cleanup() {
  local status=$? pid
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  bh rm "$container" "$container-check" "$container-standin" >/dev/null 2>&1 || true
  ip netns del "$netns" 2>/dev/null || true
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
bh rm "$container" "$container-check" "$container-standin" >/dev/null 2>&1 || true
ip netns del "$netns" 2>/dev/null || true

# --- the Dockerfile's base images -------------------------------------------------------------

# FROM [--flags] IMAGE [AS NAME]: the images that are not earlier stages.
mapfile -t bases < <(awk '
  toupper($1) == "FROM" {
    i = 2; while ($i ~ /^--/) i++
    if (!($i in stage)) print $i
    if (tolower($(i + 1)) == "as") stage[$(i + 2)] = 1
  }' Dockerfile)
rust_base="" runtime_base=""
for base in "${bases[@]}"; do
  case "$base" in
    rust:*) rust_base=$base ;;
    gcr.io/distroless/cc-debian12:*) runtime_base=$base ;;
    *) fail "Dockerfile: a base image this script has no stand-in for: $base" ;;
  esac
done
[ -n "$rust_base" ] || fail "Dockerfile: no rust:VERSION-bookworm builder stage"
[ -n "$runtime_base" ] || fail "Dockerfile: no gcr.io/distroless/cc-debian12 runtime stage"
rust_tag=${rust_base#rust:}
rust_version=${rust_tag%%-*}
suite=${rust_tag#"$rust_version"-}
[ "$suite" = bookworm ] || fail "Dockerfile: the stand-ins are Debian 12 (bookworm); $rust_base is not"
rust_standin=localhost/tollgate-standin/rust:$rust_tag
runtime_standin=localhost/tollgate-standin/distroless-cc-debian12:nonroot
# Bumped when the stand-ins' recipe below changes, so cached ones are rebuilt.
standin_recipe=1

standin_current() {
  [ "$(bh inspect --type image --format '{{index .OCIv1.Config.Labels "tollgate.standin.recipe"}}' "$1" 2>/dev/null)" = "$standin_recipe" ]
}

# --- stand-ins, made once ---------------------------------------------------------------------

rootfs=$cache/rootfs
debian_rootfs() {
  [ -e "$rootfs/.complete" ] && return 0
  say "debootstrap --variant=minbase $suite (once; kept in $cache)"
  rm -rf "$rootfs.partial"
  nice debootstrap --variant=minbase --include=ca-certificates,gcc,libc6-dev,libssl3,tzdata,netbase \
    "$suite" "$rootfs.partial" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$work/debootstrap.log" 2>&1 ||
    { tail -20 "$work/debootstrap.log" >&2; fail "debootstrap $suite (log above)"; }
  rm -rf "$rootfs"
  mv "$rootfs.partial" "$rootfs"
  touch "$rootfs/.complete"
}

rust_standin() {
  standin_current "$rust_standin" && return 0
  local sysroot ctr mnt started=$SECONDS
  # The toolchain the tests use: rustup's of that version (this machine has no other way to get
  # one: rustup's own server is not reachable from here).
  sysroot=$(rustc "+$rust_version" --print sysroot 2>/dev/null) ||
    fail "Rust $rust_version (the Dockerfile's) is not installed: rustup toolchain install $rust_version"
  [ "$("$sysroot/bin/rustc" --version | awk '{print $2}')" = "$rust_version" ] ||
    fail "$sysroot/bin/rustc is not Rust $rust_version"
  debian_rootfs
  bh rmi "$rust_standin" >/dev/null 2>&1 || true
  say "making the stand-in for $rust_base (Debian $suite, gcc, Rust $rust_version from $sysroot)"
  ctr=$(bh from --name "$container-standin" scratch)
  mnt=$(bh mount "$ctr")
  tar -C "$rootfs" --exclude=./.complete -cf - . | tar -C "$mnt" -xf -
  # As the official image: the toolchain on PATH, cargo's home in /usr/local/cargo (where
  # `cargo install` puts cargo-chef). Not its documentation (800 MB).
  mkdir -p "$mnt/usr/local/rust" "$mnt/usr/local/cargo/bin"
  tar -C "$sysroot" -cf - bin lib libexec | tar -C "$mnt/usr/local/rust" -xf -
  cp /etc/ssl/certs/ca-certificates.crt "$mnt/etc/ssl/certs/ca-certificates.crt"
  bh umount "$ctr" >/dev/null
  bh config --env RUSTUP_HOME=/usr/local/rustup --env CARGO_HOME=/usr/local/cargo \
    --env PATH=/usr/local/cargo/bin:/usr/local/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env RUST_VERSION="$rust_version" --cmd bash --label tollgate.standin.recipe="$standin_recipe" "$ctr"
  bh commit --quiet --format docker --rm "$ctr" "$rust_standin" >/dev/null
  say "stand-in $rust_standin made in $((SECONDS - started)) s"
}

runtime_standin() {
  standin_current "$runtime_standin" && return 0
  local ctr mnt package started=$SECONDS
  debian_rootfs
  bh rmi "$runtime_standin" >/dev/null 2>&1 || true
  say "making the stand-in for $runtime_base (Debian $suite's packages, as distroless is made)"
  ctr=$(bh from --name "$container-standin" scratch)
  mnt=$(bh mount "$ctr")
  # Debian 12 merges /usr: the top-level links first, so the packages' /lib/... lands in usr/lib.
  mkdir -p "$mnt/usr/bin" "$mnt/usr/sbin" "$mnt/usr/lib" "$mnt/usr/lib64"
  tar -C "$rootfs" -cf - bin lib lib64 sbin | tar -C "$mnt" -xf -
  # What distroless' cc-debian12 is made of, file by file as dpkg installed them: no shell, no
  # dpkg, no apt, no coreutils.
  for package in base-files netbase tzdata libc6 libgcc-s1 libssl3; do
    dpkg-query --admindir="$rootfs/var/lib/dpkg" -L "$package" | sed -n 's#^/\(.\)#\1#p'
  done | sort -u >"$work/runtime.files"
  tar -C "$rootfs" --no-recursion -T "$work/runtime.files" -cf - |
    tar -C "$mnt" --keep-directory-symlink -xf -
  mkdir -p "$mnt/etc/ssl/certs" "$mnt/home/nonroot" "$mnt/tmp"
  cp "$rootfs/etc/ssl/certs/ca-certificates.crt" "$mnt/etc/ssl/certs/"
  cat >"$mnt/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
  cat >"$mnt/etc/group" <<'EOF'
root:x:0:
nobody:x:65534:
tty:x:5:
staff:x:50:
nonroot:x:65532:
EOF
  chown 65532:65532 "$mnt/home/nonroot"
  chmod 1777 "$mnt/tmp"
  bh umount "$ctr" >/dev/null
  # distroless' :nonroot configuration.
  bh config --user 65532 --workingdir /home/nonroot \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    --label tollgate.standin.recipe="$standin_recipe" "$ctr"
  bh commit --quiet --format docker --rm "$ctr" "$runtime_standin" >/dev/null
  say "stand-in $runtime_standin made in $((SECONDS - started)) s"
}

rust_standin
runtime_standin
rm -rf "$rootfs"

# --- the image --------------------------------------------------------------------------------

# The Dockerfile with the two base images' names replaced, and only those.
dockerfile=$work/Dockerfile
awk -v rust="$rust_base" -v runtime="$runtime_base" \
  -v rust_standin="$rust_standin" -v runtime_standin="$runtime_standin" '
  toupper($1) == "FROM" { i = 2; while ($i ~ /^--/) i++
    if ($i == rust) { $i = rust_standin }
    else if ($i == runtime) { $i = runtime_standin } }
  { print }' Dockerfile >"$dockerfile"
changes=$(diff Dockerfile "$dockerfile" || true)
! grep '^[<>]' <<<"$changes" | grep -v -i '^[<>] FROM ' >/dev/null ||
  fail "the Dockerfile's copy differs in more than its FROM lines: $changes"
[ "$(grep -c '^>' <<<"$changes")" = "${#bases[@]}" ] ||
  fail "expected ${#bases[@]} FROM lines replaced: $changes"

if [ "$build" = 0 ]; then
  bh inspect --type image "$image" >/dev/null 2>&1 || fail "--no-build: no image $image yet: run without it first"
  say "not building: checking $image as the last run built it"
  build_seconds="(not built)"
else
  say "building the image ($driver storage, layers cached in $cache; the first build compiles cargo-chef and every dependency)"
  started=$SECONDS
  nice buildah "${buildah_args[@]}" bud --isolation chroot --format docker --layers --pull=never \
    -f "$dockerfile" -t "$image" . >"$work/build.log" 2>&1 ||
    { tail -40 "$work/build.log" >&2; fail "buildah bud (the last lines of its log above)"; }
  build_seconds="$((SECONDS - started)) s"
fi
bh inspect --type image "$image" >"$work/image.json"
bh inspect --type image "$runtime_standin" >"$work/runtime.json"

# --- the image's configuration is the Dockerfile's ---------------------------------------------

# Prints `user entrypoint...` and `healthcheck...` lines for the steps below, after checking.
python3 - Dockerfile "$work/image.json" "$work/runtime.json" >"$work/config" <<'EOF' || fail "the image's configuration (above)"
import json, re, shlex, sys

dockerfile, image, runtime = sys.argv[1:]
instructions = []
for line in re.sub(r"\\\n", " ", open(dockerfile).read()).splitlines():
    line = line.strip()
    if line and not line.startswith("#"):
        word, _, rest = line.partition(" ")
        instructions.append((word.upper(), rest.strip()))
final = instructions[max(i for i, (word, _) in enumerate(instructions) if word == "FROM"):]
said = lambda word: [rest for w, rest in final if w == word]
config = json.load(open(image))["Docker"]["config"]
errors = []

def expect(what, got, want):
    if got != want:
        errors.append(f"{what}: the image has {got!r}, the Dockerfile says {want!r}")

expect("USER", config.get("User"), said("USER")[-1])
expect("EXPOSE", sorted(config.get("ExposedPorts", {})),
       sorted(f"{p}/tcp" if "/" not in p else p for rest in said("EXPOSE") for p in rest.split()))
expect("STOPSIGNAL", config.get("StopSignal"), said("STOPSIGNAL")[-1])
expect("ENTRYPOINT", config.get("Entrypoint"), json.loads(said("ENTRYPOINT")[-1]))
check = said("HEALTHCHECK")[-1]
options, _, command = check.partition(" CMD ")
units = {"ms": 10**6, "s": 10**9, "m": 60 * 10**9}
def nanoseconds(text):
    number, unit = re.fullmatch(r"(\d+)(ms|s|m)", text).groups()
    return int(number) * units[unit]
want = {"Test": ["CMD"] + json.loads(command)}
for option in shlex.split(options):
    name, _, value = option.lstrip("-").partition("=")
    key = {"interval": "Interval", "timeout": "Timeout", "start-period": "StartPeriod", "retries": "Retries"}[name]
    want[key] = int(value) if key == "Retries" else nanoseconds(value)
expect("HEALTHCHECK", config.get("Healthcheck"), want)
# The runtime's own settings are inherited (distroless' PATH, SSL_CERT_FILE).
base = json.load(open(runtime))["Docker"]["config"]
for variable in base.get("Env", []):
    if variable not in config.get("Env", []):
        errors.append(f"Env: the runtime's {variable} is lost")
if errors:
    print("\n".join(errors), file=sys.stderr)
    sys.exit(1)
print("user", config["User"])
print("entrypoint", shlex.join(config["Entrypoint"]))
print("healthcheck", shlex.join(config["Healthcheck"]["Test"][1:]))
print("ports", " ".join(sorted(p.split("/")[0] for p in config["ExposedPorts"])))
EOF
image_user=$(awk '$1 == "user" {print $2}' "$work/config")
read -r -a entrypoint <<<"$(sed -n 's/^entrypoint //p' "$work/config")"
read -r -a healthcheck <<<"$(sed -n 's/^healthcheck //p' "$work/config")"
read -r -a exposed <<<"$(sed -n 's/^ports //p' "$work/config")"
say "user $image_user, ports ${exposed[*]}, entrypoint ${entrypoint[*]}, health check ${healthcheck[*]}: as the Dockerfile says"

# --- the image's files: one binary on the runtime, no shell --------------------------------------

# No `--ulimit nofile=65536:65536` as compose asks: a hard limit above this machine's is refused
# here (tollgate raises its soft limit to the hard one by itself).
ctr=$(bh from --name "$container" --add-host redis:127.0.0.1 --add-host backend:127.0.0.1 "$image")
mnt=$(bh mount "$ctr")
shells=$(find "$mnt" \( -name sh -o -name bash -o -name dash -o -name busybox -o -name ash -o -name zsh \) \
  \( -type f -o -type l \) -printf '/%P\n')
[ -z "$shells" ] || fail "a shell in the runtime image: $shells"
if [ -e "$mnt/usr/bin/apt" ] || [ -e "$mnt/usr/bin/dpkg" ]; then fail "a package manager in the runtime image"; fi
binary_bytes=$(stat -c %s "$mnt${entrypoint[0]}")
[ "$(stat -c %u "$mnt${entrypoint[0]}")" = 0 ] || fail "${entrypoint[0]} should be root's, not writable by $image_user"
# CARGO_PROFILE_RELEASE_STRIP=symbols, as the Dockerfile says.
readelf -S "$mnt${entrypoint[0]}" >"$work/sections"
! grep -q '\.symtab' "$work/sections" || fail "${entrypoint[0]} has a symbol table: not stripped"
bh umount "$ctr" >/dev/null
if bh run --isolation chroot "$ctr" -- /bin/sh -c true >/dev/null 2>&1; then
  fail "/bin/sh ran in the runtime image"
fi
image_bytes=$(bh images --format '{{.Size}}' "$image" | head -1)
runtime_size=$(bh images --format '{{.Size}}' "$runtime_standin" | head -1)

# --- run it: Redis, a backend and the image in a network namespace of their own -----------------

ip netns add "$netns"
ip netns exec "$netns" ip link set lo up
in_ns() { ip netns exec "$netns" "$@"; }
in_ns_bh() { in_ns buildah "${buildah_args[@]}" "$@"; }
ns_curl() { in_ns curl --noproxy '*' "$@"; }
# listening, but inside the namespace.
ns_listening() { in_ns bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }
ns_wait_for_port() {
  local _
  for _ in $(seq 1 100); do
    ns_listening "$1" && return 0
    sleep 0.1
  done
  cat "$work/$2.log" >&2 || true
  fail "$2 did not listen on 127.0.0.1:$1 (its log above)"
}

# compose's redis: no persistence. Its backend: any path 200; /slow answers after 2 s.
# Started with `ip netns exec` itself, not a shell function: $! is then the program's own pid
# (ip execs it), so the cleanup's kill reaches it; and without the lock's descriptor.
ip netns exec "$netns" redis-server --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
  >"$work/redis.log" 2>&1 9>&- &
pids+=($!)
cat >"$work/backend.py" <<'EOF'
import http.server, time
class Backend(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/slow":
            time.sleep(2)
        body = f"backend saw {self.path}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", 80), Backend).serve_forever()
EOF
# The interpreter itself, not a wrapper (pyenv's shims) that would outlive a kill of its pid.
python=$(python3 -c 'import sys; print(sys.executable)')
ip netns exec "$netns" "$python" "$work/backend.py" >"$work/backend.log" 2>&1 9>&- &
pids+=($!)
ns_wait_for_port 6379 redis
ns_wait_for_port 80 backend

# The environment of compose's tollgate service, as written there.
compose=docs/deploy/docker-compose.yml
mapfile -t compose_env < <(awk '
  /^  [a-z]/ { service = $1 }
  service == "tollgate:" && /^    [a-z_]+:/ { in_env = ($1 == "environment:") ; next }
  service == "tollgate:" && in_env && /^      - / { sub(/^      - /, ""); print }' "$compose")
[ "${#compose_env[@]}" -gt 0 ] || fail "$compose: no environment for tollgate found"
env_args=()
for variable in "${compose_env[@]}"; do env_args+=(--env "$variable"); done
say "running ${entrypoint[*]} as $image_user with $compose's environment: ${compose_env[*]}"

ip netns exec "$netns" buildah "${buildah_args[@]}" run --isolation chroot --user "$image_user" \
  "${env_args[@]}" "$ctr" -- "${entrypoint[@]}" >"$work/tollgate.log" 2>&1 9>&- &
runner=$!
pids+=("$runner")
ns_wait_for_port 8080 tollgate
ns_wait_for_port 9091 tollgate

# tollgate itself: the process under the runner whose name is tollgate.
tollgate_pid=""
descendants() { local child; for child in $(ps -o pid= --ppid "$1"); do echo "$child"; descendants "$child"; done; }
for pid in $(descendants "$runner"); do
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = tollgate ] && tollgate_pid=$pid
done
[ -n "$tollgate_pid" ] || fail "no tollgate process under buildah run $runner"
uid=$(awk '/^Uid:/ {print $2}' "/proc/$tollgate_pid/status")
gid=$(awk '/^Gid:/ {print $2}' "/proc/$tollgate_pid/status")
[ "$uid:$gid" = "$image_user" ] || [ "$uid" = "$image_user" ] || fail "tollgate runs as $uid:$gid, the image says $image_user"
say "tollgate (pid $tollgate_pid) runs as $uid:$gid"

# It serves: the backend's answer with the rate-limit headers.
ns_curl -sS -D "$work/first.headers" -o "$work/first.body" http://127.0.0.1:8080/first ||
  fail "GET / through the image"
grep -q '^HTTP/1.1 200' "$work/first.headers" || fail "GET /first: $(head -1 "$work/first.headers")"
grep -q 'backend saw /first' "$work/first.body" || fail "GET /first did not reach the backend: $(cat "$work/first.body")"
grep -qi '^x-ratelimit-limit: 10' "$work/first.headers" || fail "GET /first: no X-RateLimit-Limit: 10"
say "serves: 200 from the backend, X-RateLimit-Limit: 10"

# Past the budget (the default general rule, token_bucket 10 at 1/s): 429 with Retry-After.
# Nine more tokens, and one more for each second the loop takes (a busy machine), no more.
codes=""
loop_started=$SECONDS
for _ in $(seq 1 12); do
  codes+="$(ns_curl -sS -o /dev/null -w '%{http_code}' http://127.0.0.1:8080/) "
done
refills=$((SECONDS - loop_started + 1))
allowed=$(grep -o 200 <<<"$codes" | wc -l)
if [[ "$codes" != "200 200 200 200 200 200 200 200 200 "* ]] || [ "$allowed" -gt $((9 + refills)) ] ||
  [[ "$codes" != *429* ]]; then
  fail "expected 9 200s (and at most $refills refilled) then 429s: $codes"
fi
ns_curl -sS -D "$work/refused.headers" -o /dev/null http://127.0.0.1:8080/
grep -q '^HTTP/1.1 429' "$work/refused.headers" || fail "not refused: $(cat "$work/refused.headers")"
grep -qi '^retry-after: ' "$work/refused.headers" || fail "a refusal without Retry-After: $(cat "$work/refused.headers")"
# The budgets are in compose's Redis (REDIS_ADDR=redis:6379), not in tollgate's memory.
keys=$(in_ns redis-cli -p 6379 dbsize)
[ "$keys" -gt 0 ] || fail "no key in Redis: REDIS_ADDR=redis:6379 was not used"
say "refuses past the budget: $codes-> 429 with Retry-After; $keys key(s) in Redis"

# The admin listener (ADMIN_BIND=0.0.0.0, as the compose file and the manifest set it): the
# Kubernetes probes' paths and the metrics.
manifest=docs/deploy/kubernetes.yaml
mapfile -t probe_paths < <(awk '/Probe:$/ {p = 1} p && /path:/ {print $2; p = 0}' "$manifest")
[ "${#probe_paths[@]}" -ge 2 ] || fail "$manifest: expected a liveness and a readiness probe path"
for path in "${probe_paths[@]}" /metrics; do
  code=$(ns_curl -sS -o "$work/admin.body" -w '%{http_code}' "http://127.0.0.1:9091$path")
  [ "$code" = 200 ] || fail "GET :9091$path: $code $(cat "$work/admin.body")"
done
grep -q '^tollgate_requests_total' "$work/admin.body" || fail "/metrics has no tollgate_requests_total"
say "admin: ${probe_paths[*]} /metrics answer 200"

# The image's HEALTHCHECK, run in the image as the image's user: passes beside a serving
# tollgate, fails (1) when the admin listener is not where the environment says.
bh from --name "$container-check" "$image" >/dev/null
status=0
in_ns_bh run --isolation chroot --user "$image_user" "${env_args[@]}" "$container-check" -- \
  "${healthcheck[@]}" >"$work/healthcheck.log" 2>&1 || status=$?
[ "$status" = 0 ] || fail "${healthcheck[*]} inside the image: exit $status: $(cat "$work/healthcheck.log")"
wrong_port=9092
! ns_listening "$wrong_port" || fail "something listens on $wrong_port in the namespace"
status=0
in_ns_bh run --isolation chroot --user "$image_user" "${env_args[@]}" --env ADMIN_PORT=$wrong_port \
  "$container-check" -- "${healthcheck[@]}" >"$work/healthcheck.log" 2>&1 || status=$?
[ "$status" = 1 ] || fail "${healthcheck[*]} with ADMIN_PORT=$wrong_port: exit $status, expected 1: $(cat "$work/healthcheck.log")"
say "${healthcheck[*]}: 0 inside the image; 1 with ADMIN_PORT=$wrong_port ($(grep -m1 '^tollgate healthcheck' "$work/healthcheck.log"))"

# The examples' environments are configurations the image's binary accepts without a warning
# (a misspelt or unknown variable is one): compose's, and the Kubernetes ConfigMap's with its
# Secret filled and its rules file mounted where RULES_FILE says.
status=0
in_ns_bh run --isolation chroot --user "$image_user" "${env_args[@]}" "$container-check" -- \
  "${entrypoint[@]}" --check-config >"$work/check.log" 2>&1 || status=$?
[ "$status" = 0 ] || fail "$compose's environment: --check-config exit $status: $(cat "$work/check.log")"
mapfile -t k8s_env < <(awk '
  /^kind: ConfigMap/ { k = 1 } /^---/ { k = 0; d = 0 } /^metadata:/ && k { getline; name = $2 }
  k && name == "tollgate" && /^data:/ { d = 1; next }
  d && /^  [A-Z_]+:/ { key = $1; sub(/:$/, "", key); $1 = ""; v = substr($0, 2); gsub(/^"|"$/, "", v); print key "=" v }' "$manifest")
[ "${#k8s_env[@]}" -gt 0 ] || fail "$manifest: no ConfigMap data for tollgate found"
rules_file=$(printf '%s\n' "${k8s_env[@]}" | sed -n 's/^RULES_FILE=//p')
mkdir -p "$work/rules"
awk '/^  rules.toml: \|/ {r = 1; next} r && /^---/ {r = 0} r {sub(/^    /, ""); print}' "$manifest" >"$work/rules/$(basename "$rules_file")"
k8s_args=(--env KEY_HASH_SECRET=0123456789abcdef0123456789abcdef --env REDIS_PASSWORD=)
for variable in "${k8s_env[@]}"; do k8s_args+=(--env "$variable"); done
status=0
in_ns_bh run --isolation chroot --user "$image_user" "${k8s_args[@]}" \
  --volume "$work/rules:$(dirname "$rules_file"):ro" "$container-check" -- \
  "${entrypoint[@]}" --check-config >"$work/check.log" 2>&1 || status=$?
[ "$status" = 0 ] || fail "$manifest's environment: --check-config exit $status: $(cat "$work/check.log")"
say "--check-config in the image: compose's and the Kubernetes ConfigMap's environments valid, no warnings"

# The examples' ports, user and health check against the image's.
k8s_ports=$(awk '/containerPort:/ {print $2}' "$manifest" | sort -n | xargs)
[ "$k8s_ports" = "$(printf '%s\n' "${exposed[@]}" | sort -n | xargs)" ] ||
  fail "$manifest: containerPorts $k8s_ports, the image exposes ${exposed[*]}"
compose_ports=$(awk '/^  tollgate:/ {t = 1} /^  [a-z]+:$/ && !/tollgate/ {t = 0}
  t && /- "[0-9.:]+"/ {gsub(/[-" ]/, ""); n = split($0, a, ":"); print a[n]}' "$compose" | sort -n | xargs)
[ "$compose_ports" = "$k8s_ports" ] || fail "$compose publishes container ports $compose_ports, the image exposes ${exposed[*]}"
k8s_user=$(awk '/runAsUser:/ {u = $2} /runAsGroup:/ {g = $2} END {print u ":" g}' "$manifest")
[ "$k8s_user" = "$image_user" ] || [ "${k8s_user%%:*}" = "$image_user" ] ||
  fail "$manifest runs as $k8s_user, the image's user is $image_user"
grep -q "test: \[\"CMD\", \"${healthcheck[0]}\", \"${healthcheck[1]}\"\]" "$compose" ||
  fail "$compose: the health check is not the image's (${healthcheck[*]})"
say "compose and Kubernetes: ports $k8s_ports, user $k8s_user, health check as the image's"

# SIGTERM drains: a request in flight (the backend takes 2 s) is answered, new connections are
# refused, /readyz says 503 meanwhile, and tollgate exits 0 well before SHUTDOWN_TIMEOUT_MS.
sleep 2 # a token back for the slow request (1 a second)
ip netns exec "$netns" curl --noproxy '*' -sS -o "$work/slow.body" -w '%{http_code}' \
  http://127.0.0.1:8080/slow >"$work/slow.code" 2>&1 9>&- &
slow=$!
pids+=("$slow")
sleep 0.5
kill -TERM "$tollgate_pid"
stopped=$(date +%s%N)
sleep 0.3
readyz=$(ns_curl -sS -o /dev/null -w '%{http_code}' http://127.0.0.1:9091/readyz 2>/dev/null || true)
if ns_curl -sS -o /dev/null --max-time 2 http://127.0.0.1:8080/ 2>/dev/null; then
  fail "a new request was served after SIGTERM"
fi
[ "$readyz" = 503 ] || fail "/readyz during the drain: ${readyz:-no answer}, expected 503"
wait "$slow" || fail "the request in flight at SIGTERM failed: $(cat "$work/slow.code")"
[ "$(cat "$work/slow.code")" = 200 ] || fail "the request in flight at SIGTERM: $(cat "$work/slow.code")"
status=0
wait "$runner" || status=$?
[ "$status" = 0 ] || fail "tollgate exited $status after SIGTERM; its log: $(tail -5 "$work/tollgate.log")"
drain_ms=$((($(date +%s%N) - stopped) / 1000000))
say "SIGTERM: the request in flight answered 200, new connections refused, /readyz 503 meanwhile, exit 0 ${drain_ms} ms after SIGTERM"

say "image $image: $image_bytes (runtime stand-in $runtime_size, binary $((binary_bytes / 1024 / 1024)) MB); built in $build_seconds; cache $(du -sh "$cache" | cut -f1) in $cache"
echo "$me: all checks passed"
