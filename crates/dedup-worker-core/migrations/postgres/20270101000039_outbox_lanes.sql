-- Issue 39: every sink is delivered in a lane of its own. `sink` names a row's lane: 'default'
-- for the configured `outbox.sink` (destination NULL), the sink's name for a configured
-- `[outbox.sinks.NAME]` a handler or a route named, the spec itself for an ad-hoc destination
-- (`.to("https://…")`; names are `[a-z0-9_-]`, so never a spec). A constant default: no table
-- rewrite. Rows a lane will still claim take their lane now; dispatched history stays 'default'
-- (only counts read it).
ALTER TABLE outbox ADD COLUMN sink TEXT NOT NULL DEFAULT 'default';
UPDATE outbox SET sink = destination WHERE destination IS NOT NULL AND status <> 'dispatched';

-- One row per lane, shared by every relay process, so they agree on what the operator and the
-- receiver said: paused by hand (`outbox pause SINK`), the circuit breaker's state and its next
-- probe, and how long the receiver asked us to wait (`Retry-After`). A lane without a row is
-- closed, not paused and not held.
CREATE TABLE outbox_sinks (
    sink              TEXT PRIMARY KEY,
    paused            BOOLEAN     NOT NULL DEFAULT false,
    paused_by         TEXT,
    paused_at         TIMESTAMPTZ,
    circuit           TEXT        NOT NULL DEFAULT 'closed'
                      CHECK (circuit IN ('closed', 'open', 'half_open')),
    opened_at         TIMESTAMPTZ,
    -- How many times the circuit opened, ever.
    trips             INTEGER     NOT NULL DEFAULT 0,
    -- Open: the next probe may go then. Half-open: the probe's lease (a relay that died while
    -- probing is replaced after it).
    probe_at          TIMESTAMPTZ,
    probe_interval_ms BIGINT      NOT NULL DEFAULT 0,
    -- The receiver's `Retry-After`: no lane delivers before it.
    hold_until        TIMESTAMPTZ,
    last_error        TEXT,
    updated_at        TIMESTAMPTZ NOT NULL DEFAULT now()
);
