//! The `signed` template of `scheme = "hmac"` (`{header:svix-id}.{timestamp}.{body}`) read into
//! the pieces the verifier concatenates.

/// One piece of the signed string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Literal text.
    Text(String),
    /// The raw body.
    Body,
    /// The timestamp as sent.
    Timestamp,
    /// `public_url`.
    Url,
    /// The request's method: always `POST`, the only one the route takes.
    Method,
    /// A request header's value, lowercase name; required.
    Header(String),
}

/// The signed-string template in pieces; it must sign the body, or a forger could send any
/// body under a signature captured once.
pub fn parse_template(template: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        if open > 0 {
            pieces.push(Piece::Text(rest[..open].to_owned()));
        }
        let after = &rest[open + 1..];
        let close = after
            .find('}')
            .ok_or_else(|| format!("has a `{{` with no `}}`: {template:?}"))?;
        let field = &after[..close];
        pieces.push(match field {
            "body" => Piece::Body,
            "timestamp" => Piece::Timestamp,
            "url" => Piece::Url,
            "method" => Piece::Method,
            _ => match field.strip_prefix("header:") {
                Some(h) if h.parse::<http::HeaderName>().is_ok() => {
                    Piece::Header(h.to_ascii_lowercase())
                }
                _ => {
                    return Err(format!(
                        "has `{{{field}}}`; the fields are {{body}}, {{timestamp}}, {{url}}, \
                         {{method}} and {{header:Name}}"
                    ))
                }
            },
        });
        rest = &after[close + 1..];
    }
    if rest.contains('}') {
        return Err(format!("has a `}}` with no `{{`: {template:?}"));
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest.to_owned()));
    }
    if pieces.iter().filter(|p| **p == Piece::Body).count() != 1 {
        return Err("must have {body} once: the raw body is what the signature protects".into());
    }
    Ok(pieces)
}
