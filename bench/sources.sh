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
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
ROUNDS=${1:-4}
SECS=${2:-10}
CONNS=${3:-64}
PORT=${PORT:-18090}
bench_library_schema
bench_build --bin dedup-worker --example loadgen
OUT=$(bench_out_dir)
bench_createdb "$TAG"
export DATABASE_URL=$PG/$TAG
sql() { psql "$DATABASE_URL" -tAc "$1"; }

bench_calibrate
DEDUP_LISTEN=127.0.0.1:$PORT DEDUP_ROLES__CONSUMER=false DEDUP_ROLES__RELAY=false \
  STRIPE_WEBHOOK_SECRET=whsec_bench DEDUP_SOURCES__GITHUB__SCHEME=github \
  DEDUP_SOURCES__GITHUB__SECRETS=bench RUST_LOG=warn \
  bench_start_worker "$WORK/serve.log" "$OUT/dedup-worker" serve

# One round of `scheme` (stripe | github): loadgen's summary line, prefixed.
round() {
  local n=$1 scheme=$2 secret=whsec_bench
  [ "$scheme" = github ] && secret=bench
  sql "TRUNCATE queue_messages" >/dev/null
  printf '%s\t%s\t' "$n" "$scheme"
  "$OUT/examples/loadgen" --url "$URL/webhooks/$scheme" \
    --scheme "$scheme" --secret "$secret" --connections "$CONNS" --seconds "$SECS" \
    --random-ids --prefix "r$n$scheme"
}

echo "round	route	loadgen ($CONNS connections, ${SECS} s, PostgreSQL, database queue)"
for n in $(seq 1 "$ROUNDS"); do
  if ((n % 2)); then round "$n" stripe; round "$n" github; else round "$n" github; round "$n" stripe; fi
done
bench_calibrate
