-- The database queue's ack after the commit (crates/dedup-worker-core/src/store/queue_rows.rs, ack_messages): its own
-- autocommit `DELETE … WHERE id = ANY($1)`. The consumer binds the claimed ids; pgbench cannot
-- carry 256 ids from the claim, so they are found again by the claim token among the rows
-- leased now (the claim index's range `visible_at > now()`: the batches in flight), a little
-- more work than the consumer's bound array.
DELETE FROM queue_messages WHERE id = ANY(ARRAY(
    SELECT id FROM queue_messages
     WHERE queue = :queue::text AND visible_at > now() AND claim_token = :tok));
