-- The service's own table: one row per paid invoice, whichever event brought it.
CREATE TABLE paid_invoices (
    invoice_id  TEXT PRIMARY KEY,
    event_id    TEXT NOT NULL,
    amount_paid INTEGER NOT NULL,
    currency    TEXT NOT NULL,
    recorded_at INTEGER NOT NULL DEFAULT (CAST(strftime('%s', 'now') AS INTEGER))
);
