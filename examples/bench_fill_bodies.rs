//! Fills `event_bodies` for bench/history.sh: DAYS past UTC days (today - DAYS .. today - 1) of
//! PER_DAY kept bodies each, so that a retention pass with `payload_days = DAYS - 1` has exactly
//! the oldest day to drop.
//!
//! ```text
//! cargo run --release --example bench_fill_bodies -- --url postgres://postgres@127.0.0.1/DB
//! ```
//! The database must be migrated (`dedup-worker migrate`). Each day is a standalone table (the
//! partition's own layout, `LIKE event_bodies`) filled by `COPY … FROM STDIN` (text format, the
//! body as hex), then given the parent's three indexes and a CHECK of its bounds (so that
//! `ATTACH PARTITION` finds the indexes and skips its validation scan), then attached: building
//! an index once over a full table is several times cheaper than keeping three random-insert
//! indexes up to date row by row. Two days are filled at once (the machine's two cores).
//!
//! What a body is: a Stripe event (invoice, charge or customer object) with varying ids and
//! amounts; events come in pairs about one object (`*.created`, then `*.paid` / `*.succeeded` /
//! `*.updated`), so PER_DAY × DAYS / 2 distinct object ids; the customer of each object drawn from
//! CUSTOMERS by a Zipf law (exponent 0.45: the first few have ~10,000 events of 10 million, the
//! median ~70). Bodies are compressed with the consumer's own codec and their search columns
//! taken by the consumer's own extraction, so bytes and columns are what `serve` would write.
//!
//! Resumable: `public.bench_history_meta` records each finished day; a day in the range without
//! its row is (re)made, a partition older than the range is dropped. Deterministic: the same
//! day's rows are the same on every run.

use std::fmt::Write as _;
use std::time::Instant;

use chrono::{Days, NaiveDate, Utc};
use clap::Parser;
use dedup_worker_core::event::search_keys::{SearchKeys, SearchPointers};
use dedup_worker_core::store::bodies::codec;
use dedup_worker_core::store::dedup_key;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};

#[derive(Debug, Parser)]
struct Args {
    /// The migrated database.
    #[arg(long)]
    url: String,
    /// Past days to fill: today - DAYS .. today - 1 (UTC).
    #[arg(long, default_value_t = 10)]
    days: u32,
    /// Bodies per day.
    #[arg(long, default_value_t = 1_000_000)]
    per_day: u64,
    /// Distinct customers.
    #[arg(long, default_value_t = 100_000)]
    customers: u32,
    /// Days filled at once.
    #[arg(long, default_value_t = 2)]
    threads: usize,
}

/// The Zipf exponent of customers: ~10,000 events for the first of 100,000 out of 10 million.
const ZIPF_EXPONENT: f64 = 0.45;
/// Rows per `COPY` message (~3 MB of hex).
const ROWS_PER_SEND: u64 = 1_000;
/// The schema the library's tables live in.
const SEARCH_PATH: &str = "SET search_path = dedup_worker, public";

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let pool = PgPoolOptions::new()
        .max_connections(args.threads as u32 + 1)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::query(SEARCH_PATH).execute(&mut *conn).await?;
                Ok(())
            })
        })
        .connect(&args.url)
        .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS public.bench_history_meta (
             day DATE PRIMARY KEY, bodies BIGINT NOT NULL, customers INT NOT NULL,
             seconds DOUBLE PRECISION NOT NULL)",
    )
    .execute(&pool)
    .await?;
    let today = Utc::now().date_naive();
    let first = today - Days::new(u64::from(args.days));
    drop_older_than(&pool, first).await?;
    let mut todo = Vec::new();
    for n in 0..args.days {
        let day = first + Days::new(u64::from(n));
        let done: Option<(i64, i32)> = sqlx::query_as(
            "SELECT bodies, customers FROM public.bench_history_meta
              WHERE day = $1 AND to_regclass('event_bodies_p' || to_char(day, 'YYYYMMDD')) IS NOT NULL",
        )
        .bind(day)
        .fetch_optional(&pool)
        .await?;
        if done != Some((args.per_day as i64, args.customers as i32)) {
            todo.push((n, day));
        }
    }
    println!(
        "event_bodies: {} of {} days to fill ({} bodies each)",
        todo.len(),
        args.days,
        args.per_day
    );
    pool.close().await;
    let zipf = Zipf::new(args.customers);
    let todo = std::sync::Mutex::new(todo);
    // A thread per worker, each with a runtime of its own: the rows are made on the thread that
    // sends them (CPU-bound), and a connection's future need not be Send.
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..args.threads)
            .map(|_| {
                scope.spawn(|| {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()?
                        .block_on(fill_days(&args, &zipf, &todo))
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|worker| worker.join().expect("a fill thread panicked"))
    })
}

/// Takes days from `todo` and fills each, until none is left.
async fn fill_days(
    args: &Args,
    zipf: &Zipf,
    todo: &std::sync::Mutex<Vec<(u32, NaiveDate)>>,
) -> anyhow::Result<()> {
    let mut conn = PgConnection::connect(&args.url).await?;
    sqlx::query(SEARCH_PATH).execute(&mut conn).await?;
    loop {
        let next = todo.lock().expect("todo").pop();
        let Some((n, day)) = next else { break };
        let started = Instant::now();
        let ids = u64::from(n) * args.per_day;
        let timings = fill_day(&mut conn, day, ids, args.per_day, zipf).await?;
        let seconds = started.elapsed().as_secs_f64();
        sqlx::query(
            "INSERT INTO public.bench_history_meta VALUES ($1, $2, $3, $4)
             ON CONFLICT (day) DO UPDATE SET bodies = $2, customers = $3, seconds = $4",
        )
        .bind(day)
        .bind(args.per_day as i64)
        .bind(args.customers as i32)
        .bind(seconds)
        .execute(&mut conn)
        .await?;
        println!(
            "{day} (day {} of {}): {timings}, {seconds:.0} s in all",
            n + 1,
            args.days
        );
    }
    Ok(())
}

/// Drops the fill's partitions of days before `first` (a run on a later day).
async fn drop_older_than(pool: &PgPool, first: NaiveDate) -> anyhow::Result<()> {
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
          WHERE i.inhparent = 'event_bodies'::regclass AND c.relname < $1 ORDER BY 1",
    )
    .bind(partition_name(first))
    .fetch_all(pool)
    .await?;
    for name in names {
        println!("{name}: older than the range, dropped");
        sqlx::raw_sql(&format!("DROP TABLE {name}"))
            .execute(pool)
            .await?;
    }
    sqlx::query("DELETE FROM public.bench_history_meta WHERE day < $1")
        .bind(first)
        .execute(pool)
        .await?;
    Ok(())
}

fn partition_name(day: NaiveDate) -> String {
    format!("event_bodies_p{}", day.format("%Y%m%d"))
}

/// One day: a standalone table, COPY, indexes, bounds, ATTACH. Returns what each step took.
async fn fill_day(
    conn: &mut PgConnection,
    day: NaiveDate,
    first_id: u64,
    per_day: u64,
    zipf: &Zipf,
) -> anyhow::Result<String> {
    let part = partition_name(day);
    let (from, to) = (
        format!("{day} 00:00:00+00"),
        format!("{} 00:00:00+00", day + Days::new(1)),
    );
    sqlx::raw_sql(&format!("DROP TABLE IF EXISTS {part}"))
        .execute(&mut *conn)
        .await?;
    sqlx::raw_sql(&format!(
        "CREATE TABLE {part} (LIKE event_bodies INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE)"
    ))
    .execute(&mut *conn)
    .await?;
    let started = Instant::now();
    let pointers = SearchPointers {
        object: "/data/object/id".into(),
        customer: "/data/object/customer".into(),
    };
    let mut copy = conn.copy_in_raw(&format!("COPY {part} FROM STDIN")).await?;
    let mut buf = String::new();
    let mut raw_bytes = 0u64;
    let mut stored_bytes = 0u64;
    for i in 0..per_day {
        let event = stripe_event(first_id + i, zipf);
        let (encoding, body) = codec::encode(event.json.as_bytes());
        let search = SearchKeys::extract(event.json.as_bytes(), &pointers);
        raw_bytes += event.json.len() as u64;
        stored_bytes += body.len() as u64;
        // Spread over the day, in order, as a consumer keeps them.
        let micros = (i * 86_400_000_000 / per_day) as i64;
        let kept_at = day.and_hms_opt(0, 0, 0).expect("midnight").and_utc()
            + chrono::Duration::microseconds(micros);
        let received_at = kept_at - chrono::Duration::milliseconds(150);
        let key = uuid::Uuid::from_bytes(dedup_key("stripe", &event.id));
        let _ = write!(
            buf,
            "{}\t{key}\tstripe\t{}\t{}\t{}\t{}\t\\N\t{}\t{}\t\\\\x",
            kept_at.format("%Y-%m-%d %H:%M:%S%.6f+00"),
            event.id,
            event.event_type,
            search.object_id.as_deref().unwrap_or("\\N"),
            search.customer.as_deref().unwrap_or("\\N"),
            received_at.format("%Y-%m-%d %H:%M:%S%.6f+00"),
            encoding.code(),
        );
        for byte in &body {
            let _ = write!(buf, "{byte:02x}");
        }
        buf.push('\n');
        if (i + 1) % ROWS_PER_SEND == 0 || i + 1 == per_day {
            copy.send(std::mem::take(&mut buf).into_bytes()).await?;
        }
    }
    copy.finish().await?;
    let copy_s = started.elapsed().as_secs_f64();
    let started = Instant::now();
    sqlx::raw_sql("SET maintenance_work_mem = '256MB'")
        .execute(&mut *conn)
        .await?;
    // The parent's three indexes, as the migration defines them, so ATTACH adopts them.
    for index in [
        "(event_id text_pattern_ops, kept_at)",
        "(customer, kept_at) WHERE customer IS NOT NULL",
        "(object_id text_pattern_ops, kept_at) WHERE object_id IS NOT NULL",
    ] {
        sqlx::raw_sql(&format!("CREATE INDEX ON {part} {index}"))
            .execute(&mut *conn)
            .await?;
    }
    let index_s = started.elapsed().as_secs_f64();
    let started = Instant::now();
    sqlx::raw_sql(&format!(
        "ALTER TABLE {part} ADD CONSTRAINT {part}_bounds CHECK (kept_at >= '{from}' AND kept_at < '{to}')"
    ))
    .execute(&mut *conn)
    .await?;
    sqlx::raw_sql(&format!(
        "ALTER TABLE event_bodies ATTACH PARTITION {part} FOR VALUES FROM ('{from}') TO ('{to}')"
    ))
    .execute(&mut *conn)
    .await?;
    sqlx::raw_sql(&format!("ALTER TABLE {part} DROP CONSTRAINT {part}_bounds"))
        .execute(&mut *conn)
        .await?;
    sqlx::raw_sql(&format!("VACUUM ANALYZE {part}"))
        .execute(&mut *conn)
        .await?;
    let attach_s = started.elapsed().as_secs_f64();
    Ok(format!(
        "COPY {copy_s:.0} s ({} B raw → {} B stored per body), indexes {index_s:.0} s, \
         attach + VACUUM ANALYZE {attach_s:.0} s",
        raw_bytes / per_day.max(1),
        stored_bytes / per_day.max(1)
    ))
}

/// splitmix64: a fast, well-mixed, deterministic stream from a counter.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A Stripe-like id: PREFIX_ then 24 base-62 characters of `seed`.
fn stripe_id(prefix: &str, seed: u64) -> String {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut id = String::with_capacity(prefix.len() + 25);
    id.push_str(prefix);
    id.push('_');
    let (mut a, mut b) = (mix(seed), mix(seed ^ 0x5555_5555));
    for n in 0..24 {
        let word = if n < 12 { &mut a } else { &mut b };
        id.push(ALPHABET[(*word % 62) as usize] as char);
        *word /= 62;
    }
    id
}

/// Customer ranks by a Zipf law: the cumulative weights, searched with a uniform draw.
struct Zipf {
    cumulative: Vec<f64>,
}

impl Zipf {
    fn new(customers: u32) -> Self {
        let mut total = 0.0;
        let cumulative = (1..=customers)
            .map(|rank| {
                total += f64::from(rank).powf(-ZIPF_EXPONENT);
                total
            })
            .collect::<Vec<_>>();
        let cumulative = cumulative.into_iter().map(|c| c / total).collect();
        Zipf { cumulative }
    }

    /// The rank (1-based) a uniform `draw` in [0, 1) falls on.
    fn rank(&self, draw: f64) -> u64 {
        self.cumulative.partition_point(|&c| c < draw) as u64 + 1
    }
}

struct StripeEvent {
    id: String,
    event_type: &'static str,
    json: String,
}

/// Event `n` of the fill: the second of each pair updates the first one's object.
fn stripe_event(n: u64, zipf: &Zipf) -> StripeEvent {
    let object = n / 2;
    let later = n % 2 == 1;
    let seed = mix(object);
    let draw = (seed >> 11) as f64 / (1u64 << 53) as f64;
    let customer = stripe_id("cus", zipf.rank(draw) << 32);
    let id = stripe_id("evt", n | 1 << 63);
    let created = 1_790_000_000 + n / 12;
    let amount = 500 + (mix(seed) % 250_000);
    let (event_type, data) = match seed % 10 {
        0..=4 => {
            let kind = if later {
                "invoice.paid"
            } else {
                "invoice.created"
            };
            (
                kind,
                invoice(&stripe_id("in", object), &customer, amount, created, later),
            )
        }
        5..=8 => {
            let kind = if later {
                "charge.succeeded"
            } else {
                "charge.pending"
            };
            (
                kind,
                charge(&stripe_id("ch", object), &customer, amount, created, later),
            )
        }
        _ => {
            let kind = if later {
                "customer.updated"
            } else {
                "customer.created"
            };
            (kind, customer_object(&customer, seed, created))
        }
    };
    let json = format!(
        r#"{{"id":"{id}","object":"event","api_version":"2024-06-20","created":{created},"data":{{"object":{data}}},"livemode":true,"pending_webhooks":1,"request":{{"id":"req_{:x}","idempotency_key":"{:x}-{:x}"}},"type":"{event_type}"}}"#,
        mix(n),
        mix(n + 1),
        mix(n + 2)
    );
    StripeEvent {
        id,
        event_type,
        json,
    }
}

fn invoice(id: &str, customer: &str, amount: u64, created: u64, paid: bool) -> String {
    let line = stripe_id("il", created);
    let price = stripe_id("price", amount);
    let product = stripe_id("prod", amount / 100);
    let sub = stripe_id("sub", created / 7);
    format!(
        r#"{{"id":"{id}","object":"invoice","account_country":"DE","account_name":"Example GmbH","amount_due":{amount},"amount_paid":{paid_amount},"amount_remaining":{left},"attempt_count":{attempts},"attempted":{paid},"auto_advance":false,"billing_reason":"subscription_cycle","collection_method":"charge_automatically","created":{created},"currency":"eur","customer":"{customer}","customer_email":"billing+{amount}@example.com","customer_name":"Customer {amount}","default_payment_method":null,"description":null,"hosted_invoice_url":"https://invoice.stripe.com/i/acct_1Example/test_{id}","invoice_pdf":"https://pay.stripe.com/invoice/acct_1Example/test_{id}/pdf","lines":{{"object":"list","data":[{{"id":"{line}","object":"line_item","amount":{amount},"currency":"eur","description":"1 × Plan (at €{euros}.00 / month)","period":{{"end":{end},"start":{created}}},"price":{{"id":"{price}","object":"price","product":"{product}","unit_amount":{amount},"recurring":{{"interval":"month","interval_count":1}}}},"quantity":1,"subscription":"{sub}","type":"subscription"}}],"has_more":false,"total_count":1,"url":"/v1/invoices/{id}/lines"}},"number":"EX-{number:06}","paid":{paid},"period_end":{created},"period_start":{start},"status":"{status}","subscription":"{sub}","subtotal":{amount},"tax":null,"total":{amount}}}"#,
        paid_amount = if paid { amount } else { 0 },
        left = if paid { 0 } else { amount },
        attempts = u8::from(paid),
        euros = amount / 100,
        end = created + 2_592_000,
        start = created - 2_592_000,
        number = created % 1_000_000,
        status = if paid { "paid" } else { "open" },
    )
}

fn charge(id: &str, customer: &str, amount: u64, created: u64, done: bool) -> String {
    let intent = stripe_id("pi", created);
    let method = stripe_id("pm", amount);
    format!(
        r#"{{"id":"{id}","object":"charge","amount":{amount},"amount_captured":{captured},"amount_refunded":0,"balance_transaction":"txn_{created:x}","billing_details":{{"address":{{"city":"Berlin","country":"DE","line1":"Street {amount}","postal_code":"10{zip:03}"}},"email":"pay+{amount}@example.com","name":"Customer {amount}"}},"captured":{done},"created":{created},"currency":"eur","customer":"{customer}","description":"Subscription update","livemode":true,"outcome":{{"network_status":"approved_by_network","risk_level":"normal","risk_score":{risk},"seller_message":"Payment complete.","type":"authorized"}},"paid":{done},"payment_intent":"{intent}","payment_method":"{method}","payment_method_details":{{"card":{{"brand":"visa","country":"DE","exp_month":{month},"exp_year":2029,"fingerprint":"{finger:x}","funding":"credit","last4":"{last4:04}","network":"visa"}},"type":"card"}},"receipt_url":"https://pay.stripe.com/receipts/{id}","refunded":false,"status":"{status}"}}"#,
        captured = if done { amount } else { 0 },
        zip = amount % 1000,
        risk = amount % 90,
        month = amount % 12 + 1,
        finger = mix(amount),
        last4 = amount % 10_000,
        status = if done { "succeeded" } else { "pending" },
    )
}

fn customer_object(customer: &str, seed: u64, created: u64) -> String {
    format!(
        r#"{{"id":"{customer}","object":"customer","address":{{"city":"Hamburg","country":"DE","line1":"Weg {n}","postal_code":"20{zip:03}"}},"balance":0,"created":{created},"currency":"eur","default_source":null,"delinquent":false,"description":"Customer {n}","email":"someone+{n}@example.com","invoice_prefix":"{prefix:X}","invoice_settings":{{"default_payment_method":"pm_{seed:x}"}},"livemode":true,"metadata":{{"account":"{n}"}},"name":"Some One {n}","phone":"+4940{n:07}","preferred_locales":["de"],"tax_exempt":"none"}}"#,
        n = seed % 10_000_000,
        zip = seed % 1000,
        prefix = seed % 0xFFFF_FFFF,
    )
}
