//! A run's hooks (`on_failure`, `on_success`, `on_end`): the runs of other
//! workflows a run's end starts (FAILED, and CANCELLED if `on_failure` says
//! so; SUCCEEDED; any end). Each is created in the transaction that writes
//! the end, so a hook starts exactly once for each end, whichever
//! coordinator commits it and whatever crashes: the end and its hooks'
//! runs commit together or not at all. A hook's run starts no hook of its
//! own, and joins the ended run's tree: it is not charged to the tree's
//! budget of runs (a tree out of runs still starts its failure handler),
//! but every child it starts is, so no chain of definitions can make hooks
//! start runs without end; its MAPs share the tree's budget of items.

use composer_core::trace::{RunTrace, TraceContext};
use std::sync::Arc;

use composer_core::definition::{Hook, Workflow};
use composer_core::machine::HistoryKind;
use composer_store::definitions::DefinitionRow;
use serde_json::{json, Value};

use super::admission::{self, Bounds, NewRunOf};
use super::error::{EngineError, Rejection, Result};
use super::evaluator::{self, Subject};
use super::loaded::Loaded;
use super::store::RunStore;

/// The hooks the run's transition ends it in a way they are for, in the
/// definition's order. A hook's own run never starts another.
pub fn owed_hooks(l: &Loaded) -> Vec<Hook> {
    if !l.tr.run_changed || l.handles.is_some() {
        return Vec::new();
    }
    let started = |h: &Hook| {
        l.tr.history.iter().any(|e| {
            e.kind == HistoryKind::HandlerStarted
                && e.payload.get("hook").and_then(Value::as_str).unwrap_or("on_failure") == h.kind.field()
        })
    };
    l.wf.hooks.iter().filter(|h| h.starts_on(l.run.status) && !started(h)).cloned().collect()
}

/// The hook's input (evaluated through the evaluator's door, for the run
/// that ended): see [`composer_core::machine::hook_input`].
async fn hook_input(l: &Loaded, hook: &Hook, bounds: Bounds) -> std::result::Result<Value, String> {
    let scopes = composer_core::machine::hook_scopes(hook, &l.wf, &l.run);
    let simple = hook.input.as_ref().is_none_or(|t| t.is_simple());
    let field = hook.kind.field();
    evaluator::evaluate(Subject::Run(l.run.id), simple, (hook.clone(), scopes, bounds), |sb, (hook, scopes, bounds)| {
        composer_core::machine::hook_input(sb, &hook, &scopes, bounds.max_payload)
    })
    .await
    .map_err(|lost| format!("{field}.input: {lost}"))?
}

/// Creates the run `hook` starts for the run that ended, in the store's
/// transaction, and notes in the ended run's history which run it started
/// (or why none could start: a workflow that is not registered, an input
/// that does not evaluate; the run's end is written either way).
pub async fn start<S: RunStore>(
    store: &S,
    compile: &(dyn Fn(&DefinitionRow) -> Result<Arc<Workflow>> + Sync),
    l: &mut Loaded,
    hook: &Hook,
    bounds: Bounds,
) -> Result<Option<Loaded>> {
    let field = hook.kind.field();
    let started = async {
        let def = store
            .definition(&hook.workflow, hook.version)
            .await?
            .ok_or_else(|| Rejection::UnknownWorkflow { name: hook.workflow.clone(), version: hook.version })?;
        let input = hook_input(l, hook, bounds).await.map_err(Rejection::HandlerInput)?;
        let wf = compile(&def)?;
        let trigger = match hook.kind {
            composer_core::definition::HookKind::OnFailure => json!({"failure_of": l.run.id}),
            _ => json!({"hook": field, "end_of": l.run.id}),
        };
        // The hook's span sits under the span of the run that ended.
        let ended = RunTrace::of(l.run.id, l.traceparent.as_deref());
        let traceparent = TraceContext { trace_id: ended.trace_id, span_id: ended.run_span, sampled: true }.header();
        let how = NewRunOf {
            def: &def,
            input: &input,
            idempotency_key: None,
            parent: None,
            depth: 0,
            trigger: Some(&trigger),
            root: Some(l.root),
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
            tracing::info!(run_id = %l.run.id, hook = field, started = %row.id, workflow = %hook.workflow, "hook started");
            l.tr.log(HistoryKind::HandlerStarted, json!({"run_id": row.id, "workflow": hook.workflow, "hook": field}));
            Ok(loaded)
        }
        Err(EngineError::Rejected(why)) => {
            tracing::warn!(run_id = %l.run.id, hook = field, workflow = %hook.workflow, error = %why, "hook not started");
            let reason = why.to_string();
            let noted = json!({"run_id": null, "workflow": hook.workflow, "hook": field, "error": reason});
            l.tr.log(HistoryKind::HandlerStarted, noted);
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
            let hook = l.wf.hooks[0].clone();
            let input = hook_input(&l, &hook, Bounds::DEFAULT).await.unwrap();
            let a = &input["failed_run"]["nodes"]["a"];
            assert_eq!(a["state"], "COMPLETED", "{max_read}: {input}");
            assert_eq!(a.get("output"), shown.then_some(&text), "{max_read}: {input}");
            assert!(input["failed_run"]["nodes"]["b"]["error"].to_string().contains("boom"), "{input}");

            let l = failed(max_read, template.clone()).await;
            let hook = l.wf.hooks[0].clone();
            let input = hook_input(&l, &hook, Bounds::DEFAULT).await.unwrap();
            let seen = if shown { text.clone() } else { Value::Null };
            assert_eq!(input, json!({"seen": seen, "in": text}), "{max_read}");
        }
    }
}
