//! Fingerprint tests: the published behaviour, and the old recursive implementation kept as a
//! reference that the iterative canonicaliser must agree with (the properties, in
//! `properties.rs`, check that agreement on generated and mutated bodies).

mod properties;

use super::*;
use http::HeaderValue;
use serde_json::value::RawValue;

fn json_headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    h
}

fn fp(method: Method, path: &str, query: Option<&str>, h: &HeaderMap, body: &[u8]) -> Fingerprint {
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

// ---------------------------------------------------------------------------------------
// The recursive implementation this module replaced, kept as the compatibility reference:
// stored fingerprints must not change for any body it accepted within the depth limit.
// It recurses once per nesting level, so it is only ever called on bodies the new code
// did not refuse as too deep.

mod reference {
    use super::*;
    use std::collections::BTreeMap;

    pub fn fingerprint(
        method: &Method,
        path: &str,
        query: Option<&str>,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Fingerprint {
        let mut h = Sha256::new();
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
        Fingerprint(h.finalize().into())
    }

    pub fn canonical_json(headers: &HeaderMap, body: &[u8]) -> Option<String> {
        if !is_json(headers) {
            return None;
        }
        let raw: &RawValue = serde_json::from_slice(body).ok()?;
        let mut out = String::with_capacity(body.len());
        write_canonical_raw(raw, &mut out).ok()?;
        Some(out)
    }

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
            _ => out.push_str(text),
        }
        Ok(())
    }
}

fn canonical(body: &[u8]) -> Result<String, RawBody> {
    canonicalize(body).map(|c| String::from_utf8(c).expect("canonical JSON is UTF-8"))
}

/// The new canonical form agrees with the reference: the same text, or both raw.
/// Returns false (nothing compared) for a body refused as too deep.
fn agrees_with_reference(body: &[u8]) -> bool {
    let new = canonical(body);
    if new == Err(RawBody::TooDeep) {
        return false;
    }
    let old = reference::canonical_json(&json_headers(), body);
    assert_eq!(new.ok(), old, "body: {:?}", String::from_utf8_lossy(body));
    assert_eq!(
        fp(Method::POST, "/p", None, &json_headers(), body),
        reference::fingerprint(&Method::POST, "/p", None, &json_headers(), body)
    );
    true
}

/// The fingerprint of `body` hashed as raw bytes (the "B" branch).
fn raw_fp(body: &[u8]) -> Fingerprint {
    fp(Method::POST, "/p", None, &HeaderMap::new(), body)
}

fn nested(open: &str, inner: &str, close: &str, depth: usize) -> Vec<u8> {
    let mut body = Vec::with_capacity((open.len() + close.len()) * depth + inner.len());
    for _ in 0..depth {
        body.extend_from_slice(open.as_bytes());
    }
    body.extend_from_slice(inner.as_bytes());
    for _ in 0..depth {
        body.extend_from_slice(close.as_bytes());
    }
    body
}

#[test]
fn hostile_nesting_falls_back_to_raw_bytes_without_overflowing_the_stack() {
    // On the test thread's ordinary stack: the recursive version overflowed it at about
    // ten thousand levels.
    for depth in [10_000, 500_000, 1_000_000] {
        for body in [
            nested("[", "", "]", depth),
            nested("{\"a\":", "1", "}", depth),
        ] {
            assert_eq!(canonicalize(&body), Err(RawBody::TooDeep));
            assert_eq!(
                fp(Method::POST, "/p", None, &json_headers(), &body),
                raw_fp(&body)
            );
        }
    }
}

#[test]
fn depth_limit_is_128_levels() {
    for (open, inner, close) in [("[", "", "]"), ("{\"a\":", "null", "}"), ("[", "{}", "]")] {
        let at_limit = nested(
            open,
            inner,
            close,
            MAX_CANONICAL_DEPTH - usize::from(inner == "{}"),
        );
        assert_eq!(
            canonical(&at_limit).as_deref(),
            Ok(std::str::from_utf8(&at_limit).unwrap())
        );
        assert!(agrees_with_reference(&at_limit));
        let over = nested(
            open,
            inner,
            close,
            MAX_CANONICAL_DEPTH + 1 - usize::from(inner == "{}"),
        );
        assert_eq!(canonicalize(&over), Err(RawBody::TooDeep));
        assert_eq!(
            fp(Method::POST, "/p", None, &json_headers(), &over),
            raw_fp(&over)
        );
    }
    // Depth counts open containers, not containers in total.
    let wide = format!("[{}]", vec!["[[]]"; 1000].join(","));
    assert_eq!(canonical(wide.as_bytes()).as_deref(), Ok(wide.as_str()));
}

#[test]
fn canonical_text_matches_the_recursive_version_on_edge_cases() {
    let cases: &[(&str, Option<&str>)] = &[
        (
            r#"{"b":1,"a":[true,false,null]}"#,
            Some(r#"{"a":[true,false,null],"b":1}"#),
        ),
        // Numbers as written, whatever f64 would make of them.
        (
            "[-0,1e400,0.30000000000000004,1E+2,-0.0e-0]",
            Some("[-0,1e400,0.30000000000000004,1E+2,-0.0e-0]"),
        ),
        // Strings decoded and re-encoded by serde_json.
        (
            r#"["\u0041\/\ud83d\ude00\u00e9","\u001f\u007f",	"x"]"#,
            Some("[\"A/😀é\",\"\\u001f\u{7f}\",\"x\"]"),
        ),
        // Keys sorted by decoded string; a repeated key (in any spelling) keeps its last value.
        (
            r#"{"\u0062":1,"a":2,"\u0061":3,"é":4,"\u00e9":5}"#,
            Some(r#"{"a":3,"b":1,"é":5}"#),
        ),
        // A value overwritten by a repeated key is never decoded, so a lone surrogate in
        // it does not matter; one in a written string or key makes the body raw.
        (r#"{"a":"\ud800","a":1}"#, Some(r#"{"a":1}"#)),
        (r#"{"a":{"\udc00":1},"a":2}"#, Some(r#"{"a":2}"#)),
        (r#"["\ud800"]"#, None),
        (r#"{"\ud800":1}"#, None),
        (r#"{"a":{"\ud800x":1}}"#, None),
        // Any top-level value; whitespace around it; nothing after it.
        (" \"top\" \n", Some("\"top\"")),
        ("12.5e3\t", Some("12.5e3")),
        ("1 2", None),
        ("{} x", None),
        ("", None),
        ("[1,]", None),
        ("{\"a\"}", None),
        ("01", None),
        ("[\"\x01\"]", None),
    ];
    for (body, expected) in cases {
        assert_eq!(
            canonical(body.as_bytes()).ok().as_deref(),
            *expected,
            "{body}"
        );
        assert!(agrees_with_reference(body.as_bytes()));
    }
    // Invalid UTF-8 inside a string is not JSON.
    assert!(agrees_with_reference(b"[\"\xff\"]"));
    assert_eq!(canonicalize(b"[\"\xff\"]"), Err(RawBody::InvalidJson));
}
