-- Issue 39: every sink is delivered in a lane of its own; see the PostgreSQL migration of the
-- same version for the columns' meaning. Times are milliseconds since the epoch.
ALTER TABLE outbox ADD COLUMN sink TEXT NOT NULL DEFAULT 'default';
UPDATE outbox SET sink = destination WHERE destination IS NOT NULL AND status <> 'dispatched';
CREATE INDEX outbox_lane_due ON outbox (sink, next_attempt_at) WHERE status = 'pending';

CREATE TABLE outbox_sinks (
    sink              TEXT    PRIMARY KEY,
    paused            INTEGER NOT NULL DEFAULT 0,
    paused_by         TEXT,
    paused_at         INTEGER,
    circuit           TEXT    NOT NULL DEFAULT 'closed'
                      CHECK (circuit IN ('closed', 'open', 'half_open')),
    opened_at         INTEGER,
    trips             INTEGER NOT NULL DEFAULT 0,
    probe_at          INTEGER,
    probe_interval_ms INTEGER NOT NULL DEFAULT 0,
    hold_until        INTEGER,
    last_error        TEXT,
    updated_at        INTEGER NOT NULL DEFAULT 0
);
