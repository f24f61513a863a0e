//! The request fingerprint: what "the same request" means for a reused key.
//!
//! SHA-256 over the method, the path, the query string and the body. Each part is
//! length-prefixed so that no two different requests can produce the same byte stream
//! (`/a` + `b=1` vs `/ab` + `=1`). JSON bodies are canonicalised first (object keys sorted,
//! no insignificant whitespace), so a client library that reorders keys on a retry still
//! gets its stored result, while any change of value is a different request (422). Numbers
//! are compared as written, never through `f64`.

use std::collections::BTreeMap;

use http::{HeaderMap, Method};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

/// A SHA-256 request fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// Computes the fingerprint of a request.
    pub fn compute(
        method: &Method,
        path: &str,
        query: Option<&str>,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Self {
        let mut h = Sha256::new();
        // A version tag lets the scheme change later without colliding with stored values.
        h.update(b"idempotency-fingerprint-v1\0");
        feed(&mut h, method.as_str().as_bytes());
        feed(&mut h, path.as_bytes());
        feed(&mut h, query.unwrap_or("").as_bytes());
        match canonical_json(headers, body) {
            Some(canonical) => {
                h.update(b"J");
                feed(&mut h, canonical.as_bytes());
            }
            None => {
                h.update(b"B");
                feed(&mut h, body);
            }
        }
        Self(h.finalize().into())
    }

    /// Rebuilds a fingerprint from stored bytes.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        <[u8; 32]>::try_from(bytes).ok().map(Self)
    }

    /// The raw digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lower-case hex, for logs.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

fn feed(h: &mut Sha256, part: &[u8]) {
    h.update((part.len() as u64).to_be_bytes());
    h.update(part);
}

/// True for `application/json` and any `+json` media type.
fn is_json(headers: &HeaderMap) -> bool {
    let Some(ct) = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json" || essence.ends_with("+json")
}

/// The canonical form of a JSON body, or `None` when the body is not (valid) JSON, in which
/// case the raw bytes are hashed instead.
fn canonical_json(headers: &HeaderMap, body: &[u8]) -> Option<String> {
    if !is_json(headers) {
        return None;
    }
    let raw: &RawValue = serde_json::from_slice(body).ok()?;
    let mut out = String::with_capacity(body.len());
    write_canonical_raw(raw, &mut out).ok()?;
    Some(out)
}

/// Writes `raw` with object keys sorted (explicitly: serde_json's map order depends on whether
/// some crate in the build enabled `preserve_order`) and no insignificant whitespace. Numbers are copied as
/// written: parsed into `f64`, `12345678901234567891` and `12345678901234567890` (or two
/// amounts differing in the 17th digit) would be one request and replay each other's result.
/// Strings are re-encoded, so `"\u0041"` and `"A"` are the same. A repeated object key keeps
/// its last value, as JSON parsers that handlers use (serde_json among them) do.
fn write_canonical_raw(raw: &RawValue, out: &mut String) -> Result<(), serde_json::Error> {
    let text = raw.get();
    match text.as_bytes().first() {
        Some(b'{') => {
            let map: BTreeMap<String, &RawValue> = serde_json::from_str(text)?;
            out.push('{');
            for (i, (k, v)) in map.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::to_string(&k)?);
                out.push(':');
                write_canonical_raw(v, out)?;
            }
            out.push('}');
        }
        Some(b'[') => {
            let items: Vec<&RawValue> = serde_json::from_str(text)?;
            out.push('[');
            for (i, v) in items.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical_raw(v, out)?;
            }
            out.push(']');
        }
        Some(b'"') => {
            let s: String = serde_json::from_str(text)?;
            out.push_str(&serde_json::to_string(&s)?);
        }
        // Numbers, true, false, null: the literal itself (RawValue has no surrounding space).
        _ => out.push_str(text),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn json_headers() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=utf-8"),
        );
        h
    }

    fn fp(
        method: Method,
        path: &str,
        query: Option<&str>,
        h: &HeaderMap,
        body: &[u8],
    ) -> Fingerprint {
        Fingerprint::compute(&method, path, query, h, body)
    }

    #[test]
    fn json_key_order_and_whitespace_do_not_matter() {
        let h = json_headers();
        let a = fp(
            Method::POST,
            "/p",
            None,
            &h,
            br#"{"a":1,"b":{"y":2,"x":[1,2]}}"#,
        );
        let b = fp(
            Method::POST,
            "/p",
            None,
            &h,
            b"{ \"b\": {\"x\": [1, 2], \"y\": 2},\n \"a\": 1 }",
        );
        assert_eq!(a, b);
    }

    #[test]
    fn values_method_path_query_matter() {
        let h = json_headers();
        let base = fp(Method::POST, "/p", Some("x=1"), &h, br#"{"a":1}"#);
        assert_ne!(base, fp(Method::POST, "/p", Some("x=1"), &h, br#"{"a":2}"#));
        assert_ne!(
            base,
            fp(Method::PATCH, "/p", Some("x=1"), &h, br#"{"a":1}"#)
        );
        assert_ne!(base, fp(Method::POST, "/q", Some("x=1"), &h, br#"{"a":1}"#));
        assert_ne!(base, fp(Method::POST, "/p", Some("x=2"), &h, br#"{"a":1}"#));
        assert_ne!(base, fp(Method::POST, "/p", None, &h, br#"{"a":1}"#));
    }

    #[test]
    fn numbers_are_compared_exactly_not_as_f64() {
        let h = json_headers();
        let body = |n: &str| format!(r#"{{"amount":{n},"currency":"usd"}}"#);
        let post = |b: String| fp(Method::POST, "/p", None, &h, b.as_bytes());
        // Equal as f64, different amounts.
        assert_ne!(
            post(body("12345678901234567890123")),
            post(body("12345678901234567890124"))
        );
        assert_ne!(
            post(body("9007199254740993")),
            post(body("9007199254740992"))
        );
        assert_ne!(
            post(body("0.30000000000000004")),
            post(body("0.3000000000000000444"))
        );
        // Layout still does not matter, string escapes neither.
        assert_eq!(
            post(body("12345678901234567890123")),
            fp(
                Method::POST,
                "/p",
                None,
                &h,
                b" { \"currency\" : \"\\u0075sd\", \"amount\" : 12345678901234567890123 } "
            )
        );
    }

    #[test]
    fn repeated_keys_keep_the_last_value_like_the_handler_sees() {
        let h = json_headers();
        assert_eq!(
            fp(Method::POST, "/p", None, &h, br#"{"a":1,"a":2}"#),
            fp(Method::POST, "/p", None, &h, br#"{"a":2}"#)
        );
    }

    #[test]
    fn parts_are_delimited() {
        let h = HeaderMap::new();
        assert_ne!(
            fp(Method::POST, "/a", Some("b"), &h, b""),
            fp(Method::POST, "/ab", None, &h, b"")
        );
    }

    #[test]
    fn non_json_bodies_hash_raw_bytes() {
        let h = HeaderMap::new();
        assert_ne!(
            fp(Method::POST, "/p", None, &h, br#"{"a":1,"b":2}"#),
            fp(Method::POST, "/p", None, &h, br#"{"b":2,"a":1}"#)
        );
        // Invalid JSON under a JSON content type falls back to the raw bytes.
        let j = json_headers();
        assert_ne!(
            fp(Method::POST, "/p", None, &j, b"{not json"),
            fp(Method::POST, "/p", None, &j, b"{not  json")
        );
    }
}
