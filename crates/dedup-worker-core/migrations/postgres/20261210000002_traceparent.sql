-- The W3C traceparent an event's trace continues from: the publisher's span (queue rows) and
-- the handler's span (outbox rows). NULL when traces are off. A nullable column without a
-- default: no table rewrite.
ALTER TABLE queue_messages ADD COLUMN traceparent TEXT;
ALTER TABLE outbox ADD COLUMN traceparent TEXT;
