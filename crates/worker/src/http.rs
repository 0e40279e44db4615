//! The built-in HTTP executor.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use composer_core::duration;
use serde_json::{json, Value};

use crate::egress::{Denied, Policy, Resolver};
use crate::task::{TaskContext, TaskError};

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The HTTP executor: its clients and limits.
#[derive(Clone)]
pub struct Http {
    policy: Arc<Policy>,
    /// No redirects (the default).
    direct: reqwest::Client,
    /// `follow_redirects` with custom headers: same host only, so the
    /// headers are never carried to another host.
    same_host: reqwest::Client,
    /// `follow_redirects` without custom headers: any host the policy allows.
    any_host: reqwest::Client,
    max_body: usize,
    max_timeout: Duration,
}

/// Most redirects one request follows.
const MAX_REDIRECTS: usize = 10;

impl Http {
    pub fn new(policy: Policy, max_body: usize, max_timeout: Duration) -> Http {
        let policy = Arc::new(policy);
        let build = |redirects: reqwest::redirect::Policy| {
            reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .pool_idle_timeout(Duration::from_secs(30))
                .dns_resolver(Arc::new(Resolver(policy.clone())))
                .redirect(redirects)
                .build()
                .expect("building the HTTP client")
        };
        let follow = |same_host_only: bool| {
            let policy = policy.clone();
            reqwest::redirect::Policy::custom(move |attempt| {
                if attempt.previous().len() > MAX_REDIRECTS {
                    return attempt.error(Denied(format!("more than {MAX_REDIRECTS} redirects")));
                }
                if let Err(denied) = policy.check_url(attempt.url()) {
                    return attempt.error(denied);
                }
                let first =
                    attempt.previous().first().map(|u| (u.host_str().map(str::to_string), u.port_or_known_default()));
                let next = (attempt.url().host_str().map(str::to_string), attempt.url().port_or_known_default());
                if same_host_only && first.is_some_and(|f| f != next) {
                    let to = attempt.url().to_string();
                    return attempt.error(Denied(format!(
                        "redirect to another host ({to}) refused: the node sets custom headers, which are never sent to another host"
                    )));
                }
                attempt.follow()
            })
        };
        Http {
            direct: build(reqwest::redirect::Policy::none()),
            same_host: build(follow(true)),
            any_host: build(follow(false)),
            policy,
            max_body,
            max_timeout,
        }
    }

    /// Calls the node's endpoint. Output: `{status, headers, body}`, the body
    /// parsed as JSON when it is JSON. Transport errors, 5xx and 429 are
    /// retryable; other statuses outside `accept` (default: 2xx) are not,
    /// unless listed in `retry_statuses`. A connection the egress policy
    /// refuses fails at once, for good.
    pub async fn execute(self, ctx: TaskContext, config: Value) -> Result<Value, TaskError> {
        self.call(ctx, config).await.map_err(|e| match e {
            Failure::Task(e) => e,
            Failure::Transport(url, e) => match crate::egress::denied_in(&e) {
                Some(denied) => TaskError::fatal(format!("request to {url} refused: {denied}")),
                None => transport_error(&url, e),
            },
        })
    }

    async fn call(self, ctx: TaskContext, config: Value) -> Result<Value, Failure> {
        let url = config["url"].as_str().ok_or_else(|| TaskError::fatal("config.url is missing"))?;
        let parsed = reqwest::Url::parse(url).map_err(|e| TaskError::fatal(format!("config.url {url:?}: {e}")))?;
        if let Err(denied) = self.policy.check_url(&parsed) {
            return Err(TaskError::fatal(format!("request to {url} refused: {denied}")).into());
        }
        let method_name = config["method"].as_str().unwrap_or("GET").to_ascii_uppercase();
        let method = reqwest::Method::from_bytes(method_name.as_bytes())
            .map_err(|_| TaskError::fatal(format!("invalid HTTP method {method_name:?}")))?;
        let timeout = match config["timeout"].as_str() {
            Some(t) => duration::parse(t).map_err(|e| TaskError::fatal(format!("config.timeout: {e}")))?,
            None => DEFAULT_TIMEOUT,
        }
        .min(self.max_timeout);
        let headers = config["headers"].as_object();
        let client =
            match (config["follow_redirects"].as_bool().unwrap_or(false), headers.is_some_and(|h| !h.is_empty())) {
                (false, _) => &self.direct,
                (true, true) => &self.same_host,
                (true, false) => &self.any_host,
            };

        let mut req = client
            .request(method, parsed)
            .timeout(timeout)
            .header("Idempotency-Key", format!("{}:{}", ctx.task_id, ctx.attempt));
        let mut has_content_type = false;
        for (name, value) in headers.into_iter().flatten() {
            let value = value.as_str().ok_or_else(|| TaskError::fatal(format!("header {name} is not a string")))?;
            has_content_type |= name.eq_ignore_ascii_case("content-type");
            req = req.header(name.as_str(), value);
        }
        match &config["body"] {
            Value::Null => {}
            Value::String(text) => req = req.body(text.clone()),
            body => {
                if !has_content_type {
                    req = req.header("Content-Type", "application/json");
                }
                req = req.body(serde_json::to_vec(body).map_err(|e| TaskError::fatal(e.to_string()))?);
            }
        }

        let transport = |e| Failure::Transport(url.to_string(), e);
        let mut resp = req.send().await.map_err(transport)?;
        let status = resp.status().as_u16();
        let mut headers = BTreeMap::new();
        for (name, value) in resp.headers() {
            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
            headers
                .entry(name.as_str().to_string())
                .and_modify(|v: &mut String| {
                    v.push_str(", ");
                    v.push_str(&value);
                })
                .or_insert(value);
        }
        let max_body = self.max_body;
        let mut bytes = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(transport)? {
            if bytes.len() + chunk.len() > max_body {
                return Err(TaskError::fatal(format!(
                    "response body from {url} exceeds the limit of {max_body} bytes (COMPOSER_MAX_PAYLOAD)"
                ))
                .into());
            }
            bytes.extend_from_slice(&chunk);
        }
        let body = match serde_json::from_slice::<Value>(&bytes) {
            Ok(v) => v,
            Err(_) if bytes.is_empty() => Value::Null,
            Err(_) => Value::String(String::from_utf8_lossy(&bytes).into_owned()),
        };

        let accepted = match config["accept"].as_array() {
            Some(list) => list.iter().any(|c| c.as_u64() == Some(status as u64)),
            None => (200..300).contains(&status),
        };
        if accepted {
            return Ok(json!({"status": status, "headers": headers, "body": body}));
        }
        let retryable = match config["retry_statuses"].as_array() {
            Some(list) => list.iter().any(|c| c.as_u64() == Some(status as u64)),
            None => status >= 500 || status == 429,
        };
        // Generous here: the runtime scrubs secrets, then cuts the message.
        let snippet: String = match &body {
            Value::String(s) => s.chars().take(2000).collect(),
            Value::Null => String::new(),
            other => other.to_string().chars().take(2000).collect(),
        };
        Err(TaskError { message: format!("{method_name} {url} answered {status}: {snippet}"), retryable }.into())
    }
}

/// Why a call failed: already a task error, or a transport error to look
/// through for the egress policy's refusal.
enum Failure {
    Task(TaskError),
    Transport(String, reqwest::Error),
}

impl From<TaskError> for Failure {
    fn from(e: TaskError) -> Failure {
        Failure::Task(e)
    }
}

fn transport_error(url: &str, e: reqwest::Error) -> TaskError {
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else {
        "failed"
    };
    TaskError::retryable(format!("request to {url} {what}: {e}"))
}
