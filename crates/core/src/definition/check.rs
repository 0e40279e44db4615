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

/// Whether `name` is a valid workflow, node, queue, schedule or webhook
/// name (the API refuses filters that could name nothing).
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
    check_path_segment(name).map_err(|m| ValidationError::new(path, m))
}

/// Whether `text` (a name, a limit key) can be one segment of a URL path,
/// as `/v1/workflows/{name}` and `/v1/limits/{key}` put it. `.` and `..`
/// cannot: a browser, Node's fetch and Rust's `url` (reqwest, so the CLI)
/// read them, even percent-encoded as `%2E%2E`, as "here" and "the parent",
/// so the request goes to another route. Every name and limit key is
/// checked here; `a.b` and `...` are fine.
pub fn check_path_segment(text: &str) -> Result<(), String> {
    match text {
        "." | ".." => Err("may not be \".\" or \"..\": a URL path cannot carry it".into()),
        _ => Ok(()),
    }
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{check_name, validate_name};
    use crate::definition::Workflow;
    use crate::schedule::Schedule;

    const WHY: &str = "may not be \".\" or \"..\": a URL path cannot carry it";

    #[test]
    fn names_a_url_cannot_carry_are_refused_everywhere() {
        for bad in [".", ".."] {
            assert_eq!(validate_name("name", bad).unwrap_err().to_string(), format!("name: {WHY}"));
            assert_eq!(check_name("queues[0]", bad).unwrap_err(), format!("queues[0]: {WHY}"));
            let node =
                |id: &str, queue: &str| json!({"id": id, "type": "TRANSFORM", "queue": queue, "config": {"output": 1}});
            for (spec, field) in [
                (json!({"name": bad, "nodes": [node("a", "q")]}), "name".to_string()),
                (json!({"name": "w", "nodes": [node(bad, "q")]}), format!("nodes[{bad}].id")),
                (json!({"name": "w", "nodes": [node("a", bad)]}), "nodes[a].queue".to_string()),
            ] {
                let e = Workflow::parse(&spec).unwrap_err();
                assert_eq!((e.path.as_str(), e.message.as_str()), (field.as_str(), WHY), "{spec}");
            }
            let e = Schedule::parse(&json!({"id": bad, "workflow": "w", "cron": "0 * * * *"})).unwrap_err();
            assert_eq!((e.path.as_str(), e.message.as_str()), ("id", WHY));
        }
        for fine in ["a.b", "...", ".a", "..a", "a..", "v1.2"] {
            assert_eq!(check_name("name", fine), Ok(()), "{fine}");
        }
        let wf = Workflow::parse(
            &json!({"name": "a.b", "nodes": [{"id": "a.b", "type": "TRANSFORM", "config": {"output": 1}}]}),
        );
        assert!(wf.is_ok(), "{wf:?}");
    }
}
