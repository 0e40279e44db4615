//! What a hook's run (`on_failure`, `on_success`, `on_end`) is started
//! with: the ended run's view and the hook's input over it. The engine
//! evaluates it in the transaction that writes the end; `simulate` shows it.

use serde_json::{json, Map, Value};

use super::lifecycle::TaskState;
use super::run::Run;
use crate::definition::{Hook, Workflow};
use crate::expr::Sandbox;

/// What a hook's input sees of the run that ended: `{id, workflow, status,
/// error, output, nodes}`, each node's state, output and error.
fn ended_run(wf: &Workflow, run: &Run, with_outputs: bool) -> Value {
    let mut nodes = Map::new();
    for t in run.tasks.iter().filter(|t| t.item.is_none() && !t.removed) {
        let mut node = json!({"state": t.state});
        if with_outputs && t.state == TaskState::Completed {
            node["output"] = t.output.clone().unwrap_or(Value::Null);
        }
        if let Some(error) = t.error_json() {
            node["error"] = error;
        }
        nodes.insert(wf.nodes[t.node].id.clone(), node);
    }
    let output = if with_outputs { run.output.clone() } else { None };
    json!({"id": run.id, "workflow": wf.spec.name, "status": run.status, "error": run.error,
        "output": output, "nodes": nodes})
}

/// The scopes a hook's input is tried over, `{<subject>: ended run, input}`:
/// with the nodes' and the run's outputs when they and the run's input fit
/// in what one scope may hold (`Run::max_read`), then without them.
pub fn hook_scopes(hook: &Hook, wf: &Workflow, run: &Run) -> Vec<Value> {
    let outputs = run.tasks.iter().filter(|t| t.item.is_none() && !t.removed && t.state == TaskState::Completed);
    let values = [&run.input].into_iter().chain(run.output.as_ref()).chain(outputs.filter_map(|t| t.output.as_ref()));
    let mut left = Some(run.max_read);
    for value in values {
        left = left.and_then(|left| Some(left - crate::storable::size_up_to(value, left)?));
    }
    let subject = hook.kind.subject();
    [true, false]
        .into_iter()
        .filter(|&with_outputs| !with_outputs || left.is_some())
        .map(|with_outputs| json!({subject: ended_run(wf, run, with_outputs), "input": run.input}))
        .collect()
}

/// The hook's input: its template over the first of `scopes` whose value
/// is within `max_payload`, or `{<subject>: …}` without one. The first
/// that does not evaluate is the error, and so is the last one's size.
pub fn hook_input(sb: &Sandbox, hook: &Hook, scopes: &[Value], max_payload: usize) -> Result<Value, String> {
    let field = hook.kind.field();
    let subject = hook.kind.subject();
    let mut last = format!("{field}.input: nothing to evaluate");
    for scope in scopes {
        let input = match &hook.input {
            None => json!({subject: scope[subject]}),
            Some(template) => template.eval(sb, scope).map_err(|e| format!("{field}.input: {e}"))?,
        };
        match crate::storable::check(&input, &format!("{field}.input"), max_payload) {
            Ok(()) => return Ok(input),
            Err(e) => last = e,
        }
    }
    Err(last)
}
