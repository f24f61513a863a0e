-- no-transaction
-- Each lane claims its own due rows (`WHERE sink = $1 AND status = 'pending' AND
-- next_attempt_at <= now() ORDER BY next_attempt_at`), and the relay finds lanes with rows due
-- by a loose scan of the distinct sinks. Built CONCURRENTLY (no transaction, one statement) so a
-- migration against a large outbox does not block the consumers' inserts while it scans.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_lane_due ON outbox (sink, next_attempt_at) WHERE status = 'pending'
