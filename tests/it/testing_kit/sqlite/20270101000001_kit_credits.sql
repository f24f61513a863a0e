-- The table of the test kit's example handler (tests/it/testing_kit.rs).
CREATE TABLE kit_credits (
    event_id TEXT PRIMARY KEY,
    amount BIGINT NOT NULL
);
