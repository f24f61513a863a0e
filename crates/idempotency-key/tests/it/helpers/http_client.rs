//! The tests' HTTP client: hyper-util's pooled client behind the few calls of reqwest's shape
//! the tests make (`post`/`get`, `header`, `body`, `send`, a client-wide timeout).
//!
//! Not reqwest itself, so that this crate's dev-dependencies do not bring back what the
//! `client` feature puts behind a switch: `cargo tree -p idempotency-key --no-default-features`
//! (dev-dependencies included) shows neither reqwest nor redis. The `client` feature's own
//! tests ([`crate::client`]) use reqwest, which that feature makes a dependency.

use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// Why a request got no answer: the connection failed, or the client's timeout passed first.
#[derive(Debug)]
pub enum Error {
    Transport(String),
    TimedOut(Duration),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Transport(e) => write!(f, "request failed: {e}"),
            Error::TimedOut(after) => write!(f, "no answer within {after:?}"),
        }
    }
}

impl std::error::Error for Error {}

/// A pooled HTTP/1.1 client (connections kept between requests, as reqwest's are), cheap to
/// clone.
#[derive(Clone)]
pub struct Client {
    inner: hyper_util::client::legacy::Client<HttpConnector, Full<Bytes>>,
    /// How long `send` waits for the whole answer before giving up (dropping the request, as
    /// a client that went away does); `None` waits as long as it takes.
    timeout: Option<Duration>,
}

impl Client {
    pub fn new() -> Self {
        Client {
            inner: hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http(),
            timeout: None,
        }
    }

    /// A client that gives up on an answer after `timeout`.
    pub fn with_timeout(timeout: Duration) -> Self {
        Client {
            timeout: Some(timeout),
            ..Client::new()
        }
    }

    pub fn post(&self, url: impl Into<String>) -> RequestBuilder {
        self.request(Method::POST, url.into())
    }

    pub fn get(&self, url: impl Into<String>) -> RequestBuilder {
        self.request(Method::GET, url.into())
    }

    fn request(&self, method: Method, url: String) -> RequestBuilder {
        RequestBuilder {
            client: self.clone(),
            method,
            url,
            headers: HeaderMap::new(),
            body: Bytes::new(),
        }
    }
}

/// One request under construction; headers given twice are sent twice.
pub struct RequestBuilder {
    client: Client,
    method: Method,
    url: String,
    headers: HeaderMap,
    body: Bytes,
}

impl RequestBuilder {
    pub fn header(mut self, name: &'static str, value: impl AsRef<str>) -> Self {
        let value = HeaderValue::from_str(value.as_ref()).expect("a test's header value");
        self.headers.append(HeaderName::from_static(name), value);
        self
    }

    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    /// Sends the request and reads the whole answer (within the client's timeout, if any).
    pub async fn send(self) -> Result<Response, Error> {
        let mut request = Request::builder()
            .method(self.method)
            .uri(&self.url)
            .body(Full::new(self.body))
            .expect("a test's request");
        *request.headers_mut() = self.headers;
        let exchange = async {
            let response = self
                .client
                .inner
                .request(request)
                .await
                .map_err(|e| Error::Transport(format!("{e:?}")))?;
            let (parts, body) = response.into_parts();
            let body = body
                .collect()
                .await
                .map_err(|e| Error::Transport(e.to_string()))?
                .to_bytes();
            Ok(Response {
                status: parts.status,
                headers: parts.headers,
                body,
            })
        };
        match self.client.timeout {
            Some(after) => tokio::time::timeout(after, exchange)
                .await
                .map_err(|_| Error::TimedOut(after))?,
            None => exchange.await,
        }
    }
}

/// An answer, its body already read.
pub struct Response {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Response {
    pub fn status(&self) -> StatusCode {
        self.status
    }

    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    pub async fn bytes(self) -> Result<Bytes, Error> {
        Ok(self.body)
    }
}
