-- The `dedup_outbox_failed` gauge counts failed rows every few seconds; without an index that
-- count reads the whole outbox (a week of dispatched rows by default). Failed rows are few, so a
-- partial index on them keeps the count as small as they are.
CREATE INDEX IF NOT EXISTS outbox_failed ON outbox (id) WHERE status = 'failed';
