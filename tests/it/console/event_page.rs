//! An event's page: found by id on `/events` after logging in; a duplicate delivery on it; a
//! dead letter redriven from it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use dedup_worker::Service;
use dedup_worker_core::consumer::{Handler, HandlerError, OutboxMessage};
use dedup_worker_core::event::Event;
use dedup_worker_core::store::DbTx;

use super::browser::{Browser, WAIT};
use super::{console_app, log_in, post_event};
use crate::helpers::{wait_for, Backend, TestDb};

/// The classes of the timeline's items, in order.
async fn timeline(browser: &Browser) -> Vec<String> {
    let mut classes = Vec::new();
    for item in browser.find_all("ol#timeline > li").await {
        let class = item.attr("class").await.ok().flatten().unwrap_or_default();
        classes.push(class);
    }
    classes
}

fn has_class(timeline: &[String], class: &str) -> bool {
    timeline
        .iter()
        .any(|c| c.split_whitespace().any(|one| one == class))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_events_page_shows_handled_and_its_duplicate_delivery() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = console_app(&db, &[], Service::new()).await;
    let id = "evt_console_twice";
    post_event(&app, "evt_console_other", "invoice.paid").await;
    post_event(&app, id, "invoice.paid").await;
    wait_for("the event handled", WAIT, || async {
        let record = app.store.dedup().processed_record("stripe", id).await;
        record.ok().flatten().map(drop)
    })
    .await;
    post_event(&app, id, "invoice.paid").await;
    wait_for("both events delivered (the log sink)", WAIT, || async {
        let counts = app.store.outbox().counts().await.ok()?;
        (counts.dispatched == 2).then_some(())
    })
    .await;
    wait_for("the duplicate recorded", WAIT, || async {
        let dups = app
            .store
            .dedup()
            .duplicates_of("stripe", id, 10)
            .await
            .ok()?;
        (dups.count == 1).then_some(())
    })
    .await;

    let browser = Browser::start().await;
    // The list asks for the token first, and comes back after it.
    log_in(&browser, &app, "/events").await;
    browser.fill("form#search input[name=id]", id).await;
    browser.click_and_wait("form#search [type=submit]").await;
    // Its handling and its duplicate delivery, newest first, each leading to its page.
    let mut outcomes = Vec::new();
    for cell in browser.find_all("table#events tbody tr td.outcome").await {
        outcomes.push(cell.text().await.unwrap_or_default().trim().to_owned());
    }
    assert_eq!(
        outcomes,
        ["duplicate delivery", "handled and delivered"],
        "{}",
        browser.text().await
    );
    for link in browser.find_all("table#events tbody tr a.event").await {
        let href = link.attr("href").await.ok().flatten();
        assert_eq!(
            href.as_deref(),
            Some(format!("/events/stripe/{id}").as_str())
        );
    }
    // Narrowed to its handling by the outcome.
    browser
        .find("form#search select[name=outcome]")
        .await
        .select_by_value("handled")
        .await
        .expect("select an outcome");
    browser.click_and_wait("form#search [type=submit]").await;
    let rows = browser.find_all("table#events tbody tr").await;
    assert_eq!(rows.len(), 1, "{}", browser.text().await);
    assert_eq!(
        browser.text_of("table#events tbody tr td.outcome").await,
        "handled and delivered"
    );
    browser
        .click_and_wait("table#events tbody tr a.event")
        .await;
    assert_eq!(browser.path().await, format!("/events/stripe/{id}"));
    assert_eq!(browser.text_of("#outcome").await, "handled and delivered");
    let items = timeline(&browser).await;
    for class in ["received", "handled", "duplicate"] {
        assert!(has_class(&items, class), "li.{class} in {items:?}");
    }
    assert!(
        browser.has("ol#timeline > li.duplicate").await,
        "{}",
        browser.text().await
    );
    assert!(
        !has_class(&items, "dead_letter"),
        "no dead letter: {items:?}"
    );

    browser.close().await;
    app.stop().await;
    db.remove().await;
}

/// Fails every event fatally while `failing` is set; counts the events it handled.
struct FailWhileSet {
    failing: AtomicBool,
    handled: AtomicUsize,
}

#[dedup_worker::async_trait]
impl Handler for FailWhileSet {
    async fn handle(
        &self,
        event: &Event,
        _tx: &mut DbTx<'_>,
    ) -> Result<Vec<OutboxMessage>, HandlerError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(HandlerError::Fatal("the handler is broken".into()));
        }
        self.handled.fetch_add(1, Ordering::SeqCst);
        Ok(vec![OutboxMessage::forward(event)])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_redriven_from_its_page_ends_handled_on_postgres() {
    let db = TestDb::new(Backend::Postgres).await;
    let handler = Arc::new(FailWhileSet {
        failing: AtomicBool::new(true),
        handled: AtomicUsize::new(0),
    });
    let app = console_app(&db, &[], Service::new().handler(handler.clone())).await;
    let id = "evt_console_poison";
    post_event(&app, id, "charge.failed").await;
    wait_for("the dead letter", WAIT, || async {
        let dead = app
            .store
            .reads()
            .dead_letters_of("stripe", id, 10)
            .await
            .ok()?;
        (!dead.is_empty()).then_some(())
    })
    .await;
    // Fixed.
    handler.failing.store(false, Ordering::SeqCst);

    let browser = Browser::start().await;
    log_in(&browser, &app, "/dead-letters").await;
    let rows = browser.find_all("table#dead-letters tbody tr").await;
    assert_eq!(rows.len(), 1, "{}", browser.text().await);
    let row = rows[0].text().await.unwrap_or_default();
    assert!(row.contains(id), "{row}");
    browser.screenshot("dead-letters").await;

    browser
        .goto(&app.admin_url(&format!("/events/stripe/{id}")))
        .await;
    assert_eq!(browser.text_of("#outcome").await, "dead letter");
    browser
        .click_and_wait("ol#timeline > li.dead_letter form.redrive button[type=submit]")
        .await;
    // Back from the redrive (wherever it leads), the event's page until the consumer has it.
    let page = app.admin_url(&format!("/events/stripe/{id}"));
    let outcome = wait_for("the redriven event handled", WAIT, || {
        let (browser, page) = (&browser, &page);
        async move {
            browser.goto(page).await;
            let outcome = browser.text_of("#outcome").await;
            outcome.starts_with("handled").then_some(outcome)
        }
    })
    .await;
    assert!(outcome.starts_with("handled"), "{outcome}");
    let items = timeline(&browser).await;
    for class in ["received", "redrive", "handled"] {
        assert!(has_class(&items, class), "li.{class} in {items:?}");
    }
    assert_eq!(handler.handled.load(Ordering::SeqCst), 1, "handled once");
    assert!(
        app.store
            .reads()
            .dead_letters_of("stripe", id, 10)
            .await
            .expect("dead letters")
            .is_empty(),
        "the dead letter is gone"
    );
    // Its delivery, dispatched to the log sink.
    wait_for("the outbox row dispatched", WAIT, || async {
        let counts = app.store.outbox().counts().await.ok()?;
        (counts.dispatched == 1).then_some(())
    })
    .await;
    browser.refresh().await;
    browser.find("#outcome").await;
    browser.screenshot("event").await;

    browser.close().await;
    app.stop().await;
    db.remove().await;
}
