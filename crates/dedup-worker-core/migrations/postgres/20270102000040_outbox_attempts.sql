-- Issue 40: every delivery attempt and every operator act on a delivery, kept after the outbox
-- row is reset or deleted, so the event page can show the whole timeline. Keyed by the event's
-- dedup key (not by outbox_id: dispatched outbox rows are deleted after
-- outbox.retention_hours while attempts are kept retention.payload_days). Partitioned by UTC
-- day on `at` (the database's now(), never a process's clock) so retention drops whole days
-- (store/partitions.rs). No DEFAULT partition: DETACH … CONCURRENTLY refuses to run with one.
-- No unique key: a mark retried after an outage is kept from recording twice by the mark's
-- statement itself (store/outbox/marks.rs).
CREATE TABLE outbox_attempts (
    at               TIMESTAMPTZ NOT NULL DEFAULT now(), -- when recorded (the mark's transaction)
    event_key        UUID        NOT NULL,  -- dedup_key(source, event_id) of the row's event
    outbox_id        BIGINT      NOT NULL,
    attempt          INTEGER     NOT NULL,  -- the row's `attempts` this was; 0 for operator entries
    kind             TEXT        NOT NULL CHECK (kind IN ('delivered', 'failed', 'gave_up',
                         'throttled', 'probe_failed', 'retry', 'resend', 'skip')),
    lane             TEXT        NOT NULL,  -- outbox.sink
    destination      TEXT,                  -- the lane's shown (redacted) destination
    started_at       TIMESTAMPTZ,           -- the relay's clock when the request left
    duration_ms      INTEGER,
    status           SMALLINT,              -- HTTP status; NULL: no answer, or not HTTP
    error            TEXT,                  -- the sink's error, printable, bounded
    response_headers TEXT,                  -- JSON [[name, value], …], redacted, bounded
    response_body    BYTEA,                 -- the first outbox.response_excerpt_bytes
    body_truncated   BOOLEAN     NOT NULL DEFAULT false,
    actor            TEXT                   -- retry/resend/skip: who
) PARTITION BY RANGE (at);
-- The table is new: a plain index on the parent is instant and is built on every partition,
-- present and future.
CREATE INDEX outbox_attempts_event ON outbox_attempts (event_key, at);

-- Days from today to today + 3 (UTC), made the way store/partitions.rs makes them: a table
-- LIKE the parent, then ATTACH (SHARE UPDATE EXCLUSIVE on the parent, where CREATE TABLE …
-- PARTITION OF takes ACCESS EXCLUSIVE). Bounds carry +00: a bare date is read in the session's
-- TimeZone, while the name and the insert guard use the UTC day.
DO $$
DECLARE
    day  date;
    name text;
BEGIN
    FOR i IN 0..3 LOOP
        day := (now() AT TIME ZONE 'UTC')::date + i;
        name := 'outbox_attempts_p' || to_char(day, 'YYYYMMDD');
        EXECUTE format('CREATE TABLE IF NOT EXISTS %I (LIKE outbox_attempts INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', name);
        EXECUTE format('ALTER TABLE outbox_attempts ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                       name, to_char(day, 'YYYY-MM-DD') || ' 00:00:00+00',
                       to_char(day + 1, 'YYYY-MM-DD') || ' 00:00:00+00');
    END LOOP;
END
$$;
