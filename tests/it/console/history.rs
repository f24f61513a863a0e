//! The overview's history does not change: a past minute's counts read from `table#minutes` are
//! the same after the dead letters are redriven and the failed deliveries retried from the
//! console; the new activity lands in the minutes after. And the page's self-refresh toggles.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dedup_worker::Service;
use dedup_worker_core::consumer::{Handler, HandlerError, OutboxMessage};
use dedup_worker_core::event::Event;
use dedup_worker_core::store::{DbTx, Store};
use serde_json::json;

use super::browser::{Browser, WAIT};
use super::{console_app, log_in, post_event, Sink};
use crate::helpers::db::wait_for_outbox;
use crate::helpers::{wait_for, Backend, TestDb};

/// Events handled for the first time (each forwarded once to the failing sink).
const HANDLED: usize = 20;
/// Of those, posted a second time: duplicates.
const TWICE: usize = 4;
/// Events the handler dead-letters until it is fixed (posted once each).
const POISON: usize = 3;

/// Dead-letters `evt_poison_*` fatally while `failing` is set; forwards everything else.
struct PoisonWhileSet {
    failing: AtomicBool,
}

#[dedup_worker::async_trait]
impl Handler for PoisonWhileSet {
    async fn handle(
        &self,
        event: &Event,
        _tx: &mut DbTx<'_>,
    ) -> Result<Vec<OutboxMessage>, HandlerError> {
        if event.id.starts_with("evt_poison_") && self.failing.load(Ordering::SeqCst) {
            return Err(HandlerError::Fatal("poisoned".into()));
        }
        Ok(vec![OutboxMessage::forward(event)])
    }
}

/// A cell of `table#minutes`: `(data-minute, data-series)`.
type Cell = (i64, String);

/// The overview's `table#minutes` (opened first): its non-zero cells, and the minute still
/// counting (the row marked so), if listed.
async fn read_minutes(browser: &Browser) -> (BTreeMap<Cell, i64>, Option<i64>) {
    browser
        .find("details#minutes-details summary")
        .await
        .click()
        .await
        .expect("open the table");
    browser.find("table#minutes").await;
    let mut cells = BTreeMap::new();
    let mut counting = None;
    for row in browser.find_all("table#minutes tbody tr").await {
        let minute: i64 = attr(&row, "data-minute")
            .await
            .parse()
            .expect("data-minute");
        if attr(&row, "class")
            .await
            .split_whitespace()
            .any(|c| c == "counting")
        {
            counting = Some(minute);
        }
        for cell in row
            .find_all(fantoccini::Locator::Css("td[data-series]"))
            .await
            .expect("cells")
        {
            let text = cell.text().await.unwrap_or_default();
            let n: i64 = text.trim().parse().expect("a count");
            if n != 0 {
                cells.insert((minute, attr(&cell, "data-series").await), n);
            }
        }
    }
    (cells, counting)
}

/// The attribute `name` of `element` (empty when it has none).
async fn attr(element: &fantoccini::elements::Element, name: &str) -> String {
    element.attr(name).await.ok().flatten().unwrap_or_default()
}

/// Each series' total over `cells`.
fn totals(cells: &BTreeMap<Cell, i64>) -> BTreeMap<String, i64> {
    let mut totals = BTreeMap::new();
    for ((_, series), n) in cells {
        *totals.entry(series.clone()).or_default() += n;
    }
    totals
}

fn expected(pairs: &[(&str, usize)]) -> BTreeMap<String, i64> {
    pairs
        .iter()
        .map(|(series, n)| ((*series).to_owned(), *n as i64))
        .collect()
}

/// The database's current minute, Unix ms.
async fn database_minute(store: &Store) -> i64 {
    let pool = store.postgres_pool().expect("PostgreSQL");
    sqlx::query_scalar("SELECT (extract(epoch FROM date_trunc('minute', now())) * 1000)::int8")
        .fetch_one(pool)
        .await
        .expect("now()")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_past_minutes_counts_are_the_same_before_and_after_a_bulk_retry() {
    let db = TestDb::new(Backend::Postgres).await;
    let sink = Sink::failing().await;
    let handler = Arc::new(PoisonWhileSet {
        failing: AtomicBool::new(true),
    });
    let app = console_app(
        &db,
        &[
            ("outbox.sink", json!(sink.url())),
            ("outbox.max_attempts", json!(1)),
            // Rows failing for good are under test, not the breaker.
            ("outbox.breaker.failures", json!(0)),
            ("outbox.breaker.window", json!(0)),
        ],
        Service::new().handler(handler.clone()),
    )
    .await;
    for n in 0..HANDLED {
        post_event(&app, &format!("evt_history_{n:02}"), "invoice.paid").await;
    }
    for n in 0..POISON {
        post_event(&app, &format!("evt_poison_{n}"), "charge.failed").await;
    }
    let posted_twice: Vec<String> = (0..TWICE).map(|n| format!("evt_history_{n:02}")).collect();
    // The second deliveries after the first are handled: duplicates, not new events.
    wait_for_outbox(&app.store, "every delivery failed", WAIT, |c| {
        c.failed == HANDLED as i64
    })
    .await;
    for id in &posted_twice {
        post_event(&app, id, "invoice.paid").await;
    }
    wait_for("the duplicates recorded", WAIT, || async {
        for id in &posted_twice {
            let dups = app.store.dedup().duplicates_of("stripe", id, 10).await;
            (dups.ok()?.count == 1).then_some(())?;
        }
        Some(())
    })
    .await;
    wait_for("the dead letters", WAIT, || async {
        let dead = app.store.dead_letters().list(10).await.ok()?;
        (dead.len() == POISON).then_some(())
    })
    .await;
    // Everything so far is in minutes that have begun; wait for the next one, so they are past.
    let last_active = database_minute(&app.store).await;
    wait_for("the next minute", Duration::from_secs(70), || async {
        (database_minute(&app.store).await > last_active).then_some(())
    })
    .await;

    let browser = Browser::start().await;
    log_in(&browser, &app, "/").await;
    // The overview reloads itself unless told not to; the link says which and toggles it.
    let refresh = browser.find("meta[http-equiv=refresh]").await;
    assert_eq!(
        refresh.attr("content").await.ok().flatten().as_deref(),
        Some("15")
    );
    // The database is new: counting began within the hour, and the page says so.
    assert!(
        browser
            .text_of("#counting-since")
            .await
            .contains("Counting since"),
        "{}",
        browser.text().await
    );
    browser.click_and_wait("a#refresh-toggle").await;
    assert!(browser.url().await.ends_with("/?refresh=off"));
    assert!(!browser.has("meta[http-equiv=refresh]").await);
    let (before, counting) = read_minutes(&browser).await;
    assert_eq!(counting, None, "nothing counted in the minute now");
    // Each delivery failed its only attempt (`max_attempts = 1`): given up, none delivered.
    assert_eq!(
        totals(&before),
        expected(&[
            ("handled", HANDLED),
            ("duplicates", TWICE),
            ("dead_lettered", POISON),
            ("outbox_written", HANDLED),
            ("gave_up", HANDLED),
        ]),
        "{before:?}"
    );

    // Fixed: the handler and the receiver. Redrive every dead letter, retry every failed
    // delivery, each from its page: dry run, then confirm.
    handler.failing.store(false, Ordering::SeqCst);
    sink.recover();
    for (page, rows) in [("/dead-letters", POISON), ("/outbox/failed", HANDLED)] {
        browser.goto(&app.admin_url(page)).await;
        browser.click_and_wait("form#bulk button#dry-run").await;
        assert_eq!(
            browser.text_of("#dry-run-count").await,
            rows.to_string(),
            "{}",
            browser.text().await
        );
        browser.click_and_wait("form#confirm button#confirm").await;
    }
    wait_for_outbox(
        &app.store,
        "the retried and the redriven delivered",
        WAIT,
        |c| c.dispatched == (HANDLED + POISON) as i64,
    )
    .await;

    browser.goto(&app.admin_url("/?refresh=off")).await;
    let (after, _) = read_minutes(&browser).await;
    let (past, new): (BTreeMap<_, _>, BTreeMap<_, _>) = after
        .into_iter()
        .partition(|((minute, _), _)| before.keys().any(|(m, _)| m == minute));
    assert_eq!(past, before, "the past minutes' rows, unchanged");
    assert!(
        new.keys().all(|(minute, _)| *minute > last_active),
        "the new activity after the minute turned: {new:?}"
    );
    assert_eq!(
        totals(&new),
        expected(&[
            ("handled", POISON),
            ("redriven", POISON),
            ("outbox_written", POISON),
            ("retried", HANDLED),
            ("delivered", HANDLED + POISON),
        ]),
        "{new:?}"
    );

    browser.close().await;
    app.stop().await;
    db.remove().await;
}
