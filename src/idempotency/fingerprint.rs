//! The request fingerprint: what "the same request" means for a reused key.
//!
//! SHA-256 over the method, the path, the query string and the body. Each part is
//! length-prefixed so that no two different requests can produce the same byte stream
//! (`/a` + `b=1` vs `/ab` + `=1`). JSON bodies are canonicalised first (object keys sorted,
//! no insignificant whitespace), so a client library that reorders keys on a retry still
//! gets its stored result, while any change of value is a different request (422). Numbers
//! are compared as written, never through `f64`.
//!
//! # What counts as a JSON body
//!
//! A body is canonicalised when the content type is `application/json` or `+json`, when
//! `serde_json` accepts it (`from_slice::<&RawValue>`: its grammar, UTF-8 and escape rules,
//! numbers without range checks, any top-level value, trailing whitespace only), when every
//! string that ends up in the canonical text decodes into a Rust `String` (no lone
//! surrogate), and when arrays and objects nest at most [`MAX_CANONICAL_DEPTH`] deep. Any other
//! body is hashed as raw bytes, like a body that is not JSON at all. The depth limit is
//! serde_json's default recursion limit (128, which lets a handler deserialising with
//! serde_json read at most 127 levels): every body such a handler can read is canonicalised,
//! and the few it cannot read but that are within the limit are canonicalised as before.
//!
//! # Bounded work, whatever the body
//!
//! For a body of `n` bytes, canonicalising takes three linear passes and no recursion:
//! serde_json's validation (an explicit stack, no tree built), one pass building a flat
//! arena of nodes that point at byte ranges of the body (keys with escapes are decoded once,
//! into one shared buffer), and one pass writing the canonical text from the arena with an
//! explicit stack of at most [`MAX_CANONICAL_DEPTH`] entries. A body nested deeper than that
//! stops the build pass as soon as the limit is crossed. The only superlinear step is sorting
//! each object's keys (`k log k` key comparisons for `k` members). Memory is the canonical text
//! (never longer than the body), a 16-byte node per JSON value and per object key (each takes
//! at least two bytes of body with its separator) plus 8 bytes per object member, and the
//! decoded keys (never longer than the body): a few times the body, whatever its shape.
//!
//! The canonical text is byte-for-byte what the earlier recursive implementation produced for
//! every body it accepted within the depth limit (stored fingerprints stay valid across the
//! change): keys sorted by decoded string, a repeated key keeping its last value, numbers and
//! literals copied as written, strings decoded and re-encoded by `serde_json::to_string`.

use http::{HeaderMap, Method};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

/// The deepest nesting of arrays and objects that is canonicalised (`[]` is depth 1, a scalar
/// depth 0). A deeper body is hashed as raw bytes, as invalid JSON is.
pub const MAX_CANONICAL_DEPTH: usize = 128;

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
            Ok(canonical) => {
                h.update(b"J");
                feed(&mut h, &canonical);
            }
            Err(_) => {
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

/// Why a body is hashed as raw bytes rather than canonicalised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RawBody {
    /// The content type is not JSON.
    NotJsonContentType,
    /// serde_json refuses the body, or a string that would be written does not decode.
    InvalidJson,
    /// Arrays and objects nest deeper than [`MAX_CANONICAL_DEPTH`].
    TooDeep,
    /// Longer than 4 GiB: node offsets are 32-bit (no layer buffers such a body).
    TooLarge,
}

/// The canonical form of a JSON body, or why the raw bytes are hashed instead.
fn canonical_json(headers: &HeaderMap, body: &[u8]) -> Result<Vec<u8>, RawBody> {
    if !is_json(headers) {
        return Err(RawBody::NotJsonContentType);
    }
    canonicalize(body)
}

/// The canonical text of `body` if it is JSON within the depth limit (see the module doc).
pub(crate) fn canonicalize(body: &[u8]) -> Result<Vec<u8>, RawBody> {
    // serde_json alone decides what is JSON. Its RawValue parse checks the grammar, UTF-8 and
    // escapes with an explicit stack (any depth, no recursion) and builds nothing; the passes
    // below can then trust the structure, though they still never index out of bounds.
    let raw: &RawValue = serde_json::from_slice(body).map_err(|_| RawBody::InvalidJson)?;
    let text = raw.get();
    if u32::try_from(text.len()).is_err() {
        return Err(RawBody::TooLarge);
    }
    Arena::build(text)?.write()
}

/// One JSON value. Positions are byte offsets into the text (`start..end`) or indices into the
/// arena's vectors; nodes are in document pre-order, so a container's first child, if any,
/// is the next node and an object member's value is the node right after its key.
#[derive(Debug, Clone, Copy)]
enum Node {
    /// A number, `true`, `false` or `null`, copied as written.
    Literal { start: u32, end: u32 },
    /// A string token without escapes (quotes included): already canonical, since
    /// `serde_json::to_string` only escapes control characters, `"` and `\`, which valid JSON
    /// cannot hold unescaped.
    PlainString { start: u32, end: u32 },
    /// A string token with escapes: decoded and re-encoded when written, so a value that is
    /// never written (overwritten by a repeated key) is never decoded, as before.
    EscapedString { start: u32, end: u32 },
    /// An object key with escapes, decoded into `Arena::decoded[start..end]` when read, since
    /// sorting compares decoded keys.
    DecodedKey { start: u32, end: u32 },
    /// An array; its elements are the nodes up to `end` (exclusive), siblings found by
    /// skipping each element's subtree.
    Array { end: u32 },
    /// An object: `Arena::members[members..members + len]` are its key nodes, sorted, only the
    /// last of a repeated key kept.
    Object { end: u32, members: u32, len: u32 },
    /// An object with a key serde_json cannot decode into a `String` (a lone surrogate). Writing
    /// it makes the body invalid; an object overwritten by a repeated key is never written, so
    /// it does not matter there (the recursive version never parsed such an object either).
    UndecodableObject { end: u32 },
}

/// An array or object whose closing bracket has not been read yet.
struct OpenContainer {
    node: u32,
    is_object: bool,
    /// In an object: the next string is a key (after `{` or `,`).
    expect_key: bool,
    /// Where this object's keys start in the stack of keys of open objects.
    keys_from: usize,
    undecodable: bool,
}

/// An array or object being written: the next child to write and where the children end.
enum Writing {
    Array { next: u32, end: u32, first: bool },
    Object { next: u32, end: u32, first: bool },
}

struct Arena<'a> {
    text: &'a [u8],
    nodes: Vec<Node>,
    members: Vec<u32>,
    decoded: String,
}

/// A position that fits in 32 bits (the text is shorter than 4 GiB, checked on entry).
fn pos(value: usize) -> Result<u32, RawBody> {
    u32::try_from(value).map_err(|_| RawBody::TooLarge)
}

fn range(start: u32, end: u32) -> std::ops::Range<usize> {
    start as usize..end as usize
}

impl<'a> Arena<'a> {
    /// The build pass: one scan of `text` (serde_json-valid JSON, no surrounding whitespace).
    fn build(text: &'a str) -> Result<Self, RawBody> {
        let mut builder = Builder {
            arena: Arena {
                text: text.as_bytes(),
                nodes: Vec::new(),
                members: Vec::new(),
                decoded: String::new(),
            },
            text,
            open: Vec::new(),
            keys: Vec::new(),
            roots: 0,
        };
        let bytes = text.as_bytes();
        let mut i = 0usize;
        while let Some(&b) = bytes.get(i) {
            i = match b {
                b' ' | b'\t' | b'\n' | b'\r' | b':' => i + 1,
                b',' => {
                    builder.comma();
                    i + 1
                }
                b'[' | b'{' => {
                    builder.open(b == b'{')?;
                    i + 1
                }
                b']' | b'}' => {
                    builder.close(b == b'}')?;
                    i + 1
                }
                b'"' => builder.string(i)?,
                _ => builder.literal(i)?,
            };
        }
        builder.finish()
    }

    /// The decoded bytes of a key node, which is what `BTreeMap<String, _>` ordered by.
    fn key_bytes(&self, key: u32) -> &[u8] {
        let bytes = match self.nodes.get(key as usize) {
            // The token without its quotes: without escapes, that is the decoded key.
            Some(&Node::PlainString { start, end }) => self
                .text
                .get(start as usize + 1..(end as usize).saturating_sub(1)),
            Some(&Node::DecodedKey { start, end }) => {
                self.decoded.as_bytes().get(range(start, end))
            }
            _ => None,
        };
        bytes.unwrap_or(&[])
    }

    /// Sorts an object's keys (stable, so equal keys stay in document order), appends the last
    /// of each run of equal keys to `members`, and returns where they start and how many.
    fn sort_members(&mut self, keys: &mut [u32]) -> Result<(u32, u32), RawBody> {
        keys.sort_by(|&a, &b| self.key_bytes(a).cmp(self.key_bytes(b)));
        let from = self.members.len();
        for (n, &key) in keys.iter().enumerate() {
            let repeated_later = keys
                .get(n + 1)
                .is_some_and(|&next| self.key_bytes(next) == self.key_bytes(key));
            if !repeated_later {
                self.members.push(key);
            }
        }
        Ok((pos(from)?, pos(self.members.len() - from)?))
    }

    fn node(&self, n: u32) -> Result<Node, RawBody> {
        self.nodes
            .get(n as usize)
            .copied()
            .ok_or(RawBody::InvalidJson)
    }

    fn slice(&self, start: u32, end: u32) -> Result<&[u8], RawBody> {
        self.text.get(range(start, end)).ok_or(RawBody::InvalidJson)
    }

    /// The node after `n`'s subtree: its next sibling, if it has one.
    fn skip(&self, n: u32) -> Result<u32, RawBody> {
        Ok(match self.node(n)? {
            Node::Array { end } | Node::Object { end, .. } | Node::UndecodableObject { end } => end,
            _ => n + 1,
        })
    }

    /// Decodes a string token with serde_json (as the recursive version did) and re-encodes it.
    fn write_escaped(&self, start: u32, end: u32, out: &mut Vec<u8>) -> Result<(), RawBody> {
        let token =
            std::str::from_utf8(self.slice(start, end)?).map_err(|_| RawBody::InvalidJson)?;
        let decoded: String = serde_json::from_str(token).map_err(|_| RawBody::InvalidJson)?;
        serde_json::to_writer(out, &decoded).map_err(|_| RawBody::InvalidJson)
    }

    fn write_key(&self, key: u32, out: &mut Vec<u8>) -> Result<(), RawBody> {
        match self.node(key)? {
            Node::PlainString { start, end } => out.extend_from_slice(self.slice(start, end)?),
            Node::DecodedKey { start, end } => {
                let decoded = self
                    .decoded
                    .get(range(start, end))
                    .ok_or(RawBody::InvalidJson)?;
                serde_json::to_writer(out, decoded).map_err(|_| RawBody::InvalidJson)?;
            }
            _ => return Err(RawBody::InvalidJson),
        }
        Ok(())
    }

    /// The pass writing the canonical text, from the root (node 0), with an explicit stack.
    fn write(&self) -> Result<Vec<u8>, RawBody> {
        let mut out = Vec::with_capacity(self.text.len());
        let mut stack: Vec<Writing> = Vec::new();
        let mut value = Some(0u32);
        loop {
            if let Some(n) = value.take() {
                match self.node(n)? {
                    Node::Literal { start, end } | Node::PlainString { start, end } => {
                        out.extend_from_slice(self.slice(start, end)?);
                    }
                    Node::EscapedString { start, end } => {
                        self.write_escaped(start, end, &mut out)?
                    }
                    Node::Array { end } => {
                        out.push(b'[');
                        stack.push(Writing::Array {
                            next: n + 1,
                            end,
                            first: true,
                        });
                    }
                    Node::Object { members, len, .. } => {
                        out.push(b'{');
                        stack.push(Writing::Object {
                            next: members,
                            end: members + len,
                            first: true,
                        });
                    }
                    Node::UndecodableObject { .. } | Node::DecodedKey { .. } => {
                        return Err(RawBody::InvalidJson)
                    }
                }
            }
            let Some(top) = stack.last_mut() else {
                break;
            };
            match top {
                Writing::Array { next, end, first } => {
                    if *next >= *end {
                        out.push(b']');
                        stack.pop();
                        continue;
                    }
                    if !std::mem::take(first) {
                        out.push(b',');
                    }
                    value = Some(*next);
                    *next = self.skip(*next)?;
                }
                Writing::Object { next, end, first } => {
                    if *next >= *end {
                        out.push(b'}');
                        stack.pop();
                        continue;
                    }
                    if !std::mem::take(first) {
                        out.push(b',');
                    }
                    let key = *self
                        .members
                        .get(*next as usize)
                        .ok_or(RawBody::InvalidJson)?;
                    *next += 1;
                    self.write_key(key, &mut out)?;
                    out.push(b':');
                    value = Some(key + 1);
                }
            }
        }
        Ok(out)
    }
}

/// The build pass's state: the arena so far and the containers still open.
struct Builder<'a> {
    arena: Arena<'a>,
    text: &'a str,
    /// At most [`MAX_CANONICAL_DEPTH`] entries.
    open: Vec<OpenContainer>,
    /// Keys of the open objects, innermost last; sorted into `members` when one closes.
    keys: Vec<u32>,
    /// Values started outside any container: valid JSON has exactly one.
    roots: usize,
}

impl<'a> Builder<'a> {
    fn push(&mut self, node: Node) -> Result<u32, RawBody> {
        let index = pos(self.arena.nodes.len())?;
        self.arena.nodes.push(node);
        Ok(index)
    }

    /// A value (not a key) starts.
    fn value(&mut self) -> Result<(), RawBody> {
        if self.open.is_empty() {
            self.roots += 1;
            if self.roots > 1 {
                return Err(RawBody::InvalidJson);
            }
        }
        Ok(())
    }

    fn comma(&mut self) {
        if let Some(top) = self.open.last_mut() {
            top.expect_key = top.is_object;
        }
    }

    fn open(&mut self, is_object: bool) -> Result<(), RawBody> {
        if self.open.len() >= MAX_CANONICAL_DEPTH {
            return Err(RawBody::TooDeep);
        }
        self.value()?;
        // A placeholder: the real node is known when the container closes.
        let node = self.push(Node::Array { end: 0 })?;
        self.open.push(OpenContainer {
            node,
            is_object,
            expect_key: is_object,
            keys_from: self.keys.len(),
            undecodable: false,
        });
        Ok(())
    }

    fn close(&mut self, is_object: bool) -> Result<(), RawBody> {
        let container = self.open.pop().ok_or(RawBody::InvalidJson)?;
        if container.is_object != is_object {
            return Err(RawBody::InvalidJson);
        }
        let end = pos(self.arena.nodes.len())?;
        let node = if !is_object {
            Node::Array { end }
        } else if container.undecodable {
            Node::UndecodableObject { end }
        } else {
            let keys = self
                .keys
                .get_mut(container.keys_from..)
                .ok_or(RawBody::InvalidJson)?;
            let (members, len) = self.arena.sort_members(keys)?;
            Node::Object { end, members, len }
        };
        self.keys.truncate(container.keys_from);
        let slot = self
            .arena
            .nodes
            .get_mut(container.node as usize)
            .ok_or(RawBody::InvalidJson)?;
        *slot = node;
        Ok(())
    }

    /// A string token starting at `start`, a key or a value; returns where it ends.
    fn string(&mut self, start: usize) -> Result<usize, RawBody> {
        let (end, escaped) = string_end(self.arena.text, start)?;
        let token = (pos(start)?, pos(end)?);
        let is_key = self.open.last().is_some_and(|top| top.expect_key);
        let node = if !escaped {
            Node::PlainString {
                start: token.0,
                end: token.1,
            }
        } else if !is_key {
            Node::EscapedString {
                start: token.0,
                end: token.1,
            }
        } else {
            let text = self.text.get(start..end).ok_or(RawBody::InvalidJson)?;
            match serde_json::from_str::<String>(text) {
                Ok(key) => {
                    let from = pos(self.arena.decoded.len())?;
                    self.arena.decoded.push_str(&key);
                    Node::DecodedKey {
                        start: from,
                        end: pos(self.arena.decoded.len())?,
                    }
                }
                Err(_) => {
                    if let Some(top) = self.open.last_mut() {
                        top.undecodable = true;
                    }
                    Node::EscapedString {
                        start: token.0,
                        end: token.1,
                    }
                }
            }
        };
        if is_key {
            if let Some(top) = self.open.last_mut() {
                top.expect_key = false;
            }
            let index = self.push(node)?;
            self.keys.push(index);
        } else {
            self.value()?;
            self.push(node)?;
        }
        Ok(end)
    }

    /// A number or literal starting at `start`; returns where it ends.
    fn literal(&mut self, start: usize) -> Result<usize, RawBody> {
        // It runs to the next delimiter (validated JSON puts one after it). An unexpected byte
        // would scan nothing: refusing it also guarantees progress.
        let len = self
            .arena
            .text
            .get(start..)
            .unwrap_or_default()
            .iter()
            .take_while(
                |c| matches!(c, b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z' | b'+' | b'-' | b'.'),
            )
            .count();
        if len == 0 {
            return Err(RawBody::InvalidJson);
        }
        self.value()?;
        self.push(Node::Literal {
            start: pos(start)?,
            end: pos(start + len)?,
        })?;
        Ok(start + len)
    }

    fn finish(self) -> Result<Arena<'a>, RawBody> {
        if !self.open.is_empty() || self.roots != 1 {
            return Err(RawBody::InvalidJson);
        }
        Ok(self.arena)
    }
}

/// The end (past the closing quote) of the string token starting at `start`, and whether it
/// holds escapes. Validated JSON: an escape never ends the token, so skipping the byte after a
/// backslash is enough (`\u` digits are never quotes).
fn string_end(bytes: &[u8], start: usize) -> Result<(usize, bool), RawBody> {
    let mut escaped = false;
    let mut i = start + 1;
    loop {
        match bytes.get(i) {
            Some(b'"') => return Ok((i + 1, escaped)),
            Some(b'\\') => {
                escaped = true;
                i += 2;
            }
            Some(_) => i += 1,
            None => return Err(RawBody::InvalidJson),
        }
    }
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

    #[test]
    fn nodes_take_the_sixteen_bytes_the_module_doc_promises() {
        assert_eq!(std::mem::size_of::<Node>(), 16);
    }

    // ---------------------------------------------------------------------------------------
    // Properties.

    use proptest::prelude::*;
    use proptest::sample::{select, Index};

    fn config(cases: u32) -> ProptestConfig {
        ProptestConfig {
            cases,
            // Failures are reported with their minimal input; no regression files in src/.
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

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
}
