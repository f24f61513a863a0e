//! [`Answer`]: what a receiver answered a delivery, kept with the attempt (`outbox_attempts`):
//! its status, its headers redacted and bounded, and the first bytes of its body. The request's
//! own headers are never kept (they hold our signatures and bearer token).

/// The most headers of one answer kept.
pub const MAX_HEADERS: usize = 32;
/// The most characters of one header value kept.
pub const MAX_HEADER_CHARS: usize = 256;
/// What a redacted header value becomes.
pub const REDACTED: &str = "[redacted]";
/// The most of a receiver's answer read to keep its connection: a body left unread makes the
/// HTTP client close the connection rather than reuse it, so every delivery to a receiver that
/// answers `{"ok":true}` would pay a new TCP (and TLS) handshake. A longer body is dropped
/// unread past this, and its connection closed. Also the most `outbox.response_excerpt_bytes`
/// may ask for.
pub const DRAINED_BODY_BYTES: usize = 64 * 1024;

/// A receiver's answer to one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// Its headers in the order received, redacted ([`redact`]).
    pub headers: Vec<(String, String)>,
    /// The first `outbox.response_excerpt_bytes` of its body.
    pub body: Vec<u8>,
    /// Whether the body went on past [`Answer::body`] (or could not be read to its end).
    pub truncated: bool,
}

impl Answer {
    /// Reads `response`'s headers and up to `limit` bytes of its body, draining the rest up to
    /// `DRAINED_BODY_BYTES` so the connection can be reused (one read serves both). Bounded
    /// in time by the client's timeout, which covers the body. A body that fails mid-read keeps
    /// what arrived, marked truncated: the status already decided the delivery.
    pub async fn read(mut response: reqwest::Response, limit: usize) -> Answer {
        let status = response.status().as_u16();
        let headers = redact(response.headers().iter().map(|(name, value)| {
            (
                name.as_str().to_owned(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        }));
        let mut body = Vec::new();
        let mut read = 0;
        let mut truncated = false;
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    read += chunk.len();
                    let room = limit.saturating_sub(body.len());
                    body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                    truncated |= chunk.len() > room;
                    if read > DRAINED_BODY_BYTES {
                        truncated = true;
                        break;
                    }
                }
                Ok(None) => break,
                Err(_) => {
                    truncated = true;
                    break;
                }
            }
        }
        Answer {
            status,
            headers,
            body,
            truncated,
        }
    }

    /// The headers as kept in `outbox_attempts.response_headers`: JSON `[[name, value], …]`.
    pub fn headers_json(&self) -> String {
        serde_json::to_string(&self.headers).unwrap_or_else(|_| "[]".to_owned())
    }
}

/// Whether a header's value is a credential or a session: cookies, authorization, and any
/// name holding `token`, `secret`, `signature`, `session` or an API key.
fn is_secret(name: &str) -> bool {
    const NAMES: [&str; 4] = [
        "set-cookie",
        "cookie",
        "authorization",
        "proxy-authorization",
    ];
    const PARTS: [&str; 6] = [
        "token",
        "secret",
        "signature",
        "session",
        "api-key",
        "apikey",
    ];
    let name = name.to_ascii_lowercase();
    NAMES.contains(&name.as_str()) || PARTS.iter().any(|part| name.contains(part))
}

/// At most `MAX_HEADERS` headers, each value printable and cut to `MAX_HEADER_CHARS`
/// characters, the value of a credential (`is_secret`) replaced by [`REDACTED`].
pub fn redact(headers: impl IntoIterator<Item = (String, String)>) -> Vec<(String, String)> {
    headers
        .into_iter()
        .take(MAX_HEADERS)
        .map(|(name, value)| {
            let name = crate::event::printable(&name, MAX_HEADER_CHARS).into_owned();
            let value = if is_secret(&name) {
                REDACTED.to_owned()
            } else {
                crate::event::printable(&value, MAX_HEADER_CHARS).into_owned()
            };
            (name, value)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn credentials_and_sessions_are_redacted_and_the_rest_kept() {
        let kept = redact(pairs(&[
            ("set-cookie", "s=SECRET"),
            ("Authorization", "Bearer abc"),
            ("x-api-key", "K"),
            ("X-ApiKey", "K"),
            ("x-auth-token", "T"),
            ("x-client-secret", "S"),
            ("webhook-signature", "v1,x"),
            ("x-session-id", "sid"),
            ("x-request-id", "req_1"),
            ("content-type", "application/json"),
        ]));
        let shown: Vec<&str> = kept.iter().map(|(_, v)| v.as_str()).collect();
        assert_eq!(
            shown,
            [
                REDACTED,
                REDACTED,
                REDACTED,
                REDACTED,
                REDACTED,
                REDACTED,
                REDACTED,
                REDACTED,
                "req_1",
                "application/json"
            ]
        );
    }

    #[test]
    fn headers_are_bounded_in_number_length_and_printable() {
        let many: Vec<(String, String)> = (0..40)
            .map(|i| (format!("x-h{i}"), "v".repeat(300)))
            .collect();
        let kept = redact(many);
        assert_eq!(kept.len(), MAX_HEADERS);
        // 256 characters and the ellipsis that says it was cut.
        assert_eq!(kept[0].1.chars().count(), MAX_HEADER_CHARS + 1);
        let kept = redact(pairs(&[("x-odd", "a\u{0}b")]));
        assert!(!kept[0].1.contains('\u{0}'), "{:?}", kept[0].1);
    }

    async fn answer_of(body: &'static [u8], limit: usize) -> Answer {
        let router = axum::Router::new().route(
            "/",
            axum::routing::post(move || async move {
                (
                    [("x-request-id", "req_9"), ("set-cookie", "s=SECRET")],
                    body,
                )
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        let response = reqwest::Client::new()
            .post(format!("http://{addr}/"))
            .send()
            .await
            .unwrap();
        Answer::read(response, limit).await
    }

    #[tokio::test]
    async fn the_body_is_kept_up_to_the_limit_and_says_when_it_was_cut() {
        let whole = answer_of(br#"{"error":"boom 1"}"#, 4096).await;
        assert_eq!(whole.status, 200);
        assert_eq!(whole.body, br#"{"error":"boom 1"}"#);
        assert!(!whole.truncated);
        assert!(whole
            .headers
            .contains(&("x-request-id".to_owned(), "req_9".to_owned())));
        assert!(whole
            .headers
            .contains(&("set-cookie".to_owned(), REDACTED.to_owned())));
        let cut = answer_of(br#"{"error":"boom 1"}"#, 5).await;
        assert_eq!(cut.body, br#"{"err"#);
        assert!(cut.truncated);
        let none = answer_of(b"abc", 0).await;
        assert!(none.body.is_empty());
        assert!(none.truncated);
    }
}
