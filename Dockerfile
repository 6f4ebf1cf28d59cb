# docker build -t tollgate . && docker run -e BACKEND_URL=http://host.docker.internal:8000 -p 8080:8080 tollgate
#
# Three build stages: cargo-chef turns the manifests into a recipe, the recipe's dependencies
# are compiled in a layer of their own (rebuilt only when Cargo.toml, Cargo.lock or the set of
# targets changes), then tollgate itself. The runtime image is distroless: glibc, libgcc and
# CA certificates, no shell, no package manager, one binary, a non-root user.

FROM rust:1-bookworm AS chef
RUN cargo install cargo-chef --locked --version 0.1.78
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

# Debian 12, as the builder, so the binary finds the glibc it was linked against.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /src/target/release/tollgate /usr/local/bin/tollgate
# Numeric, so Kubernetes' runAsNonRoot can verify it (this is distroless' "nonroot" user).
USER 65532:65532
EXPOSE 8080
# tollgate drains in-flight requests on SIGTERM for up to SHUTDOWN_TIMEOUT_MS (default 10 s);
# give `docker stop` more than that (docker stop -t 15, or --stop-timeout on docker run).
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/tollgate"]
