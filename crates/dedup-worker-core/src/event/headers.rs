//! The sender's own delivery headers a handler may want (`X-GitHub-Delivery`, `X-Shopify-Topic`,
//! `X-Slack-Retry-Num`, …), kept by the ingress and carried with the message on every transport
//! to the handler's [`Event`](super::Event).
//!
//! On the wire (a queue row's column, an AMQP header, one SQS message attribute) they are one
//! JSON array of `[name, value]` pairs: one attribute whatever their number, as SQS allows ten
//! per message, and in the order the scheme names them. A foreign producer may put anything
//! there, so text that is not such an array reads as no headers rather than failing the message.

use serde::{Deserialize, Serialize};

/// The longest header value kept, in bytes. The headers worth carrying are ids, names, counts
/// and times; a longer value is dropped rather than grow every message of the queue.
pub const MAX_SENDER_HEADER_BYTES: usize = 255;

/// The sender's headers kept with an event, in order: names in lower case (as HTTP/2 and the
/// ingress see them), values as sent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SenderHeaders(Vec<(String, String)>);

impl SenderHeaders {
    /// Adds `name: value`, unless the value is empty, longer than [`MAX_SENDER_HEADER_BYTES`] or
    /// holds a control character (which PostgreSQL text, AMQP headers and logs would each take
    /// badly): such a header is left out, as if the sender had not sent it.
    pub fn push(&mut self, name: &str, value: &str) {
        let keep = !value.is_empty()
            && value.len() <= MAX_SENDER_HEADER_BYTES
            && !value.chars().any(char::is_control);
        if keep {
            self.0.push((name.to_ascii_lowercase(), value.to_owned()));
        }
    }

    /// The value of header `name`, compared without regard to ASCII case
    /// (`x-github-delivery` and `X-GitHub-Delivery` alike); the first when sent twice.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(kept, _)| kept.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// Every kept header as `(name, value)`, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// Whether none was kept.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The wire form (a JSON array of `[name, value]`), or `None` when there is nothing to carry,
    /// so a message without headers carries no column value, AMQP header or SQS attribute.
    pub fn to_wire(&self) -> Option<String> {
        if self.0.is_empty() {
            return None;
        }
        // A Vec of string pairs always serialises.
        serde_json::to_string(self).ok()
    }

    /// The headers of a wire form [`SenderHeaders::to_wire`] made; none for anything else
    /// (absent, or a foreign producer's text that is not such an array). Each pair is checked
    /// again as [`SenderHeaders::push`] does: anyone who can publish to the queue can write it.
    pub fn from_wire(wire: Option<&str>) -> Self {
        let pairs: Vec<(String, String)> = wire
            .and_then(|text| serde_json::from_str(text).ok())
            .unwrap_or_default();
        let mut headers = SenderHeaders::default();
        for (name, value) in &pairs {
            headers.push(name, value);
        }
        headers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_read_back_from_their_wire_form_in_order_and_by_any_case() {
        let mut headers = SenderHeaders::default();
        headers.push("X-GitHub-Event", "push");
        headers.push("x-github-delivery", "72d3162e");
        headers.push("X-GitHub-Hook-ID", "");
        headers.push("X-Long", &"x".repeat(MAX_SENDER_HEADER_BYTES + 1));
        headers.push("X-Control", "a\u{0}b");
        let wire = headers.to_wire().expect("two headers");
        assert_eq!(
            wire,
            r#"[["x-github-event","push"],["x-github-delivery","72d3162e"]]"#
        );
        let back = SenderHeaders::from_wire(Some(&wire));
        assert_eq!(back, headers);
        assert_eq!(back.get("X-GITHUB-DELIVERY"), Some("72d3162e"));
        assert_eq!(back.get("x-github-hook-id"), None);
        assert_eq!(SenderHeaders::default().to_wire(), None);
        for foreign in [None, Some(""), Some("{}"), Some("[1]"), Some("not json")] {
            assert!(SenderHeaders::from_wire(foreign).is_empty(), "{foreign:?}");
        }
    }
}
