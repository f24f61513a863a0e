//! What the console refuses: every page and action without the token, and a state change from
//! another origin even with a valid session and CSRF token.

use axum::response::Html;
use axum::routing::get;
use axum::Router;
use dedup_worker::testing::TestApp;
use dedup_worker::Service;
use dedup_worker_core::consumer::{Handler, HandlerError, OutboxMessage};
use dedup_worker_core::event::Event;
use dedup_worker_core::store::DbTx;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, COOKIE};
use reqwest::StatusCode;
use serde_json::{json, Value};

use super::browser::{Browser, WAIT};
use super::{console_app, log_in, outbox_statuses, post_event, store_state, Sink, TOKEN};
use crate::helpers::{serve, wait_for, Backend, TestDb};

/// Request headers, and a form's fields.
type Headers = Vec<(&'static str, String)>;
type Fields = Vec<(String, String)>;

/// The session cookie's name.
const COOKIE_NAME: &str = "dedup_console";

/// A POST form of a page as the browser would send it: where, and its fields (with the
/// clicked button's name and value when it has one).
#[derive(Debug, Clone)]
struct PostForm {
    /// The page it was on, and the button, for messages.
    label: String,
    action: String,
    fields: Fields,
}

/// Every POST form of the browser's current page, once per submit button.
async fn post_forms(browser: &Browser) -> Vec<PostForm> {
    let script = "
        const forms = Array.from(document.querySelectorAll('form'))
            .filter(f => f.method.toLowerCase() === 'post');
        return forms.flatMap(f => {
            const fields = Array.from(new FormData(f)).map(([k, v]) => [k, String(v)]);
            const buttons = Array.from(f.querySelectorAll('button, input[type=submit]'))
                .filter(b => (b.type || 'submit') === 'submit');
            return (buttons.length ? buttons : [null]).map(b => ({
                action: f.action,
                button: b ? (b.id || b.textContent.trim() || b.value) : '',
                fields: b && b.name ? fields.concat([[b.name, b.value]]) : fields,
            }));
        });";
    let found = browser
        .client
        .execute(script, vec![])
        .await
        .expect("read the page's forms");
    let page = browser.path().await;
    let forms: Vec<Value> = serde_json::from_value(found).expect("a list of forms");
    forms
        .into_iter()
        .map(|f| PostForm {
            label: format!("{page}: {}", f["button"].as_str().unwrap_or_default()),
            action: f["action"].as_str().expect("an action").to_owned(),
            fields: serde_json::from_value(f["fields"].clone()).expect("fields"),
        })
        .collect()
}

/// The session cookie the browser holds for the console (HttpOnly: only WebDriver sees it).
async fn session_cookie(browser: &Browser) -> String {
    let cookie = browser
        .client
        .get_named_cookie(COOKIE_NAME)
        .await
        .expect("the session cookie");
    assert_eq!(cookie.http_only(), Some(true), "HttpOnly");
    assert_eq!(
        format!("{:?}", cookie.same_site()),
        "Some(Strict)",
        "SameSite=Strict"
    );
    cookie.value().to_owned()
}

fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a client")
}

/// Ways to ask without the token: none, a wrong Bearer token, an empty one, another scheme, a
/// cookie made up, the real cookie altered (expiry, name, MAC) and the real one renamed.
fn without_the_token(real_cookie: &str) -> Vec<(&'static str, Headers)> {
    let mut altered_mac = real_cookie.to_owned();
    let last = altered_mac.pop().expect("a cookie");
    altered_mac.push(if last == '0' { '1' } else { '0' });
    let (expiry, rest) = real_cookie.split_once('.').expect("EXPIRY.NAME.MAC");
    let later = format!("{}.{rest}", expiry.parse::<i64>().expect("expiry") + 3600);
    let (_, mac) = rest.split_once('.').expect("NAME.MAC");
    let renamed = format!("{expiry}.{}.{mac}", hex::encode("admin"));
    vec![
        ("no credentials", vec![]),
        (
            "a wrong Bearer token",
            vec![("authorization", "Bearer not-the-admin-token".into())],
        ),
        (
            "an empty Bearer token",
            vec![("authorization", "Bearer ".into())],
        ),
        (
            "the token under another scheme",
            vec![("authorization", format!("Basic {TOKEN}"))],
        ),
        (
            "a made-up cookie",
            vec![(
                "cookie",
                format!(
                    "{COOKIE_NAME}=99999999999.{}.{}",
                    hex::encode("x"),
                    "00".repeat(32)
                ),
            )],
        ),
        (
            "the session cookie with another MAC",
            vec![("cookie", format!("{COOKIE_NAME}={altered_mac}"))],
        ),
        (
            "the session cookie with a later expiry",
            vec![("cookie", format!("{COOKIE_NAME}={later}"))],
        ),
        (
            "the session cookie with another name",
            vec![("cookie", format!("{COOKIE_NAME}={renamed}"))],
        ),
        (
            "the session cookie under another name",
            vec![("cookie", format!("session={real_cookie}"))],
        ),
    ]
}

/// Fails `charge.failed` events fatally, forwards the rest.
struct FailCharges;

#[dedup_worker::async_trait]
impl Handler for FailCharges {
    async fn handle(
        &self,
        event: &Event,
        _tx: &mut DbTx<'_>,
    ) -> Result<Vec<OutboxMessage>, HandlerError> {
        if event.event_type == "charge.failed" {
            return Err(HandlerError::Fatal("declined".into()));
        }
        Ok(vec![OutboxMessage::forward(event)])
    }
}

/// A store where every action has something to act on: a dead letter (`evt_refuse_dead`), a
/// failed delivery (`evt_refuse_failed`) and a dispatched one (`evt_refuse_sent`).
async fn something_to_act_on(db: &TestDb, sink: &Sink) -> TestApp {
    let app = console_app(
        db,
        &[
            ("outbox.sink", json!(sink.url())),
            ("outbox.max_attempts", json!(1)),
        ],
        Service::new().handler(FailCharges),
    )
    .await;
    post_event(&app, "evt_refuse_failed", "invoice.paid").await;
    post_event(&app, "evt_refuse_dead", "charge.failed").await;
    wait_for("a failed delivery and a dead letter", WAIT, || async {
        let counts = app.store.outbox().counts().await.ok()?;
        let dead = app.store.dead_letters().list(10).await.ok()?;
        (counts.failed == 1 && dead.len() == 1).then_some(())
    })
    .await;
    sink.recover();
    post_event(&app, "evt_refuse_sent", "invoice.paid").await;
    wait_for("a dispatched delivery", WAIT, || async {
        let counts = app.store.outbox().counts().await.ok()?;
        (counts.dispatched == 1).then_some(())
    })
    .await;
    app
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_token_every_page_is_401_and_every_action_refused() {
    let db = TestDb::new(Backend::Sqlite).await;
    let sink = Sink::failing().await;
    let app = something_to_act_on(&db, &sink).await;
    let http = no_redirects();

    // The login page, in the browser: a wrong token is refused there, the right one lets in.
    let browser = Browser::start().await;
    browser.goto(&app.admin_url("/")).await;
    let token = browser.find("form#login input[name=token]").await;
    assert_eq!(
        token.attr("type").await.ok().flatten().as_deref(),
        Some("password")
    );
    browser.find("form#login button[type=submit]").await;
    assert!(!browser.has("nav").await, "nothing of the console shown");
    browser.screenshot("login").await;
    browser
        .fill("form#login input[name=token]", "not-the-admin-token")
        .await;
    browser
        .click_and_wait("form#login button[type=submit]")
        .await;
    assert!(browser.has("form#login").await, "{}", browser.text().await);
    assert!(!browser.text_of(".error").await.is_empty());
    log_in(&browser, &app, "/").await;

    // Every POST form of every page, as the browser would send it with the session (its CSRF
    // token included).
    let mut forms = Vec::new();
    for path in [
        "/",
        "/events/stripe/evt_refuse_dead",
        "/events/stripe/evt_refuse_failed",
        "/events/stripe/evt_refuse_sent",
        "/dead-letters",
        "/outbox/failed",
    ] {
        browser.goto(&app.admin_url(path)).await;
        browser.find("h1").await;
        forms.extend(post_forms(&browser).await);
    }
    // The confirmation pages of the bulk actions (a dry run changes nothing).
    for (path, button) in [
        ("/dead-letters", "form#bulk button#dry-run"),
        ("/outbox/failed", "form#bulk button#dry-run"),
    ] {
        browser.goto(&app.admin_url(path)).await;
        browser.click_and_wait(button).await;
        assert_eq!(browser.text_of("#dry-run-count").await, "1", "{path}");
        forms.extend(post_forms(&browser).await);
    }
    let cookie = session_cookie(&browser).await;
    browser.close().await;
    let actions: Vec<String> = forms.iter().map(|f| f.action.clone()).collect();
    for route in [
        "/events/stripe/evt_refuse_dead/redrive",
        "/events/stripe/evt_refuse_failed/resend",
        "/events/stripe/evt_refuse_sent/resend",
        "/dead-letters/redrive",
        "/outbox/failed/retry",
        "/logout",
    ] {
        assert!(
            actions.contains(&app.admin_url(route)),
            "a form posts to {route}: {actions:?}"
        );
    }

    let before = store_state(&app.store).await;
    let received = sink.received();
    let pages = [
        "/",
        "/events",
        "/events?id=evt_refuse_dead",
        "/events/stripe/evt_x",
        "/events/stripe/evt_refuse_dead",
        "/dead-letters",
        "/outbox/failed",
    ];
    for (how, headers) in without_the_token(&cookie) {
        for path in pages {
            // A browser gets the login page; a script (one sending Authorization) a problem.
            let page = send(http.get(app.admin_url(path)), &headers).await;
            assert_eq!(
                page.status(),
                StatusCode::UNAUTHORIZED,
                "GET {path} with {how}"
            );
            if headers.iter().any(|(name, _)| *name == "authorization") {
                assert_problem(page, &format!("GET {path} with {how}")).await;
            } else {
                let body = page.text().await.unwrap_or_default();
                assert!(
                    body.contains("id=\"login\""),
                    "GET {path} with {how}: {body}"
                );
                assert!(!body.contains("<nav"), "GET {path} with {how}: {body}");
            }
            // A script gets a problem.
            let json = http
                .get(app.admin_url(path))
                .header(ACCEPT, "application/json");
            let problem = send(json, &headers).await;
            assert_eq!(
                problem.status(),
                StatusCode::UNAUTHORIZED,
                "GET {path} (JSON) with {how}"
            );
            assert_problem(problem, &format!("GET {path} (JSON) with {how}")).await;
        }
        for form in &forms {
            let what = format!("POST {} ({}) with {how}", form.action, form.label);
            let request = http.post(&form.action).form(&form.fields);
            let refused = send(request, &headers).await;
            assert_eq!(refused.status(), StatusCode::UNAUTHORIZED, "{what}");
            let request = http
                .post(&form.action)
                .header(ACCEPT, "application/json")
                .form(&form.fields);
            let refused = send(request, &headers).await;
            assert_eq!(refused.status(), StatusCode::UNAUTHORIZED, "{what}");
            assert_problem(refused, &what).await;
        }
    }
    assert_eq!(store_state(&app.store).await, before, "nothing changed");
    assert_eq!(sink.received(), received, "nothing delivered");

    // The same requests with the token are let in (the refusals above were the token's): each
    // page with the Bearer token, each form with the session.
    for path in pages {
        let page = http
            .get(app.admin_url(path))
            .header(AUTHORIZATION, format!("Bearer {TOKEN}"))
            .send()
            .await
            .expect("GET");
        // An event nothing is recorded of is a page of its own, answered 404.
        let expected = match path {
            "/events/stripe/evt_x" => StatusCode::NOT_FOUND,
            _ => StatusCode::OK,
        };
        assert_eq!(page.status(), expected, "GET {path} with the token");
    }
    for form in forms.iter().filter(|f| !f.action.ends_with("/logout")) {
        let response = http
            .post(&form.action)
            .header(COOKIE, format!("{COOKIE_NAME}={cookie}"))
            .form(&form.fields)
            .send()
            .await
            .expect("POST");
        assert!(
            response.status().is_success() || response.status().is_redirection(),
            "POST {} ({}) with the session: {}",
            form.action,
            form.label,
            response.status()
        );
    }
    assert_ne!(store_state(&app.store).await, before, "the actions acted");

    app.stop().await;
    db.remove().await;
}

async fn send(
    mut request: reqwest::RequestBuilder,
    headers: &[(&'static str, String)],
) -> reqwest::Response {
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    request.send().await.expect("the console answers")
}

async fn assert_problem(response: reqwest::Response, what: &str) {
    let content_type = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        content_type.starts_with("application/problem+json"),
        "{what}: {content_type}"
    );
    let problem: Value = response.json().await.expect("a problem document");
    assert!(problem["status"].is_number(), "{what}: {problem}");
}

/// A page of another origin that posts `form` to the console as soon as it loads.
fn auto_submitting(form: &PostForm) -> String {
    let escape = |s: &str| {
        s.replace('&', "&amp;")
            .replace('"', "&quot;")
            .replace('<', "&lt;")
    };
    let fields: String = form
        .fields
        .iter()
        .map(|(k, v)| {
            format!(
                "<input type=\"hidden\" name=\"{}\" value=\"{}\">",
                escape(k),
                escape(v)
            )
        })
        .collect();
    format!(
        "<!DOCTYPE html><html><body onload=\"document.forms[0].submit()\">\
         <h1>You won a prize</h1>\
         <form method=\"post\" action=\"{}\">{fields}</form></body></html>",
        escape(&form.action)
    )
}

/// The HTTP status of the document the browser shows (Chromium's Navigation Timing).
async fn document_status(browser: &Browser) -> i64 {
    let status = browser
        .client
        .execute(
            "return performance.getEntriesByType('navigation')[0].responseStatus",
            vec![],
        )
        .await
        .expect("navigation timing");
    status.as_i64().expect("a status")
}

/// Opens `page` (of another origin) in `browser` and waits until the console's answer to the
/// form it submits is shown; that answer's status.
async fn submitted_from(browser: &Browser, page: &str, console: &str) -> i64 {
    browser.goto(page).await;
    wait_for(
        "the console's answer to the other page's form",
        WAIT,
        || async {
            let url = browser.url().await;
            let ready = browser
                .client
                .execute("return document.readyState", vec![])
                .await
                .ok()?;
            (url.starts_with(console) && ready == "complete").then_some(())
        },
    )
    .await;
    document_status(browser).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_origin_post_is_refused() {
    let db = TestDb::new(Backend::Sqlite).await;
    let sink = Sink::failing().await;
    let app = console_app(
        &db,
        &[
            ("outbox.sink", json!(sink.url())),
            ("outbox.max_attempts", json!(1)),
        ],
        Service::new(),
    )
    .await;
    for n in 0..3 {
        post_event(&app, &format!("evt_cross_{n}"), "invoice.paid").await;
    }
    wait_for("3 failed deliveries", WAIT, || async {
        let counts = app.store.outbox().counts().await.ok()?;
        (counts.failed == 3).then_some(())
    })
    .await;
    sink.recover();

    // Logged in, at the confirmation of a retry: the form an attacker would need to replay,
    // CSRF token and all.
    let browser = Browser::start().await;
    log_in(&browser, &app, "/outbox/failed").await;
    browser.click_and_wait("form#bulk button#dry-run").await;
    assert_eq!(browser.text_of("#dry-run-count").await, "3");
    let confirm = post_forms(&browser)
        .await
        .into_iter()
        .find(|f| f.label.ends_with(": confirm"))
        .expect("the confirmation form (button#confirm)");
    assert!(confirm
        .fields
        .iter()
        .any(|(k, v)| k == "csrf" && !v.is_empty()));
    let cookie = session_cookie(&browser).await;
    let before = store_state(&app.store).await;
    let received = sink.received();

    // Over HTTP, with the session and its CSRF token: another Origin, or a browser saying the
    // request is not same-origin, or no CSRF token, is 403.
    let http = no_redirects();
    let admin = app.admin_url("");
    let session = ("cookie", format!("{COOKIE_NAME}={cookie}"));
    let without_csrf: Vec<_> = confirm
        .fields
        .iter()
        .filter(|(k, _)| k != "csrf")
        .cloned()
        .collect();
    let mut wrong_csrf = confirm.fields.clone();
    for (k, v) in &mut wrong_csrf {
        if k == "csrf" {
            *v = "00".repeat(32);
        }
    }
    let cases: Vec<(&str, Headers, &Fields)> = vec![
        (
            "Origin of another site",
            vec![session.clone(), ("origin", "http://evil.example".into())],
            &confirm.fields,
        ),
        (
            "Origin null",
            vec![session.clone(), ("origin", "null".into())],
            &confirm.fields,
        ),
        (
            "Origin of the webhook listener (same site, another port)",
            vec![session.clone(), ("origin", format!("http://{}", app.addr))],
            &confirm.fields,
        ),
        (
            "Sec-Fetch-Site: cross-site",
            vec![session.clone(), ("sec-fetch-site", "cross-site".into())],
            &confirm.fields,
        ),
        (
            "Sec-Fetch-Site: same-site",
            vec![session.clone(), ("sec-fetch-site", "same-site".into())],
            &confirm.fields,
        ),
        (
            "Sec-Fetch-Site: cross-site with the console's own Origin",
            vec![
                session.clone(),
                ("sec-fetch-site", "cross-site".into()),
                ("origin", admin.clone()),
            ],
            &confirm.fields,
        ),
        ("no CSRF token", vec![session.clone()], &without_csrf),
        ("another CSRF token", vec![session.clone()], &wrong_csrf),
    ];
    for (how, headers, fields) in &cases {
        for accept in ["text/html", "application/json"] {
            let request = http
                .post(&confirm.action)
                .header(ACCEPT, accept)
                .form(fields);
            let response = send(request, headers).await;
            assert_eq!(response.status(), StatusCode::FORBIDDEN, "{how} ({accept})");
            if accept == "application/json" {
                assert_problem(response, how).await;
            }
        }
    }
    assert_eq!(store_state(&app.store).await, before, "nothing changed");

    // In the browser: pages of other origins submitting the confirmation form as soon as they
    // load. On 127.0.0.1 at another port (the same site: the cookie goes along, the CSRF token
    // is the real one) the console refuses it for its origin; on `localhost` (another site)
    // the browser sends no cookie at all.
    let html = auto_submitting(&confirm);
    let other = serve(Router::new().route("/", get(move || async move { Html(html) }))).await;
    let same_site = submitted_from(&browser, &format!("http://{other}/"), &admin).await;
    assert_eq!(same_site, 403, "{}", browser.text().await);
    let cross_site = format!("http://localhost:{}/", other.port());
    let status = submitted_from(&browser, &cross_site, &admin).await;
    assert!(
        status == 401 || status == 403,
        "{status}: {}",
        browser.text().await
    );
    assert_eq!(store_state(&app.store).await, before, "nothing changed");
    assert_eq!(sink.received(), received, "nothing delivered");
    assert_eq!(
        outbox_statuses(&app.store, "invoice.paid").await,
        ["failed"; 3]
    );

    // The same form from the console's own page does it (the refusals were the origin's).
    browser.goto(&app.admin_url("/outbox/failed")).await;
    browser.click_and_wait("form#bulk button#dry-run").await;
    browser.click_and_wait("form#confirm button#confirm").await;
    wait_for("the 3 deliveries retried", WAIT, || async {
        let statuses = outbox_statuses(&app.store, "invoice.paid").await;
        (statuses == ["dispatched"; 3]).then_some(())
    })
    .await;

    browser.close().await;
    app.stop().await;
    db.remove().await;
}
