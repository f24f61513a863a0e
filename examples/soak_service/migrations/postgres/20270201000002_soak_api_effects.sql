-- The effect table of the soak's API role (`soak_service api`, behind the Idempotency-Key
-- layer): one row per handler execution that committed, and deliberately NO unique key, so only
-- the layer stands between a client's retry and a second row. The checker expects at most one
-- row per (tenant, idem_key), and exactly one, with the answered charge id, for every key that
-- was answered 2xx.
CREATE TABLE soak_api_effects (
    id          BIGSERIAL   PRIMARY KEY,
    tenant      TEXT        NOT NULL,
    idem_key    TEXT        NOT NULL,
    amount      BIGINT      NOT NULL,
    -- The session's app.tenant as the handler found it: anything but '' is another request's
    -- session state lent to this one.
    seen_tenant TEXT        NOT NULL,
    -- The process tag (SOAK_PROCESS) and the PostgreSQL backend that wrote the row.
    process     TEXT        NOT NULL,
    backend_pid INTEGER     NOT NULL DEFAULT pg_backend_pid(),
    inserted_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX soak_api_effects_key ON soak_api_effects (tenant, idem_key);
