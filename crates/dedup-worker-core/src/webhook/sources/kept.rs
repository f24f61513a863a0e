//! The sender's headers a scheme keeps ([`Scheme::kept_headers`]), read from a verified
//! delivery for the message the handler's `Event` is made of.

use axum::http::HeaderMap;

use super::Scheme;
use crate::event::SenderHeaders;

/// The headers `scheme` keeps, as `headers` carries them, in the scheme's order. A header sent
/// twice keeps its first value; one that is not visible ASCII, or too long (see
/// [`SenderHeaders::push`]), is left out rather than refusing a delivery that verified: these
/// are for the handler's convenience, not what the event is deduplicated on.
pub(super) fn kept_headers(scheme: &dyn Scheme, headers: &HeaderMap) -> SenderHeaders {
    let mut kept = SenderHeaders::default();
    for name in scheme.kept_headers() {
        if let Some(value) = headers.get(*name).and_then(|v| v.to_str().ok()) {
            kept.push(name, value);
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;
    use crate::http::problem::Problem;
    use crate::webhook::sources::{Delivery, Identified, Keys};

    struct Keeps;

    impl Scheme for Keeps {
        fn verify(&self, _: &Delivery<'_>, _: &Keys<'_>) -> Result<(), Problem> {
            Ok(())
        }

        fn identify(&self, _: &Delivery<'_>) -> Result<Identified, Problem> {
            Ok(Identified::Challenge(serde_json::Value::Null))
        }

        fn kept_headers(&self) -> &'static [&'static str] {
            &["x-delivery", "x-retry-num", "x-binary", "x-absent"]
        }
    }

    #[test]
    fn only_the_named_headers_are_kept_in_the_schemes_order() {
        let mut headers = HeaderMap::new();
        headers.insert("x-retry-num", HeaderValue::from_static("2"));
        headers.insert("X-Delivery", HeaderValue::from_static("d-1"));
        headers.insert("x-other", HeaderValue::from_static("not kept"));
        headers.insert("x-binary", HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap());
        let kept = kept_headers(&Keeps, &headers);
        let pairs: Vec<(&str, &str)> = kept.iter().collect();
        assert_eq!(pairs, [("x-delivery", "d-1"), ("x-retry-num", "2")]);
    }
}
