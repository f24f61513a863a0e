-- The soak's effect table (bench/soak.sh): one row per handler call that committed, and
-- deliberately NO unique key of its own, so only the dedup record stands between a duplicate
-- delivery and a second row. The soak's checker counts rows per (source, event_id) and compares
-- their insert times with the dedup window.
CREATE TABLE soak_effects (
    source           TEXT        NOT NULL,
    -- The dedup key's id half (a thin event's is its snapshot event's id).
    event_id         TEXT        NOT NULL,
    event_type       TEXT        NOT NULL,
    -- The id in the payload handled: the event's own, or the thin event's (which of the pair won).
    payload_id       TEXT        NOT NULL,
    -- The process tag (SOAK_PROCESS) and the PostgreSQL backend that wrote the row.
    process          TEXT        NOT NULL,
    backend_pid      INTEGER     NOT NULL DEFAULT pg_backend_pid(),
    delivery_attempt INTEGER     NOT NULL,
    -- The time of the insert itself (not of the transaction's start): after the dedup insert of
    -- the same transaction, so two rows of one id closer than the dedup window are a violation.
    inserted_at      TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);
-- For the checker's reads; not unique.
CREATE INDEX soak_effects_event ON soak_effects (source, event_id);
