-- no-transaction
-- The console lists handled events newest first (issue 28): generation 0's ids by time. The
-- key breaks ties between the ids of one batch (one transaction, one now()) for keyset pages.
-- CONCURRENTLY, so the build does not block the consumer's inserts into the current generation
-- (one statement per migration: CONCURRENTLY cannot run in a transaction).
CREATE INDEX CONCURRENTLY IF NOT EXISTS processed_events_0_at ON processed_events_0 (processed_at, key)
