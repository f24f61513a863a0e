//! The retrying client: one key per operation, retried on 5xx, 408, 409 and network errors,
//! not on other 4xx (the double-charge timeline, a lost response and a retry charging once, is
//! the checkout example's test).
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use axum::Router;
use http::{HeaderMap, StatusCode};
use idempotency_key::{IdempotentClient, RetryPolicy};
use serde_json::json;

use crate::helpers::serve;

fn quick_client() -> IdempotentClient {
    IdempotentClient::new(reqwest::Client::new()).with_policy(RetryPolicy {
        max_retries: 6,
        min_delay: Duration::from_millis(20),
        max_delay: Duration::from_millis(500),
        max_retry_after: Duration::from_secs(2),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_helper_retries_with_one_key_and_stops_on_other_4xx() {
    use axum::routing::post as route_post;
    use std::sync::Mutex;

    #[derive(Clone, Default)]
    struct Script {
        replies: Arc<Mutex<Vec<u16>>>,
        keys: Arc<Mutex<Vec<String>>>,
    }
    async fn scripted(State(s): State<Script>, headers: HeaderMap) -> Response {
        s.keys.lock().unwrap().push(
            headers
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned(),
        );
        let status = {
            let mut r = s.replies.lock().unwrap();
            if r.is_empty() {
                200
            } else {
                r.remove(0)
            }
        };
        let mut resp = Response::new(Body::from("{}"));
        *resp.status_mut() = StatusCode::from_u16(status).unwrap();
        if status == 409 {
            resp.headers_mut()
                .insert("retry-after", "1".parse().unwrap());
        }
        resp
    }
    let client = quick_client();
    for (script, final_status, attempts) in [
        (vec![503, 500, 408, 409, 201], 201, 5),
        (vec![400], 400, 1),
        (vec![402], 402, 1),
        (vec![422], 422, 1),
        (vec![502, 404], 404, 2),
    ] {
        let s = Script::default();
        *s.replies.lock().unwrap() = script.clone();
        let addr = serve(
            Router::new()
                .route("/op", route_post(scripted))
                .with_state(s.clone()),
        )
        .await;
        let r = client
            .post_json(&format!("http://{addr}/op"), None, &json!({"x": 1}))
            .await
            .unwrap();
        assert_eq!(r.status.as_u16(), final_status, "{script:?}");
        assert_eq!(r.attempts, attempts, "{script:?}");
        let keys = s.keys.lock().unwrap().clone();
        assert_eq!(keys.len(), attempts as usize);
        assert!(
            keys.iter().all(|k| k == r.key.as_str()),
            "one key per operation: {keys:?}"
        );
    }
    // Network errors are retried, then reported.
    let err = client
        .post_json("http://127.0.0.1:1/op", None, &json!({}))
        .await
        .unwrap_err();
    match err {
        idempotency_key::ClientError::Network { attempts, .. } => assert_eq!(attempts, 7),
        other => panic!("unexpected {other}"),
    }
}
