# syntax=docker/dockerfile:1
# mailroom container image: `docker build -t mailroom .`, then e.g.
#   docker run --rm -e DATABASE_URL=... -e AMQP_URL=... -e SMTP_URL=... -e MAILROOM_FROM=... mailroom
# The default command is `worker`; pass another (`migrate`, `relay`, `run`, `serve`, ...) to
# override it. For `serve`/`run`, set MAILROOM_HTTP_ADDR=0.0.0.0:8080: its default is loopback.

# --- build ------------------------------------------------------------------------------------
# The toolchain is pinned (the one CI and the README's benchmarks use); raise it on purpose, not
# whenever a new Rust is released. `rust-version` in Cargo.toml is the oldest that builds.
FROM rust:1.95.0-bookworm AS build
WORKDIR /src
COPY . .
# A plain `cargo build`: no failpoints (they exist only under `cargo test`, src/failpoint.rs).
# Cache mounts keep the crate registry and build artifacts between builds (BuildKit). The
# target directory is a mount, so the binary is copied out in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
    && cp target/release/mailroom /usr/local/bin/mailroom

# --- runtime ----------------------------------------------------------------------------------
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 mailroom \
    && useradd --system --uid 10001 --gid mailroom --home-dir /app --no-create-home \
        --shell /usr/sbin/nologin mailroom
COPY --from=build /usr/local/bin/mailroom /usr/local/bin/mailroom
WORKDIR /app
# Owned by root, read-only for the service; mount a volume over /app/templates to change them.
COPY templates /app/templates
COPY migrations /app/migrations
ENV MAILROOM_TEMPLATES=/app/templates
# Numeric, so that orchestrators can check runAsNonRoot; 10001 is the user `mailroom`.
USER 10001:10001
ENTRYPOINT ["mailroom"]
CMD ["worker"]
