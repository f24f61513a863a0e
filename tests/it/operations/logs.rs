//! Operating it, through the real binary: log lines as JSON carrying the event they are about,
//! no colours off a terminal, no secret or URL password in what it prints, and start-up errors
//! that name the dependency, its host and port, and the cause.

use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::{dedup_command, post_signed, Backend, RunningBinary, TestDb};

const SECRET: &str = "whsec_operations_test_secret";

/// Every line the binary wrote to stderr, each parsed as JSON (the test fails on one that is not).
fn json_lines(stderr: &str) -> Vec<Value> {
    stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect()
}

fn update(id: &str, created: i64) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "id": id, "object": "event", "created": created, "type": "customer.subscription.updated",
        "data": {"object": {"id": "sub_ops", "object": "subscription"}}
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_a_terminal_log_lines_are_json_and_carry_the_event_they_are_about() {
    let db = TestDb::new(Backend::Sqlite).await;
    let work = tempfile::tempdir().unwrap();
    // `auto` (the default): stderr is a file here, so JSON lines.
    let bin = RunningBinary::start(
        &[
            ("DATABASE_URL", db.url.clone()),
            ("STRIPE_WEBHOOK_SECRET", SECRET.to_owned()),
            ("DEDUP_LOG__FORMAT", "auto".to_owned()),
            ("RUST_LOG", "info".to_owned()),
            ("DEDUP_CONSUMER__STALE_GUARD__ENABLED", "true".to_owned()),
            ("DEDUP_CONSUMER__POLL_INTERVAL", "50ms".to_owned()),
            ("DEDUP_OUTBOX__POLL_INTERVAL", "50ms".to_owned()),
        ],
        work.path(),
    );
    let client = reqwest::Client::new();
    let url = bin.url("/webhooks/stripe");
    // The newer update first, then the older one: the second is held back as stale, a line
    // logged inside the consumer's span for that event.
    for (id, created) in [
        ("evt_ops_new", 1_796_119_209),
        ("evt_ops_old", 1_796_119_205),
    ] {
        let r = post_signed(&client, &url, SECRET, update(id, created))
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let lines = bin
        .wait_for(
            "the delivery and the stale lines",
            Duration::from_secs(30),
            || {
                let lines = json_lines(&bin.stderr());
                let delivered = lines
                    .iter()
                    .any(|l| l["event_id"] == "evt_ops_new" && l["message"] == "event delivered");
                let stale = lines.iter().any(|l| l["event_id"] == "evt_ops_old");
                async move { (delivered && stale).then_some(lines) }
            },
        )
        .await;
    let delivered = lines
        .iter()
        .find(|l| l["message"] == "event delivered")
        .unwrap();
    let stale = lines
        .iter()
        .find(|l| l["event_id"] == "evt_ops_old")
        .unwrap();
    for line in [delivered, stale] {
        assert_eq!(line["source"], "stripe", "{line}");
        assert_eq!(
            line["event_type"], "customer.subscription.updated",
            "{line}"
        );
        assert!(
            line["timestamp"].is_string() && line["level"] == "INFO",
            "{line}"
        );
    }
    // The stale line's own fields, beside those of the span it was logged in.
    assert_eq!(stale["newer_event_id"], "evt_ops_new", "{stale}");
    assert!(
        stale["message"]
            .as_str()
            .unwrap()
            .starts_with("stale event"),
        "{stale}"
    );
    let logged = bin.stderr();
    assert!(!logged.contains('\u{1b}'), "no terminal colours in a file");
    assert!(!logged.contains(SECRET), "the webhook secret was logged");
    drop(bin);
    db.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_logs_off_a_terminal_have_no_colours() {
    let db = TestDb::new(Backend::Sqlite).await;
    let work = tempfile::tempdir().unwrap();
    let bin = RunningBinary::start(
        &[
            ("DATABASE_URL", db.url.clone()),
            ("STRIPE_WEBHOOK_SECRET", SECRET.to_owned()),
            ("DEDUP_LOG__FORMAT", "text".to_owned()),
            ("RUST_LOG", "info".to_owned()),
            ("DEDUP_CONSUMER__POLL_INTERVAL", "50ms".to_owned()),
            ("DEDUP_OUTBOX__POLL_INTERVAL", "50ms".to_owned()),
        ],
        work.path(),
    );
    let client = reqwest::Client::new();
    let body = update("evt_ops_text", 1_796_119_209);
    let r = post_signed(&client, &bin.url("/webhooks/stripe"), SECRET, body)
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    bin.wait_for("the delivery line", Duration::from_secs(30), || {
        let logged = bin.stderr();
        async move { logged.contains("event delivered").then_some(()) }
    })
    .await;
    let logged = bin.stderr();
    let line = logged
        .lines()
        .find(|l| l.contains("event delivered"))
        .unwrap();
    assert!(
        line.contains("source=stripe") && line.contains("event_id=evt_ops_text"),
        "{line}"
    );
    assert!(!logged.contains('\u{1b}'), "colours in a file: {logged}");
    drop(bin);
    db.remove().await;
}

/// `dedup-worker migrate` against `url`: it must fail; what it printed.
async fn failed_start(url: String) -> String {
    let output = tokio::task::spawn_blocking(move || {
        dedup_command(&[
            ("DATABASE_URL", url),
            ("DEDUP_DATABASE__ACQUIRE_TIMEOUT", "1500ms".to_owned()),
        ])
        .arg("migrate")
        .output()
        .expect("run the binary")
    })
    .await
    .unwrap();
    assert!(!output.status.success(), "it started");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_errors_name_the_database_its_address_and_the_cause_never_the_password() {
    // Refused: nothing listens on the port (bound, then closed).
    let port = {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        socket.local_addr().unwrap().port()
    };
    let refused = failed_start(format!("postgres://app:s3cretpw@127.0.0.1:{port}/orders")).await;
    assert!(
        refused.contains(&format!(
            "PostgreSQL at 127.0.0.1:{port} (database orders, user app)"
        )),
        "{refused}"
    );
    assert!(refused.to_lowercase().contains("refused"), "{refused}");
    // Black-holed: the port accepts connections (the kernel's backlog) and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let quiet = failed_start(format!("postgres://app:s3cretpw@127.0.0.1:{port}/orders")).await;
    assert!(
        quiet.contains(&format!("PostgreSQL at 127.0.0.1:{port}")),
        "{quiet}"
    );
    assert!(quiet.contains("no answer within"), "{quiet}");
    drop(silent);
    for printed in [&refused, &quiet] {
        assert!(
            !printed.contains("s3cretpw"),
            "the password was printed: {printed}"
        );
    }
}

/// How many times `needle` is in `haystack`.
fn occurrences(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_is_one_line_that_says_each_cause_once() {
    // Three errors whose message includes their source's: sqlx's I/O error (the OS's words),
    // the server's refusal, and the store's own (an io::Error it names and keeps as source).
    let port = {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        socket.local_addr().unwrap().port()
    };
    let refused = failed_start(format!("postgres://app@127.0.0.1:{port}/orders")).await;
    let missing_db = format!("dw_missing_{}", uuid::Uuid::new_v4().simple());
    let base = crate::helpers::db::pg_admin_url();
    let (server, _) = base.rsplit_once('/').expect("a database URL");
    let missing = failed_start(format!("{server}/{missing_db}")).await;
    let file = tempfile::NamedTempFile::new().unwrap();
    let not_a_dir = failed_start(format!("sqlite://{}/dedup.db", file.path().display())).await;
    for (printed, cause) in [
        (&refused, "Connection refused".to_owned()),
        (
            &missing,
            format!("database \"{missing_db}\" does not exist"),
        ),
        (&not_a_dir, "File exists".to_owned()),
    ] {
        let line = printed.trim_end();
        assert!(
            line.starts_with("dedup-worker: ") && !line.contains('\n'),
            "not one line of the program's: {printed:?}"
        );
        assert_eq!(
            occurrences(line, &cause),
            1,
            "{cause:?} not said once: {line}"
        );
    }
}
