//! `${ .secrets.NAME }` in a task's input is resolved here, at execution,
//! from the worker's own environment (`COMPOSER_SECRET_NAME`). Coordinators
//! never see the value: it is not in PostgreSQL, on a stream, in the API or
//! in a log. Whatever the task reports back is scrubbed of the values used,
//! in case the target echoes them.

use composer_core::expr::{secret_name, segments, Segment};
use serde_json::Value;

use crate::task::TaskError;

/// Where secret NAME comes from.
pub fn env_var(name: &str) -> String {
    format!("COMPOSER_SECRET_{name}")
}

/// Replaces every secret reference in `input`; returns the values used.
pub fn resolve(input: &Value) -> Result<(Value, Vec<String>), TaskError> {
    let mut used = Vec::new();
    let out = walk(input, &mut used)?;
    Ok((out, used))
}

fn walk(v: &Value, used: &mut Vec<String>) -> Result<Value, TaskError> {
    Ok(match v {
        Value::String(s) if s.contains("${") => Value::String(resolve_str(s, used)?),
        Value::Array(items) => Value::Array(items.iter().map(|i| walk(i, used)).collect::<Result<_, _>>()?),
        Value::Object(map) => {
            let mut out = serde_json::Map::new();
            for (k, item) in map {
                out.insert(unescape_key(k), walk(item, used)?);
            }
            Value::Object(out)
        }
        other => other.clone(),
    })
}

/// Keys never reference secrets; an escaped `$${` in one is the text `${`.
fn unescape_key(k: &str) -> String {
    if !k.contains("$${") {
        return k.to_string();
    }
    match segments(k) {
        Ok(parts) => parts
            .into_iter()
            .map(|p| match p {
                Segment::Text(t) => t,
                Segment::Escaped => "${",
                Segment::Expr { raw, .. } => raw,
            })
            .collect(),
        Err(_) => k.to_string(),
    }
}

fn resolve_str(s: &str, used: &mut Vec<String>) -> Result<String, TaskError> {
    // Text the template compiler accepted always scans; anything else is text.
    let Ok(segments) = segments(s) else { return Ok(s.to_string()) };
    let mut out = String::with_capacity(s.len());
    for segment in segments {
        match segment {
            Segment::Text(text) => out.push_str(text),
            // Data placed in the input by the coordinator: text, never a reference.
            Segment::Escaped => out.push_str("${"),
            Segment::Expr { source, raw } => match secret_name(source) {
                Some(name) => {
                    let value = std::env::var(env_var(name)).map_err(|_| {
                        TaskError::fatal(format!(
                            "unknown secret {name}: set {} in the worker's environment",
                            env_var(name)
                        ))
                    })?;
                    if !used.contains(&value) {
                        used.push(value.clone());
                    }
                    out.push_str(&value);
                }
                None => out.push_str(raw),
            },
        }
    }
    Ok(out)
}

/// The longest error message a task reports, cut after scrubbing so that
/// a secret is never cut in two and half of it kept.
pub const MAX_ERROR_CHARS: usize = 500;

/// Scrubs `message`, then cuts it to [`MAX_ERROR_CHARS`].
pub fn scrub_message(message: &str, secrets: &[String]) -> String {
    let scrubbed = scrub_str(message, secrets);
    if scrubbed.chars().count() <= MAX_ERROR_CHARS {
        return scrubbed;
    }
    let mut cut: String = scrubbed.chars().take(MAX_ERROR_CHARS).collect();
    cut.push('…');
    cut
}

/// Replaces the secret values in `text`.
pub fn scrub_str(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_string();
    for s in secrets.iter().filter(|s| s.len() >= 3) {
        out = out.replace(s.as_str(), "[secret]");
    }
    out
}

/// Replaces the secret values anywhere in `v`.
pub fn scrub(v: &mut Value, secrets: &[String]) {
    match v {
        Value::String(s) if secrets.iter().any(|x| x.len() >= 3 && s.contains(x.as_str())) => {
            *s = scrub_str(s, secrets);
        }
        Value::Array(items) => items.iter_mut().for_each(|i| scrub(i, secrets)),
        Value::Object(map) => {
            let echoed = |k: &str| secrets.iter().any(|x| x.len() >= 3 && k.contains(x.as_str()));
            if map.keys().any(|k| echoed(k)) {
                *map = std::mem::take(map)
                    .into_iter()
                    .map(|(k, v)| (if echoed(&k) { scrub_str(&k, secrets) } else { k }, v))
                    .collect();
            }
            map.values_mut().for_each(|i| scrub(i, secrets));
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn resolves_from_the_environment_and_scrubs_echoes() {
        std::env::set_var("COMPOSER_SECRET_UNIT_TOKEN", "tok-123");
        let (v, used) = resolve(&json!({"h": {"Authorization": "Bearer ${ .secrets.UNIT_TOKEN }"}, "n": 1})).unwrap();
        assert_eq!(v, json!({"h": {"Authorization": "Bearer tok-123"}, "n": 1}));
        let mut echoed = json!({"headers": {"authorization": "Bearer tok-123"}});
        scrub(&mut echoed, &used);
        assert_eq!(echoed, json!({"headers": {"authorization": "Bearer [secret]"}}));
        let e = resolve(&json!("${.secrets.NOPE_NOT_SET}")).unwrap_err();
        assert!(e.message.contains("COMPOSER_SECRET_NOPE_NOT_SET") && !e.retryable, "{e:?}");
    }

    #[test]
    fn a_reference_arriving_as_data_is_sent_as_text() {
        std::env::set_var("COMPOSER_SECRET_UNIT_PAY", "pay-secret");
        // The coordinator escapes data; only the definition's own text is a reference.
        let input = composer_core::expr::escape_data(json!({"m": "${ .secrets.UNIT_PAY }", "${k}": "$${x}"}));
        let (v, used) = resolve(&input).unwrap();
        assert_eq!(v, json!({"m": "${ .secrets.UNIT_PAY }", "${k}": "$${x}"}), "data comes out as it went in");
        assert!(used.is_empty());
    }

    #[test]
    fn keys_are_scrubbed_and_messages_cut_after_scrubbing() {
        let secrets = vec!["s3cr3t-value".to_string()];
        let mut echoed = json!({"s3cr3t-value": {"x": "s3cr3t-value"}});
        scrub(&mut echoed, &secrets);
        assert_eq!(echoed, json!({"[secret]": {"x": "[secret]"}}));
        let message = format!("{}s3cr3t-value", "x".repeat(MAX_ERROR_CHARS - 4));
        let cut = scrub_message(&message, &secrets);
        assert!(!cut.contains("s3cr"), "no part of a secret survives the cut: {cut}");
    }
}
