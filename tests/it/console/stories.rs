//! A handled event's story tells where its delivery stands, the same on `/events` and on its
//! page, each with its colour's class: delivered, delivery failed for good (red), delivery
//! failing (a retry due), delivering, delivered with its outbox row purged (told by its
//! attempts), and nothing to deliver. Both stores: each has its own form of the page's
//! statements (`store/reads/delivery_state.rs`).

use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use dedup_worker::testing::TestApp;
use dedup_worker::Service;
use serde_json::json;

use super::browser::WAIT;
use super::console_app;
use super::post_event;
use super::rough_edges::{element_text, get};
use crate::helpers::db::execute;
use crate::helpers::{serve, wait_for, Backend, TestDb};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handled_events_story_tells_where_its_delivery_stands_postgres() {
    a_handled_events_story_tells_where_its_delivery_stands(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handled_events_story_tells_where_its_delivery_stands_sqlite() {
    a_handled_events_story_tells_where_its_delivery_stands(Backend::Sqlite).await;
}

/// A receiver refusing (500) every delivery of an event whose id has `refused` in it, taking
/// every other.
async fn receiver() -> String {
    let router = Router::new().route(
        "/hook",
        post(|body: String| async move {
            if body.contains("refused") {
                StatusCode::INTERNAL_SERVER_ERROR
            } else {
                StatusCode::OK
            }
        }),
    );
    format!("http://{}/hook", serve(router).await)
}

/// The story of `id` on the list (`class`, label of each row) and on its page.
async fn story(app: &TestApp, id: &str) -> (Vec<(String, String)>, (String, String)) {
    let (status, list) = get(app, &format!("/events?id={id}")).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    // Each cell is `<td class="outcome s-NAME">LABEL</td>`.
    let cells = list
        .split("<td class=\"outcome ")
        .skip(1)
        .filter_map(|cell| {
            let (class, rest) = cell.split_once('"')?;
            let label = rest.split_once('>')?.1.split('<').next()?;
            Some((class.to_owned(), label.trim().to_owned()))
        })
        .collect();
    let (status, page) = get(app, &format!("/events/stripe/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let label = element_text(&page, "strong", "outcome").expect("#outcome");
    // The `<strong …>` tag of `#outcome`, whichever order its attributes come in.
    let at = page.find("id=\"outcome\"").expect("#outcome");
    let tag = &page[page[..at].rfind('<').expect("its tag")..];
    let tag = &tag[..tag.find('>').expect("its tag's end")];
    let class = tag
        .split("class=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_default()
        .to_owned();
    (cells, (class, label))
}

async fn a_handled_events_story_tells_where_its_delivery_stands(backend: Backend) {
    let db = TestDb::new(backend).await;
    let url = receiver().await;
    let app = console_app(
        &db,
        &[
            ("outbox.sink", json!(url)),
            ("outbox.max_attempts", json!(1)),
            ("outbox.breaker.failures", json!(0)),
            ("outbox.breaker.window", json!(0)),
        ],
        Service::new(),
    )
    .await;
    let ids = [
        "evt_story_delivered",
        "evt_story_refused",
        "evt_story_failing",
        "evt_story_delivering",
        "evt_story_purged",
    ];
    for id in ids {
        post_event(&app, id, "invoice.paid").await;
    }
    wait_for("four delivered, one failed for good", WAIT, || async {
        let counts = app.store.outbox().counts().await.ok()?;
        (counts.dispatched == 4 && counts.failed == 1).then_some(())
    })
    .await;
    // Where the relay would be in between: one row failed once and due again tomorrow, one on
    // its way; and one event's rows purged by retention (its attempts remain).
    let tomorrow = match backend {
        Backend::Postgres => "now() + interval '1 day'".to_owned(),
        Backend::Sqlite => {
            let ms = chrono::Utc::now().timestamp_millis() + 86_400_000;
            ms.to_string()
        }
    };
    let set = |id: &str, error: &str| {
        format!(
            "UPDATE outbox SET status = 'pending', dispatched_at = NULL, last_error = {error},
                    next_attempt_at = {tomorrow} WHERE event_id = '{id}'"
        )
    };
    execute(&app.store, &set("evt_story_failing", "'HTTP 500'")).await;
    execute(&app.store, &set("evt_story_delivering", "NULL")).await;
    execute(
        &app.store,
        "DELETE FROM outbox WHERE event_id = 'evt_story_purged'",
    )
    .await;

    for (id, name, label) in [
        ("evt_story_delivered", "delivered", "handled and delivered"),
        (
            "evt_story_refused",
            "delivery_failed",
            "handled, delivery failed",
        ),
        (
            "evt_story_failing",
            "delivery_failing",
            "handled, delivery failing",
        ),
        ("evt_story_delivering", "delivering", "handled, delivering"),
        ("evt_story_purged", "delivered", "handled and delivered"),
    ] {
        let want = (format!("s-{name}"), label.to_owned());
        let (list, page) = story(&app, id).await;
        assert_eq!(list, std::slice::from_ref(&want), "{id} on the list");
        assert_eq!(page, want, "{id} on its page");
    }
    // Every row of one page at once, each its own (the page's statements answer in order).
    let (_, all) = get(&app, "/events?outcome=handled").await;
    for name in [
        "delivered",
        "delivery_failed",
        "delivery_failing",
        "delivering",
    ] {
        assert!(
            all.contains(&format!("outcome s-{name}\"")),
            "{name}: {all}"
        );
    }

    // An event whose handler wrote nothing to deliver (its row and attempts gone as if never
    // written): handled, nothing to deliver.
    execute(
        &app.store,
        "DELETE FROM outbox_attempts WHERE outbox_id NOT IN (SELECT id FROM outbox)",
    )
    .await;
    let nothing = (
        "s-handled".to_owned(),
        "handled (nothing to deliver)".to_owned(),
    );
    let (list, page) = story(&app, "evt_story_purged").await;
    assert_eq!((list, page), (vec![nothing.clone()], nothing));
    app.stop().await;
    db.remove().await;
}
