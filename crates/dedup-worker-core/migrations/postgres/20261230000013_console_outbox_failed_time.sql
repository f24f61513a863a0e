-- no-transaction
-- Failed deliveries by time, newest first, for the console's /outbox/failed and the CLI's
-- `outbox retry --failed --since` (issue 28). CONCURRENTLY: the build reads the whole outbox (a
-- week of dispatched rows by default), and a plain build would hold the consumers' outbox inserts
-- and the relays' marks for that long.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_failed_created_at ON outbox (created_at, id) WHERE status = 'failed'
