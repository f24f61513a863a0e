//! The pages fit the window: an event page with the longest id an event can have (255 bytes)
//! and `/outbox/failed` with long errors and destinations are no wider than the window at 1280
//! and at 800 px. Times are UTC, with the browser's own zone after them (chromium in Tokyo).

use dedup_worker::Service;
use serde_json::json;

use super::browser::{Browser, WAIT};
use super::{console_app, log_in, post_event, Sink};
use crate::helpers::db::execute;
use crate::helpers::{wait_for, Backend, TestDb};

/// The page's width and the window's, in CSS pixels.
async fn widths(browser: &Browser) -> (i64, i64) {
    let script = "return [document.documentElement.scrollWidth, window.innerWidth]";
    let both = browser
        .client
        .execute(script, vec![])
        .await
        .expect("the widths");
    let width = |i: usize| both[i].as_i64().expect("a width");
    (width(0), width(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_ids_and_tables_fit_the_window() {
    let db = TestDb::new(Backend::Sqlite).await;
    let sink = Sink::failing().await;
    // A long destination: the receiver's path (any answer but 2xx fails the delivery).
    let destination = format!("{}/{}", sink.url(), "receiver-path-".repeat(12));
    let app = console_app(
        &db,
        &[
            ("outbox.sink", json!(destination)),
            ("outbox.max_attempts", json!(1)),
            ("outbox.breaker.failures", json!(0)),
            ("outbox.breaker.window", json!(0)),
        ],
        Service::new(),
    )
    .await;
    let long_id = format!("evt_{}", "x".repeat(251));
    assert_eq!(long_id.len(), 255);
    post_event(&app, &long_id, "invoice.paid").await;
    post_event(&app, "evt_layout_short", "invoice.paid").await;
    wait_for("two failed deliveries", WAIT, || async {
        let counts = app.store.outbox().counts().await.ok()?;
        (counts.failed == 2).then_some(())
    })
    .await;
    // A long error without a space to break at (a receiver's body, a chain of causes).
    let error = "connection-refused:".repeat(60);
    execute(
        &app.store,
        &format!("UPDATE outbox SET last_error = '{error}'"),
    )
    .await;

    let browser = Browser::start().await;
    log_in(&browser, &app, "/outbox/failed").await;
    let pages = [
        format!("/events/stripe/{long_id}"),
        "/outbox/failed".to_owned(),
        "/events".to_owned(),
    ];
    for (width, height) in [(1280, 900), (800, 900)] {
        browser
            .client
            .set_window_size(width, height)
            .await
            .expect("resize the window");
        for page in &pages {
            browser.goto(&app.admin_url(page)).await;
            browser.find("main h1").await;
            let (scroll, inner) = widths(&browser).await;
            assert!(
                scroll <= inner,
                "{page} at {width} px is {scroll} px wide in a {inner} px window"
            );
        }
    }
    browser.close().await;
    app.stop().await;
    db.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn times_show_utc_and_the_browsers_zone() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = console_app(&db, &[], Service::new()).await;
    let id = "evt_layout_tokyo";
    post_event(&app, id, "invoice.paid").await;
    wait_for("the event handled", WAIT, || async {
        let record = app.store.dedup().processed_record("stripe", id).await;
        record.ok().flatten().map(drop)
    })
    .await;
    let browser = Browser::start_in_zone("Asia/Tokyo").await;
    log_in(&browser, &app, &format!("/events/stripe/{id}")).await;
    let times = browser.find_all("ol#timeline time").await;
    assert!(!times.is_empty(), "{}", browser.text().await);
    let locals = browser.find_all("ol#timeline time + span.local").await;
    assert_eq!(locals.len(), times.len(), "a local time after each");
    for (time, local) in times.iter().zip(&locals) {
        let datetime = time
            .attr("datetime")
            .await
            .ok()
            .flatten()
            .expect("datetime");
        let at = chrono::DateTime::parse_from_rfc3339(&datetime).expect("RFC 3339");
        let utc = time.text().await.unwrap_or_default();
        assert_eq!(utc, at.format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string());
        let tokyo = at + chrono::Duration::hours(9);
        let expected = tokyo
            .format("(%Y-%m-%d %H:%M:%S local, UTC+09:00)")
            .to_string();
        assert_eq!(local.text().await.unwrap_or_default().trim(), expected);
    }
    browser.close().await;
    app.stop().await;
    db.remove().await;
}
