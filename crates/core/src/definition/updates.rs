//! The updates a waiting step accepts (`updates` on a WAIT_FOR_EVENT node):
//! a named request (`POST /v1/runs/{id}/update`) that the step validates,
//! and completes with when it accepts, answering the caller with its output
//! or the reason it refused.

use serde_json::{json, Value};

use super::check::{validate_name, ValidationError};
use super::kind::NodeKind;
use super::spec::UpdateSpec;
use crate::expr::{Expr, Sandbox, Template};

/// Most updates one step accepts.
pub const MAX_UPDATES: usize = 8;

/// Longest `refusal` text, in characters.
pub const MAX_REFUSAL_CHARS: usize = 1024;

/// An update a step accepts, compiled.
#[derive(Debug, Clone, PartialEq)]
pub struct Update {
    pub name: String,
    /// Over [`scope`]: true accepts, false refuses with `refusal`, an error
    /// refuses with its message. `None` accepts every one.
    validate: Option<Expr>,
    refusal: Option<String>,
    /// The step's output when it accepts, over [`scope`]; the payload by default.
    output: Option<Template>,
}

/// What a step decided of an update.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Accepted: the step completes with this output.
    Accepted(Value),
    /// Refused, and why.
    Refused(String),
}

/// The scope an update's expressions see: `{update: {id, name, payload}, input}`.
pub fn scope(id: &str, name: &str, payload: &Value, input: &Value) -> Value {
    json!({"update": {"id": id, "name": name, "payload": payload}, "input": input})
}

impl Update {
    /// Whether every expression of it is simple ([`Expr::is_simple`]).
    pub fn is_simple(&self) -> bool {
        self.validate.as_ref().is_none_or(Expr::is_simple) && self.output.as_ref().is_none_or(Template::is_simple)
    }

    /// The step's decision on an update, given its [`scope`]: an output the
    /// engine could not store as a value of at most `max` bytes (a NUL, the
    /// offloaded key, too deep or too large) refuses it, and a reason is
    /// text it can store.
    pub fn decide(&self, sb: &Sandbox, scope: &Value, max: usize) -> Decision {
        let refused = |why: String| Decision::Refused(why.replace('\0', "\u{fffd}"));
        if let Some(validate) = &self.validate {
            match validate.eval_bool(sb, scope) {
                Ok(true) => {}
                Ok(false) => return refused(self.refusal.clone().unwrap_or_else(|| "refused by validate".into())),
                Err(e) => return refused(format!("validate: {e}")),
            }
        }
        let output = match &self.output {
            None => scope["update"]["payload"].clone(),
            Some(t) => match t.eval(sb, scope) {
                Ok(v) => v,
                Err(e) => return refused(format!("output: {e}")),
            },
        };
        match crate::storable::check(&output, "output", max) {
            Ok(()) => Decision::Accepted(output),
            Err(why) => refused(why),
        }
    }
}

/// The updates at `at` (`nodes[a].updates`) of a node of `kind`.
pub(super) fn compile_updates(at: &str, kind: &NodeKind, specs: &[UpdateSpec]) -> Result<Vec<Update>, ValidationError> {
    if specs.is_empty() {
        return Ok(Vec::new());
    }
    if !matches!(kind, NodeKind::WaitForEvent { .. }) {
        return Err(ValidationError::new(at, "only a WAIT_FOR_EVENT step accepts updates"));
    }
    if specs.len() > MAX_UPDATES {
        return Err(ValidationError::new(at, format!("at most {MAX_UPDATES} updates (MAX_UPDATES)")));
    }
    let mut out: Vec<Update> = Vec::with_capacity(specs.len());
    for (i, u) in specs.iter().enumerate() {
        let at = format!("{at}[{i}]");
        validate_name(&format!("{at}.name"), &u.name)?;
        if out.iter().any(|o| o.name == u.name) {
            return Err(ValidationError::new(format!("{at}.name"), format!("{:?} is accepted twice", u.name)));
        }
        // Their scope holds the update and the run's input, nothing else.
        let validate = match &u.validate {
            None => None,
            Some(v) => Some(Expr::compile(v).map_err(|m| ValidationError::new(format!("{at}.validate"), m))?),
        };
        match &u.refusal {
            Some(r) if r.chars().count() > MAX_REFUSAL_CHARS => {
                let why = format!("must be at most {MAX_REFUSAL_CHARS} characters");
                return Err(ValidationError::new(format!("{at}.refusal"), why));
            }
            Some(r) if r.contains('\0') => {
                return Err(ValidationError::new(format!("{at}.refusal"), "contains a NUL character"))
            }
            _ => {}
        }
        let output = match &u.output {
            None => None,
            Some(v) => Some(Template::compile(v).map_err(|(p, m)| ValidationError::new(format!("{at}.output{p}"), m))?),
        };
        out.push(Update { name: u.name.clone(), validate, refusal: u.refusal.clone(), output });
    }
    Ok(out)
}
