-- The service's own table: one row per paid invoice, whichever event brought it.
CREATE TABLE paid_invoices (
    invoice_id  TEXT PRIMARY KEY,
    event_id    TEXT NOT NULL,
    amount_paid BIGINT NOT NULL,
    currency    TEXT NOT NULL,
    recorded_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
