# syntax=docker/dockerfile:1
# mailroom container image: `docker build -t mailroom .`, then e.g.
#   docker run --rm -e DATABASE_URL=... -e AMQP_URL=... -e SMTP_URL=... -e MAILROOM_FROM=... mailroom
# The default command is `worker`; pass another (`migrate`, `relay`, `run`, `serve`, ...) to
# override it. For `serve`/`run`, set MAILROOM_HTTP_ADDR=0.0.0.0:8080 (and MAILROOM_API_TOKEN):
# its default is loopback. docs/DEPLOY.md has the process layout, probes and versions.
#
# The debug info lives apart from the binary: the image ships it without its debug sections,
# 25 MB instead of 127 MB (measured on x86_64 at 0.1.0; symbols stay, for backtraces).
# `docker build --target debuginfo --output type=local,dest=out .` writes out/mailroom.debug,
# which gdb finds through the binary's debuglink.

# --- build ------------------------------------------------------------------------------------
# The toolchain is pinned (the one CI and the README's benchmarks use); raise it on purpose, not
# whenever a new Rust is released. `rust-version` in Cargo.toml is the oldest that builds.
# Pinned by exact tag only: the tag is rebuilt on Debian's point releases under new digests.
FROM rust:1.95.0-bookworm AS build
WORKDIR /src
# What the binary is built from, by name. The workspace's other members (the test kit and the
# benchmark) are not built, but cargo reads their manifests: those come in, their sources are
# empty stubs (.dockerignore leaves tests/ and benches/ out of the context).
COPY Cargo.toml Cargo.lock ./
COPY tests/kit/Cargo.toml tests/kit/
COPY benches/bench/Cargo.toml benches/bench/
RUN mkdir -p tests/kit/src benches/bench/src \
    && touch tests/kit/src/lib.rs benches/bench/src/lib.rs benches/bench.rs
COPY src src
COPY migrations migrations
# A plain `cargo build`: no failpoints (they exist only under `cargo test`, src/failpoint.rs).
# Cache mounts keep the crate registry and build artifacts between builds (BuildKit). The
# target directory is a mount, so the binary is copied out in the same step. Cargo's release
# profile keeps line tables (for local profiling and readable backtraces); here they move to
# mailroom.debug, and the binary keeps its symbol table and a debuglink to that file.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
    && mkdir /out \
    && objcopy --only-keep-debug target/release/mailroom /out/mailroom.debug \
    && objcopy --strip-debug --add-gnu-debuglink=/out/mailroom.debug \
        target/release/mailroom /out/mailroom

# --- debug info (not in the image; see the top) --------------------------------------------------
FROM scratch AS debuginfo
COPY --from=build /out/mailroom.debug /mailroom.debug

# --- runtime ----------------------------------------------------------------------------------
# debian:bookworm-20260918-slim, by the digest of its multi-platform index
# (docker-library/repo-info, repos/debian/remote/bookworm-20260918-slim.md).
FROM debian:bookworm-20260918-slim@sha256:3783cc01769c7b2b1b83a5c5ad96c815348e28ed7da68e2e3687004faa906251 AS runtime
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="mailroom" \
      org.opencontainers.image.description="Gets email out of a web application's database transaction and into the inbox once: transactional outbox, relay, idempotent worker." \
      org.opencontainers.image.licenses="MIT OR Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.documentation="docs/DEPLOY.md" \
      org.opencontainers.image.base.name="docker.io/library/debian:bookworm-20260918-slim" \
      org.opencontainers.image.base.digest="sha256:3783cc01769c7b2b1b83a5c5ad96c815348e28ed7da68e2e3687004faa906251"
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 mailroom \
    && useradd --system --uid 10001 --gid mailroom --home-dir /app --no-create-home \
        --shell /usr/sbin/nologin mailroom
COPY --from=build /out/mailroom /usr/local/bin/mailroom
# The health check: GET /healthz on the process's own listener, MAILROOM_METRICS_ADDR (worker,
# relay, run), else MAILROOM_HTTP_ADDR (serve), on loopback. Bash's /dev/tcp: no curl needed.
COPY --chmod=0755 <<'EOF' /usr/local/bin/mailroom-healthcheck
#!/bin/bash
probe() {
    local port=${1##*:} status=
    [[ -n $port ]] || return 1
    {
        printf 'GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
        read -r _ status _ <&3
    } 3<>"/dev/tcp/127.0.0.1/$port" || return 1
    [[ $status == 200 ]]
}
probe "${MAILROOM_METRICS_ADDR:-}" 2>/dev/null || probe "${MAILROOM_HTTP_ADDR:-127.0.0.1:8080}"
EOF
WORKDIR /app
# Owned by root, read-only for the service; mount a volume over /app/templates to change them.
COPY templates /app/templates
COPY migrations /app/migrations
ENV MAILROOM_TEMPLATES=/app/templates
# worker, relay and run serve /metrics and /healthz here (the HTTP API of serve/run: 8080).
ENV MAILROOM_METRICS_ADDR=0.0.0.0:9090
EXPOSE 9090 8080
# Liveness, not readiness: a database or broker outage is not cured by restarting mailroom.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/mailroom-healthcheck"]
# Numeric, so that orchestrators can check runAsNonRoot; 10001 is the user `mailroom`.
USER 10001:10001
ENTRYPOINT ["mailroom"]
CMD ["worker"]
