//! Creating a run: its admission under its workflow's concurrency limit, the
//! insert, and its first transition, all in the caller's transaction.

use std::sync::Arc;

use chrono::Utc;
use composer_core::definition::Workflow;
use composer_core::machine::{Event, RunStatus};
use composer_store::definitions::DefinitionRow;
use composer_store::runs::{self, NewRun, Parent, RunRow};
use serde_json::Value;
use uuid::Uuid;

use super::effects;
use super::error::{Rejection, Result};
use super::loaded::Loaded;
use super::store::RunStore;

/// A run to create, besides its workflow.
pub struct NewRunOf<'a> {
    pub def: &'a DefinitionRow,
    pub input: &'a Value,
    pub idempotency_key: Option<&'a str>,
    pub parent: Option<Parent>,
    pub depth: i32,
    pub trigger: Option<&'a Value>,
    /// For a child: the root of the tree it joins.
    pub root: Option<Uuid>,
    /// For a failure handler: the run whose end started it.
    pub handles: Option<Uuid>,
    /// A child its parent never cancels (`on_parent_close: "abandon"`).
    pub abandoned: bool,
    /// Tags the start gives, besides the definition's.
    pub tags: Option<&'a serde_json::Map<String, Value>>,
    /// The W3C `traceparent` it continues.
    pub traceparent: Option<&'a str>,
    /// Its priority instead of its definition's: the start's, or its parent's.
    pub priority: Option<u8>,
    /// Its parent's fairness key, unless its own definition names one.
    pub fairness_key: Option<&'a str>,
}

/// What the engine holds every run to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `COMPOSER_MAX_PAYLOAD`, for the values the state machine computes.
    pub max_payload: usize,
    /// The fan-out budget of a run tree (`COMPOSER_MAX_TREE_RUNS`,
    /// `COMPOSER_MAX_TREE_ITEMS`).
    pub tree: TreeBudget,
}

/// Most runs and MAP items one run tree (a root run and every child run
/// under it, at any depth) may create.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeBudget {
    pub runs: i64,
    pub items: i64,
}

impl TreeBudget {
    pub const DEFAULT: TreeBudget = TreeBudget { runs: 100_000, items: 1_000_000 };
}

impl Limits {
    pub const DEFAULT: Limits =
        Limits { max_payload: composer_core::storable::DEFAULT_MAX_PAYLOAD, tree: TreeBudget::DEFAULT };
}

/// MAP items a run of the tree of `root` may still create.
pub async fn items_left<S: RunStore>(store: &S, root: Uuid, limits: Limits) -> Result<u64> {
    let used = store.tree_items_used(root).await?;
    Ok(u64::try_from(limits.tree.items.saturating_sub(used)).unwrap_or(0))
}

/// Inserts a run — QUEUED when its concurrency limit says so, else RUNNING
/// with `RunStarted` applied (returned loaded, to write) — in the store's
/// transaction.
pub async fn create_run<S: RunStore>(
    store: &S,
    wf: Arc<Workflow>,
    how: NewRunOf<'_>,
    limits: Limits,
) -> Result<(RunRow, Option<Loaded>)> {
    let def = how.def;
    let tags = wf.tags_of(how.input, how.tags).map_err(Rejection::Tags)?;
    let fairness_key = wf.fairness_key_of(how.input).map_err(Rejection::FairnessKey)?;
    let fairness_key = fairness_key.as_deref().or(how.fairness_key);
    let (key, status) = admit(store, &wf, &def.name, how.input).await?;
    let deadline = (status == RunStatus::Running).then(|| deadline_of(&wf)).flatten();
    let new = NewRun {
        id: Uuid::now_v7(),
        workflow_definition_id: def.id,
        workflow_name: &def.name,
        workflow_version: def.version,
        input: how.input,
        idempotency_key: how.idempotency_key,
        deadline,
        parent: how.parent,
        depth: how.depth,
        status,
        concurrency_key: key.as_deref(),
        trigger: how.trigger,
        root_run_id: how.root,
        handles_run_id: how.handles,
        abandoned: how.abandoned,
        tags: tags.as_ref(),
        traceparent: how.traceparent,
        priority: how.priority.unwrap_or(wf.priority),
        fairness_key,
    };
    let row = store.insert_run(&new).await?;
    if status == RunStatus::Queued {
        tracing::debug!(run_id = %row.id, workflow = %def.name, "run queued by its concurrency limit");
        return Ok((row, None));
    }
    // The row goes back to the caller with its data; the run gets a copy.
    let mut run = runs::into_machine(&wf, &mut row.clone(), Vec::new())?;
    run.max_payload = limits.max_payload;
    run.items_left = match how.root {
        Some(root) if wf.has_items() => items_left(store, root, limits).await?,
        _ => limits.tree.items as u64,
    };
    let tr = effects::apply(store, &wf, &mut run, Event::RunStarted).await?;
    let loaded = Loaded::new(wf, run, tr, &row);
    Ok((row, Some(loaded)))
}

/// Whether a new run of `wf` may start or must wait QUEUED, and its
/// concurrency key. Under the key's lock (held to the commit) every
/// coordinator sees the same count.
pub async fn admit<S: RunStore>(
    store: &S,
    wf: &Workflow,
    workflow: &str,
    input: &Value,
) -> Result<(Option<String>, RunStatus)> {
    let Some(limit) = &wf.concurrency else { return Ok((None, RunStatus::Running)) };
    let key = limit.key_of(input).map_err(Rejection::ConcurrencyKey)?;
    store.lock_concurrency_key(workflow, &key).await?;
    let (open, queued) = store.concurrency_usage(workflow, &key).await?;
    Ok((Some(key), admission(limit.max, open, queued)))
}

/// A new run waits when runs wait before it (the queue is first come,
/// first served) or the key's open runs are at the limit.
pub fn admission(max: u32, open: i64, queued: bool) -> RunStatus {
    if queued || open >= max as i64 {
        RunStatus::Queued
    } else {
        RunStatus::Running
    }
}

/// When a run of `wf` starting now times out.
pub fn deadline_of(wf: &Workflow) -> Option<chrono::DateTime<Utc>> {
    wf.timeout.and_then(|d| chrono::Duration::from_std(d).ok()).and_then(|d| Utc::now().checked_add_signed(d))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::effects::fake::FakeStore;
    use super::super::error::EngineError;
    use super::*;

    /// A payload limit small enough to reach in a test.
    const SMALL: Limits = Limits { max_payload: 1024, ..Limits::DEFAULT };

    fn definition(spec: Value) -> (Arc<Workflow>, DefinitionRow) {
        let wf = Workflow::parse(&spec).unwrap();
        let row =
            DefinitionRow { id: Uuid::now_v7(), name: wf.spec.name.clone(), version: 1, spec, created_at: Utc::now() };
        (Arc::new(wf), row)
    }

    fn how<'a>(def: &'a DefinitionRow, input: &'a Value) -> NewRunOf<'a> {
        NewRunOf {
            def,
            input,
            idempotency_key: None,
            parent: None,
            depth: 0,
            trigger: None,
            root: None,
            handles: None,
            abandoned: false,
            tags: None,
            traceparent: None,
            priority: None,
            fairness_key: None,
        }
    }

    #[test]
    fn a_run_waits_behind_waiting_runs_and_at_the_limit() {
        assert_eq!(admission(2, 1, false), RunStatus::Running);
        assert_eq!(admission(2, 2, false), RunStatus::Queued);
        assert_eq!(admission(2, 0, true), RunStatus::Queued, "first come, first served");
    }

    #[tokio::test]
    async fn runs_over_the_limit_of_their_key_are_queued_and_other_keys_are_not() {
        let (wf, def) = definition(json!({"name": "per", "concurrency": {"key": "${ .input.c }", "max": 1},
            "nodes": [{"id": "a", "type": "HTTP", "config": {"url": "http://h"}}]}));
        let store = FakeStore::default();
        let (a, first) = create_run(&store, wf.clone(), how(&def, &json!({"c": "x"})), SMALL).await.unwrap();
        assert_eq!(a.status, RunStatus::Running);
        assert_eq!(first.unwrap().tr.dispatch.len(), 1, "started: its first step dispatched");
        let (b, loaded) = create_run(&store, wf.clone(), how(&def, &json!({"c": "x"})), SMALL).await.unwrap();
        assert_eq!((b.status, loaded.is_none()), (RunStatus::Queued, true));
        let (c, _) = create_run(&store, wf, how(&def, &json!({"c": 7})), SMALL).await.unwrap();
        assert_eq!((c.status, c.concurrency_key.as_deref()), (RunStatus::Running, Some("7")));
        assert_eq!(store.locked_keys.lock().unwrap().len(), 3, "every admission under its key's lock");
    }

    #[tokio::test]
    async fn a_key_that_does_not_evaluate_is_a_typed_rejection_and_nothing_is_inserted() {
        let (wf, def) = definition(json!({"name": "per", "concurrency": {"key": "${ .input.c.d }", "max": 1},
            "nodes": [{"id": "a", "type": "HTTP", "config": {"url": "http://h"}}]}));
        let store = FakeStore::default();
        let e = create_run(&store, wf, how(&def, &json!({"c": [1]})), SMALL).await.unwrap_err();
        assert!(matches!(e, EngineError::Rejected(Rejection::ConcurrencyKey(_))), "{e:?}");
        assert!(store.inserted.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_definition_timeout_gives_the_run_its_deadline() {
        let (wf, def) = definition(json!({"name": "t", "timeout": "1h",
            "nodes": [{"id": "a", "type": "HTTP", "config": {"url": "http://h"}}]}));
        let store = FakeStore::default();
        let (row, _) = create_run(&store, wf, how(&def, &json!({})), SMALL).await.unwrap();
        let left = row.deadline.unwrap() - Utc::now();
        assert!(left > chrono::Duration::minutes(59) && left <= chrono::Duration::hours(1), "{left}");
    }
}
