-- Issue 39: a sink's `rate_per_sec` and `burst` hold for all relay processes together, not for
-- each. The lane's shared bucket is a GCRA's theoretical arrival time, in microseconds since
-- the epoch (store/sink_rate.rs): a process takes a few tokens at a time, under the row's lock.
-- NULL: a full bucket.
ALTER TABLE outbox_sinks ADD COLUMN rate_tat_us DOUBLE PRECISION;
