//! The searches of kept bodies at bench/history.sh's size, timed: WARMUP untimed then N timed
//! executions per shape over one connection, as prepared statements (what sqlx and the store
//! do: after five executions PostgreSQL may switch to a generic plan, which is measured too);
//! p50 / p95 / max per shape, a JSON line of them, then `EXPLAIN (ANALYZE, BUFFERS)` of each.
//!
//! ```text
//! cargo run --release --example bench_history_reads -- --url postgres://postgres@127.0.0.1/DB
//! ```
//! The statements are in [`SHAPES`], in one place, to be swapped for the store's own.
//! Which customer and which ids: found first, untimed: the heaviest customers of one day (the
//! fill's Zipf law puts ~10,000 events on the first of them), light ones (5–10 events that day,
//! ~70 in all), and a sample of object and event ids from every day.

use std::time::{Duration, Instant};

use clap::Parser;
use dedup_worker_core::store::bodies::codec;
use sqlx::postgres::PgRow;
use sqlx::{Connection, PgConnection, Row};

#[derive(Debug, Parser)]
struct Args {
    /// The filled database.
    #[arg(long)]
    url: String,
    /// Timed executions per shape.
    #[arg(long, default_value_t = 200)]
    n: usize,
    /// Untimed executions first.
    #[arg(long, default_value_t = 20)]
    warmup: usize,
    /// Print the EXPLAINs.
    #[arg(long)]
    explain: bool,
}

/// The listing's columns: what a result row shows (the body is read by the event page).
const COLUMNS: &str = "kept_at, key, source, event_id, event_type, object_id, customer";

/// Newest first, a page of 50 and one more (to know there is a next page); the second page by
/// keyset below the first page's last (kept_at, key).
const CUSTOMER_FIRST: &str = "WHERE customer = $1 ORDER BY kept_at DESC, key DESC LIMIT 51";
const CUSTOMER_NEXT: &str = "WHERE customer = $1 AND (kept_at, key) < ($2, $3)
     ORDER BY kept_at DESC, key DESC LIMIT 51";
const OBJECT_FIRST: &str = "WHERE object_id = $1 ORDER BY kept_at DESC, key DESC LIMIT 51";
/// An event id searched (no time known: every partition).
const EVENT_ID: &str = "WHERE event_id = $1 ORDER BY kept_at DESC, key DESC LIMIT 51";
/// The event page: id, source and kept_at (= the dedup record's processed_at), body included.
const EVENT_PAGE: &str = "SELECT kept_at, event_type, object_id, customer, headers, encoding, body
     FROM event_bodies WHERE event_id = $1 AND source = 'stripe' AND kept_at = $2";

/// What one execution binds.
#[derive(Clone)]
enum Bind {
    Text(String),
    Next(String, chrono::DateTime<chrono::Utc>, uuid::Uuid),
    Page(String, chrono::DateTime<chrono::Utc>),
}

struct Shape {
    name: &'static str,
    sql: String,
    binds: Vec<Bind>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut conn = PgConnection::connect(&args.url).await?;
    sqlx::query("SET search_path = dedup_worker, public")
        .execute(&mut conn)
        .await?;
    let shapes = shapes(&mut conn).await?;
    let mut json = Vec::new();
    println!(
        "{:<34} {:>8} {:>8} {:>8} {:>6}",
        "shape", "p50 ms", "p95 ms", "max ms", "rows"
    );
    for shape in &shapes {
        let mut times = Vec::with_capacity(args.n);
        let mut rows = 0;
        for i in 0..args.warmup + args.n {
            let bind = &shape.binds[i % shape.binds.len()];
            let started = Instant::now();
            let got = run(&mut conn, &shape.sql, bind).await?;
            if shape.name.starts_with("event page") {
                for row in &got {
                    codec::decode(row.get("encoding"), row.get::<&[u8], _>("body"))?;
                }
            }
            if i >= args.warmup {
                times.push(started.elapsed());
                rows += got.len();
            }
        }
        times.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let (p50, p95, max) = (
            ms(times[times.len() / 2]),
            ms(times[(times.len() * 95).div_ceil(100) - 1]),
            ms(times[times.len() - 1]),
        );
        println!(
            "{:<34} {p50:>8.2} {p95:>8.2} {max:>8.2} {:>6.1}",
            shape.name,
            rows as f64 / times.len() as f64
        );
        json.push(serde_json::json!({"shape": shape.name, "p50": p50, "p95": p95, "max": max}));
    }
    println!("JSON {}", serde_json::Value::Array(json));
    if args.explain {
        for shape in &shapes {
            println!("-- EXPLAIN (ANALYZE, BUFFERS): {}", shape.name);
            let explain = format!("EXPLAIN (ANALYZE, BUFFERS) {}", shape.sql);
            for row in run(&mut conn, &explain, &shape.binds[0]).await? {
                println!("   {}", row.get::<String, _>(0));
            }
        }
    }
    Ok(())
}

async fn run(conn: &mut PgConnection, sql: &str, bind: &Bind) -> sqlx::Result<Vec<PgRow>> {
    let query = sqlx::query(sql);
    let query = match bind {
        Bind::Text(a) => query.bind(a),
        Bind::Next(a, at, key) => query.bind(a).bind(at).bind(key),
        Bind::Page(a, at) => query.bind(a).bind(at),
    };
    query.fetch_all(conn).await
}

/// The shapes and their parameters, found with untimed queries.
async fn shapes(conn: &mut PgConnection) -> anyhow::Result<Vec<Shape>> {
    let list = |filter: &str| format!("SELECT {COLUMNS} FROM event_bodies {filter}");
    // One full day: the newest partition of the fill (not today's, which a consumer may fill).
    let day: String = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
          WHERE i.inhparent = 'event_bodies'::regclass AND c.reltuples > 0
          ORDER BY c.relname DESC LIMIT 1",
    )
    .fetch_one(&mut *conn)
    .await?;
    let per_customer: Vec<(String, i64)> = sqlx::query_as(&format!(
        "SELECT customer, count(*) FROM {day} WHERE customer IS NOT NULL GROUP BY customer"
    ))
    .fetch_all(&mut *conn)
    .await?;
    let mut heavy = per_customer.clone();
    heavy.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    let heavy: Vec<String> = heavy.into_iter().take(3).map(|(c, _)| c).collect();
    let light: Vec<String> = per_customer
        .into_iter()
        .filter(|(_, n)| (5..=10).contains(n))
        .take(200)
        .map(|(c, _)| c)
        .collect();
    let sample: Vec<(String, String, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "SELECT object_id, event_id, kept_at FROM event_bodies TABLESAMPLE SYSTEM (0.05)
          WHERE object_id IS NOT NULL AND kept_at < date_trunc('day', now()) LIMIT 200",
    )
    .fetch_all(&mut *conn)
    .await?;
    let totals: Vec<i64> = sqlx::query_scalar(
        "SELECT count(*) FROM event_bodies WHERE customer = ANY($1) GROUP BY customer",
    )
    .bind(&heavy)
    .fetch_all(&mut *conn)
    .await?;
    println!(
        "heavy customers {heavy:?}: {totals:?} events; light: {} of ~5-10 a day",
        light.len()
    );
    let heavy_next = cursors(conn, &list(CUSTOMER_FIRST), &heavy).await?;
    let light_next = cursors(conn, &list(CUSTOMER_FIRST), &light).await?;
    let texts = |v: &[String]| v.iter().cloned().map(Bind::Text).collect::<Vec<_>>();
    let objects: Vec<Bind> = sample.iter().map(|s| Bind::Text(s.0.clone())).collect();
    let events: Vec<Bind> = sample.iter().map(|s| Bind::Text(s.1.clone())).collect();
    let pages: Vec<Bind> = sample
        .iter()
        .map(|s| Bind::Page(s.1.clone(), s.2))
        .collect();
    let mut shapes = vec![
        Shape {
            name: "customer heavy, first page",
            sql: list(CUSTOMER_FIRST),
            binds: texts(&heavy),
        },
        Shape {
            name: "customer heavy, second page",
            sql: list(CUSTOMER_NEXT),
            binds: heavy_next,
        },
        Shape {
            name: "customer light, first page",
            sql: list(CUSTOMER_FIRST),
            binds: texts(&light),
        },
        Shape {
            name: "customer light, second page",
            sql: list(CUSTOMER_NEXT),
            binds: light_next,
        },
        Shape {
            name: "object id",
            sql: list(OBJECT_FIRST),
            binds: objects,
        },
        Shape {
            name: "event id (any day)",
            sql: list(EVENT_ID),
            binds: events,
        },
        Shape {
            name: "event page (id + kept_at, body)",
            sql: EVENT_PAGE.into(),
            binds: pages,
        },
    ];
    shapes.retain(|s| !s.binds.is_empty());
    Ok(shapes)
}

/// The second page's cursors: each customer's first page's 50th row (none under 51 rows).
async fn cursors(
    conn: &mut PgConnection,
    first_page: &str,
    customers: &[String],
) -> anyhow::Result<Vec<Bind>> {
    let mut binds = Vec::new();
    for customer in customers {
        let rows = run(conn, first_page, &Bind::Text(customer.clone())).await?;
        if rows.len() > 50 {
            let last = &rows[49];
            binds.push(Bind::Next(
                customer.clone(),
                last.get("kept_at"),
                last.get("key"),
            ));
        }
    }
    Ok(binds)
}
