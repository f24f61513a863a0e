//! Failed deliveries retried by filter from `/outbox/failed`: a dry run, a confirmation, the
//! recorded action and the banner that says it.

use chrono::{DateTime, Timelike, Utc};
use dedup_worker::Service;
use serde_json::json;

use super::browser::{Browser, WAIT};
use super::{console_app, log_in, outbox_statuses, post_event, Sink};
use crate::helpers::db::execute;
use crate::helpers::{wait_for, Backend, TestDb};

/// `at` floored to its minute, as a browser's `datetime-local` field gives it (UTC here).
fn minute(at: DateTime<Utc>) -> String {
    let floored = at.with_second(0).and_then(|t| t.with_nanosecond(0));
    floored
        .expect("a minute")
        .format("%Y-%m-%dT%H:%M")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_failed_deliveries_retried_by_filter_end_dispatched_after_a_dry_run_of_20() {
    let started = Utc::now();
    let db = TestDb::new(Backend::Sqlite).await;
    let sink = Sink::failing().await;
    let app = console_app(
        &db,
        &[
            ("outbox.sink", json!(sink.url())),
            ("outbox.max_attempts", json!(1)),
            // 24 rows failing for good are under test, not the breaker (it would open after 20
            // and keep the last 4 pending without spending their attempt).
            ("outbox.breaker.failures", json!(0)),
            ("outbox.breaker.window", json!(0)),
        ],
        Service::new(),
    )
    .await;
    // 20 to retry; 2 of the same type from an hour ago and 2 of another type stay failed.
    for n in 0..22 {
        post_event(&app, &format!("evt_console_paid_{n:02}"), "invoice.paid").await;
    }
    for n in 0..2 {
        let id = format!("evt_console_refund_{n}");
        post_event(&app, &id, "charge.refunded").await;
    }
    wait_for("24 failed deliveries", WAIT, || async {
        let counts = app.store.outbox().counts().await.ok()?;
        (counts.failed == 24).then_some(())
    })
    .await;
    execute(
        &app.store,
        "UPDATE outbox SET created_at = created_at - 3600000
         WHERE event_id IN ('evt_console_paid_00', 'evt_console_paid_01')",
    )
    .await;
    let failed_attempts = sink.received();
    assert_eq!(failed_attempts, 24, "one attempt each");
    sink.recover();

    let browser = Browser::start().await;
    log_in(&browser, &app, "/outbox/failed").await;
    let rows = browser.find_all("table#deliveries tbody tr").await;
    assert!(!rows.is_empty(), "{}", browser.text().await);
    for row in &rows {
        let status = row
            .find(fantoccini::Locator::Css("td.status"))
            .await
            .expect("td.status");
        assert_eq!(status.text().await.unwrap_or_default().trim(), "failed");
    }
    // The filter: the type, and since a minute before the test began.
    browser
        .fill("form#filter input[name=type]", "invoice.paid")
        .await;
    let since = minute(started - chrono::Duration::minutes(1));
    browser.fill("form#filter input[name=since]", &since).await;
    browser.click_and_wait("form#filter [type=submit]").await;
    let rows = browser.find_all("table#deliveries tbody tr").await;
    assert!(
        !rows.is_empty() && rows.len() <= 20,
        "{} rows: {}",
        rows.len(),
        browser.text().await
    );
    for row in &rows {
        let text = row.text().await.unwrap_or_default();
        assert!(text.contains("invoice.paid"), "{text}");
        for backdated in ["evt_console_paid_00", "evt_console_paid_01"] {
            assert!(!text.contains(backdated), "{text}");
        }
    }
    browser.screenshot("outbox-failed").await;

    browser.click_and_wait("form#bulk button#dry-run").await;
    assert_eq!(
        browser.text_of("#dry-run-count").await,
        "20",
        "{}",
        browser.text().await
    );
    assert_eq!(
        sink.received(),
        failed_attempts,
        "a dry run retries nothing"
    );
    browser.screenshot("outbox-failed-dry-run").await;
    browser.click_and_wait("form#confirm button#confirm").await;
    assert_eq!(browser.path().await, "/outbox/failed", "back on the list");
    // Which says what was done, by whom, when.
    let done = browser.text_of("#done").await;
    for part in [
        "Retried 20 deliveries (type invoice.paid, since ",
        ") — console, ",
        " UTC",
    ] {
        assert!(done.contains(part), "{part:?} in the banner: {done}");
    }

    wait_for("the 20 retried deliveries dispatched", WAIT, || async {
        let statuses = outbox_statuses(&app.store, "invoice.paid").await;
        let dispatched = statuses.iter().filter(|s| *s == "dispatched").count();
        (dispatched == 20).then_some(())
    })
    .await;
    let paid = outbox_statuses(&app.store, "invoice.paid").await;
    assert_eq!(
        paid.iter().filter(|s| *s == "failed").count(),
        2,
        "the backdated two stay failed: {paid:?}"
    );
    let refunds = outbox_statuses(&app.store, "charge.refunded").await;
    assert_eq!(refunds, ["failed", "failed"], "another type stays failed");
    assert_eq!(sink.received(), failed_attempts + 20, "one delivery each");

    // The action, recorded and shown.
    browser.refresh().await;
    let actions = browser.find_all("table#actions tbody tr").await;
    assert_eq!(actions.len(), 1, "{}", browser.text().await);
    let action = actions[0].text().await.unwrap_or_default();
    for part in ["outbox_retry", "20", "invoice.paid", "console"] {
        assert!(action.contains(part), "{part:?} in the action: {action}");
    }
    // What is left: the four the filter left out.
    let rows = browser.find_all("table#deliveries tbody tr").await;
    assert!(rows.len() <= 4, "{}", browser.text().await);

    // The overview: the queue empty, the failures of the last hour listed.
    browser.goto(&app.admin_url("/")).await;
    browser.find("svg#chart").await;
    assert_eq!(browser.text_of("#queue-depth").await, "0");
    let failures = browser.find_all("table#recent-failures tbody tr").await;
    assert!(!failures.is_empty(), "{}", browser.text().await);
    browser.screenshot("dashboard").await;
    browser.goto(&app.admin_url("/events")).await;
    browser.find("table#events").await;
    browser.screenshot("events").await;

    browser.close().await;
    app.stop().await;
    db.remove().await;
}
