-- Issue 39, ordering by key: see the PostgreSQL migrations of versions 239 and 339. SQLite has
-- one writer at a time, so ids already are commit order. Times are milliseconds since the epoch.
ALTER TABLE outbox ADD COLUMN ordering_key TEXT;
ALTER TABLE outbox ADD COLUMN skipped_at INTEGER;
ALTER TABLE outbox ADD COLUMN skipped_by TEXT;
CREATE INDEX outbox_lane_key ON outbox (sink, ordering_key, id)
    WHERE ordering_key IS NOT NULL AND status IN ('pending', 'failed') AND skipped_at IS NULL;
