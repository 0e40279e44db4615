//! What a definition decides of a new run from its input when it is
//! created: its tags, its concurrency key and its fairness key, each
//! template evaluated in one scope of the input ([`OneScope`]: converted
//! once, and only if one of them reads it).

use serde_json::Value;

use super::check::ValidationError;
use crate::expr::{OneScope, Sandbox, Template};

/// Most tags a run may have (`max_run_tags`).
pub const MAX_TAGS: usize = 16;
/// Longest tag value, in characters.
pub const MAX_TAG_VALUE: usize = 256;

/// Whether `key` may name a tag: 1 to 64 of `A-Z a-z 0-9 _ . -`.
pub fn is_tag_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 64
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// A tag's value as stored: text (a number becomes its text), at most
/// [`MAX_TAG_VALUE`] characters, no NUL.
pub fn tag_value(key: &str, v: &Value) -> Result<String, String> {
    let text = match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => {
            return Err(format!("tag {key}: must be text or a number, got {}", crate::clipped(&other.to_string(), 200)))
        }
    };
    if text.chars().count() > MAX_TAG_VALUE || text.contains('\0') {
        return Err(format!("tag {key}: at most {MAX_TAG_VALUE} characters, without NUL"));
    }
    Ok(text)
}

/// Longest concurrency key, in bytes.
pub const MAX_CONCURRENCY_KEY: usize = 512;

/// Longest fairness key, in bytes (`max_fairness_key`).
pub const MAX_FAIRNESS_KEY: usize = 512;

/// A new run's tags, fairness key and concurrency key (with a limit), from
/// its input in one scope (and the start's `given` tags); the error names
/// the field.
pub(super) fn start_keys(
    templates: StartTemplates<'_>,
    sb: &Sandbox,
    input: &OneScope,
    given: Option<&serde_json::Map<String, Value>>,
) -> Result<StartKeys, StartKeyError> {
    Ok(StartKeys {
        tags: tags(templates.tags, sb, input, given).map_err(StartKeyError::Tags)?,
        fairness_key: fairness_key(templates.fairness_key, sb, input).map_err(StartKeyError::FairnessKey)?,
        concurrency_key: match templates.concurrency_key {
            Some(key) => Some(concurrency_key(key, sb, input).map_err(StartKeyError::ConcurrencyKey)?),
            None => None,
        },
    })
}

/// A definition's templates [`start_keys`] evaluates.
pub(super) struct StartTemplates<'a> {
    pub tags: &'a [(String, Template)],
    pub fairness_key: Option<&'a Template>,
    /// `Some` with a concurrency limit: its key, if it has one.
    pub concurrency_key: Option<Option<&'a Template>>,
}

/// A concurrency limit's key: text, `""` without a key template.
pub(super) fn concurrency_key(key: Option<&Template>, sb: &Sandbox, input: &OneScope) -> Result<String, String> {
    let Some(key) = key else { return Ok(String::new()) };
    match input.eval(sb, key) {
        // PostgreSQL text holds no NUL: refused here, not by the insert.
        Ok(Value::String(s)) if s.contains('\0') => Err("concurrency.key: contains a NUL character".into()),
        Ok(Value::String(s)) if s.len() <= MAX_CONCURRENCY_KEY => Ok(s),
        Ok(Value::String(_)) => Err(format!("concurrency.key: longer than {MAX_CONCURRENCY_KEY} bytes")),
        Ok(Value::Number(n)) => Ok(n.to_string()),
        Ok(other) => Err(format!(
            "concurrency.key: must be a string or a number, got {}",
            crate::clipped(&other.to_string(), 200)
        )),
        Err(e) => Err(format!("concurrency.key: {e}")),
    }
}

/// A new run's fairness key: `None` when the definition names none.
pub(super) fn fairness_key(key: Option<&Template>, sb: &Sandbox, input: &OneScope) -> Result<Option<String>, String> {
    let Some(key) = key else { return Ok(None) };
    match input.eval(sb, key) {
        Ok(Value::String(s)) if s.is_empty() => Ok(None),
        Ok(Value::String(s)) if s.contains('\0') => Err("fairness_key: contains a NUL character".into()),
        Ok(Value::String(s)) if s.len() <= MAX_FAIRNESS_KEY => Ok(Some(s)),
        Ok(Value::String(_)) => Err(format!("fairness_key: longer than {MAX_FAIRNESS_KEY} bytes (max_fairness_key)")),
        Ok(Value::Number(n)) => Ok(Some(n.to_string())),
        Ok(Value::Null) => Ok(None),
        Ok(other) => {
            Err(format!("fairness_key: must be text, a number or null, got {}", crate::clipped(&other.to_string(), 80)))
        }
        Err(e) => Err(format!("fairness_key: {e}")),
    }
}

/// A new run's tags: the definition's (`defined`), evaluated over
/// `{input}`, then `given` (the start's), which wins on a key both have.
pub(super) fn tags(
    defined: &[(String, Template)],
    sb: &Sandbox,
    input: &OneScope,
    given: Option<&serde_json::Map<String, Value>>,
) -> Result<Option<Value>, String> {
    let mut tags = serde_json::Map::new();
    for (key, template) in defined {
        let v = input.eval(sb, template).map_err(|e| format!("tags.{key}: {e}"))?;
        if !v.is_null() {
            tags.insert(key.clone(), Value::String(tag_value(key, &v)?));
        }
    }
    for (key, v) in given.into_iter().flatten() {
        if !is_tag_key(key) {
            return Err(format!("tags: {key:?} is not a tag key (1 to 64 of A-Z, a-z, 0-9, '_', '.' and '-')"));
        }
        tags.insert(key.clone(), Value::String(tag_value(key, v)?));
    }
    if tags.len() > MAX_TAGS {
        return Err(format!("tags: at most {MAX_TAGS} (max_run_tags)"));
    }
    Ok((!tags.is_empty()).then_some(Value::Object(tags)))
}

pub(super) fn compile_tags(
    tags: Option<&serde_json::Map<String, Value>>,
) -> Result<Vec<(String, Template)>, ValidationError> {
    let Some(tags) = tags else { return Ok(Vec::new()) };
    if tags.len() > MAX_TAGS {
        return Err(ValidationError::new("tags", format!("at most {MAX_TAGS} (max_run_tags)")));
    }
    let mut out = Vec::with_capacity(tags.len());
    for (key, v) in tags {
        let at = format!("tags.{key}");
        if !is_tag_key(key) {
            return Err(ValidationError::new(at, "a key is 1 to 64 of A-Z, a-z, 0-9, '_', '.' and '-'"));
        }
        match v {
            Value::String(s) if s.contains(".nodes") || s.contains(".secrets") => {
                return Err(ValidationError::new(at, "is computed when the run is created: it can read .input only"))
            }
            Value::String(_) | Value::Number(_) | Value::Bool(_) => {}
            _ => return Err(ValidationError::new(at, "must be text, a number or an expression")),
        }
        let template = Template::compile(v).map_err(|(_, m)| ValidationError::new(at.clone(), m))?;
        out.push((key.clone(), template));
    }
    Ok(out)
}

/// What a definition decides of a new run from its input ([`Workflow::start_keys`]).
#[derive(Debug, Clone, PartialEq)]
pub struct StartKeys {
    pub tags: Option<Value>,
    pub fairness_key: Option<String>,
    /// `Some` (`""` without a key template) when the workflow has a concurrency limit.
    pub concurrency_key: Option<String>,
}

/// Which of a new run's start-time fields did not evaluate, and why.
#[derive(Debug, Clone, PartialEq)]
pub enum StartKeyError {
    Tags(String),
    FairnessKey(String),
    ConcurrencyKey(String),
}
