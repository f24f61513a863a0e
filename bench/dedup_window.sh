#!/usr/bin/env bash
# The dedup window at production size (issue 13): consumer events/s and batch p99 as retained
# ids accumulate, on PostgreSQL, through RabbitMQ, as bench/rabbitmq_drain.sh measures it.
# For each retained size:
#   1. a fresh database, migrated by the binary ($BIN migrate), filled with `retained` random
#      processed ids (`evt_` + 32 hex characters, source 'stripe', type 'invoice.paid', processed
#      over the last 30 days), then VACUUM ANALYZE and a CHECKPOINT, so every round starts from
#      the same state. The fill follows the schema the binary migrated to:
#      - old layout (one table `processed_events`): the ids go into it (generate_series);
#      - ring layout (`processed_events_0` … `_4` and `dedup_generations`, issue 13): the worst
#        case, just before a rotation. A third of the ids in each of three generations: slot 0
#        (sealed, the oldest ten days), slot 1 (sealed, the ten days after), slot 2 (the current
#        generation, the last ten days), each id under its 16-byte key (the first half of
#        sha256(be_u32(byte length of source) || source || event_id)); dedup_generations holds
#        exactly those slots. All generation times lie ROTATION_HEADROOM seconds (default 3600)
#        later than the 30/20/10-day marks, so that the current generation, started
#        10 days − 1 hour ago, is not yet due for rotation when the consumer starts (0: exactly
#        on the marks). PostgreSQL keys by SQL sha256 in generate_series; SQLite by a Python
#        script (sqlite3 + hashlib, times in Unix ms);
#   2. an ingress-only process accepts N signed webhooks with Stripe-like random ids, a
#      fraction repeating earlier ids, into a fresh RabbitMQ queue;
#   3. CONSUMERS consume-only processes (default 1; default settings each, on the same queue,
#      /metrics on ports PORT+1, PORT+2, …) drain it; the round reports the rate (deliveries
#      summed over the processes, each process's share in parentheses), the consumer's batch
#      p50 and p99 (from the histogram buckets of every process, summed), the dedup tables'
#      heap and index bytes (on the ring layout summed over processed_events_legacy and
#      processed_events_0 … _4) and, on the ring, the rows in the current generation's table
#      after the drain.
# On SQLite (4th argument `sqlite`) the same, with the database file's size per id in place of
# PostgreSQL's heap, index and WAL figures.
# With EXPIRED=n in the environment, n more ids processed past the window are added: on the old
# layout processed 31 days ago (within one day); on the ring, in slot 3, a generation started
# 41 days ago and sealed 31 days ago, its ids processed in between. The consume process's
# retention (which runs at start) deletes them (ring: empties slot 3) while it drains, so the
# batch p99 shows what retention costs the consumer; the round reports how many are left.
# BIN in the environment: the dedup-worker binary to run (default target/release/dedup-worker,
# built here), e.g. an older build for the old schema and a newer one, back to back; loadgen is
# always this checkout's.
# Usage: [BIN=path] [CONSUMERS=n] [EXPIRED=n] [ROTATION_HEADROOM=s] \
#   bench/dedup_window.sh "0 1000000 10000000" [events] [duplicate fraction] [postgres|sqlite]
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
SIZES=${1:-"0 1000000"}
EVENTS=${2:-30000}
DUPLICATES=${3:-0.2}
BACKEND=${4:-postgres}
EXPIRED=${EXPIRED:-0}
CONSUMERS=${CONSUMERS:-1}
ROTATION_HEADROOM=${ROTATION_HEADROOM:-3600}
PORT=18083
bench_library_schema
bench_bin --example loadgen
bench_worker_env
export DEDUP_TRANSPORT=rabbitmq
bench_at_exit bench_delete_queues

received() { # deliveries settled (duplicates included), summed over the consume processes
  local i
  for i in $(seq 1 "$CONSUMERS"); do bench_metric "http://127.0.0.1:$((PORT + i))" dedup_events_received_total; done |
    awk '{ n += $1 } END { printf "%d\n", n }'
}
received_all() { [ "$(received)" -ge "$1" ]; }
batch_quantile() { # batch_quantile Q: the Q-quantile of dedup_consumer_batch_seconds over all the
  # consume processes, from their histogram buckets summed per bound and interpolated linearly
  # inside the bucket as PromQL's histogram_quantile does (so within a bucket's width, see
  # HISTOGRAM_BUCKETS in crates/dedup-worker-core/src/telemetry/mod.rs; 0 if nothing was recorded)
  local i
  for i in $(seq 1 "$CONSUMERS"); do curl -sf "http://127.0.0.1:$((PORT + i))/metrics" || true; done |
    python3 -c '
import re, sys
counts = {}
for line in sys.stdin:
    m = re.match(r"dedup_consumer_batch_seconds_bucket\{le=\"([^\"]+)\"\} (\S+)", line)
    if m:
        le = float(m.group(1))  # "+Inf" parses as inf
        counts[le] = counts.get(le, 0) + float(m.group(2))
bounds = sorted(counts)
total = counts[bounds[-1]] if bounds else 0
rank, lower, below = float(sys.argv[1]) * total, 0.0, 0.0
for le in bounds:
    if total and counts[le] >= rank:
        inside = counts[le] - below
        print(lower if le == float("inf") else lower + (le - lower) * ((rank - below) / inside if inside else 1))
        break
    lower, below = le, counts[le]
else:
    print(0)
' "$1"
}
# The ring fill on PostgreSQL, one transaction (one now()). ring_insert SLOT COUNT FROM TO: COUNT
# ids into processed_events_SLOT, processed uniformly in [now() - FROM s, now() - TO s).
ring_insert() {
  echo "INSERT INTO processed_events_$1 (key, source, event_id, event_type, processed_at)
    SELECT encode(substring(sha256(int4send(octet_length(source)) || convert_to(source, 'UTF8')
                                   || convert_to(event_id, 'UTF8')) FROM 1 FOR 16), 'hex')::uuid,
           source, event_id, 'invoice.paid', processed_at
      FROM (SELECT 'stripe' AS source, 'evt_' || md5(random()::text || g::text || ' $1') AS event_id,
                   now() - make_interval(secs => $3) + random() * make_interval(secs => $3 - $4)
                     AS processed_at
              FROM generate_series(1, $2) AS g) AS ids;"
}
ring_fill_pg() { # ring_fill_pg RETAINED
  local day=86400 h=$ROTATION_HEADROOM n=$1
  local n0=$((n / 3)) n1=$((n / 3)) n2=$((n - 2 * (n / 3)))
  {
    echo "BEGIN;"
    bench_ring_generations "$h"
    ring_insert 0 "$n0" $((30 * day - h)) $((20 * day - h))
    ring_insert 1 "$n1" $((20 * day - h)) $((10 * day - h))
    ring_insert 2 "$n2" $((10 * day - h)) 0
    if [ "$EXPIRED" -gt 0 ]; then
      echo "INSERT INTO dedup_generations (slot, started_at, sealed_at)
        VALUES (3, now() - interval '41 days', now() - interval '31 days');"
      ring_insert 3 "$EXPIRED" $((41 * day)) $((31 * day))
    fi
    echo "COMMIT;"
  } | psql "$DATABASE_URL" -q -v ON_ERROR_STOP=1 >/dev/null
}
# The same on SQLite: a Python script (sqlite3 + hashlib), times in Unix ms.
cat >"$WORK/ring_fill.py" <<'EOF'
import hashlib, itertools, random, sqlite3, sys, time

path, retained, expired, headroom = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
DAY, H, CHUNK = 86_400_000, headroom * 1000, 100_000
now = int(time.time() * 1000)
db = sqlite3.connect(path, isolation_level=None)
db.execute("PRAGMA journal_mode = WAL")
db.execute("PRAGMA synchronous = OFF")  # the fill only; the checkpoint at the end makes it durable
db.execute("PRAGMA cache_size = -1048576")  # 1 GiB: random keys into a large index
SOURCE = b"stripe"
PREFIX = len(SOURCE).to_bytes(4, "big") + SOURCE


def rows(n, start, end):  # n ids processed uniformly in [start, end) ms
    sha256, bits, uniform = hashlib.sha256, random.getrandbits, random.random
    span = end - start
    for _ in range(n):
        event_id = "evt_%032x" % bits(128)
        yield (sha256(PREFIX + event_id.encode()).digest()[:16], event_id,
               start + int(uniform() * span))


def insert(slot, n, start, end):
    sql = (f"INSERT INTO processed_events_{slot} (key, source, event_id, event_type, processed_at)"
           " VALUES (?, 'stripe', ?, 'invoice.paid', ?)")
    it = rows(n, start, end)
    while chunk := list(itertools.islice(it, CHUNK)):
        db.execute("BEGIN")
        db.executemany(sql, chunk)
        db.execute("COMMIT")


generations = [(0, now - 30 * DAY + H, now - 20 * DAY + H),
               (1, now - 20 * DAY + H, now - 10 * DAY + H),
               (2, now - 10 * DAY + H, None)]
if expired > 0:
    generations.append((3, now - 41 * DAY, now - 31 * DAY))
db.execute("BEGIN")
db.execute("DELETE FROM dedup_generations")
db.executemany("INSERT INTO dedup_generations (slot, started_at, sealed_at) VALUES (?, ?, ?)",
               generations)
db.execute("COMMIT")
third = retained // 3
insert(0, third, now - 30 * DAY + H, now - 20 * DAY + H)
insert(1, third, now - 20 * DAY + H, now - 10 * DAY + H)
insert(2, retained - 2 * third, now - 10 * DAY + H, now)
insert(3, expired, now - 41 * DAY, now - 31 * DAY)
db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
db.close()
EOF

round=0
for retained in $SIZES; do
  round=$((round + 1))
  db=${TAG}_$round
  export DEDUP_QUEUE="${TAG}_$round"
  if [ "$BACKEND" = sqlite ]; then
    export DATABASE_URL="sqlite://$WORK/$db.db"
  else
    bench_createdb "$db"
    export DATABASE_URL="$PG/$db"
  fi
  "$BIN" migrate >/dev/null
  if [ "$BACKEND" = sqlite ]; then
    layout=$(sqlite3 "$WORK/$db.db" "SELECT CASE WHEN EXISTS (SELECT 1 FROM sqlite_master
      WHERE type = 'table' AND name = 'processed_events_0') THEN 'ring' ELSE 'old' END")
  else
    layout=$(psql "$DATABASE_URL" -tAc "SELECT CASE WHEN to_regclass('processed_events_0') IS NULL
      THEN 'old' ELSE 'ring' END")
  fi
  fill_start=$(date +%s)
  if [ "$BACKEND" = sqlite ] && [ "$layout" = ring ]; then
    python3 "$WORK/ring_fill.py" "$WORK/$db.db" "$retained" "$EXPIRED" "$ROTATION_HEADROOM"
  elif [ "$BACKEND" = sqlite ]; then
    sqlite3 "$WORK/$db.db" "PRAGMA journal_mode = WAL;
      WITH RECURSIVE g(x) AS (SELECT 1 WHERE $retained > 0 UNION ALL SELECT x + 1 FROM g WHERE x < $retained)
      INSERT INTO processed_events (source, event_id, event_type, processed_at)
      SELECT 'stripe', 'evt_' || lower(hex(randomblob(16))), 'invoice.paid',
             CAST(unixepoch('now') * 1000 - abs(random() % 2592000000) AS INTEGER) FROM g;
      WITH RECURSIVE g(x) AS (SELECT 1 WHERE $EXPIRED > 0 UNION ALL SELECT x + 1 FROM g WHERE x < $EXPIRED)
      INSERT INTO processed_events (source, event_id, event_type, processed_at)
      SELECT 'stripe', 'evt_' || lower(hex(randomblob(16))), 'invoice.paid',
             CAST(unixepoch('now') * 1000 - 2678400000 + abs(random() % 86400000) AS INTEGER) FROM g;
      PRAGMA wal_checkpoint(TRUNCATE);" >/dev/null
  elif [ "$layout" = ring ]; then
    ring_fill_pg "$retained"
    psql "$DATABASE_URL" -qc "VACUUM ANALYZE processed_events_legacy, processed_events_0,
        processed_events_1, processed_events_2, processed_events_3, processed_events_4,
        dedup_generations" -c "CHECKPOINT"
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
    bench_start_worker "$WORK/ingress.log" "$BIN" serve
  "$OUT/examples/loadgen" --url "$URL/webhooks/stripe" \
    --connections 64 --seconds 300 --requests "$EVENTS" --duplicates "$DUPLICATES" \
    --prefix "evt_window_$round" --random-ids >"$WORK/load.log"
  bench_stop_last
  queued=$(bench_loadgen_accepted "$WORK/load.log")
  if [ "$BACKEND" = postgres ]; then
    wal_before=$(psql "$DATABASE_URL" -tAc "SELECT pg_current_wal_lsn()")
  fi

  start=$(date +%s.%N)
  consumers=()
  for i in $(seq 1 "$CONSUMERS"); do
    DEDUP_LISTEN=127.0.0.1:$((PORT + i)) DEDUP_ROLES__INGRESS=false DEDUP_ROLES__RELAY=false \
      bench_spawn "$WORK/consume_$i.log" "$BIN" serve
    consumers+=("$LAST")
  done
  outcome=drained
  BENCH_POLL=0.2 bench_wait_until "drain" 600 "" received_all "$queued" || outcome="NOT drained after 600 s"
  elapsed=$(python3 -c "import time,sys; print(f'{time.time()-float(sys.argv[1]):.2f}')" "$start")
  shares=$(for i in $(seq 1 "$CONSUMERS"); do bench_metric "http://127.0.0.1:$((PORT + i))" dedup_events_received_total; done |
    awk '{ printf "%s%d", (NR > 1 ? " + " : ""), $1 }')
  p99=$(batch_quantile 0.99)
  p50=$(batch_quantile 0.5)
  bench_stop "${consumers[@]}"
  current=
  if [ "$BACKEND" = sqlite ]; then
    sizes=$(python3 -c "import os,sqlite3,sys; f=sys.argv[1]; n=sqlite3.connect(f).execute('SELECT count(*) FROM processed_events').fetchone()[0]; b=os.path.getsize(f); print(f'{b/1e6:.0f} MB file, {b/max(n,1):.0f} B/id (whole file)')" "$WORK/$db.db")
    expired_table=processed_events
    [ "$layout" = ring ] && expired_table=processed_events_3
    left=$(sqlite3 "$WORK/$db.db" "SELECT count(*) FROM $expired_table
      WHERE processed_at < CAST(unixepoch('now') * 1000 AS INTEGER) - 2592000000")
    if [ "$layout" = ring ]; then
      slot=$(sqlite3 "$WORK/$db.db" "SELECT slot FROM dedup_generations WHERE sealed_at IS NULL")
      current="; current generation: slot $slot, $(sqlite3 "$WORK/$db.db" "SELECT count(*) FROM processed_events_$slot") rows"
    fi
  elif [ "$layout" = ring ]; then
    sizes=$(psql "$DATABASE_URL" -tAc "SELECT pg_size_pretty(sum(pg_table_size(t))) || ' heap, ' ||
        pg_size_pretty(sum(pg_indexes_size(t))) || ' indexes, ' ||
        round(sum(pg_table_size(t) + pg_indexes_size(t))::numeric
              / greatest((SELECT count(*) FROM processed_events), 1)) || ' B/id (legacy + ring); WAL ' ||
        pg_size_pretty(pg_current_wal_lsn() - '$wal_before'::pg_lsn)
      FROM unnest('{processed_events_legacy, processed_events_0, processed_events_1, processed_events_2,
                    processed_events_3, processed_events_4}'::regclass[]) AS t")
    left=$(psql "$DATABASE_URL" -tAc "SELECT count(*) FROM processed_events_3
      WHERE processed_at < now() - interval '30 days'")
    slot=$(psql "$DATABASE_URL" -tAc "SELECT slot FROM dedup_generations WHERE sealed_at IS NULL")
    current="; current generation: slot $slot, $(psql "$DATABASE_URL" -tAc "SELECT count(*) FROM processed_events_$slot") rows"
  else
    sizes=$(psql "$DATABASE_URL" -tAc "SELECT pg_size_pretty(pg_table_size('processed_events')) || ' heap, ' ||
        pg_size_pretty(pg_indexes_size('processed_events')) || ' indexes, ' ||
        round((pg_table_size('processed_events') + pg_indexes_size('processed_events'))::numeric
              / greatest(count(*), 1)) || ' B/id; WAL ' ||
        pg_size_pretty(pg_current_wal_lsn() - '$wal_before'::pg_lsn) FROM processed_events")
    left=$(psql "$DATABASE_URL" -tAc "SELECT count(*) FROM processed_events WHERE processed_at < now() - interval '30 days'")
  fi
  echo "$layout layout, retained $retained + $EXPIRED expired ($left left after the drain) (filled in ${fill}s):" \
    "$queued messages $outcome by $CONSUMERS consume process(es) ($shares) in ${elapsed} s" \
    "= $(python3 -c "print(int($queued / $elapsed))") messages/s; batch p50 $(python3 -c "print(round($p50*1000,1))") ms," \
    "p99 $(python3 -c "print(round($p99*1000,1))") ms (all processes' buckets); $sizes$current"
  if [ "$BACKEND" = sqlite ]; then
    rm -f "$WORK/$db.db"*
  else
    bench_dropdb "$db"
  fi
done
