-- The database queue's claim of one consumer batch (crates/dedup-worker-core/src/store/queue_rows.rs, claim_messages),
-- its own autocommit statement before the batch transaction, exactly as the consumer sends it
-- (lease 10 s, a random claim token). pgbench variables: -D queue=<name> (run with -M prepared: the variables are bound as parameters) -D batch=256.
-- consumer.sh runs consumer_claim.sql + consumer_tx.sql + consumer_ack.sql as one script.
\set tok random(1, 4000000000000000000)
UPDATE queue_messages q
                SET visible_at = now() + make_interval(secs => 10), attempts = q.attempts + 1,
                    claim_token = :tok
               FROM (SELECT id FROM queue_messages
                      WHERE queue = :queue::text AND visible_at <= now()
                      ORDER BY visible_at, id
                      LIMIT :batch::int
                      FOR UPDATE SKIP LOCKED) c
              WHERE q.id = c.id
          RETURNING q.id, q.source, q.message_id, q.message_type, q.payload, q.attempts,
                    floor(extract(epoch FROM q.enqueued_at) * 1000)::int8 AS enqueued_at,
                    q.traceparent, q.stripe_signature, q.claim_token;
