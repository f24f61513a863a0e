-- no-transaction
-- The `dedup_outbox_failed` gauge counts failed rows every few seconds in every process; without
-- an index that count reads the whole outbox (a week of dispatched rows by default). Failed rows
-- are few, so a partial index on them keeps the count as small as they are. Built CONCURRENTLY
-- (hence no transaction, and one statement) so a migration against a large outbox does not
-- block the consumers' inserts while it scans.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_failed ON outbox (id) WHERE status = 'failed'
