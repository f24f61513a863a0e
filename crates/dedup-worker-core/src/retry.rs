//! Retry decisions: backoff delays for redeliveries (consumer) and delivery attempts (outbox
//! relay), and which database errors no retry can cure.
//!
//! The delay is stored with the message or row rather than slept in memory, so it survives
//! restarts; `dedup_db::backoff` computes it, with `backon`'s exponential builder and jitter.

/// The delay before attempt `attempt + 1`, and durations as SQL binds them: shared with the
/// Idempotency-Key layer, so they live in `dedup-db`.
pub use dedup_db::backoff::{backoff_delay, millis};

/// Whether the database refused a statement for the values it carried: PostgreSQL's SQLSTATE
/// classes 22 (data exception: a NUL in text, an invalid byte sequence, a value out of range)
/// and 54 (program limit exceeded: an index row larger than a B-tree page allows), SQLite's
/// `SQLITE_TOOBIG`. The same values fail again however often they are retried, so a statement
/// shared by several rows must be split and the offending row given its own, permanent error;
/// any other failure (connection lost, deadlock, timeout) is worth retrying as a whole.
pub fn refused_for_its_data(error: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = error else {
        return false;
    };
    let Some(code) = db.code() else {
        return false;
    };
    code.starts_with("22") || code.starts_with("54") || code == "18"
}

/// Whether no retry can cure `error`, so a handler that hit it is dead-lettered at once rather
/// than redelivered `consumer.max_attempts` times over minutes of backoff. Fatal:
/// * PostgreSQL SQLSTATE classes 21 (cardinality violation), 22 (data exception), 23
///   (integrity constraint violation: unique, foreign key, not null, check), 42 (syntax error
///   or access rule violation: undefined table or column, bad syntax, insufficient privilege)
///   and 54 (program limit exceeded);
/// * SQLite's primary result codes 1 (`SQLITE_ERROR`: syntax error, no such table or column),
///   18 (too big), 19 (constraint), 20 (type mismatch) and 25 (range);
/// * a row or column that does not decode into the type asked for, or a column or type that
///   does not exist: the code and the schema disagree.
///
/// Retryable: everything else, notably a lost connection or pool timeout (08, I/O, TLS), a
/// serialization failure or deadlock (40001, 40P01), a lock or statement timeout (55P03,
/// 57014), a server shutting down or out of resources (57P, 53), SQLite's busy and locked (5,
/// 6), and `RowNotFound`: Stripe delivers events out of order, so the row an event refers to
/// (its customer, its invoice) may arrive with a later one. A handler that races another
/// worker for the same row should write `ON CONFLICT …`: a unique violation is fatal.
pub fn no_retry_can_cure(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => {
            let Some(code) = db.code() else {
                return false;
            };
            if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
                // Extended result codes carry the primary one in their low byte.
                let primary = code.parse::<i32>().map(|c| c & 0xff).unwrap_or(0);
                matches!(primary, 1 | 18 | 19 | 20 | 25)
            } else {
                ["21", "22", "23", "42", "54"]
                    .iter()
                    .any(|class| code.starts_with(class))
            }
        }
        sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::TypeNotFound { .. }
        | sqlx::Error::Encode(_)
        | sqlx::Error::InvalidArgument(_) => true,
        _ => false,
    }
}
