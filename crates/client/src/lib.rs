//! A client of Composer's REST API, typed by the bodies in
//! `composer_api`: the one client the CLI, the bench and the test kit
//! share.

use std::time::Duration;

use composer_api::{ErrorBody, RunView, StartRun};
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::Serialize;
use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request's error and its causes, in the message once each (not
    /// a `source` too, which a `{:#}` would print a second time).
    #[error("cannot reach the coordinator at {url}: {}", causes(cause))]
    Unreachable { url: String, cause: reqwest::Error },
    /// The coordinator answered with an error; `code` is its stable code.
    #[error("{status}: {message}")]
    Api { status: u16, code: String, message: String },
    #[error("unexpected answer from the coordinator: {0}")]
    Decode(String),
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
}

impl Client {
    /// A client of the coordinator at `base`, with `token` as bearer.
    pub fn new(http: reqwest::Client, base: &str, token: Option<String>) -> Client {
        Client { http, base: base.trim().trim_end_matches('/').to_string(), token }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// Calls `path` and decodes the answer as `T`; an error answer becomes
    /// [`Error::Api`] with the coordinator's code and message.
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<T> {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let url = self.base.clone();
        let resp = req.send().await.map_err(|cause| Error::Unreachable { url: url.clone(), cause })?;
        let status = resp.status();
        let text = resp.text().await.map_err(|cause| Error::Unreachable { url, cause })?;
        if !status.is_success() {
            return Err(match serde_json::from_str::<ErrorBody>(&text) {
                Ok(b) => Error::Api { status: status.as_u16(), code: b.error.code, message: b.error.message },
                Err(_) => Error::Api { status: status.as_u16(), code: "unknown".into(), message: text },
            });
        }
        serde_json::from_str(&text).map_err(|e| Error::Decode(format!("{path}: {e}")))
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
