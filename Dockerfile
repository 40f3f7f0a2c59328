# syntax=docker/dockerfile:1
# Build: docker build -t colloquy .
# Run:   docker run -p 8080:8080 -v colloquy-data:/data -e COLLOQUY_TOKENS=me:secret colloquy
#
# Stages: `build` compiles the binary; `runtime-base` is the runtime image without it; the last
# stage (the default target) copies the binary out of `build`. The `prebuilt` target takes an
# already built binary named `colloquy` at the root of its build context instead, for machines
# without a Rust toolchain image (.ci/container.sh builds it that way):
#   docker build --target prebuilt -f Dockerfile -t colloquy <folder holding colloquy>
# .dockerignore admits only what `build` copies (tests/it/container.rs checks that it suffices).

FROM rust:1-slim-bookworm AS build
# The slim toolchain image has gcc but not make, which jemalloc's build (tikv-jemalloc-sys) runs.
RUN apt-get update \
 && apt-get install -y --no-install-recommends make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
# Cargo.toml patches sled from vendor/sled.
COPY vendor ./vendor
COPY src ./src
COPY benches ./benches
# Debug line tables (the release profile's) stay out of the image: about 100 MB of the binary's 125.
# Symbols stay, so a panic's backtrace still names its functions.
ENV CARGO_PROFILE_RELEASE_STRIP=debuginfo
RUN cargo build --release --locked --bin colloquy

FROM debian:bookworm-slim AS runtime-base
# No packages added: TLS roots are compiled in (webpki-roots) and the HEALTHCHECK is the binary's.
RUN groupadd --system --gid 10001 colloquy \
 && useradd --system --uid 10001 --gid colloquy --no-create-home --shell /usr/sbin/nologin colloquy \
 && mkdir -p /data && chown colloquy:colloquy /data
USER colloquy
# All interfaces inside the container: without tokens it starts only with
# COLLOQUY_ALLOW_UNAUTHENTICATED=1 (the environment form of --allow-unauthenticated).
ENV COLLOQUY_LISTEN=0.0.0.0:8080 \
    COLLOQUY_GRPC_LISTEN=0.0.0.0:8081 \
    COLLOQUY_DATA=/data \
    COLLOQUY_LOG_FORMAT=json
VOLUME /data
# HTTP (JSON-RPC, HTTP+JSON, the card, health) and the gRPC binding.
EXPOSE 8080 8081
STOPSIGNAL SIGTERM
# GET /healthz on the port COLLOQUY_LISTEN names (it stays there even when
# COLLOQUY_ADMIN_LISTEN moves /metrics elsewhere); exit 0 only on 200.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["colloquy", "healthcheck"]
ENTRYPOINT ["colloquy"]
CMD ["serve"]

FROM runtime-base AS prebuilt
COPY colloquy /usr/local/bin/colloquy

FROM runtime-base AS runtime
COPY --from=build /src/target/release/colloquy /usr/local/bin/colloquy
