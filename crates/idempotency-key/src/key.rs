//! The validated `Idempotency-Key` header value.
//!
//! Two wire forms are accepted for one key: the bare token Stripe clients send
//! (`Idempotency-Key: 8e03978e-40d5`) and the quoted sf-string of the IETF draft
//! (`Idempotency-Key: "8e03978e-40d5"`). Both parse to the same [`IdempotencyKey`], so a
//! client that switches form still hits its stored result.

use std::fmt;

use http::HeaderValue;

/// Longest key accepted (Stripe's documented limit).
pub const MAX_KEY_LEN: usize = 255;

/// Longest header value (after optional whitespace) that can hold a valid key: the quoted form
/// of a [`MAX_KEY_LEN`] key whose every character is escaped. Anything longer is refused
/// before a byte of it is copied.
pub const MAX_RAW_KEY_LEN: usize = 2 * MAX_KEY_LEN + 2;

/// Why a header value is not a usable key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The value (after unquoting) is empty.
    #[error("Idempotency-Key is empty")]
    Empty,
    /// More than [`MAX_KEY_LEN`] characters.
    #[error("Idempotency-Key is longer than {MAX_KEY_LEN} characters")]
    TooLong,
    /// A character outside visible ASCII (0x21..=0x7E), e.g. a space or a control byte.
    #[error("Idempotency-Key must contain only visible ASCII characters")]
    InvalidCharacter,
    /// A quoted value that is not a valid sf-string (unterminated, bad escape).
    #[error("Idempotency-Key is not a valid quoted string")]
    BadQuoting,
    /// The header was sent more than once.
    #[error("Idempotency-Key was sent more than once")]
    Repeated,
}

/// A key that passed validation: 1 to 255 visible ASCII characters, unquoted.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// Parses one header value, bare or quoted.
    pub fn parse(raw: &[u8]) -> Result<Self, KeyError> {
        // Optional whitespace around a field value is not part of it (RFC 9110 5.5).
        let raw = trim_ows(raw);
        if raw.len() > MAX_RAW_KEY_LEN {
            return Err(KeyError::TooLong);
        }
        let value = if raw.first() == Some(&b'"') {
            unquote(raw)?
        } else {
            raw.to_vec()
        };
        Self::validate(value)
    }

    /// Parses a header value.
    pub fn from_header(value: &HeaderValue) -> Result<Self, KeyError> {
        Self::parse(value.as_bytes())
    }

    /// Builds a key from an already unquoted string (e.g. a client generated one).
    pub fn new(value: impl Into<String>) -> Result<Self, KeyError> {
        Self::validate(value.into().into_bytes())
    }

    /// A fresh random key (UUID v4, 36 visible ASCII characters), for a client's new operation.
    pub fn generate() -> Self {
        Self(uuid::Uuid::new_v4().to_string())
    }

    fn validate(value: Vec<u8>) -> Result<Self, KeyError> {
        if value.is_empty() {
            return Err(KeyError::Empty);
        }
        if value.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong);
        }
        if !value.iter().all(|b| (0x21..=0x7e).contains(b)) {
            return Err(KeyError::InvalidCharacter);
        }
        // Only visible ASCII remains, so this cannot fail; map defensively anyway.
        String::from_utf8(value)
            .map(Self)
            .map_err(|_| KeyError::InvalidCharacter)
    }

    /// The key as stored and compared.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The header value to send: the bare form, which every server we know accepts, except for
    /// a key starting with `"`, which bare would read as a quoted string: that one is sent as
    /// an sf-string.
    pub fn to_header_value(&self) -> HeaderValue {
        let value = if self.0.starts_with('"') {
            quote(&self.0)
        } else {
            self.0.clone()
        };
        // Visible ASCII is always a valid header value.
        HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for IdempotencyKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

fn trim_ows(mut raw: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = raw {
        raw = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = raw {
        raw = rest;
    }
    raw
}

/// The sf-string form of a key: `"` and `\` escaped, in double quotes.
fn quote(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + 2);
    out.push('"');
    for c in key.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// RFC 8941 sf-string: DQUOTE *( unescaped / "\" ( DQUOTE / "\" ) ) DQUOTE.
fn unquote(raw: &[u8]) -> Result<Vec<u8>, KeyError> {
    let inner = match raw {
        [b'"', inner @ .., b'"'] if raw.len() >= 2 => inner,
        _ => return Err(KeyError::BadQuoting),
    };
    let mut out = Vec::with_capacity(inner.len());
    let mut bytes = inner.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some(&e @ (b'"' | b'\\')) => out.push(e),
                _ => return Err(KeyError::BadQuoting),
            },
            b'"' => return Err(KeyError::BadQuoting),
            0x20..=0x7e => out.push(b),
            _ => return Err(KeyError::InvalidCharacter),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_and_quoted_are_the_same_key() {
        let bare = IdempotencyKey::parse(b"8e03978e-40d5-43e8").unwrap();
        let quoted = IdempotencyKey::parse(b"\"8e03978e-40d5-43e8\"").unwrap();
        assert_eq!(bare, quoted);
        assert_eq!(bare.as_str(), "8e03978e-40d5-43e8");
    }

    #[test]
    fn escapes_in_quoted_form() {
        let k = IdempotencyKey::parse(br#""a\"b\\c""#).unwrap();
        assert_eq!(k.as_str(), r#"a"b\c"#);
        assert_eq!(
            IdempotencyKey::parse(br#""a\nb""#),
            Err(KeyError::BadQuoting)
        );
        assert_eq!(IdempotencyKey::parse(br#""ab"#), Err(KeyError::BadQuoting));
        assert_eq!(
            IdempotencyKey::parse(br#""a"b""#),
            Err(KeyError::BadQuoting)
        );
        assert_eq!(IdempotencyKey::parse(b"\""), Err(KeyError::BadQuoting));
    }

    #[test]
    fn length_limits() {
        assert!(IdempotencyKey::parse("k".repeat(255).as_bytes()).is_ok());
        assert_eq!(
            IdempotencyKey::parse("k".repeat(256).as_bytes()),
            Err(KeyError::TooLong)
        );
        let quoted = format!("\"{}\"", "k".repeat(255));
        assert!(IdempotencyKey::parse(quoted.as_bytes()).is_ok());
        assert_eq!(IdempotencyKey::parse(b""), Err(KeyError::Empty));
        assert_eq!(IdempotencyKey::parse(b"\"\""), Err(KeyError::Empty));
        assert_eq!(IdempotencyKey::parse(b"  "), Err(KeyError::Empty));
    }

    #[test]
    fn generated_keys_are_valid_and_distinct() {
        let a = IdempotencyKey::generate();
        assert_eq!(IdempotencyKey::parse(a.as_str().as_bytes()), Ok(a.clone()));
        assert_ne!(a, IdempotencyKey::generate());
    }

    #[test]
    fn only_visible_ascii() {
        assert_eq!(
            IdempotencyKey::parse(b"a b"),
            Err(KeyError::InvalidCharacter)
        );
        assert_eq!(
            IdempotencyKey::parse(b"\"a b\""),
            Err(KeyError::InvalidCharacter)
        );
        assert_eq!(
            IdempotencyKey::parse("clé".as_bytes()),
            Err(KeyError::InvalidCharacter)
        );
        assert_eq!(
            IdempotencyKey::parse(b"a\x01"),
            Err(KeyError::InvalidCharacter)
        );
        assert_eq!(IdempotencyKey::parse(b" abc\t").unwrap().as_str(), "abc");
    }

    #[test]
    fn overlong_values_are_refused_before_unquoting() {
        // The longest quoted form: every character escaped.
        let escaped = format!("\"{}\"", "\\\"".repeat(MAX_KEY_LEN));
        assert_eq!(escaped.len(), MAX_RAW_KEY_LEN);
        assert_eq!(
            IdempotencyKey::parse(escaped.as_bytes()).unwrap().as_str(),
            "\"".repeat(MAX_KEY_LEN)
        );
        // One byte more is refused as too long, even though it is malformed quoting too.
        let longer = format!("\"{}\\\"", "\\\"".repeat(MAX_KEY_LEN));
        assert_eq!(
            IdempotencyKey::parse(longer.as_bytes()),
            Err(KeyError::TooLong)
        );
        assert_eq!(
            IdempotencyKey::parse(&vec![b'"'; 1 << 20]),
            Err(KeyError::TooLong)
        );
        // Surrounding whitespace is not counted.
        let padded = format!("{0}{escaped}{0}", " ".repeat(1000));
        assert!(IdempotencyKey::parse(padded.as_bytes()).is_ok());
    }

    use crate::proptest_support::config;
    use proptest::prelude::*;

    /// Valid keys, often with the characters that need escaping when quoted.
    fn valid_key() -> impl Strategy<Value = String> {
        prop_oneof!["[!-~]{1,255}", "[\"\\\\a]{1,255}"]
    }

    proptest! {
        #![proptest_config(config(512))]

        /// Arbitrary bytes, and bytes shaped like quoted strings: an answer, never a panic;
        /// anything accepted is 1..=255 visible ASCII.
        #[test]
        fn never_panics_and_accepts_only_visible_ascii(
            raw in prop_oneof![
                prop::collection::vec(any::<u8>(), 0..600),
                "[!-~]{0,600}".prop_map(String::into_bytes),
                "[ \t]{0,3}\"([ -~]|\\\\.){0,300}\"?[ \t]{0,3}".prop_map(String::into_bytes),
            ],
        ) {
            if let Ok(key) = IdempotencyKey::parse(&raw) {
                prop_assert!((1..=MAX_KEY_LEN).contains(&key.as_str().len()));
                prop_assert!(key.as_str().bytes().all(|b| (0x21..=0x7e).contains(&b)));
            }
            if raw.len() > MAX_RAW_KEY_LEN && !raw.starts_with(b" ") && !raw.starts_with(b"\t")
                && !raw.ends_with(b" ") && !raw.ends_with(b"\t")
            {
                prop_assert_eq!(IdempotencyKey::parse(&raw), Err(KeyError::TooLong));
            }
        }

        /// A valid key's bare and quoted forms are the same key, and the header value a client
        /// sends parses back to it.
        #[test]
        fn bare_quoted_and_header_forms_agree(key in valid_key()) {
            let parsed = IdempotencyKey::new(key.clone()).unwrap();
            prop_assert_eq!(parsed.as_str(), key.as_str());
            prop_assert_eq!(IdempotencyKey::parse(quote(&key).as_bytes()), Ok(parsed.clone()));
            // Bare, a leading `"` would start a quoted string: such a key has only one form.
            if !key.starts_with('"') {
                prop_assert_eq!(IdempotencyKey::parse(key.as_bytes()), Ok(parsed.clone()));
            }
            prop_assert_eq!(IdempotencyKey::from_header(&parsed.to_header_value()), Ok(parsed));
        }
    }
}
