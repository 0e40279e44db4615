//! A run's failure handler (`on_failure`): the run another workflow starts
//! when one of this workflow's runs ends FAILED (or CANCELLED, if it says
//! so). It is created in the transaction that writes the end, so a handler
//! starts exactly once for each end, whichever coordinator commits it and
//! whatever crashes: the end and the handler commit together or not at all.

use composer_core::trace::{RunTrace, TraceContext};
use std::sync::Arc;

use composer_core::definition::Workflow;
use composer_core::machine::{HistoryKind, TaskState};
use composer_store::definitions::DefinitionRow;
use serde_json::{json, Map, Value};

use super::admission::{self, Bounds, NewRunOf};
use super::error::{EngineError, Rejection, Result};
use super::evaluator::{self, Subject};
use super::loaded::Loaded;
use super::store::RunStore;

/// Whether the run's transition ends it in a way its definition's handler
/// is for. A handler's own run never starts another.
pub fn owes_handler(l: &Loaded) -> bool {
    l.tr.run_changed
        && l.handles.is_none()
        && l.wf.on_failure.as_ref().is_some_and(|h| h.starts_on(l.run.status))
        && !l.tr.history.iter().any(|h| h.kind == HistoryKind::HandlerStarted)
}

/// What a handler run's input sees of the run that failed: `{id, workflow,
/// status, error, nodes}`, each node's state, output and error.
fn failed_run(l: &Loaded, with_outputs: bool) -> Value {
    let mut nodes = Map::new();
    for t in l.run.tasks.iter().filter(|t| t.item.is_none() && !t.removed) {
        let mut node = json!({"state": t.state});
        if with_outputs && t.state == TaskState::Completed {
            node["output"] = t.output.clone().unwrap_or(Value::Null);
        }
        if let Some(error) = t.error_json() {
            node["error"] = error;
        }
        nodes.insert(l.wf.nodes[t.node].id.clone(), node);
    }
    json!({"id": l.run.id, "workflow": l.wf.spec.name, "status": l.run.status, "error": l.run.error, "nodes": nodes})
}

/// The handler's input: the definition's `on_failure.input` over
/// `{failed_run, input}` (evaluated through the evaluator's door, for the
/// failed run), or `{"failed_run": …}`. The nodes' outputs are left out when
/// the input would be larger than the payload limit with them, or when they
/// and the run's input are more than one scope may hold (`Run::max_read`).
async fn handler_input(l: &Loaded, bounds: Bounds) -> std::result::Result<Value, String> {
    let h = l.wf.on_failure.as_ref().ok_or("no handler")?;
    // The nodes' outputs, copied and converted only when they and the
    // input fit in what one scope may hold (`Run::max_read`).
    let outputs = l.run.tasks.iter().filter(|t| t.item.is_none() && !t.removed && t.state == TaskState::Completed);
    let values = std::iter::once(&l.run.input).chain(outputs.filter_map(|t| t.output.as_ref()));
    let mut left = Some(l.run.max_read);
    for value in values {
        left = left.and_then(|left| Some(left - composer_core::storable::size_up_to(value, left)?));
    }
    let contexts: Vec<Value> = [true, false]
        .into_iter()
        .filter(|&with_outputs| !with_outputs || left.is_some())
        .map(|with_outputs| json!({"failed_run": failed_run(l, with_outputs), "input": l.run.input}))
        .collect();
    let Some(template) = h.input.clone() else {
        return first_storable(contexts.into_iter().map(|ctx| Ok(json!({"failed_run": ctx["failed_run"]}))), bounds);
    };
    let simple = template.is_simple();
    evaluator::evaluate(
        Subject::Run(l.run.id),
        simple,
        (template, contexts, bounds),
        |sb, (template, contexts, bounds)| {
            let inputs =
                contexts.iter().map(|ctx| template.eval(sb, ctx).map_err(|e| format!("on_failure.input: {e}")));
            first_storable(inputs, bounds)
        },
    )
    .await
    .map_err(|lost| format!("on_failure.input: {lost}"))?
}

/// The first of `inputs` within the payload limit; the first that does not
/// evaluate is the error, and so is the last one's size.
fn first_storable(
    inputs: impl Iterator<Item = std::result::Result<Value, String>>,
    bounds: Bounds,
) -> std::result::Result<Value, String> {
    let mut last = String::new();
    for input in inputs {
        let input = input?;
        match composer_core::storable::check(&input, "on_failure.input", bounds.max_payload) {
            Ok(()) => return Ok(input),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Creates the handler run a failed run owes, in the store's transaction,
/// and notes in the failed run's history which run it started (or why none
/// could start: a handler workflow that is not registered, an input that
/// does not evaluate; the failed run's end is written either way).
pub async fn start<S: RunStore>(
    store: &S,
    compile: &(dyn Fn(&DefinitionRow) -> Result<Arc<Workflow>> + Sync),
    l: &mut Loaded,
    bounds: Bounds,
) -> Result<Option<Loaded>> {
    let Some(h) = l.wf.on_failure.clone() else { return Ok(None) };
    let started = async {
        let def = store
            .definition(&h.workflow, h.version)
            .await?
            .ok_or_else(|| Rejection::UnknownWorkflow { name: h.workflow.clone(), version: h.version })?;
        let input = handler_input(l, bounds).await.map_err(Rejection::HandlerInput)?;
        let wf = compile(&def)?;
        let trigger = json!({"failure_of": l.run.id});
        // The handler's span sits under the span of the run that failed.
        let failed = RunTrace::of(l.run.id, l.traceparent.as_deref());
        let traceparent = TraceContext { trace_id: failed.trace_id, span_id: failed.run_span, sampled: true }.header();
        let how = NewRunOf {
            def: &def,
            input: &input,
            idempotency_key: None,
            parent: None,
            depth: 0,
            trigger: Some(&trigger),
            root: None,
            handles: Some(l.run.id),
            abandoned: false,
            tags: None,
            traceparent: Some(&traceparent),
            priority: None,
            fairness_key: None,
        };
        admission::create_run(store, wf, how, bounds).await
    }
    .await;
    match started {
        Ok((row, loaded)) => {
            tracing::info!(run_id = %l.run.id, handler = %row.id, workflow = %h.workflow, "failure handler started");
            l.tr.log(HistoryKind::HandlerStarted, json!({"run_id": row.id, "workflow": h.workflow}));
            Ok(loaded)
        }
        Err(EngineError::Rejected(why)) => {
            tracing::warn!(run_id = %l.run.id, workflow = %h.workflow, error = %why, "failure handler not started");
            let reason = why.to_string();
            l.tr.log(HistoryKind::HandlerStarted, json!({"run_id": null, "workflow": h.workflow, "error": reason}));
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use composer_core::machine::{Event, Run, RunStatus};
    use uuid::Uuid;

    use super::super::effects::{apply, fake::FakeStore};
    use super::*;

    /// The failed run of a workflow whose first step copies its 300-byte
    /// input and whose second fails, loaded as a handler sees it, with
    /// `max_read` bytes for one scope.
    async fn failed(max_read: usize, handler: Value) -> Loaded {
        let wf = Arc::new(
            Workflow::parse(&json!({"name": "w", "nodes": [
                {"id": "a", "type": "TRANSFORM", "config": {"output": "${ .input.text }"}},
                {"id": "b", "type": "TRANSFORM", "config": {"output": "${ error(\"boom\") }"}}],
                "edges": [{"from": "a", "to": "b"}], "on_failure": handler}))
            .unwrap(),
        );
        let mut run = Run::new(Uuid::now_v7(), json!({"text": "t".repeat(300)}));
        run.max_read = max_read;
        let tr = apply(&FakeStore::default(), &wf, &mut run, Event::RunStarted).await.unwrap();
        assert_eq!(run.status, RunStatus::Failed, "{tr:?}");
        let id = run.id;
        Loaded {
            wf,
            run,
            tr,
            depth: 0,
            definition: (Uuid::nil(), 1),
            root: id,
            handles: None,
            traceparent: None,
            seen: Default::default(),
            priority: 3,
            fairness_key: None,
            eager: Vec::new(),
            pending_at_read: Vec::new(),
            read: Default::default(),
            offloaded: Default::default(),
        }
    }

    /// A handler's input holds the nodes' outputs only while they and the
    /// run's input fit in what one scope may hold (`Run::max_read`): past
    /// it they are left out (never copied or converted), for the default
    /// input and for a template, which then reads them as absent.
    #[tokio::test]
    async fn a_handlers_input_leaves_the_nodes_outputs_out_past_what_one_scope_may_hold() {
        let text = json!("t".repeat(300));
        let template =
            json!({"workflow": "h", "input": {"seen": "${ .failed_run.nodes.a.output }", "in": "${ .input.text }"}});
        for (max_read, shown) in [(4096, true), (700, true), (500, false), (350, false)] {
            let l = failed(max_read, json!({"workflow": "h"})).await;
            let input = handler_input(&l, Bounds::DEFAULT).await.unwrap();
            let a = &input["failed_run"]["nodes"]["a"];
            assert_eq!(a["state"], "COMPLETED", "{max_read}: {input}");
            assert_eq!(a.get("output"), shown.then_some(&text), "{max_read}: {input}");
            assert!(input["failed_run"]["nodes"]["b"]["error"].to_string().contains("boom"), "{input}");

            let l = failed(max_read, template.clone()).await;
            let input = handler_input(&l, Bounds::DEFAULT).await.unwrap();
            let seen = if shown { text.clone() } else { Value::Null };
            assert_eq!(input, json!({"seen": seen, "in": text}), "{max_read}");
        }
    }
}
