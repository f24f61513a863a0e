-- The ceiling of one database-queue group commit of the ingress (crates/dedup-worker-core/src/store/queue_rows.rs,
-- enqueue; crates/dedup-worker-core/src/queue/database.rs, write_groups): one autocommit statement inserting the
-- group's messages with UNNEST and notifying the queue's channel in the same transaction,
-- exactly as the writers send it, the arrays built here from generate_series instead of bound:
-- fresh ids, loadgen's payload shape (~150 bytes), type invoice.paid, source stripe, no
-- traceparent, a Stripe signature of the size the ingress carries.
-- pgbench variables (run with -M prepared: they are bound as parameters): -D queue=<name>
-- -D group=<rows>.
\set n random(1, 9000000000000000)
WITH inserted AS (
                 INSERT INTO queue_messages (queue, message_id, message_type, payload, source,
                                             traceparent, stripe_signature)
                 SELECT :queue::text, * FROM UNNEST(
                     ARRAY(SELECT 'evt_ceil_' || :client_id::text || '_' || :n::text || '_' || g FROM generate_series(1, :group::int) g),
                     array_fill('invoice.paid'::text, ARRAY[:group::int]),
                     ARRAY(SELECT convert_to('{"id":"evt_ceil_' || :client_id::text || '_' || :n::text || '_' || g
                                  || '","object":"event","type":"invoice.paid","created":1796387916,"data":{"object":{"id":"in_evt_ceil_'
                                  || g || '","amount_paid":1999,"currency":"usd"}}}', 'UTF8')
                             FROM generate_series(1, :group::int) g),
                     array_fill('stripe'::text, ARRAY[:group::int]),
                     array_fill(NULL::text, ARRAY[:group::int]),
                     ARRAY(SELECT 't=1796387916,v1=' || md5(:n::text || '_' || g) || md5(g || '_' || :n::text) FROM generate_series(1, :group::int) g))
                 RETURNING 1
             )
             SELECT pg_notify('dedup_queue', :queue::text), (SELECT count(*) FROM inserted);
