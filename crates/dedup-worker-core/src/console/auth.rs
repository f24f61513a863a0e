//! Who may use the console, and which requests are theirs.
//!
//! * **The token.** `admin.token`, sent as `Authorization: Bearer` by scripts, or typed once on
//!   the login page, which sets a session cookie: `HttpOnly` (no script reads it),
//!   `SameSite=Strict` (no other site's page sends it), and `Secure` when the browser reached
//!   the console over HTTPS (its `Origin`, or a proxy's `X-Forwarded-Proto`): a browser drops
//!   a `Secure` cookie set over plain HTTP, which would make a console on a private network's
//!   plain HTTP impossible to log in to. The cookie is `EXPIRY.NAME.MAC`, the MAC an HMAC under a key derived from the
//!   token: nothing is stored, a forged or altered cookie is refused, and changing the token
//!   ends every session. Comparisons are constant-time (`Mac::verify_slice`).
//! * **Cross-site requests.** Every state change is a POST, and a POST is refused (403) when the
//!   browser says it comes from elsewhere (`Sec-Fetch-Site` other than `same-origin`: the
//!   webhook listener on the same host is same-*site*, which is why nothing looser passes), when
//!   its `Origin` is not this listener's own, or, with a session cookie, without the form field
//!   `csrf` that every page embeds (an HMAC of the session: a page elsewhere cannot know it).
//!   The login form is checked the same way, so no other page can log a browser in.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::{login, ConsoleState};
use crate::http::problem::Problem;

type HmacSha256 = Hmac<Sha256>;

/// The session cookie's name.
pub const COOKIE: &str = "dedup_console";

/// How long a login lasts.
const SESSION_SECS: i64 = 12 * 3600;

/// The largest form the console reads (a filter and a few fields).
pub const MAX_FORM_BYTES: usize = 16 * 1024;

/// The console's secret material, from `admin.token`.
#[derive(Clone)]
pub struct Keys {
    /// The token itself, compared (by MAC) with what a request presents.
    token: Vec<u8>,
    /// Signs session cookies and their CSRF tokens.
    session_key: Vec<u8>,
    /// Whether the console listens on loopback only (kept for the log of a generated token).
    pub loopback: bool,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys(***)")
    }
}

fn mac(key: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    for part in parts {
        mac.update(&(part.len() as u64).to_be_bytes());
        mac.update(part);
    }
    mac
}

/// Who a request is, once let in.
#[derive(Debug, Clone)]
pub enum Caller {
    Bearer,
    /// A browser session, with the name given at login (may be empty) and its cookie value.
    Session {
        name: String,
        cookie: String,
    },
}

impl Caller {
    /// Who acted, as `admin_actions` records it.
    pub fn actor(&self) -> String {
        match self {
            Caller::Bearer => "console (bearer token)".to_owned(),
            Caller::Session { name, .. } if !name.is_empty() => format!("console ({name})"),
            Caller::Session { .. } => "console (session)".to_owned(),
        }
    }
}

impl Keys {
    pub fn new(token: &str, loopback: bool) -> Self {
        let session_key = mac(token.as_bytes(), &[b"dedup-worker console session"])
            .finalize()
            .into_bytes()
            .to_vec();
        Keys {
            token: token.as_bytes().to_vec(),
            session_key,
            loopback,
        }
    }

    /// Whether `presented` is the token, in constant time.
    pub fn is_token(&self, presented: &str) -> bool {
        let expected = mac(&self.session_key, &[&self.token])
            .finalize()
            .into_bytes();
        mac(&self.session_key, &[presented.as_bytes()])
            .verify_slice(&expected)
            .is_ok()
    }

    /// A new session cookie's value for `name`, valid from `now` (Unix seconds).
    pub fn session(&self, name: &str, now: i64) -> String {
        let expiry = (now + SESSION_SECS).to_string();
        let name = hex::encode(name.as_bytes());
        let tag = mac(
            &self.session_key,
            &[b"session", expiry.as_bytes(), name.as_bytes()],
        )
        .finalize()
        .into_bytes();
        format!("{expiry}.{name}.{}", hex::encode(tag))
    }

    /// The name of a valid, unexpired session cookie.
    pub fn check_session(&self, value: &str, now: i64) -> Option<String> {
        let mut parts = value.split('.');
        let (expiry, name, tag) = (parts.next()?, parts.next()?, parts.next()?);
        let tag = hex::decode(tag).ok()?;
        mac(
            &self.session_key,
            &[b"session", expiry.as_bytes(), name.as_bytes()],
        )
        .verify_slice(&tag)
        .ok()?;
        if expiry.parse::<i64>().ok()? <= now {
            return None;
        }
        String::from_utf8(hex::decode(name).ok()?).ok()
    }

    /// The CSRF form token of a session.
    pub fn csrf(&self, cookie: &str) -> String {
        hex::encode(
            mac(&self.session_key, &[b"csrf", cookie.as_bytes()])
                .finalize()
                .into_bytes(),
        )
    }

    fn is_csrf(&self, cookie: &str, presented: &str) -> bool {
        let Ok(tag) = hex::decode(presented) else {
            return false;
        };
        mac(&self.session_key, &[b"csrf", cookie.as_bytes()])
            .verify_slice(&tag)
            .is_ok()
    }

    /// The `Set-Cookie` value of a session (or, empty, of a logout).
    pub fn set_cookie(&self, value: &str, https: bool) -> String {
        let secure = if https { "; Secure" } else { "" };
        let age = if value.is_empty() { 0 } else { SESSION_SECS };
        format!("{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={age}{secure}")
    }
}

/// Whether the browser reached the console over HTTPS: its `Origin` says so, or a TLS proxy in
/// front does (`X-Forwarded-Proto`).
pub fn over_https(headers: &HeaderMap) -> bool {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    get("origin").is_some_and(|o| o.starts_with("https://"))
        || get("x-forwarded-proto").is_some_and(|p| p.eq_ignore_ascii_case("https"))
}

pub fn now_secs() -> i64 {
    chrono::Utc::now().timestamp()
}

/// The session cookie's value in `headers`.
pub fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
}

/// Who the request is: a valid Bearer token or session cookie.
pub fn caller(keys: &Keys, headers: &HeaderMap) -> Option<Caller> {
    if let Some(auth) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        let token = auth.strip_prefix("Bearer ")?;
        return keys.is_token(token.trim()).then_some(Caller::Bearer);
    }
    let cookie = session_cookie(headers)?;
    let name = keys.check_session(cookie, now_secs())?;
    Some(Caller::Session {
        name,
        cookie: cookie.to_owned(),
    })
}

/// Refuses a cross-origin state change: see the module documentation.
pub fn cross_origin(headers: &HeaderMap) -> Option<&'static str> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = get("sec-fetch-site") {
        if site != "same-origin" {
            return Some("the browser says this request comes from another origin");
        }
    }
    if let Some(origin) = get("origin") {
        let host = get("host").unwrap_or("");
        let own = ["http://", "https://"]
            .iter()
            .any(|scheme| origin.strip_prefix(scheme) == Some(host));
        if !own || host.is_empty() {
            return Some("the request's Origin is not this console");
        }
    }
    None
}

/// Whether the client wants JSON rather than a page.
pub fn wants_json(headers: &HeaderMap) -> bool {
    headers.contains_key(header::AUTHORIZATION)
        || headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|accept| accept.contains("json") && !accept.contains("text/html"))
}

/// 401: problem+json for scripts, the login page for browsers, which comes back to the page
/// asked for (`next`: a GET's path and query; a POST's form cannot be replayed, so `/`).
pub fn unauthorized(method: &Method, uri: &axum::http::Uri, headers: &HeaderMap) -> Response {
    if wants_json(headers) {
        return Problem::new(
            StatusCode::UNAUTHORIZED,
            "urn:dedup-worker:problem:console-unauthorized",
            "Not logged in",
            "send Authorization: Bearer with admin.token, or log in at /login",
        )
        .into_response();
    }
    let next = match uri.path_and_query() {
        Some(path) if method == Method::GET => login::safe_next(path.as_str()),
        _ => "/",
    };
    (StatusCode::UNAUTHORIZED, login::login_page(next, None)).into_response()
}

pub fn forbidden(detail: &str) -> Response {
    Problem::new(
        StatusCode::FORBIDDEN,
        "urn:dedup-worker:problem:console-cross-origin",
        "Refused",
        detail,
    )
    .into_response()
}

/// The middleware in front of every route but the login page: lets in a caller with the token
/// or a session, and a POST only from this console's own pages (see the module documentation).
/// The caller is put in the request's extensions for the handlers.
pub async fn require_caller(
    State(state): State<ConsoleState>,
    request: Request,
    next: Next,
) -> Response {
    let Some(who) = caller(&state.keys, request.headers()) else {
        return unauthorized(request.method(), request.uri(), request.headers());
    };
    if request.method() == Method::GET || request.method() == Method::HEAD {
        let mut request = request;
        request.extensions_mut().insert(who);
        return next.run(request).await;
    }
    if let Some(why) = cross_origin(request.headers()) {
        return forbidden(why);
    }
    let (mut parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_FORM_BYTES).await else {
        return forbidden("the form is larger than the console reads");
    };
    if let Caller::Session { cookie, .. } = &who {
        let presented = form_field(&bytes, "csrf").unwrap_or_default();
        if !state.keys.is_csrf(cookie, &presented) {
            return forbidden("the form's csrf field is missing or not this session's");
        }
    }
    parts.extensions.insert(who);
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// One field of a URL-encoded form.
pub fn form_field(body: &[u8], name: &str) -> Option<String> {
    form_urlencoded::parse(body)
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_valid_until_it_expires_and_only_as_issued() {
        let keys = Keys::new("a-token-of-some-length", true);
        let cookie = keys.session("alice", 1_000);
        assert_eq!(keys.check_session(&cookie, 1_001).as_deref(), Some("alice"));
        assert_eq!(keys.check_session(&cookie, 1_000 + SESSION_SECS), None);
        let other = Keys::new("another-token-entirely", true);
        assert_eq!(
            other.check_session(&cookie, 1_001),
            None,
            "a new token ends it"
        );
        let (expiry, rest) = cookie.split_once('.').unwrap();
        let later = format!("{}.{rest}", expiry.parse::<i64>().unwrap() + 1);
        assert_eq!(keys.check_session(&later, 1_001), None, "altered expiry");
        assert!(keys.is_csrf(&cookie, &keys.csrf(&cookie)));
        assert!(!keys.is_csrf(&cookie, &keys.csrf(&later)));
        assert!(keys.is_token("a-token-of-some-length"));
        assert!(!keys.is_token("a-token-of-some-lengtH"));
    }
}
