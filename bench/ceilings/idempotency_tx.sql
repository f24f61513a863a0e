-- The ceiling of a first execution in the transactional mode (IdempotentTx), as one pgbench
-- transaction: exactly the statements the path sends for one request, in one commit:
--   the claim (a new key, as the grouped claim writes it), the handler's insert (the
--   idempotency_load harness's provider stub), the token-guarded completion, the commit.
-- The path itself commits the claim apart (grouped with other requests' claims) and the rest
-- in the handler's transaction; this script gives PostgreSQL the cheaper single commit.
\set n random(1, 9000000000000000)
BEGIN;
INSERT INTO dedup_worker.idempotency_keys AS k
    (account, key, fingerprint, status, claim_token, locked_until, created_at, expires_at)
VALUES ('Bearer acct_bench', 'ceil-' || :client_id::text || '-' || :n::text, '\x0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef'::bytea,
        'in_progress', '6f9619ff-8b86-d011-b42d-00c04fc964ff'::uuid,
        now() + 30000 * interval '1 millisecond', now(), now() + 86400000 * interval '1 millisecond')
ON CONFLICT (account, key) DO NOTHING
RETURNING k.claim_token;
INSERT INTO bench_charges (merchant, amount, currency) VALUES ('acct_bench', 4200, 'eur') RETURNING id;
UPDATE dedup_worker.idempotency_keys
   SET status = 'completed', claim_token = NULL, locked_until = NULL,
       response_status = 201, response_headers = '[["content-type","text/plain; charset=utf-8"]]'::jsonb,
       response_body = '\x7b226964223a2263685f31222c22737461747573223a22737563636565646564227d'::bytea
 WHERE account = 'Bearer acct_bench' AND key = 'ceil-' || :client_id::text || '-' || :n::text
   AND claim_token = '6f9619ff-8b86-d011-b42d-00c04fc964ff'::uuid AND status = 'in_progress'
RETURNING GREATEST(0, floor(extract(epoch FROM (expires_at - now())) * 1000))::bigint;
COMMIT;
