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
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
ROUNDS=${1:-4}
EVENTS=${2:-30000}
DUPLICATES=${3:-0.2}
PORT=18081
bench_library_schema
bench_worker_env
export DEDUP_TRANSPORT=rabbitmq
bench_build --bin dedup-worker --example loadgen
OUT=$(bench_out_dir)
bench_at_exit bench_delete_queues

# Every delivery the consumer has settled (duplicates included), from its /metrics.
received_all() { [ "$(bench_metric "http://127.0.0.1:$((PORT + 1))" dedup_events_received_total)" -ge "$1" ]; }

for round in $(seq 1 "$ROUNDS"); do
  db=${TAG}_$round
  bench_createdb "$db"
  export DATABASE_URL="$PG/$db" DEDUP_QUEUE="${TAG}_$round"
  DEDUP_LISTEN=127.0.0.1:$PORT DEDUP_ROLES__CONSUMER=false DEDUP_ROLES__RELAY=false \
    bench_start_worker "$WORK/ingress.log" "$OUT/dedup-worker" serve
  "$OUT/examples/loadgen" --url "$URL/webhooks/stripe" \
    --connections 64 --seconds 300 --requests "$EVENTS" --duplicates "$DUPLICATES" \
    --prefix "evt_drain_$round" >"$WORK/load.log"
  bench_stop_last
  # Every accepted request is one message in the queue, duplicates included.
  queued=$(bench_loadgen_accepted "$WORK/load.log")

  start=$(date +%s.%N)
  DEDUP_LISTEN=127.0.0.1:$((PORT + 1)) DEDUP_ROLES__INGRESS=false DEDUP_ROLES__RELAY=false \
    bench_spawn "$WORK/consume.log" "$OUT/dedup-worker" serve
  outcome=drained
  BENCH_POLL=0.2 bench_wait_until "drain" 300 "$LAST" received_all "$queued" ||
    outcome="NOT drained after 300 s"
  elapsed=$(python3 -c "import time,sys; print(f'{time.time()-float(sys.argv[1]):.2f}')" "$start")
  bench_stop_last
  handled=$(psql "$DATABASE_URL" -tAc "SELECT count(*) FROM processed_events")
  deadlocks=$(grep -c "deadlock detected" "$WORK/consume.log" || true)
  failed=$(grep -c "consumer step failed" "$WORK/consume.log" || true)
  echo "round $round: $queued messages, $handled events handled once, $outcome in ${elapsed} s" \
    "($(python3 -c "print(int($queued / $elapsed))") messages/s); deadlocks: $deadlocks, failed steps: $failed"
done
