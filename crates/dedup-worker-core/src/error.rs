//! [`Cause`]: the payload of the boundary errors that classify a failure by what the caller
//! should do next ([`crate::queue::TransportError`]: unavailable or rejected,
//! [`crate::consumer::HandlerError`]: retryable or fatal) rather than by where it came from.
//! Their variants say what to do; the cause says why, and keeps the underlying error as its
//! `source`.

/// Why a call failed: what we say about it, and the error it came from (the broker client's,
/// the SDK's, the store's, sqlx's), kept as the `source` so the cause chain survives. Cheap to
/// clone: one failed group commit answers every caller in the group with the same cause.
#[derive(Debug, Clone)]
pub struct Cause {
    /// What failed, as logged and answered (it already includes the underlying error's text
    /// where that text is what an operator needs).
    context: String,
    /// The underlying error, if there is one.
    source: Option<std::sync::Arc<dyn std::error::Error + Send + Sync>>,
}

impl Cause {
    /// `context`, caused by `source`.
    pub fn new(
        context: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Cause {
            context: context.into(),
            source: Some(std::sync::Arc::new(source)),
        }
    }
}

impl From<String> for Cause {
    fn from(context: String) -> Self {
        Cause {
            context,
            source: None,
        }
    }
}

impl From<&str> for Cause {
    fn from(context: &str) -> Self {
        Cause::from(context.to_owned())
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.context)
    }
}

impl std::error::Error for Cause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}
