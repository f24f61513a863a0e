-- The compact Stripe-Signature (`t=…,v1=…`) the ingress verified, carried with the message so
-- the consumer can verify it again before it trusts the event's `created` (which decides which
-- dedup generations an event may skip). NULL from every other publisher. A nullable column
-- without a default: no table rewrite.
ALTER TABLE queue_messages ADD COLUMN stripe_signature TEXT;
