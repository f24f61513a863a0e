-- no-transaction
-- An ordered lane's claim asks, for each due row, whether an earlier row of its key is still
-- pending or failed and not skipped; the held keys of the console are read the same way. Only
-- rows that can hold a key are indexed. CONCURRENTLY: a migration against a large outbox does
-- not block the consumers' inserts.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_lane_key ON outbox (sink, ordering_key, id) WHERE ordering_key IS NOT NULL AND status IN ('pending', 'failed') AND skipped_at IS NULL
