-- NOT what the ingress sends: a variant measured for issue 29 (GROUP_SQL=<this file>
-- ingress.sh gives its ceiling). The NOTIFY in the insert's transaction (ingress_group.sql)
-- holds PostgreSQL's cluster-wide notify lock from before the commit record until its flush,
-- so the writers' commits never share an fsync (pg_stat_activity: 3 of 4 writers in
-- Lock/object, 1 in IO/WALSync). This variant sends the group's messages
-- in one autocommit INSERT … SELECT FROM UNNEST (its commit is the group's fsync), then on the
-- same connection the wake-up in a transaction of its own without waiting for its flush
-- (crates/dedup-worker-core/src/store/postgres.rs, notify_after_commit). The arrays are built here from generate_series
-- instead of bound: fresh ids, loadgen's payload shape (~150 bytes), type invoice.paid, source
-- stripe, no traceparent, a Stripe signature of the size the ingress carries.
-- pgbench variables (run with -M prepared: they are bound as parameters): -D queue=<name>
-- -D group=<rows>.
\set n random(1, 9000000000000000)
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
         ARRAY(SELECT 't=1796387916,v1=' || md5(:n::text || '_' || g) || md5(g || '_' || :n::text) FROM generate_series(1, :group::int) g));
SELECT set_config('synchronous_commit', 'off', true), pg_notify('dedup_queue', :queue::text);
