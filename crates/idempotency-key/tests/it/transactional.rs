//! The layer's tests again, in the transactional mode: every counting handler also inserts a
//! row through its `IdempotentTx`, committed with the stored result (see
//! [`in_transactional_mode`]). Replays, 422, 409, `NotExecuted`, TTLs, leases and Redis loss
//! answer the same in both modes. The tests only the transactional mode has are in
//! [`atomic`](super::atomic).

use crate::helpers::in_transactional_mode;

#[test]
fn same_key_same_body_replays_status_headers_body_and_runs_once() {
    in_transactional_mode(
        super::replay::same_key_same_body_replays_status_headers_body_and_runs_once,
    );
}

#[test]
fn same_key_different_body_is_422_and_stored_result_is_untouched() {
    in_transactional_mode(
        super::replay::same_key_different_body_is_422_and_stored_result_is_untouched,
    );
}

#[test]
fn key_presence_length_and_forms() {
    in_transactional_mode(super::replay::key_presence_length_and_forms);
}

#[test]
fn same_key_under_two_accounts_is_two_requests() {
    in_transactional_mode(super::replay::same_key_under_two_accounts_is_two_requests);
}

#[test]
fn declined_402_is_replayed_and_5xx_releases_the_key() {
    in_transactional_mode(super::replay::declined_402_is_replayed_and_5xx_releases_the_key);
}

#[test]
fn an_oversized_body_is_413_and_nothing_runs() {
    in_transactional_mode(super::replay::an_oversized_body_is_413_and_nothing_runs);
}

#[test]
fn while_a_request_runs_another_request_is_422_and_a_duplicate_409() {
    in_transactional_mode(
        super::concurrency::while_a_request_runs_another_request_is_422_and_a_duplicate_409,
    );
}

#[test]
fn drain_waits_for_a_request_whose_client_went_away() {
    in_transactional_mode(super::concurrency::drain_waits_for_a_request_whose_client_went_away);
}

#[test]
fn hundred_concurrent_requests_one_key_run_once() {
    in_transactional_mode(super::concurrency::hundred_concurrent_requests_one_key_run_once);
}

#[test]
fn after_the_ttl_a_key_executes_again_and_expired_rows_are_deleted() {
    in_transactional_mode(
        super::leases::after_the_ttl_a_key_executes_again_and_expired_rows_are_deleted,
    );
}

#[test]
fn a_crashed_request_holds_the_key_until_its_lease_ends_then_one_retry_runs() {
    in_transactional_mode(
        super::leases::a_crashed_request_holds_the_key_until_its_lease_ends_then_one_retry_runs,
    );
}

#[test]
fn a_handler_slower_than_the_lease_keeps_its_claim() {
    in_transactional_mode(super::leases::a_handler_slower_than_the_lease_keeps_its_claim);
}

#[cfg(feature = "redis")]
#[test]
fn redis_replays_skip_postgres_and_a_flushed_or_stopped_redis_changes_nothing() {
    in_transactional_mode(
        super::redis::redis_replays_skip_postgres_and_a_flushed_or_stopped_redis_changes_nothing,
    );
}

#[cfg(feature = "redis")]
#[test]
fn a_black_holed_redis_leaves_every_answer_to_postgres_and_the_fast_path_returns() {
    in_transactional_mode(super::redis_faults::a_black_holed_redis_leaves_every_answer_to_postgres_and_the_fast_path_returns);
}

#[cfg(feature = "redis")]
#[test]
fn a_refusing_redis_leaves_every_answer_to_postgres_and_the_fast_path_returns() {
    in_transactional_mode(super::redis_faults::a_refusing_redis_leaves_every_answer_to_postgres_and_the_fast_path_returns);
}

#[cfg(feature = "redis")]
#[test]
fn cut_redis_connections_leave_every_answer_to_postgres_and_the_fast_path_returns() {
    in_transactional_mode(super::redis_faults::cut_redis_connections_leave_every_answer_to_postgres_and_the_fast_path_returns);
}

#[test]
fn postgres_that_stops_answering_is_503_and_the_breaker_refuses_the_queue() {
    in_transactional_mode(
        super::postgres::postgres_that_stops_answering_is_503_and_the_breaker_refuses_the_queue,
    );
}
