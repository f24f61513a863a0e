//! The commands that read the store and then exit: `sign` and `backfill` (`events` is in
//! `events`, `dlq` and `outbox` are in `repair`), and what they share. None of them runs the
//! handler.

use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;

use crate::backfill::{self, BackfillLimits, BackfillRange};
use crate::config::Settings;
use crate::signature::stripe::signature_header;
use crate::startup::build_transport;
use crate::store::{Store, Wakeups};
use crate::stripe::StripeApi;

/// A `--since`/`--until` value as Unix seconds.
pub(super) fn parse_time(value: &str) -> Result<i64, String> {
    if let Ok(secs) = value.parse::<i64>() {
        return Ok(secs);
    }
    if let Ok(at) = chrono::DateTime::parse_from_rfc3339(value) {
        return Ok(at.timestamp());
    }
    chrono::NaiveDate::parse_from_str(value, "%Y-%m-%d")
        .ok()
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|d| d.and_utc().timestamp())
        .ok_or_else(|| {
            format!("{value:?} is not RFC 3339 (2026-11-01T00:00:00Z), a date or Unix seconds")
        })
}

/// `sign`: prints the `Stripe-Signature` header for the file (or its thin event).
pub(super) fn sign(
    secret: &str,
    timestamp: Option<i64>,
    thin_event: Option<&Path>,
    file: &Path,
) -> anyhow::Result<()> {
    let mut payload = if file.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .context("reading stdin")?;
        buf
    } else {
        std::fs::read(file).with_context(|| format!("reading {}", file.display()))?
    };
    if let Some(out) = thin_event {
        payload = crate::stripe::thin_event_beside(&payload)
            .context("--thin-event: FILE must be a Stripe snapshot event")?;
        std::fs::write(out, &payload).with_context(|| format!("writing {}", out.display()))?;
    }
    let t = timestamp.unwrap_or_else(|| chrono::Utc::now().timestamp());
    println!("{}", signature_header(secret, t, &payload));
    Ok(())
}

/// `backfill`: lists Stripe's events in the range and publishes those not processed yet.
pub(super) async fn backfill(
    config: Option<PathBuf>,
    since: i64,
    until: Option<i64>,
    types: Vec<String>,
) -> anyhow::Result<()> {
    let settings = store_settings(config)?;
    anyhow::ensure!(
        !settings.stripe.api_key.expose().is_empty(),
        "backfill lists events with Stripe's API: set STRIPE_API_KEY (stripe.api_key)"
    );
    let store = Store::connect(&settings).await?;
    let transport = build_transport(&settings, &store, Arc::new(Wakeups::default())).await;
    let api = StripeApi::new(
        &settings.stripe.api_base,
        settings.stripe.api_key.clone(),
        &settings.stripe.api_version,
        backfill::REQUEST_TIMEOUT,
    )?;
    let range = BackfillRange {
        since,
        until,
        types,
    };
    let on_terminal = std::io::stderr().is_terminal();
    let summary = backfill::backfill(
        &api,
        &range,
        &store,
        transport.as_ref(),
        BackfillLimits {
            publish_timeout: settings.transport.publish_timeout,
            max_page_bytes: backfill::page_limit(settings.consumer.max_message_bytes),
        },
        |s| {
            let line = format!(
                "backfill: page {}, listed {}, enqueued {}, already processed {}",
                s.pages, s.listed, s.enqueued, s.already_processed
            );
            // A line rewritten in place on a terminal; one line per page otherwise.
            if on_terminal {
                eprint!("\r{line}");
            } else {
                eprintln!("{line}");
            }
        },
    )
    .await;
    if on_terminal {
        eprintln!();
    }
    let summary = summary?;
    println!("{}", serde_json::to_string(&summary)?);
    Ok(())
}

/// Loads settings for commands that only need the store (no secret required).
pub(super) async fn connect(config: Option<PathBuf>) -> anyhow::Result<Store> {
    Ok(Store::connect(&store_settings(config)?).await?)
}

/// Settings without the ingress role, which is what requires a webhook secret.
pub(super) fn store_settings(config: Option<PathBuf>) -> anyhow::Result<Settings> {
    let figment = Settings::figment(config.as_deref()).merge(("roles.ingress", false));
    Ok(Settings::from_figment(figment)?)
}
