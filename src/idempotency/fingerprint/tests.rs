//! Fingerprint tests: the published behaviour, the old recursive implementation as a
//! reference, and properties.

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

// ---------------------------------------------------------------------------------------
// Properties.

use crate::proptest_support::config;
use proptest::prelude::*;
use proptest::sample::{select, Index};

/// A generated JSON value. Strings and keys hold the raw text between the quotes.
#[derive(Debug, Clone)]
enum J {
    Null,
    Bool(bool),
    Num(String),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

/// One piece of a string's raw text: a plain character or an escape.
fn string_piece(lone_surrogates: bool) -> BoxedStrategy<String> {
    let plain = any::<char>()
        .prop_filter("needs an escape", |c| *c >= ' ' && *c != '"' && *c != '\\')
        .prop_map(String::from);
    let short = select(vec![
        "\\\"", "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r", "\\t",
    ])
    .prop_map(String::from);
    let bmp = (
        any::<char>().prop_filter("BMP", |c| (*c as u32) <= 0xFFFF),
        any::<bool>(),
    )
        .prop_map(|(c, upper)| {
            let e = format!("\\u{:04x}", c as u32);
            if upper {
                e.to_uppercase().replace("\\U", "\\u")
            } else {
                e
            }
        });
    let pair = (0x1_0000u32..=0x10_FFFF).prop_map(|n| {
        let c = char::from_u32(n).expect("a supplementary code point");
        c.encode_utf16(&mut [0; 2])
            .iter()
            .map(|u| format!("\\u{u:04X}"))
            .collect::<String>()
    });
    if lone_surrogates {
        let lone = (0xD800u32..=0xDFFF).prop_map(|n| format!("\\u{n:04x}"));
        prop_oneof![8 => plain, 3 => short, 3 => bmp, 2 => pair, 1 => lone].boxed()
    } else {
        prop_oneof![8 => plain, 3 => short, 3 => bmp, 2 => pair].boxed()
    }
}

fn string_raw(lone_surrogates: bool) -> impl Strategy<Value = String> {
    prop::collection::vec(string_piece(lone_surrogates), 0..8).prop_map(|p| p.concat())
}

/// Keys drawn mostly from a small set, so objects repeat keys, also in other spellings.
fn key_raw(lone_surrogates: bool) -> impl Strategy<Value = String> {
    let common = select(vec![
        "a",
        "b",
        "\\u0061",
        "\\u0062",
        "B",
        "é",
        "\\u00e9",
        "\\u00E9",
        "😀",
        "\\ud83d\\ude00",
        "\\uD83D\\uDE00",
        "",
        "/",
        "\\/",
        "a\\nb",
        "\\u0000",
        "\u{7f}",
        "\\u007f",
        "aa",
        "a ",
    ])
    .prop_map(String::from);
    prop_oneof![3 => common, 1 => string_raw(lone_surrogates)]
}

fn number() -> impl Strategy<Value = String> {
    let odd = select(vec![
        "0",
        "-0",
        "1e400",
        "-1e-400",
        "0.30000000000000004",
        "0.3000000000000000444",
        "12345678901234567890123",
        "9007199254740993",
        "1E+2",
        "1e-0",
        "-0.0e0",
        "1.0",
        "1e308",
        "5e-324",
    ])
    .prop_map(String::from);
    let any = "-?(0|[1-9][0-9]{0,24})(\\.[0-9]{1,20})?([eE][+-]?[0-9]{1,4})?";
    prop_oneof![odd, any]
}

fn json(lone_surrogates: bool) -> impl Strategy<Value = J> {
    let leaf = prop_oneof![
        Just(J::Null),
        any::<bool>().prop_map(J::Bool),
        number().prop_map(J::Num),
        string_raw(lone_surrogates).prop_map(J::Str),
    ];
    leaf.prop_recursive(8, 96, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(J::Arr),
            prop::collection::vec((key_raw(lone_surrogates), inner), 0..6).prop_map(J::Obj),
        ]
    })
}

/// Insignificant whitespace from a seed (xorshift), so one tree prints many ways.
struct Spacing(u64);

impl Spacing {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn space(&mut self, out: &mut String) {
        const SPACES: [&str; 8] = ["", "", "", " ", "\n", "\t", "\r\n", "  "];
        out.push_str(SPACES[(self.next() % 8) as usize]);
    }
}

fn print(j: &J, ws: &mut Spacing, out: &mut String) {
    ws.space(out);
    match j {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Num(n) => out.push_str(n),
        J::Str(s) => {
            out.push('"');
            out.push_str(s);
            out.push('"');
        }
        J::Arr(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                print(item, ws, out);
            }
            ws.space(out);
            out.push(']');
        }
        J::Obj(members) => {
            out.push('{');
            for (i, (k, v)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                ws.space(out);
                out.push('"');
                out.push_str(k);
                out.push('"');
                ws.space(out);
                out.push(':');
                print(v, ws, out);
            }
            ws.space(out);
            out.push('}');
        }
    }
    ws.space(out);
}

fn printed(j: &J, seed: u64) -> String {
    let mut out = String::new();
    // xorshift must not start from zero.
    print(j, &mut Spacing(seed | 1), &mut out);
    out
}

fn decoded_key(raw: &str) -> String {
    serde_json::from_str(&format!("\"{raw}\"")).expect("generated without lone surrogates")
}

/// Keeps only the last member of each repeated key (what the handler sees), so members
/// can be reordered and every scalar is written.
fn without_repeated_keys(j: J) -> J {
    match j {
        J::Arr(items) => J::Arr(items.into_iter().map(without_repeated_keys).collect()),
        J::Obj(members) => {
            let mut kept: Vec<(String, J)> = Vec::new();
            for (k, v) in members.into_iter().rev() {
                if !kept
                    .iter()
                    .any(|(seen, _)| decoded_key(seen) == decoded_key(&k))
                {
                    kept.push((k, without_repeated_keys(v)));
                }
            }
            kept.reverse();
            J::Obj(kept)
        }
        scalar => scalar,
    }
}

fn shuffled(j: &J, seed: &mut Spacing) -> J {
    match j {
        J::Arr(items) => J::Arr(items.iter().map(|i| shuffled(i, seed)).collect()),
        J::Obj(members) => {
            let mut members: Vec<(String, J)> = members
                .iter()
                .map(|(k, v)| (k.clone(), shuffled(v, seed)))
                .collect();
            for i in (1..members.len()).rev() {
                members.swap(i, (seed.next() % (i as u64 + 1)) as usize);
            }
            J::Obj(members)
        }
        scalar => scalar.clone(),
    }
}

fn scalars(j: &J) -> usize {
    match j {
        J::Arr(items) => items.iter().map(scalars).sum(),
        J::Obj(members) => members.iter().map(|(_, v)| scalars(v)).sum(),
        _ => 1,
    }
}

/// Changes the `n`th scalar (document order) to a different value.
fn change_scalar(j: &mut J, n: &mut usize) -> bool {
    let children: Vec<&mut J> = match j {
        J::Arr(items) => items.iter_mut().collect(),
        J::Obj(members) => members.iter_mut().map(|(_, v)| v).collect(),
        scalar => {
            if *n > 0 {
                *n -= 1;
                return false;
            }
            *scalar = match scalar {
                J::Null => J::Bool(false),
                J::Bool(b) => J::Bool(!*b),
                J::Num(num) if num == "1" => J::Num("2".into()),
                J::Num(_) => J::Num("1".into()),
                J::Str(s) => J::Str(format!("{s}x")),
                _ => unreachable!(),
            };
            return true;
        }
    };
    children.into_iter().any(|child| change_scalar(child, n))
}

/// Byte-level edits of a JSON text, biased towards JSON's own punctuation.
fn mutated(text: &str, edits: &[(Index, u8, u8)]) -> Vec<u8> {
    const BYTES: &[u8] = b"[]{}\",:\\u0123456789-+.eEtfn \n\xff\xc3\xa9";
    let mut body = text.as_bytes().to_vec();
    for (at, op, b) in edits {
        let byte = BYTES[*b as usize % BYTES.len()];
        let len = body.len();
        match op % 3 {
            0 => body.insert(at.index(len + 1), byte),
            1 if len > 0 => {
                body.remove(at.index(len));
            }
            _ if len > 0 => body[at.index(len)] = byte,
            _ => body.push(byte),
        }
    }
    body
}

proptest! {
    #![proptest_config(config(256))]

    /// (a) Arbitrary bytes under a JSON content type never panic, and whatever the old
    /// code accepted gets the same fingerprint.
    #[test]
    fn arbitrary_bytes_never_panic_and_match_the_reference(
        body in prop::collection::vec(any::<u8>(), 0..512),
    ) {
        let _ = Fingerprint::compute(&Method::POST, "/p", None, &json_headers(), &body);
        agrees_with_reference(&body);
    }

    /// (a) JSON-like byte soup: brackets, quotes, escapes and digits in any order (deep
    /// nesting included), often valid enough to reach the canonicaliser.
    #[test]
    fn json_alphabet_soup_never_panics_and_matches_the_reference(
        body in prop::collection::vec(
            select(b"[]{}\",:\\u0aAdD8e+-.1 tfnrl\xc3\xa9".to_vec()), 0..300),
    ) {
        let _ = Fingerprint::compute(&Method::POST, "/p", None, &json_headers(), &body);
        agrees_with_reference(&body);
    }

    /// (b) Generated JSON (depth ≤ 8, repeated keys, escapes, odd numbers, lone
    /// surrogates now and then) printed with random whitespace: same canonical text and
    /// fingerprint as the recursive version.
    #[test]
    fn generated_json_matches_the_reference(j in json(true), seed in any::<u64>()) {
        let text = printed(&j, seed);
        prop_assert!(agrees_with_reference(text.as_bytes()));
    }

    /// (b) The same JSON with a few byte edits: valid or not, the same verdict and text.
    #[test]
    fn mutated_json_matches_the_reference(
        j in json(true),
        seed in any::<u64>(),
        edits in prop::collection::vec((any::<Index>(), any::<u8>(), any::<u8>()), 1..4),
    ) {
        let body = mutated(&printed(&j, seed), &edits);
        agrees_with_reference(&body);
    }

    /// (c) Reordering object members and changing whitespace keep the fingerprint.
    #[test]
    fn key_order_and_whitespace_do_not_change_the_fingerprint(
        j in json(false),
        seeds in (any::<u64>(), any::<u64>(), any::<u64>()),
    ) {
        let j = without_repeated_keys(j);
        let other = shuffled(&j, &mut Spacing(seeds.2 | 1));
        let (a, b) = (printed(&j, seeds.0), printed(&other, seeds.1));
        prop_assert!(canonicalize(a.as_bytes()).is_ok());
        prop_assert_eq!(canonical(a.as_bytes()), canonical(b.as_bytes()));
        prop_assert_eq!(
            fp(Method::POST, "/p", None, &json_headers(), a.as_bytes()),
            fp(Method::POST, "/p", None, &json_headers(), b.as_bytes())
        );
    }

    /// (d) Changing any one scalar changes the fingerprint.
    #[test]
    fn changing_one_scalar_changes_the_fingerprint(
        j in json(false),
        which in any::<Index>(),
        seed in any::<u64>(),
    ) {
        let j = without_repeated_keys(j);
        let count = scalars(&j);
        prop_assume!(count > 0);
        let mut changed = j.clone();
        prop_assert!(change_scalar(&mut changed, &mut which.index(count)));
        let (a, b) = (printed(&j, seed), printed(&changed, seed));
        prop_assert!(canonicalize(b.as_bytes()).is_ok());
        prop_assert_ne!(
            fp(Method::POST, "/p", None, &json_headers(), a.as_bytes()),
            fp(Method::POST, "/p", None, &json_headers(), b.as_bytes())
        );
    }
}
