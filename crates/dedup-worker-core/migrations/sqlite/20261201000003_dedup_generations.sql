-- The dedup record as a ring of generation tables (issue 13).
--
-- Why: one table keyed by (source, event_id) takes every insert at a random place of an index
-- as large as the whole window (30 days: hundreds of millions of ids). Once that index outgrows
-- memory, each insert dirties a page that is not cached, and after every checkpoint the first
-- change to each page writes the whole page to the WAL: the consumer sank to 74 % of its
-- empty-table rate at 10 million retained ids and 70 % at 30 million.
--
-- Now:
-- * the key is 16 bytes (a BLOB), the first half of
--   sha256(be_u32(len(source)) || source || event_id), computed by the consumer (`store::dedup_key`): index entries less than half as wide;
-- * ids go into the CURRENT generation's table only; a generation lasts a third of the window,
--   so the index that takes writes holds at most a third of it. The sealed generations are only
--   read (one index probe per id and table: NOT EXISTS), never written;
-- * retention empties a generation sealed longer ago than the window with one DELETE of the
--   whole table (SQLite's truncate optimisation) and the ring reuses its table; nothing else deletes processed ids;
-- * uniqueness across the whole window: an id is inserted into the current table (its primary
--   key decides races inside one generation) only if no other generation's table holds it. A
--   batch reads which generation is current inside its write transaction; SQLite has one
--   writer at a time, so a rotation never interleaves with a batch.
--
-- Today's table becomes processed_events_legacy, kept as it is (no rewrite of a large table at
-- upgrade): ids are looked up there by (source, event_id) too, and retention deletes its rows
-- as before, in bounded batches by age, until it is empty. The view processed_events shows every
-- retained id, for people and tools; the pipeline never reads through it.
--
-- Times are Unix milliseconds, as everywhere in the embedded store.

ALTER TABLE processed_events RENAME TO processed_events_legacy;
DROP INDEX processed_events_processed_at;
CREATE INDEX processed_events_legacy_processed_at ON processed_events_legacy (processed_at);

CREATE TABLE dedup_generations (
    slot       INTEGER PRIMARY KEY CHECK (slot BETWEEN 0 AND 4),
    started_at INTEGER NOT NULL,
    sealed_at  INTEGER
);
CREATE UNIQUE INDEX dedup_generations_one_current
    ON dedup_generations ((sealed_at IS NULL)) WHERE sealed_at IS NULL;
INSERT INTO dedup_generations (slot, started_at) VALUES (0, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER));

CREATE TABLE processed_events_0 (
    key          BLOB    PRIMARY KEY,
    source       TEXT    NOT NULL,
    event_id     TEXT    NOT NULL,
    event_type   TEXT    NOT NULL DEFAULT '',
    processed_at INTEGER NOT NULL
);
CREATE TABLE processed_events_1 (
    key          BLOB    PRIMARY KEY,
    source       TEXT    NOT NULL,
    event_id     TEXT    NOT NULL,
    event_type   TEXT    NOT NULL DEFAULT '',
    processed_at INTEGER NOT NULL
);
CREATE TABLE processed_events_2 (
    key          BLOB    PRIMARY KEY,
    source       TEXT    NOT NULL,
    event_id     TEXT    NOT NULL,
    event_type   TEXT    NOT NULL DEFAULT '',
    processed_at INTEGER NOT NULL
);
CREATE TABLE processed_events_3 (
    key          BLOB    PRIMARY KEY,
    source       TEXT    NOT NULL,
    event_id     TEXT    NOT NULL,
    event_type   TEXT    NOT NULL DEFAULT '',
    processed_at INTEGER NOT NULL
);
CREATE TABLE processed_events_4 (
    key          BLOB    PRIMARY KEY,
    source       TEXT    NOT NULL,
    event_id     TEXT    NOT NULL,
    event_type   TEXT    NOT NULL DEFAULT '',
    processed_at INTEGER NOT NULL
);

CREATE VIEW processed_events AS
    SELECT source, event_id, event_type, processed_at FROM processed_events_legacy
    UNION ALL SELECT source, event_id, event_type, processed_at FROM processed_events_0
    UNION ALL SELECT source, event_id, event_type, processed_at FROM processed_events_1
    UNION ALL SELECT source, event_id, event_type, processed_at FROM processed_events_2
    UNION ALL SELECT source, event_id, event_type, processed_at FROM processed_events_3
    UNION ALL SELECT source, event_id, event_type, processed_at FROM processed_events_4;
