//! The checks that need more than one value's type: values that parse but cannot work. Each
//! refusal names its key. (Secrets and the sink spec are refused while loading, by their types.)

use std::time::Duration;

use super::bounds::SQS_LONGEST_POLL;
use super::durations::{not_whole_seconds, shown};
use super::source_checks::check_source;
use super::{
    invalid, stripe_key_material, ConfigError, Settings, TransportKind, MIN_DEDUP_RETENTION_DAYS,
    MIN_LEASE_SECS, RESERVED_SOURCE_NAMES, STRIPE_SECRET_WARN_CHARS,
};
use crate::event::{check_event_field, EventField};
use crate::signature::ed25519::MAX_PUBLIC_KEYS;

impl Settings {
    /// Rejects values that parse but cannot work, naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check_upper_bounds()?;
        self.check_database_url()?;
        self.check_signature_keys()?;
        self.check_sources()?;
        self.check_transport()?;
        self.check_counts()?;
        self.check_leases_and_dedup_window()?;
        self.check_stripe_api()?;
        self.check_pointers()?;
        self.check_outbox_lanes()?;
        self.search.check()?;
        self.admin.check()
    }

    fn check_database_url(&self) -> Result<(), ConfigError> {
        if !(self.database_url.starts_with("postgres://")
            || self.database_url.starts_with("postgresql://")
            || self.database_url.starts_with("sqlite:"))
        {
            return Err(invalid(
                "database_url",
                "must start with postgres://, postgresql:// or sqlite: (env DATABASE_URL)",
            ));
        }
        Ok(())
    }

    /// The ingress's keys and the sources events are filed under.
    fn check_signature_keys(&self) -> Result<(), ConfigError> {
        if self.roles.ingress && self.stripe.secrets.is_empty() {
            return Err(invalid(
                "stripe.secrets",
                "no Stripe webhook secret configured: set STRIPE_WEBHOOK_SECRET (comma-separated \
                 for rotation); ingress refuses to start without one",
            ));
        }
        let public_keys = self.standard_webhooks.public_keys.len();
        if public_keys > MAX_PUBLIC_KEYS {
            return Err(invalid(
                "standard_webhooks.public_keys",
                format!(
                    "has {public_keys} keys, more than {MAX_PUBLIC_KEYS}: each v1a signature of a \
                     delivery is checked against every key, and that work is bounded per delivery"
                ),
            ));
        }
        for (key, tolerance) in [
            ("stripe.tolerance", self.stripe.tolerance),
            (
                "standard_webhooks.tolerance",
                self.standard_webhooks.tolerance,
            ),
        ] {
            if let Some(reason) = not_whole_seconds(tolerance) {
                return Err(invalid(key, reason));
            }
        }
        for (key, source) in [
            ("standard_webhooks.source", &self.standard_webhooks.source),
            ("consumer.source", &self.consumer.source),
        ] {
            check_event_field(EventField::Source, source)
                .map_err(|e| invalid(key, e.to_string()))?;
        }
        Ok(())
    }

    /// Each `[sources.NAME]`: its name, that it has a secret, its tolerance.
    fn check_sources(&self) -> Result<(), ConfigError> {
        let mut taken: Vec<&str> = RESERVED_SOURCE_NAMES.to_vec();
        taken.push(&self.standard_webhooks.source);
        for (name, source) in &self.sources {
            check_source(name, source, &taken, self.roles.ingress)?;
        }
        Ok(())
    }

    /// The transport's address for its kind, and the database queue's group commit.
    fn check_transport(&self) -> Result<(), ConfigError> {
        let transport = &self.transport;
        if transport.kind == TransportKind::Sqs
            && !(transport.queue.starts_with("https://") || transport.queue.starts_with("http://"))
        {
            return Err(invalid(
                "transport.queue",
                "with transport.kind = sqs this is the queue URL, e.g. https://sqs.eu-west-1.amazonaws.com/123456789012/events (env DEDUP_QUEUE)",
            ));
        }
        if transport.kind == TransportKind::Rabbitmq {
            positive(
                "transport.delivery_limit",
                transport.delivery_limit as usize,
            )?;
            if !(transport.amqp_url.starts_with("amqp://")
                || transport.amqp_url.starts_with("amqps://"))
            {
                return Err(invalid(
                    "transport.amqp_url",
                    "must start with amqp:// or amqps:// (env AMQP_URL)",
                ));
            }
        }
        let wait = transport.sqs_wait_time;
        if wait < Duration::from_secs(1) || wait > SQS_LONGEST_POLL || wait.subsec_nanos() != 0 {
            return Err(invalid(
                "transport.sqs_wait_time",
                format!(
                    "is {}: it must be whole seconds from 1s to 20s (SQS's long-poll range; 0 \
                     would be short polling)",
                    shown(wait)
                ),
            ));
        }
        if transport.queue.is_empty() {
            return Err(invalid("transport.queue", "must not be empty"));
        }
        positive("transport.publish_batch_max", transport.publish_batch_max)?;
        positive("transport.publish_writers", transport.publish_writers)?;
        positive_duration("transport.publish_timeout", transport.publish_timeout)?;
        positive(
            "transport.publish_channel_capacity",
            transport.publish_channel_capacity,
        )
    }

    /// Sizes, timeouts and counts for which zero would stop the work or bound nothing.
    fn check_counts(&self) -> Result<(), ConfigError> {
        let (http, consumer, outbox) = (&self.http, &self.consumer, &self.outbox);
        for (key, value) in [
            ("http.header_read_timeout", http.header_read_timeout),
            ("http.body_read_timeout", http.body_read_timeout),
            ("http.request_timeout", http.request_timeout),
            (
                "database.statement_timeout",
                self.database.statement_timeout,
            ),
            ("consumer.step_timeout", consumer.step_timeout),
        ] {
            positive_duration(key, value)?;
        }
        for (key, value) in [
            ("http.body_limit_bytes", http.body_limit_bytes),
            ("http.max_concurrent_requests", http.max_concurrent_requests),
            ("http.max_connections", http.max_connections),
            ("http.max_header_bytes", http.max_header_bytes),
            ("consumer.max_message_bytes", consumer.max_message_bytes),
            (
                "database.max_connections",
                self.database.max_connections as usize,
            ),
            ("consumer.batch_size", consumer.batch_size),
            ("consumer.workers", consumer.workers),
            ("consumer.max_attempts", consumer.max_attempts as usize),
            // 0 would never delete anything; a negative LIMIT is no limit at all on SQLite (one
            // unbounded delete) and an error on PostgreSQL.
            (
                "consumer.retention_batch",
                usize::try_from(consumer.retention_batch).unwrap_or(0),
            ),
            ("outbox.batch_size", outbox.batch_size),
            ("outbox.concurrency", outbox.concurrency),
            ("outbox.max_attempts", outbox.max_attempts as usize),
        ] {
            positive(key, value)?;
        }
        Ok(())
    }

    fn check_leases_and_dedup_window(&self) -> Result<(), ConfigError> {
        // Leases are extended every third of a lease while their work runs, so they need not
        // cover the slowest batch; but a one-second lease would be lost to any pause of a third
        // of a second (a slow heartbeat round trip, a stalled runtime), and its work done twice.
        for (key, value) in [
            ("consumer.lease", self.consumer.lease),
            ("outbox.lease", self.outbox.lease),
        ] {
            if value < Duration::from_secs(MIN_LEASE_SECS) {
                return Err(invalid(
                    key,
                    format!(
                        "is {}, below the minimum of {MIN_LEASE_SECS}s: the lease is extended \
                         every third of it, and a shorter one is lost to a pause that long (its \
                         work is then done twice)",
                        shown(value)
                    ),
                ));
            }
        }
        let window = self.consumer.dedup_window();
        if window.as_secs() < MIN_DEDUP_RETENTION_DAYS * 86_400
            && !self.consumer.allow_short_dedup_retention
        {
            let value = match self.consumer.dedup_window {
                Some(window) => shown(window),
                None => self.consumer.dedup_retention_days.to_string(),
            };
            return Err(invalid(
                self.consumer.dedup_window_key(),
                format!(
                    "is {value}, below the minimum of {MIN_DEDUP_RETENTION_DAYS} days: Stripe \
                     retries a webhook for up to 3 days, and a retry arriving after its processed \
                     id was purged is handled again (a double charge). Set \
                     consumer.allow_short_dedup_retention = true only if no source redelivers \
                     that late"
                ),
            ));
        }
        Ok(())
    }

    /// Stripe's API, which the consumer (thin events) and `backfill` call.
    fn check_stripe_api(&self) -> Result<(), ConfigError> {
        let stripe = &self.stripe;
        if !(stripe.api_base.starts_with("https://") || stripe.api_base.starts_with("http://")) {
            return Err(invalid(
                "stripe.api_base",
                "must be an http(s) URL such as https://api.stripe.com (env STRIPE_API_BASE)",
            ));
        }
        if self.roles.consumer && stripe.fetch_thin_events {
            if stripe.api_key.expose().is_empty() {
                return Err(invalid(
                    "stripe.api_key",
                    "stripe.fetch_thin_events is on: the consumer fetches each thin event's full \
                     event with Stripe's API; set STRIPE_API_KEY (a key that may read events)",
                ));
            }
            let timeout = stripe.api_timeout;
            if timeout.is_zero() || timeout > self.consumer.step_timeout / 3 {
                return Err(invalid(
                    "stripe.api_timeout",
                    format!(
                        "is {}: it must be above zero and at most a third of \
                         consumer.step_timeout ({}), so a slow API fails its fetch (retried \
                         later) rather than the whole batch",
                        shown(timeout),
                        shown(self.consumer.step_timeout)
                    ),
                ));
            }
        }
        if stripe.api_version.is_empty()
            || !stripe.api_version.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(invalid(
                "stripe.api_version",
                "must be a Stripe API version such as 2026-10-28.endive",
            ));
        }
        Ok(())
    }

    /// Every JSON pointer into an event.
    fn check_pointers(&self) -> Result<(), ConfigError> {
        let guard = &self.consumer.stale_guard;
        for (key, pointer, example) in [
            (
                "transport.sqs_message_group_pointer",
                &self.transport.sqs_message_group_pointer,
                "/data/object/id",
            ),
            (
                "consumer.stale_guard.object_pointer",
                &guard.object_pointer,
                "/data/object/id",
            ),
            (
                "consumer.stale_guard.version_pointer",
                &guard.version_pointer,
                "/data/object/id",
            ),
            (
                "consumer.dedup_key_pointer",
                &self.consumer.dedup_key_pointer,
                "/id",
            ),
        ] {
            if !pointer.starts_with('/') {
                return Err(invalid(
                    key,
                    format!("must be a JSON pointer such as {example}"),
                ));
            }
        }
        Ok(())
    }
}

impl Settings {
    /// Logs a WARN for values accepted but suspicious: Stripe secrets shorter than Stripe issues
    /// (only where the ingress verifies with them). Refused values are [`Settings::validate`]'s.
    pub(super) fn warn_about_weak_values(&self) {
        if !self.roles.ingress {
            return;
        }
        for (i, secret) in self.stripe.secrets.iter().enumerate() {
            let chars = stripe_key_material(secret.expose()).chars().count();
            if chars < STRIPE_SECRET_WARN_CHARS {
                tracing::warn!(
                    key = "stripe.secrets",
                    entry = i + 1,
                    chars,
                    "a Stripe webhook secret with fewer than {STRIPE_SECRET_WARN_CHARS} \
                     characters after whsec_ (Stripe issues 32 or more): fine for local tests, \
                     but a short secret can be guessed; use the endpoint's signing secret"
                );
            }
        }
    }
}

fn positive_duration(key: &'static str, value: Duration) -> Result<(), ConfigError> {
    if value.is_zero() {
        Err(invalid(key, "must be longer than zero"))
    } else {
        Ok(())
    }
}

fn positive(key: &'static str, value: usize) -> Result<(), ConfigError> {
    if value == 0 {
        Err(invalid(key, "must be greater than zero"))
    } else {
        Ok(())
    }
}
