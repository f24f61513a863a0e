-- The ceiling of one consumer batch's transaction (forward handler, default batch of 256 new
-- events, no duplicates), as the consumer sends it on PostgreSQL (read with log_statement=all
-- from `dedup-worker consume`; crates/dedup-worker-core/src/consumer/batch.rs, crates/dedup-worker-core/src/store/dedup/postgres.rs,
-- crates/dedup-worker-core/src/store/outbox_rows.rs): BEGIN, the shared ring lock, the generations read, the dedup
-- insert (the consumer's exact statement for current slot 0, its arrays built here from
-- generate_series instead of bound: fresh random 16-byte keys sorted as the consumer sorts
-- them, ids from the client and a random number, `created` given so sealed generations may be
-- skipped, no aliases), the outbox insert with its NOTIFY, COMMIT.
-- pgbench variables: -D batch=256.
\set n random(1, 9000000000000000)
BEGIN ISOLATION LEVEL READ COMMITTED;
SELECT pg_advisory_xact_lock_shared(7234298832001067374);
SELECT slot, extract(epoch FROM sealed_at)::float8 FROM dedup_generations;
INSERT INTO processed_events_0 (key, source, event_id, event_type, received_at, delivery_attempt)
                 SELECT e.key, 'stripe', e.id, e.t, to_timestamp(e.r / 1000.0::float8), e.a
                   FROM UNNEST(ARRAY(SELECT gen_random_uuid() FROM generate_series(1, :batch::int) ORDER BY 1),
                               ARRAY(SELECT 'evt_ceil_' || :client_id::text || '_' || :n::text || '_' || g FROM generate_series(1, :batch::int) g),
                               array_fill('invoice.paid'::text, ARRAY[:batch::int]),
                               array_fill(extract(epoch FROM now())::float8, ARRAY[:batch::int]),
                               array_fill((extract(epoch FROM now()) * 1000)::int8, ARRAY[:batch::int]),
                               array_fill(1, ARRAY[:batch::int]),
                               array_fill(NULL::uuid, ARRAY[:batch::int]),
                               array_fill(NULL::text, ARRAY[:batch::int])) AS e(key, id, t, c, r, a, ak, ai)
                  WHERE NOT EXISTS (SELECT 1 FROM processed_events_legacy l
                                     WHERE l.source = 'stripe' AND l.event_id = e.id)
   AND (e.c >= NULL::float8 OR NOT EXISTS (SELECT 1 FROM processed_events_1 p WHERE p.key = e.key))
   AND (e.c >= NULL::float8 OR NOT EXISTS (SELECT 1 FROM processed_events_2 p WHERE p.key = e.key))
   AND (e.c >= NULL::float8 OR NOT EXISTS (SELECT 1 FROM processed_events_3 p WHERE p.key = e.key))
   AND (e.c >= NULL::float8 OR NOT EXISTS (SELECT 1 FROM processed_events_4 p WHERE p.key = e.key))
                    AND (e.ak IS NULL OR (NOT EXISTS (SELECT 1 FROM processed_events_legacy l
                                           WHERE l.source = 'stripe' AND l.event_id = e.ai)
        AND NOT EXISTS (SELECT 1 FROM processed_events_0 p WHERE p.key = e.ak)
        AND NOT EXISTS (SELECT 1 FROM processed_events_1 p WHERE p.key = e.ak)
        AND NOT EXISTS (SELECT 1 FROM processed_events_2 p WHERE p.key = e.ak)
        AND NOT EXISTS (SELECT 1 FROM processed_events_3 p WHERE p.key = e.ak)
        AND NOT EXISTS (SELECT 1 FROM processed_events_4 p WHERE p.key = e.ak)))
                 ON CONFLICT DO NOTHING
                 RETURNING event_id;
WITH inserted AS (
                 INSERT INTO outbox (source, event_id, destination, idempotency_key, event_type, payload,
                                     traceparent)
                 SELECT * FROM UNNEST(array_fill('stripe'::text, ARRAY[:batch::int]),
                                      ARRAY(SELECT 'evt_ceil_' || :client_id::text || '_' || :n::text || '_' || g FROM generate_series(1, :batch::int) g),
                                      array_fill(NULL::text, ARRAY[:batch::int]),
                                      ARRAY(SELECT 'evt_ceil_' || :client_id::text || '_' || :n::text || '_' || g FROM generate_series(1, :batch::int) g),
                                      array_fill('invoice.paid'::text, ARRAY[:batch::int]),
                                      ARRAY(SELECT convert_to('{"id":"evt_ceil_' || :client_id::text || '_' || :n::text || '_' || g
                                                   || '","object":"event","type":"invoice.paid","created":1796387916,"data":{"object":{"id":"in_evt_ceil_'
                                                   || g || '","amount_paid":1999,"currency":"usd"}}}', 'UTF8')
                                              FROM generate_series(1, :batch::int) g),
                                      array_fill(NULL::text, ARRAY[:batch::int]))
                 RETURNING 1
             )
             SELECT pg_notify('dedup_outbox', ''), (SELECT count(*) FROM inserted);
COMMIT;
