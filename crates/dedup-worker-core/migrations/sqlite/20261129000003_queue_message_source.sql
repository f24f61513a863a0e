-- Which provider a queued message came from (`stripe`, `standard`, …): the first half of the
-- dedup key. NULL for messages from other producers: the consumer's configured source applies.
ALTER TABLE queue_messages ADD COLUMN source TEXT;
