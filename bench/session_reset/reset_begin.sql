BEGIN \; CLOSE ALL \; RESET ALL \; UNLISTEN * \; DISCARD TEMP \; DISCARD SEQUENCES \; SELECT set_config(E'session_authorization', E'postgres', false), set_config(E'search_path', E'dedup_worker, public', false), set_config(E'role', E'none', false), pg_advisory_unlock_all() \; COMMIT \; BEGIN;
INSERT INTO session_reset_bench (v) VALUES (1);
COMMIT;
