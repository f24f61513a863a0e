//! Search by what an event is about: a customer's events found on `/events` in the browser,
//! only theirs, each event page showing its kept body; by object id and by id prefix too; an
//! impossible prefix refused by name; and the search's keyset pages walked older, then newer
//! back, at two a page.

use std::collections::BTreeSet;

use dedup_worker::Service;
use dedup_worker_core::inspect::{search_events, EventQuery, ListOptions, Total};
use dedup_worker_core::store::Store;
use dedup_worker_core::testing::stripe_event_with;
use serde_json::{json, Value};

use super::browser::{Browser, WAIT};
use super::{console_app, log_in};
use crate::helpers::{post_signed, wait_for, Backend, TestApp, TestDb};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_by_customer_finds_that_customers_events_with_their_bodies_postgres() {
    a_search_by_customer_finds_that_customers_events_with_their_bodies(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_by_customer_finds_that_customers_events_with_their_bodies_sqlite() {
    a_search_by_customer_finds_that_customers_events_with_their_bodies(Backend::Sqlite).await;
}

/// The events: `(id, type, data.object)`. Customer `cus_A` has four (three about invoices, one
/// a `customer.*` event whose object is the customer itself), `cus_B` two.
fn events() -> Vec<(&'static str, &'static str, Value)> {
    let invoice = |id: &str, customer: &str, amount: i64| json!({"id": id, "object": "invoice", "customer": customer, "amount_due": amount});
    vec![
        (
            "evt_srch_a1",
            "invoice.created",
            invoice("in_A1", "cus_A", 1200),
        ),
        (
            "evt_srch_b1",
            "invoice.created",
            invoice("in_B1", "cus_B", 1200),
        ),
        (
            "evt_srch_a2",
            "invoice.paid",
            invoice("in_A1", "cus_A", 1200),
        ),
        (
            "evt_srch_a3",
            "customer.updated",
            json!({"id": "cus_A", "object": "customer", "email": "a@example.com"}),
        ),
        (
            "evt_srch_b2",
            "customer.created",
            json!({"id": "cus_B", "object": "customer", "email": "b@example.com"}),
        ),
        (
            "evt_srch_a4",
            "invoice.created",
            invoice("in_A2", "cus_A", 900),
        ),
    ]
}

async fn post_all(app: &TestApp) {
    let client = reqwest::Client::new();
    for (id, event_type, object) in events() {
        let response = post_signed(
            &client,
            &app.url("/webhooks/stripe"),
            dedup_worker::testing::TEST_SECRET,
            stripe_event_with(id, event_type, object),
        )
        .await
        .expect("post the event");
        assert_eq!(response.status(), 200, "{id} accepted");
    }
    wait_for("every body kept", WAIT, || async {
        for (id, _, _) in events() {
            app.store.bodies().kept("stripe", id).await.ok()??;
        }
        Some(())
    })
    .await;
}

/// The ids the results table links to, and where.
async fn results(browser: &Browser) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for link in browser.find_all("table#events a.event").await {
        let id = link.text().await.unwrap_or_default();
        let href = link.attr("href").await.ok().flatten().unwrap_or_default();
        found.push((id, href));
    }
    found
}

fn ids(found: &[(String, String)]) -> BTreeSet<String> {
    found.iter().map(|(id, _)| id.clone()).collect()
}

fn set(ids: &[&str]) -> BTreeSet<String> {
    ids.iter().map(|id| (*id).to_owned()).collect()
}

/// Searches `/events` for `value` typed into the form's field `name`.
async fn search(browser: &Browser, name: &str, value: &str) {
    for field in ["id", "customer", "object"] {
        browser
            .fill(&format!("form#search input[name={field}]"), "")
            .await;
    }
    browser
        .fill(&format!("form#search input[name={name}]"), value)
        .await;
    browser.click_and_wait("form#search [type=submit]").await;
}

async fn a_search_by_customer_finds_that_customers_events_with_their_bodies(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = console_app(&db, &[], Service::new()).await;
    post_all(&app).await;

    let browser = Browser::start().await;
    log_in(&browser, &app, "/events").await;
    search(&browser, "customer", "cus_A").await;
    let found = results(&browser).await;
    assert_eq!(
        ids(&found),
        set(&["evt_srch_a1", "evt_srch_a2", "evt_srch_a3", "evt_srch_a4"]),
        "{}",
        browser.text().await
    );
    assert_eq!(browser.text_of("#total").await, "4 found");
    for (id, href) in &found {
        browser.goto(&app.admin_url(href)).await;
        let body: Value = serde_json::from_str(&browser.text_of("pre#body").await)
            .unwrap_or_else(|e| panic!("{id}'s page shows its body as JSON: {e}"));
        assert_eq!(body["id"], json!(id));
        let object = &body["data"]["object"];
        assert!(
            object["customer"] == json!("cus_A")
                || (object["object"] == json!("customer") && object["id"] == json!("cus_A")),
            "{id}: {body}"
        );
    }

    browser.goto(&app.admin_url("/events")).await;
    search(&browser, "object", "in_A1").await;
    assert_eq!(
        ids(&results(&browser).await),
        set(&["evt_srch_a1", "evt_srch_a2"]),
        "{}",
        browser.text().await
    );
    assert_eq!(browser.text_of("#total").await, "2 found");

    search(&browser, "id", "evt_srch_b*").await;
    assert_eq!(
        ids(&results(&browser).await),
        set(&["evt_srch_b1", "evt_srch_b2"]),
        "{}",
        browser.text().await
    );

    // Three characters before the `*` would read nearly every body: refused, by its field.
    search(&browser, "id", "evt*").await;
    let text = browser.text().await;
    assert!(text.contains("id: "), "{text}");
    assert!(text.contains("at least 4 characters"), "{text}");
    assert!(browser.has("form#search").await, "{text}");
    // Dead letters keep no search fields: a customer search of them is refused, not empty.
    browser
        .goto(&app.admin_url("/events?customer=cus_A&outcome=dead_letter"))
        .await;
    let text = browser.text().await;
    assert!(text.contains("outcome: a search by customer"), "{text}");
    browser
        .goto(&app.admin_url("/events?customer=cus_A&after=junk"))
        .await;
    let text = browser.text().await;
    assert!(text.contains("after: the cursor"), "{text}");

    browser.close().await;
    walk_the_pages_both_ways(&app.store).await;
    app.stop().await;
    db.remove().await;
}

/// `cus_A`'s four events at two a page: the first page, the older one (the last), then the
/// newer one from there is the first again.
async fn walk_the_pages_both_ways(store: &Store) {
    let options = ListOptions {
        statement_timeout: std::time::Duration::from_secs(10),
        sources: vec!["stripe".into()],
        default_source: "stripe".into(),
        database_queue: true,
    };
    let query = EventQuery {
        customer: Some("cus_A".into()),
        limit: 2,
        ..EventQuery::default()
    };
    let first = search_events(store, &query, &options)
        .await
        .expect("page 1");
    assert_eq!(first.total, Some(Total::Exactly(4)));
    assert_eq!(first.previous, None, "nothing is newer than the first page");
    let older = search_events(
        store,
        &EventQuery {
            cursor: first.next.clone(),
            ..query.clone()
        },
        &options,
    )
    .await
    .expect("page 2");
    assert_eq!(older.next, None, "four events: two pages");
    let names = |page: &dedup_worker_core::inspect::EventPage| -> Vec<String> {
        page.events.iter().map(|e| e.event_id.clone()).collect()
    };
    let mut all = names(&first);
    all.extend(names(&older));
    assert_eq!(
        all.iter().cloned().collect::<BTreeSet<_>>(),
        set(&["evt_srch_a1", "evt_srch_a2", "evt_srch_a3", "evt_srch_a4"])
    );
    let mut times: Vec<i64> = first.events.iter().map(|e| e.at_ms).collect();
    times.extend(older.events.iter().map(|e| e.at_ms));
    assert!(
        times.windows(2).all(|w| w[0] >= w[1]),
        "newest first: {times:?}"
    );
    let newer = search_events(
        store,
        &EventQuery {
            before: older.previous.clone(),
            ..query.clone()
        },
        &options,
    )
    .await
    .expect("back to page 1");
    assert_eq!(names(&newer), names(&first), "back where it began");
    assert_eq!(newer.previous, None, "the first page again: nothing newer");
    assert_eq!(newer.next, first.next);
}
