//! A client of Composer's REST API, typed by the bodies in
//! `composer_api`: the one client the CLI, the bench and the test kit
//! share. It talks to a coordinator only: a URL that is not `http://` or
//! `https://` is refused before any request, and an answer without the
//! [`VERSION_HEADER`] every coordinator sends is another server's.

use std::time::Duration;

use composer_api::{ErrorBody, RunView, StartRun};
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::Serialize;
use uuid::Uuid;

/// The header every answer of a coordinator carries (its version): what
/// tells it from another server on the port.
pub const VERSION_HEADER: &str = "composer-version";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request's error and its causes, in the message once each (not
    /// a `source` too, which a `{:#}` would print a second time).
    #[error("cannot reach the coordinator at {url}: {}", causes(cause))]
    Unreachable { url: String, cause: reqwest::Error },
    /// The URL cannot be a coordinator's (no `http://` or `https://`): the
    /// caller's mistake, found before any request, not an outage.
    #[error("{url:?}{} is not a coordinator's URL: {reason}", from_where(.url_from))]
    BadUrl { url: String, reason: String, url_from: Option<&'static str> },
    /// Something answered, but not a coordinator: the answer has no
    /// [`VERSION_HEADER`]. (A 5xx without it is an [`Error::Api`]: a proxy
    /// in front of a coordinator that is down says so.)
    #[error(
        "the server at {url} is not a Composer coordinator (its answer, HTTP {status}, has no {VERSION_HEADER} \
         header){}",
        change_where(.url_from)
    )]
    NotComposer { url: String, status: u16, url_from: Option<&'static str> },
    /// The coordinator answered with an error; `code` is its stable code.
    #[error("{status}: {message}")]
    Api { status: u16, code: String, message: String },
    #[error("unexpected answer from the coordinator: {0}")]
    Decode(String),
}

/// ` (COMPOSER_URL or --url)`: where a bad URL came from, when known.
fn from_where(url_from: &Option<&'static str>) -> String {
    url_from.map(|f| format!(" ({f})")).unwrap_or_default()
}

/// `; set COMPOSER_URL or --url to a coordinator`, when where the URL came from is known.
fn change_where(url_from: &Option<&'static str>) -> String {
    url_from.map(|f| format!("; set {f} to a coordinator")).unwrap_or_default()
}

/// Whether `url` can be a coordinator's: `http://` or `https://`, then a
/// host (`http://127.0.0.1:8080`, `https://composer.example/prefix`); the
/// error says what is wrong with it.
pub fn check_url(url: &str) -> Result<(), String> {
    let url = url.trim();
    let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
    if !matches!(scheme.as_deref(), Some("http" | "https")) {
        return Err("it must start with http:// or https:// (as in http://127.0.0.1:8080)".into());
    }
    reqwest::Url::parse(url).map(drop).map_err(|e| format!("{e}"))
}

/// An error and its sources, joined by ": ", each once (a source whose text
/// its error already shows is left out).
fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = cause.source();
    }
    out
}

impl Error {
    /// The HTTP status of an error answer.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One coordinator's API.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
    /// Where the URL came from (`COMPOSER_URL or --url`), for the errors
    /// that say to change it.
    url_from: Option<&'static str>,
    /// Whether an answer without the [`VERSION_HEADER`] is taken.
    any_server: bool,
    /// The namespace every call is in ([`NAMESPACE_HEADER`]); `default` when `None`.
    namespace: Option<String>,
}

/// The header naming the namespace a call is in.
pub const NAMESPACE_HEADER: &str = "composer-namespace";

impl Client {
    /// A client of the coordinator at `base`, with `token` as bearer.
    pub fn new(http: reqwest::Client, base: &str, token: Option<String>) -> Client {
        let base = base.trim().trim_end_matches('/').to_string();
        Client { http, base, token, url_from: None, any_server: false, namespace: None }
    }

    /// Names where the URL came from (`"COMPOSER_URL or --url"`) in the
    /// errors that say it is wrong.
    pub fn url_from(mut self, from: &'static str) -> Client {
        self.url_from = Some(from);
        self
    }

    /// Takes answers without the [`VERSION_HEADER`]: for a coordinator built
    /// before it sent one (`composer bench --ab` against an older binary).
    pub fn any_server(mut self) -> Client {
        self.any_server = true;
        self
    }

    /// Makes every call in namespace `namespace` (none: `default`).
    pub fn in_namespace(mut self, namespace: Option<String>) -> Client {
        self.namespace = namespace;
        self
    }

    /// The namespace every call is in: `default` unless one was named.
    pub fn namespace(&self) -> &str {
        self.namespace.as_deref().unwrap_or("default")
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// Calls `path` and decodes the answer as `T`; an error answer becomes
    /// [`Error::Api`] with the coordinator's code and message, an answer
    /// that is not a coordinator's [`Error::NotComposer`].
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<T> {
        let resp = self.send(method, path, body, None).await?;
        let text = resp.text().await.map_err(|cause| Error::Unreachable { url: self.base.clone(), cause })?;
        serde_json::from_str(&text).map_err(|e| Error::Decode(format!("{path}: {e}")))
    }

    /// Calls `path` and gives its answer unread, to read a part at a time
    /// (an offloaded value's text), all of it within `timeout` (in place
    /// of the client's); errors as [`Client::call`]'s.
    pub async fn call_unread(&self, method: Method, path: &str, timeout: Duration) -> Result<reqwest::Response> {
        self.send(method, path, None::<&()>, Some(timeout)).await
    }

    /// Sends a call; its answer when it is a success from a coordinator.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
        timeout: Option<Duration>,
    ) -> Result<reqwest::Response> {
        let bad_url = |reason| Error::BadUrl { url: self.base.clone(), reason, url_from: self.url_from };
        check_url(&self.base).map_err(bad_url)?;
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(n) = &self.namespace {
            req = req.header(NAMESPACE_HEADER, n);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        if let Some(t) = timeout {
            req = req.timeout(t);
        }
        let url = self.base.clone();
        let resp = req.send().await.map_err(|cause| {
            if cause.is_builder() {
                bad_url(causes(&cause))
            } else {
                Error::Unreachable { url: url.clone(), cause }
            }
        })?;
        let status = resp.status();
        if !self.any_server && !status.is_server_error() && !resp.headers().contains_key(VERSION_HEADER) {
            return Err(Error::NotComposer { url, status: status.as_u16(), url_from: self.url_from });
        }
        if status.is_success() {
            return Ok(resp);
        }
        let text = resp.text().await.map_err(|cause| Error::Unreachable { url, cause })?;
        Err(match serde_json::from_str::<ErrorBody>(&text) {
            Ok(b) => Error::Api { status: status.as_u16(), code: b.error.code, message: b.error.message },
            Err(_) => Error::Api { status: status.as_u16(), code: "unknown".into(), message: text },
        })
    }

    /// Starts a run.
    pub async fn start_run(&self, req: &StartRun) -> Result<RunView> {
        self.call(Method::POST, "/v1/runs", Some(req)).await
    }

    /// A run with its tasks.
    pub async fn get_run(&self, id: Uuid) -> Result<RunView> {
        self.call(Method::GET, &format!("/v1/runs/{id}"), None::<&()>).await
    }

    /// Long-polls until the run ends or `timeout` passes; returns the run as
    /// last seen (still RUNNING or PAUSED when the time ran out).
    pub async fn wait_for_run(&self, id: Uuid, timeout: Duration) -> Result<RunView> {
        let give_up = tokio::time::Instant::now() + timeout;
        loop {
            let left = give_up.saturating_duration_since(tokio::time::Instant::now());
            let wait = left.clamp(Duration::from_millis(1), Duration::from_secs(30));
            let run: RunView =
                self.call(Method::GET, &format!("/v1/runs/{id}?wait={}ms", wait.as_millis()), None::<&()>).await?;
            if run.status.is_terminal() || tokio::time::Instant::now() >= give_up {
                return Ok(run);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_without_http_or_https_is_refused_before_any_request() {
        for good in ["http://127.0.0.1:8080", "HTTPS://composer.example/prefix/", " http://[::1]:8080 "] {
            assert_eq!(check_url(good), Ok(()), "{good}");
        }
        for bad in ["127.0.0.1:8080", "localhost:8080", "ftp://h", "http:/h", "http://", "http://a b", ""] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
        let said = check_url("127.0.0.1:8080").unwrap_err();
        assert!(said.contains("http:// or https://"), "{said}");
    }

    #[tokio::test]
    async fn the_error_names_where_the_url_came_from() {
        let api = Client::new(reqwest::Client::new(), "127.0.0.1:8080", None).url_from("COMPOSER_URL or --url");
        let e = api.get_run(Uuid::nil()).await.unwrap_err();
        assert!(matches!(e, Error::BadUrl { .. }), "{e:?}");
        let said = e.to_string();
        assert!(said.starts_with("\"127.0.0.1:8080\" (COMPOSER_URL or --url) is not a coordinator's URL"), "{said}");
    }
}
