-- Issue 40: what happened per minute, counted in the transactions that did it (store/activity.rs),
-- so that no later retry, redrive or retention changes a past minute. One row per minute, series
-- and writer's shard: a writer adds to its own row (`n = n + EXCLUDED.n`), and writers on other
-- shards never wait for it. The overview reads a primary-key range (minute >= an hour ago).
-- Minutes before this migration have no rows: nothing is backfilled (a backfill would derive
-- them from today's rows, the rewritten past this table exists to avoid).
CREATE TABLE activity_minutes (
    minute TIMESTAMPTZ NOT NULL,   -- date_trunc('minute', the writing transaction's now())
    series TEXT        NOT NULL,   -- store/activity.rs `Series`: handled, duplicates, …
    shard  SMALLINT    NOT NULL,   -- the writer's, 0..64
    n      BIGINT      NOT NULL,
    PRIMARY KEY (minute, series, shard)
) WITH (fillfactor = 70);          -- room for HOT updates: n is not indexed
