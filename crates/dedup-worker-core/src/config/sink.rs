//! `outbox.sink` (env `DEDUP_SINK`) as a typed value: parsed once while the configuration loads,
//! so a bad spec names its key at start-up; the relay builds its sink from it. Handlers may also
//! name a per-message destination in the same syntax, which the relay parses with the same
//! [`SinkSpec::parse`].

use std::path::PathBuf;

use serde::Deserialize;

use super::secrets::{masked_authority, masked_segment};

/// A parsed `outbox.sink` / `DEDUP_SINK` value.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum SinkSpec {
    /// Log each event (tracing, level info).
    Log,
    /// Append each event as one JSON line.
    File(PathBuf),
    /// POST each event to the URL.
    Http(String),
    /// Publish each event to an exchange (`amqp://…?exchange=NAME`), routing key = event type.
    Amqp {
        /// The broker URL without the `exchange` parameter.
        url: String,
        exchange: String,
    },
    /// Send each event to an SQS queue (`https://sqs.<region>.amazonaws.com/…`, or `sqs:URL`
    /// for an emulator's queue URL).
    Sqs(String),
}

/// How a sink's URL is shown anywhere outside the process (Display and Debug of a
/// [`SinkSpec`], logs, `last_error`, `outbox failed`, `events show`): its scheme, user info
/// masked ([`super::redact_url`]), host and port, its first path segment, then `/…` when more
/// path follows, `?…` when it has a query and `#…` when it has a fragment. Slack-, Zapier- and
/// Discord-style webhook URLs carry their secret in the path (`/services/T000/B000/XXXX`) or the
/// query (`?token=…`), and whoever reads a log could post to them. Others are the secret: a
/// host label or first path segment that looks generated ([`super::token_like`]: webhook.site's
/// `/<UUID>`, a Pipedream host `eo1234abcd.m.pipedream.net`) is shown as `***`. Text that is not
/// a URL is cut the same way (a mistyped scheme still hides its path).
pub fn shown_url(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), url),
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, after) = rest.split_at(authority_end);
    let path_end = after.find(['?', '#']).unwrap_or(after.len());
    let (path, tail) = after.split_at(path_end);
    let mut shown = format!("{scheme}{}", masked_authority(authority));
    if let Some(segments) = path.strip_prefix('/') {
        let (first, more) = segments.split_at(segments.find('/').unwrap_or(segments.len()));
        shown.push('/');
        shown.push_str(&masked_segment(first));
        match more {
            "" | "/" => shown.push_str(more),
            _ => shown.push_str("/…"),
        }
    }
    if tail.starts_with('?') {
        shown.push_str("?…");
    }
    if tail.contains('#') {
        shown.push_str("#…");
    }
    shown
}

/// A sink spec as stored (a row's destination), shown as its parsed [`SinkSpec`] is, or cut as
/// [`shown_url`] cuts a URL if it does not parse.
pub fn shown_destination(spec: &str) -> String {
    SinkSpec::parse(spec)
        .map(|parsed| parsed.to_string())
        .unwrap_or_else(|_| shown_url(spec))
}

/// The sink as [`shown_url`] shows URLs: nothing of a token in a path or query, no password.
impl std::fmt::Display for SinkSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SinkSpec::Log => f.write_str("log"),
            SinkSpec::File(path) => write!(f, "file:{}", path.display()),
            SinkSpec::Http(url) | SinkSpec::Sqs(url) => f.write_str(&shown_url(url)),
            SinkSpec::Amqp { url, exchange } => {
                write!(f, "{} (exchange {exchange})", shown_url(url))
            }
        }
    }
}

/// As [`Display`](std::fmt::Display): URLs shown by [`shown_url`].
impl std::fmt::Debug for SinkSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SinkSpec::Log => f.write_str("Log"),
            SinkSpec::File(path) => f.debug_tuple("File").field(path).finish(),
            SinkSpec::Http(url) => f.debug_tuple("Http").field(&shown_url(url)).finish(),
            SinkSpec::Amqp { url, exchange } => f
                .debug_struct("Amqp")
                .field("url", &shown_url(url))
                .field("exchange", exchange)
                .finish(),
            SinkSpec::Sqs(url) => f.debug_tuple("Sqs").field(&shown_url(url)).finish(),
        }
    }
}

impl SinkSpec {
    pub fn parse(spec: &str) -> Result<Self, InvalidSinkSpec> {
        if spec == "log" {
            Ok(SinkSpec::Log)
        } else if let Some(path) = spec.strip_prefix("file:") {
            if path.is_empty() {
                return Err(InvalidSinkSpec(
                    "file: needs a path, e.g. file:/var/lib/dedup/events.jsonl".into(),
                ));
            }
            Ok(SinkSpec::File(PathBuf::from(path)))
        } else if let Some(url) = spec.strip_prefix("sqs:") {
            reqwest::Url::parse(url).map_err(|e| {
                InvalidSinkSpec(format!("invalid SQS queue URL {:?}: {e}", shown_url(url)))
            })?;
            Ok(SinkSpec::Sqs(url.to_owned()))
        } else if spec.starts_with("http://") || spec.starts_with("https://") {
            let url = reqwest::Url::parse(spec)
                .map_err(|e| InvalidSinkSpec(format!("invalid URL {:?}: {e}", shown_url(spec))))?;
            let host = url.host_str().unwrap_or_default();
            if host.starts_with("sqs.") && host.ends_with(".amazonaws.com") {
                Ok(SinkSpec::Sqs(spec.to_owned()))
            } else {
                Ok(SinkSpec::Http(spec.to_owned()))
            }
        } else if spec.starts_with("amqp://") || spec.starts_with("amqps://") {
            let mut url = reqwest::Url::parse(spec)
                .map_err(|e| InvalidSinkSpec(format!("invalid URL {:?}: {e}", shown_url(spec))))?;
            let mut exchange = None;
            let rest: Vec<(String, String)> = url
                .query_pairs()
                .filter_map(|(k, v)| {
                    if k == "exchange" {
                        exchange = Some(v.into_owned());
                        None
                    } else {
                        Some((k.into_owned(), v.into_owned()))
                    }
                })
                .collect();
            let exchange = exchange.filter(|e| !e.is_empty()).ok_or_else(|| {
                InvalidSinkSpec(
                    "an amqp sink names its exchange: amqp://host/vhost?exchange=NAME".into(),
                )
            })?;
            if rest.is_empty() {
                url.set_query(None);
            } else {
                url.query_pairs_mut().clear().extend_pairs(rest);
            }
            Ok(SinkSpec::Amqp {
                url: url.to_string(),
                exchange,
            })
        } else {
            Err(InvalidSinkSpec(format!(
                "unsupported sink {:?}: expected log, file:PATH, an http(s):// URL, \
                 amqp://…?exchange=NAME or an SQS queue URL (sqs:URL for emulators)",
                shown_url(spec)
            )))
        }
    }
}

impl TryFrom<String> for SinkSpec {
    type Error = InvalidSinkSpec;

    fn try_from(spec: String) -> Result<Self, Self::Error> {
        SinkSpec::parse(&spec)
    }
}

/// Why a sink spec was refused, with the accepted forms; the spec itself as [`shown_url`] shows
/// it (it is refused, but may still carry a token).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidSinkSpec(String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_say_why() {
        assert_eq!(SinkSpec::parse("log"), Ok(SinkSpec::Log));
        assert_eq!(
            SinkSpec::parse("file:/tmp/x.jsonl"),
            Ok(SinkSpec::File("/tmp/x.jsonl".into()))
        );
        assert_eq!(
            SinkSpec::parse("http://127.0.0.1:9/hook"),
            Ok(SinkSpec::Http("http://127.0.0.1:9/hook".into()))
        );
        assert!(SinkSpec::parse("file:").is_err());
        assert_eq!(
            SinkSpec::parse("amqp://guest:guest@127.0.0.1:5672/%2f?exchange=out&heartbeat=10"),
            Ok(SinkSpec::Amqp {
                url: "amqp://guest:guest@127.0.0.1:5672/%2f?heartbeat=10".into(),
                exchange: "out".into()
            })
        );
        assert!(SinkSpec::parse("amqp://127.0.0.1/%2f")
            .unwrap_err()
            .to_string()
            .contains("exchange"));
        assert_eq!(
            SinkSpec::parse("https://sqs.eu-west-1.amazonaws.com/123456789012/out"),
            Ok(SinkSpec::Sqs(
                "https://sqs.eu-west-1.amazonaws.com/123456789012/out".into()
            ))
        );
        assert_eq!(
            SinkSpec::parse("sqs:http://127.0.0.1:4566/000000000000/out"),
            Ok(SinkSpec::Sqs(
                "http://127.0.0.1:4566/000000000000/out".into()
            ))
        );
        assert!(SinkSpec::parse("ftp://x")
            .unwrap_err()
            .to_string()
            .contains("unsupported sink"));
    }

    #[test]
    fn sink_urls_show_scheme_host_port_and_first_segment_only() {
        for (url, shown) in [
            (
                "https://hooks.slack.com/services/T000/B000/XXXX",
                "https://hooks.slack.com/services/…",
            ),
            (
                "https://hooks.zapier.com/hooks/catch/123/abc/",
                "https://hooks.zapier.com/hooks/…",
            ),
            (
                "https://discord.com/api/webhooks/123/T0KEN",
                "https://discord.com/api/…",
            ),
            (
                "http://127.0.0.1:9/hook?token=abc",
                "http://127.0.0.1:9/hook?…",
            ),
            ("http://127.0.0.1:9/hook", "http://127.0.0.1:9/hook"),
            ("http://127.0.0.1:9/hook/", "http://127.0.0.1:9/hook/"),
            ("http://127.0.0.1:9", "http://127.0.0.1:9"),
            ("http://127.0.0.1:9/", "http://127.0.0.1:9/"),
            ("http://h/?token=abc", "http://h/?…"),
            ("http://h?token=abc#x", "http://h?…#…"),
            ("https://user:pw@h/a/b#frag", "https://user:***@h/a/…#…"),
            (
                "https://tok3n@hooks.example/a@b",
                "https://***@hooks.example/a@b",
            ),
            ("http://[::1]:8080/a/b", "http://[::1]:8080/a/…"),
            (
                "amqp://guest:guest@127.0.0.1:5672/%2f?heartbeat=10",
                "amqp://guest:***@127.0.0.1:5672/%2f?…",
            ),
            (
                "https://sqs.eu-west-1.amazonaws.com/123456789012/out",
                "https://sqs.eu-west-1.amazonaws.com/123456789012/…",
            ),
            (
                "hooks.slack.com/services/T/B/X",
                "hooks.slack.com/services/…",
            ),
            // The secret is the address: a host label, the first path segment.
            (
                "https://eo1234abcd.m.pipedream.net/",
                "https://***.m.pipedream.net/",
            ),
            (
                "https://webhook.site/0b6e5c1a-3f2d-4e8b-9a7c-1d2e3f4a5b6c",
                "https://webhook.site/***",
            ),
            (
                "https://requestbin.example/r/en7xk2qj9a0b4?x",
                "https://requestbin.example/r/…?…",
            ),
        ] {
            assert_eq!(shown_url(url), shown, "{url}");
        }
    }

    #[test]
    fn a_sink_spec_never_shows_a_token_or_password() {
        for (spec, secret) in [
            (
                "https://hooks.slack.com/services/T000/B000/S3CRET",
                "S3CRET",
            ),
            ("http://127.0.0.1:9/hook?token=S3CRET", "S3CRET"),
            (
                "amqp://app:S3CRET@127.0.0.1:5672/%2f?exchange=out",
                "S3CRET",
            ),
            ("sqs:http://127.0.0.1:4566/000000000000/S3CRET", "S3CRET"),
        ] {
            let parsed = SinkSpec::parse(spec).expect(spec);
            let shown = format!("{parsed} {parsed:?}");
            assert!(!shown.contains(secret), "{shown}");
        }
        assert_eq!(
            SinkSpec::parse("amqp://app:pw@h:5672/%2f?exchange=out")
                .expect("valid")
                .to_string(),
            "amqp://app:***@h:5672/%2f (exchange out)"
        );
        assert_eq!(
            SinkSpec::parse("file:/tmp/x.jsonl")
                .expect("valid")
                .to_string(),
            "file:/tmp/x.jsonl"
        );
        // Refused specs are echoed the same way.
        for spec in [
            "htps://hooks.slack.com/services/T000/B000/S3CRET",
            "http://[bad/services/T000/B000/S3CRET",
            "sqs:http://[bad/x/S3CRET",
            "amqp://[bad/x/S3CRET?exchange=x",
        ] {
            let error = SinkSpec::parse(spec).expect_err(spec).to_string();
            assert!(!error.contains("S3CRET"), "{error}");
        }
    }
}
