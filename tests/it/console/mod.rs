//! The operator console (issue 28) in Debian's headless chromium through chromedriver
//! ([`browser`]), against the application in this process with its admin listener on port 0:
//!
//! * [`event_page`]: an event posted twice, found by id on `/events` after logging in through the
//!   login form, shows "handled" and its duplicate delivery; a dead letter redriven from its
//!   page (the handler fixed) ends "handled" (on PostgreSQL);
//! * [`bulk_retry`]: 20 deliveries failed at a sink answering 500, retried by filter (type and
//!   time) from `/outbox/failed` after the sink recovers: a dry run counts 20, the confirmation
//!   retries them, all 20 end dispatched and the action is listed; failed rows of another type
//!   stay failed;
//! * [`history`]: a past minute's counts in the overview's `table#minutes` are the same after
//!   the dead letters are redriven and the failed deliveries retried (on PostgreSQL); the
//!   overview's self-refresh and its toggle;
//! * [`refusals`]: without the token (none, a wrong one, a forged cookie) every page is 401 and
//!   every action refused with nothing changed in the store; a cross-origin POST is refused
//!   (with a valid session and CSRF token: a forged `Origin`, `Sec-Fetch-Site: cross-site`, and
//!   a real page of another origin auto-submitting the confirmation form in the same browser);
//! * [`rough_edges`]: a control character in any filter is a 400 naming the field (both stores),
//!   error pages keep their form and the session's token, an unknown event is a 404, a failed
//!   read shows a reference only, one vocabulary on the list and the page, no Redrive for a
//!   dead letter handled since;
//! * [`layout`]: a 255-byte id and long errors fit the window at 1280 and 800 px; times in UTC
//!   with the browser's own zone after them;
//! * [`resend`]: a re-send asks first, then says what it did;
//! * [`search`]: a customer's events found on `/events` (only theirs, each page with its kept
//!   body), by object id and id prefix too; the search's pages walked older then newer (both
//!   stores).
//! * [`discard`]: junk dead letters discarded by filter after a dry run, and one from its page;
//!   the banner, the list, the record left on its page, the action and the minute's count;
//! * [`stories`]: a handled event's story on the list and its page tells where its delivery
//!   stands (delivered, failing, failed for good, on its way, told by its attempts once its
//!   row is purged, nothing to deliver), on both stores.
//!
//! With `SCREENSHOTS=1` the tests write the book's screenshots of each page to
//! `docs/src/console/*.png`.

mod attempts;
mod browser;
mod bulk_retry;
mod discard;
mod event_page;
mod history;
mod layout;
mod refusals;
mod resend;
mod rough_edges;
mod search;
mod stories;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use dedup_worker::Service;
use dedup_worker_core::store::Store;
use serde_json::{json, Value};

use crate::helpers::{post_signed, serve, stripe_event, test_settings, TestApp, TestDb};
use browser::Browser;

/// The console's token in these tests.
pub const TOKEN: &str = "test-admin-token";

/// The application on `db` with its console on 127.0.0.1:0 behind [`TOKEN`], quick polls, and
/// `values`.
pub async fn console_app(db: &TestDb, values: &[(&str, Value)], service: Service) -> TestApp {
    let mut all = vec![
        ("admin.listen", json!("127.0.0.1:0")),
        ("admin.token", json!(TOKEN)),
        ("consumer.poll_interval", json!("50ms")),
        ("outbox.poll_interval", json!("50ms")),
    ];
    all.extend(values.iter().cloned());
    let app = TestApp::spawn(test_settings(&db.url, &all), service).await;
    assert!(app.admin_addr.is_some(), "the admin listener is on");
    app
}

/// Posts the Stripe event `id` of `event_type`, signed, and expects it accepted.
pub async fn post_event(app: &TestApp, id: &str, event_type: &str) {
    let client = reqwest::Client::new();
    let response = post_signed(
        &client,
        &app.url("/webhooks/stripe"),
        dedup_worker::testing::TEST_SECRET,
        stripe_event(id, event_type),
    )
    .await
    .expect("post the event");
    assert_eq!(response.status(), 200, "{id} accepted");
}

/// Logs in through the login form (`/login?next=PATH`) and checks that it lands on `path`.
pub async fn log_in(browser: &Browser, app: &TestApp, path: &str) {
    browser
        .goto(&app.admin_url(&format!("/login?next={path}")))
        .await;
    browser.fill("form#login input[name=token]", TOKEN).await;
    browser
        .click_and_wait("form#login button[type=submit]")
        .await;
    assert_eq!(
        browser.path().await,
        path,
        "logged in, back on {path}: {}",
        browser.text().await
    );
    assert!(!browser.has("form#login").await, "{}", browser.text().await);
}

/// What the console's actions can change, in a comparable form: every outbox row (status and
/// attempts), dead letter, redrive, recorded action and queued message.
pub async fn store_state(store: &Store) -> Vec<(String, i64, String)> {
    let sql =
        "SELECT 'outbox', CAST(id AS BIGINT), status || ' ' || CAST(attempts AS TEXT) FROM outbox
               UNION ALL SELECT 'dead_letter', CAST(id AS BIGINT), event_id FROM dead_letters
               UNION ALL SELECT 'redrive', CAST(id AS BIGINT), event_id FROM dead_letter_redrives
               UNION ALL SELECT 'action', CAST(id AS BIGINT), action FROM admin_actions
               UNION ALL SELECT 'queued', CAST(id AS BIGINT), queue FROM queue_messages
               ORDER BY 1, 2";
    match (store.postgres_pool(), store.sqlite_pool()) {
        (Some(pool), _) => sqlx::query_as(sql).fetch_all(pool).await,
        (_, Some(pool)) => sqlx::query_as(sql).fetch_all(pool).await,
        (None, None) => unreachable!("a store is one of the two"),
    }
    .expect("read the store's state")
}

/// Outbox rows by status, for the rows of `event_type`.
pub async fn outbox_statuses(store: &Store, event_type: &str) -> Vec<String> {
    let sql = "SELECT status FROM outbox WHERE event_type = $1 ORDER BY id";
    match (store.postgres_pool(), store.sqlite_pool()) {
        (Some(pool), _) => {
            sqlx::query_scalar(sql)
                .bind(event_type)
                .fetch_all(pool)
                .await
        }
        (_, Some(pool)) => {
            sqlx::query_scalar(sql)
                .bind(event_type)
                .fetch_all(pool)
                .await
        }
        (None, None) => unreachable!("a store is one of the two"),
    }
    .expect("read the outbox")
}

/// An HTTP sink target answering 500 until [`Sink::recover`], then 200; counts what it got.
pub struct Sink {
    addr: SocketAddr,
    failing: Arc<AtomicBool>,
    received: Arc<AtomicUsize>,
}

impl Sink {
    pub async fn failing() -> Self {
        let failing = Arc::new(AtomicBool::new(true));
        let received = Arc::new(AtomicUsize::new(0));
        let (f, r) = (failing.clone(), received.clone());
        let router = Router::new().route(
            "/hook",
            post(move || {
                let (f, r) = (f.clone(), r.clone());
                async move {
                    r.fetch_add(1, Ordering::SeqCst);
                    if f.load(Ordering::SeqCst) {
                        StatusCode::INTERNAL_SERVER_ERROR
                    } else {
                        StatusCode::OK
                    }
                }
            }),
        );
        let addr = serve(router).await;
        Sink {
            addr,
            failing,
            received,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    pub fn recover(&self) {
        self.failing.store(false, Ordering::SeqCst);
    }

    /// Deliveries received so far.
    pub fn received(&self) -> usize {
        self.received.load(Ordering::SeqCst)
    }
}
