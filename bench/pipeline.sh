#!/usr/bin/env bash
# End-to-end figures for BENCHMARKS.md, in release mode on this machine:
#   1. ingress requests/s and latency (loadgen, signed requests, N connections) with the
#      database queue on PostgreSQL (consumer and relay off, so only ingress is measured);
#   2. consumer events/s: a consume-only process drains what ingress queued;
#   3. relay rows/s: a relay-only process delivers the outbox to a file sink.
# Usage: bench/pipeline.sh [connections] [seconds] [postgres|sqlite]
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
CONNECTIONS=${1:-64}
SECONDS_LOAD=${2:-10}
BACKEND=${3:-postgres}
PORT=18080
bench_library_schema
bench_worker_env
bench_build --bin dedup-worker --example loadgen
OUT=$(bench_out_dir)

if [ "$BACKEND" = postgres ]; then
  bench_createdb "$TAG"
  export DATABASE_URL="$PG/$TAG"
  count() { psql "$DATABASE_URL" -tAc "$1"; }
else
  export DATABASE_URL="sqlite://$WORK/bench.db"
  count() { python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute(sys.argv[2]).fetchone()[0])" "$WORK/bench.db" "$1"; }
fi

zero() { [ "$(count "$1")" = 0 ]; }
# Polls `sql` until it returns 0; prints the rate for `total` items since `start`.
drain_rate() {
  local sql=$1 total=$2 start=$3 label=$4
  BENCH_POLL=0.5 bench_wait_until "$label" 600 "$LAST" zero "$sql" || { echo "$label did not finish"; return 1; }
  python3 -c "import time,sys; print(f'{sys.argv[1]}: {int(sys.argv[2])} in {time.time()-float(sys.argv[3]):.1f} s = {int(sys.argv[2])/(time.time()-float(sys.argv[3])):.0f}/s')" "$label" "$total" "$start"
}

echo "== ingress ($BACKEND, database queue, $CONNECTIONS connections, ${SECONDS_LOAD}s)"
DEDUP_LISTEN=127.0.0.1:$PORT DEDUP_ROLES__CONSUMER=false DEDUP_ROLES__RELAY=false \
  bench_start_worker "$WORK/ingress.log" "$OUT/dedup-worker" serve
"$OUT/examples/loadgen" --url "$URL/webhooks/stripe" --connections "$CONNECTIONS" --seconds "$SECONDS_LOAD"
bench_stop_last
TOTAL=$(count "SELECT count(*) FROM queue_messages")

echo "== consumer (forward handler, default batch size)"
START=$(date +%s.%N)
DEDUP_LISTEN=127.0.0.1:0 bench_spawn "$WORK/consume.log" "$OUT/dedup-worker" consume
drain_rate "SELECT count(*) FROM queue_messages" "$TOTAL" "$START" "consumer events"
bench_stop_last

echo "== relay (file sink)"
START=$(date +%s.%N)
DEDUP_LISTEN=127.0.0.1:0 DEDUP_SINK="file:$WORK/sink.jsonl" \
  bench_spawn "$WORK/relay.log" "$OUT/dedup-worker" relay
drain_rate "SELECT count(*) FROM outbox WHERE status = 'pending'" "$TOTAL" "$START" "relay rows"
