#!/usr/bin/env bash
# The GitHub source's ingress beside the Stripe route's, on the same machine, in alternating
# rounds (Stripe first in odd rounds, GitHub first in even ones): one ingress-only process
# (consumer and relay off) on PostgreSQL with the database queue, serving POST /webhooks/stripe
# and a `[sources.github]` at POST /webhooks/github; loadgen sends the same JSON body to each,
# signed as each sender signs (examples/loadgen.rs --scheme). The queue is emptied between
# rounds so every round starts on the same table. A pgbench calibration (the one-row insert of
# the other bench scripts) is printed before and after.
#
# Usage: bench/sources.sh [rounds] [seconds] [connections]     (defaults 4, 10, 64)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-4}
SECS=${2:-10}
CONNS=${3:-64}
PG=${PG:-postgres://postgres@127.0.0.1:5432}
PORT=${PORT:-18090}
export PGOPTIONS='-c search_path=dedup_worker,public'
DB=dw_sources_$$
WORK=$(mktemp -d)
PID=
cargo build --release --quiet --bin dedup-worker --example loadgen

cleanup() {
  set +e
  # Only what this script started: the machine is shared.
  [ -z "$PID" ] || { kill "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; }
  psql "$PG/postgres" -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

psql "$PG/postgres" -qc "CREATE DATABASE $DB"
export DATABASE_URL=$PG/$DB
sql() { psql "$DATABASE_URL" -tAc "$1"; }

calibrate() {
  sql "CREATE TABLE IF NOT EXISTS bench_calibration (id BIGSERIAL PRIMARY KEY, v INT NOT NULL)" >/dev/null
  echo 'INSERT INTO bench_calibration (v) VALUES (1);' >"$WORK/calibration.sql"
  local tps
  tps=$(pgbench -n -M prepared -c 16 -j 2 -T 8 -f "$WORK/calibration.sql" "$DATABASE_URL" 2>/dev/null |
    sed -n 's/^tps = \([0-9.]*\).*/\1/p')
  echo "calibration: pgbench -n -M prepared -c 16 -j 2 -T 8, one-row insert: ${tps%.*} tps ($(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg))"
}
calibrate

DEDUP_LISTEN=127.0.0.1:$PORT DEDUP_ROLES__CONSUMER=false DEDUP_ROLES__RELAY=false \
  STRIPE_WEBHOOK_SECRET=whsec_bench DEDUP_SOURCES__GITHUB__SCHEME=github \
  DEDUP_SOURCES__GITHUB__SECRETS=bench RUST_LOG=warn \
  target/release/dedup-worker serve >"$WORK/serve.log" 2>&1 &
PID=$!
deadline=$((SECONDS + 30))
until curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null; do
  kill -0 "$PID" 2>/dev/null || { echo "dedup-worker exited:"; cat "$WORK/serve.log"; exit 1; }
  ((SECONDS < deadline)) || { echo "not ready in 30 s"; exit 1; }
  sleep 0.2
done

# One round of `scheme` (stripe | github): loadgen's summary line, prefixed.
round() {
  local n=$1 scheme=$2 secret=whsec_bench
  [ "$scheme" = github ] && secret=bench
  sql "TRUNCATE queue_messages" >/dev/null
  printf '%s\t%s\t' "$n" "$scheme"
  target/release/examples/loadgen --url "http://127.0.0.1:$PORT/webhooks/$scheme" \
    --scheme "$scheme" --secret "$secret" --connections "$CONNS" --seconds "$SECS" \
    --random-ids --prefix "r$n$scheme"
}

echo "round	route	loadgen ($CONNS connections, ${SECS} s, PostgreSQL, database queue)"
for n in $(seq 1 "$ROUNDS"); do
  if ((n % 2)); then round "$n" stripe; round "$n" github; else round "$n" github; round "$n" stripe; fi
done
calibrate
