//! Junk dead letters (no event id, not JSON) discarded from the console: by the list's filter
//! after a dry run that says how many, and one from its own page (offered first there, and
//! asking first); each time a banner says what was done, the letters are gone from the list,
//! their pages show the record they left, the action is recorded (`dlq_discard`) and the
//! minute counts them (`discarded`). A dead letter the filter left out stays.

use dedup_worker::Service;
use dedup_worker_core::store::NewDeadLetter;

use super::browser::Browser;
use super::{console_app, log_in};
use crate::helpers::{cli_json_lines, Backend, TestDb};

/// A dead letter of `event_id` (empty: none) holding `payload`.
fn dead_letter(event_id: &str, event_type: &str, payload: &[u8]) -> NewDeadLetter {
    NewDeadLetter {
        source: "stripe".into(),
        event_id: event_id.into(),
        event_type: event_type.into(),
        queue: "dedup.events".into(),
        payload: payload.to_vec(),
        error: "the payload is not JSON".into(),
        attempts: 1,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn junk_dead_letters_are_discarded_after_a_dry_run_and_recorded() {
    let db = TestDb::new(Backend::Sqlite).await;
    let app = console_app(&db, &[], Service::new()).await;
    let mut tx = app.store.begin().await.expect("begin");
    for letter in [
        dead_letter("", "junk", b"<b>not an event</b>"),
        dead_letter("", "junk", b"\x00\x01 binary"),
        dead_letter("", "other", b"not json either"),
        dead_letter("evt_keep", "invoice.paid", br#"{"id":"evt_keep"}"#),
    ] {
        tx.insert_dead_letter(&letter).await.expect("a dead letter");
    }
    tx.commit().await.expect("commit");
    let letters = app.store.dead_letters().list(10).await.expect("list");
    let ids = |kind: &str| -> Vec<i64> {
        let mut ids: Vec<i64> = letters
            .iter()
            .filter(|d| d.event_type == kind)
            .map(|d| d.id)
            .collect();
        ids.sort();
        ids
    };
    let (junk, other, keep) = (ids("junk"), ids("other")[0], ids("invoice.paid")[0]);

    let browser = Browser::start().await;
    log_in(&browser, &app, "/dead-letters").await;
    browser.fill("form#filter input[name=type]", "junk").await;
    browser.click_and_wait("form#filter [type=submit]").await;
    browser
        .click_and_wait("form#bulk-discard button#dry-run-discard")
        .await;
    assert_eq!(
        browser.text_of("#dry-run-count").await,
        "2",
        "{}",
        browser.text().await
    );
    assert_eq!(
        app.store.dead_letters().list(10).await.expect("list").len(),
        4,
        "a dry run discards nothing"
    );
    browser.click_and_wait("form#confirm button#confirm").await;
    assert_eq!(browser.path().await, "/dead-letters", "back on the list");
    let done = browser.text_of("#done").await;
    for part in ["Discarded 2 dead letters (type junk) — console", " UTC"] {
        assert!(done.contains(part), "{part:?} in the banner: {done}");
    }
    browser.goto(&app.admin_url("/dead-letters")).await;
    let listed: Vec<String> = {
        let mut listed = Vec::new();
        for link in browser.find_all("table#dead-letters a.dead-letter").await {
            listed.push(link.text().await.unwrap_or_default());
        }
        listed
    };
    assert_eq!(
        listed,
        [keep.to_string(), other.to_string()],
        "only the letters the filter left out"
    );
    let actions = browser.find_all("table#actions tbody tr").await;
    let action = actions[0].text().await.unwrap_or_default();
    for part in ["dlq_discard", "junk", "2", "console"] {
        assert!(action.contains(part), "{part:?} in the action: {action}");
    }

    // Its page now shows the record it left.
    browser
        .goto(&app.admin_url(&format!("/dead-letters/{}", junk[0])))
        .await;
    let left = browser.text_of("#left").await;
    assert!(left.starts_with("Discarded by console"), "{left}");
    assert_eq!(browser.text_of("#error").await, "the payload is not JSON");

    // One junk letter from its own page: Discard offered first, asked first, then done.
    browser
        .goto(&app.admin_url(&format!("/dead-letters/{other}")))
        .await;
    let first_form = browser.find("main form").await;
    assert_eq!(
        first_form.attr("class").await.ok().flatten().as_deref(),
        Some("discard"),
        "Discard comes first for junk: {}",
        browser.text().await
    );
    browser.click_and_wait("form.discard button").await;
    assert_eq!(browser.text_of("#dry-run-count").await, "1");
    browser.click_and_wait("form#confirm button#confirm").await;
    assert_eq!(browser.path().await, format!("/dead-letters/{other}"));
    let done = browser.text_of("#done").await;
    assert!(done.contains("Discarded 1 dead letter (row "), "{done}");
    assert!(
        browser
            .text_of("#left")
            .await
            .starts_with("Discarded by console"),
        "{}",
        browser.text().await
    );
    // A letter with an id and a JSON payload offers Redrive first.
    browser
        .goto(&app.admin_url(&format!("/dead-letters/{keep}")))
        .await;
    let first_form = browser.find("main form").await;
    assert_eq!(
        first_form.attr("class").await.ok().flatten().as_deref(),
        Some("redrive")
    );
    browser.close().await;

    let left = app.store.dead_letters().list(10).await.expect("list");
    assert_eq!(left.iter().map(|d| d.id).collect::<Vec<_>>(), [keep]);
    let discarded: i64 = app
        .store
        .reads()
        .minute_counts(0)
        .await
        .expect("minute counts")
        .iter()
        .filter(|c| c.series == "discarded")
        .map(|c| c.count)
        .sum();
    assert_eq!(discarded, 3, "each discard counted in its minute");
    app.stop().await;
    db.remove().await;
}

/// `dlq discard` on PostgreSQL (the console's test is SQLite's): the dry run counts, the
/// discard deletes what the filter selects, each leaving its record with the CLI as the actor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_discard_from_the_command_line_after_a_dry_run_on_postgres() {
    let db = TestDb::new(Backend::Postgres).await;
    let app = console_app(&db, &[], Service::new()).await;
    let mut tx = app.store.begin().await.expect("begin");
    for letter in [
        dead_letter("", "junk", b"<b>not an event</b>"),
        dead_letter("evt_cli_discard", "junk", br#"{"id":"evt_cli_discard"}"#),
        dead_letter("evt_cli_keep", "invoice.paid", br#"{"id":"evt_cli_keep"}"#),
    ] {
        tx.insert_dead_letter(&letter).await.expect("a dead letter");
    }
    tx.commit().await.expect("commit");
    let env = [("DATABASE_URL", db.url.clone())];
    let dry = cli_json_lines(&env, &["dlq", "discard", "--type", "junk", "--dry-run"]);
    assert_eq!(dry[0]["action"], "dlq_discard", "{dry:?}");
    assert_eq!(
        (dry[0]["dry_run"].as_bool(), dry[0]["count"].as_u64()),
        (Some(true), Some(2))
    );
    assert_eq!(
        app.store.dead_letters().list(10).await.expect("list").len(),
        3
    );
    let done = cli_json_lines(&env, &["dlq", "discard", "--type", "junk"]);
    assert_eq!(
        (done[0]["dry_run"].as_bool(), done[0]["count"].as_u64()),
        (Some(false), Some(2))
    );
    let left = app.store.dead_letters().list(10).await.expect("list");
    assert_eq!(
        left.iter().map(|d| d.event_id.as_str()).collect::<Vec<_>>(),
        ["evt_cli_keep"]
    );
    let records = app
        .store
        .reads()
        .redrives_of("stripe", "evt_cli_discard", 10)
        .await
        .expect("records");
    assert_eq!(records.len(), 1, "{records:?}");
    assert!(records[0].discarded(), "{records:?}");
    assert!(
        records[0]
            .actor
            .as_deref()
            .is_some_and(|a| a.starts_with("cli")),
        "{records:?}"
    );
    let (_, page) = super::rough_edges::get(&app, "/events/stripe/evt_cli_discard").await;
    assert!(page.contains("dead letter, discarded"), "{page}");
    app.stop().await;
    db.remove().await;
}
