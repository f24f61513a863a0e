//! The request fingerprint never panics on any body under a JSON content type, is
//! deterministic, and whitespace around a body changes neither whether it is canonicalised as
//! JSON nor, when it is, the fingerprint.
//!
//! Whether a body was canonicalised is read off the result: a body that is not JSON to the
//! canonicaliser is hashed as raw bytes, exactly as without a JSON content type. (Its own
//! notion of valid JSON is the one to use: serde_json's `RawValue` accepts lone surrogates such
//! as `"\ude00"`, which the canonicaliser, like a handler decoding into `String`, refuses, and
//! `serde_json::Value` refuses `1e400`, which the canonicaliser copies as written.)
#![no_main]

use idempotency_key::Fingerprint;
use http::{header::CONTENT_TYPE, HeaderMap, HeaderValue, Method};
use libfuzzer_sys::fuzz_target;

#[path = "support.rs"]
mod support;

fuzz_target!(init: support::catch_stack_overflow(), |body: &[u8]| {
    let mut json = HeaderMap::new();
    json.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let plain = HeaderMap::new();
    let fp = |headers: &HeaderMap, body: &[u8]| {
        Fingerprint::compute(&Method::POST, "/p", None, headers, body)
    };

    let first = fp(&json, body);
    assert_eq!(first, fp(&json, body), "not deterministic");

    let mut spaced = b" \n\t".to_vec();
    spaced.extend_from_slice(body);
    spaced.extend_from_slice(b"\r\n ");
    let spaced_fp = fp(&json, &spaced);
    if first != fp(&plain, body) {
        assert_eq!(first, spaced_fp, "whitespace around a JSON body changed its fingerprint");
    } else {
        assert_eq!(
            spaced_fp,
            fp(&plain, &spaced),
            "whitespace around a body made it JSON"
        );
    }
});
