-- Issue 39, ordering by key: a sink with `ordered = true` delivers rows with the same
-- `ordering_key` in id order, one at a time (a later row waits while an earlier one is pending,
-- or failed and not skipped). NULL: the row holds nothing and waits for nothing. Ids are commit
-- order per key because the insert takes a transaction-scoped advisory lock per ordered key
-- (store/outbox.rs), so a later transaction of the key allocates its ids after the earlier one
-- committed.
ALTER TABLE outbox ADD COLUMN ordering_key TEXT;
-- An operator's `dedup-worker outbox skip ID`: the row stays failed (still listed as not
-- delivered) but no longer holds its key.
ALTER TABLE outbox ADD COLUMN skipped_at TIMESTAMPTZ;
ALTER TABLE outbox ADD COLUMN skipped_by TEXT;
