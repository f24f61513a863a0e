//! `id_field`: the dedup id read from a field the user names, for a sender whose own id does not
//! suit (Zoom and Twilio document none; the schemes choose one and say why in
//! docs/src/sources.md). Read only once the delivery verified, like every scheme's id.

use serde_json::Value;

use super::missing_id;
use crate::http::problem::Problem;

/// The id at `field` of `body`: a JSON pointer (`/payload/object/uuid`) into a JSON body, or a
/// form parameter's name (`MessageSid`) in a form-encoded one; a non-empty string or a number.
/// The `missing_id` 400 otherwise: a delivery that lacks it cannot be deduplicated as told.
pub(super) fn read(body: &[u8], field: &str) -> Result<String, Problem> {
    let found = if field.starts_with('/') {
        serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|value| match value.pointer(field) {
                Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
                Some(Value::Number(n)) => Some(n.to_string()),
                _ => None,
            })
    } else {
        form_urlencoded::parse(body)
            .find(|(name, _)| name == field)
            .map(|(_, value)| value.into_owned())
            .filter(|value| !value.is_empty())
    };
    found.ok_or_else(|| missing_id(&format!("`{field}` (the source's id_field)")))
}

#[cfg(test)]
mod tests {
    use super::read;

    #[test]
    fn a_pointer_reads_json_and_a_name_reads_a_form() {
        let json = br#"{"payload":{"object":{"uuid":"u==","id":42}}}"#;
        assert_eq!(read(json, "/payload/object/uuid").unwrap(), "u==");
        assert_eq!(read(json, "/payload/object/id").unwrap(), "42");
        let form = b"MessageSid=SM1&MessageStatus=sent&Body=a%20b";
        assert_eq!(read(form, "MessageSid").unwrap(), "SM1");
        assert_eq!(read(form, "Body").unwrap(), "a b");
    }

    #[test]
    fn a_missing_or_unusable_field_is_the_missing_id_400() {
        let json = br#"{"payload":{"object":{"uuid":"","obj":{}}}}"#;
        for (body, field) in [
            (&json[..], "/payload/object/uuid"),
            (&json[..], "/payload/object/obj"),
            (&json[..], "/nowhere"),
            (&b"not json"[..], "/id"),
            (&b"A=1"[..], "B"),
            (&b"A="[..], "A"),
        ] {
            let problem = read(body, field).expect_err(field);
            assert_eq!(problem.status, 400, "{field}");
            assert_eq!(problem.check, Some("missing_id"), "{field}");
        }
    }
}
