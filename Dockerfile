# syntax=docker/dockerfile:1
# Build: docker build -t colloquy .
# Run:   docker run -p 8080:8080 -v colloquy-data:/data -e COLLOQUY_TOKENS=me:secret colloquy

FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
RUN cargo build --release --locked --bin colloquy

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin colloquy \
 && mkdir -p /data && chown colloquy:colloquy /data
COPY --from=build /src/target/release/colloquy /usr/local/bin/colloquy
USER colloquy
# All interfaces inside the container: without tokens it starts only with
# COLLOQUY_ALLOW_UNAUTHENTICATED=1 (the environment form of --allow-unauthenticated).
ENV COLLOQUY_LISTEN=0.0.0.0:8080 \
    COLLOQUY_DATA=/data \
    COLLOQUY_LOG_FORMAT=json
VOLUME /data
EXPOSE 8080
STOPSIGNAL SIGTERM
# /healthz stays on 8080 even when COLLOQUY_ADMIN_LISTEN moves /metrics to another address.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD curl -fsS http://127.0.0.1:8080/healthz || exit 1
ENTRYPOINT ["colloquy"]
CMD ["serve"]
