//! Properties of the fingerprint: no input panics, every accepted body agrees with the
//! reference implementation, and what a client may vary (key order, whitespace) never changes
//! the fingerprint while any value it changes does. Generated JSON, not examples, because the
//! canonicaliser's bugs live in combinations nobody writes by hand.

use super::*;
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
