-- The stale-event guard (consumer.stale_guard): the newest version handled per object, and the
-- events it held back as stale.

-- One row per (source, object): the newest version handled so far and the event that had it.
CREATE TABLE object_versions (
    source     TEXT   NOT NULL,
    object_id  TEXT   NOT NULL,
    version    BIGINT NOT NULL,
    event_id   TEXT   NOT NULL,
    PRIMARY KEY (source, object_id)
);

-- Events recorded as processed with outcome `stale`: not passed to the handler because an event
-- with a strictly newer version of the same object had been handled.
CREATE TABLE stale_events (
    id              BIGSERIAL   PRIMARY KEY,
    source          TEXT        NOT NULL,
    event_id        TEXT        NOT NULL,
    event_type      TEXT        NOT NULL,
    object_id       TEXT        NOT NULL,
    version         BIGINT      NOT NULL,
    newer_event_id  TEXT        NOT NULL,
    newer_version   BIGINT      NOT NULL,
    recorded_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);
