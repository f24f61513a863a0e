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

mod canonical;

pub(crate) use canonical::canonicalize;

#[cfg(test)]
mod tests;
