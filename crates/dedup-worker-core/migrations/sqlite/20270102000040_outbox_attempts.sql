-- Issue 40: every delivery attempt and every operator act on a delivery; see the PostgreSQL
-- migration of the same version. Not partitioned: retention deletes by `id` in small batches
-- (insert order is time order). Times in milliseconds since the epoch; the key a 16-byte BLOB.
CREATE TABLE outbox_attempts (
    id               INTEGER PRIMARY KEY,
    at               INTEGER NOT NULL,
    event_key        BLOB    NOT NULL,
    outbox_id        INTEGER NOT NULL,
    attempt          INTEGER NOT NULL,
    kind             TEXT    NOT NULL CHECK (kind IN ('delivered', 'failed', 'gave_up',
                         'throttled', 'probe_failed', 'retry', 'resend', 'skip')),
    lane             TEXT    NOT NULL,
    destination      TEXT,
    started_at       INTEGER,
    duration_ms      INTEGER,
    status           INTEGER,
    error            TEXT,
    response_headers TEXT,
    response_body    BLOB,
    body_truncated   INTEGER NOT NULL DEFAULT 0,
    actor            TEXT
);
CREATE INDEX outbox_attempts_event ON outbox_attempts (event_key, at);
