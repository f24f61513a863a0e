BEGIN;
INSERT INTO session_reset_bench (v) VALUES (1);
COMMIT;
