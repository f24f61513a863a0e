# Multi-stage build: compile in the Rust image, run as a non-root user in a slim Debian.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY crates ./crates
COPY config ./config
COPY bench/criterion ./bench/criterion
COPY examples ./examples
COPY tests ./tests
RUN cargo build --release --locked --bin dedup-worker

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 dedup \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/dedup-worker --create-home dedup
COPY --from=build /src/target/release/dedup-worker /usr/local/bin/dedup-worker
COPY config/default.toml /etc/dedup-worker/default.toml
# Numeric, so Kubernetes' runAsNonRoot can check it (deploy/k8s runs as 10001:10001).
USER 10001:10001
WORKDIR /var/lib/dedup-worker
ENV DEDUP_LISTEN=0.0.0.0:8080
EXPOSE 8080
ENTRYPOINT ["dedup-worker"]
CMD ["serve"]
