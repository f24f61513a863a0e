//! The checks that need more than one value's type: values that parse but cannot work. Each
//! refusal names its key. (Secrets and the sink spec are refused while loading, by their types.)

use super::{
    invalid, stripe_key_material, ConfigError, Settings, TransportKind, MIN_DEDUP_RETENTION_DAYS,
    MIN_LEASE_SECS, STRIPE_SECRET_WARN_CHARS,
};
use crate::event::{check_event_field, EventField};
use crate::signature::ed25519::MAX_PUBLIC_KEYS;

impl Settings {
    /// Rejects values that parse but cannot work, naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check_upper_bounds()?;
        if !(self.database_url.starts_with("postgres://")
            || self.database_url.starts_with("postgresql://")
            || self.database_url.starts_with("sqlite:"))
        {
            return Err(invalid(
                "database_url",
                "must start with postgres://, postgresql:// or sqlite: (env DATABASE_URL)",
            ));
        }
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
        for (key, source) in [
            ("standard_webhooks.source", &self.standard_webhooks.source),
            ("consumer.source", &self.consumer.source),
        ] {
            check_event_field(EventField::Source, source)
                .map_err(|e| invalid(key, e.to_string()))?;
        }
        if self.transport.kind == TransportKind::Sqs
            && !(self.transport.queue.starts_with("https://")
                || self.transport.queue.starts_with("http://"))
        {
            return Err(invalid(
                "transport.queue",
                "with transport.kind = sqs this is the queue URL, e.g. https://sqs.eu-west-1.amazonaws.com/123456789012/events (env DEDUP_QUEUE)",
            ));
        }
        if self.transport.kind == TransportKind::Rabbitmq {
            positive(
                "transport.delivery_limit",
                self.transport.delivery_limit as usize,
            )?;
            if !(self.transport.amqp_url.starts_with("amqp://")
                || self.transport.amqp_url.starts_with("amqps://"))
            {
                return Err(invalid(
                    "transport.amqp_url",
                    "must start with amqp:// or amqps:// (env AMQP_URL)",
                ));
            }
        }
        if !(1..=20).contains(&self.transport.sqs_wait_time_secs) {
            return Err(invalid(
                "transport.sqs_wait_time_secs",
                "must be 1 to 20 (SQS's long-poll range; 0 would be short polling)",
            ));
        }
        if self.transport.queue.is_empty() {
            return Err(invalid("transport.queue", "must not be empty"));
        }
        positive("http.body_limit_bytes", self.http.body_limit_bytes)?;
        for (key, value) in [
            (
                "http.header_read_timeout_ms",
                self.http.header_read_timeout_ms,
            ),
            ("http.body_read_timeout_ms", self.http.body_read_timeout_ms),
            ("http.request_timeout_ms", self.http.request_timeout_ms),
        ] {
            positive(key, usize::try_from(value).unwrap_or(usize::MAX))?;
        }
        positive(
            "http.max_concurrent_requests",
            self.http.max_concurrent_requests,
        )?;
        positive("http.max_connections", self.http.max_connections)?;
        positive("http.max_header_bytes", self.http.max_header_bytes)?;
        positive(
            "consumer.max_message_bytes",
            self.consumer.max_message_bytes,
        )?;
        positive(
            "database.max_connections",
            self.database.max_connections as usize,
        )?;
        positive(
            "transport.publish_batch_max",
            self.transport.publish_batch_max,
        )?;
        positive("transport.publish_writers", self.transport.publish_writers)?;
        positive(
            "transport.publish_timeout_ms",
            self.transport.publish_timeout_ms as usize,
        )?;
        positive(
            "transport.publish_channel_capacity",
            self.transport.publish_channel_capacity,
        )?;
        for (key, value) in [
            (
                "database.statement_timeout_ms",
                self.database.statement_timeout_ms,
            ),
            ("consumer.step_timeout_ms", self.consumer.step_timeout_ms),
        ] {
            positive(key, usize::try_from(value).unwrap_or(usize::MAX))?;
        }
        positive("consumer.batch_size", self.consumer.batch_size)?;
        positive("consumer.workers", self.consumer.workers)?;
        positive("consumer.max_attempts", self.consumer.max_attempts as usize)?;
        // 0 would never delete anything; a negative LIMIT is no limit at all on SQLite (one
        // unbounded delete) and an error on PostgreSQL.
        positive(
            "consumer.retention_batch",
            usize::try_from(self.consumer.retention_batch).unwrap_or(0),
        )?;
        positive("outbox.batch_size", self.outbox.batch_size)?;
        positive("outbox.concurrency", self.outbox.concurrency)?;
        positive("outbox.max_attempts", self.outbox.max_attempts as usize)?;
        // Leases are extended every third of a lease while their work runs, so they need not
        // cover the slowest batch; but a one-second lease would be lost to any pause of a third
        // of a second (a slow heartbeat round trip, a stalled runtime), and its work done twice.
        for (key, value) in [
            ("consumer.lease_secs", self.consumer.lease_secs),
            ("outbox.lease_secs", self.outbox.lease_secs),
        ] {
            if value < MIN_LEASE_SECS {
                return Err(invalid(
                    key,
                    format!(
                        "is {value}, below the minimum of {MIN_LEASE_SECS} s: the lease is \
                         extended every third of it, and a shorter one is lost to a pause that \
                         long (its work is then done twice)"
                    ),
                ));
            }
        }
        let window = self.consumer.dedup_window();
        if window.as_secs() < MIN_DEDUP_RETENTION_DAYS * 86_400
            && !self.consumer.allow_short_dedup_retention
        {
            let value = match self.consumer.dedup_window_secs {
                Some(secs) => format!("{secs} s"),
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
        if !(self.stripe.api_base.starts_with("https://")
            || self.stripe.api_base.starts_with("http://"))
        {
            return Err(invalid(
                "stripe.api_base",
                "must be an http(s) URL such as https://api.stripe.com (env STRIPE_API_BASE)",
            ));
        }
        if self.roles.consumer && self.stripe.fetch_thin_events {
            if self.stripe.api_key.expose().is_empty() {
                return Err(invalid(
                    "stripe.api_key",
                    "stripe.fetch_thin_events is on: the consumer fetches each thin event's full \
                     event with Stripe's API; set STRIPE_API_KEY (a key that may read events)",
                ));
            }
            let timeout = self.stripe.api_timeout_ms;
            if timeout == 0 || timeout > self.consumer.step_timeout_ms / 3 {
                return Err(invalid(
                    "stripe.api_timeout_ms",
                    format!(
                        "is {timeout}: it must be above zero and at most a third of \
                         consumer.step_timeout_ms ({}), so a slow API fails its fetch (retried \
                         later) rather than the whole batch",
                        self.consumer.step_timeout_ms
                    ),
                ));
            }
        }
        if self.stripe.api_version.is_empty()
            || !self
                .stripe
                .api_version
                .bytes()
                .all(|b| b.is_ascii_graphic())
        {
            return Err(invalid(
                "stripe.api_version",
                "must be a Stripe API version such as 2026-10-28.endive",
            ));
        }
        if !self.transport.sqs_message_group_pointer.starts_with('/') {
            return Err(invalid(
                "transport.sqs_message_group_pointer",
                "must be a JSON pointer such as /data/object/id",
            ));
        }
        for (key, pointer) in [
            (
                "consumer.stale_guard.object_pointer",
                &self.consumer.stale_guard.object_pointer,
            ),
            (
                "consumer.stale_guard.version_pointer",
                &self.consumer.stale_guard.version_pointer,
            ),
        ] {
            if !pointer.starts_with('/') {
                return Err(invalid(
                    key,
                    "must be a JSON pointer such as /data/object/id",
                ));
            }
        }
        if !self.consumer.dedup_key_pointer.starts_with('/') {
            return Err(invalid(
                "consumer.dedup_key_pointer",
                "must be a JSON pointer such as /id",
            ));
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

fn positive(key: &'static str, value: usize) -> Result<(), ConfigError> {
    if value == 0 {
        Err(invalid(key, "must be greater than zero"))
    } else {
        Ok(())
    }
}
