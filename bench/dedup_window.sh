#!/usr/bin/env bash
# The dedup window at production size (issue 13): consumer events/s and batch p99 as retained
# ids accumulate, on PostgreSQL, through RabbitMQ, as bench/rabbitmq_drain.sh measures it.
# For each retained size:
#   1. a fresh database, migrated by the binary, with `retained` random processed ids
#      (`evt_` + 32 hex characters, processed over the last 30 days) inserted by generate_series,
#      then VACUUM ANALYZE and a CHECKPOINT, so every round starts from the same state;
#   2. an ingress-only process accepts N signed webhooks with Stripe-like random ids, a
#      fraction repeating earlier ids, into a fresh RabbitMQ queue;
#   3. a consume-only process (default settings) drains it; the round reports the rate, the
#      consumer's batch p99 (its /metrics summary), and the table's heap and index bytes.
# On SQLite (4th argument `sqlite`) the same, with the database file's size per id in place of
# PostgreSQL's heap, index and WAL figures.
# With EXPIRED=n in the environment (PostgreSQL), n more ids processed 31 days ago are added:
# the consume process's retention (which runs at start) deletes them while it drains, so the
# batch p99 shows what retention costs the consumer.
# Usage: bench/dedup_window.sh "0 1000000 10000000" [events] [duplicate fraction] [postgres|sqlite]
set -euo pipefail
cd "$(dirname "$0")/.."
SIZES=${1:-"0 1000000"}
EVENTS=${2:-30000}
DUPLICATES=${3:-0.2}
BACKEND=${4:-postgres}
EXPIRED=${EXPIRED:-0}
PORT=18083
PG=postgres://postgres@127.0.0.1:5432
WORK=$(mktemp -d)
cargo build --release --quiet --bin dedup-worker --example loadgen
export STRIPE_WEBHOOK_SECRET=whsec_bench RUST_LOG=warn DEDUP_TRANSPORT=rabbitmq

metric() { # a line of the consumer's /metrics, by its exact name and labels
  curl -sf "http://127.0.0.1:$((PORT + 1))/metrics" |
    awk -v m="$1" '$1 == m { print $2; found = 1 } END { if (!found) print 0 }'
}
cleanup() {
  pkill -f "target/release/dedup-worker" 2>/dev/null || true
  for q in $(rabbitmqctl -q list_queues name | grep "^dw_bench_window_$$" || true); do
    rabbitmqctl -q delete_queue "$q" >/dev/null || true
  done
  for db in $(psql "$PG/postgres" -tAc "SELECT datname FROM pg_database WHERE datname LIKE 'dw_bench_window_$$%'"); do
    psql "$PG/postgres" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)"
  done
  rm -rf "$WORK"
}
trap cleanup EXIT

round=0
for retained in $SIZES; do
  round=$((round + 1))
  db=dw_bench_window_$$_$round
  export DEDUP_QUEUE="dw_bench_window_$$_$round"
  if [ "$BACKEND" = sqlite ]; then
    export DATABASE_URL="sqlite://$WORK/$db.db"
  else
    psql "$PG/postgres" -qc "CREATE DATABASE $db"
    export DATABASE_URL="$PG/$db"
  fi
  target/release/dedup-worker migrate >/dev/null
  fill_start=$(date +%s)
  if [ "$BACKEND" = sqlite ]; then
    sqlite3 "$WORK/$db.db" "PRAGMA journal_mode = WAL;
      WITH RECURSIVE g(x) AS (SELECT 1 WHERE $retained > 0 UNION ALL SELECT x + 1 FROM g WHERE x < $retained)
      INSERT INTO processed_events (source, event_id, event_type, processed_at)
      SELECT 'stripe', 'evt_' || lower(hex(randomblob(16))), 'invoice.paid',
             CAST(unixepoch('now') * 1000 - abs(random() % 2592000000) AS INTEGER) FROM g;
      PRAGMA wal_checkpoint(TRUNCATE);" >/dev/null
  else
    psql "$DATABASE_URL" -qc "INSERT INTO processed_events (source, event_id, event_type, processed_at)
        SELECT 'stripe', 'evt_' || md5(random()::text || g::text), 'invoice.paid',
               now() - random() * interval '30 days'
        FROM generate_series(1, $retained) AS g"
    psql "$DATABASE_URL" -qc "INSERT INTO processed_events (source, event_id, event_type, processed_at)
        SELECT 'stripe', 'evt_' || md5(random()::text || g::text || 'expired'), 'invoice.paid',
               now() - interval '31 days' + random() * interval '1 day'
        FROM generate_series(1, $EXPIRED) AS g"
    psql "$DATABASE_URL" -qc "VACUUM ANALYZE processed_events" -c "CHECKPOINT"
  fi
  fill=$(($(date +%s) - fill_start))

  DEDUP_LISTEN=127.0.0.1:$PORT DEDUP_ROLES__CONSUMER=false DEDUP_ROLES__RELAY=false \
    target/release/dedup-worker serve >"$WORK/ingress.log" 2>&1 &
  until curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null; do sleep 0.1; done
  target/release/examples/loadgen --url "http://127.0.0.1:$PORT/webhooks/stripe" \
    --connections 64 --seconds 300 --requests "$EVENTS" --duplicates "$DUPLICATES" \
    --prefix "evt_window_$round" --random-ids >"$WORK/load.log"
  pkill -f "target/release/dedup-worker serve"; sleep 0.5
  queued=$(awk '{ for (i = 1; i < NF; i++) if ($i == "requests:") n = $(i + 1);
                  for (i = 1; i < NF; i++) if ($i == "non-2xx:") f = $(i + 1) }
                END { sub(";", "", f); print n - f }' "$WORK/load.log")
  if [ "$BACKEND" = postgres ]; then
    wal_before=$(psql "$DATABASE_URL" -tAc "SELECT pg_current_wal_lsn()")
  fi

  start=$(date +%s.%N)
  DEDUP_LISTEN=127.0.0.1:$((PORT + 1)) DEDUP_ROLES__INGRESS=false DEDUP_ROLES__RELAY=false \
    target/release/dedup-worker serve >"$WORK/consume.log" 2>&1 &
  deadline=$((SECONDS + 600))
  outcome=drained
  until [ "$(metric dedup_events_received_total | cut -d. -f1)" -ge "$queued" ]; do
    if ((SECONDS > deadline)); then outcome="NOT drained after 600 s"; break; fi
    sleep 0.2
  done
  elapsed=$(python3 -c "import time,sys; print(f'{time.time()-float(sys.argv[1]):.2f}')" "$start")
  p99=$(metric 'dedup_consumer_batch_seconds{quantile="0.99"}')
  p50=$(metric 'dedup_consumer_batch_seconds{quantile="0.5"}')
  pkill -f "target/release/dedup-worker serve"; sleep 0.5
  if [ "$BACKEND" = sqlite ]; then
    sizes=$(python3 -c "import os,sqlite3,sys; f=sys.argv[1]; n=sqlite3.connect(f).execute('SELECT count(*) FROM processed_events').fetchone()[0]; b=os.path.getsize(f); print(f'{b/1e6:.0f} MB file, {b/max(n,1):.0f} B/id (whole file)')" "$WORK/$db.db")
  else
  sizes=$(psql "$DATABASE_URL" -tAc "SELECT pg_size_pretty(pg_table_size('processed_events')) || ' heap, ' ||
      pg_size_pretty(pg_indexes_size('processed_events')) || ' indexes, ' ||
      round((pg_table_size('processed_events') + pg_indexes_size('processed_events'))::numeric
            / greatest(count(*), 1)) || ' B/id; WAL ' ||
      pg_size_pretty(pg_current_wal_lsn() - '$wal_before'::pg_lsn) FROM processed_events")
  fi
  left=$( [ "$BACKEND" = postgres ] && psql "$DATABASE_URL" -tAc "SELECT count(*) FROM processed_events WHERE processed_at < now() - interval '30 days'" || echo 0)
  echo "retained $retained + $EXPIRED expired ($left left after the drain) (filled in ${fill}s): $queued messages $outcome in ${elapsed} s" \
    "= $(python3 -c "print(int($queued / $elapsed))") messages/s; batch p50 $(python3 -c "print(round($p50*1000,1))") ms," \
    "p99 $(python3 -c "print(round($p99*1000,1))") ms; $sizes"
  if [ "$BACKEND" = sqlite ]; then
    rm -f "$WORK/$db.db"*
  else
    psql "$PG/postgres" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)"
  fi
done
