-- Issue 40: per-minute counts written with what they count; see the PostgreSQL migration of
-- the same version. `minute` is Unix milliseconds, floored to the minute of the writing
-- transaction's start (as `processed_at` is that start).
CREATE TABLE activity_minutes (
    minute INTEGER NOT NULL,
    series TEXT    NOT NULL,
    shard  INTEGER NOT NULL,
    n      INTEGER NOT NULL,
    PRIMARY KEY (minute, series, shard)
);
