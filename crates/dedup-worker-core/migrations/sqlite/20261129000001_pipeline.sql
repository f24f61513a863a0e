-- The pipeline's tables for the embedded store. Times are Unix milliseconds (INTEGER).

CREATE TABLE processed_events (
    source       TEXT    NOT NULL,
    event_id     TEXT    NOT NULL,
    event_type   TEXT    NOT NULL DEFAULT '',
    processed_at INTEGER NOT NULL,
    PRIMARY KEY (source, event_id)
) WITHOUT ROWID;
CREATE INDEX processed_events_processed_at ON processed_events (processed_at);

CREATE TABLE outbox (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    source          TEXT    NOT NULL,
    event_id        TEXT    NOT NULL,
    destination     TEXT,
    idempotency_key TEXT    NOT NULL,
    event_type      TEXT    NOT NULL DEFAULT '',
    payload         BLOB    NOT NULL,
    status          TEXT    NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'dispatched', 'failed')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,
    last_error      TEXT,
    created_at      INTEGER NOT NULL,
    dispatched_at   INTEGER
);
CREATE INDEX outbox_pending ON outbox (next_attempt_at) WHERE status = 'pending';
CREATE INDEX outbox_dispatched ON outbox (dispatched_at) WHERE status = 'dispatched';

CREATE TABLE dead_letters (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    source      TEXT    NOT NULL,
    event_id    TEXT    NOT NULL,
    event_type  TEXT    NOT NULL DEFAULT '',
    queue       TEXT    NOT NULL,
    payload     BLOB    NOT NULL,
    error       TEXT    NOT NULL,
    attempts    INTEGER NOT NULL,
    created_at  INTEGER NOT NULL
);

CREATE TABLE queue_messages (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    queue        TEXT    NOT NULL,
    message_id   TEXT,
    message_type TEXT,
    payload      BLOB    NOT NULL,
    attempts     INTEGER NOT NULL DEFAULT 0,
    visible_at   INTEGER NOT NULL,
    enqueued_at  INTEGER NOT NULL
);
CREATE INDEX queue_messages_ready ON queue_messages (queue, visible_at, id);

CREATE TABLE event_ledger (
    source      TEXT    NOT NULL,
    event_id    TEXT    NOT NULL,
    event_type  TEXT    NOT NULL,
    recorded_at INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER))
);
CREATE INDEX event_ledger_event ON event_ledger (source, event_id);
