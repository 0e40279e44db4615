//! Creating a run: its admission under its workflow's concurrency limit, the
//! insert, and its first transition, all in the caller's transaction.

use std::sync::Arc;

use chrono::Utc;
use composer_core::definition::{StartKeyError, StartKeys, Workflow};
use composer_core::expr::Sandbox;
use composer_core::machine::{Event, RunStatus};
use composer_store::definitions::DefinitionRow;
use composer_store::runs::{self, NewRun, Parent, RunRow};
use serde_json::Value;
use uuid::Uuid;

use super::effects;
use super::error::{Rejection, Result};
use super::evaluator::{self, Subject};
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

impl<'a> NewRunOf<'a> {
    /// A top-level run of `def` with `input` and nothing else: no key,
    /// parent, trigger, tags or priority of its own.
    pub fn of(def: &'a DefinitionRow, input: &'a Value) -> Self {
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
}

/// What the engine holds every run to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// `COMPOSER_MAX_PAYLOAD`, for the values the state machine computes.
    pub max_payload: usize,
    /// The fan-out budget of a run tree (`COMPOSER_MAX_TREE_RUNS`,
    /// `COMPOSER_MAX_TREE_ITEMS`).
    pub tree: TreeBudget,
    /// A step's result loads its whole run up to this many nodes in its
    /// definition, past it only what it needs (`COMPOSER_WHOLE_RUN_NODES`).
    pub whole_run_nodes: i32,
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

impl Bounds {
    pub const DEFAULT: Bounds = Bounds {
        max_payload: composer_core::storable::DEFAULT_MAX_PAYLOAD,
        tree: TreeBudget::DEFAULT,
        whole_run_nodes: 16,
    };

    /// What one expression's scope may hold of a run's values
    /// (`Run::max_read`): `SCOPE_MAX_BYTES`, or more where the largest
    /// value a run may hold is set larger (it and some room).
    pub fn max_read(&self) -> usize {
        composer_core::machine::SCOPE_MAX_BYTES.max(self.max_payload.saturating_add(64 << 20))
    }
}

/// MAP items a run of the tree of `root` may still create.
pub async fn items_left<S: RunStore>(store: &S, root: Uuid, bounds: Bounds) -> Result<u64> {
    let used = store.tree_items_used(root).await?;
    Ok(u64::try_from(bounds.tree.items.saturating_sub(used)).unwrap_or(0))
}

/// Inserts a run — QUEUED when its concurrency limit says so, else RUNNING
/// with `RunStarted` applied (returned loaded, to write) — in the store's
/// transaction.
pub async fn create_run<S: RunStore>(
    store: &S,
    wf: Arc<Workflow>,
    how: NewRunOf<'_>,
    bounds: Bounds,
) -> Result<(RunRow, Option<Loaded>)> {
    let prepared = Prepared::new(wf, how).await?;
    let (key, status) = admit(store, &prepared.wf, &prepared.how.def.name, prepared.concurrency_key.as_deref()).await?;
    let row = store.insert_run(&prepared.row(key.as_deref(), status)).await?;
    if status == RunStatus::Queued {
        tracing::debug!(run_id = %row.id, workflow = %row.workflow_name, "run queued by its concurrency limit");
        return Ok((row, None));
    }
    let loaded = prepared.start(store, &row, bounds).await?;
    Ok((row, Some(loaded)))
}

/// [`create_run`] for many runs, in the order given: those of workflows
/// without a concurrency limit in one insert, the others one by one under
/// their keys' locks.
pub async fn create_runs<S: RunStore>(
    store: &S,
    starts: Vec<(Arc<Workflow>, NewRunOf<'_>)>,
    bounds: Bounds,
) -> Result<Vec<(RunRow, Option<Loaded>)>> {
    let mut created: Vec<Option<(RunRow, Option<Loaded>)>> = Vec::with_capacity(starts.len());
    let mut unlimited = Vec::new();
    for (wf, how) in starts {
        if wf.concurrency.is_some() {
            created.push(Some(create_run(store, wf, how, bounds).await?));
        } else {
            unlimited.push((created.len(), Prepared::new(wf, how).await?));
            created.push(None);
        }
    }
    let rows: Vec<NewRun<'_>> = unlimited.iter().map(|(_, p)| p.row(None, RunStatus::Running)).collect();
    let rows = store.insert_runs(&rows).await?;
    for ((at, prepared), row) in unlimited.iter().zip(rows) {
        let loaded = prepared.start(store, &row, bounds).await?;
        created[*at] = Some((row, Some(loaded)));
    }
    Ok(created.into_iter().flatten().collect())
}

/// A run to create with what its definition decides from its input (tags,
/// fairness and concurrency keys, id, deadline) worked out: everything but
/// its admission.
struct Prepared<'a> {
    wf: Arc<Workflow>,
    how: NewRunOf<'a>,
    id: Uuid,
    tags: Option<Value>,
    /// Its own definition's, which wins over its parent's.
    fairness_key: Option<String>,
    concurrency_key: Option<String>,
}

impl<'a> Prepared<'a> {
    async fn new(wf: Arc<Workflow>, how: NewRunOf<'a>) -> Result<Prepared<'a>> {
        if wf.input_schema.is_some() {
            check_input(&wf, how.def, how.input).await?;
        }
        let keys = start_keys(how.def.id, &wf, how.input, how.tags).await?;
        let StartKeys { tags, fairness_key, concurrency_key } = keys;
        Ok(Prepared { wf, how, id: Uuid::now_v7(), tags, fairness_key, concurrency_key })
    }

    /// Its row, admitted as `status` under `key`.
    fn row<'k>(&'k self, key: Option<&'k str>, status: RunStatus) -> NewRun<'k> {
        let (def, how) = (self.how.def, &self.how);
        NewRun {
            id: self.id,
            workflow_definition_id: def.id,
            workflow_name: &def.name,
            workflow_version: def.version,
            input: how.input,
            idempotency_key: how.idempotency_key,
            deadline: (status == RunStatus::Running).then(|| deadline_of(&self.wf)).flatten(),
            parent: how.parent,
            depth: how.depth,
            status,
            concurrency_key: key,
            trigger: how.trigger,
            root_run_id: how.root,
            handles_run_id: how.handles,
            abandoned: how.abandoned,
            tags: self.tags.as_ref(),
            traceparent: how.traceparent,
            priority: how.priority.unwrap_or(self.wf.priority),
            fairness_key: self.fairness_key.as_deref().or(how.fairness_key),
        }
    }

    /// Applies `RunStarted` to its inserted RUNNING `row`.
    async fn start<S: RunStore>(&self, store: &S, row: &RunRow, bounds: Bounds) -> Result<Loaded> {
        // The row goes back to the caller with its data; the run gets a copy.
        let mut run = runs::into_machine(&self.wf, &mut row.clone(), Vec::new())?;
        run.max_payload = bounds.max_payload;
        run.max_read = bounds.max_read();
        run.items_left = match self.how.root {
            Some(root) if self.wf.has_items() => items_left(store, root, bounds).await?,
            _ => bounds.tree.items as u64,
        };
        let tr = effects::apply(store, &self.wf, &mut run, Event::RunStarted).await?;
        Ok(Loaded::new(self.wf.clone(), run, tr, row))
    }
}

/// `input` against `wf`'s input schema, off the async runtime: a check may
/// take up to its budget of steps (`INPUT_SCHEMA_MAX_STEPS`), which no
/// other request should wait behind.
async fn check_input(wf: &Arc<Workflow>, def: &DefinitionRow, input: &Value) -> Result<()> {
    let (wf, input) = (wf.clone(), input.clone());
    let checked = tokio::task::spawn_blocking(move || wf.input_schema.as_ref().map(|s| s.check(&input)))
        .await
        .map_err(|e| Rejection::Evaluation(format!("the input_schema check stopped: {e}")))?;
    match checked {
        Some(Err(m)) => Err(Rejection::Input { workflow: def.name.clone(), why: m.to_string() }.into()),
        _ => Ok(()),
    }
}

/// What `wf`'s definition (`definition_id`) decides of a new run from its
/// input, evaluated through the evaluator's door (nothing is evaluated when
/// the definition has no such expression). An expression that fails is the
/// start's rejection, naming the field.
async fn start_keys(
    definition_id: Uuid,
    wf: &Arc<Workflow>,
    input: &Value,
    given: Option<&serde_json::Map<String, Value>>,
) -> Result<StartKeys> {
    let decided = if wf.start_templates().all(|t| t.is_literal()) {
        wf.start_keys(&Sandbox::simple_only(), input, given)
    } else {
        let simple = wf.start_templates().all(|t| t.is_simple());
        let input = (wf.clone(), input.clone(), given.cloned());
        evaluator::evaluate(Subject::Definition(definition_id), simple, input, |sb, (wf, input, given)| {
            wf.start_keys(sb, &input, given.as_ref())
        })
        .await
        .map_err(|lost| Rejection::Evaluation(lost.to_string()))?
    };
    decided.map_err(|e| {
        match e {
            StartKeyError::Tags(e) => Rejection::Tags(e),
            StartKeyError::FairnessKey(e) => Rejection::FairnessKey(e),
            StartKeyError::ConcurrencyKey(e) => Rejection::ConcurrencyKey(e),
        }
        .into()
    })
}

/// Whether a new run of `wf` under the concurrency key `key` (given when
/// it has a concurrency limit) may start or must wait QUEUED. Under the
/// key's lock (held to the commit) every coordinator sees the same count.
pub async fn admit<S: RunStore>(
    store: &S,
    wf: &Workflow,
    workflow: &str,
    key: Option<&str>,
) -> Result<(Option<String>, RunStatus)> {
    let Some(limit) = &wf.concurrency else { return Ok((None, RunStatus::Running)) };
    let key = key.unwrap_or_default().to_string();
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
    wf.timeout.and_then(|d| chrono::Duration::from_std(d).ok()).and_then(|d| crate::clock::now().checked_add_signed(d))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::effects::fake::FakeStore;
    use super::super::error::EngineError;
    use super::*;

    /// A payload limit small enough to reach in a test.
    const SMALL: Bounds = Bounds { max_payload: 1024, ..Bounds::DEFAULT };

    fn definition(spec: Value) -> (Arc<Workflow>, DefinitionRow) {
        let wf = Workflow::parse(&spec).unwrap();
        let row = DefinitionRow {
            id: Uuid::now_v7(),
            name: wf.spec.name.clone(),
            version: 1,
            spec,
            created_at: crate::clock::now(),
        };
        (Arc::new(wf), row)
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
        let (a, first) = create_run(&store, wf.clone(), NewRunOf::of(&def, &json!({"c": "x"})), SMALL).await.unwrap();
        assert_eq!(a.status, RunStatus::Running);
        assert_eq!(first.unwrap().tr.dispatch.len(), 1, "started: its first step dispatched");
        let (b, loaded) = create_run(&store, wf.clone(), NewRunOf::of(&def, &json!({"c": "x"})), SMALL).await.unwrap();
        assert_eq!((b.status, loaded.is_none()), (RunStatus::Queued, true));
        let (c, _) = create_run(&store, wf, NewRunOf::of(&def, &json!({"c": 7})), SMALL).await.unwrap();
        assert_eq!((c.status, c.concurrency_key.as_deref()), (RunStatus::Running, Some("7")));
        assert_eq!(store.locked_keys.lock().unwrap().len(), 3, "every admission under its key's lock");
    }

    #[tokio::test]
    async fn runs_created_together_keep_their_order_and_the_limited_ones_their_admission() {
        let (limited, limited_def) = definition(json!({"name": "per", "concurrency": {"key": "k", "max": 1},
            "nodes": [{"id": "a", "type": "HTTP", "config": {"url": "http://h"}}]}));
        let (free, free_def) =
            definition(json!({"name": "free", "nodes": [{"id": "a", "type": "HTTP", "config": {"url": "http://h"}}]}));
        let inputs: Vec<Value> = (0..4).map(|n| json!({"n": n})).collect();
        let store = FakeStore::default();
        let starts = vec![
            (free.clone(), NewRunOf::of(&free_def, &inputs[0])),
            (limited.clone(), NewRunOf::of(&limited_def, &inputs[1])),
            (free, NewRunOf::of(&free_def, &inputs[2])),
            (limited, NewRunOf::of(&limited_def, &inputs[3])),
        ];
        let created = create_runs(&store, starts, SMALL).await.unwrap();
        let seen: Vec<_> =
            created.iter().map(|(row, loaded)| (row.input.clone(), row.status, loaded.is_some())).collect();
        assert_eq!(
            seen,
            vec![
                (inputs[0].clone(), RunStatus::Running, true),
                (inputs[1].clone(), RunStatus::Running, true),
                (inputs[2].clone(), RunStatus::Running, true),
                (inputs[3].clone(), RunStatus::Queued, false),
            ]
        );
        assert_eq!(store.locked_keys.lock().unwrap().len(), 2, "only the limited runs take a key's lock");
    }

    #[tokio::test]
    async fn a_key_that_does_not_evaluate_is_a_typed_rejection_and_nothing_is_inserted() {
        let (wf, def) = definition(json!({"name": "per", "concurrency": {"key": "${ .input.c.d }", "max": 1},
            "nodes": [{"id": "a", "type": "HTTP", "config": {"url": "http://h"}}]}));
        let store = FakeStore::default();
        let e = create_run(&store, wf, NewRunOf::of(&def, &json!({"c": [1]})), SMALL).await.unwrap_err();
        assert!(matches!(e, EngineError::Rejected(Rejection::ConcurrencyKey(_))), "{e:?}");
        assert!(store.inserted.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_definition_timeout_gives_the_run_its_deadline() {
        let (wf, def) = definition(json!({"name": "t", "timeout": "1h",
            "nodes": [{"id": "a", "type": "HTTP", "config": {"url": "http://h"}}]}));
        let store = FakeStore::default();
        let (row, _) = create_run(&store, wf, NewRunOf::of(&def, &json!({})), SMALL).await.unwrap();
        let left = row.deadline.unwrap() - crate::clock::now();
        assert!(left > chrono::Duration::minutes(59) && left <= chrono::Duration::hours(1), "{left}");
    }
}
