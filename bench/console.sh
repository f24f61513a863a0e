#!/usr/bin/env bash
# The operator console's reads at production size (issue 28): `/events` by id, by type prefix
# and a one-day range (outcome any and handled, first and second page), and the event page,
# p50 / p95 / max over N sequential requests each, with IDS retained ids and OUTBOX outbox rows
# on PostgreSQL. Target: p95 under 200 ms.
#
# 1. Machine facts, then the calibration the rest of BENCHMARKS.md uses: `pgbench -n -M prepared
#    -c 16 -j 2 -T 8` of a one-row insert (a throwaway table in a scratch database, durable
#    commits).
# 2. The database $DB (default bench_console): if it holds a finished fill of the same IDS and
#    OUTBOX (public.bench_console_meta, and that many ids in the generation tables), it is
#    reused; otherwise it is created anew: `dedup-worker migrate` makes the real schema, the
#    console's ten generation indexes (processed_events_N_at, processed_events_N_type) are
#    dropped, bench/console/fill.py's SQL fills every table (INSERT … SELECT generate_series,
#    at most 1,000,000 ids per statement; the primary keys and every other index stay during the
#    load), the ten indexes are built again from their migration files' own statements
#    (CONCURRENTLY removed: nothing else runs), then VACUUM ANALYZE and CHECKPOINT. Fill and
#    index times and sizes are printed. See bench/console/fill.py for what the rows are.
# 3. `dedup-worker serve` with only the HTTP side (consumer and relay off) and the console on
#    127.0.0.1:$PORT; bench/console/measure.py (one keep-alive connection, WARMUP untimed then
#    N timed requests per shape, random ids and windows) prints the table; ROUNDS rounds.
# 4. EXPLAIN (ANALYZE, BUFFERS) of the slowest listing shape, each outcome's statement as the
#    console runs it (bench/console/explain.py: prepared, 7th execution).
# The database is kept (re-runs skip the fill); `dropdb bench_console` removes it.
# Usage: [IDS=10000000] [OUTBOX=1000000] [N=200] [WARMUP=20] [ROUNDS=1] [DB=bench_console]
#        [PORT=18090] [BIN=path] bench/console.sh
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
IDS=${IDS:-10000000}
OUTBOX=${OUTBOX:-1000000}
N=${N:-200}
WARMUP=${WARMUP:-20}
ROUNDS=${ROUNDS:-1}
DB=${DB:-bench_console}
PORT=${PORT:-18090}
TOKEN=bench-console-token-0123456789
export PGHOST=127.0.0.1 PGPORT=5432 PGUSER=postgres PGOPTIONS='-c client_min_messages=warning'
URL=$PG/$DB
# shellcheck disable=SC2119 # no other target to build
bench_bin
q() { psql -X -At -v ON_ERROR_STOP=1 -c "SET search_path = dedup_worker, public" -c "$1" "$DB" | tail -n +2; }

echo "== machine ($(date -u '+%Y-%m-%d %H:%M UTC'))"
echo "$(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(free -g | awk '/Mem:/ {print $2}') GiB RAM, load average $(cut -d' ' -f1-3 /proc/loadavg)"
psql -X -At -c "SELECT version()" postgres | cut -d, -f1
psql -X -At -c "SELECT 'shared_buffers ' || current_setting('shared_buffers') || ', work_mem ' || current_setting('work_mem') || ', random_page_cost ' || current_setting('random_page_cost') || ', effective_cache_size ' || current_setting('effective_cache_size') || ', jit ' || current_setting('jit')" postgres
echo "binary: $BIN ($(stat -c %y "$BIN" | cut -d. -f1))"

bench_calibrate

filled() {
  psql -X -At -c "SELECT 1" "$DB" >/dev/null 2>&1 || return 1
  local meta
  meta=$(psql -X -At -c "SELECT ids, outbox_target, done FROM public.bench_console_meta" "$DB" 2>/dev/null) || return 1
  [ "$meta" = "$IDS|$OUTBOX|t" ] || return 1
  local n
  n=$(q "SELECT (SELECT count(*) FROM processed_events_0) + (SELECT count(*) FROM processed_events_1)
          + (SELECT count(*) FROM processed_events_2) + (SELECT count(*) FROM processed_events_3)
          + (SELECT count(*) FROM processed_events_4)")
  [ "$n" = "$IDS" ]
}

GEN_INDEX_FILES=$(bench_console_index_files)
if filled; then
  echo "== $DB: filled already ($IDS ids, outbox target $OUTBOX), reused"
else
  echo "== filling $DB: $IDS ids, ~$OUTBOX outbox rows"
  psql -X -q -c "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB" postgres
  DATABASE_URL=$URL RUST_LOG=warn "$BIN" migrate
  # The console's generation indexes: dropped for the load, built again below from their files.
  for f in $GEN_INDEX_FILES; do
    q "DROP INDEX $(bench_index_name "$f")" >/dev/null
  done
  T0=$(date +%s)
  start=$(date +%s.%N)
  python3 bench/console/fill.py "$IDS" "$OUTBOX" "$T0" | psql -X -q "$DB"
  fill_s=$(echo "$(date +%s.%N) - $start" | bc)
  start=$(date +%s.%N)
  for f in $GEN_INDEX_FILES; do
    stmt=$(bench_index_statement "$f")
    psql -X -q -v ON_ERROR_STOP=1 -c "SET search_path = dedup_worker" -c "SET maintenance_work_mem = '512MB'" -c "$stmt" "$DB"
  done
  index_s=$(echo "$(date +%s.%N) - $start" | bc)
  start=$(date +%s.%N)
  psql -X -q -c "SET search_path = dedup_worker" -c "VACUUM ANALYZE" -c "CHECKPOINT" "$DB"
  vacuum_s=$(echo "$(date +%s.%N) - $start" | bc)
  psql -X -q -c "UPDATE public.bench_console_meta SET done = true, fill_seconds = $fill_s, index_seconds = $index_s" "$DB"
  printf 'fill %.0f s (inserts, primary keys and other indexes maintained), generation indexes %.0f s, VACUUM ANALYZE + CHECKPOINT %.0f s\n' \
    "$fill_s" "$index_s" "$vacuum_s"
fi
T0=$(psql -X -At -c "SELECT t0 FROM public.bench_console_meta" "$DB")
echo "T0 (fill time, newest ids just before it): $(date -u -d @"$T0" '+%Y-%m-%d %H:%M:%S UTC')"
echo "database size: $(psql -X -At -c "SELECT pg_size_pretty(pg_database_size('$DB'))" postgres)"
q "SELECT rpad(t, 24) || lpad(to_char(n, 'FM999,999,999'), 12) || '  heap ' || pg_size_pretty(h) || ', indexes ' || pg_size_pretty(i)
     FROM (SELECT 'processed_events_0..4' AS t, sum(c.reltuples)::int8 AS n, sum(pg_relation_size(c.oid)) AS h, sum(pg_indexes_size(c.oid)) AS i
             FROM pg_class c WHERE c.relname ~ '^processed_events_[0-4]$' AND c.relnamespace = 'dedup_worker'::regnamespace
           UNION ALL SELECT 'duplicate_deliveries', sum(c.reltuples)::int8, sum(pg_relation_size(c.oid)), sum(pg_indexes_size(c.oid))
             FROM pg_class c WHERE c.relname ~ '^duplicate_deliveries_[0-4]$' AND c.relnamespace = 'dedup_worker'::regnamespace
           UNION ALL SELECT relname, reltuples::int8, pg_relation_size(oid), pg_indexes_size(oid) FROM pg_class
            WHERE relname IN ('outbox', 'dead_letters') AND relnamespace = 'dedup_worker'::regnamespace) s"
q "SELECT 'generation ' || g.slot || ': ' || to_char(g.started_at, 'MM-DD HH24:MI') || ' .. ' || coalesce(to_char(g.sealed_at, 'MM-DD HH24:MI'), 'current')
          || ', ' || to_char(c.reltuples, 'FM999,999,999') || ' ids'
     FROM dedup_generations g JOIN pg_class c ON c.relname = 'processed_events_' || g.slot AND c.relnamespace = 'dedup_worker'::regnamespace ORDER BY slot"
q "SELECT 'outbox ' || status || ': ' || count(*) FROM outbox GROUP BY status ORDER BY status"

echo "== serve (console on 127.0.0.1:$PORT, consumer and relay off)"
DATABASE_URL=$URL STRIPE_WEBHOOK_SECRET=whsec_bench DEDUP_LISTEN=127.0.0.1:0 RUST_LOG=warn \
  DEDUP_ROLES__CONSUMER=false DEDUP_ROLES__RELAY=false \
  DEDUP_ADMIN__LISTEN=127.0.0.1:$PORT DEDUP_ADMIN__TOKEN=$TOKEN \
  bench_spawn "$WORK/serve.log" "$BIN" serve
bench_wait_until "the console" 60 "$LAST" curl -sf -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$PORT/events"

for r in $(seq 1 "$ROUNDS"); do
  echo "== round $r: $N requests per shape after $WARMUP, sequential, one connection ($(date -u '+%H:%M:%S UTC'), load $(cut -d' ' -f1-3 /proc/loadavg))"
  python3 bench/console/measure.py "$PORT" "$TOKEN" "$IDS" "$T0" "$N" "$WARMUP" "$r" | tee "$WORK/round$r"
done
grep -i 'warn\|error' "$WORK/serve.log" | head -5 || true

# The slowest listing shape (by p95 over the rounds): each outcome's statement, EXPLAINed.
slowest=$(cat "$WORK"/round* | sed -n 's/^JSON //p' | python3 -c '
import json, sys
rows = [r for line in sys.stdin for r in json.loads(line) if "type=" in r["shape"]]
r = max(rows, key=lambda r: r["p95"])
prefix = r["shape"].split("type=")[1].split(" ")[0]
kinds = "handled" if "handled" in r["shape"] else "handled duplicate dead_letter stale pending"
print(prefix, kinds, "|", r["shape"], "p95 %.1f ms" % r["p95"])')
prefix=${slowest%% *}
kinds=$(echo "$slowest" | cut -d'|' -f1 | cut -d' ' -f2-)
since=$(( (T0 - 15 * 86400) * 1000000 ))
until=$(( since + 86400 * 1000000 ))
echo "== EXPLAIN (ANALYZE, BUFFERS), the slowest listing shape: $(echo "$slowest" | cut -d'|' -f2-)"
echo "   window $(date -u -d @$((since / 1000000)) '+%Y-%m-%dT%H:%M:%S') + 1 day, first page"
for kind in $kinds; do
  echo "-- outcome $kind"
  python3 bench/console/explain.py "$kind" "$prefix" "$since" "$until" |
    PGOPTIONS='-c client_min_messages=warning -c search_path=dedup_worker,public' psql -X -q "$DB" | grep -v '^$'
done
