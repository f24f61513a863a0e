//! The OAuth receiver: a client credentials token endpoint and a receiver wanting its bearer
//! token, which it revokes once; a sink with the right secret and one with a wrong one.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use base64::Engine;

use super::{binary, idempotency_key, ids, lane_rows, send, CLIENT_ID, CLIENT_SECRET};
use crate::helpers::{serve, Backend, TestDb};

const WRONG_SECRET: &str = "cs-Xw3k-not-the-secret";

/// The OAuth stand-ins' state: tokens the receiver takes, fetches by outcome, deliveries.
#[derive(Default)]
struct OAuthState {
    valid: HashSet<String>,
    issued: usize,
    refused_fetches: usize,
    accepted: Vec<String>,
    unauthorized: usize,
}

type Shared = Arc<Mutex<OAuthState>>;

/// `POST /token`: RFC 6749 §4.4's client credentials grant, the client authenticated with HTTP
/// Basic (§2.3.1); `POST /hook`: a receiver that takes `Authorization: Bearer <valid token>`
/// and revokes the token after the fifth delivery it accepts (a rotation before its time).
async fn oauth_stand_ins() -> (String, String, Shared) {
    async fn token(
        State(state): State<Shared>,
        headers: HeaderMap,
        body: String,
    ) -> impl IntoResponse {
        let form: Vec<(String, String)> = form_urlencoded::parse(body.as_bytes())
            .into_owned()
            .collect();
        let basic = base64::engine::general_purpose::STANDARD
            .encode(format!("{CLIENT_ID}:{CLIENT_SECRET}"));
        let authenticated = headers.get("authorization").and_then(|v| v.to_str().ok())
            == Some(format!("Basic {basic}").as_str());
        let mut state = state.lock().unwrap();
        if !authenticated || !form.contains(&("grant_type".into(), "client_credentials".into())) {
            state.refused_fetches += 1;
            let error = serde_json::json!({
                "error": "invalid_client",
                "error_description": "client authentication failed",
            });
            return (StatusCode::UNAUTHORIZED, axum::Json(error)).into_response();
        }
        state.issued += 1;
        let access_token = format!("at-{}-{}", state.issued, uuid::Uuid::new_v4().simple());
        state.valid.insert(access_token.clone());
        let grant = serde_json::json!({
            "access_token": access_token,
            "token_type": "Bearer",
            "expires_in": 3600,
        });
        (
            StatusCode::OK,
            [("cache-control", "no-store")],
            axum::Json(grant),
        )
            .into_response()
    }
    async fn hook(State(state): State<Shared>, headers: HeaderMap) -> impl IntoResponse {
        let presented = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default()
            .to_owned();
        let mut state = state.lock().unwrap();
        if !state.valid.contains(&presented) {
            state.unauthorized += 1;
            return (
                StatusCode::UNAUTHORIZED,
                [("www-authenticate", r#"Bearer error="invalid_token""#)],
            )
                .into_response();
        }
        state.accepted.push(idempotency_key(&headers));
        if state.accepted.len() == 5 {
            state.valid.remove(&presented);
        }
        StatusCode::OK.into_response()
    }
    let state: Shared = Arc::default();
    let addr = serve(
        Router::new()
            .route("/token", post(token))
            .route("/hook", post(hook))
            .with_state(state.clone()),
    )
    .await;
    (
        format!("http://{addr}/token"),
        format!("http://{addr}/hook"),
        state,
    )
}

#[tokio::test]
async fn an_oauth_receiver_gets_every_event_with_a_token_renewed_on_401() {
    let db = TestDb::new(Backend::Sqlite).await;
    let work = tempfile::tempdir().unwrap();
    let (token_url, hook_url, state) = oauth_stand_ins().await;
    let mut owned = vec![(
        "DEDUP_OUTBOX__ROUTES".to_owned(),
        r#"[{sinks=["oauth", "wrong"]}]"#.to_owned(),
    )];
    for (sink, secret) in [("OAUTH", CLIENT_SECRET), ("WRONG", WRONG_SECRET)] {
        let key = |k: &str| format!("DEDUP_OUTBOX__SINKS__{sink}__{k}");
        owned.extend([
            (key("URL"), hook_url.clone()),
            (key("OAUTH__TOKEN_URL"), token_url.clone()),
            (key("OAUTH__CLIENT_ID"), CLIENT_ID.to_owned()),
            (key("OAUTH__CLIENT_SECRET"), secret.to_owned()),
            (key("OAUTH__SCOPE"), "webhooks:write".to_owned()),
        ]);
    }
    let env: Vec<(&str, String)> = owned.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let app = binary(&db, work.path(), &env);
    let sent = ids("evt_oauth", 20);
    send(&app, &sent).await;
    let rows = app
        .wait_for(
            "every row of the OAuth sink marked",
            Duration::from_secs(30),
            || async {
                let rows = lane_rows(&db, "oauth").await;
                (rows.len() == sent.len() && rows.iter().all(|(s, _, _)| s == "dispatched"))
                    .then_some(rows)
            },
        )
        .await;
    // The 401 to the revoked token was answered by a fresh token within the same attempt.
    assert!(
        rows.iter().all(|(_, attempts, _)| *attempts == 1),
        "{rows:?}"
    );
    let wrong = app
        .wait_for(
            "the wrong secret's deliveries failed",
            Duration::from_secs(20),
            || async {
                let rows = lane_rows(&db, "wrong").await;
                (rows.len() == sent.len() && rows.iter().all(|(_, _, error)| error.is_some()))
                    .then_some(rows)
            },
        )
        .await;
    {
        let state = state.lock().unwrap();
        let accepted: HashSet<&String> = state.accepted.iter().collect();
        assert_eq!(
            accepted.len(),
            sent.len(),
            "every event reached the receiver"
        );
        assert_eq!(state.accepted.len(), sent.len(), "each once");
        assert_eq!(
            state.issued, 2,
            "a token, then one more after the receiver revoked it"
        );
        assert!(
            state.unauthorized >= 1,
            "the receiver refused the revoked token"
        );
        assert!(state.refused_fetches >= 1);
    }
    for (status, _, error) in &wrong {
        let error = error.as_deref().unwrap_or_default();
        assert_ne!(status, "dispatched");
        assert!(
            error.contains("OAuth token endpoint") && error.contains("401 invalid_client"),
            "{error}"
        );
        assert!(!error.contains(WRONG_SECRET), "{error}");
    }
    let logged = app.stderr();
    let tokens: Vec<String> = state.lock().unwrap().valid.iter().cloned().collect();
    for secret in [CLIENT_SECRET, WRONG_SECRET]
        .into_iter()
        .chain(tokens.iter().map(String::as_str))
        .chain(["at-1-", "at-2-"])
    {
        assert!(
            !logged.contains(secret),
            "{secret:?} is in the binary's logs"
        );
    }
}
