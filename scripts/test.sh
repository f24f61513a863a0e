#!/usr/bin/env bash
# Runs the whole test suite on this machine: PostgreSQL, RabbitMQ and Redis are expected on their
# standard local ports (started if they are installed but stopped); the Python packages the
# tests use (the official `stripe` library as an independent signer, the official `standardwebhooks`
# library as an independent verifier of what the HTTP sink signs, `cryptography` as an independent
# ed25519 signer and verifier for Standard Webhooks `v1a`, `moto[server]` as the SQS emulator,
# `slack_sdk` as Slack's signer, `paypalrestsdk` for the string PayPal signs, its pyOpenSSL pinned to
# one that keeps the installed `cryptography`) and the npm packages of GitHub's and Shopify's signers (under
# target/sender-sdks) are installed, moto_server is started on a free port for the run and stopped after (through
# scripts/moto_server.py, which closes a race of moto's that loses a sent message); Debian's
# prometheus and docker-compose are installed when missing (tests/it/operations/), chromium
# with its chromedriver (tests/it/console/), and openssl (tests/it/sink_auth/).
# It begins with the gates and the fast lane, which need no service: `cargo fmt --check`, clippy
# on every target with warnings denied, rustdoc with warnings denied, the book under docs/ built
# (mdbook, installed if missing) and every relative link of it and of the top-level pages checked
# (scripts/check_links.py), then the unit and property tests of the library (LINT=0 skips the gates; a test filter given as arguments skips the fast
# lane and runs `cargo test --locked FILTER…` alone).
# Then a fault soak of 60 s (bench/soak.sh; SOAK_SECONDS=0 skips it), and a fuzz smoke run:
# every cargo-fuzz target of fuzz/ for FUZZ_SECONDS (default 20) each, through scripts/fuzz.sh
# (which installs cargo-fuzz if missing); FUZZ_SECONDS=0 skips it.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[test.sh] %s\n' "$*" >&2; }
# Each section's start, with the seconds since the script began (where CI's time goes).
section() { log "$* (at ${SECONDS} s)"; }
# `cargo test ARGS…`, its output also kept; on a failure, a short summary of each failed test's
# message printed last (scripts/failure_summary.py), because CI shows only the end of the output
# and the messages come before libtest's list and the binaries' logs. No backtraces: the panic's
# location and message say more than frames of async test code, and they push the message out.
run_tests() {
  local test_log status
  test_log=$(mktemp "${TMPDIR:-/tmp}/dedup-tests.XXXXXX")
  set +e
  RUST_BACKTRACE=0 cargo test "$@" 2>&1 | tee "$test_log"
  status=${PIPESTATUS[0]}
  set -e
  if [ "$status" != 0 ]; then
    python3 scripts/failure_summary.py "$test_log" >&2 || true
  fi
  rm -f -- "$test_log"
  return "$status"
}

# Tests must not pick up a developer's own configuration.
unset DATABASE_URL DEDUP_LISTEN DEDUP_TRANSPORT DEDUP_QUEUE DEDUP_SINK STRIPE_WEBHOOK_SECRET REDIS_URL

# --- gates and the fast lane (no services) ----------------------------------------------------
if [ "${LINT:-1}" != 0 ]; then
  section "gates: rustfmt, clippy, rustdoc"
  cargo fmt --all --check
  cargo clippy --locked --workspace --all-targets -- -D warnings
  RUSTDOCFLAGS="-D warnings" cargo doc --locked --workspace --no-deps --quiet
  section "gates: idempotency-key stands alone"
  # The layer is a product of its own: an axum service depending on it builds none of the
  # pipeline, RabbitMQ's client or the AWS SDK.
  layer_tree=$(cargo tree --locked -p idempotency-key -e normal --prefix none)
  for foreign in dedup-worker dedup-worker-core lapin aws-sdk-sqs aws-config; do
    if grep -q "^$foreign v" <<<"$layer_tree"; then
      log "idempotency-key depends on $foreign (cargo tree -p idempotency-key -i $foreign shows how)"
      exit 1
    fi
  done
  # Its Redis fast path and retrying client are features (both default): without them it
  # builds neither redis nor reqwest, and still builds. Its dev-dependencies are counted too
  # (no `-e normal`): its tests' HTTP client is hyper's, so a test build without the features
  # is without both as well.
  bare_tree=$(cargo tree --locked -p idempotency-key --no-default-features --prefix none)
  for optional in redis reqwest; do
    if grep -q "^$optional v" <<<"$bare_tree"; then
      log "idempotency-key --no-default-features depends on $optional (cargo tree -p idempotency-key --no-default-features -i $optional shows how)"
      exit 1
    fi
  done
  cargo check --locked -p idempotency-key --no-default-features
  section "gates: the book (docs/) built, its links and README's checked, its configuration table against config/default.toml"
  if ! command -v mdbook >/dev/null; then
    log "installing mdbook"
    cargo install mdbook --locked --no-default-features --version '^0.5'
  fi
  book_dir=$(mktemp -d "${TMPDIR:-/tmp}/dedup-book.XXXXXX")
  mdbook build docs --dest-dir "$book_dir"
  rm -rf -- "$book_dir"
  python3 scripts/check_links.py --self-test
  python3 scripts/check_links.py
  # The book's configuration table names exactly the keys config/default.toml has.
  python3 scripts/check_config_reference.py --self-test
  python3 scripts/check_config_reference.py
fi
if [ $# -eq 0 ]; then
  section "fast lane: the unit and property tests of every crate"
  python3 scripts/failure_summary.py --self-test
  run_tests --locked --workspace --lib --bins
  # The pipeline's doc tests run with its integration tests below; the other crates' here.
  cargo test --locked -p idempotency-key -p dedup-db --doc
fi

section "services"

# --- services ---------------------------------------------------------------------------------
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() { # port, name, seconds
  local deadline=$((SECONDS + $3))
  until port_open "$1"; do
    if ((SECONDS > deadline)); then log "$2 did not come up on port $1"; return 1; fi
    sleep 0.2
  done
}
if ! port_open 5432 && command -v pg_ctlcluster >/dev/null; then
  log "starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
fi
wait_port 5432 PostgreSQL 60
if ! port_open 6379 && command -v redis-server >/dev/null; then
  log "starting Redis"
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no || true
fi
if ! port_open 5672 && command -v rabbitmq-server >/dev/null; then
  log "starting RabbitMQ"
  rabbitmq-server -detached || true
fi

# --- Debian tools -----------------------------------------------------------------------------
# tests/it/operations/: a real Prometheus scrapes the binary, promtool checks and unit-tests the
# alert rules (package prometheus), and the compose file is checked with `docker-compose config`
# where the `docker compose` plugin is absent (package docker-compose; no engine is needed).
# tests/it/console/ drives the operator console in a headless chromium through its chromedriver
# (packages chromium and chromium-driver).
# Installed only when missing, quietly, without recommends, and without starting the packages'
# services (policy-rc.d): the tests start their own Prometheus on a free port.
apt_install() {
  local made_policy=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    made_policy=1
  fi
  local apt=(env DEBIAN_FRONTEND=noninteractive apt-get -y -qq --no-install-recommends)
  # A fresh machine's package lists may be missing or stale: update once if the install fails.
  "${apt[@]}" install "$@" >/dev/null 2>&1 ||
    { apt-get update -qq >/dev/null && "${apt[@]}" install "$@" >/dev/null; }
  [ -z "$made_policy" ] || rm -f /usr/sbin/policy-rc.d
}
missing=()
{ command -v promtool && command -v prometheus; } >/dev/null || missing+=(prometheus)
{ docker compose version || command -v docker-compose; } >/dev/null 2>&1 || missing+=(docker-compose)
{ [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; } || missing+=(chromium chromium-driver)
# tests/it/sink_auth/ makes its CA and certificates with the openssl command.
command -v openssl >/dev/null || missing+=(openssl)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  apt_install "${missing[@]}"
fi

# --- Python tools -----------------------------------------------------------------------------
# hubspot-api-client signs the hubspot preset's test deliveries (its Signature.get_signature, v3).
# PyYAML reads deploy/'s YAML for the tests; kubernetes-validate carries the Kubernetes JSON
# schemas, so the manifests are validated offline.
PYTHON=${PYTHON:-python3}
export PYTHON
"$PYTHON" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
  'stripe>=16,<17' 'moto[server]>=5,<6' 'standardwebhooks>=1.0,<2' 'cryptography>=40' \
  'pyyaml>=6' 'kubernetes-validate>=1.33,<2' 'slack_sdk>=3.48,<4' 'paddle-python-sdk==1.16.1' \
  'squareup==46.0.0.20260916' 'twilio==9.13.0' 'Adyen==16.0.0' \
  'paypalrestsdk==1.13.3' 'pyOpenSSL==26.2.0' 'hubspot-api-client==12.0.0'

# --- Node packages ----------------------------------------------------------------------------
# The senders' own libraries sign the deliveries of tests/it/sources/ where they are JavaScript:
# GitHub's @octokit/webhooks-methods (`sign`) and Shopify's @shopify/shopify-api (its test helper
# `getHmac`); Linear's @linear/sdk and Zoom's @zoom/rivet, which only verify, check what their
# tests sign (`LinearWebhookClient.verify`, `AwsLambdaReceiver`). Pinned (shopify-api 15 wants node 22; 13.1 is the last for
# node 20), installed once into the build's own directory and skipped while the pins are what is
# installed. The tests find them through NODE_PATH (and run node from beside it, since ESM
# imports ignore NODE_PATH).
SENDER_SDKS="${CARGO_TARGET_DIR:-$PWD/target}/sender-sdks"
sender_pins='@octokit/webhooks-methods@6.0.0 @shopify/shopify-api@13.1.0 @linear/sdk@98.0.0 @zoom/rivet@0.4.0'
if [ "$(cat "$SENDER_SDKS/.pins" 2>/dev/null)" != "$sender_pins" ]; then
  log "installing $sender_pins into $SENDER_SDKS"
  mkdir -p "$SENDER_SDKS"
  [ -f "$SENDER_SDKS/package.json" ] || printf '{"private": true}\n' >"$SENDER_SDKS/package.json"
  # shellcheck disable=SC2086 # the pins are words
  (cd "$SENDER_SDKS" && npm install --no-audit --no-fund --silent --save-exact $sender_pins)
  printf '%s' "$sender_pins" >"$SENDER_SDKS/.pins"
fi
export NODE_PATH="$SENDER_SDKS/node_modules"

MOTO_PORT=$("$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$PYTHON" scripts/moto_server.py -H 127.0.0.1 -p "$MOTO_PORT" >"${TMPDIR:-/tmp}/moto-$MOTO_PORT.log" 2>&1 &
MOTO_PID=$!
trap 'kill $MOTO_PID 2>/dev/null || true' EXIT
wait_port "$MOTO_PORT" moto_server 60
export AWS_ENDPOINT_URL="http://127.0.0.1:$MOTO_PORT" AWS_REGION=us-east-1 \
  AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test
log "moto_server on $AWS_ENDPOINT_URL"

# --- the suite --------------------------------------------------------------------------------
# tests/it/paid_invoices.rs runs the example service's binary, which `cargo test` builds only as
# its unit-test harness.
section "the suite"
cargo build --locked --example paid_invoices
run_tests --locked "$@"
# The Idempotency-Key layer's integration tests and its checkout example's, each crate's one
# binary `it` (their unit tests ran in the fast lane).
run_tests --locked -p idempotency-key -p idempotency-key-checkout --test it "$@"

# --- fault soak -------------------------------------------------------------------------------
# bench/soak.sh for 60 s, a fresh seed each run (printed first, with the command that replays
# it), debug builds (`cargo test` built most of them), on an emulator and a PostgreSQL server of
# its own (initdb + pg_ctl; removed after). Every run of 20 s or more crashes that server once
# and duplicates SQS receives once at least, besides the drawn faults; about two minutes in all.
section "fault soak"
[ "${SOAK_SECONDS:-60}" = 0 ] || env -u AWS_ENDPOINT_URL SOAK_PROFILE=debug SOAK_RATE=20 ./bench/soak.sh "${SOAK_SECONDS:-60}"

# --- fuzz smoke run -------------------------------------------------------------------------
if [ "${FUZZ_SECONDS:-20}" != 0 ]; then
  section "fuzz smoke run"
  ./scripts/fuzz.sh "${FUZZ_SECONDS:-20}"
fi
section "done"
