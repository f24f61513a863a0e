-- The operator console and the CLI's bulk actions (issue 28); see the PostgreSQL migration of
-- the same version for why each. Times are Unix milliseconds.
CREATE TABLE admin_actions (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    at      INTEGER NOT NULL,
    actor   TEXT    NOT NULL,
    action  TEXT    NOT NULL,
    filter  TEXT    NOT NULL,
    count   INTEGER NOT NULL
);

CREATE INDEX duplicate_deliveries_0_seen_at ON duplicate_deliveries_0 (seen_at);
CREATE INDEX duplicate_deliveries_1_seen_at ON duplicate_deliveries_1 (seen_at);
CREATE INDEX duplicate_deliveries_2_seen_at ON duplicate_deliveries_2 (seen_at);
CREATE INDEX duplicate_deliveries_3_seen_at ON duplicate_deliveries_3 (seen_at);
CREATE INDEX duplicate_deliveries_4_seen_at ON duplicate_deliveries_4 (seen_at);
CREATE INDEX dead_letters_created_at ON dead_letters (created_at, id);
CREATE INDEX stale_events_recorded_at ON stale_events (recorded_at, id);
CREATE INDEX outbox_failed_created_at ON outbox (created_at, id) WHERE status = 'failed';

CREATE INDEX processed_events_0_at ON processed_events_0 (processed_at, key);
CREATE INDEX processed_events_1_at ON processed_events_1 (processed_at, key);
CREATE INDEX processed_events_2_at ON processed_events_2 (processed_at, key);
CREATE INDEX processed_events_3_at ON processed_events_3 (processed_at, key);
CREATE INDEX processed_events_4_at ON processed_events_4 (processed_at, key);
CREATE INDEX processed_events_0_type ON processed_events_0 (event_type, processed_at, key);
CREATE INDEX processed_events_1_type ON processed_events_1 (event_type, processed_at, key);
CREATE INDEX processed_events_2_type ON processed_events_2 (event_type, processed_at, key);
CREATE INDEX processed_events_3_type ON processed_events_3 (event_type, processed_at, key);
CREATE INDEX processed_events_4_type ON processed_events_4 (event_type, processed_at, key);
