//! The checker judged on fabricated histories: it must name every violation it claims to.

use super::*;
use crate::cluster::Lane;

fn invoke(key: &str) -> Record {
    Record::Invoke {
        t: 0,
        key: key.into(),
        post: 0,
        copy: 0,
        shape: Shape::Snapshot,
        ingress: 0,
        attempt: 1,
        at_once: false,
    }
}

fn complete(key: &str, outcome: Outcome, status: Option<u16>) -> Record {
    Record::Complete {
        t: 1,
        key: key.into(),
        post: 0,
        attempt: 1,
        outcome,
        status,
        error: None,
    }
}

fn sink(key: &str, idempotency_key: &str) -> Record {
    Record::Sink {
        t: 2,
        key: key.into(),
        idempotency_key: Some(idempotency_key.into()),
        payload_id: key.into(),
    }
}

fn effect(key: &str, at_secs: i64) -> EffectRow {
    EffectRow {
        event_id: key.into(),
        payload_id: key.into(),
        process: "p".into(),
        backend_pid: 1,
        delivery_attempt: 1,
        inserted_at_us: at_secs * 1_000_000,
    }
}

#[test]
fn a_clean_history_holds() {
    let records = [
        invoke("a"),
        complete("a", Outcome::Ok, Some(200)),
        sink("a", "a"),
        sink("a", "a"),
    ];
    let found = check(&records, &[effect("a", 0)], &[], 60);
    assert!(found.holds(), "{found:?}");
    assert_eq!(found.sink_redeliveries_same_key, 1);
    assert_eq!(found.events_accepted, 1);
}

#[test]
fn every_violation_is_named() {
    let records = [
        invoke("lost"),
        complete("lost", Outcome::Ok, Some(200)),
        invoke("twice"),
        complete("twice", Outcome::Ok, Some(200)),
        sink("twice", "twice"),
        sink("twice", "other"),
        invoke("late"),
        complete("late", Outcome::Ok, Some(200)),
        sink("late", "late"),
        invoke("maybe"),
        complete("maybe", Outcome::Info, Some(503)),
        sink("maybe", "maybe"),
        invoke("bad"),
        complete("bad", Outcome::Fail, Some(400)),
        sink("ghost", "ghost"),
    ];
    let effects = [
        effect("lost", 0),
        effect("twice", 0),
        effect("twice", 59),
        effect("late", 0),
        effect("late", 61),
        effect("maybe", 0),
    ];
    let found = check(&records, &effects, &[], 60);
    assert!(!found.holds());
    assert_eq!(found.lost, ["lost"]);
    assert_eq!(found.doubled, ["twice"]);
    assert_eq!(found.reaccepted_after_window, ["late"]);
    assert_eq!(found.unexpected, ["ghost"]);
    assert_eq!(found.rejected, ["bad"]);
    assert_eq!(found.recovered, 1);
    assert_eq!(found.sink_redeliveries_other_key, 1);
    assert_eq!(found.sink_wrong_key, 1);
    assert!(found.missing_effect.is_empty());
}

fn ended(drained: bool) -> EndState {
    EndState {
        drained,
        ..EndState::default()
    }
}

#[test]
fn a_clean_drained_history_passes_the_verdict() {
    let records = [
        invoke("a"),
        complete("a", Outcome::Ok, Some(200)),
        sink("a", "a"),
    ];
    let found = check(&records, &[effect("a", 0)], &[], 60);
    assert_eq!(
        verdict(&found, &no_api(), ended(true)),
        Vec::<String>::new()
    );
}

#[test]
fn a_history_of_503s_fails_the_verdict() {
    // Every post answered 503, nothing at the sink: nothing lost, nothing doubled, and still no
    // evidence of anything; before the verdict counted acceptance this passed.
    let mut records = Vec::new();
    for key in ["a", "b", "c"] {
        records.push(invoke(key));
        records.push(complete(key, Outcome::Info, Some(503)));
    }
    let found = check(&records, &[], &[], 60);
    assert!(found.holds(), "no violation of the promise as such");
    let why = verdict(&found, &no_api(), ended(true));
    assert_eq!(why.len(), 1, "{why:?}");
    assert!(why[0].contains("accepted 0 of 3"), "{why:?}");
}

#[test]
fn fewer_than_nine_in_ten_accepted_fails_and_nine_in_ten_passes() {
    let history = |accepted: usize| {
        let mut records = Vec::new();
        let mut effects = Vec::new();
        for i in 0..10 {
            let key = format!("k{i}");
            records.push(invoke(&key));
            if i < accepted {
                records.push(complete(&key, Outcome::Ok, Some(200)));
                records.push(sink(&key, &key));
                effects.push(effect(&key, 0));
            } else {
                records.push(complete(&key, Outcome::Info, None));
            }
        }
        check(&records, &effects, &[], 60)
    };
    assert!(verdict(&history(9), &no_api(), ended(true)).is_empty());
    let why = verdict(&history(8), &no_api(), ended(true));
    assert!(
        why.iter().any(|w| w.contains("accepted 8 of 10")),
        "{why:?}"
    );
}

#[test]
fn an_unfinished_drain_fails_the_verdict() {
    let records = [
        invoke("a"),
        complete("a", Outcome::Ok, Some(200)),
        sink("a", "a"),
    ];
    let found = check(&records, &[effect("a", 0)], &[], 60);
    assert_eq!(
        verdict(&found, &no_api(), ended(false)),
        ["the drain did not finish"]
    );
}

#[test]
fn the_end_state_s_findings_fail_the_verdict() {
    let records = [
        invoke("a"),
        complete("a", Outcome::Ok, Some(200)),
        sink("a", "a"),
    ];
    let found = check(&records, &[effect("a", 0)], &[], 60);
    let end = EndState {
        drained: true,
        outbox_failed: 2,
        crashes: 3,
    };
    assert_eq!(
        verdict(&found, &no_api(), end),
        ["outbox_failed: 2", "crashes: 3"]
    );
}

fn publish(key: &str, kind: DirectKind, keyed_as: Option<&str>) -> Record {
    Record::Publish {
        t: 0,
        key: key.into(),
        kind: kind.name().into(),
        lane: Lane::Database,
        copy: 0,
        attempt: 1,
        outcome: Outcome::Ok,
        keyed_as: keyed_as.map(str::to_owned),
        error: None,
    }
}

fn at_once(key: &str) -> Record {
    match invoke(key) {
        Record::Invoke {
            t,
            key,
            post,
            copy,
            shape,
            ingress,
            attempt,
            ..
        } => Record::Invoke {
            t,
            key,
            post,
            copy,
            shape,
            ingress,
            attempt,
            at_once: true,
        },
        other => other,
    }
}

#[test]
fn a_change_handled_on_each_of_two_channels_is_doubled_under_its_own_key() {
    // "pair": the webhook and the thin event under its own id, both handled (two keys to the
    // consumer, one change); "once": the same, handled once (the thin event's delivery only).
    let records = [
        at_once("pair"),
        complete("pair", Outcome::Ok, Some(200)),
        publish("pair", DirectKind::ThinOwnId, Some("pair_thin")),
        sink("pair", "pair"),
        sink("pair", "pair_thin"),
        at_once("once"),
        complete("once", Outcome::Info, Some(503)),
        publish("once", DirectKind::ThinOwnId, Some("once_thin")),
        sink("once", "once_thin"),
    ];
    let mut thin = effect("pair_thin", 1);
    thin.payload_id = "pair_thin".into();
    let effects = [effect("pair", 0), thin, effect("once_thin", 0)];
    let found = check(&records, &effects, &[], 60);
    assert_eq!(found.doubled, ["pair"]);
    assert_eq!(found.doubled_two_channels, ["pair"]);
    let by_kind: Vec<(&str, usize)> = found
        .doubled_two_channels_by_kind
        .iter()
        .map(|(k, n)| (k.as_str(), *n))
        .collect();
    assert_eq!(by_kind, [("two_channels_thin_own_id/database", 1)]);
    assert_eq!(found.two_channel_changes, 2);
    assert_eq!(
        found.sink_wrong_key, 0,
        "the thin event's own id is an alias"
    );
    assert_eq!(found.sink_redeliveries_other_key, 1);
    assert!(found.unexpected.is_empty(), "{found:?}");
    assert!(found.lost.is_empty() && found.missing_effect.is_empty());
    let why = verdict(&found, &no_api(), ended(true));
    assert!(
        why.contains(&"doubled_two_channels: 1".to_owned()),
        "{why:?}"
    );
}

#[test]
fn foreign_messages_are_judged_like_events_and_id_less_ones_by_their_dead_letters() {
    let dead = |event_id: &str, soak_key: Option<&str>| DeadLetterRow {
        event_id: event_id.into(),
        soak_key: soak_key.map(str::to_owned),
        error: "no message id".into(),
    };
    let records = [
        publish("f_id", DirectKind::ForeignId, None),
        sink("f_id", "f_id"),
        publish("f_lost", DirectKind::ForeignBodyId, None),
        publish("f_none", DirectKind::ForeignNoId, None),
        publish("f_none_twice", DirectKind::ForeignNoId, None),
        publish("f_none_missing", DirectKind::ForeignNoId, None),
    ];
    let effects = [effect("f_id", 0), effect("f_lost", 0)];
    let dead_letters = [
        dead("", Some("f_none")),
        dead("", Some("f_none_twice")),
        dead("", Some("f_none_twice")),
        dead("evt_other", None),
    ];
    let found = check(&records, &effects, &dead_letters, 60);
    assert_eq!(found.events_accepted, 2, "id-less messages are not events");
    assert_eq!(found.lost, ["f_lost"]);
    assert_eq!(found.dead_lettered_as_promised, 2);
    assert_eq!(found.dead_letter_missing, ["f_none_missing"]);
    assert_eq!(found.dead_letter_unexpected, ["evt_other"]);
    assert!(found.doubled.is_empty(), "a second dead letter is allowed");
}

/// A run with no API calls: nothing of the layer to judge.
fn no_api() -> ApiFindings {
    ApiFindings::default()
}

#[test]
fn the_apis_violations_and_unanswered_calls_fail_the_verdict() {
    let found = check(
        &[invoke("evt_1"), complete("evt_1", Outcome::Ok, Some(200))],
        &[],
        &[],
        60,
    );
    let mut api = ApiFindings {
        calls: 10,
        answered: 10,
        ..ApiFindings::default()
    };
    api.session_leaks.push("tenant_0/k".into());
    let why = verdict(&found, &api, ended(true));
    assert!(why.contains(&"api_session_leaks: 1".to_owned()), "{why:?}");
    let api = ApiFindings {
        calls: 10,
        answered: 8,
        ..ApiFindings::default()
    };
    let why = verdict(&found, &api, ended(true));
    assert!(
        why.iter()
            .any(|w| w.starts_with("answered 8 of 10 API calls")),
        "{why:?}"
    );
}
