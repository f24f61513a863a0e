-- The pipeline's tables: dedup record, outbox, dead letters, the database queue, and the
-- example handler's ledger.

-- One row per event that was handled; the primary key decides races between workers.
CREATE TABLE processed_events (
    source       TEXT        NOT NULL,
    event_id     TEXT        NOT NULL,
    event_type   TEXT        NOT NULL DEFAULT '',
    processed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (source, event_id)
);
CREATE INDEX processed_events_processed_at ON processed_events (processed_at);

-- Messages produced by handlers, delivered by the relay. Claimed with FOR UPDATE SKIP LOCKED,
-- never read by id order.
CREATE TABLE outbox (
    id              BIGSERIAL   PRIMARY KEY,
    source          TEXT        NOT NULL,
    event_id        TEXT        NOT NULL,
    destination     TEXT,
    idempotency_key TEXT        NOT NULL,
    event_type      TEXT        NOT NULL DEFAULT '',
    payload         BYTEA       NOT NULL,
    status          TEXT        NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'dispatched', 'failed')),
    attempts        INTEGER     NOT NULL DEFAULT 0,
    next_attempt_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_error      TEXT,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    dispatched_at   TIMESTAMPTZ
);
CREATE INDEX outbox_pending ON outbox (next_attempt_at) WHERE status = 'pending';
CREATE INDEX outbox_dispatched ON outbox (dispatched_at) WHERE status = 'dispatched';

-- Events whose handler failed fatally or ran out of retries; `dedup-worker dlq` lists them.
CREATE TABLE dead_letters (
    id          BIGSERIAL   PRIMARY KEY,
    source      TEXT        NOT NULL,
    event_id    TEXT        NOT NULL,
    event_type  TEXT        NOT NULL DEFAULT '',
    queue       TEXT        NOT NULL,
    payload     BYTEA       NOT NULL,
    error       TEXT        NOT NULL,
    attempts    INTEGER     NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The database queue: a message is invisible while leased (visible_at in the future) and
-- deleted on ack.
CREATE TABLE queue_messages (
    id           BIGSERIAL   PRIMARY KEY,
    queue        TEXT        NOT NULL,
    message_id   TEXT,
    message_type TEXT,
    payload      BYTEA       NOT NULL,
    attempts     INTEGER     NOT NULL DEFAULT 0,
    visible_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    enqueued_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX queue_messages_ready ON queue_messages (queue, visible_at, id);

-- The example handler's table. Deliberately no unique key: a double effect must be visible.
CREATE TABLE event_ledger (
    source      TEXT        NOT NULL,
    event_id    TEXT        NOT NULL,
    event_type  TEXT        NOT NULL,
    recorded_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX event_ledger_event ON event_ledger (source, event_id);
