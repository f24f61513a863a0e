-- A duplicate's event type, written with it: the console lists
-- duplicates of a type (issue 28) without first looking up each one's event in the generations,
-- which read every duplicate of a day to find the few of a rare type (BENCHMARKS.md, "Issue 28:
-- the console's reads at 10 million ids"). A nullable column rewrites nothing; the table is
-- written only for duplicates, so its index costs the consumer's common path nothing.
ALTER TABLE duplicate_deliveries ADD COLUMN event_type TEXT;
CREATE INDEX duplicate_deliveries_type
    ON duplicate_deliveries (event_type text_pattern_ops, seen_at, key);
-- The duplicates recorded before this, typed from their events: a primary-key probe of each
-- generation per duplicate (duplicates are a few per cent of the ids).
UPDATE duplicate_deliveries d
   SET event_type = coalesce((SELECT event_type FROM processed_events_0 p WHERE p.key = d.key),
                             (SELECT event_type FROM processed_events_1 p WHERE p.key = d.key),
                             (SELECT event_type FROM processed_events_2 p WHERE p.key = d.key),
                             (SELECT event_type FROM processed_events_3 p WHERE p.key = d.key),
                             (SELECT event_type FROM processed_events_4 p WHERE p.key = d.key));
