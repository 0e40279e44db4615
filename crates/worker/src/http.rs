//! The built-in HTTP executor.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use composer_core::definition::HTTP_METHODS;
use composer_core::duration;
use reqwest::header::{HeaderName, HeaderValue};
use serde_json::{json, Value};

use crate::egress::{Policy, Resolver};
use crate::redirect::{Body, Clients, Follow, OtherHost};
use crate::secrets::Secrets;
use crate::task::{TaskContext, TaskError};
use composer_core::machine::codes;

/// The node type the built-in executor runs.
pub(crate) const NODE_TYPE: &str = "HTTP";

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The HTTP executor: its clients and limits.
#[derive(Clone)]
pub struct Http {
    policy: Arc<Policy>,
    clients: Clients,
    max_body: usize,
    max_timeout: Duration,
}

/// A request as the node's config describes it, checked.
struct Request {
    req: reqwest::RequestBuilder,
    /// The method and URL as errors may show them.
    method: String,
    url: String,
    /// Why the request may not be redirected to another host, if it may not.
    stays: Option<Stay>,
}

/// What keeps a request on its host.
enum Stay {
    /// A secret bound to hosts, by name.
    BoundSecret(String),
    CustomHeaders,
    Body,
}

impl Http {
    pub fn new(policy: Policy, max_body: usize, max_timeout: Duration) -> Http {
        let policy = Arc::new(policy);
        let clients = Clients::new(policy.clone(), |redirects| {
            // HTTP/1.1 to targets, as ever: the archive's object storage
            // client compiles HTTP/2 into the one reqwest the binary has.
            reqwest::Client::builder()
                .http1_only()
                .connect_timeout(Duration::from_secs(10))
                .pool_idle_timeout(Duration::from_secs(30))
                .dns_resolver(Arc::new(Resolver(policy.clone())))
                .redirect(redirects)
                .referer(false)
                .build()
                .expect("building the HTTP client")
        });
        Http { policy, clients, max_body, max_timeout }
    }

    /// Calls the node's endpoint. Output: `{status, headers, body}`, the body
    /// parsed as JSON when it is JSON. Transport errors, 5xx and 429 are
    /// retryable; other statuses outside `accept` (default: 2xx) are not,
    /// unless listed in `retry_statuses`. A connection the egress policy
    /// refuses, a redirect that may not be followed and a bound secret on
    /// its way to another host fail at once, for good. An error never
    /// quotes a method, URL or header value that holds a secret.
    pub async fn execute(self, ctx: TaskContext, config: Value) -> Result<Value, TaskError> {
        let request = self.prepare(&ctx, &config)?;
        let (method, url) = (request.method.clone(), request.url.clone());
        let (status, headers, body) = self.send(request, &ctx.secrets).await?;
        let Some(retryable) = composer_core::http::refusal(&config, status) else {
            return Ok(json!({"status": status, "headers": headers, "body": body}));
        };
        let retry_after = match status {
            // Cut here as the engine would: a wait past u64 milliseconds is not a report.
            429 => headers
                .get("retry-after")
                .and_then(|v| composer_core::http::retry_after(v, chrono::Utc::now()))
                .map(|d| d.min(composer_core::definition::limit::MAX_RETRY_AFTER)),
            _ => None,
        };
        // Generous here: the runtime scrubs secrets, then cuts the message.
        Err(TaskError {
            message: composer_core::http::refused_answer(&method, &url, status, &body),
            retryable,
            code: Some(codes::HTTP_STATUS.into()),
            status: Some(status),
            retry_after,
        })
    }

    /// Reads and checks the config into a request, refusing what may not
    /// be sent: a denied address, a bound secret for another host.
    fn prepare(&self, ctx: &TaskContext, config: &Value) -> Result<Request, TaskError> {
        let secrets = &ctx.secrets;
        let config_error = |m: String| TaskError::fatal(m).with_code(codes::CONFIG);
        let refused = |m: String| TaskError::fatal(m).with_code(codes::REFUSED);
        let url = config["url"].as_str().ok_or_else(|| config_error("config.url is missing".into()))?;
        let shown_url = show_url(url, secrets);
        let parsed = reqwest::Url::parse(url).map_err(|e| {
            config_error(match secrets.holds(url) {
                true => format!("config.url (which holds a secret) is not a valid URL: {e}"),
                false => format!("config.url {url:?}: {e}"),
            })
        })?;
        if let Err(denied) = self.policy.check_url(&parsed) {
            return Err(refused(format!("request to {shown_url} refused: {denied}")));
        }
        let host = parsed.host_str().unwrap_or_default().to_string();
        if let Some(refusal) = secrets.refused_for(&host) {
            return Err(refused(format!("{refusal}, not to {host}: the request was not sent")));
        }
        // The methods registration accepts, whatever an expression yields.
        let method_name = config["method"].as_str().unwrap_or("GET").to_ascii_uppercase();
        let method = HTTP_METHODS
            .contains(&method_name.as_str())
            .then(|| reqwest::Method::from_bytes(method_name.as_bytes()).ok())
            .flatten()
            .ok_or_else(|| {
                config_error(match secrets.holds(&method_name) {
                    true => "the method (which holds a secret) is not a valid HTTP method".to_string(),
                    false => format!("the method {method_name:?} is not one of {}", HTTP_METHODS.join(", ")),
                })
            })?;
        let timeout = match config["timeout"].as_str() {
            Some(t) => duration::parse(t).map_err(|e| config_error(format!("config.timeout: {e}")))?,
            None => DEFAULT_TIMEOUT,
        }
        .min(self.max_timeout);
        let headers = config["headers"].as_object().filter(|h| !h.is_empty());
        let (follow, stays) = redirects(config, &method, headers.is_some(), secrets);
        let mut req = self
            .clients
            .get(follow)
            .request(method, parsed)
            .timeout(timeout)
            .header("Idempotency-Key", idempotency_key(ctx, config)?);
        let mut has_content_type = false;
        let mut has_traceparent = false;
        for (name, value) in headers.into_iter().flatten() {
            let (name, value) = header(name, value, secrets)?;
            has_content_type |= name == reqwest::header::CONTENT_TYPE;
            has_traceparent |= name == "traceparent";
            req = req.header(name, value);
        }
        // The target joins the run's trace, unless the node names its own.
        if let Some(tp) = ctx.traceparent.as_deref().filter(|_| !has_traceparent) {
            req = req.header("traceparent", tp);
        }
        match &config["body"] {
            Value::Null => {}
            Value::String(text) => req = req.body(text.clone()),
            body => {
                if !has_content_type {
                    req = req.header("Content-Type", "application/json");
                }
                req = req.body(serde_json::to_vec(body).map_err(|e| config_error(e.to_string()))?);
            }
        }
        Ok(Request { req, method: method_name, url: shown_url, stays })
    }

    /// Sends the request and reads the answer, up to the body limit.
    async fn send(
        &self,
        request: Request,
        secrets: &Secrets,
    ) -> Result<(u16, BTreeMap<String, String>, Value), TaskError> {
        let Request { req, url, stays, .. } = request;
        let failed = |e: reqwest::Error| transport_error(&url, stays.as_ref(), secrets, e);
        let mut resp = req.send().await.map_err(failed)?;
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
        while let Some(chunk) = resp.chunk().await.map_err(failed)? {
            if bytes.len() + chunk.len() > max_body {
                return Err(TaskError::fatal(format!(
                    "response body from {url} exceeds the limit of {max_body} bytes (COMPOSER_MAX_PAYLOAD)"
                ))
                .with_code(codes::PAYLOAD));
            }
            bytes.extend_from_slice(&chunk);
        }
        let body = match serde_json::from_slice::<Value>(&bytes) {
            Ok(v) => v,
            Err(_) if bytes.is_empty() => Value::Null,
            Err(_) => Value::String(String::from_utf8_lossy(&bytes).into_owned()),
        };
        Ok((status, headers, body))
    }
}

/// How the request may be redirected (see [`crate::redirect`]), and what
/// keeps it on its host.
fn redirects(
    config: &Value,
    method: &reqwest::Method,
    custom_headers: bool,
    secrets: &Secrets,
) -> (Follow, Option<Stay>) {
    let body = Body::of(method, !config["body"].is_null());
    let stays = match (secrets.bound().next(), custom_headers, body) {
        (Some(name), _, _) => Some(Stay::BoundSecret(name.to_string())),
        (None, true, _) => Some(Stay::CustomHeaders),
        (None, false, Body::None) => None,
        (None, false, _) => Some(Stay::Body),
    };
    let follow = match (config["follow_redirects"].as_bool().unwrap_or(false), &stays) {
        (false, _) => Follow::Never,
        (true, Some(Stay::BoundSecret(_) | Stay::CustomHeaders)) => Follow::SameHost,
        (true, _) => Follow::AnyHost(body),
    };
    (follow, stays)
}

/// The URL as an error may show it: whole, or only its origin when the
/// rest holds a secret, or not at all.
fn show_url(url: &str, secrets: &Secrets) -> String {
    if !secrets.holds(url) {
        return url.to_string();
    }
    match reqwest::Url::parse(url).map(|u| u.origin().ascii_serialization()) {
        Ok(origin) if origin != "null" && !secrets.holds(&origin) => format!("{origin}/… (the URL holds a secret)"),
        _ => "the URL (which holds a secret)".to_string(),
    }
}

/// A custom header, checked; an invalid value is not quoted when it holds
/// a secret.
fn header(name: &str, value: &Value, secrets: &Secrets) -> Result<(HeaderName, HeaderValue), TaskError> {
    let config_error = |m: String| TaskError::fatal(m).with_code(codes::CONFIG);
    let name_ok = HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| config_error(format!("header name {name:?} is not a valid HTTP header name")))?;
    let value = value.as_str().ok_or_else(|| config_error(format!("header {name} is not a string")))?;
    let value_ok = HeaderValue::from_str(value).map_err(|_| {
        config_error(match secrets.holds(value) {
            true => format!("header {name}: its value (which holds a secret) is not a valid header value"),
            false => format!("header {name}: {value:?} is not a valid header value"),
        })
    })?;
    Ok((name_ok, value_ok))
}

/// Longest `Idempotency-Key` a node may send (Stripe's limit).
pub const MAX_IDEMPOTENCY_KEY: usize = 255;

/// The `Idempotency-Key` of a request: the node's `idempotency_key` as the
/// coordinator evaluated it (by default `<task id>:<attempt>` of the attempt
/// that began this execution, so that retries and reclaims send the same
/// key), or, with `"per_attempt"` or from an older coordinator, the
/// attempt's own.
fn idempotency_key(ctx: &TaskContext, config: &Value) -> Result<String, TaskError> {
    match &config["idempotency_key"] {
        Value::Null => Ok(format!("{}:{}", ctx.task_id, ctx.attempt)),
        Value::String(k) if k == "per_attempt" => Ok(format!("{}:{}", ctx.task_id, ctx.attempt)),
        Value::String(k) if !k.is_empty() && k.len() <= MAX_IDEMPOTENCY_KEY && HeaderValue::from_str(k).is_ok() => {
            Ok(k.clone())
        }
        other => Err(TaskError::fatal(format!(
            "config.idempotency_key must be text of 1 to {MAX_IDEMPOTENCY_KEY} visible characters, got {}",
            match ctx.secrets.holds(&other.to_string()) {
                true => "a value that holds a secret".to_string(),
                false => other.to_string().chars().take(80).collect::<String>(),
            }
        ))
        .with_code(codes::CONFIG)),
    }
}

/// A transport error: a refusal (egress policy, a redirect to another host)
/// fails for good; anything else is retryable. reqwest's own message
/// carries the URL, which is left out: `url` is the URL as it may be shown.
fn transport_error(url: &str, stays: Option<&Stay>, secrets: &Secrets, e: reqwest::Error) -> TaskError {
    if let Some(denied) = crate::egress::denied_in(&e) {
        return TaskError::fatal(format!("request to {url} refused: {denied}")).with_code(codes::REFUSED);
    }
    if let Some(other) = cause::<OtherHost>(&e) {
        return TaskError::fatal(refused_redirect(other, stays, secrets)).with_code(codes::REFUSED);
    }
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else {
        "failed"
    };
    // Whether the request may have reached the target: an at-most-once
    // node's attempt is not sent again when it may have.
    let code = if e.is_timeout() {
        codes::TIMEOUT
    } else if e.is_connect() {
        codes::CONNECT
    } else {
        codes::TRANSPORT
    };
    TaskError::retryable(format!("request to {url} {what}: {}", e.without_url())).with_code(code)
}

/// Why a redirect to another host was not followed.
fn refused_redirect(other: &OtherHost, stays: Option<&Stay>, secrets: &Secrets) -> String {
    match stays {
        Some(Stay::BoundSecret(name)) => match secrets.refused_for(other.host()) {
            Some(refusal) => format!("{refusal}, not to {}: {other} refused", other.host()),
            None => format!(
                "{other} refused: the request carries secret {name}, bound to hosts ({}), and follows redirects only on its own host",
                crate::secrets::hosts_var(name)
            ),
        },
        Some(Stay::CustomHeaders) => {
            format!("{other} refused: the node sets custom headers, which are never sent to another host")
        }
        Some(Stay::Body) | None => format!("{other} refused: it would send the request's body there again"),
    }
}

/// An error of type `T` anywhere in `e`'s chain.
fn cause<'a, T: std::error::Error + 'static>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a T> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(found) = err.downcast_ref::<T>() {
            return Some(found);
        }
        cur = err.source();
    }
    None
}
