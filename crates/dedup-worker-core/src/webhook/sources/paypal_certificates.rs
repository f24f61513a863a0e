//! Where a PayPal source's certificate comes from: the one configured (`certificate`), or the
//! one each delivery names (`PAYPAL-CERT-URL`), fetched only from the allowed prefixes (PayPal's
//! own hosts unless `certificate_url_prefixes` says otherwise), over a client that follows no
//! redirect and waits a bounded time, and kept by URL until the certificate expires or a day
//! has passed, for at most [`CACHED_CERTIFICATES`] URLs.
//!
//! The answers, as the route gives them: a URL outside the prefixes is a forgery (400
//! `certificate_url`, nothing fetched); a certificate that could not be fetched or read is not
//! the delivery's fault (503 with `Retry-After`: PayPal retries); one that is not PayPal's
//! message-verification certificate is a forgery (400 `certificate_subject`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use url::Url;

use crate::config::{certificate_url_prefix, is_paypal_signing_certificate};
use crate::config::{SourceSettings, PAYPAL_CERTIFICATE_URL_PREFIXES};
use crate::http::problem::Problem;
use crate::signature::certificate::{RsaCertificate, MAX_PEM_BYTES};
use crate::webhook::deliver::invalid_signature;

/// How many certificate URLs are kept: PayPal rotates its certificate rarely, and a live and a
/// sandbox one, each during a rotation, are four.
pub(super) const CACHED_CERTIFICATES: usize = 16;

/// The longest a fetched certificate is kept, even if it is valid for longer.
const CACHE_SECS: i64 = 24 * 3_600;

/// The longest a fetch may take, connection included: PayPal waits for the answer too.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// A PayPal source's certificates.
pub(super) struct Certificates {
    /// Used for every delivery when configured; nothing is fetched then.
    configured: Option<Arc<RsaCertificate>>,
    /// The prefixes a certificate URL must start with (scheme, host and port equal, path
    /// under the prefix's).
    allowed: Vec<Url>,
    /// Fetched certificates by URL, with the Unix second until which each is kept.
    cache: Mutex<HashMap<String, (Arc<RsaCertificate>, i64)>>,
    /// The fetching client, `None` if it could not be built (each fetch is then a 503, logged).
    client: Option<reqwest::Client>,
}

impl Certificates {
    /// The certificates of a validated `paypal` source.
    pub(super) fn from_settings(source: &SourceSettings) -> Self {
        let allowed = if source.certificate_url_prefixes.is_empty() {
            PAYPAL_CERTIFICATE_URL_PREFIXES
                .iter()
                .filter_map(|p| certificate_url_prefix(p).ok())
                .collect()
        } else {
            source.certificate_url_prefixes.clone()
        };
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(FETCH_TIMEOUT)
            .connect_timeout(FETCH_TIMEOUT)
            .build()
            .inspect_err(|error| {
                tracing::error!(%error, "cannot build the PayPal certificate client; deliveries naming a certificate will be answered 503")
            })
            .ok();
        Certificates {
            configured: source.certificate.clone().map(Arc::new),
            allowed,
            cache: Mutex::new(HashMap::new()),
            client,
        }
    }

    /// The certificate to verify a delivery naming `url` with, at `now` (Unix seconds).
    pub(super) async fn for_url(
        &self,
        url: &str,
        now: i64,
    ) -> Result<Arc<RsaCertificate>, Problem> {
        let url = self.allowed_url(url)?;
        if let Some(configured) = &self.configured {
            return Ok(configured.clone());
        }
        if let Some(cached) = self.cached(url.as_str(), now) {
            return Ok(cached);
        }
        let certificate = Arc::new(self.fetch(&url).await?);
        if !is_paypal_signing_certificate(&certificate) {
            return Err(invalid_signature(
                "the certificate PAYPAL-CERT-URL names is not PayPal's message-verification \
                 certificate",
                "certificate_subject",
            ));
        }
        let keep_until = certificate.not_after().min(now.saturating_add(CACHE_SECS));
        self.keep(url.as_str(), certificate.clone(), keep_until, now);
        Ok(certificate)
    }

    /// `url` parsed, if it is under one of the allowed prefixes: the same scheme, host and
    /// port, a path under the prefix's (dot segments resolved first), no user, query or
    /// fragment. The 400 `certificate_url` otherwise.
    fn allowed_url(&self, url: &str) -> Result<Url, Problem> {
        let refused = || {
            invalid_signature(
                "PAYPAL-CERT-URL is not under PayPal's certificate URLs; nothing was fetched",
                "certificate_url",
            )
        };
        let parsed = Url::parse(url).map_err(|_| refused())?;
        let plain = parsed.username().is_empty()
            && parsed.password().is_none()
            && parsed.query().is_none()
            && parsed.fragment().is_none();
        let under = |prefix: &Url| {
            prefix.scheme() == parsed.scheme()
                && prefix.host() == parsed.host()
                && prefix.port_or_known_default() == parsed.port_or_known_default()
                && parsed.path().starts_with(prefix.path())
        };
        if plain && self.allowed.iter().any(under) {
            Ok(parsed)
        } else {
            Err(refused())
        }
    }

    /// The certificate kept for `url`, if it is still to be kept at `now`.
    fn cached(&self, url: &str, now: i64) -> Option<Arc<RsaCertificate>> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .get(url)
            .filter(|(_, until)| now <= *until)
            .map(|(certificate, _)| certificate.clone())
    }

    /// Keeps `certificate` for `url` until `until`: expired entries go first, and when the cache
    /// is still full, the one kept for the shortest time.
    fn keep(&self, url: &str, certificate: Arc<RsaCertificate>, until: i64, now: i64) {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.retain(|_, (_, kept_until)| now <= *kept_until);
        if cache.len() >= CACHED_CERTIFICATES && !cache.contains_key(url) {
            let soonest = cache
                .iter()
                .min_by_key(|(_, (_, kept_until))| *kept_until)
                .map(|(u, _)| u.clone());
            if let Some(soonest) = soonest {
                cache.remove(&soonest);
            }
        }
        cache.insert(url.to_owned(), (certificate, until));
    }

    /// GET `url` (within [`FETCH_TIMEOUT`], at most [`MAX_PEM_BYTES`], no redirect) and read
    /// its first certificate; the 503 on any failure, the cause logged.
    async fn fetch(&self, url: &Url) -> Result<RsaCertificate, Problem> {
        let client = self
            .client
            .as_ref()
            .ok_or_else(|| unavailable(url, &"no client"))?;
        let mut response = client
            .get(url.clone())
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|e| unavailable(url, &e))?;
        let mut pem = Vec::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) if pem.len() + chunk.len() <= MAX_PEM_BYTES => {
                    pem.extend_from_slice(&chunk)
                }
                Ok(Some(_)) => return Err(unavailable(url, &"the answer is too long")),
                Ok(None) => break,
                Err(e) => return Err(unavailable(url, &e)),
            }
        }
        RsaCertificate::from_pem(&pem).map_err(|e| unavailable(url, &e))
    }
}

/// 503: the certificate `url` names could not be had now; PayPal retries.
fn unavailable(url: &Url, cause: &dyn std::fmt::Display) -> Problem {
    tracing::warn!(%url, %cause, "cannot fetch the PayPal certificate; answering 503");
    Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "urn:dedup-worker:problem:unavailable",
        "Temporarily unavailable",
        "the certificate named by PAYPAL-CERT-URL could not be fetched; retry later",
    )
    .with_retry_after(5)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn certificates(prefixes: &[&str]) -> Certificates {
        Certificates {
            configured: None,
            allowed: prefixes
                .iter()
                .map(|p| certificate_url_prefix(p).unwrap())
                .collect(),
            cache: Mutex::new(HashMap::new()),
            client: None,
        }
    }

    #[test]
    fn only_urls_under_an_allowed_prefix_are_fetched_from() {
        let paypal = certificates(PAYPAL_CERTIFICATE_URL_PREFIXES);
        for good in [
            "https://api.paypal.com/v1/notifications/certs/CERT-360caa42-fca2a594-df8cd2d5",
            "https://api.sandbox.paypal.com/v1/notifications/certs/CERT-360caa42-fca2a594-a5cafa77",
            "https://API.PAYPAL.COM:443/v1/notifications/certs/CERT-1",
        ] {
            assert!(paypal.allowed_url(good).is_ok(), "{good}");
        }
        for bad in [
            "http://api.paypal.com/v1/notifications/certs/CERT-1",
            "https://api.paypal.com:8443/v1/notifications/certs/CERT-1",
            "https://api.paypal.com.example.com/v1/notifications/certs/CERT-1",
            "https://example.com/v1/notifications/certs/CERT-1",
            "https://api.paypal.com@example.com/v1/notifications/certs/CERT-1",
            "https://user@api.paypal.com/v1/notifications/certs/CERT-1",
            "https://api.paypal.com/v1/notifications/certs/../../../x/CERT-1",
            "https://api.paypal.com/v1/notifications/certs/CERT-1?u=https://example.com",
            "https://api.paypal.com/v1/notifications/certs/CERT-1#x",
            "https://www.paypal.com/v1/notifications/certs/CERT-1",
            "https://api.paypal.com/v1/other/CERT-1",
            "/v1/notifications/certs/CERT-1",
            "",
            "not a url",
        ] {
            let problem = paypal.allowed_url(bad).unwrap_err();
            assert_eq!(problem.check, Some("certificate_url"), "{bad}");
        }
        let test = certificates(&["http://127.0.0.1:4000/certs/"]);
        assert!(test
            .allowed_url("http://127.0.0.1:4000/certs/a.pem")
            .is_ok());
        assert!(test
            .allowed_url("http://127.0.0.1:4001/certs/a.pem")
            .is_err());
        assert!(test
            .allowed_url("https://api.paypal.com/v1/notifications/certs/CERT-1")
            .is_err());
    }

    #[test]
    fn the_cache_keeps_until_the_deadline_and_stays_bounded() {
        let pem = include_str!("../../signature/testdata/rsa_test_certificate.pem");
        let certificate = Arc::new(RsaCertificate::from_pem(pem.as_bytes()).unwrap());
        let certificates = certificates(PAYPAL_CERTIFICATE_URL_PREFIXES);
        certificates.keep("u0", certificate.clone(), 100, 0);
        assert!(certificates.cached("u0", 100).is_some());
        assert!(certificates.cached("u0", 101).is_none());
        for i in 1..=CACHED_CERTIFICATES * 2 {
            certificates.keep(&format!("u{i}"), certificate.clone(), 1_000 + i as i64, 50);
        }
        let cache = certificates.cache.lock().unwrap();
        assert_eq!(cache.len(), CACHED_CERTIFICATES);
        // The longest-kept survive.
        assert!(cache.contains_key(&format!("u{}", CACHED_CERTIFICATES * 2)));
        assert!(!cache.contains_key("u1"));
    }
}
