//! Settings that cannot be right stop the binary before it serves anything, with a message that
//! names the key (issue 26): secrets whose key material is empty (a template `whsec_${X}` with
//! `X` unset), under which anyone's delivery signed with the empty key would be a 200; and
//! numbers past their bound, such as a `dedup_retention_days` whose conversion to seconds would
//! wrap to hours and empty a two-day-old dedup generation (shown at the store too, with the
//! conversion the binary uses). Durations (issue 38): a former integer key (`_MS`, `_SECS`)
//! starts with a warning naming its new spelling; given both ways, or as no duration, refused.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::Duration;

use dedup_worker_core::config::whole_days;
use dedup_worker_core::signature::standard::standard_signature;
use dedup_worker_core::store::Store;

use crate::helpers::{dedup_command, now, post_signed, stripe_event, Backend, TestDb};

/// A Stripe secret as Stripe issues them.
const STRIPE_SECRET: &str = "whsec_5f1c0c4f2a9be7d1c3e8a6b4d2f0e9c7";
/// The issue's `dedup_retention_days`: times 86,400 it is 2⁶⁴ + 61,184, so a wrapping
/// multiplication makes a dedup window of 17 hours.
const WRAPPING_DAYS: u64 = 213_503_982_334_602;

/// How `serve` ended up: listening (it accepted the configuration), or exited first.
pub(crate) enum Start {
    Listening {
        child: Child,
        addr: String,
        stderr_path: std::path::PathBuf,
    },
    Refused {
        stderr: String,
    },
}

/// Starts `serve` with `env` on a fresh SQLite file and port 0.
pub(crate) fn start(env: &[(&str, String)], dir: &std::path::Path) -> Start {
    let stderr_path = dir.join(format!("stderr-{}.log", uuid::Uuid::new_v4().simple()));
    let mut env = env.to_vec();
    env.extend([
        (
            "DATABASE_URL",
            format!("sqlite://{}/dedup.db", dir.display()),
        ),
        ("DEDUP_LISTEN", "127.0.0.1:0".to_owned()),
        ("DEDUP_LOG__FORMAT", "text".to_owned()),
    ]);
    let mut child = dedup_command(&env)
        .arg("serve")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr_path).expect("log file"))
        .spawn()
        .expect("start the binary");
    let stdout = child.stdout.take().expect("stdout");
    let first = BufReader::new(stdout).lines().next().and_then(Result::ok);
    match first.and_then(|l| {
        l.strip_prefix("dedup-worker listening on ")
            .map(str::to_owned)
    }) {
        Some(addr) => Start::Listening {
            child,
            addr,
            stderr_path,
        },
        None => {
            let status = child.wait().expect("wait");
            assert!(!status.success(), "exited without listening, yet succeeded");
            Start::Refused {
                stderr: std::fs::read_to_string(&stderr_path).unwrap_or_default(),
            }
        }
    }
}

/// The refusal's text, or a failure saying what the started binary did with the bad value:
/// `probe` gives the status of a request to it (a delivery signed with the empty key), if any.
async fn refusal<F, Fut>(start: Start, probe: F) -> String
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = Option<u16>>,
{
    match start {
        Start::Refused { stderr } => stderr,
        Start::Listening {
            mut child, addr, ..
        } => {
            let answered = probe(addr.clone()).await;
            let _ = child.kill();
            let _ = child.wait();
            panic!("the binary started on {addr}; the probe's answer: {answered:?}")
        }
    }
}

fn assert_names(stderr: &str, needed: &[&str]) {
    for needed in needed {
        assert!(stderr.contains(needed), "{needed:?} missing from: {stderr}");
    }
    assert!(
        !stderr.contains(&STRIPE_SECRET[6..]),
        "a secret shown: {stderr}"
    );
}

/// Issue 26, item 4, Stripe: a rotation list whose second entry is `whsec_` (its variable was
/// unset) would verify any delivery signed with the empty key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_stripe_secret_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let started = start(
        &[("STRIPE_WEBHOOK_SECRET", format!("{STRIPE_SECRET},whsec_"))],
        dir.path(),
    );
    let stderr = refusal(started, |addr| async move {
        let url = format!("{addr}/webhooks/stripe");
        let body = stripe_event("evt_signed_with_nothing", "invoice.paid");
        let r = post_signed(&reqwest::Client::new(), &url, "whsec_", body).await;
        r.ok().map(|r| r.status().as_u16())
    })
    .await;
    assert_names(
        &stderr,
        &["stripe.secrets", "entry 2", "empty after whsec_"],
    );
}

/// Item 4, Standard Webhooks: `whsec_` decodes to the empty HMAC key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_standard_webhooks_secret_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let started = start(
        &[
            ("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET.to_owned()),
            ("DEDUP_STANDARD_WEBHOOKS__SECRETS", "whsec_".to_owned()),
        ],
        dir.path(),
    );
    let stderr = refusal(started, |addr| async move {
        let (id, t, body) = ("msg_signed_with_nothing", now(), br#"{"id":"x"}"#);
        let r = reqwest::Client::new()
            .post(format!("{addr}/webhooks/standard"))
            .header("webhook-id", id)
            .header("webhook-timestamp", t.to_string())
            .header("webhook-signature", standard_signature(&[], id, t, body))
            .body(body.to_vec())
            .send()
            .await;
        r.ok().map(|r| r.status().as_u16())
    })
    .await;
    assert_names(
        &stderr,
        &["standard_webhooks.secrets", "entry 1", "empty after whsec_"],
    );
}

/// Item 4, the HTTP sink's signing secret: deliveries signed with the empty key would prove
/// nothing to the receiver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_sink_signing_secret_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let started = start(
        &[
            ("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET.to_owned()),
            ("DEDUP_SINK_SIGNING_SECRET", "whsec_".to_owned()),
        ],
        dir.path(),
    );
    let stderr = refusal(started, |_| async { None }).await;
    assert_names(
        &stderr,
        &["outbox.signing_secret", "entry 1", "empty after whsec_"],
    );
}

/// Issue 26, item 6: the issue's `dedup_retention_days` stops the start, naming the key and its
/// bound (a release build used to wrap it to a 17-hour window; a debug build panicked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dedup_retention_that_would_wrap_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let started = start(
        &[
            ("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET.to_owned()),
            (
                "DEDUP_CONSUMER__DEDUP_RETENTION_DAYS",
                WRAPPING_DAYS.to_string(),
            ),
        ],
        dir.path(),
    );
    let stderr = refusal(started, |_| async { None }).await;
    assert_names(
        &stderr,
        &[
            "consumer.dedup_retention_days",
            &format!("is {WRAPPING_DAYS}, more than 3650"),
        ],
    );
}

mod two_day_old_generation {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_postgres() {
        outlives_the_wrapping_window(Backend::Postgres).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_sqlite() {
        outlives_the_wrapping_window(Backend::Sqlite).await
    }
}

/// Records `id` in one committed batch; whether it was new.
async fn record(store: &Store, id: &str) -> bool {
    let mut tx = store.begin().await.unwrap();
    let new = tx
        .insert_processed("stripe", &[(id.to_owned(), "invoice.paid".to_owned())])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    !new.is_empty()
}

/// Item 6 at the store: a generation sealed two days ago keeps its ids through a retention pass
/// whose window comes from the issue's `dedup_retention_days` by the conversion the binary uses
/// (saturating: PostgreSQL refuses a window that far back, SQLite finds nothing that old),
/// whereas the window the old multiplication made in a release build (17 hours) empties it.
async fn outlives_the_wrapping_window(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    assert!(record(&store, "evt_two_days_old").await);
    let sealed = store.dedup().seal(whole_days(30)).await.unwrap();
    assert!(sealed.sealed, "{sealed:?}");
    let two_days_back = match backend {
        Backend::Postgres => {
            "UPDATE dedup_generations SET sealed_at = sealed_at - interval '2 days' \
             WHERE sealed_at IS NOT NULL"
        }
        Backend::Sqlite => {
            "UPDATE dedup_generations SET sealed_at = sealed_at - 172800000 \
             WHERE sealed_at IS NOT NULL"
        }
    };
    crate::helpers::db::execute(&store, two_days_back).await;

    match store.dedup().maintain(whole_days(WRAPPING_DAYS)).await {
        Ok(pass) => assert_eq!(pass.expired, 0, "{pass:?}"),
        Err(error) => assert!(
            backend == Backend::Postgres && error.to_string().contains("out of range"),
            "{error}"
        ),
    }
    assert!(
        !record(&store, "evt_two_days_old").await,
        "the two-day-old generation still holds its id"
    );

    // What the bound and the saturation prevent: the release build's product.
    let wrapped = Duration::from_secs(WRAPPING_DAYS.wrapping_mul(86_400));
    assert_eq!(wrapped, Duration::from_secs(61_184));
    let pass = store.dedup().maintain(wrapped).await.unwrap();
    assert_eq!(pass.expired, 1, "{pass:?}");
    assert!(record(&store, "evt_two_days_old").await, "handled twice");
}

/// Item 4's other half: a Stripe secret shorter than Stripe issues (README's quick start uses
/// `whsec_local`) starts, with a WARN naming the key and the entry, not the secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_stripe_secret_starts_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let started = start(
        &[
            (
                "STRIPE_WEBHOOK_SECRET",
                format!("{STRIPE_SECRET},whsec_local"),
            ),
            ("RUST_LOG", "warn".to_owned()),
        ],
        dir.path(),
    );
    let Start::Listening {
        mut child,
        addr,
        stderr_path,
    } = started
    else {
        panic!("refused a short Stripe secret");
    };
    let body = stripe_event("evt_short_secret", "invoice.paid");
    let url = format!("{addr}/webhooks/stripe");
    let r = post_signed(&reqwest::Client::new(), &url, "whsec_local", body)
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "verified under the short secret");
    let _ = child.kill();
    let _ = child.wait();
    let logged = crate::helpers::without_colours(&std::fs::read_to_string(stderr_path).unwrap());
    let warning = logged
        .lines()
        .find(|l| l.contains("WARN") && l.contains("stripe.secrets"))
        .unwrap_or_else(|| panic!("no WARN naming stripe.secrets in: {logged}"));
    assert!(
        warning.contains("entry=2") && warning.contains("chars=5"),
        "{warning}"
    );
    assert!(!warning.contains("whsec_local"), "{warning}");
}

/// Issue 38: a duration set under its former integer key from the environment still starts the
/// binary, read as the same duration, with a WARN naming the old key and the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_former_duration_key_starts_with_a_warning_naming_its_new_key() {
    let dir = tempfile::tempdir().unwrap();
    let started = start(
        &[
            ("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET.to_owned()),
            ("DEDUP_CONSUMER__POLL_INTERVAL_MS", "250".to_owned()),
            ("RUST_LOG", "warn".to_owned()),
        ],
        dir.path(),
    );
    let Start::Listening {
        mut child,
        stderr_path,
        ..
    } = started
    else {
        panic!("refused a former duration key");
    };
    let _ = child.kill();
    let _ = child.wait();
    let logged = crate::helpers::without_colours(&std::fs::read_to_string(stderr_path).unwrap());
    let warning = logged
        .lines()
        .find(|l| l.contains("WARN") && l.contains("consumer.poll_interval_ms"))
        .unwrap_or_else(|| panic!("no WARN naming consumer.poll_interval_ms in: {logged}"));
    assert!(
        warning.contains("deprecated") && warning.contains("`consumer.poll_interval`"),
        "{warning}"
    );
}

/// Issue 38: a duration given under both its keys, or that is no duration, stops the start,
/// naming the keys as written; issue 40: so do a retention past ten years and a search field
/// that is no JSON pointer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duration_given_twice_or_unreadable_stops_the_start() {
    for (env, needed) in [
        (
            vec![("DEDUP_RETENTION__PAYLOAD_DAYS", "3651")],
            vec!["retention.payload_days", "more than 3650"],
        ),
        (
            vec![("DEDUP_SEARCH__CUSTOMER_POINTER", "data/object/customer")],
            vec!["search.customer_pointer", "must start with '/'"],
        ),
        (
            vec![
                ("DEDUP_CONSUMER__LEASE_SECS", "30"),
                ("DEDUP_CONSUMER__LEASE", "30s"),
            ],
            vec!["`consumer.lease_secs`", "`consumer.lease`"],
        ),
        (
            vec![("DEDUP_CONSUMER__LEASE", "10 parsecs")],
            vec!["`consumer.lease`", "10 parsecs", "\"10s\""],
        ),
        (
            vec![("DEDUP_CONSUMER__LEASE_SECS", "1")],
            vec!["`consumer.lease_secs`", "below the minimum of 2s"],
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut env: Vec<(&str, String)> = env.iter().map(|(k, v)| (*k, v.to_string())).collect();
        env.push(("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET.to_owned()));
        let stderr = refusal(start(&env, dir.path()), |_| async { None }).await;
        assert_names(&stderr, &needed);
    }
}

/// Issue 39: a sink's or a route's bad setting refuses the start naming its key, in the
/// environment's form too: a rate of 0, a burst without a rate, a reserved or malformed sink
/// name, a route naming no configured sink, a type pattern with a `*` inside, a `where` that is
/// not a JSON pointer, a breaker ratio above 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_and_route_settings_name_their_key() {
    let dir = tempfile::tempdir().unwrap();
    let billing = (
        "DEDUP_OUTBOX__SINKS__BILLING__URL",
        "http://127.0.0.1:9/hook".to_owned(),
    );
    /// The environment added, and what the refusal must say.
    type Case<'a> = (Vec<(&'a str, String)>, Vec<&'a str>);
    let cases: Vec<Case> = vec![
        (
            vec![
                ("DEDUP_OUTBOX__BURST", "0".into()),
                ("DEDUP_OUTBOX__RATE_PER_SEC", "2".into()),
            ],
            vec!["outbox.burst", "at least 1"],
        ),
        (
            vec![("DEDUP_OUTBOX__RESPONSE_EXCERPT_BYTES", "65537".into())],
            vec!["outbox.response_excerpt_bytes", "65536"],
        ),
        (
            vec![
                billing.clone(),
                ("DEDUP_OUTBOX__SINKS__BILLING__RATE_PER_SEC", "0".into()),
            ],
            vec!["outbox.sinks.billing.rate_per_sec", "above 0"],
        ),
        (
            vec![
                billing.clone(),
                ("DEDUP_OUTBOX__SINKS__BILLING__BURST", "5".into()),
            ],
            vec!["outbox.sinks.billing.burst", "without rate_per_sec"],
        ),
        (
            vec![
                billing.clone(),
                ("DEDUP_OUTBOX__SINKS__BILLING__ORDERED", "true".into()),
                (
                    "DEDUP_OUTBOX__SINKS__BILLING__ORDERING_KEY",
                    "data/object/id".into(),
                ),
            ],
            vec!["outbox.sinks.billing.ordering_key", "must start with '/'"],
        ),
        (
            vec![
                billing.clone(),
                (
                    "DEDUP_OUTBOX__SINKS__BILLING__ORDERING_KEY",
                    "/data/object/id".into(),
                ),
            ],
            vec!["outbox.sinks.billing.ordering_key", "not ordered"],
        ),
        (
            vec![(
                "DEDUP_OUTBOX__SINKS__DEFAULT__URL",
                "http://127.0.0.1:9/hook".into(),
            )],
            vec!["outbox.sinks.default", "reserved"],
        ),
        (
            vec![(
                "DEDUP_OUTBOX__ROUTES",
                r#"[{types=["invoice.*"], sinks=["biling"]}]"#.into(),
            )],
            vec!["outbox.routes[0].sinks", "no sink \"biling\"", "default"],
        ),
        (
            vec![
                billing.clone(),
                (
                    "DEDUP_OUTBOX__ROUTES",
                    r#"[{types=["*.paid"], sinks=["billing"]}]"#.into(),
                ),
            ],
            vec!["outbox.routes[0].types", "may only end"],
        ),
        (
            vec![
                billing.clone(),
                (
                    "DEDUP_OUTBOX__ROUTES",
                    r#"[{where={"data/currency"="eur"}, sinks=["billing"]}]"#.into(),
                ),
            ],
            vec!["outbox.routes[0].where", "must start with '/'"],
        ),
        (
            vec![
                billing,
                (
                    "DEDUP_OUTBOX__SINKS__BILLING__BREAKER__FAILURE_RATIO",
                    "1.5".into(),
                ),
            ],
            vec!["outbox.sinks.billing.breaker.failure_ratio", "at most 1"],
        ),
    ];
    for (mut env, needed) in cases {
        env.push(("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET.to_owned()));
        let stderr = refusal(start(&env, dir.path()), |_| async { None }).await;
        assert_names(&stderr, &needed);
    }
}
