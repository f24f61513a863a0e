//! `events list` and the console's `/events` against a model, on both stores: random sets of
//! events (handled in any generation, seen again as duplicates, dead-lettered, held back as
//! stale, waiting in the database queue) at a handful of times, so that many share one
//! instant as a batch's rows do; then random filters (type prefix, source, since, until,
//! outcome, id) read page by page with random page sizes.
//!
//! Checked: the pages, concatenated, are exactly the model's rows for the filter, newest first
//! (ties by outcome, then key or id), each row once: a keyset cursor that rounded a time or
//! mis-ordered a tie would skip or repeat rows of one instant; every page but the last is full
//! and says there is more, the last says there is not.
//!
//! Deterministic: a fixed seed (`PROPTEST_RNG_SEED` overrides it), no failure persistence.

use std::time::Duration;

use dedup_worker_core::inspect::{list_events, EventQuery, ListOptions, OutcomeFilter};
use dedup_worker_core::store::{dedup_key, ListedKind, Store};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestRunner};

use crate::helpers::db::execute;
use crate::helpers::{Backend, TestDb};

const TYPES: &[&str] = &[
    "invoice.paid",
    "invoice.payment_failed",
    "charge.succeeded",
    "customer.created",
];
const PREFIXES: &[&str] = &["", "invoice.", "invoice.paid", "charge", "c", "x"];
/// Few instants, so that ties are the rule (ms; 2026-12-04).
const TIMES: &[i64] = &[
    1_796_378_000_000,
    1_796_378_000_001,
    1_796_378_060_000,
    1_796_378_060_000 + 999,
];
const SOURCES: &[&str] = &["stripe", "shop"];
const DEFAULT_SOURCE: &str = "stripe";

/// One event and what happened to it.
#[derive(Debug, Clone)]
struct Spec {
    source: usize,
    type_index: usize,
    /// Handled in this slot at this time.
    handled: Option<(i16, usize)>,
    /// Later deliveries seen as duplicates, at these times (distinct).
    duplicates: Vec<usize>,
    dead_letter: Option<usize>,
    stale: Option<usize>,
    /// Waiting in the database queue (source named or not).
    pending: Option<(usize, bool)>,
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        0..SOURCES.len(),
        0..TYPES.len(),
        proptest::option::of((0i16..5, 0..TIMES.len())),
        proptest::collection::btree_set(0..TIMES.len(), 0..3),
        proptest::option::weighted(0.3, 0..TIMES.len()),
        proptest::option::weighted(0.2, 0..TIMES.len()),
        proptest::option::weighted(0.2, (0..TIMES.len(), any::<bool>())),
    )
        .prop_map(
            |(source, type_index, handled, duplicates, dead_letter, stale, pending)| Spec {
                source,
                type_index,
                duplicates: if handled.is_some() {
                    duplicates.into_iter().collect()
                } else {
                    Vec::new()
                },
                handled,
                dead_letter,
                stale,
                pending,
            },
        )
}

#[derive(Debug, Clone)]
struct Search {
    prefix: usize,
    since: Option<usize>,
    until: Option<usize>,
    outcome: usize,
    /// Search by the id of this spec (modulo their number).
    id: Option<usize>,
    /// Only this source's events (`--source`, the console's Source filter).
    source: Option<usize>,
    page: i64,
}

fn search() -> impl Strategy<Value = Search> {
    (
        0..PREFIXES.len(),
        proptest::option::of(0..TIMES.len()),
        proptest::option::of(0..TIMES.len()),
        0..OutcomeFilter::NAMES.len(),
        proptest::option::weighted(0.2, any::<usize>()),
        proptest::option::weighted(0.3, 0..SOURCES.len()),
        1i64..6,
    )
        .prop_map(|(prefix, since, until, outcome, id, source, page)| Search {
            prefix,
            since,
            until,
            outcome,
            id,
            source,
            page,
        })
}

/// A row as the model lists it: (time, kind, tie) descending is the order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Row {
    at_ms: i64,
    kind: ListedKind,
    tie: (Vec<u8>, i64),
    source: String,
    event_id: String,
    event_type: String,
}

fn model(specs: &[Spec]) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut next_id = 0;
    for (n, s) in specs.iter().enumerate() {
        let source = SOURCES[s.source].to_owned();
        let event_id = format!("evt_{n}");
        let key = dedup_key(&source, &event_id).to_vec();
        let row = |at: usize, kind, tie| Row {
            at_ms: TIMES[at],
            kind,
            tie,
            source: source.clone(),
            event_id: event_id.clone(),
            event_type: TYPES[s.type_index].to_owned(),
        };
        if let Some((_, at)) = s.handled {
            rows.push(row(at, ListedKind::Handled, (key.clone(), 0)));
        }
        for &at in &s.duplicates {
            rows.push(row(at, ListedKind::Duplicate, (key.clone(), 0)));
        }
        for (kind, at) in [
            (ListedKind::DeadLetter, s.dead_letter),
            (ListedKind::Stale, s.stale),
            (ListedKind::Pending, s.pending.map(|p| p.0)),
        ] {
            if let Some(at) = at {
                next_id += 1;
                let mut listed = row(at, kind, (Vec::new(), next_id));
                if kind == ListedKind::Pending && s.pending.is_some_and(|(_, named)| !named) {
                    // A message that names no source is the consumer's (`consumer.source`).
                    listed.source = DEFAULT_SOURCE.to_owned();
                }
                rows.push(listed);
            }
        }
    }
    rows
}

/// Writes the specs' rows with the model's ids and times.
async fn write(store: &Store, specs: &[Spec], postgres: bool) {
    for table in [
        "processed_events_0",
        "processed_events_1",
        "processed_events_2",
        "processed_events_3",
        "processed_events_4",
        "dead_letters",
        "stale_events",
        "queue_messages",
    ] {
        execute(store, &format!("DELETE FROM {table}")).await;
    }
    let dd_tables: Vec<String> = if postgres {
        vec!["duplicate_deliveries".into()]
    } else {
        (0..5)
            .map(|s| format!("duplicate_deliveries_{s}"))
            .collect()
    };
    for table in &dd_tables {
        execute(store, &format!("DELETE FROM {table}")).await;
    }
    let time = |ms: i64| {
        if postgres {
            format!("('epoch'::timestamptz + {ms} * interval '1 millisecond')")
        } else {
            ms.to_string()
        }
    };
    let key = |bytes: &[u8]| {
        if postgres {
            format!("'{}'::uuid", hex::encode(bytes))
        } else {
            format!("x'{}'", hex::encode(bytes))
        }
    };
    let payload = if postgres {
        "'\\x7b7d'::bytea"
    } else {
        "x'7b7d'"
    };
    let mut next_id = 0;
    for (n, s) in specs.iter().enumerate() {
        let (source, event_id, event_type) =
            (SOURCES[s.source], format!("evt_{n}"), TYPES[s.type_index]);
        let k = dedup_key(source, &event_id);
        if let Some((slot, at)) = s.handled {
            execute(store, &format!(
                "INSERT INTO processed_events_{slot} (key, source, event_id, event_type, processed_at) VALUES ({}, '{source}', '{event_id}', '{event_type}', {})",
                key(&k), time(TIMES[at])
            )).await;
            for &at in &s.duplicates {
                let sql = if postgres {
                    format!("INSERT INTO duplicate_deliveries (slot, key, seen_at, event_type) VALUES ({slot}, {}, {}, '{event_type}')", key(&k), time(TIMES[at]))
                } else {
                    format!(
                        "INSERT INTO duplicate_deliveries_{slot} (key, seen_at, event_type) VALUES ({}, {}, '{event_type}')",
                        key(&k),
                        time(TIMES[at])
                    )
                };
                execute(store, &sql).await;
            }
        }
        if let Some(at) = s.dead_letter {
            next_id += 1;
            execute(store, &format!(
                "INSERT INTO dead_letters (id, source, event_id, event_type, queue, payload, error, attempts, created_at)
                 VALUES ({next_id}, '{source}', '{event_id}', '{event_type}', 'q', {payload}, 'failed', 1, {})", time(TIMES[at])
            )).await;
        }
        if let Some(at) = s.stale {
            next_id += 1;
            execute(store, &format!(
                "INSERT INTO stale_events (id, source, event_id, event_type, object_id, version, newer_event_id, newer_version, recorded_at)
                 VALUES ({next_id}, '{source}', '{event_id}', '{event_type}', 'obj', 1, 'evt_newer', 2, {})", time(TIMES[at])
            )).await;
        }
        if let Some((at, named)) = s.pending {
            next_id += 1;
            let source = if named {
                format!("'{source}'")
            } else {
                "NULL".into()
            };
            execute(store, &format!(
                "INSERT INTO queue_messages (id, queue, message_id, message_type, payload, source, enqueued_at, visible_at)
                 VALUES ({next_id}, 'q', '{event_id}', '{event_type}', {payload}, {source}, {t}, {t})", t = time(TIMES[at])
            )).await;
        }
    }
}

/// The rows the filter selects, in the listing's order.
fn expected(rows: &[Row], search: &Search, specs: &[Spec]) -> Vec<Row> {
    let prefix = PREFIXES[search.prefix];
    let outcome = OutcomeFilter::parse(OutcomeFilter::NAMES[search.outcome]).expect("a name");
    let id = search
        .id
        .filter(|_| !specs.is_empty())
        .map(|i| format!("evt_{}", i % specs.len()));
    let mut selected: Vec<Row> = rows
        .iter()
        .filter(|r| r.event_type.starts_with(prefix))
        .filter(|r| search.since.is_none_or(|s| r.at_ms >= TIMES[s]))
        .filter(|r| search.until.is_none_or(|u| r.at_ms < TIMES[u]))
        .filter(|r| match outcome {
            OutcomeFilter::Any => true,
            OutcomeFilter::Only(kind) => r.kind == kind,
        })
        .filter(|r| id.as_ref().is_none_or(|id| &r.event_id == id))
        .filter(|r| search.source.is_none_or(|s| r.source == SOURCES[s]))
        .cloned()
        .collect();
    selected.sort_by(|a, b| b.cmp(a));
    selected
}

async fn check(store: &Store, specs: &[Spec], search: &Search) -> Result<(), TestCaseError> {
    let options = ListOptions {
        statement_timeout: Duration::from_secs(10),
        sources: SOURCES.iter().map(|s| s.to_string()).collect(),
        default_source: DEFAULT_SOURCE.into(),
        database_queue: true,
    };
    let id = search
        .id
        .filter(|_| !specs.is_empty())
        .map(|i| format!("evt_{}", i % specs.len()));
    let mut query = EventQuery {
        id,
        type_prefix: Some(PREFIXES[search.prefix].to_owned()),
        source: search.source.map(|s| SOURCES[s].to_owned()),
        since_ms: search.since.map(|s| TIMES[s]),
        until_ms: search.until.map(|u| TIMES[u]),
        outcome: OutcomeFilter::parse(OutcomeFilter::NAMES[search.outcome]).expect("a name"),
        cursor: None,
        limit: search.page,
        ..EventQuery::default()
    };
    let want = expected(&model(specs), search, specs);
    let mut got = Vec::new();
    // Each page's rows and its `previous`, to walk back through with `before`.
    let mut pages: Vec<(Vec<ListedRow>, Option<String>)> = Vec::new();
    for page_number in 0.. {
        prop_assert!(page_number <= want.len(), "more pages than rows: {got:?}");
        let page = list_events(store, &query, &options)
            .await
            .map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
        prop_assert!(page.events.len() as i64 <= search.page);
        if page.next.is_some() {
            prop_assert_eq!(
                page.events.len() as i64,
                search.page,
                "a page that says there is more is full"
            );
        }
        let rows: Vec<ListedRow> = page
            .events
            .into_iter()
            .map(|e| (e.at_ms, e.outcome, e.source, e.event_id, e.event_type))
            .collect();
        got.extend(rows.iter().cloned());
        pages.push((rows, page.previous));
        match page.next {
            Some(next) => query.cursor = Some(next),
            None => break,
        }
    }
    let want: Vec<_> = want
        .into_iter()
        .map(|r| {
            (
                r.at_ms,
                dedup_worker_core::inspect::kind_name(r.kind),
                r.source,
                r.event_id,
                r.event_type,
            )
        })
        .collect();
    prop_assert_eq!(got, want, "pages of {:?}", search);
    // Back: each page's "newer" link gives the page before it, the first page gives none.
    prop_assert!(pages[0].1.is_none(), "nothing is newer than the first page");
    for k in 1..pages.len() {
        let before = pages[k].1.clone();
        prop_assert!(before.is_some(), "page {} links to newer rows", k);
        let newer = list_events(
            store,
            &EventQuery {
                cursor: None,
                before,
                ..query.clone()
            },
            &options,
        )
        .await
        .map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
        let rows: Vec<ListedRow> = newer
            .events
            .into_iter()
            .map(|e| (e.at_ms, e.outcome, e.source, e.event_id, e.event_type))
            .collect();
        prop_assert_eq!(&rows, &pages[k - 1].0, "page {} back from {}", k - 1, k);
        prop_assert_eq!(
            newer.previous.is_some(),
            k > 1,
            "page {} has newer rows",
            k - 1
        );
    }
    Ok(())
}

/// A listed row as compared: time, outcome, source, id, type.
type ListedRow = (i64, &'static str, String, String, String);

fn run(backend: Backend) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let db = rt.block_on(TestDb::new(backend));
    let store = rt.block_on(db.store());
    let postgres = backend == Backend::Postgres;
    let mut config = Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    };
    if let RngSeed::Random = config.rng_seed {
        config.rng_seed = RngSeed::Fixed(28);
    }
    let mut runner = TestRunner::new(config);
    let strategy = (
        proptest::collection::vec(spec(), 0..24),
        proptest::collection::vec(search(), 1..6),
    );
    let result = runner.run(&strategy, |(specs, searches)| {
        rt.block_on(async {
            write(&store, &specs, postgres).await;
            for search in &searches {
                check(&store, &specs, search).await?;
            }
            Ok(())
        })
    });
    rt.block_on(store.close());
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn pages_are_the_model_on_sqlite() {
    run(Backend::Sqlite);
}

#[test]
fn pages_are_the_model_on_postgres() {
    run(Backend::Postgres);
}
