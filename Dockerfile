# docker build -t tollgate . && docker run -e BACKEND_URL=http://host.docker.internal:8000 -e ADMIN_BIND=0.0.0.0 -p 8080:8080 -p 127.0.0.1:9091:9091 tollgate
#
# Three build stages: cargo-chef turns the manifests into a recipe, the recipe's dependencies
# are compiled in a layer of their own (rebuilt only when Cargo.toml, Cargo.lock or the set of
# targets changes), then tollgate itself. The runtime image is distroless: glibc, libgcc and
# CA certificates, no shell, no package manager, one stripped binary, a non-root user.
# A compose file, a Kubernetes manifest and a Grafana dashboard: docs/deploy/.
# scripts/test_image.sh builds this file with buildah (stand-ins for the two base images, made from
# Debian's packages) and runs the image: docs/deploy/README.md says what it checks.

# The toolchain tollgate is developed and tested with; bump it together with the CI toolchain.
FROM rust:1.95.0-bookworm AS chef
RUN cargo install cargo-chef --locked --version 0.1.78
# Symbols stripped at link time: a smaller image and nothing useful lost (panics still print
# their message; backtraces would show no names). Set here, before `cook`, so the dependency
# layer and the final build use one profile and the cached layer is reused.
ENV CARGO_PROFILE_RELEASE_STRIP=symbols
WORKDIR /src

FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS builder
COPY --from=planner /src/recipe.json recipe.json
RUN cargo chef cook --release --locked --bin tollgate --recipe-path recipe.json
# The whole context (see .dockerignore): src/ and the Lua scripts that src/ embeds with
# include_str!, plus whatever targets Cargo.toml declares (benches/, examples/, tests/).
COPY . .
RUN cargo build --release --locked --bin tollgate

# Debian 12, as the builder, so the binary finds the glibc it was linked against. The tag says
# what the image is; the digest (the multi-platform index of cc-debian12:nonroot) is what is
# pulled, so a rebuild gets the same runtime until someone bumps it on purpose.
FROM gcr.io/distroless/cc-debian12:nonroot@sha256:9dac0a79194e45a7da0158a9c6da57b217585af0786db3845d1f0ec1a0dd182f
COPY --from=builder /src/target/release/tollgate /usr/local/bin/tollgate
# Numeric, so Kubernetes' runAsNonRoot can verify it (this is distroless' "nonroot" user).
USER 65532:65532
# 8080: proxied traffic (PORT). 9091: the admin listener (ADMIN_PORT): /metrics, /healthz,
# /readyz. It listens on the container's loopback unless ADMIN_BIND=0.0.0.0 (needed for a
# published 9091, Kubernetes probes, Prometheus); publish it only where those can reach it.
EXPOSE 8080 9091
# tollgate drains in-flight requests on SIGTERM for up to SHUTDOWN_TIMEOUT_MS (default 8 s),
# inside `docker stop`'s default 10 s grace. Raising SHUTDOWN_TIMEOUT_MS means raising the
# grace too: `docker run --stop-timeout`, `docker stop -t`, compose's `stop_grace_period`.
STOPSIGNAL SIGTERM
# No shell in the image, so the check is the binary itself: `tollgate healthcheck` GETs
# /healthz on the admin listener it reads from the same environment (ADMIN_BIND, ADMIN_PORT;
# 0.0.0.0 is reached on loopback), and exits 0 or 1.
# (Docker and compose run this; Kubernetes ignores it and uses its own probes.)
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 CMD ["/usr/local/bin/tollgate", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/tollgate"]
