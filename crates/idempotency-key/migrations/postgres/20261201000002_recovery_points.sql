-- Recovery points of the Idempotency-Key layer (src/idempotency/layer/phases.rs): a request
-- split into phases records, with each phase's commit, the phase's name and its output, so that
-- a retry after a crash or a 5xx resumes at the first unfinished phase instead of starting over.
-- phase_data maps each finished phase's name to its JSON output; recovery_point names the last.
-- Both stay with an in-progress row whose claim is released or taken over by the same request;
-- a different request (past the TTL) or an expired result starts from none.
ALTER TABLE idempotency_keys ADD COLUMN recovery_point TEXT, ADD COLUMN phase_data JSONB;
