//! The console's rough edges, through HTTP with the Bearer token (and one browser check): a
//! control character in any filter field of any page is a 400 naming the field, never a 503;
//! a bad filter's page keeps the form as typed and the session's form token; an unknown event is
//! a 404 and an impossible id a 400; a failed read shows a reference, not the error; the list and
//! the page tell the same story; a dead letter of an event handled since offers no redrive; a
//! dead letter without an event id has a page of its own with its payload.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use dedup_worker::testing::TestApp;
use dedup_worker::Service;
use dedup_worker_core::consumer::{Handler, HandlerError, OutboxMessage};
use dedup_worker_core::event::Event;
use dedup_worker_core::store::{DbTx, NewDeadLetter};
use reqwest::header::{AUTHORIZATION, COOKIE, LOCATION, SET_COOKIE};
use reqwest::StatusCode;

use super::browser::{Browser, WAIT};
use super::{console_app, log_in, post_event, store_state, TOKEN};
use crate::helpers::db::execute;
use crate::helpers::{wait_for, Backend, TestDb};

fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a client")
}

/// `GET path` with the Bearer token: the status and the page.
pub async fn get(app: &TestApp, path: &str) -> (StatusCode, String) {
    let response = no_redirects()
        .get(app.admin_url(path))
        .header(AUTHORIZATION, format!("Bearer {TOKEN}"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let status = response.status();
    (status, response.text().await.expect("the page"))
}

/// `POST path` with the Bearer token and `form`.
pub async fn post(app: &TestApp, path: &str, form: &[(&str, &str)]) -> (StatusCode, String) {
    let response = no_redirects()
        .post(app.admin_url(path))
        .header(AUTHORIZATION, format!("Bearer {TOKEN}"))
        .form(form)
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {path}: {e}"));
    let status = response.status();
    (status, response.text().await.expect("the page"))
}

/// The text of the element `<tag … id="id" …>…</tag>` (no nesting of the same tag inside).
pub fn element_text(page: &str, tag: &str, id: &str) -> Option<String> {
    let start = page.find(&format!(" id=\"{id}\""))?;
    let open_end = start + page[start..].find('>')? + 1;
    let close = open_end + page[open_end..].find(&format!("</{tag}>"))?;
    Some(strip_tags(&page[open_end..close]))
}

fn strip_tags(html: &str) -> String {
    let mut text = String::new();
    let mut inside = false;
    for c in html.chars() {
        match c {
            '<' => inside = true,
            '>' => inside = false,
            c if !inside => text.push(c),
            _ => {}
        }
    }
    text
}

/// Fails every event whose id starts with `evt_poison` fatally while `failing` is set.
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
        if event.id.starts_with("evt_poison") && self.failing.load(Ordering::SeqCst) {
            return Err(HandlerError::Fatal("the handler is broken".into()));
        }
        Ok(vec![OutboxMessage::forward(event)])
    }
}

/// Every page that takes a filter, and each action that takes one.
const FILTERED_PAGES: [&str; 3] = ["/events", "/dead-letters", "/outbox/failed"];
const FILTERED_ACTIONS: [&str; 2] = ["/dead-letters/redrive", "/outbox/failed/retry"];
const FILTER_FIELDS: [&str; 10] = [
    "id", "type", "source", "since", "until", "outcome", "customer", "object", "after", "before",
];

async fn a_nul_in_any_filter_is_a_400(backend: Backend) {
    let db = TestDb::new(backend).await;
    let app = console_app(&db, &[], Service::new()).await;
    post_event(&app, "evt_rough_one", "invoice.paid").await;
    wait_for("the event delivered", WAIT, || async {
        let counts = app.store.outbox().counts().await.ok()?;
        (counts.dispatched == 1).then_some(())
    })
    .await;
    let before = store_state(&app.store).await;
    let named = |field: &str| format!("{field}: contains the control character U+0000");
    for path in FILTERED_PAGES {
        for field in FILTER_FIELDS {
            let (status, page) = get(&app, &format!("{path}?{field}=a%00b")).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {field}: {page}");
            assert!(page.contains(&named(field)), "{path} {field}: {page}");
        }
    }
    for path in FILTERED_ACTIONS {
        for field in ["type", "since", "until"] {
            for confirm in ["", "yes"] {
                let form = [(field, "a\0b"), ("confirm", confirm)];
                let (status, page) = post(&app, path, &form).await;
                assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {field}: {page}");
                assert!(page.contains(&named(field)), "{path} {field}: {page}");
            }
        }
    }
    assert_eq!(store_state(&app.store).await, before, "nothing acted on");
    app.stop().await;
    db.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_in_any_filter_of_any_page_is_a_400_on_postgres() {
    a_nul_in_any_filter_is_a_400(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_in_any_filter_of_any_page_is_a_400_on_sqlite() {
    a_nul_in_any_filter_is_a_400(Backend::Sqlite).await;
}

/// A session cookie (`name=value`) from the login form.
async fn session(app: &TestApp) -> String {
    let response = no_redirects()
        .post(app.admin_url("/login"))
        .form(&[("token", TOKEN), ("name", "ops"), ("next", "/events")])
        .send()
        .await
        .expect("log in");
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let set = response.headers()[SET_COOKIE].to_str().expect("a cookie");
    set.split(';').next().expect("name=value").to_owned()
}

/// The value of the page's first `name="csrf"` field.
fn csrf_of(page: &str) -> String {
    let at = page.find("name=\"csrf\" value=\"").expect("a csrf field") + 19;
    page[at..].split('"').next().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_filter_keeps_the_form_and_what_was_typed() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = console_app(&db, &[], Service::new()).await;
    let cookie = session(&app).await;
    let http = no_redirects();
    let response = http
        .get(app.admin_url("/events?id=evt_typed&type=invoice.&since=yesterday"))
        .header(COOKIE, &cookie)
        .send()
        .await
        .expect("the page");
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let page = response.text().await.expect("the page");
    let form = page
        .split("<form id=\"search\"")
        .nth(1)
        .expect("form#search on the error page");
    for typed in [
        "name=\"id\" value=\"evt_typed\"",
        "name=\"type\" value=\"invoice.\"",
        "name=\"since\" value=\"yesterday\"",
    ] {
        assert!(form.contains(typed), "{typed} in {form}");
    }
    assert!(page.contains("since: "), "the field named: {page}");
    let (status, list) = get(&app, "/outbox/failed?type=charge.&until=%1b").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(list.contains("<form id=\"filter\""), "{list}");
    assert!(list.contains("name=\"type\" value=\"charge.\""), "{list}");

    // The page carries the session's form token: logging out from it works.
    let csrf = csrf_of(&page);
    assert!(!csrf.is_empty(), "a form token on the error page");
    let out = http
        .post(app.admin_url("/logout"))
        .header(COOKIE, &cookie)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .expect("log out");
    assert_eq!(out.status(), StatusCode::SEE_OTHER, "logged out");
    assert_eq!(out.headers()[LOCATION], "/login");
    app.stop().await;
    db.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_event_is_a_404_and_an_impossible_id_a_400() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = console_app(&db, &[], Service::new()).await;
    let (status, page) = get(&app, "/events/stripe/evt_never_sent").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{page}");
    assert!(page.contains("Nothing recorded of"), "{page}");
    let form = page
        .split("<form id=\"search\"")
        .nth(1)
        .expect("form#search");
    assert!(
        form.contains("name=\"id\" value=\"evt_never_sent\""),
        "{form}"
    );
    // The longest id an event can have is a page (404 here); one byte more, or a control
    // character, is no event's.
    let longest = "a".repeat(255);
    let (status, _) = get(&app, &format!("/events/stripe/{longest}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    for path in [
        format!("/events/stripe/{longest}a"),
        "/events/stripe/evt%00nul".to_owned(),
        "/events/st%0Aripe/evt_1".to_owned(),
    ] {
        let (status, page) = get(&app, &path).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {page}");
        assert!(page.contains("No event can have this path"), "{page}");
    }
    app.stop().await;
    db.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_read_shows_a_reference_and_not_the_error() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = console_app(&db, &[], Service::new()).await;
    execute(&app.store, "DROP TABLE admin_actions").await;
    let (status, page) = get(&app, "/dead-letters").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{page}");
    let reference = element_text(&page, "code", "reference").expect("a reference");
    assert_eq!(reference.len(), 12, "{reference}");
    for inner in [
        "admin_actions",
        "no such table",
        "error returned from database",
    ] {
        assert!(!page.contains(inner), "{inner:?} on the page: {page}");
    }
    app.stop().await;
    db.remove().await;
}

/// The story cells of `/events?id=ID`, and the story on the event's page.
async fn stories(app: &TestApp, id: &str) -> (Vec<String>, String) {
    let (_, list) = get(app, &format!("/events?id={id}")).await;
    // Each cell is `<td class="outcome s-NAME">LABEL</td>`.
    let cells = list
        .split("<td class=\"outcome ")
        .skip(1)
        .filter_map(|cell| cell.split('>').nth(1)?.split('<').next())
        .map(|label| label.trim().to_owned())
        .collect::<Vec<_>>();
    let (_, page) = get(app, &format!("/events/stripe/{id}")).await;
    let story = element_text(&page, "strong", "outcome").expect("#outcome");
    (cells, story)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_are_the_same_on_the_list_and_the_page() {
    let db = TestDb::new(Backend::Sqlite).await;
    let handler = Arc::new(PoisonWhileSet {
        failing: AtomicBool::new(true),
    });
    let app = console_app(&db, &[], Service::new().handler(handler)).await;
    post_event(&app, "evt_rough_fine", "invoice.paid").await;
    post_event(&app, "evt_poison_rough", "invoice.paid").await;
    wait_for("one handled, one dead letter", WAIT, || async {
        let handled = app
            .store
            .dedup()
            .processed_record("stripe", "evt_rough_fine");
        let dead = app
            .store
            .reads()
            .dead_letters_of("stripe", "evt_poison_rough", 10);
        let (handled, dead) = (handled.await.ok()?, dead.await.ok()?);
        let delivered = app.store.outbox().counts().await.ok()?.dispatched == 1;
        (handled.is_some() && !dead.is_empty() && delivered).then_some(())
    })
    .await;
    for (id, label) in [
        ("evt_rough_fine", "handled and delivered"),
        ("evt_poison_rough", "dead letter"),
    ] {
        let (list, page) = stories(&app, id).await;
        assert_eq!(list, [label], "{id} on the list");
        assert_eq!(page, label, "{id} on its page");
    }
    app.stop().await;
    db.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_dead_letter_offers_no_redrive() {
    let db = TestDb::new(Backend::Sqlite).await;
    let handler = Arc::new(PoisonWhileSet {
        failing: AtomicBool::new(true),
    });
    let app = console_app(&db, &[], Service::new().handler(handler.clone())).await;
    let id = "evt_poison_superseded";
    post_event(&app, id, "invoice.paid").await;
    let dead = wait_for("the dead letter", WAIT, || async {
        let dead = app.store.reads().dead_letters_of("stripe", id, 10);
        dead.await.ok()?.first().map(|d| d.id)
    })
    .await;
    let path = format!("/events/stripe/{id}");
    let (_, page) = get(&app, &path).await;
    assert!(
        page.contains("class=\"redrive"),
        "Redrive offered first: {page}"
    );
    // Fixed, and the sender delivers it again: handled, its dead letter left behind.
    handler.failing.store(false, Ordering::SeqCst);
    post_event(&app, id, "invoice.paid").await;
    wait_for("the event handled", WAIT, || async {
        let record = app.store.dedup().processed_record("stripe", id).await;
        record.ok().flatten().map(drop)
    })
    .await;
    let (status, page) = get(&app, &path).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!page.contains("class=\"redrive"), "no Redrive now: {page}");
    assert!(page.contains("handled since"), "{page}");
    wait_for("its delivery dispatched", WAIT, || async {
        let counts = app.store.outbox().counts().await.ok()?;
        (counts.dispatched == 1).then_some(())
    })
    .await;
    let before = store_state(&app.store).await;
    let row = dead.to_string();
    let (status, page) = post(&app, &format!("{path}/redrive"), &[("row", &row)]).await;
    assert_eq!(status, StatusCode::CONFLICT, "{page}");
    assert_eq!(store_state(&app.store).await, before, "nothing redriven");
    app.stop().await;
    db.remove().await;
}

/// The must-show: a `%00` typed into the search is a 400 page saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_typed_into_the_search_is_a_400_page_in_the_browser() {
    let db = TestDb::new(Backend::Postgres).await;
    let app = console_app(&db, &[], Service::new()).await;
    let browser = Browser::start().await;
    log_in(&browser, &app, "/events").await;
    browser
        .goto(&app.admin_url("/events?id=evt%00x&type=invoice."))
        .await;
    assert_eq!(browser.text_of("h1").await, "Check the filter");
    let problem = browser.text_of("#problem").await;
    assert!(
        problem.starts_with("id: contains the control character U+0000"),
        "{problem}"
    );
    let typed = browser.find("form#search input[name=type]").await;
    let typed = typed.prop("value").await.ok().flatten();
    assert_eq!(typed.as_deref(), Some("invoice."));
    // Logging out from the error page works (its form carries the session's token).
    browser
        .click_and_wait("header form button[type=submit]")
        .await;
    assert_eq!(browser.path().await, "/login", "{}", browser.text().await);
    browser.close().await;
    app.stop().await;
    db.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_without_an_id_has_a_page_with_its_payload() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = console_app(&db, &[], Service::new()).await;
    // What a foreign producer left on the queue: no id, not JSON.
    let mut tx = app.store.begin().await.expect("begin");
    let junk = NewDeadLetter {
        source: "stripe".into(),
        event_id: String::new(),
        event_type: String::new(),
        queue: "dedup.events".into(),
        payload: b"<b>not an event</b>".to_vec(),
        error: "the payload is not JSON".into(),
        attempts: 1,
    };
    tx.insert_dead_letter(&junk).await.expect("a dead letter");
    tx.commit().await.expect("commit");
    let id = app
        .store
        .dead_letters()
        .list(10)
        .await
        .expect("dead letters")[0]
        .id;

    let (_, list) = get(&app, "/dead-letters").await;
    let page = format!("/dead-letters/{id}");
    assert!(
        list.contains(&format!("href=\"{page}\"")),
        "the list links it: {list}"
    );
    let (status, html) = get(&app, &page).await;
    assert_eq!(status, StatusCode::OK, "{html}");
    let payload = element_text(&html, "pre", "payload").expect("pre#payload");
    assert_eq!(payload, "&lt;b&gt;not an event&lt;/b&gt;", "escaped, whole");
    assert!(html.contains("the payload is not JSON"), "{html}");
    assert!(
        html.contains("class=\"redrive\""),
        "Redrive offered: {html}"
    );
    let (status, _) = get(&app, "/dead-letters/999999").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let response = no_redirects()
        .post(app.admin_url(&format!("{page}/redrive")))
        .header(AUTHORIZATION, format!("Bearer {TOKEN}"))
        .send()
        .await
        .expect("redrive");
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let location = response.headers()[LOCATION].to_str().expect("a location");
    assert!(location.starts_with("/dead-letters?done="), "{location}");
    let (_, after) = get(&app, location).await;
    let done = element_text(&after, "p", "done").expect("p#done");
    assert!(
        done.starts_with(&format!("Redrove 1 dead letter (row {id}) — console")),
        "{done}"
    );
    app.stop().await;
    db.remove().await;
}
