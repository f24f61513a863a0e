-- What `dedup-worker events show` reads (issue 15); see the PostgreSQL migration of the same
-- name for why these and no more. Times are Unix milliseconds, as everywhere in this store.

-- 1. When the transport took the event in, and which delivery of it was handled (NULL where
--    the transport does not say, and in rows written before this migration).
ALTER TABLE processed_events_0 ADD COLUMN received_at INTEGER;
ALTER TABLE processed_events_0 ADD COLUMN delivery_attempt INTEGER;
ALTER TABLE processed_events_1 ADD COLUMN received_at INTEGER;
ALTER TABLE processed_events_1 ADD COLUMN delivery_attempt INTEGER;
ALTER TABLE processed_events_2 ADD COLUMN received_at INTEGER;
ALTER TABLE processed_events_2 ADD COLUMN delivery_attempt INTEGER;
ALTER TABLE processed_events_3 ADD COLUMN received_at INTEGER;
ALTER TABLE processed_events_3 ADD COLUMN delivery_attempt INTEGER;
ALTER TABLE processed_events_4 ADD COLUMN received_at INTEGER;
ALTER TABLE processed_events_4 ADD COLUMN delivery_attempt INTEGER;

-- 2. Each later delivery recognised as a duplicate, in the ring like the ids: slot N's table is
--    emptied with processed_events_N. Append-only.
CREATE TABLE duplicate_deliveries_0 (key BLOB NOT NULL, seen_at INTEGER NOT NULL);
CREATE TABLE duplicate_deliveries_1 (key BLOB NOT NULL, seen_at INTEGER NOT NULL);
CREATE TABLE duplicate_deliveries_2 (key BLOB NOT NULL, seen_at INTEGER NOT NULL);
CREATE TABLE duplicate_deliveries_3 (key BLOB NOT NULL, seen_at INTEGER NOT NULL);
CREATE TABLE duplicate_deliveries_4 (key BLOB NOT NULL, seen_at INTEGER NOT NULL);
CREATE INDEX duplicate_deliveries_0_key ON duplicate_deliveries_0 (key);
CREATE INDEX duplicate_deliveries_1_key ON duplicate_deliveries_1 (key);
CREATE INDEX duplicate_deliveries_2_key ON duplicate_deliveries_2 (key);
CREATE INDEX duplicate_deliveries_3_key ON duplicate_deliveries_3 (key);
CREATE INDEX duplicate_deliveries_4_key ON duplicate_deliveries_4 (key);

-- 3. Dead letters that were redriven.
CREATE TABLE dead_letter_redrives (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    dead_letter_id   INTEGER NOT NULL,
    source           TEXT    NOT NULL,
    event_id         TEXT    NOT NULL,
    event_type       TEXT    NOT NULL,
    queue            TEXT    NOT NULL,
    redriven_to      TEXT    NOT NULL,
    error            TEXT    NOT NULL,
    attempts         INTEGER NOT NULL,
    dead_lettered_at INTEGER NOT NULL,
    redriven_at      INTEGER NOT NULL
);
CREATE INDEX dead_letter_redrives_event ON dead_letter_redrives (source, event_id);

-- 4. One event's dead letters and stale listings by its id.
CREATE INDEX dead_letters_event ON dead_letters (source, event_id);
CREATE INDEX stale_events_event ON stale_events (source, event_id);

-- 5. One event's outbox rows, by the time they share with its processed id: the batch
--    transaction's start, which this store's transactions keep for both (see StoreTx).
CREATE INDEX outbox_created_at ON outbox (created_at);
