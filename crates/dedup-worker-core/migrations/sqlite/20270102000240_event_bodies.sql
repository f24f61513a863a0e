-- Issue 40: the body of each handled event; see the PostgreSQL migration of the same version.
-- One plain table: retention deletes the oldest rows 500 at a time by id (insert order is time
-- order, so no time index is needed), each delete its own short transaction. Times are Unix ms.
CREATE TABLE event_bodies (
    id          INTEGER PRIMARY KEY,
    kept_at     INTEGER NOT NULL,
    key         BLOB    NOT NULL,
    source      TEXT    NOT NULL,
    event_id    TEXT    NOT NULL,
    event_type  TEXT    NOT NULL,
    object_id   TEXT,
    customer    TEXT,
    headers     TEXT,
    received_at INTEGER,
    encoding    INTEGER NOT NULL,
    body        BLOB    NOT NULL
);
CREATE INDEX event_bodies_event ON event_bodies (event_id, kept_at);
CREATE INDEX event_bodies_customer ON event_bodies (customer, kept_at) WHERE customer IS NOT NULL;
CREATE INDEX event_bodies_object ON event_bodies (object_id, kept_at) WHERE object_id IS NOT NULL;
