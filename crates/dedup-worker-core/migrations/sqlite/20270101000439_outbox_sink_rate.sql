-- Issue 39: a sink's rate shared by every relay process; see the PostgreSQL migration of the
-- same version.
ALTER TABLE outbox_sinks ADD COLUMN rate_tat_us REAL;
