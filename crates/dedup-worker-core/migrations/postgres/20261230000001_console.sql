-- The operator console and the CLI's bulk actions (issue 28).
--
-- 1. Every bulk action an operator took (a dead-letter redrive, a retry of failed deliveries, a
--    re-send of dispatched ones), from the console or the CLI: who, when, with which filter, and
--    how many rows it acted on. Written once per action, never updated; the console lists the
--    newest. Deleted by nothing: a few rows a day at most.
CREATE TABLE admin_actions (
    id      BIGSERIAL   PRIMARY KEY,
    at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    actor   TEXT        NOT NULL,
    action  TEXT        NOT NULL,
    filter  TEXT        NOT NULL,
    count   BIGINT      NOT NULL
);

-- 2. Listing each outcome newest first, in keyset pages. These tables are written only for the
--    deliveries they describe (a duplicate, a stale event, a dead letter), so an index each costs
--    the consumer nothing on its common path. Times grow with inserts: each row lands on the
--    right edge of its index. The generation tables' indexes, and the outbox's (which consumers
--    and relays write all the time), are built one per migration, CONCURRENTLY, in the
--    migrations that follow.
CREATE INDEX duplicate_deliveries_seen_at ON duplicate_deliveries (seen_at);
CREATE INDEX dead_letters_created_at ON dead_letters (created_at, id);
CREATE INDEX stale_events_recorded_at ON stale_events (recorded_at, id);
