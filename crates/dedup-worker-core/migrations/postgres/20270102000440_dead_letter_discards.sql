-- Issue 40: an operator may discard a dead letter (junk: no event id, not JSON, or simply not
-- wanted). Like a redrive, the discard deletes it and keeps a record of what it was, beside the
-- redrives, so its page and `events show` still say what became of it and who decided.
-- `redriven_to` stays NOT NULL ('' for a discard): dropping it is a catalog change here but a
-- table rebuild on SQLite, and nothing reads an empty destination as one.
-- The table is small (purged after the dedup window): the CHECK's scan is brief, no rewrite
-- (a constant default is kept in the catalog since PostgreSQL 11).
ALTER TABLE dead_letter_redrives
    ADD COLUMN outcome TEXT NOT NULL DEFAULT 'redriven'
        CHECK (outcome IN ('redriven', 'discarded')),
    ADD COLUMN actor TEXT; -- who discarded it (`console (ops)`, `cli (alice)`); NULL for a redrive
