//! What an HTTP node makes of its target's answer: shared by the worker
//! that calls the target and by simulate, so that a mocked answer takes the
//! path a real one would.

use serde_json::Value;

/// How an HTTP node's attempt ends with an answer of `status`, by its
/// evaluated `config`: `None` when the status is accepted (`accept`, by
/// default any 2xx), else `Some(retryable)` (`retry_statuses`, by default
/// 5xx and 429).
pub fn refusal(config: &Value, status: u16) -> Option<bool> {
    let listed = |key: &str| config[key].as_array().map(|list| list.iter().any(|c| c.as_u64() == Some(status as u64)));
    let accepted = listed("accept").unwrap_or((200..300).contains(&status));
    if accepted {
        return None;
    }
    Some(listed("retry_statuses").unwrap_or(status >= 500 || status == 429))
}

/// How long a `Retry-After` header asks to wait, read at `now`: whole
/// seconds, or an HTTP date (a date past is no wait). Anything else is
/// `None`; the engine cuts a long wait to its `max_retry_after`.
pub fn retry_after(value: &str, now: chrono::DateTime<chrono::Utc>) -> Option<std::time::Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Digits past u64 are "very long": the cap applies.
        return Some(std::time::Duration::from_secs(value.parse().unwrap_or(u64::MAX)));
    }
    let at = chrono::DateTime::parse_from_rfc2822(value).ok()?.with_timezone(&chrono::Utc);
    Some((at - now).to_std().unwrap_or_default())
}

/// The error of an attempt whose answer was refused: the request and the
/// status, and the start of the body (the worker scrubs secrets from it).
pub fn refused_answer(method: &str, url: &str, status: u16, body: &Value) -> String {
    let snippet: String = match body {
        Value::String(s) => s.chars().take(2000).collect(),
        Value::Null => String::new(),
        other => other.to_string().chars().take(2000).collect(),
    };
    format!("{method} {url} answered {status}: {snippet}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn retry_after_is_seconds_or_a_date() {
        use std::time::Duration;
        let now = chrono::DateTime::parse_from_rfc3339("2015-10-21T07:28:00Z").unwrap().to_utc();
        assert_eq!(super::retry_after("120", now), Some(Duration::from_secs(120)));
        assert_eq!(super::retry_after(" 0 ", now), Some(Duration::ZERO));
        assert_eq!(super::retry_after("99999999999999999999999", now), Some(Duration::from_secs(u64::MAX)));
        assert_eq!(super::retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now), Some(Duration::from_secs(30)));
        assert_eq!(super::retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now), Some(Duration::ZERO), "a date past");
        for bad in ["", "-5", "1.5", "soon", "120s"] {
            assert_eq!(super::retry_after(bad, now), None, "{bad:?}");
        }
    }

    use super::*;
    use serde_json::json;

    #[test]
    fn statuses_are_accepted_retried_or_final_as_the_config_says() {
        let plain = json!({"url": "http://h"});
        assert_eq!(refusal(&plain, 200), None);
        assert_eq!(refusal(&plain, 204), None);
        assert_eq!(refusal(&plain, 402), Some(false));
        assert_eq!(refusal(&plain, 429), Some(true));
        assert_eq!(refusal(&plain, 503), Some(true));
        let listed = json!({"url": "http://h", "accept": [200, 402], "retry_statuses": [409]});
        assert_eq!(refusal(&listed, 402), None);
        assert_eq!(refusal(&listed, 201), Some(false));
        assert_eq!(refusal(&listed, 409), Some(true));
        assert_eq!(refusal(&listed, 503), Some(false), "retry_statuses replaces the default");
    }
}
