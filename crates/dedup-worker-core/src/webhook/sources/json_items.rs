//! The events of a batch: the declarative scheme's `items_pointer` (HubSpot posts a JSON array
//! of up to 100 events) and Twilio's Event Streams (an array of CloudEvents): the array an RFC 6901 pointer names in the body, each element
//! kept as its raw JSON (`RawValue`), byte for byte as sent: its event's payload, nothing
//! re-serialized.

use std::collections::HashMap;

use serde_json::value::RawValue;

use crate::http::problem::Problem;
use crate::webhook::deliver::invalid_payload;

/// The elements of the array at `pointer` in `body` (`""`: the body itself), in order: a 400
/// `payload_json` when the body is not JSON, `missing_items` when no array is there.
pub(super) fn items<'b>(body: &'b [u8], pointer: &str) -> Result<Vec<&'b RawValue>, Problem> {
    let mut at: &'b RawValue = serde_json::from_slice(body)
        .map_err(|e| invalid_payload(format!("the body is not JSON: {e}"), "payload_json"))?;
    let missing = || {
        invalid_payload(
            format!("the body has no array of events at the pointer \"{pointer}\""),
            "missing_items",
        )
    };
    for token in pointer.split('/').skip(1) {
        at = child(at, &token.replace("~1", "/").replace("~0", "~")).ok_or_else(missing)?;
    }
    serde_json::from_str(at.get()).map_err(|_| missing())
}

/// The member `token` of an object, or the element at index `token` of an array (digits, no
/// leading zero, as RFC 6901 has it); `None` when there is none.
fn child<'b>(value: &'b RawValue, token: &str) -> Option<&'b RawValue> {
    let text: &'b str = value.get();
    match text.as_bytes().first()? {
        // Duplicate keys: the last wins, as for serde_json's `Value`.
        b'{' => serde_json::from_str::<HashMap<String, &'b RawValue>>(text)
            .ok()?
            .remove(token),
        b'[' => {
            let index_like = !token.is_empty()
                && token.bytes().all(|b| b.is_ascii_digit())
                && (token == "0" || !token.starts_with('0'));
            if !index_like {
                return None;
            }
            let index: usize = token.parse().ok()?;
            serde_json::from_str::<Vec<&'b RawValue>>(text)
                .ok()?
                .get(index)
                .copied()
        }
        _ => None,
    }
}
