#!/usr/bin/env bash
# The consumer draining a RabbitMQ backlog with duplicates, repeated: does every round drain?
# (Issue 9: two workers deadlocked on their dedup inserts and stalled with a batch unacked.)
# Each round:
#   1. an ingress-only process accepts N signed webhooks, a fraction repeating earlier ids
#      (loadgen --duplicates), into a fresh RabbitMQ queue;
#   2. a consume-only process (default settings: two workers) drains it; the round reports the
#      drain time, the rate, and the deadlocks and failed steps its log records.
# Usage: bench/rabbitmq_drain.sh [rounds] [events] [duplicate fraction]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-4}
EVENTS=${2:-30000}
DUPLICATES=${3:-0.2}
PORT=18081
PG=postgres://postgres@127.0.0.1:5432
# psql below names the library's tables unqualified: they live in schema dedup_worker (the
# binary's own connections put it first; an older binary's tables in public are found too).
export PGOPTIONS='-c search_path=dedup_worker,public'
WORK=$(mktemp -d)
cargo build --release --quiet --bin dedup-worker --example loadgen
export STRIPE_WEBHOOK_SECRET=whsec_bench RUST_LOG=warn DEDUP_TRANSPORT=rabbitmq

received() { # deliveries the consumer has settled (duplicates included), from its /metrics
  curl -sf "http://127.0.0.1:$((PORT + 1))/metrics" |
    awk '/^dedup_events_received_total / { print int($2) } END { if (!NR) print 0 }'
}
cleanup() {
  # Only the processes this script started: the machine is shared.
  [ -z "${PIDS:-}" ] || kill $PIDS 2>/dev/null || true
  for q in $(rabbitmqctl -q list_queues name | grep "^dw_bench_drain_$$" || true); do
    rabbitmqctl -q delete_queue "$q" >/dev/null || true
  done
  for round in $(seq 1 "$ROUNDS"); do
    psql "$PG/postgres" -qc "DROP DATABASE IF EXISTS dw_bench_drain_$$_$round WITH (FORCE)"
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
# Stops the dedup-worker started last and waits for it to exit.
stop_last() { kill "$LAST" 2>/dev/null || true; wait "$LAST" 2>/dev/null || true; }

for round in $(seq 1 "$ROUNDS"); do
  db=dw_bench_drain_$$_$round
  psql "$PG/postgres" -qc "CREATE DATABASE $db"
  export DATABASE_URL="$PG/$db" DEDUP_QUEUE="dw_bench_drain_$$_$round"
  DEDUP_LISTEN=127.0.0.1:$PORT DEDUP_ROLES__CONSUMER=false DEDUP_ROLES__RELAY=false \
    target/release/dedup-worker serve >"$WORK/ingress.log" 2>&1 &
  LAST=$!; PIDS="${PIDS:-} $LAST"
  until curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null; do sleep 0.1; done
  target/release/examples/loadgen --url "http://127.0.0.1:$PORT/webhooks/stripe" \
    --connections 64 --seconds 300 --requests "$EVENTS" --duplicates "$DUPLICATES" \
    --prefix "evt_drain_$round" >"$WORK/load.log"
  stop_last
  # Every accepted request is one message in the queue, duplicates included.
  queued=$(awk '{ for (i = 1; i < NF; i++) if ($i == "requests:") n = $(i + 1);
                  for (i = 1; i < NF; i++) if ($i == "non-2xx:") f = $(i + 1) }
                END { sub(";", "", f); print n - f }' "$WORK/load.log")

  start=$(date +%s.%N)
  DEDUP_LISTEN=127.0.0.1:$((PORT + 1)) DEDUP_ROLES__INGRESS=false DEDUP_ROLES__RELAY=false \
    target/release/dedup-worker serve >"$WORK/consume.log" 2>&1 &
  LAST=$!; PIDS="${PIDS:-} $LAST"
  deadline=$((SECONDS + 300))
  outcome=drained
  until [ "$(received)" -ge "$queued" ]; do
    if ((SECONDS > deadline)); then outcome="NOT drained after 300 s"; break; fi
    sleep 0.2
  done
  elapsed=$(python3 -c "import time,sys; print(f'{time.time()-float(sys.argv[1]):.2f}')" "$start")
  stop_last
  handled=$(psql "$DATABASE_URL" -tAc "SELECT count(*) FROM processed_events")
  deadlocks=$(grep -c "deadlock detected" "$WORK/consume.log" || true)
  failed=$(grep -c "consumer step failed" "$WORK/consume.log" || true)
  echo "round $round: $queued messages, $handled events handled once, $outcome in ${elapsed} s" \
    "($(python3 -c "print(int($queued / $elapsed))") messages/s); deadlocks: $deadlocks, failed steps: $failed"
done
