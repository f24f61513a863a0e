//! Shared by the property tests (test builds only).

use proptest::prelude::*;

/// `cases` cases per property; a failure is reported with its minimal input, and no
/// regression file is written into `src/`.
pub(crate) fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Any `i64`, with the values that overflow careless arithmetic (timestamps, clocks) weighted in.
pub(crate) fn extreme_i64() -> impl Strategy<Value = i64> {
    prop_oneof![
        any::<i64>(),
        Just(i64::MIN),
        Just(i64::MIN + 1),
        Just(i64::MAX),
        Just(-1),
        Just(0),
        Just(1),
    ]
}
