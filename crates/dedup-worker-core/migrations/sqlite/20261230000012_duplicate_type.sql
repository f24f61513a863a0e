-- A duplicate's event type (issue 28); see the PostgreSQL migration of the same version.
ALTER TABLE duplicate_deliveries_0 ADD COLUMN event_type TEXT;
ALTER TABLE duplicate_deliveries_1 ADD COLUMN event_type TEXT;
ALTER TABLE duplicate_deliveries_2 ADD COLUMN event_type TEXT;
ALTER TABLE duplicate_deliveries_3 ADD COLUMN event_type TEXT;
ALTER TABLE duplicate_deliveries_4 ADD COLUMN event_type TEXT;
CREATE INDEX duplicate_deliveries_0_type ON duplicate_deliveries_0 (event_type, seen_at, key);
CREATE INDEX duplicate_deliveries_1_type ON duplicate_deliveries_1 (event_type, seen_at, key);
CREATE INDEX duplicate_deliveries_2_type ON duplicate_deliveries_2 (event_type, seen_at, key);
CREATE INDEX duplicate_deliveries_3_type ON duplicate_deliveries_3 (event_type, seen_at, key);
CREATE INDEX duplicate_deliveries_4_type ON duplicate_deliveries_4 (event_type, seen_at, key);
