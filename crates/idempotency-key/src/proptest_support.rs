//! Shared by the property tests (test builds only).

use proptest::test_runner::Config as ProptestConfig;

/// `cases` cases per property; a failure is reported with its minimal input, and no
/// regression file is written into `src/`.
pub(crate) fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}
