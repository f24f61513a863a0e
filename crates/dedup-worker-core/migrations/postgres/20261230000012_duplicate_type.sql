-- A duplicate's event type, written with it (NULL in rows recorded before: they are not
-- backfilled here, which would hold the consumers' duplicate records for the whole update; a type
-- search misses them until they leave the dedup window). The console lists
-- duplicates of a type (issue 28) without first looking up each one's event in the generations,
-- which read every duplicate of a day to find the few of a rare type (BENCHMARKS.md, "Issue 28:
-- the console's reads at 10 million ids"). A nullable column rewrites nothing; the table is
-- written only for duplicates, so its index costs the consumer's common path nothing, and
-- its build is short (a few per cent of the ids are duplicates).
ALTER TABLE duplicate_deliveries ADD COLUMN event_type TEXT;
CREATE INDEX duplicate_deliveries_type
    ON duplicate_deliveries (event_type text_pattern_ops, seen_at, key);
