//! `Idempotency-Key` parsing never panics; an accepted key is 1..=255 visible ASCII, and the
//! header value it is sent as, its quoted sf-string form and the value with surrounding
//! whitespace all parse back to the same key.
#![no_main]

use idempotency_key::MAX_KEY_LEN;
use idempotency_key::IdempotencyKey;
use libfuzzer_sys::fuzz_target;

#[path = "support.rs"]
mod support;

fuzz_target!(init: support::catch_stack_overflow(), |data: &[u8]| {
    let parsed = IdempotencyKey::parse(data);

    // Optional whitespace around a field value is not part of it.
    let mut padded = b" \t".to_vec();
    padded.extend_from_slice(data);
    padded.extend_from_slice(b"\t ");
    assert_eq!(IdempotencyKey::parse(&padded), parsed);

    let key = match parsed {
        Ok(key) => key,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    let s = key.as_str();
    assert!((1..=MAX_KEY_LEN).contains(&s.len()), "length {}", s.len());
    assert!(s.bytes().all(|b| (0x21..=0x7e).contains(&b)), "{s:?}");

    // The bare form, except for a key that begins with a quote, which the bare form would turn
    // into an sf-string (`"a"` would come back as the key `a`): that one is sent quoted.
    let header = key.to_header_value();
    if !s.starts_with('"') {
        assert_eq!(header.as_bytes(), s.as_bytes());
    }
    assert_eq!(IdempotencyKey::parse(header.as_bytes()), Ok(key.clone()));
    assert_eq!(IdempotencyKey::from_header(&header), Ok(key.clone()));
    assert_eq!(IdempotencyKey::new(s), Ok(key.clone()));

    let mut quoted = String::from("\"");
    for c in s.chars() {
        if c == '"' || c == '\\' {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    quoted.push('"');
    assert_eq!(IdempotencyKey::parse(quoted.as_bytes()), Ok(key));
});
