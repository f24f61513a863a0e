//! The API checker judged on fabricated histories: it must name every violation it claims to.

use super::*;

fn attempt(tenant: &str, key: &str, status: Option<u16>, replayed: bool, body: &str) -> Record {
    Record::Api {
        t_sent: 0,
        t: 1,
        tenant: tenant.into(),
        key: key.into(),
        call: 0,
        stream: 0,
        attempt: 1,
        process: 12,
        status,
        replayed,
        body: (!body.is_empty()).then(|| body.into()),
        error: None,
    }
}

fn answer(id: i64, tenant: &str, seen: &str, nonce: &str) -> String {
    serde_json::json!({
        "charge": format!("ch_{id}"), "tenant": tenant, "amount": 500, "seen_tenant": seen,
        "process": "api-0#1", "backend_pid": 7, "nonce": nonce,
    })
    .to_string()
}

fn row(id: i64, tenant: &str, key: &str, pid: i32) -> ApiEffectRow {
    ApiEffectRow {
        id,
        tenant: tenant.into(),
        idem_key: key.into(),
        amount: 500,
        seen_tenant: String::new(),
        process: "api-0#1".into(),
        backend_pid: pid,
    }
}

/// A history the layer kept its promise in: a timeout, a 409, a 5xx, the answer, a replay.
fn clean() -> (Vec<Record>, Vec<ApiEffectRow>) {
    let first = answer(1, "tenant_0", "", "n1");
    let records = vec![
        attempt("tenant_0", "k1", None, false, ""),
        attempt("tenant_0", "k1", Some(409), false, "{}"),
        attempt(
            "tenant_0",
            "k1",
            Some(500),
            false,
            r#"{"error":"drawn failure","seen_tenant":""}"#,
        ),
        attempt(
            "tenant_0",
            "k1",
            Some(500),
            false,
            r#"{"title":"Internal error"}"#,
        ),
        attempt("tenant_0", "k1", Some(201), false, &first),
        attempt("tenant_0", "k1", Some(201), true, &first),
        // The same key under another tenant: its own operation.
        attempt(
            "tenant_1",
            "k1",
            Some(201),
            false,
            &answer(2, "tenant_1", "", "n2"),
        ),
    ];
    (
        records,
        vec![row(1, "tenant_0", "k1", 7), row(2, "tenant_1", "k1", 7)],
    )
}

#[test]
fn a_clean_history_holds_and_is_counted() {
    let (records, rows) = clean();
    let found = check(&records, &rows);
    assert!(found.holds(), "{found:?}");
    assert_eq!((found.calls, found.answered, found.attempts), (2, 2, 7));
    assert_eq!(
        (found.replays, found.conflicts, found.server_errors),
        (1, 1, 2)
    );
    assert_eq!((found.handler_failures, found.commits_refused), (1, 1));
    assert_eq!(found.no_answer, 1);
    assert_eq!(found.keys_shared_across_tenants, 2);
    assert_eq!(found.connection_reused_across_tenants, 1);
}

#[test]
fn a_second_execution_is_doubled_and_its_answer_differs() {
    let (mut records, mut rows) = clean();
    records.push(attempt(
        "tenant_0",
        "k1",
        Some(201),
        false,
        &answer(3, "tenant_0", "", "n3"),
    ));
    rows.push(row(3, "tenant_0", "k1", 8));
    let found = check(&records, &rows);
    assert_eq!(found.doubled, ["tenant_0/k1"]);
    assert_eq!(found.replay_differs, ["tenant_0/k1"]);
    assert!(!found.holds());
}

#[test]
fn a_2xx_with_nothing_stored_is_missing_and_another_rows_answer_a_mismatch() {
    let (records, rows) = clean();
    let found = check(&records, &rows[1..]);
    assert_eq!(found.missing_effect, ["tenant_0/k1"]);
    // Tenant 1's answer names tenant 0's row.
    let mut swapped = rows.clone();
    swapped[1].id = 9;
    let found = check(&records, &swapped);
    assert_eq!(found.effect_mismatch, ["tenant_1/k1"]);
}

#[test]
fn another_requests_session_state_is_a_leak_in_an_answer_or_a_row() {
    let (mut records, mut rows) = clean();
    records.push(attempt(
        "tenant_2",
        "k2",
        Some(500),
        false,
        r#"{"error":"drawn failure","seen_tenant":"tenant_0"}"#,
    ));
    let found = check(&records, &rows);
    assert_eq!(found.session_leaks, ["tenant_2/k2"]);
    rows[1].seen_tenant = "tenant_0".into();
    let found = check(&records, &rows);
    assert_eq!(found.session_leaks, ["tenant_1/k1", "tenant_2/k2"]);
}

#[test]
fn a_refusal_and_a_row_of_no_call_are_findings() {
    let (mut records, mut rows) = clean();
    records.push(attempt("tenant_3", "k3", Some(422), false, "{}"));
    rows.push(row(4, "tenant_4", "k4", 9));
    let found = check(&records, &rows);
    assert_eq!(found.rejected, ["tenant_3/k3"]);
    assert_eq!(found.unexpected, ["tenant_4/k4"]);
}
