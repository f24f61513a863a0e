-- Which claim holds a leased row: each claim of the outbox or the database queue writes a fresh
-- random token, and a mark (dispatched, delivery failed) or a release applies only while the row
-- still carries the token of the caller's claim. A relay or consumer whose lease expired and was
-- taken over by another then changes nothing. NULL: never claimed (or claimed before this
-- migration).
ALTER TABLE outbox ADD COLUMN claim_token INTEGER;
ALTER TABLE queue_messages ADD COLUMN claim_token INTEGER;
