#!/usr/bin/env bash
# The consumer against its ceiling (issue 29): what one `dedup-worker consume` (default
# settings: `consumer.workers` loops, `consumer.batch_size` per batch, forward handler) drains,
# against what PostgreSQL itself does for the same statements at the same concurrency.
#
# The statements per batch (read with log_statement=all from `consume`; see the .sql files):
#   database queue: claim (autocommit UPDATE … FOR UPDATE SKIP LOCKED … RETURNING), then
#     BEGIN; pg_advisory_xact_lock_shared; SELECT … FROM dedup_generations; the dedup INSERT …
#     UNNEST … ON CONFLICT DO NOTHING RETURNING; the outbox INSERT … UNNEST with pg_notify;
#     COMMIT; then the ack (autocommit DELETE … WHERE id = ANY(…)):
#     consumer_claim.sql + consumer_tx.sql + consumer_ack.sql;
#   RabbitMQ: the transaction only (receive and ack go to the broker): consumer_tx.sql.
#
# Each round, for each transport in $TRANSPORTS (default "database rabbitmq"), in this order:
#   path:    database queue: a copy of a template database holding $EVENTS queued webhooks (an
#            ingress-only `serve` fed by examples/loadgen, as bench/pipeline.sh), `consume`
#            timed from its start until queue_messages is empty;
#            RabbitMQ: a fresh queue filled with $EVENTS webhooks the same way (as
#            bench/rabbitmq_drain.sh), `consume` timed until its /metrics counts them received;
#   ceiling: pgbench -M prepared -c <workers> -j <workers> -t <EVENTS / (batch × workers)> of
#            those statements with full batches, on a copy of the same template (database
#            queue: the same queued rows, claimed and deleted as the consumer does) or of a
#            freshly migrated database (RabbitMQ).
# Both rates are measured alike, from the batches' own transaction times (processed_at, the
# transaction's now()): the events of every batch but the first over the time from the first
# batch's transaction to the last's. So neither counts process start-up, connecting or the
# polling; the line also shows the consumer's wall-clock rate from its start and pgbench's
# tps × batch.
# Prints a calibration line first (pgbench -n -M prepared -c 16 -j 2 -T 8, one-row insert),
# a line per round and transport, and a summary per transport: rate/ceiling median.
# Every database and queue is this run's own (names with the shell's pid) and dropped at the
# end; only processes this script started are stopped.
# Usage: bench/ceilings/consumer.sh [rounds]   (env: EVENTS=100000, TRANSPORTS="database rabbitmq", BIN,
#        WORKERS, BATCH)
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/../lib.sh"
ROUNDS=${1:-3}
EVENTS=${EVENTS:-100000}
TRANSPORTS=${TRANSPORTS:-database rabbitmq}
HERE=bench/ceilings
bench_library_schema
bench_worker_env
# WORKERS / BATCH override the defaults the consumer runs with, for both the path and its ceiling.
WORKERS=${WORKERS:-$(bench_toml consumer workers)}
BATCH=${BATCH:-$(bench_toml consumer batch_size)}
export DEDUP_CONSUMER__WORKERS=$WORKERS DEDUP_CONSUMER__BATCH_SIZE=$BATCH
# BIN: a dedup-worker built elsewhere to compare (A/B); else this tree's, built now.
bench_bin --example loadgen
LOADGEN=$OUT/examples/loadgen
bench_at_exit bench_delete_queues
q() { bench_sql "$@"; }
now() { date +%s.%N; }
# fill DB [env…]: an ingress-only serve takes $EVENTS signed webhooks; FILLED = how many it accepted.
# Their ids are those of the figures in BENCHMARKS.md (named after the database's name then,
# dw_ceil_c_<pid>_…), so the rows' sizes stay the same.
fill() {
  local db=$1; shift
  DATABASE_URL="$PG/$db" DEDUP_ROLES__CONSUMER=false DEDUP_ROLES__RELAY=false \
    bench_start_worker "$WORK/ingress.log" env "$@" "$BIN" serve
  "$LOADGEN" --url "$URL/webhooks/stripe" --connections 64 --seconds 600 \
    --requests "$EVENTS" --prefix "evt_ceil_dw_ceil_c_$$${db#"$TAG"}" >"$WORK/load.log"
  bench_stop_last
  FILLED=$(bench_loadgen_accepted "$WORK/load.log")
}

echo "$(date -u '+%Y-%m-%d %H:%M:%S UTC') consumer ceilings: $ROUNDS rounds, $EVENTS events, workers $WORKERS, batch $BATCH, transports: $TRANSPORTS; binary $(sha256sum "$BIN" | cut -c1-12)"
bench_calibrate

# The templates: a migrated empty database, and (database queue) one holding $EVENTS messages.
bench_createdb "${TAG}_empty"
DATABASE_URL="$PG/${TAG}_empty" "$BIN" migrate >/dev/null
if [[ " $TRANSPORTS " == *" database "* ]]; then
  bench_createdb "${TAG}_tpl" "${TAG}_empty"
  fill "${TAG}_tpl"; QUEUED=$FILLED
  q "$PG/${TAG}_tpl" "VACUUM ANALYZE" >/dev/null
  q "$PG/${TAG}_tpl" "CHECKPOINT" >/dev/null
  echo "template: $QUEUED messages queued in ${TAG}_tpl"
fi
TX=$((EVENTS / (BATCH * WORKERS))) # full batches per pgbench client
cat "$HERE/consumer_claim.sql" "$HERE/consumer_tx.sql" "$HERE/consumer_ack.sql" >"$WORK/dbqueue.sql"

# ceiling DB SCRIPT: runs SCRIPT on DB; CEIL_PGBENCH = pgbench's events/s (tps × batch),
# CEIL = the steady rate (as the consumer's).
ceiling() {
  local tps
  tps=$(pgbench -n -M prepared -c "$WORKERS" -j "$WORKERS" -t "$TX" -D batch="$BATCH" -D queue=dedup.events \
    -f "$2" "$PG/$1" 2>"$WORK/pgbench.err" | awk '/^tps/ { print $3 }')
  [ -n "$tps" ] || { cat "$WORK/pgbench.err" >&2; return 1; }
  CEIL_PGBENCH=$(python3 -c "import sys; print(round(float(sys.argv[1]) * int(sys.argv[2])))" "$tps" "$BATCH")
  CEIL=$(steady "$1")
}
# steady DB: events/s between the first and the last batch transaction (their now(), which is
# each row's processed_at): the events of every batch but the first over the time between, the
# same measure for the consumer and for pgbench, without process start-up or polling.
steady() {
  q "$PG/$1" "SELECT round(count(*) FILTER (WHERE processed_at > m) / extract(epoch FROM max(processed_at) - m))
                FROM processed_events, (SELECT min(processed_at) AS m FROM processed_events) f GROUP BY m"
}
# Until the queue (database) or the broker's deliveries (rabbitmq) are drained.
queue_empty() { [ "$(q "$PG/$1" "SELECT count(*) FROM queue_messages")" = 0 ]; }
received_all() { [ "$(bench_metric "$URL" dedup_events_received_total)" -ge "$1" ]; }
declare -A RATIOS

for round in $(seq 1 "$ROUNDS"); do
  for transport in $TRANSPORTS; do
    db=${TAG}_r${round}_${transport}
    if [ "$transport" = database ]; then
      bench_createdb "$db" "${TAG}_tpl"
      q "$PG/$db" "CHECKPOINT" >/dev/null
      n=$QUEUED
      start=$(now)
      DATABASE_URL="$PG/$db" bench_start_worker "$WORK/consume.log" "$BIN" consume
      BENCH_POLL=0.2 bench_wait_until "drain" 3600 "$LAST" queue_empty "$db"
      elapsed=$(bench_since "$start")
      batches=$(bench_metric "$URL" dedup_consumer_batch_seconds_count)
      bench_stop_last
      rate=$(steady "$db")
      bench_dropdb "$db"
      bench_createdb "$db" "${TAG}_tpl"
      q "$PG/$db" "CHECKPOINT" >/dev/null
      ceiling "$db" "$WORK/dbqueue.sql"
      label="database queue"
    else
      queue=${TAG}_r${round}
      bench_createdb "$db" "${TAG}_empty"
      fill "$db" DEDUP_TRANSPORT=rabbitmq DEDUP_QUEUE="$queue"; n=$FILLED
      q "$PG/$db" "CHECKPOINT" >/dev/null
      start=$(now)
      DATABASE_URL="$PG/$db" DEDUP_TRANSPORT=rabbitmq DEDUP_QUEUE="$queue" \
        bench_start_worker "$WORK/consume.log" "$BIN" consume
      BENCH_POLL=0.2 bench_wait_until "drain" 3600 "$LAST" received_all "$n"
      elapsed=$(bench_since "$start")
      batches=$(bench_metric "$URL" dedup_consumer_batch_seconds_count)
      bench_stop_last
      rate=$(steady "$db")
      rabbitmqctl -q delete_queue "$queue" >/dev/null || true
      bench_dropdb "$db"
      bench_createdb "$db" "${TAG}_empty"
      q "$PG/$db" "CHECKPOINT" >/dev/null
      ceiling "$db" "$HERE/consumer_tx.sql"
      label="rabbitmq"
    fi
    bench_dropdb "$db"
    wall=$(python3 -c "import sys; print(round(int(sys.argv[1]) / float(sys.argv[2])))" "$n" "$elapsed")
    r=$(bench_ratio "$rate" "$CEIL")
    RATIOS[$transport]="${RATIOS[$transport]:-} $r"
    printf '%s round %d %s: consumer %s events/s (wall %s: %s in %.2f s from start; %s batches, mean %s), ceiling %s events/s (pgbench -c %s -t %s, batch %s: tps x batch %s), ratio %s\n' \
      "$(date -u +%H:%M:%S)" "$round" "$label" "$rate" "$wall" "$n" "$elapsed" "${batches:-?}" \
      "$(python3 -c "import sys; print(round(int(sys.argv[1]) / max(1, int(sys.argv[2] or 0))))" "$n" "${batches:-0}")" \
      "$CEIL" "$WORKERS" "$TX" "$BATCH" "$CEIL_PGBENCH" "$r"
  done
done

for transport in $TRANSPORTS; do
  label=$([ "$transport" = database ] && echo "database queue" || echo rabbitmq)
  echo "consumer ($label): rate/ceiling median $(bench_median "${RATIOS[$transport]}") (rounds: ${RATIOS[$transport]# })"
done
