//! The built-in HTTP executor.

use std::collections::BTreeMap;
use std::time::Duration;

use composer_core::duration;
use serde_json::{json, Value};

use crate::{TaskContext, TaskError};

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .pool_idle_timeout(Duration::from_secs(30))
        .build()
        .expect("building the HTTP client")
}

/// Calls the node's endpoint. Output: `{status, headers, body}`, the body
/// parsed as JSON when it is JSON. Transport errors, 5xx and 429 are
/// retryable; other statuses outside `accept` (default: 2xx) are not, unless
/// listed in `retry_statuses`.
pub async fn execute(
    client: reqwest::Client,
    ctx: TaskContext,
    config: Value,
    max_body: usize,
) -> Result<Value, TaskError> {
    let url = config["url"].as_str().ok_or_else(|| TaskError::fatal("config.url is missing"))?;
    let method_name = config["method"].as_str().unwrap_or("GET").to_ascii_uppercase();
    let method = reqwest::Method::from_bytes(method_name.as_bytes())
        .map_err(|_| TaskError::fatal(format!("invalid HTTP method {method_name:?}")))?;
    let timeout = match config["timeout"].as_str() {
        Some(t) => duration::parse(t).map_err(|e| TaskError::fatal(format!("config.timeout: {e}")))?,
        None => DEFAULT_TIMEOUT,
    };

    let mut req = client
        .request(method, url)
        .timeout(timeout)
        .header("Idempotency-Key", format!("{}:{}", ctx.task_id, ctx.attempt));
    let mut has_content_type = false;
    if let Some(headers) = config["headers"].as_object() {
        for (name, value) in headers {
            let value = value.as_str().ok_or_else(|| TaskError::fatal(format!("header {name} is not a string")))?;
            has_content_type |= name.eq_ignore_ascii_case("content-type");
            req = req.header(name.as_str(), value);
        }
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

    let mut resp = req.send().await.map_err(|e| transport_error(url, e))?;
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
    let mut bytes = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| transport_error(url, e))? {
        if bytes.len() + chunk.len() > max_body {
            return Err(TaskError::fatal(format!(
                "response body from {url} exceeds the limit of {max_body} bytes (COMPOSER_MAX_PAYLOAD)"
            )));
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
    Err(TaskError { message: format!("{method_name} {url} answered {status}: {snippet}"), retryable })
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
