//! The plan's draws: the same seed gives the same plan, and each draw has its share.

use std::collections::{HashMap, HashSet};

use super::*;
use crate::workload::foreign_body;

fn json(plan: &Plan) -> String {
    serde_json::to_string(plan).expect("a plan serialises")
}

#[test]
fn a_seed_gives_one_plan_and_another_seed_another() {
    let plan = Plan::generate(42, 120, 30, 60, 4);
    assert_eq!(json(&plan), json(&Plan::generate(42, 120, 30, 60, 4)));
    assert_ne!(json(&plan), json(&Plan::generate(43, 120, 30, 60, 4)));
    assert!(!plan.faults.is_empty());
}

#[test]
fn the_stream_mixes_duplicates_thin_events_and_old_events_in_order() {
    let plan = Plan::generate(7, 300, 30, 60, 6);
    assert_eq!(plan.events.len(), 9_000);
    assert!(plan.posts.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
    assert!(plan.posts.iter().all(|p| p.at_ms < 300_000));
    let copies = plan.posts.iter().filter(|p| p.copy > 0).count();
    let thin = plan
        .posts
        .iter()
        .filter(|p| p.shape == Shape::Thin && p.copy == 0)
        .count();
    let old = plan
        .events
        .iter()
        .filter(|e| e.created_offset_secs < 0)
        .count();
    for (what, n, share) in [
        ("duplicates", copies, DUPLICATED * 2.0),
        ("thin events", thin, THIN_PAIRS),
        ("old events", old, OLD_EVENTS),
    ] {
        let expected = share * 9_000.0;
        assert!(
            (n as f64 - expected).abs() < expected * 0.2,
            "{what}: {n}, expected about {expected}"
        );
    }
    let to_sqs = plan.posts.iter().filter(|p| p.ingress >= 4).count() as f64;
    let share = to_sqs / plan.posts.len() as f64;
    assert!((0.17..0.23).contains(&share), "SQS share {share}");
    // Every thin post has its snapshot event posted too: one change, two shapes (except at
    // the very end, where the snapshot's turn may fall after the run).
    let thin_posts = plan.posts.iter().filter(|p| p.shape == Shape::Thin);
    for thin in thin_posts.filter(|p| p.at_ms < 295_000) {
        assert!(plan
            .posts
            .iter()
            .any(|p| p.event == thin.event && p.shape == Shape::Snapshot));
    }
}

#[test]
fn faults_come_every_few_seconds_and_pauses_outlast_every_lease() {
    let plan = Plan::generate(9, 600, 10, 60, 4);
    assert!(plan.faults.windows(2).all(|w| {
        let gap = w[1].at_ms - w[0].at_ms;
        gap <= 4 * 6_000
    }));
    assert!(plan.faults.iter().all(|f| f.at_ms >= 3_000));
    let mut kinds = std::collections::HashSet::new();
    for fault in &plan.faults {
        kinds.insert(fault.kind.name());
        match fault.kind {
            FaultKind::Pause { ms, .. } => assert!(ms > Tuning::MAX_LEASE_SECS * 1_000),
            FaultKind::Latency { latency_ms, ms, .. } => {
                assert!((200..2_000).contains(&latency_ms));
                assert!((5_000..40_000).contains(&ms));
            }
            _ => {}
        }
    }
    let all: std::collections::HashSet<&str> = crate::faults::FAULT_NAMES.into_iter().collect();
    assert_eq!(kinds, all, "every kind of fault in ten minutes");
}

#[test]
fn each_run_draws_an_isolation_and_one_to_four_workers_four_the_most_common() {
    let mut isolations = std::collections::HashSet::new();
    let mut workers = [0u32; 5];
    for seed in 0..300 {
        let plan = Plan::generate(seed, 10, 5, 60, 1);
        isolations.insert(plan.isolation);
        workers[plan.workers as usize] += 1;
        // The run's settings do not depend on its length or rate.
        let longer = Plan::generate(seed, 20, 7, 60, 1);
        assert_eq!(
            (plan.isolation, plan.workers),
            (longer.isolation, longer.workers)
        );
    }
    assert_eq!(isolations.len(), 3, "{isolations:?}");
    assert_eq!(workers[0], 0);
    assert!(workers[1..4].iter().all(|n| *n > 20), "{workers:?}");
    assert!(workers[4] > 120, "four workers half the time: {workers:?}");
    // A reload draws from the same distribution.
    let mut rng = StdRng::seed_from_u64(1);
    let reloads: Vec<u32> = (0..600).map(|_| Tuning::draw(&mut rng).workers).collect();
    assert!(reloads.iter().all(|w| (1..=4).contains(w)));
    assert!(reloads.iter().filter(|w| **w == 4).count() > 240);
}

#[test]
fn a_change_on_two_channels_is_sent_on_both_at_the_same_moment() {
    let plan = Plan::generate(11, 300, 20, 60, 4);
    let twins: Vec<(usize, Twin)> = plan
        .events
        .iter()
        .enumerate()
        .filter_map(|(i, e)| Some((i, e.twin?)))
        .collect();
    let expected = TWO_CHANNELS * plan.events.len() as f64;
    assert!(
        (twins.len() as f64 - expected).abs() < expected * 0.25,
        "{} changes on two channels, expected about {expected}",
        twins.len()
    );
    let mut kinds = std::collections::HashSet::new();
    // Whether a thin copy went to the webhook's queue: both happen.
    let mut lanes = std::collections::HashSet::new();
    for (event, twin) in twins {
        kinds.insert(twin);
        let first = plan
            .posts
            .iter()
            .find(|p| p.event == event && p.copy == 0 && p.shape == Shape::Snapshot);
        let Some(first) = first else {
            continue; // its moment fell after the run
        };
        assert!(first.at_once);
        match twin {
            Twin::ThinWebhook => assert!(plan.posts.iter().any(|p| p.event == event
                && p.shape == Shape::Thin
                && p.at_once
                && p.at_ms == first.at_ms)),
            Twin::EventBridge | Twin::ThinOwnId => {
                let direct = plan
                    .direct
                    .iter()
                    .find(|d| d.event == Some(event))
                    .expect("the second channel is planned");
                assert_eq!(direct.at_ms, first.at_ms);
                assert_eq!(direct.key, plan.events[event].key);
                match twin {
                    Twin::EventBridge => {
                        assert_eq!(direct.kind, DirectKind::EventBridge);
                        assert_eq!(direct.lane, Lane::Sqs);
                    }
                    _ => {
                        assert_eq!(direct.kind, DirectKind::ThinOwnId);
                        lanes.insert(direct.lane == LAYOUT[first.ingress].lane);
                    }
                }
            }
        }
    }
    assert_eq!(kinds.len(), 3, "{kinds:?}");
    assert_eq!(lanes.len(), 2, "the same queue and another");
    // Nothing else is sent at once.
    assert!(plan
        .posts
        .iter()
        .filter(|p| p.at_once)
        .all(|p| plan.events[p.event].twin.is_some()));
}

#[test]
fn the_foreign_producer_mixes_ids_lanes_and_its_own_repeats() {
    let plan = Plan::generate(12, 300, 40, 60, 4);
    let foreign: Vec<&Direct> = plan.direct.iter().filter(|d| d.event.is_none()).collect();
    assert!(plan.direct.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
    assert!(plan.direct.iter().all(|d| d.at_ms < 300_000));
    let firsts = foreign.iter().filter(|d| d.copy == 0).count();
    // 40 events a second: two foreign messages a second (less the last second's overflow).
    assert!((590..=600).contains(&firsts), "{firsts}");
    let share = |f: &dyn Fn(&Direct) -> bool| {
        foreign.iter().filter(|d| d.copy == 0 && f(d)).count() as f64 / firsts as f64
    };
    for (what, got, want) in [
        ("with id", share(&|d| d.kind == DirectKind::ForeignId), 0.5),
        (
            "body id",
            share(&|d| d.kind == DirectKind::ForeignBodyId),
            0.3,
        ),
        ("no id", share(&|d| d.kind == DirectKind::ForeignNoId), 0.2),
        ("database", share(&|d| d.lane == Lane::Database), 0.4),
        ("rabbitmq", share(&|d| d.lane == Lane::Rabbitmq), 0.4),
        ("sqs", share(&|d| d.lane == Lane::Sqs), 0.2),
    ] {
        assert!(
            (got - want).abs() < 0.07,
            "{what}: {got}, expected about {want}"
        );
    }
    let repeats = foreign.iter().filter(|d| d.copy == 1).count() as f64;
    assert!((repeats / firsts as f64 - 0.2).abs() < 0.06, "{repeats}");
    for repeat in foreign.iter().filter(|d| d.copy == 1) {
        let first = foreign
            .iter()
            .find(|d| d.copy == 0 && d.key == repeat.key)
            .expect("a repeat of a message sent");
        assert!(repeat.at_ms > first.at_ms);
        assert_eq!((repeat.kind, repeat.lane), (first.kind, first.lane));
    }
    // A foreign body names its key, and carries an id only where the kind says so.
    for d in foreign.iter().take(50) {
        let body: serde_json::Value = serde_json::from_slice(&foreign_body(d)).unwrap();
        assert_eq!(body["soak_key"], d.key.as_str());
        assert_eq!(
            body.get("id").is_some(),
            d.kind == DirectKind::ForeignBodyId
        );
    }
}

#[test]
fn every_run_of_twenty_seconds_or_more_crashes_postgres_loses_its_answers_and_duplicates_an_sqs_receive(
) {
    for seed in 0..200 {
        let plan = Plan::generate(seed, 60, 20, 60, 4);
        let names: Vec<&str> = plan.faults.iter().map(|f| f.kind.name()).collect();
        assert!(names.contains(&"pg_kill"), "seed {seed}: {names:?}");
        assert!(names.contains(&"sqs_duplicate"), "seed {seed}: {names:?}");
        assert!(
            plan.faults.iter().any(|f| matches!(
                f.kind,
                FaultKind::Partition {
                    dependency: Dependency::Postgres,
                    mode: Partition::LoseAnswers,
                    ..
                }
            )),
            "seed {seed}: {names:?}"
        );
        assert!(plan.faults.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
        // A crash of the server never overlaps a partition of its proxy.
        for crash in &plan.faults {
            let FaultKind::PgCrash { down_ms } = crash.kind else {
                continue;
            };
            assert!((500..5_000).contains(&down_ms));
            let crash_end = crash.at_ms + down_ms + 6_000;
            for other in &plan.faults {
                if let FaultKind::Partition {
                    dependency: Dependency::Postgres,
                    ms,
                    ..
                } = other.kind
                {
                    let apart = other.at_ms + ms <= crash.at_ms || crash_end <= other.at_ms;
                    assert!(apart, "seed {seed}: {crash:?} and {other:?}");
                }
            }
        }
    }
    let short = Plan::generate(1, 10, 20, 60, 4);
    assert!(short.faults.len() <= 3);
}

#[test]
fn the_workload_counts_name_every_kind() {
    let plan = Plan::generate(13, 120, 20, 60, 4);
    let counts = crate::workload::counts(&plan);
    for name in [
        "webhook_snapshot",
        "webhook_thin",
        "webhook_duplicate",
        "old_created",
        "two_channels_eventbridge",
        "two_channels_thin_own_id",
        "two_channels_thin_webhook",
        "foreign_with_id",
        "foreign_body_id",
        "foreign_no_id",
        "foreign_republished",
    ] {
        assert!(
            counts.get(name).is_some_and(|n| *n > 0),
            "{name}: {counts:?}"
        );
    }
    assert_eq!(
        counts["webhook_snapshot"] + counts["webhook_thin"] + counts["webhook_duplicate"],
        plan.posts.len() as u64
    );
}

#[test]
fn api_calls_mix_tenants_twins_replays_and_shared_keys_on_the_api_processes() {
    for process in crate::cluster::API_PROCESSES {
        assert_eq!(LAYOUT[process].role, crate::cluster::Role::Api);
    }
    let plan = Plan::generate(14, 300, 20, 60, 4).with_api(5);
    assert_eq!(plan.api.len(), 1_500);
    assert!(plan.api.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
    let share = |n: usize| n as f64 / plan.api.len() as f64;
    let at_once = share(plan.api.iter().filter(|c| c.at_once).count());
    let resent = share(plan.api.iter().filter(|c| !c.resends_ms.is_empty()).count());
    assert!((0.05..0.15).contains(&at_once), "{at_once}");
    assert!((0.2..0.4).contains(&resent), "{resent}");
    let tenants: HashSet<&str> = plan.api.iter().map(|c| c.tenant.as_str()).collect();
    assert!(tenants.len() >= 4, "{tenants:?}");
    let mut scopes_of_key: HashMap<&str, HashSet<&str>> = HashMap::new();
    for call in &plan.api {
        scopes_of_key
            .entry(&call.key)
            .or_default()
            .insert(&call.tenant);
    }
    assert!(scopes_of_key.values().any(|tenants| tenants.len() > 1));
    // Each operation's scope once: a second call there would be a 422 by right.
    let scopes: HashSet<(&str, &str)> = plan.api.iter().map(|c| (&*c.tenant, &*c.key)).collect();
    assert_eq!(scopes.len(), plan.api.len());
    // The rest of the plan does not move with the API's calls.
    let without = Plan::generate(14, 300, 20, 60, 4);
    let faults = |p: &Plan| serde_json::to_string(&p.faults).expect("faults serialise");
    assert_eq!(faults(&without), faults(&plan));
}
