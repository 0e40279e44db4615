//! Why a definition is refused, and the small checks every part of the
//! language shares (names, known fields, expressions, durations).

use std::time::Duration;

use serde_json::Value;

use crate::duration;

/// Longest id or name (of a workflow, node, queue or schedule).
pub const MAX_ID_LEN: usize = 128;

/// Why a definition was refused: `path` locates the problem
/// (`nodes[charge].config.url`), `message` says what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ValidationError {
    pub path: String,
    pub message: String,
}

impl ValidationError {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self { path: path.into(), message: message.into() }
    }
}

/// Whether `name` is a valid workflow, node, queue or schedule name (the
/// API refuses filters that could name nothing).
pub fn check_name(what: &str, name: &str) -> Result<(), String> {
    validate_name(what, name).map_err(|e| e.to_string())
}

/// Names and ids end up in stream keys, URLs and logs: keep them plain.
pub(crate) fn validate_name(path: &str, name: &str) -> Result<(), ValidationError> {
    if name.is_empty() {
        return Err(ValidationError::new(path, "must not be empty"));
    }
    if name.len() > MAX_ID_LEN {
        return Err(ValidationError::new(path, format!("must be at most {MAX_ID_LEN} characters")));
    }
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')) {
        return Err(ValidationError::new(path, format!("{name:?} may contain only letters, digits, '_', '-' and '.'")));
    }
    Ok(())
}

pub(crate) fn is_expression(v: &Value) -> bool {
    v.as_str().is_some_and(|s| s.contains("${"))
}

/// A positive duration (`"30s"`) at `path`.
pub(crate) fn positive_duration(path: &str, text: &str) -> Result<Duration, ValidationError> {
    match duration::parse(text) {
        Ok(d) if d.is_zero() => Err(ValidationError::new(path, "must be greater than zero")),
        Ok(d) => Ok(d),
        Err(e) => Err(ValidationError::new(path, e)),
    }
}
