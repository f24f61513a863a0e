-- Idempotency-Key layer (src/idempotency): one row per (account, key).
-- status 'in_progress' rows are claims held by a running request until locked_until (the lease);
-- claim_token identifies the holder so that a request whose lease was taken over cannot
-- complete or release the new holder's claim. 'completed' rows carry the stored response.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    account          TEXT        NOT NULL,
    key              TEXT        NOT NULL,
    fingerprint      BYTEA       NOT NULL,
    status           TEXT        NOT NULL CHECK (status IN ('in_progress', 'completed')),
    claim_token      UUID,
    locked_until     TIMESTAMPTZ,
    response_status  SMALLINT,
    response_headers JSONB,
    response_body    BYTEA,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at       TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (account, key)
) WITH (fillfactor = 70);
-- fillfactor: completion rewrites the row without touching an indexed column, so free room on
-- the page lets it be a HOT update (no index writes) on the hot path.

-- Batch deletion of expired keys scans by expiry.
CREATE INDEX IF NOT EXISTS idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);
