#!/usr/bin/env bash
# Kept bodies at 10 million (issue 40): searches by customer, object id and event id, and a
# day's partition dropped while the consumer runs at full rate. Not in CI.
#
# 1. Machine facts and the calibration line (bench/lib.sh: pgbench of a one-row insert).
# 2. The database $DB (default dedup_bench_history), kept between runs: `dedup-worker migrate`
#    if new, then examples/bench_fill_bodies fills each missing past day (DAYS days of PER_DAY
#    bodies: standalone tables, COPY, indexes, ATTACH; public.bench_history_meta records each
#    finished day, so a re-run after the drop below refills just that day). Refuses to fill with
#    less than 25 GB free. Sizes: heap, TOAST and indexes per body.
# 3. Reads: examples/bench_history_reads, N timed after WARMUP untimed per shape over one
#    connection, ROUNDS rounds; EXPLAIN (ANALYZE, BUFFERS) of each shape after the last.
# 4. Drop under load: a backlog queued by loadgen (BACKLOG_SECONDS, ingress only, as
#    bench/pipeline.sh), then `dedup-worker serve` (ingress + consumer, sink `log`, relay off)
#    with loadgen (CONNECTIONS) still sending for LOAD_SECONDS; at DROP_AT s `dedup-worker
#    retention run` with payload_days = DAYS - 1, so the oldest day expires. Prints the pass's
#    JSON (detach and drop times), the consumer's handled events/s in the 10 s before, during
#    and the 10 s after, and dedup_consumer_step_failures_total before and after.
# PREBUILT=DIR runs DIR's binaries as they are (no build); where DIR has not the two examples,
# bench/history/fill_libzstd.py (POOL=N: bodies drawn from N made once, ids and search columns
# per row) and bench/history/measure_psql.py stand in for them.
# Every timed step holds /tmp/bench.lock (flock), so two benchmarks on this shared machine never
# measure at once; the fill does not (it is not measured, and is long).
# Needs: psql, pgbench, flock, curl, python3, cargo; PostgreSQL at $PG (trust).
# Usage: [DB=dedup_bench_history] [DAYS=10] [PER_DAY=1000000] [N=200] [WARMUP=20] [ROUNDS=3]
#        [CONNECTIONS=64] [BACKLOG_SECONDS=20] [LOAD_SECONDS=40] [DROP_AT=20] [SKIP_DROP=]
#        [PREBUILT=target/release] [POOL=0] bench/history.sh
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
DB=${DB:-dedup_bench_history}
DAYS=${DAYS:-10}
PER_DAY=${PER_DAY:-1000000}
N=${N:-200}
WARMUP=${WARMUP:-20}
ROUNDS=${ROUNDS:-3}
CONNECTIONS=${CONNECTIONS:-64}
LOAD_SECONDS=${LOAD_SECONDS:-40}
DROP_AT=${DROP_AT:-20}
BACKLOG_SECONDS=${BACKLOG_SECONDS:-20}
LOCK=/tmp/bench.lock
URL_DB=$PG/$DB
export PGOPTIONS='-c client_min_messages=warning'
if [ -n "${PREBUILT:-}" ]; then
  # A build directory as it is (no build): the fill and reads fall back to their Python
  # stand-ins (bench/history/*.py) where its examples lack them.
  OUT=$(bench_caller_path "$PREBUILT")
  BIN=$OUT/dedup-worker
else
  bench_bin --example loadgen --example bench_fill_bodies --example bench_history_reads
fi
q() { psql -X -At -v ON_ERROR_STOP=1 -c "SET search_path = dedup_worker, public" -c "$1" "$URL_DB" | tail -n +2; }
load() { cut -d' ' -f1-3 /proc/loadavg; }

echo "== machine ($(date -u '+%Y-%m-%d %H:%M UTC'))"
echo "$(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(free -g | awk '/Mem:/ {print $2}') GiB RAM, load average $(load)"
psql -X -At -c "SELECT version()" "$PG/postgres" | cut -d, -f1
psql -X -At -c "SELECT 'shared_buffers ' || current_setting('shared_buffers') || ', work_mem ' || current_setting('work_mem') || ', random_page_cost ' || current_setting('random_page_cost') || ', jit ' || current_setting('jit')" "$PG/postgres"
echo "binary: $BIN ($(stat -c %y "$BIN" | cut -d. -f1))"
exec 9>"$LOCK"
flock 9
bench_calibrate
flock -u 9

echo "== $DB: $DAYS days × $PER_DAY bodies"
if ! psql -X -At -c "SELECT 1" "$URL_DB" >/dev/null 2>&1; then
  psql -X -q -c "CREATE DATABASE $DB" "$PG/postgres"
  DATABASE_URL=$URL_DB RUST_LOG=warn "$BIN" migrate
fi
missing=$(psql -X -At -c "SELECT $DAYS - count(*) FROM public.bench_history_meta
            WHERE day >= current_date - $DAYS AND bodies = $PER_DAY
              AND to_regclass('dedup_worker.event_bodies_p' || to_char(day, 'YYYYMMDD')) IS NOT NULL" \
            "$URL_DB" 2>/dev/null || echo "$DAYS")
if [ "$missing" != 0 ]; then
  free_gb=$(df -BG --output=avail "$(psql -X -At -c 'SHOW data_directory' "$PG/postgres" 2>/dev/null || echo /)" | tail -1 | tr -dc 0-9)
  if ((free_gb < 25)); then
    echo "only $free_gb GB free: the fill needs ~12 GB and leaves the machine 15 GB at least; refused" >&2
    exit 1
  fi
  echo "filling $missing day(s) ($free_gb GB free, load $(load))"
  start=$(date +%s.%N)
  if [ -x "$OUT/examples/bench_fill_bodies" ]; then
    "$OUT/examples/bench_fill_bodies" --url "$URL_DB" --days "$DAYS" --per-day "$PER_DAY"
  else
    q "CREATE TABLE IF NOT EXISTS public.bench_history_meta (day DATE PRIMARY KEY,
         bodies BIGINT NOT NULL, customers INT NOT NULL, seconds DOUBLE PRECISION NOT NULL)" >/dev/null
    python3 bench/history/fill_libzstd.py "$URL_DB" "$DAYS" "$PER_DAY" 0 2 "${POOL:-0}" &
    python3 bench/history/fill_libzstd.py "$URL_DB" "$DAYS" "$PER_DAY" 1 2 "${POOL:-0}"
    wait
  fi
  q "ANALYZE event_bodies" >/dev/null # the parent's own statistics: autovacuum never gathers them
  q "CHECKPOINT" >/dev/null
  printf 'fill %.0f s (all days, indexes, ANALYZE, CHECKPOINT)\n' "$(bench_since "$start")"
fi
echo "database size: $(psql -X -At -c "SELECT pg_size_pretty(pg_database_size('$DB'))" "$PG/postgres")"
q "SELECT count(*) || ' partitions, ' || to_char(sum(c.reltuples), 'FM999,999,999') || ' bodies: heap '
          || pg_size_pretty(sum(pg_relation_size(c.oid))) || ', TOAST ' || pg_size_pretty(sum(pg_total_relation_size(c.reltoastrelid)))
          || ', indexes ' || pg_size_pretty(sum(pg_indexes_size(c.oid))) || '; per body: '
          || round(sum(pg_relation_size(c.oid) + coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0)) / sum(c.reltuples)) || ' B table + '
          || round(sum(pg_indexes_size(c.oid)) / sum(c.reltuples)) || ' B indexes'
     FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'event_bodies'::regclass AND c.reltuples > 0"
q "SELECT 'stored body ' || round(avg(length(body))) || ' B average (encoding 1: ' || round(100.0 * avg((encoding = 1)::int)) || ' %)'
     FROM event_bodies TABLESAMPLE SYSTEM (0.1) WHERE kept_at < date_trunc('day', now())"

for r in $(seq 1 "$ROUNDS"); do
  explain=
  [ "$r" != "$ROUNDS" ] || explain=--explain
  echo "== reads, round $r of $ROUNDS: $N timed after $WARMUP per shape, one connection ($(date -u +%H:%M:%S), load $(load))"
  if [ -x "$OUT/examples/bench_history_reads" ]; then
    flock "$LOCK" "$OUT/examples/bench_history_reads" --url "$URL_DB" --n "$N" --warmup "$WARMUP" $explain
  else
    flock "$LOCK" python3 bench/history/measure_psql.py "$URL_DB" "$N" "$WARMUP" $explain
  fi
done

[ -z "${SKIP_DROP:-}" ] || exit 0
# shellcheck source=bench/history/drop_under_load.sh
source bench/history/drop_under_load.sh
