#!/usr/bin/env bash
# End-to-end figures for BENCHMARKS.md, in release mode on this machine:
#   1. ingress requests/s and latency (loadgen, signed requests, N connections) with the
#      database queue on PostgreSQL (consumer and relay off, so only ingress is measured);
#   2. consumer events/s: a consume-only process drains what ingress queued;
#   3. relay rows/s: a relay-only process delivers the outbox to a file sink.
# Usage: bench/pipeline.sh [connections] [seconds] [postgres|sqlite]
set -euo pipefail
cd "$(dirname "$0")/.."
CONNECTIONS=${1:-64}
SECONDS_LOAD=${2:-10}
BACKEND=${3:-postgres}
PORT=18080
PG=postgres://postgres@127.0.0.1:5432
# psql below names the library's tables unqualified: they live in schema dedup_worker (the
# binary's own connections put it first; an older binary's tables in public are found too).
export PGOPTIONS='-c search_path=dedup_worker,public'
WORK=$(mktemp -d)
cargo build --release --quiet --bin dedup-worker --example loadgen

if [ "$BACKEND" = postgres ]; then
  DB=dw_bench_$$
  psql "$PG/postgres" -qc "CREATE DATABASE $DB"
  export DATABASE_URL="$PG/$DB"
  count() { psql "$DATABASE_URL" -tAc "$1"; }
else
  export DATABASE_URL="sqlite://$WORK/bench.db"
  count() { python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute(sys.argv[2]).fetchone()[0])" "$WORK/bench.db" "$1"; }
fi
cleanup() {
  # Only the processes this script started: the machine is shared.
  [ -z "${PIDS:-}" ] || kill $PIDS 2>/dev/null || true
  if [ "$BACKEND" = postgres ]; then psql "$PG/postgres" -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)"; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
# Stops the dedup-worker started last and waits for it to exit.
stop_last() { kill "$LAST" 2>/dev/null || true; wait "$LAST" 2>/dev/null || true; }
export STRIPE_WEBHOOK_SECRET=whsec_bench RUST_LOG=warn

# Polls `sql` until it returns 0; prints the rate for `total` items since `start`.
drain_rate() {
  local sql=$1 total=$2 start=$3 label=$4 deadline=$((SECONDS + 600))
  until [ "$(count "$sql")" = 0 ]; do
    ((SECONDS < deadline)) || { echo "$label did not finish"; return 1; }
    sleep 0.5
  done
  python3 -c "import time,sys; print(f'{sys.argv[1]}: {int(sys.argv[2])} in {time.time()-float(sys.argv[3]):.1f} s = {int(sys.argv[2])/(time.time()-float(sys.argv[3])):.0f}/s')" "$label" "$total" "$start"
}

echo "== ingress ($BACKEND, database queue, $CONNECTIONS connections, ${SECONDS_LOAD}s)"
DEDUP_LISTEN=127.0.0.1:$PORT DEDUP_ROLES__CONSUMER=false DEDUP_ROLES__RELAY=false \
  target/release/dedup-worker serve >"$WORK/ingress.log" 2>&1 &
LAST=$!; PIDS="${PIDS:-} $LAST"
until curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null; do sleep 0.1; done
target/release/examples/loadgen --url "http://127.0.0.1:$PORT/webhooks/stripe" \
  --connections "$CONNECTIONS" --seconds "$SECONDS_LOAD"
stop_last
TOTAL=$(count "SELECT count(*) FROM queue_messages")

echo "== consumer (forward handler, default batch size)"
START=$(python3 -c 'import time; print(time.time())')
DEDUP_LISTEN=127.0.0.1:0 target/release/dedup-worker consume >"$WORK/consume.log" 2>&1 &
LAST=$!; PIDS="${PIDS:-} $LAST"
drain_rate "SELECT count(*) FROM queue_messages" "$TOTAL" "$START" "consumer events"
stop_last

echo "== relay (file sink)"
START=$(python3 -c 'import time; print(time.time())')
DEDUP_LISTEN=127.0.0.1:0 DEDUP_SINK="file:$WORK/sink.jsonl" target/release/dedup-worker relay >"$WORK/relay.log" 2>&1 &
LAST=$!; PIDS="${PIDS:-} $LAST"
drain_rate "SELECT count(*) FROM outbox WHERE status = 'pending'" "$TOTAL" "$START" "relay rows"
