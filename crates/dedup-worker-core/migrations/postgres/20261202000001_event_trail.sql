-- What `dedup-worker events show` reads (issue 15): when each processed event was received and
-- on which delivery, the later deliveries recognised as its duplicates, the dead letters that
-- were redriven, and indexes that find one event's rows without scanning a table.
--
-- Why these and no more: each write here is either two more columns in a row the consumer's
-- batch writes anyway, or happens only for the deliveries it describes (a duplicate, a stale
-- event, a dead letter, a redrive), or lands on the right edge of an index (the outbox's
-- creation time). BENCHMARKS.md ("events show") has the consumer's rate before and after.

-- 1. When the transport took the event in (the ingress's publish, a redrive's, another
--    producer's send) and which delivery of it was handled. NULL where the transport does not
--    say, and in rows written before this migration. Nullable columns rewrite nothing.
ALTER TABLE processed_events_0 ADD COLUMN received_at TIMESTAMPTZ, ADD COLUMN delivery_attempt INTEGER;
ALTER TABLE processed_events_1 ADD COLUMN received_at TIMESTAMPTZ, ADD COLUMN delivery_attempt INTEGER;
ALTER TABLE processed_events_2 ADD COLUMN received_at TIMESTAMPTZ, ADD COLUMN delivery_attempt INTEGER;
ALTER TABLE processed_events_3 ADD COLUMN received_at TIMESTAMPTZ, ADD COLUMN delivery_attempt INTEGER;
ALTER TABLE processed_events_4 ADD COLUMN received_at TIMESTAMPTZ, ADD COLUMN delivery_attempt INTEGER;

-- 2. Each later delivery the consumer recognised as a duplicate: the event's dedup key and
--    when. Kept in the ring like the ids: recorded in the current generation's partition and
--    emptied (TRUNCATE) with that generation, so duplicates are kept as long as ids are, with
--    no row-by-row delete. Partitioned by slot so that the consumer's insert is one statement
--    that finds the current generation itself. Append-only (no unique key): two batches
--    recording duplicates of one event never wait for each other.
CREATE TABLE duplicate_deliveries (
    slot    SMALLINT    NOT NULL,
    key     UUID        NOT NULL,
    seen_at TIMESTAMPTZ NOT NULL DEFAULT now()
) PARTITION BY LIST (slot);
CREATE TABLE duplicate_deliveries_0 PARTITION OF duplicate_deliveries FOR VALUES IN (0);
CREATE TABLE duplicate_deliveries_1 PARTITION OF duplicate_deliveries FOR VALUES IN (1);
CREATE TABLE duplicate_deliveries_2 PARTITION OF duplicate_deliveries FOR VALUES IN (2);
CREATE TABLE duplicate_deliveries_3 PARTITION OF duplicate_deliveries FOR VALUES IN (3);
CREATE TABLE duplicate_deliveries_4 PARTITION OF duplicate_deliveries FOR VALUES IN (4);
CREATE INDEX duplicate_deliveries_key ON duplicate_deliveries (key);

-- 3. Dead letters that were redriven: `dlq redrive` deletes a dead letter once its publish
--    succeeded, and records here what it was and where it went, in the same transaction.
--    Deleted by retention once older than the dedup window.
CREATE TABLE dead_letter_redrives (
    id               BIGSERIAL   PRIMARY KEY,
    dead_letter_id   BIGINT      NOT NULL,
    source           TEXT        NOT NULL,
    event_id         TEXT        NOT NULL,
    event_type       TEXT        NOT NULL,
    queue            TEXT        NOT NULL,
    redriven_to      TEXT        NOT NULL,
    error            TEXT        NOT NULL,
    attempts         INTEGER     NOT NULL,
    dead_lettered_at TIMESTAMPTZ NOT NULL,
    redriven_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX dead_letter_redrives_event ON dead_letter_redrives (source, event_id);

-- 4. One event's dead letters and stale listings by its id (written only for those rows).
CREATE INDEX dead_letters_event ON dead_letters (source, event_id);
CREATE INDEX stale_events_event ON stale_events (source, event_id);

-- 5. One event's outbox rows: written in the batch transaction that recorded its id, so their
--    created_at and the id's processed_at are the same now(), the transaction's start (events
--    show looks them up by that equality). Times grow with inserts, so this index takes each
--    row on its right edge, unlike a random key (the event id), whose inserts would land all
--    over an index as large as a week of rows (outbox.retention_hours): the cost the dedup
--    ring removed from processed ids. Built while the migration holds the outbox: on a large
--    outbox it blocks handlers' outbox writes for the build (stop the consumers first, as for
--    every upgrade; README "The dedup window at production size").
CREATE INDEX outbox_created_at ON outbox (created_at);
