-- The stale-event guard (consumer.stale_guard): the newest version handled per object, and the
-- events it held back as stale. Times are Unix milliseconds, as elsewhere in this store.

CREATE TABLE object_versions (
    source     TEXT    NOT NULL,
    object_id  TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    event_id   TEXT    NOT NULL,
    PRIMARY KEY (source, object_id)
);

CREATE TABLE stale_events (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    source          TEXT    NOT NULL,
    event_id        TEXT    NOT NULL,
    event_type      TEXT    NOT NULL,
    object_id       TEXT    NOT NULL,
    version         INTEGER NOT NULL,
    newer_event_id  TEXT    NOT NULL,
    newer_version   INTEGER NOT NULL,
    recorded_at     INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER))
);
