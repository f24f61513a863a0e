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
cd "$(dirname "$0")/../.."
ROUNDS=${1:-3}
EVENTS=${EVENTS:-100000}
TRANSPORTS=${TRANSPORTS:-database rabbitmq}
PG=postgres://postgres@127.0.0.1:5432
HERE=bench/ceilings
# The library's tables live in schema dedup_worker; psql and pgbench name them unqualified.
export PGOPTIONS='-c search_path=dedup_worker,public'
export STRIPE_WEBHOOK_SECRET=whsec_bench RUST_LOG=warn
# The defaults the consumer runs with.
conf() { awk -v s="[$1]" -v k="$2" '$0 == s { c = 1; next } /^\[/ { c = 0 } c && $1 == k { print $3; exit }' config/default.toml; }
# WORKERS / BATCH override the defaults for both the path and its ceiling.
WORKERS=${WORKERS:-$(conf consumer workers)}
BATCH=${BATCH:-$(conf consumer batch_size)}
export DEDUP_CONSUMER__WORKERS=$WORKERS DEDUP_CONSUMER__BATCH_SIZE=$BATCH
TAG=dw_ceil_c_$$
WORK=$(mktemp -d)
# BIN: a dedup-worker built elsewhere to compare (A/B; then nothing is built here, and
# target/release/examples/loadgen must exist); else this tree's, built now.
if [ -z "${BIN:-}" ]; then
  cargo build --release --quiet --bin dedup-worker --example loadgen
  BIN=target/release/dedup-worker
fi

PIDS=""
cleanup() {
  # Only the processes this script started: the machine is shared.
  [ -z "$PIDS" ] || kill $PIDS 2>/dev/null || true
  for db in $(psql -X "$PG/postgres" -tAc "SELECT datname FROM pg_database WHERE datname LIKE '${TAG}%'"); do
    psql -X "$PG/postgres" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" || true
  done
  for q in $(rabbitmqctl -q list_queues name 2>/dev/null | grep "^${TAG}" || true); do
    rabbitmqctl -q delete_queue "$q" >/dev/null || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
q() { psql -X -tA -v ON_ERROR_STOP=1 "$1" -c "$2"; }
now() { date +%s.%N; }
# start LOG CMD…: starts a dedup-worker in the background (LAST = its pid), listening on a port
# of its own choosing; waits until it answers /readyz and sets URL to its base address.
start() {
  local log=$1; shift
  DEDUP_LISTEN=127.0.0.1:0 "$@" >"$log" 2>&1 &
  LAST=$!; PIDS="$PIDS $LAST"
  URL=""
  for _ in $(seq 1 300); do
    URL=$(sed -n 's/^dedup-worker listening on \(http:[^ ]*\).*/\1/p' "$log" | head -1)
    if [ -n "$URL" ] && curl -sf "$URL/readyz" >/dev/null; then return 0; fi
    kill -0 "$LAST" 2>/dev/null || { cat "$log" >&2; return 1; }
    sleep 0.1
  done
  echo "dedup-worker did not become ready" >&2; return 1
}
stop_last() { kill "$LAST" 2>/dev/null || true; wait "$LAST" 2>/dev/null || true; }
metric() { # metric NAME: the value of an unlabelled counter on the last started process
  curl -sf "$URL/metrics" | awk -v m="$1" '$1 == m { print int($2) } END { if (!NR) print 0 }' | tail -1
}
# fill DB [env…]: an ingress-only serve takes $EVENTS signed webhooks; FILLED = how many it accepted.
fill() {
  local db=$1; shift
  DATABASE_URL="$PG/$db" DEDUP_ROLES__CONSUMER=false DEDUP_ROLES__RELAY=false \
    start "$WORK/ingress.log" env "$@" "$BIN" serve
  target/release/examples/loadgen --url "$URL/webhooks/stripe" --connections 64 --seconds 600 \
    --requests "$EVENTS" --prefix "evt_ceil_$db" >"$WORK/load.log"
  stop_last
  FILLED=$(awk '{ for (i = 1; i < NF; i++) { if ($i == "requests:") n = $(i + 1); if ($i == "non-2xx:") f = $(i + 1) } }
       END { sub(";", "", f); print n - f }' "$WORK/load.log")
}

echo "$(date -u '+%Y-%m-%d %H:%M:%S UTC') consumer ceilings: $ROUNDS rounds, $EVENTS events, workers $WORKERS, batch $BATCH, transports: $TRANSPORTS; binary $(sha256sum "$BIN" | cut -c1-12)"
q "$PG/postgres" "CREATE DATABASE ${TAG}_calib" >/dev/null
q "$PG/${TAG}_calib" "CREATE TABLE ceil_calibration (id BIGSERIAL PRIMARY KEY, v INTEGER NOT NULL)" >/dev/null
CALIB=$(pgbench -n -M prepared -c 16 -j 2 -T 8 -f "$HERE/calibration.sql" "$PG/${TAG}_calib" 2>/dev/null |
  awk '/^tps/ { printf "%d", $3 }')
q "$PG/postgres" "DROP DATABASE ${TAG}_calib" >/dev/null
echo "calibration: pgbench -n -M prepared -c 16 -j 2 -T 8 (one-row insert): $CALIB commits/s; load average $(cut -d' ' -f1-3 /proc/loadavg)"

# The templates: a migrated empty database, and (database queue) one holding $EVENTS messages.
q "$PG/postgres" "CREATE DATABASE ${TAG}_empty" >/dev/null
DATABASE_URL="$PG/${TAG}_empty" "$BIN" migrate >/dev/null
if [[ " $TRANSPORTS " == *" database "* ]]; then
  q "$PG/postgres" "CREATE DATABASE ${TAG}_tpl TEMPLATE ${TAG}_empty" >/dev/null
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
ratio() { python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.2f}')" "$1" "$2"; }
declare -A RATIOS

for round in $(seq 1 "$ROUNDS"); do
  for transport in $TRANSPORTS; do
    db=${TAG}_r${round}_${transport}
    if [ "$transport" = database ]; then
      q "$PG/postgres" "CREATE DATABASE $db TEMPLATE ${TAG}_tpl" >/dev/null
      q "$PG/$db" "CHECKPOINT" >/dev/null
      n=$QUEUED
      start=$(now)
      DATABASE_URL="$PG/$db" start "$WORK/consume.log" "$BIN" consume
      until [ "$(q "$PG/$db" "SELECT count(*) FROM queue_messages")" = 0 ]; do sleep 0.2; done
      elapsed=$(python3 -c "import time,sys; print(time.time() - float(sys.argv[1]))" "$start")
      batches=$(curl -sf "$URL/metrics" | awk '$1 == "dedup_consumer_batch_seconds_count" { print int($2) }' | tail -1)
      stop_last
      rate=$(steady "$db")
      q "$PG/postgres" "DROP DATABASE $db WITH (FORCE)" >/dev/null
      q "$PG/postgres" "CREATE DATABASE $db TEMPLATE ${TAG}_tpl" >/dev/null
      q "$PG/$db" "CHECKPOINT" >/dev/null
      ceiling "$db" "$WORK/dbqueue.sql"
      label="database queue"
    else
      queue=${TAG}_r${round}
      q "$PG/postgres" "CREATE DATABASE $db TEMPLATE ${TAG}_empty" >/dev/null
      fill "$db" DEDUP_TRANSPORT=rabbitmq DEDUP_QUEUE="$queue"; n=$FILLED
      q "$PG/$db" "CHECKPOINT" >/dev/null
      start=$(now)
      DATABASE_URL="$PG/$db" DEDUP_TRANSPORT=rabbitmq DEDUP_QUEUE="$queue" \
        start "$WORK/consume.log" "$BIN" consume
      until [ "$(metric dedup_events_received_total)" -ge "$n" ]; do sleep 0.2; done
      elapsed=$(python3 -c "import time,sys; print(time.time() - float(sys.argv[1]))" "$start")
      batches=$(curl -sf "$URL/metrics" | awk '$1 == "dedup_consumer_batch_seconds_count" { print int($2) }' | tail -1)
      stop_last
      rate=$(steady "$db")
      rabbitmqctl -q delete_queue "$queue" >/dev/null || true
      q "$PG/postgres" "DROP DATABASE $db WITH (FORCE)" >/dev/null
      q "$PG/postgres" "CREATE DATABASE $db TEMPLATE ${TAG}_empty" >/dev/null
      q "$PG/$db" "CHECKPOINT" >/dev/null
      ceiling "$db" "$HERE/consumer_tx.sql"
      label="rabbitmq"
    fi
    q "$PG/postgres" "DROP DATABASE $db WITH (FORCE)" >/dev/null
    wall=$(python3 -c "import sys; print(round(int(sys.argv[1]) / float(sys.argv[2])))" "$n" "$elapsed")
    r=$(ratio "$rate" "$CEIL")
    RATIOS[$transport]="${RATIOS[$transport]:-} $r"
    printf '%s round %d %s: consumer %s events/s (wall %s: %s in %.2f s from start; %s batches, mean %s), ceiling %s events/s (pgbench -c %s -t %s, batch %s: tps x batch %s), ratio %s\n' \
      "$(date -u +%H:%M:%S)" "$round" "$label" "$rate" "$wall" "$n" "$elapsed" "${batches:-?}" \
      "$(python3 -c "import sys; print(round(int(sys.argv[1]) / max(1, int(sys.argv[2] or 0))))" "$n" "${batches:-0}")" \
      "$CEIL" "$WORKERS" "$TX" "$BATCH" "$CEIL_PGBENCH" "$r"
  done
done

for transport in $TRANSPORTS; do
  label=$([ "$transport" = database ] && echo "database queue" || echo rabbitmq)
  python3 -c "
import statistics, sys
r = [float(x) for x in sys.argv[2].split()]
print(f'consumer ({sys.argv[1]}): rate/ceiling median {statistics.median(r):.2f} (rounds: {sys.argv[2].strip()})')" "$label" "${RATIOS[$transport]}"
done
