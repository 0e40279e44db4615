//! A definition's hooks: the runs of other workflows a run's end starts —
//! `on_failure` (FAILED, and CANCELLED if it says so), `on_success`
//! (SUCCEEDED) and `on_end` (every end) — and its deadlines, the runs a
//! run or a step that has not ended some time after its start starts.
//! Each is a workflow, a version and an input template that reads no
//! secret.

use std::time::Duration;

use super::check::positive_duration;
use super::check::{validate_name, ValidationError};
use super::spec::{DeadlineSpec, HookSpec, OnFailureSpec, WorkflowSpec};
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

/// A definition's hooks and its run's deadlines.
pub(super) fn compile_hooks_and_deadlines(spec: &WorkflowSpec) -> Result<(Vec<Hook>, Vec<Deadline>), ValidationError> {
    let hooks = compile_hooks(spec.on_failure.as_ref(), spec.on_success.as_ref(), spec.on_end.as_ref())?;
    Ok((hooks, compile_deadlines("deadlines", &spec.deadlines)?))
}

/// A definition's hooks, in the order they start: `on_failure`,
/// `on_success`, `on_end`.
fn compile_hooks(
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

/// Most deadlines a run, or one node's step, may have.
pub const MAX_DEADLINES: usize = 8;

/// A deadline, compiled: the run it starts when a run (or a node's step)
/// has not ended `after` its start.
#[derive(Debug, Clone, PartialEq)]
pub struct Deadline {
    pub after: Duration,
    pub workflow: String,
    pub version: Option<i32>,
    /// Its input, over `{run, step, deadline, input}`; `None` gives
    /// `{run, step, deadline}`.
    pub input: Option<Template>,
}

/// The deadlines at `at` (`deadlines`, `nodes[a].deadlines`).
pub(super) fn compile_deadlines(at: &str, specs: &[DeadlineSpec]) -> Result<Vec<Deadline>, ValidationError> {
    if specs.len() > MAX_DEADLINES {
        return Err(ValidationError::new(at, format!("at most {MAX_DEADLINES} deadlines (MAX_DEADLINES)")));
    }
    let mut out = Vec::with_capacity(specs.len());
    for (i, d) in specs.iter().enumerate() {
        let at = format!("{at}[{i}]");
        let after = positive_duration(&format!("{at}.after"), &d.after)?;
        let field = format!("{at}.start");
        validate_name(&format!("{field}.workflow"), &d.start.workflow)?;
        if d.start.version.is_some_and(|v| v < 1) {
            return Err(ValidationError::new(format!("{field}.version"), "must be a version number (1 or more)"));
        }
        let input = match &d.start.input {
            None => None,
            Some(v) if v.to_string().contains(".secrets") => {
                return Err(ValidationError::new(format!("{field}.input"), "a deadline's input cannot read secrets"))
            }
            Some(v) => {
                Some(Template::compile(v).map_err(|(p, m)| ValidationError::new(format!("{field}.input{p}"), m))?)
            }
        };
        out.push(Deadline { after, workflow: d.start.workflow.clone(), version: d.start.version, input });
    }
    Ok(out)
}
