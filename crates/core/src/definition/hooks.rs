//! A definition's hooks: the runs of other workflows a run's end starts —
//! `on_failure` (FAILED, and CANCELLED if it says so), `on_success`
//! (SUCCEEDED) and `on_end` (every end). Each is a workflow, a version and
//! an input template that reads no secret.

use super::check::{validate_name, ValidationError};
use super::spec::{HookSpec, OnFailureSpec};
use crate::expr::Template;

/// Which of a definition's hooks one is: its field, and the name its
/// input's template reads the ended run by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookKind {
    OnFailure,
    OnSuccess,
    OnEnd,
}

impl HookKind {
    /// The definition's field, which the run's history names too.
    pub fn field(self) -> &'static str {
        match self {
            HookKind::OnFailure => "on_failure",
            HookKind::OnSuccess => "on_success",
            HookKind::OnEnd => "on_end",
        }
    }

    /// What the input's template calls the run that ended: `failed_run`
    /// for a failure handler (as it always has), `run` for the others.
    pub fn subject(self) -> &'static str {
        match self {
            HookKind::OnFailure => "failed_run",
            HookKind::OnSuccess | HookKind::OnEnd => "run",
        }
    }
}

/// One hook, compiled: the run it starts when a run ends as `ends` says.
#[derive(Debug, Clone, PartialEq)]
pub struct Hook {
    pub kind: HookKind,
    pub workflow: String,
    pub version: Option<i32>,
    /// The hook run's input, over `{<subject>, input}`; `None` gives
    /// `{"<subject>": …}`.
    pub input: Option<Template>,
    /// The ends that start it.
    pub ends: Ends,
}

/// The ends of a run a hook starts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ends {
    pub succeeded: bool,
    pub failed: bool,
    pub cancelled: bool,
}

/// A definition's hooks, in the order they start: `on_failure`,
/// `on_success`, `on_end`.
pub(super) fn compile_hooks(
    on_failure: Option<&OnFailureSpec>,
    on_success: Option<&HookSpec>,
    on_end: Option<&HookSpec>,
) -> Result<Vec<Hook>, ValidationError> {
    let mut hooks = Vec::new();
    if let Some(h) = on_failure {
        let ends = failure_ends(h.on.as_deref())?;
        hooks.push(compile(HookKind::OnFailure, &h.workflow, h.version, h.input.as_ref(), ends)?);
    }
    let all = Ends { succeeded: true, failed: true, cancelled: true };
    for (kind, spec, ends) in
        [(HookKind::OnSuccess, on_success, Ends { succeeded: true, ..Ends::default() }), (HookKind::OnEnd, on_end, all)]
    {
        if let Some(h) = spec {
            hooks.push(compile(kind, &h.workflow, h.version, h.input.as_ref(), ends)?);
        }
    }
    Ok(hooks)
}

fn compile(
    kind: HookKind,
    workflow: &str,
    version: Option<i32>,
    input: Option<&serde_json::Value>,
    ends: Ends,
) -> Result<Hook, ValidationError> {
    let field = kind.field();
    validate_name(&format!("{field}.workflow"), workflow)?;
    if version.is_some_and(|v| v < 1) {
        return Err(ValidationError::new(format!("{field}.version"), "must be a version number (1 or more)"));
    }
    let input = match input {
        None => None,
        Some(v) if v.to_string().contains(".secrets") => {
            return Err(ValidationError::new(format!("{field}.input"), "a hook's input cannot read secrets"))
        }
        Some(v) => Some(Template::compile(v).map_err(|(p, m)| ValidationError::new(format!("{field}.input{p}"), m))?),
    };
    Ok(Hook { kind, workflow: workflow.to_string(), version, input, ends })
}

/// `on_failure.on`: FAILED by default, CANCELLED when it says so.
fn failure_ends(on: Option<&[String]>) -> Result<Ends, ValidationError> {
    let Some(on) = on else { return Ok(Ends { failed: true, ..Ends::default() }) };
    if on.is_empty() {
        return Err(ValidationError::new("on_failure.on", "must name FAILED, CANCELLED or both"));
    }
    let mut ends = Ends::default();
    for end in on {
        match end.as_str() {
            "FAILED" => ends.failed = true,
            "CANCELLED" => ends.cancelled = true,
            other => {
                return Err(ValidationError::new(
                    "on_failure.on",
                    format!("{other:?} is not an end a handler can start on (FAILED, CANCELLED)"),
                ))
            }
        }
    }
    Ok(ends)
}
