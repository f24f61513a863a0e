//! OAuth 2.0 client credentials (RFC 6749 §4.4) for the HTTP sink: a [`TokenSource`] fetches a
//! bearer token from the sink's token endpoint, keeps it until 80 % of its life, and drops it
//! when the receiver answers 401 to it. Hand-written (one grant; the `oauth2` crate would bring
//! an HTTP client stack of its own): the request goes through the sink's own client, so its
//! timeout and its TLS identity apply (RFC 8705 certificate-bound tokens work).
//!
//! One fetch at a time (the cache's `tokio::sync::Mutex` is held across it): deliveries waiting
//! meanwhile take the token it brings or share its failure, so a lane of 32 deliveries fetches
//! once, not 32 times, and a dead token endpoint is asked once per wave of deliveries.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use http::HeaderValue;
use serde::Deserialize;
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::error_chain;
use crate::config::{shown_url, OAuthAuthMethod, Secret, SinkOAuthSettings};

/// A token's life when the endpoint does not say (`expires_in` is only RECOMMENDED).
pub const DEFAULT_TOKEN_LIFE: Duration = Duration::from_secs(300);
/// The longest a token is kept whatever it says; a 401 ends it sooner anyway.
const MAX_TOKEN_LIFE: Duration = Duration::from_secs(86_400);
/// The shortest: a token said to live 0 s would otherwise be fetched for every delivery.
const MIN_TOKEN_LIFE: Duration = Duration::from_secs(1);
/// The most of a token endpoint's answer read: a token response is a few kilobytes at most.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// Why no token could be had. Never holds the client secret nor a token.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("{}", error_chain(.0))]
    Request(#[source] reqwest::Error),
    /// A non-2xx answer, with the OAuth `error` and `error_description` (RFC 6749 §5.2) when
    /// the body has them, printable and bounded, the secret masked should the server echo it.
    #[error("answered {status}{}", refusal_text(.error, .description))]
    Refused {
        status: u16,
        error: Option<String>,
        description: Option<String>,
    },
    #[error("answered 2xx without a usable token: {0}")]
    Unusable(String),
}

fn refusal_text(error: &Option<String>, description: &Option<String>) -> String {
    match (error, description) {
        (Some(error), Some(description)) => format!(" {error} ({description})"),
        (Some(error), None) => format!(" {error}"),
        (None, _) => String::new(),
    }
}

/// A token to send, and which fetch brought it (for [`TokenSource::rejected`]).
#[derive(Clone)]
pub struct Bearer {
    /// `Bearer <token>`, marked sensitive (hyper and reqwest leave it out of their logs).
    pub header: HeaderValue,
    generation: u64,
}

/// Its generation only: the token is a secret.
impl std::fmt::Debug for Bearer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bearer(generation {})", self.generation)
    }
}

/// What a token endpoint granted.
#[derive(Debug, PartialEq)]
struct Grant {
    access_token: String,
    life: Duration,
}

struct Token {
    bearer: Bearer,
    /// From here on the next delivery fetches a new one (80 % of its life).
    renew_at: Instant,
    /// Until here it is still sent should a renewal fail.
    expires_at: Instant,
}

#[derive(Default)]
struct Cache {
    token: Option<Token>,
    /// Of the last fetch; each fetched token gets the next.
    generation: u64,
    /// The last failed fetch: when it ended, and why (shared with deliveries that waited on it).
    failed: Option<(Instant, Arc<TokenError>)>,
}

/// Fetches and caches one sink's bearer token.
pub struct TokenSource {
    client: reqwest::Client,
    token_url: String,
    /// `grant_type=client_credentials` with `scope`, `audience` and, with
    /// `auth_method = "post"`, the client's id and secret (so this is a secret too).
    form: Secret,
    /// `Basic base64(id:secret)`, marked sensitive, with `auth_method = "basic"`.
    basic: Option<HeaderValue>,
    /// Masked in any text of the endpoint's that echoes it.
    client_secret: Secret,
    cache: Mutex<Cache>,
}

/// The token endpoint as [`shown_url`] shows it; never the secret.
impl std::fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSource")
            .field("token_url", &shown_url(&self.token_url))
            .finish_non_exhaustive()
    }
}

impl TokenSource {
    /// A source asking `settings`' token endpoint through `client`. The settings were checked
    /// at start-up (`outbox_checks.rs`): endpoint, id and secret are there.
    pub fn new(client: reqwest::Client, settings: &SinkOAuthSettings) -> Self {
        let client_id = settings.client_id.clone().unwrap_or_default();
        let secret = settings
            .client_secret
            .as_ref()
            .map(|s| s.expose().to_owned())
            .unwrap_or_default();
        let mut form = form_urlencoded::Serializer::new(String::new());
        form.append_pair("grant_type", "client_credentials");
        for (name, value) in [("scope", &settings.scope), ("audience", &settings.audience)] {
            if let Some(value) = value.as_deref().filter(|v| !v.is_empty()) {
                form.append_pair(name, value);
            }
        }
        let basic = match settings.auth_method {
            OAuthAuthMethod::Post => {
                form.append_pair("client_id", &client_id);
                form.append_pair("client_secret", &secret);
                None
            }
            OAuthAuthMethod::Basic => {
                // RFC 6749 §2.3.1: id and secret are form-encoded before they are joined.
                let encode = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect();
                let (id, password): (String, String) = (encode(&client_id), encode(&secret));
                let credentials =
                    base64::engine::general_purpose::STANDARD.encode(format!("{id}:{password}"));
                let mut header = HeaderValue::from_str(&format!("Basic {credentials}"))
                    .expect("base64 is a valid header value");
                header.set_sensitive(true);
                Some(header)
            }
        };
        TokenSource {
            client,
            token_url: settings.token_url.clone().unwrap_or_default(),
            form: Secret(form.finish()),
            basic,
            client_secret: Secret(secret),
            cache: Mutex::default(),
        }
    }

    /// The token endpoint as logs show it.
    pub fn shown_url(&self) -> String {
        shown_url(&self.token_url)
    }

    /// A token to send: the cached one until 80 % of its life, else a fresh one. A delivery
    /// that waited while another fetched takes that fetch's token, or its failure.
    pub async fn bearer(&self) -> Result<Bearer, Arc<TokenError>> {
        self.bearer_with(|| self.fetch()).await
    }

    /// [`TokenSource::bearer`] with `fetch` standing for the token endpoint (tests give their
    /// own).
    async fn bearer_with<F, Fut>(&self, fetch: F) -> Result<Bearer, Arc<TokenError>>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Grant, TokenError>>,
    {
        let asked = Instant::now();
        let mut cache = self.cache.lock().await;
        if let Some(token) = &cache.token {
            if Instant::now() < token.renew_at {
                return Ok(token.bearer.clone());
            }
        }
        if let Some((failed_at, error)) = &cache.failed {
            if *failed_at >= asked {
                return Err(error.clone());
            }
        }
        match fetch().await {
            Ok(grant) => {
                cache.generation += 1;
                cache.failed = None;
                let token = Token::new(grant, cache.generation, Instant::now())?;
                let bearer = token.bearer.clone();
                cache.token = Some(token);
                Ok(bearer)
            }
            Err(error) => {
                let error = Arc::new(error);
                let now = Instant::now();
                cache.failed = Some((now, error.clone()));
                match &mut cache.token {
                    // A renewal that failed while the token still lives: keep sending it, and
                    // try again after a tenth of what is left of it (not at every delivery).
                    Some(token) if now < token.expires_at => {
                        tracing::warn!(
                            token_url = %self.shown_url(),
                            error = %error,
                            "OAuth token renewal failed; the current token is used until it expires"
                        );
                        token.renew_at = now + ((token.expires_at - now) / 10).max(MIN_TOKEN_LIFE);
                        Ok(token.bearer.clone())
                    }
                    _ => Err(error),
                }
            }
        }
    }

    /// The receiver refused `bearer` (401): it is not sent again. Only the token of that
    /// generation is dropped, so of many deliveries refused with one token the first makes the
    /// next fetch and the others take its token.
    pub async fn rejected(&self, bearer: &Bearer) {
        let mut cache = self.cache.lock().await;
        if cache
            .token
            .as_ref()
            .is_some_and(|t| t.bearer.generation == bearer.generation)
        {
            cache.token = None;
        }
    }

    async fn fetch(&self) -> Result<Grant, TokenError> {
        let mut request = self
            .client
            .post(&self.token_url)
            .header(http::header::ACCEPT, "application/json")
            .header(
                http::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(self.form.expose().to_owned());
        if let Some(basic) = &self.basic {
            request = request.header(http::header::AUTHORIZATION, basic.clone());
        }
        let request_error = |error: reqwest::Error| TokenError::Request(error.without_url());
        let mut response = request.send().await.map_err(request_error)?;
        let status = response.status();
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(request_error)? {
            body.extend_from_slice(&chunk);
            if body.len() > MAX_RESPONSE_BYTES {
                break;
            }
        }
        if status.is_success() {
            parse_grant(&body).map_err(TokenError::Unusable)
        } else {
            Err(self.refusal(status.as_u16(), &body))
        }
    }

    /// The endpoint's refusal, with its `error` and `error_description` if the body has them.
    fn refusal(&self, status: u16, body: &[u8]) -> TokenError {
        #[derive(Deserialize)]
        struct ErrorBody {
            error: Option<String>,
            error_description: Option<String>,
        }
        let parsed: Option<ErrorBody> = serde_json::from_slice(body).ok();
        let shown = |text: Option<String>, max_chars: usize| {
            text.map(|text| {
                let secret = self.client_secret.expose();
                let text = if secret.is_empty() {
                    text
                } else {
                    text.replace(secret, "***")
                };
                crate::event::printable(&text, max_chars).into_owned()
            })
        };
        let (error, description) = match parsed {
            Some(body) => (shown(body.error, 64), shown(body.error_description, 200)),
            None => (None, None),
        };
        TokenError::Refused {
            status,
            error,
            description,
        }
    }
}

impl Token {
    fn new(grant: Grant, generation: u64, now: Instant) -> Result<Token, Arc<TokenError>> {
        let mut header =
            HeaderValue::from_str(&format!("Bearer {}", grant.access_token)).map_err(|_| {
                Arc::new(TokenError::Unusable(
                    "its access_token holds characters an HTTP header cannot carry".into(),
                ))
            })?;
        header.set_sensitive(true);
        Ok(Token {
            bearer: Bearer { header, generation },
            renew_at: now + grant.life.mul_f64(0.8),
            expires_at: now + grant.life,
        })
    }
}

/// A successful token response (RFC 6749 §5.1): `access_token`; `token_type` bearer (or left
/// out); `expires_in` in seconds, a number or a numeric string (absent:
/// [`DEFAULT_TOKEN_LIFE`]), kept within 1 s and 1 day. `Err` says what is wrong, never the token.
fn parse_grant(body: &[u8]) -> Result<Grant, String> {
    #[derive(Deserialize)]
    struct GrantBody {
        access_token: Option<String>,
        token_type: Option<String>,
        expires_in: Option<serde_json::Value>,
    }
    let grant: GrantBody = serde_json::from_slice(body)
        .map_err(|error| format!("the body is not a JSON token response ({error})"))?;
    let access_token = grant
        .access_token
        .filter(|t| !t.is_empty())
        .ok_or("no access_token")?;
    if let Some(kind) = grant.token_type {
        if !kind.eq_ignore_ascii_case("bearer") {
            return Err(format!(
                "token_type {:?}; only bearer tokens are sent",
                crate::event::printable(&kind, 32)
            ));
        }
    }
    let seconds = match grant.expires_in {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::Number(n)) => n.as_f64(),
        Some(serde_json::Value::String(s)) => s.trim().parse::<f64>().ok(),
        Some(_) => None,
    };
    let life = match seconds {
        Some(s) if s.is_finite() => Duration::from_secs_f64(
            s.clamp(MIN_TOKEN_LIFE.as_secs_f64(), MAX_TOKEN_LIFE.as_secs_f64()),
        ),
        _ => DEFAULT_TOKEN_LIFE,
    };
    Ok(Grant { access_token, life })
}

#[cfg(test)]
#[path = "oauth_tests.rs"]
mod tests;
