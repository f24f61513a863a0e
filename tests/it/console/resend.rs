//! A delivered row is re-sent only once asked twice: the first click shows what was delivered,
//! when and where, and sends nothing; the confirmation re-sends it and the event's page says
//! what was done.

use dedup_worker::Service;
use serde_json::json;

use super::browser::{Browser, WAIT};
use super::{console_app, log_in, post_event, Sink};
use crate::helpers::{wait_for, Backend, TestDb};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_send_asks_first_and_says_what_it_did() {
    let db = TestDb::new(Backend::Sqlite).await;
    let sink = Sink::failing().await;
    sink.recover();
    let app = console_app(&db, &[("outbox.sink", json!(sink.url()))], Service::new()).await;
    let id = "evt_resend_once";
    post_event(&app, id, "invoice.paid").await;
    wait_for("the delivery dispatched", WAIT, || async {
        let counts = app.store.outbox().counts().await.ok()?;
        (counts.dispatched == 1 && sink.received() == 1).then_some(())
    })
    .await;
    let row = app
        .store
        .reads()
        .outbox_of("stripe", id, 10)
        .await
        .expect("the row")[0]
        .id;

    let browser = Browser::start().await;
    let page = format!("/events/stripe/{id}");
    log_in(&browser, &app, &page).await;
    browser
        .click_and_wait("ol#timeline form.resend button[type=submit]")
        .await;
    assert_eq!(
        browser.text_of("h1").await,
        format!("Re-send delivery {row}?")
    );
    let question = browser.text_of("#question").await;
    for part in [
        format!("Delivery {row} was delivered at "),
        // The row names no sink of its own: the configured default (outbox.sink).
        "UTC".to_owned(),
        " to the default sink; re-send it".to_owned(),
    ] {
        assert!(question.contains(&part), "{part:?} in {question}");
    }
    assert_eq!(sink.received(), 1, "asking sends nothing");

    browser.click_and_wait("form#confirm button#confirm").await;
    assert_eq!(browser.path().await, page, "back on the event's page");
    let done = browser.text_of("#done").await;
    assert!(
        done.starts_with(&format!("Re-sent 1 delivery (row {row}) — console, ")),
        "{done}"
    );
    assert!(done.contains(" UTC"), "{done}");
    wait_for("the delivery sent again", WAIT, || async {
        (sink.received() == 2).then_some(())
    })
    .await;
    browser.close().await;
    app.stop().await;
    db.remove().await;
}
