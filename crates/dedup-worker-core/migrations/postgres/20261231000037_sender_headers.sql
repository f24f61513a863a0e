-- The sender's delivery headers a named source's scheme keeps (`X-GitHub-Delivery`, …; issue
-- 37), as one JSON array of [name, value] pairs, carried to the handler's `Event::header`. NULL
-- when there are none (Stripe, Standard Webhooks, other producers). A nullable column without a
-- default: no table rewrite.
ALTER TABLE queue_messages ADD COLUMN sender_headers TEXT;
