//! The token cache's rules with a stand-in fetch (one fetch for many waiting deliveries, a 401
//! dropping only its own token, failures shared, a failed renewal keeping the live token), and
//! the token request's shape against a local endpoint.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};

use futures::future::join_all;

use super::*;

const SECRET: &str = "s3cr3t:with&odd=chars";

fn settings(token_url: &str, auth_method: OAuthAuthMethod) -> SinkOAuthSettings {
    SinkOAuthSettings {
        token_url: Some(token_url.to_owned()),
        client_id: Some("relay:one".to_owned()),
        client_secret: Some(Secret(SECRET.to_owned())),
        scope: Some("webhooks:write".to_owned()),
        audience: None,
        auth_method,
    }
}

fn source() -> TokenSource {
    TokenSource::new(
        reqwest::Client::new(),
        &settings("http://127.0.0.1:9/token", OAuthAuthMethod::Basic),
    )
}

/// A fetch that counts itself and, after a short wait (so that others queue behind it), grants
/// `tok-N` for 100 s, or fails when `fail` is set.
async fn fetch(count: &AtomicUsize, fail: bool) -> Result<Grant, TokenError> {
    let n = count.fetch_add(1, Ordering::SeqCst) + 1;
    tokio::time::sleep(Duration::from_millis(30)).await;
    if fail {
        return Err(TokenError::Refused {
            status: 503,
            error: None,
            description: None,
        });
    }
    Ok(Grant {
        access_token: format!("tok-{n}"),
        life: Duration::from_secs(100),
    })
}

#[test]
fn grants_are_read() {
    let grant = |body: &str| parse_grant(body.as_bytes());
    assert_eq!(
        grant(r#"{"access_token":"a","token_type":"Bearer","expires_in":3600}"#),
        Ok(Grant {
            access_token: "a".into(),
            life: Duration::from_secs(3600)
        })
    );
    assert_eq!(
        grant(r#"{"access_token":"a"}"#).unwrap().life,
        DEFAULT_TOKEN_LIFE
    );
    assert_eq!(
        grant(r#"{"access_token":"a","expires_in":"60"}"#)
            .unwrap()
            .life,
        Duration::from_secs(60)
    );
    assert_eq!(
        grant(r#"{"access_token":"a","expires_in":0}"#)
            .unwrap()
            .life,
        MIN_TOKEN_LIFE
    );
    assert_eq!(
        grant(r#"{"access_token":"a","expires_in":1e12}"#)
            .unwrap()
            .life,
        MAX_TOKEN_LIFE
    );
    let refused = grant(r#"{"access_token":"secret-token","token_type":"mac"}"#).unwrap_err();
    assert!(refused.contains("\"mac\""), "{refused}");
    assert!(!refused.contains("secret-token"), "{refused}");
    assert_eq!(
        grant(r#"{"token_type":"bearer"}"#).unwrap_err(),
        "no access_token"
    );
    assert!(grant("<html>")
        .unwrap_err()
        .contains("not a JSON token response"));
}

#[test]
fn a_token_is_renewed_at_four_fifths_of_its_life() {
    let now = Instant::now();
    let grant = Grant {
        access_token: "a".into(),
        life: Duration::from_secs(100),
    };
    let token = Token::new(grant, 7, now).unwrap();
    assert_eq!(token.renew_at, now + Duration::from_secs(80));
    assert_eq!(token.expires_at, now + Duration::from_secs(100));
    assert_eq!(token.bearer.header, "Bearer a");
    assert!(token.bearer.header.is_sensitive());
    let unusable = Grant {
        access_token: "a\nb".into(),
        life: Duration::from_secs(1),
    };
    assert!(Token::new(unusable, 1, now).is_err());
}

#[tokio::test]
async fn deliveries_waiting_on_a_fetch_take_its_token() {
    let source = source();
    let count = AtomicUsize::new(0);
    let bearers = join_all((0..20).map(|_| source.bearer_with(|| fetch(&count, false)))).await;
    assert_eq!(count.load(Ordering::SeqCst), 1);
    for bearer in bearers {
        assert_eq!(bearer.unwrap().header, "Bearer tok-1");
    }
}

#[tokio::test]
async fn a_refused_token_is_dropped_once_and_fetched_again_once() {
    let source = source();
    let count = AtomicUsize::new(0);
    let first = source.bearer_with(|| fetch(&count, false)).await.unwrap();
    // Ten deliveries refused with the same token: the first drops it, the others find it gone.
    join_all((0..10).map(|_| source.rejected(&first))).await;
    let fresh = join_all((0..10).map(|_| source.bearer_with(|| fetch(&count, false)))).await;
    assert_eq!(count.load(Ordering::SeqCst), 2);
    assert!(fresh
        .iter()
        .all(|b| b.as_ref().unwrap().header == "Bearer tok-2"));
    // A late 401 to the old token leaves the new one alone.
    source.rejected(&first).await;
    let again = source.bearer_with(|| fetch(&count, false)).await.unwrap();
    assert_eq!(again.header, "Bearer tok-2");
    assert_eq!(count.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_failed_fetch_is_shared_by_the_deliveries_that_waited() {
    let source = source();
    let count = AtomicUsize::new(0);
    let results = join_all((0..5).map(|_| source.bearer_with(|| fetch(&count, true)))).await;
    assert_eq!(count.load(Ordering::SeqCst), 1);
    assert!(results.iter().all(Result::is_err));
    // A delivery asking after the failure tries again.
    let later = source.bearer_with(|| fetch(&count, false)).await.unwrap();
    assert_eq!(later.header, "Bearer tok-2");
}

#[tokio::test]
async fn a_failed_renewal_keeps_sending_the_live_token() {
    let source = source();
    let count = AtomicUsize::new(0);
    let first = source.bearer_with(|| fetch(&count, false)).await.unwrap();
    let source = &source;
    let age = |renew_at: Instant, expires_at: Instant| async move {
        let mut cache = source.cache.lock().await;
        let token = cache.token.as_mut().unwrap();
        token.renew_at = renew_at;
        token.expires_at = expires_at;
    };
    // Past 80 % of its life, the endpoint failing: the token still lives, so it is sent, and
    // the renewal is not tried again at once.
    let now = Instant::now();
    age(now, now + Duration::from_secs(20)).await;
    let kept = source.bearer_with(|| fetch(&count, true)).await.unwrap();
    assert_eq!(kept.header, first.header);
    let kept = source.bearer_with(|| fetch(&count, true)).await.unwrap();
    assert_eq!(kept.header, first.header);
    assert_eq!(count.load(Ordering::SeqCst), 2);
    // Expired: the failure is the delivery's.
    age(now, now).await;
    assert!(source.bearer_with(|| fetch(&count, true)).await.is_err());
}

/// What the stand-in token endpoint saw: the `Authorization` header and the form.
type Seen = Arc<StdMutex<Vec<(Option<String>, String)>>>;

async fn token_endpoint(answer: (u16, &'static str)) -> (String, Seen) {
    use axum::routing::post;
    let seen: Seen = Arc::default();
    let record = seen.clone();
    let router = axum::Router::new().route(
        "/token",
        post(move |headers: http::HeaderMap, body: String| async move {
            let authorization = headers
                .get(http::header::AUTHORIZATION)
                .map(|v| v.to_str().unwrap().to_owned());
            record.lock().unwrap().push((authorization, body));
            (
                http::StatusCode::from_u16(answer.0).unwrap(),
                [(http::header::CONTENT_TYPE, "application/json")],
                answer.1,
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    (format!("http://{addr}/token"), seen)
}

fn form(body: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(body.as_bytes())
        .into_owned()
        .collect()
}

#[tokio::test]
async fn the_token_request_is_rfc_6749s() {
    let granted = r#"{"access_token":"tok","token_type":"bearer","expires_in":60}"#;
    let (url, seen) = token_endpoint((200, granted)).await;
    let basic = TokenSource::new(
        reqwest::Client::new(),
        &settings(&url, OAuthAuthMethod::Basic),
    );
    assert_eq!(basic.bearer().await.unwrap().header, "Bearer tok");
    let (authorization, body) = seen.lock().unwrap()[0].clone();
    // §2.3.1: id and secret form-encoded, then joined and base64-encoded.
    let expected =
        base64::engine::general_purpose::STANDARD.encode("relay%3Aone:s3cr3t%3Awith%26odd%3Dchars");
    assert_eq!(authorization, Some(format!("Basic {expected}")));
    assert_eq!(
        form(&body),
        [
            ("grant_type".into(), "client_credentials".into()),
            ("scope".into(), "webhooks:write".into())
        ]
    );
    let post = TokenSource::new(
        reqwest::Client::new(),
        &settings(&url, OAuthAuthMethod::Post),
    );
    post.bearer().await.unwrap();
    let (authorization, body) = seen.lock().unwrap()[1].clone();
    assert_eq!(authorization, None);
    let fields = form(&body);
    assert!(fields.contains(&("client_id".into(), "relay:one".into())));
    assert!(fields.contains(&("client_secret".into(), SECRET.into())));
    assert!(!format!("{basic:?} {post:?}").contains("s3cr3t"));
}

#[tokio::test]
async fn a_refusal_shows_the_oauth_error_and_never_the_secret() {
    let refused = r#"{"error":"invalid_client","error_description":"no client relay:one with secret s3cr3t:with&odd=chars"}"#;
    let (url, _) = token_endpoint((401, refused)).await;
    let source = TokenSource::new(
        reqwest::Client::new(),
        &settings(&url, OAuthAuthMethod::Basic),
    );
    let error = source.bearer().await.unwrap_err().to_string();
    assert!(
        error.starts_with("answered 401 invalid_client (no client relay:one with secret ***"),
        "{error}"
    );
    assert!(!error.contains("s3cr3t"), "{error}");
    let (url, _) = token_endpoint((500, "<html>oops</html>")).await;
    let source = TokenSource::new(
        reqwest::Client::new(),
        &settings(&url, OAuthAuthMethod::Basic),
    );
    assert_eq!(
        source.bearer().await.unwrap_err().to_string(),
        "answered 500"
    );
}
