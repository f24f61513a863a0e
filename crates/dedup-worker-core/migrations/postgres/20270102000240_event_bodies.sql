-- Issue 40: the body of each handled event (and of each held back as stale), kept
-- retention.payload_days, for the console's event page and, later, search. Written by the
-- consumer in the batch's transaction, once per event id (only fresh events are written).
--
-- Partitioned by UTC day on kept_at, so retention drops a whole day (DETACH PARTITION …
-- CONCURRENTLY, then DROP TABLE: store/partitions.rs) instead of deleting rows, which would
-- leave dead tuples and index bloat behind on the consumer's path. No DEFAULT partition:
-- DETACH … CONCURRENTLY refuses to run when there is one; an insert for a missing day is
-- skipped by the consumer's guard instead (store/bodies/).
CREATE TABLE event_bodies (
    kept_at     TIMESTAMPTZ NOT NULL,  -- the batch transaction's now() = the id's processed_at
    key         UUID        NOT NULL,  -- dedup_key(source, event_id)
    source      TEXT        NOT NULL,
    event_id    TEXT        NOT NULL,
    event_type  TEXT        NOT NULL,
    object_id   TEXT,                  -- search.object_pointer's value, checked
    customer    TEXT,                  -- search.customer_pointer's value, checked
    headers     TEXT,                  -- the sender headers the source keeps (wire form)
    received_at TIMESTAMPTZ,
    encoding    SMALLINT    NOT NULL,  -- 0 raw, 1 zstd
    body        BYTEA       NOT NULL
) PARTITION BY RANGE (kept_at);
-- Compressed already (zstd in the consumer): TOAST must not try again.
ALTER TABLE event_bodies ALTER COLUMN body SET STORAGE EXTERNAL;
-- The table is new: plain CREATE INDEX on the parent is instant, and each partition, present
-- and future, gets its own. The event id serves the page's lookup (equality) and an id prefix
-- (a range); customers equality only.
CREATE INDEX event_bodies_event ON event_bodies (event_id text_pattern_ops, kept_at);
CREATE INDEX event_bodies_customer ON event_bodies (customer, kept_at) WHERE customer IS NOT NULL;
CREATE INDEX event_bodies_object ON event_bodies (object_id text_pattern_ops, kept_at)
    WHERE object_id IS NOT NULL;

-- Days from today to today + 3 (UTC), made the way store/partitions.rs makes them: a standalone
-- table, then ATTACH (SHARE UPDATE EXCLUSIVE on the parent; CREATE TABLE … PARTITION OF would
-- take ACCESS EXCLUSIVE). Bounds carry +00: a bare date is read in the session's TimeZone.
DO $$
DECLARE
    day date;
    part text;
BEGIN
    FOR i IN 0..3 LOOP
        day := (now() AT TIME ZONE 'UTC')::date + i;
        part := 'event_bodies_p' || to_char(day, 'YYYYMMDD');
        EXECUTE format('CREATE TABLE %I (LIKE event_bodies INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE)', part);
        EXECUTE format('ALTER TABLE event_bodies ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                       part, day::text || ' 00:00:00+00', (day + 1)::text || ' 00:00:00+00');
    END LOOP;
END
$$;
