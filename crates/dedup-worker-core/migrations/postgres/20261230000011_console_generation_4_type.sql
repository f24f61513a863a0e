-- no-transaction
-- The console lists handled events of a type (or a type prefix: text_pattern_ops, whatever the
-- database's collation) newest first (issue 28), for generation 4. Each type's inserts land on
-- its own right edge. CONCURRENTLY, as the one before.
CREATE INDEX CONCURRENTLY IF NOT EXISTS processed_events_4_type ON processed_events_4 (event_type text_pattern_ops, processed_at, key)
