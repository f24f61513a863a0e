//! `outbox.sink` (env `DEDUP_SINK`) as a typed value: parsed once while the configuration loads,
//! so a bad spec names its key at start-up; the relay builds its sink from it. Handlers may also
//! name a per-message destination in the same syntax, which the relay parses with the same
//! [`SinkSpec::parse`].

use std::path::PathBuf;

use serde::Deserialize;

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

/// Credentials in a sink's URL are masked ([`super::redact_url`]).
impl std::fmt::Debug for SinkSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use super::redact_url;
        match self {
            SinkSpec::Log => f.write_str("Log"),
            SinkSpec::File(path) => f.debug_tuple("File").field(path).finish(),
            SinkSpec::Http(url) => f.debug_tuple("Http").field(&redact_url(url)).finish(),
            SinkSpec::Amqp { url, exchange } => f
                .debug_struct("Amqp")
                .field("url", &redact_url(url))
                .field("exchange", exchange)
                .finish(),
            SinkSpec::Sqs(url) => f.debug_tuple("Sqs").field(&redact_url(url)).finish(),
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
            reqwest::Url::parse(url)
                .map_err(|e| InvalidSinkSpec(format!("invalid SQS queue URL {url:?}: {e}")))?;
            Ok(SinkSpec::Sqs(url.to_owned()))
        } else if spec.starts_with("http://") || spec.starts_with("https://") {
            let url = reqwest::Url::parse(spec)
                .map_err(|e| InvalidSinkSpec(format!("invalid URL {spec:?}: {e}")))?;
            let host = url.host_str().unwrap_or_default();
            if host.starts_with("sqs.") && host.ends_with(".amazonaws.com") {
                Ok(SinkSpec::Sqs(spec.to_owned()))
            } else {
                Ok(SinkSpec::Http(spec.to_owned()))
            }
        } else if spec.starts_with("amqp://") || spec.starts_with("amqps://") {
            let mut url = reqwest::Url::parse(spec)
                .map_err(|e| InvalidSinkSpec(format!("invalid URL {spec:?}: {e}")))?;
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
                "unsupported sink {spec:?}: expected log, file:PATH, an http(s):// URL, \
                 amqp://…?exchange=NAME or an SQS queue URL (sqs:URL for emulators)"
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

/// Why a sink spec was refused, with the accepted forms.
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
}
