#!/usr/bin/env bash
# What the console's generation indexes (issue 28: processed_events_N_at, processed_events_N_type)
# cost the consumer end to end on PostgreSQL: the "consumer alone on a template database" method
# of BENCHMARKS.md, one binary, three schemas that differ only by those indexes.
#
#   bench/console_indexes.sh prepare   # builds the templates (once, a few minutes)
#   bench/console_indexes.sh rounds "A B T A B T …"   # one drain per letter, in order
#   bench/console_indexes.sh calibrate
#   bench/console_indexes.sh drop      # drops the templates
# (BIN: the dedup-worker to run; default this tree's, built by prepare and rounds.)
#
# prepare: database ci_tpl_b migrated by $BIN (all migrations, the ten console indexes
#   included); the console indexes dropped for the load and built again after it from their
#   migration files (CONCURRENTLY removed); the ring filled as bench/dedup_window.sh does
#   (slots 0 and 1 sealed, slot 2 current; PER_GEN ids each, `evt_` + 32 hex, 16-byte sha256
#   keys) but with event types from the skewed 20-type Stripe mix of bench/console/fill.py,
#   received_at and delivery_attempt set, and generation times HEADROOM seconds (default one
#   day) later than the 30/20/10-day marks, so no rotation is due during the session. Then an
#   ingress-only `serve` takes EVENTS signed webhooks from examples/loadgen (--random-ids,
#   --duplicates DUPS) into the database queue; loadgen sends type invoice.paid only, so each
#   queued message's `message_type` (which the consumer takes as the event type, the signed
#   body untouched) is set from the same 20-type mix by a hash of its id. VACUUM ANALYZE,
#   CHECKPOINT. Then the copies:
#     ci_tpl_a  the ten console indexes dropped (before issue 28);
#     ci_tpl_t  only the five type indexes dropped (the time index kept);
#     ci_tpl_b  both kept (issue 28 as merged).
# rounds: for each letter, CREATE DATABASE ci_round TEMPLATE ci_tpl_<x> STRATEGY FILE_COPY,
#   CHECKPOINT, then `$BIN consume` (default settings, forward handler) started and timed until
#   `queue_messages` is empty (polled every 0.2 s, deadline 600 s); rate = queued messages /
#   seconds from start. Also printed: seconds from the first message gone to empty, the
#   current generation's index bytes after the drain, the cluster's WAL during the drain
#   (cluster-wide: other sessions' writes count too), and the CPU seconds of the consumer's
#   PostgreSQL backends and of the consume process. The round's database is dropped.
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
PER_GEN=${PER_GEN:-1500000}
EVENTS=${EVENTS:-300000}
DUPS=${DUPS:-0.2}
HEADROOM=${HEADROOM:-86400}
PORT=${PORT:-18097}
# The templates are kept between calls, so their names are fixed (ci_tpl_*), not the run's $TAG.
export PGHOST=127.0.0.1 PGPORT=5432 PGUSER=postgres
bench_library_schema
bench_worker_env
q() { bench_sql "$@"; }
now() { date +%s.%N; }

fill_slot() { # fill_slot SLOT FROM_S TO_S: PER_GEN ids processed uniformly in [now()-FROM, now()-TO)
  local u="((hashtext(event_id) & 2147483647) % 100000)"
  echo "INSERT INTO processed_events_$1 (key, source, event_id, event_type, processed_at, received_at, delivery_attempt)
    SELECT encode(substring(sha256(int4send(octet_length(source)) || convert_to(source, 'UTF8')
                                   || convert_to(event_id, 'UTF8')) FROM 1 FOR 16), 'hex')::uuid,
           source, event_id, $(python3 bench/console_indexes/types.py "$u"), at, at - interval '40 ms', 1
      FROM (SELECT 'stripe' AS source, 'evt_' || md5(random()::text || g::text || ' $1') AS event_id,
                   now() - make_interval(secs => $2) + random() * make_interval(secs => $2 - $3) AS at
              FROM generate_series(1, $PER_GEN) AS g) AS ids;"
}

prepare() {
  local day=86400 h=$HEADROOM db=ci_tpl_b url=$PG/ci_tpl_b t0
  for d in ci_tpl_a ci_tpl_t ci_tpl_b; do psql -X -q -c "DROP DATABASE IF EXISTS $d WITH (FORCE)" postgres; done
  psql -X -q -c "CREATE DATABASE $db" postgres
  DATABASE_URL=$url "$BIN" migrate >/dev/null
  local files; files=$(bench_console_index_files)
  for f in $files; do
    q "$db" "DROP INDEX $(bench_index_name "$f")" >/dev/null
  done
  t0=$(now)
  {
    echo "BEGIN;"
    bench_ring_generations "$h"
    fill_slot 0 $((30 * day - h)) $((20 * day - h))
    fill_slot 1 $((20 * day - h)) $((10 * day - h))
    fill_slot 2 $((10 * day - h)) 0
    echo "COMMIT;"
  } | psql -X -q -v ON_ERROR_STOP=1 "$db"
  echo "fill: $(python3 -c "print(round($(now) - $t0))") s"
  t0=$(now)
  for f in $files; do
    psql -X -q -v ON_ERROR_STOP=1 -c "SET maintenance_work_mem = '256MB'" -c "$(bench_index_statement "$f")" "$db"
  done
  echo "console indexes: $(python3 -c "print(round($(now) - $t0))") s"

  DATABASE_URL=$url DEDUP_LISTEN=127.0.0.1:$PORT DEDUP_ROLES__CONSUMER=false DEDUP_ROLES__RELAY=false \
    bench_start_worker "$WORK/ingress.log" "$BIN" serve
  "$OUT/examples/loadgen" --url "$URL/webhooks/stripe" --connections 64 \
    --seconds 300 --requests "$EVENTS" --duplicates "$DUPS" --prefix evt_ci --random-ids
  bench_stop_last
  local u="((hashtext(message_id) & 2147483647) % 100000)"
  q "$db" "UPDATE queue_messages SET message_type = $(python3 bench/console_indexes/types.py "$u")" >/dev/null
  psql -X -q -c "VACUUM ANALYZE" -c "CHECKPOINT" "$db"
  q "$db" "SELECT 'queued ' || count(*) || ' messages, ' || count(DISTINCT message_id) || ' distinct ids, '
           || count(DISTINCT message_type) || ' types' FROM queue_messages"
  q "$db" "SELECT 'ids: slot 0 ' || (SELECT count(*) FROM processed_events_0) || ', slot 1 '
           || (SELECT count(*) FROM processed_events_1) || ', slot 2 (current) ' || (SELECT count(*) FROM processed_events_2)"
  q "$db" "SELECT c.relname || ' ' || pg_size_pretty(pg_relation_size(c.oid)) FROM pg_class c
          WHERE c.relnamespace = 'dedup_worker'::regnamespace AND c.relname ~ '^processed_events_2' ORDER BY 1"
  psql -X -q -c "CREATE DATABASE ci_tpl_a TEMPLATE ci_tpl_b STRATEGY FILE_COPY" \
    -c "CREATE DATABASE ci_tpl_t TEMPLATE ci_tpl_b STRATEGY FILE_COPY" postgres
  for n in 0 1 2 3 4; do
    q ci_tpl_a "DROP INDEX processed_events_${n}_at; DROP INDEX processed_events_${n}_type" >/dev/null
    q ci_tpl_t "DROP INDEX processed_events_${n}_type" >/dev/null
  done
  psql -X -q -c "CHECKPOINT" postgres
  for d in ci_tpl_a ci_tpl_t ci_tpl_b; do echo "$d: $(q postgres "SELECT pg_size_pretty(pg_database_size('$d'))")"; done
}

round() { # round X (a, t or b)
  local x=${1,,} db=ci_round url=$PG/ci_round
  psql -X -q -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" \
    -c "CREATE DATABASE $db TEMPLATE ci_tpl_$x STRATEGY FILE_COPY" -c "CHECKPOINT" postgres
  local total before wal0 start first='' elapsed left deadline
  total=$(q "$url" "SELECT count(*) FROM queue_messages")
  before=$(q "$url" "SELECT count(*) FROM processed_events_2")
  wal0=$(q "$url" "SELECT pg_current_wal_lsn()")
  start=$(now)
  DATABASE_URL=$url DEDUP_LISTEN=127.0.0.1:0 bench_spawn "$WORK/consume.log" "$BIN" consume
  local pid=$LAST
  deadline=$((SECONDS + 600))
  while :; do
    left=$(q "$url" "SELECT count(*) FROM queue_messages")
    [ -n "$first" ] || [ "$left" = "$total" ] || first=$(now)
    [ "$left" = 0 ] && break
    ((SECONDS < deadline)) || { echo "round $x NOT drained after 600 s ($left left)"; break; }
    kill -0 "$pid" 2>/dev/null || { echo "consume exited:"; cat "$WORK/consume.log"; break; }
    sleep 0.2
  done
  elapsed=$(python3 -c "print($(now) - $start)")
  # CPU seconds of the consumer's PostgreSQL backends (user + system, /proc/<pid>/stat) and of
  # the consume process, read before it stops: less moved by the machine's noise than seconds.
  local bpids cpu
  bpids=$(q postgres "SELECT pid FROM pg_stat_activity WHERE datname = '$db' AND backend_type = 'client backend'
                        AND application_name <> 'psql'")
  cpu=$(for b in $bpids "$pid"; do awk '{ print $14 + $15 }' "/proc/$b/stat" 2>/dev/null || true; done |
    awk -v hz="$(getconf CLK_TCK)" '{ if (NR > 1) pg += $1; last = $1; n++ } END { }
      { a[NR] = $1 } END { s = 0; for (i = 1; i < NR; i++) s += a[i]; printf "PostgreSQL backends %.1f s, consume %.1f s CPU", s / hz, a[NR] / hz }')
  bench_stop "$pid"
  local after wal idx
  after=$(q "$url" "SELECT count(*) FROM processed_events_2")
  wal=$(q "$url" "SELECT pg_size_pretty(pg_current_wal_lsn() - '$wal0'::pg_lsn)")
  idx=$(q "$url" "SELECT pg_size_pretty(pg_indexes_size('processed_events_2'))")
  python3 -c "
import sys
x, total, el, first, start, new, wal, idx, cpu = sys.argv[1:]
tail = f'{int(total) / (float(start) + float(el) - float(first)):.0f}/s from the first ack' if first else ''
print(f'{x.upper()} {int(total) / float(el):.0f} events/s: {total} in {float(el):.1f} s ({tail}); {new} new ids; current generation indexes {idx}; cluster WAL {wal}; {cpu}')
" "$x" "$total" "$elapsed" "$first" "$start" "$((after - before))" "$wal" "$idx" "$cpu"
  psql -X -q -c "DROP DATABASE $db WITH (FORCE)" postgres
}

case ${1:-} in
  prepare) bench_bin --example loadgen; prepare ;;
  calibrate) bench_calibrate ;;
  rounds) bench_bin; bench_at_exit bench_dropdb ci_round; echo "$(date -u '+%Y-%m-%d %H:%M:%S UTC') rounds: $2"; for x in $2; do round "$x"; done ;;
  drop) for d in ci_tpl_a ci_tpl_t ci_tpl_b ci_round; do psql -X -q -c "DROP DATABASE IF EXISTS $d WITH (FORCE)" postgres; done ;;
  *) echo "usage: $0 prepare|calibrate|rounds \"A B T …\"|drop" >&2; exit 2 ;;
esac
