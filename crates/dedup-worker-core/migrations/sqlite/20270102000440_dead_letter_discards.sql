-- Issue 40: dead letters discarded by an operator, recorded beside the redriven ones; see the
-- PostgreSQL migration of the same version.
ALTER TABLE dead_letter_redrives ADD COLUMN outcome TEXT NOT NULL DEFAULT 'redriven'
    CHECK (outcome IN ('redriven', 'discarded'));
ALTER TABLE dead_letter_redrives ADD COLUMN actor TEXT;
