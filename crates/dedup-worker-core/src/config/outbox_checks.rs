//! Checks of `[outbox.sinks.NAME]`, `[outbox.breaker]` and `[[outbox.routes]]`: each refusal
//! names its key as written (`outbox.sinks.billing.rate_per_sec`, `outbox.routes[1].sinks`).
//! A sink's `tls` files are read and parsed here (`sink_tls.rs`), so a missing or broken one
//! stops the start instead of failing every delivery.

use std::time::Duration;

use super::durations::shown;
use super::outbox::{BreakerSettings, SinkOAuthSettings, SinkSettings, DEFAULT_LANE};
use super::sink_tls::check_sink_tls;
use super::{ConfigError, Settings, SinkSpec};

/// The longest name of a sink (it is a metrics label and a URL path segment).
pub const MAX_SINK_NAME_CHARS: usize = 64;
/// The most deliveries a second a sink's rate may name.
const MAX_RATE_PER_SEC: f64 = 1_000_000.0;

impl Settings {
    pub(super) fn check_outbox_lanes(&self) -> Result<(), ConfigError> {
        let outbox = &self.outbox;
        if outbox.max_retry_after < Duration::from_secs(1) {
            return Err(ConfigError::invalid_at(
                "outbox.max_retry_after",
                format!(
                    "is {}: a receiver's Retry-After is in whole seconds, so at least 1s",
                    shown(outbox.max_retry_after)
                ),
            ));
        }
        check_breaker("outbox.breaker", &outbox.breaker)?;
        check_rate("outbox.", outbox.rate_per_sec, outbox.burst)?;
        for (name, sink) in &outbox.sinks {
            let key = |field: &str| format!("outbox.sinks.{name}.{field}");
            check_sink_name(name)?;
            for (field, value) in [
                ("concurrency", sink.concurrency),
                ("batch_size", sink.batch_size),
                ("max_attempts", sink.max_attempts.map(|n| n as usize)),
            ] {
                match value {
                    Some(0) => return Err(ConfigError::invalid_at(key(field), "must be above 0")),
                    Some(n) if n > 10_000 && field != "max_attempts" => {
                        return Err(ConfigError::invalid_at(
                            key(field),
                            format!("is {n}, more than 10000, the most it accepts"),
                        ))
                    }
                    _ => {}
                }
            }
            if let Some(timeout) = sink.http_timeout {
                if timeout.is_zero() || timeout > Duration::from_secs(3_600) {
                    return Err(ConfigError::invalid_at(
                        key("http_timeout"),
                        format!("is {}: it must be above 0 and at most 1h", shown(timeout)),
                    ));
                }
            }
            check_rate(&key(""), sink.rate_per_sec, sink.burst)?;
            check_breaker(&key("breaker"), &outbox.breaker.with(&sink.breaker))?;
            if let Some(pointer) = &sink.ordering_key {
                if !sink.ordered {
                    return Err(ConfigError::invalid_at(
                        key("ordering_key"),
                        "is set on a sink that is not ordered: set `ordered = true` too, or \
                         leave the key out",
                    ));
                }
                check_pointer(pointer)
                    .map_err(|reason| ConfigError::invalid_at(key("ordering_key"), reason))?;
            }
            check_sink_auth(name, sink)?;
        }
        self.check_routes()
    }

    fn check_routes(&self) -> Result<(), ConfigError> {
        let outbox = &self.outbox;
        for (i, route) in outbox.routes.iter().enumerate() {
            let key = |field: &str| format!("outbox.routes[{i}].{field}");
            if route.sinks.is_empty() {
                return Err(ConfigError::invalid_at(
                    key("sinks"),
                    "is empty: a route must name at least one sink",
                ));
            }
            for sink in &route.sinks {
                if sink != DEFAULT_LANE && !outbox.sinks.contains_key(sink) {
                    let mut known: Vec<&str> = outbox.sinks.keys().map(String::as_str).collect();
                    known.push(DEFAULT_LANE);
                    return Err(ConfigError::invalid_at(
                        key("sinks"),
                        format!(
                            "names no sink {sink:?}; the sinks are: {} (configure others as \
                             [outbox.sinks.NAME])",
                            known.join(", ")
                        ),
                    ));
                }
            }
            for pattern in &route.types {
                check_type_pattern(pattern)
                    .map_err(|reason| ConfigError::invalid_at(key("types"), reason))?;
            }
            for pointer in route.matches.keys() {
                check_pointer(pointer)
                    .map_err(|reason| ConfigError::invalid_at(key("where"), reason))?;
            }
        }
        Ok(())
    }
}

/// `tls` and `oauth` of sink `name`: only on an HTTP sink, each file readable and parsable,
/// the OAuth client complete.
fn check_sink_auth(name: &str, sink: &SinkSettings) -> Result<(), ConfigError> {
    let key = |field: &str| format!("outbox.sinks.{name}.{field}");
    for (field, set) in [("tls", sink.tls.is_some()), ("oauth", sink.oauth.is_some())] {
        if set && !matches!(sink.url, SinkSpec::Http(_)) {
            return Err(ConfigError::invalid_at(
                key(field),
                format!(
                    "is set on a sink whose url ({}) is not an http(s) URL; only HTTP sinks \
                     use it",
                    sink.url
                ),
            ));
        }
    }
    if let Some(tls) = &sink.tls {
        check_sink_tls(tls).map_err(|(field, reason)| {
            ConfigError::invalid_at(key(&format!("tls.{field}")), reason)
        })?;
    }
    if let Some(oauth) = &sink.oauth {
        check_oauth(oauth).map_err(|(field, reason)| {
            ConfigError::invalid_at(key(&format!("oauth.{field}")), reason)
        })?;
    }
    Ok(())
}

fn check_oauth(oauth: &SinkOAuthSettings) -> Result<(), (&'static str, String)> {
    let Some(token_url) = &oauth.token_url else {
        return Err((
            "token_url",
            "is not set: the authorization server's token endpoint (https://…/oauth/token)".into(),
        ));
    };
    let parsed = url::Url::parse(token_url).map_err(|error| {
        let shown = crate::config::shown_url(token_url);
        ("token_url", format!("{shown:?} is not a URL: {error}"))
    })?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err((
            "token_url",
            format!(
                "{:?} is not an http(s) URL with a host",
                crate::config::shown_url(token_url)
            ),
        ));
    }
    if oauth
        .client_id
        .as_deref()
        .is_none_or(|id| id.trim().is_empty())
    {
        return Err((
            "client_id",
            "is not set: the client id the token endpoint knows this relay by".into(),
        ));
    }
    if oauth
        .client_secret
        .as_ref()
        .is_none_or(|secret| secret.expose().is_empty())
    {
        return Err((
            "client_secret",
            "is not set (or empty): the secret of client_id at the token endpoint".into(),
        ));
    }
    Ok(())
}

/// A sink's name: `[a-z0-9_-]`, 1 to 64 characters (a metrics label, a console path and the
/// lane's name in the store, where it can never equal a sink spec), and not a reserved name.
fn check_sink_name(name: &str) -> Result<(), ConfigError> {
    let key = format!("outbox.sinks.{name}");
    if name == DEFAULT_LANE || name == "log" {
        return Err(ConfigError::invalid_at(
            key,
            format!(
                "{name:?} is reserved (`default` is outbox.sink's lane, configured by [outbox]); \
                 choose another name"
            ),
        ));
    }
    let valid = (1..=MAX_SINK_NAME_CHARS).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if !valid {
        return Err(ConfigError::invalid_at(
            key,
            format!(
                "a sink's name is 1 to {MAX_SINK_NAME_CHARS} of a-z, 0-9, `_` and `-` (environment \
                 names are read in lower case)"
            ),
        ));
    }
    Ok(())
}

fn check_breaker(key: &str, breaker: &BreakerSettings) -> Result<(), ConfigError> {
    let at =
        |field: &str, reason: String| ConfigError::invalid_at(format!("{key}.{field}"), reason);
    if !(breaker.failure_ratio > 0.0 && breaker.failure_ratio <= 1.0) {
        return Err(at(
            "failure_ratio",
            format!(
                "is {}: it must be above 0 and at most 1 (the share of failed deliveries)",
                breaker.failure_ratio
            ),
        ));
    }
    for (field, value) in [
        ("failures", breaker.failures),
        ("window", breaker.window),
        ("min_requests", breaker.min_requests),
    ] {
        if value > 100_000 {
            return Err(at(
                field,
                format!("is {value}, more than 100000, the most it accepts"),
            ));
        }
    }
    // A min_requests above window is read as window, a probe_after above probe_max as
    // probe_max (the breaker caps both), so each key's bound holds on its own.
    if breaker.window > 0 && breaker.min_requests == 0 {
        return Err(at(
            "min_requests",
            "is 0: the ratio needs at least 1 delivery seen (set window = 0 to turn it off)".into(),
        ));
    }
    if breaker.probe_after.is_zero() {
        return Err(at("probe_after", "must be above 0".into()));
    }
    if breaker.probe_max > Duration::from_secs(86_400) {
        return Err(at(
            "probe_max",
            format!("is {}, more than 1day", shown(breaker.probe_max)),
        ));
    }
    Ok(())
}

/// Checks a type pattern: non-empty, `*` only as the last character. `Err` says what is wrong.
pub fn check_type_pattern(pattern: &str) -> Result<(), String> {
    if pattern.is_empty() {
        return Err("an event type pattern must not be empty".to_string());
    }
    if pattern.strip_suffix('*').unwrap_or(pattern).contains('*') {
        return Err(format!(
            "event type pattern {pattern:?}: '*' may only end a pattern (a prefix match)"
        ));
    }
    Ok(())
}

/// Checks an RFC 6901 JSON pointer: starts with '/', every '~' followed by '0' or '1'. `Err`
/// says what is wrong.
pub fn check_pointer(pointer: &str) -> Result<(), String> {
    if !pointer.starts_with('/') {
        return Err(format!(
            "JSON pointer {pointer:?} must start with '/' (RFC 6901; \"/type\" is the top-level key \"type\")"
        ));
    }
    let mut rest = pointer;
    while let Some(at) = rest.find('~') {
        rest = &rest[at + 1..];
        if !(rest.starts_with('0') || rest.starts_with('1')) {
            return Err(format!(
                "JSON pointer {pointer:?}: '~' must be followed by '0' (for '~') or '1' (for '/')"
            ));
        }
    }
    Ok(())
}

/// A lane's `rate_per_sec` and `burst`, under `prefix` (`outbox.` or `outbox.sinks.NAME.`).
fn check_rate(prefix: &str, rate: Option<f64>, burst: Option<u32>) -> Result<(), ConfigError> {
    let key = |field: &str| format!("{prefix}{field}");
    if let Some(rate) = rate {
        if !(rate > 0.0 && rate <= MAX_RATE_PER_SEC) {
            return Err(ConfigError::invalid_at(
                key("rate_per_sec"),
                format!(
                    "is {rate}: it must be above 0 and at most {MAX_RATE_PER_SEC} \
                     (deliveries a second; leave it out for no limit)"
                ),
            ));
        }
    }
    match (burst, rate) {
        (Some(0), _) => Err(ConfigError::invalid_at(
            key("burst"),
            "must be at least 1 (the deliveries that may go at once)",
        )),
        (Some(_), None) => Err(ConfigError::invalid_at(
            key("burst"),
            "is set without rate_per_sec: a burst bounds nothing without a rate",
        )),
        (Some(burst), _) if burst > 1_000_000 => Err(ConfigError::invalid_at(
            key("burst"),
            format!("is {burst}, more than 1000000, the most it accepts"),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_patterns_are_checked() {
        for good in ["invoice.paid", "invoice.*", "*", "cust*", "a.b.c"] {
            assert_eq!(check_type_pattern(good), Ok(()), "{good}");
        }
        assert!(check_type_pattern("").unwrap_err().contains("empty"));
        for bad in ["*.paid", "invoice.*.x", "**", "a*b", "*é"] {
            let error = check_type_pattern(bad).unwrap_err();
            assert!(error.contains("may only end"), "{bad}: {error}");
        }
    }

    #[test]
    fn pointers_are_checked() {
        for good in ["/", "/a", "/a~1b", "/m~0n", "/~01", "/items/0/id", "//"] {
            assert_eq!(check_pointer(good), Ok(()), "{good}");
        }
        for bad in ["", "a", "a/b", "#/a"] {
            let error = check_pointer(bad).unwrap_err();
            assert!(error.contains("must start with '/'"), "{bad}: {error}");
        }
        for bad in ["/a~", "/a~2", "/~/", "/ok~1/~x"] {
            let error = check_pointer(bad).unwrap_err();
            assert!(error.contains("'~' must be followed"), "{bad}: {error}");
        }
    }
}
