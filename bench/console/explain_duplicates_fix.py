"""The proposed fix for a type search's duplicates (BENCHMARKS.md, issue 28), EXPLAINed: prints a
psql script for the statement as it would be with `duplicate_deliveries.event_type` and the
page taken before the lookup of each duplicate's event. Run it on a scratch copy of the bench
database with the column and index added (not on bench_console itself, which the script keeps
as the migrations make it):

  createdb -T bench_console bench_console_fix
  PGOPTIONS='-c search_path=dedup_worker' psql bench_console_fix <<'SQL'
  ALTER TABLE duplicate_deliveries ADD COLUMN event_type TEXT;
  UPDATE duplicate_deliveries d SET event_type = p.event_type FROM (
    SELECT key, event_type FROM processed_events_0 UNION ALL SELECT key, event_type FROM processed_events_1
    UNION ALL SELECT key, event_type FROM processed_events_2 UNION ALL SELECT key, event_type FROM processed_events_3) p
   WHERE p.key = d.key;
  CREATE INDEX duplicate_deliveries_type ON duplicate_deliveries (event_type text_pattern_ops, seen_at, key);
  VACUUM ANALYZE duplicate_deliveries;
  SQL
  python3 bench/console/explain_duplicates_fix.py charge.dispute.created SINCE_US UNTIL_US auto |
    PGOPTIONS='-c search_path=dedup_worker' psql bench_console_fix

Usage: explain_duplicates_fix.py TYPE_PREFIX SINCE_US UNTIL_US auto|custom
(auto: PostgreSQL's plan cache decides, as for sqlx's prepared statements; custom: a plan with
the values each time, as an unnamed statement gets.)
"""
import sys
prefix, s, u, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
high = prefix[:-1] + chr(ord(prefix[-1]) + 1)
t = lambda p: f"('epoch'::timestamptz + {p} * interval '1 microsecond')"
lookups = " UNION ALL ".join(f"SELECT key, source, event_id, event_type FROM processed_events_{i} WHERE key = d.key" for i in range(5))
sql = f"""SELECT p.source, p.event_id, p.event_type, (extract(epoch FROM d.seen_at) * 1000000)::int8 AS at_us, d.key
  FROM (SELECT key, seen_at FROM duplicate_deliveries
         WHERE seen_at >= {t('$1')} AND seen_at < {t('$2')} AND event_type ~>=~ $3 AND event_type ~<~ $4
         ORDER BY seen_at DESC, key DESC LIMIT 51) d
  CROSS JOIN LATERAL ({lookups} LIMIT 1) p ORDER BY d.seen_at DESC, d.key DESC"""
print("DEALLOCATE ALL;")
if mode == "custom": print("SET plan_cache_mode = force_custom_plan;")
print(f"PREPARE f (int8, int8, text, text) AS {sql};")
args = f"{s}, {u}, '{prefix}', '{high}'"
print("\\o /dev/null")
for _ in range(6): print(f"EXECUTE f ({args});")
print("\\o")
print(f"EXPLAIN (ANALYZE, BUFFERS) EXECUTE f ({args});")
