//! The effect runner: applies an event to a run, then does what the state
//! machine asked of storage within the same transaction (load MAP items it
//! needs, take an event that came before its waiter) and applies each
//! result, until it asks nothing more.

use std::collections::HashMap;
use std::sync::Arc;

use composer_core::definition::Workflow;
use composer_core::machine::{self, Effect, Event, Need, Run, Transition};
use composer_store::runs::Items;
use serde_json::Value;
use uuid::Uuid;

use super::error::{EngineError, Result};
use super::evaluator::Subject;
use super::store::RunStore;

/// Applies `event` and every effect it leads to; the merged transition.
pub async fn apply<S: RunStore>(store: &S, wf: &Arc<Workflow>, run: &mut Run, event: Event) -> Result<Transition> {
    let mut tr = apply_loading(store, wf, run, event).await?;
    loop {
        let effects = std::mem::take(&mut tr.effects);
        if effects.is_empty() {
            return Ok(tr);
        }
        for effect in effects {
            match effect {
                Effect::LoadItems(Need::Sources { map, from, count }) => {
                    let items = store.load_sources(run.id, map, from, count).await?;
                    let loaded = Event::SourcesLoaded { task_id: map, from, items };
                    tr.merge(apply_loading(store, wf, run, loaded).await?);
                }
                Effect::LoadItems(Need::Collect { map, share }) => {
                    let output = collect(store, wf, run, map, share).await?;
                    run.holds_gathered_output = true;
                    let collected = Event::ItemsCollected { task_id: map, output };
                    tr.merge(apply_loading(store, wf, run, collected).await?);
                }
                Effect::LoadItems(need) => {
                    let (map, which) = match need {
                        Need::Queued { map, count } => (map, Items::Queued { count, from: queued_from(run, map) }),
                        Need::All { map } => (map, Items::All),
                        Need::Sources { .. } | Need::Collect { .. } => unreachable!("matched above"),
                    };
                    if load_items(store, wf, run, Some(map), which).await? == 0 {
                        return Err(composer_store::Error::Corrupt(format!(
                            "MAP task {map} of run {} counts items that are not stored",
                            run.id
                        ))
                        .into());
                    }
                    tr.merge(apply_loading(store, wf, run, Event::ItemsLoaded { task_id: map }).await?);
                }
                Effect::TakeBufferedEvent { task_id, event, key } => {
                    if let Some(payload) = store.take_buffered_event(&event, &key, task_id).await? {
                        tr.merge(apply_loading(store, wf, run, Event::EventReceived { task_id, payload }).await?);
                    }
                }
            }
        }
    }
}

/// [`apply_loading_nodes`] on a run that left values unread
/// ([`Run::unread`]): when the machine says it needed one, its transition
/// is dropped, the run put back as it was, every value read, and the event
/// applied again (once: the run then holds no reference).
async fn apply_loading<S: RunStore>(store: &S, wf: &Arc<Workflow>, run: &mut Run, event: Event) -> Result<Transition> {
    if !run.unread {
        return apply_loading_nodes(store, wf, run, event).await;
    }
    if run.holds_gathered_output {
        // Not copied (it may be large): its values are read first.
        store.read_unread(run).await?;
        return apply_loading_nodes(store, wf, run, event).await;
    }
    let before = run.clone();
    let tr = apply_loading_nodes(store, wf, run, event.clone()).await?;
    if !tr.unread {
        return Ok(tr);
    }
    *run = before;
    store.read_unread(run).await?;
    crate::metrics::inc(composer_metrics::UNREAD_LOADS, &[], 1);
    let tr = apply_loading_nodes(store, wf, run, event).await?;
    match tr.unread {
        true => Err(composer_store::Error::Corrupt(format!("run {}: a value read is still unread", run.id)).into()),
        false => Ok(tr),
    }
}

/// [`apply_contained`] on a run loaded in part ([`Run::known`]): while the
/// machine says it misses nodes' tasks, its transition is dropped, the run
/// put back as it was, those tasks loaded, and the event applied again. A
/// step of a chain needs one such round (the next node, which has no task
/// yet). A second round loads every node still missing, so an event that
/// runs on through a cascade (a chain of skips or TRANSFORMs) is applied
/// at most three times, not once per node.
async fn apply_loading_nodes<S: RunStore>(
    store: &S,
    wf: &Arc<Workflow>,
    run: &mut Run,
    event: Event,
) -> Result<Transition> {
    if run.known.is_none() {
        return apply_contained(wf, run, event).await;
    }
    if run.holds_gathered_output {
        // A MAP's gathered output, which may be large: applied once, the run
        // not copied for a second round, with every node loaded.
        load_every_node(store, wf, run).await?;
        let tr = apply_contained(wf, run, event).await?;
        if !tr.missing.is_empty() {
            return Err(corrupt_missing(run.id));
        }
        return Ok(tr);
    }
    let mut rounds = 0;
    loop {
        let before = run.clone();
        let tr = apply_contained(wf, run, event.clone()).await?;
        if tr.missing.is_empty() {
            return Ok(tr);
        }
        *run = before;
        let known = run.known.get_or_insert_with(Vec::new);
        let missing: Vec<usize> = match rounds {
            0 => tr.missing,
            _ => (0..known.len()).filter(|&n| !known[n]).collect(),
        };
        rounds += 1;
        if missing.is_empty() {
            return Err(corrupt_missing(run.id));
        }
        let mut nodes = Vec::with_capacity(missing.len());
        for n in missing {
            match known.get_mut(n) {
                Some(k) if !*k => *k = true,
                _ => {
                    return Err(composer_store::Error::Corrupt(format!(
                        "run {}: the state machine asked again for node {n}, which is loaded",
                        run.id
                    ))
                    .into())
                }
            }
            nodes.push(wf.nodes[n].id.as_str());
        }
        let held: Vec<Uuid> = run.tasks.iter().map(|t| t.id).collect();
        let more = store.load_nodes(wf, run.id, &nodes, &held).await?;
        crate::metrics::inc(composer_metrics::PARTIAL_LOADS, &[], 1);
        run.tasks.extend(more);
    }
}

fn corrupt_missing(run: Uuid) -> EngineError {
    composer_store::Error::Corrupt(format!("run {run}: the state machine misses tasks of nodes that are all loaded"))
        .into()
}

/// Loads the tasks of every node of a run loaded in part that it does not
/// hold yet: the run is then whole but for its MAPs' items.
async fn load_every_node<S: RunStore>(store: &S, wf: &Workflow, run: &mut Run) -> Result<()> {
    let Some(known) = run.known.as_mut() else { return Ok(()) };
    let nodes: Vec<&str> = (0..known.len()).filter(|&n| !known[n]).map(|n| wf.nodes[n].id.as_str()).collect();
    known.iter_mut().for_each(|k| *k = true);
    if nodes.is_empty() {
        return Ok(());
    }
    let held: Vec<Uuid> = run.tasks.iter().map(|t| t.id).collect();
    let more = store.load_nodes(wf, run.id, &nodes, &held).await?;
    crate::metrics::inc(composer_metrics::PARTIAL_LOADS, &[], 1);
    run.tasks.extend(more);
    Ok(())
}

/// Where a MAP's QUEUED items begin, unless some were sent back to the
/// queue: items are created in index order and start lowest first, so the
/// ones not started yet are the last created.
fn queued_from(run: &Run, map: Uuid) -> i32 {
    let Some(p) = run.tasks.iter().find(|t| t.id == map).and_then(|t| t.progress) else { return 0 };
    let waiting = p.queued.saturating_sub(p.total - p.created());
    i32::try_from(p.created().saturating_sub(waiting)).unwrap_or(0)
}

/// Items a page of a MAP's output is read in.
const COLLECT_PAGE: i64 = 1_000;

/// The output of MAP `map` (`collect: "all"`), its items' entries in index
/// order ([`machine::collected_entry`]), read a page at a time: only the
/// output and a page are held, not every item whole. An item the run holds
/// is taken from the run: its row may be older, or not written yet.
async fn collect<S: RunStore>(store: &S, wf: &Workflow, run: &Run, map: Uuid, share: usize) -> Result<Value> {
    let corrupt = |what: String| EngineError::from(composer_store::Error::Corrupt(format!("run {}: {what}", run.id)));
    let Some(total) = run.task(map).and_then(|t| t.progress).map(|p| p.total) else {
        return Err(corrupt(format!("MAP task {map} to collect is not held")));
    };
    let held: HashMap<u32, &machine::Task> =
        run.tasks.iter().filter_map(|t| t.item.filter(|i| i.map == map).map(|i| (i.index, t))).collect();
    let entry = |t: &machine::Task| machine::collected_entry(t.state, t.output.clone(), t.error.as_deref(), share);
    let mut out = Vec::with_capacity(total as usize);
    let mut after = -1;
    while out.len() < total as usize {
        let page = store.item_page(wf, run.id, map, after, COLLECT_PAGE).await?;
        let Some(last) = page.last().and_then(|t| t.item) else { break };
        for t in page {
            let index = t.item.map_or(u32::MAX, |i| i.index);
            // Items only the run holds (created by this event) come before.
            while let Some(own) = held.get(&(out.len() as u32)).filter(|_| (out.len() as u32) < index) {
                out.push(entry(own));
            }
            if index != out.len() as u32 {
                return Err(corrupt(format!("MAP task {map} lacks item {}", out.len())));
            }
            out.push(match held.get(&index) {
                Some(own) => entry(own),
                None => machine::collected_entry(t.state, t.output, t.error.as_deref(), share),
            });
        }
        after = last.index as i32;
    }
    while let Some(own) = held.get(&(out.len() as u32)) {
        out.push(entry(own));
    }
    if out.len() != total as usize {
        return Err(corrupt(format!("MAP task {map} counts {total} items, {} are stored", out.len())));
    }
    Ok(Value::Array(out))
}

/// Adds the items of a MAP (or of the run, for held ones) that `run` does
/// not hold yet; returns how many.
pub async fn load_items<S: RunStore>(
    store: &S,
    wf: &Workflow,
    run: &mut Run,
    map: Option<Uuid>,
    which: Items,
) -> Result<usize> {
    let held: Vec<Uuid> =
        run.tasks.iter().filter(|t| t.item.is_some_and(|i| map.is_none_or(|m| i.map == m))).map(|t| t.id).collect();
    let items = store.load_items(wf, run.id, map, which, &held).await?;
    let n = items.len();
    run.tasks.extend(items);
    Ok(n)
}

/// Applies the pure state machine through the evaluator's door
/// ([`super::evaluator::evaluate`]), containing a panic to this event (the
/// run's in-memory state is then discarded with the failed transaction): on
/// the evaluation pool unless every expression of the workflow is simple
/// (`Workflow::simple`).
pub async fn apply_contained(wf: &Arc<Workflow>, run: &mut Run, event: Event) -> Result<Transition> {
    let name = event.name();
    let run_id = run.id;
    // An evaluation tried inline keeps a copy of what it is given, to try
    // again on the pool: not of a run that holds large values.
    let inline = wf.simple && !run.holds_gathered_output;
    let owned = std::mem::replace(run, Run::new(run_id, serde_json::Value::Null));
    let input = (wf.clone(), owned, event);
    // A panic inside `apply` loses the run's state with the transaction, as
    // it should.
    let applied = super::evaluator::evaluate(Subject::Run(run_id), inline, input, |sb, (wf, mut run, event)| {
        let tr = machine::apply(sb, &wf, &mut run, event, crate::clock::now(), &mut Uuid::now_v7);
        (run, tr)
    })
    .await;
    let (owned, tr) = applied.map_err(|lost| EngineError::Fault { run_id, event: name, message: lost.to_string() })?;
    *run = owned;
    Ok(tr)
}

#[cfg(test)]
pub(crate) mod fake {
    //! A store in memory for the engine's unit tests.

    use std::collections::HashMap;
    use std::sync::Mutex;

    use composer_core::definition::Workflow;
    use composer_core::machine::{self, RunStatus, TaskState};
    use composer_store::definitions::DefinitionRow;
    use composer_store::runs::{Items, NewRun, RunRow};
    use serde_json::Value;
    use uuid::Uuid;

    use crate::engine::store::RunStore;

    #[derive(Default)]
    pub struct FakeStore {
        /// MAP items not held by the run in memory, by their MAP.
        pub items: Mutex<Vec<machine::Task>>,
        /// Events kept for a waiter: `(name, key)` → payloads, oldest first.
        pub buffered: Mutex<HashMap<(String, String), Vec<Value>>>,
        /// Open and queued runs per `(workflow, key)`.
        pub usage: Mutex<HashMap<(String, String), (i64, bool)>>,
        pub locked_keys: Mutex<Vec<(String, String)>>,
        pub inserted: Mutex<Vec<RunRow>>,
        pub definitions: Vec<DefinitionRow>,
        /// Node tasks not held by a run loaded in part, and the node ids
        /// each read of them asked for.
        pub node_tasks: Mutex<Vec<machine::Task>>,
        pub node_reads: Mutex<Vec<Vec<String>>>,
    }

    impl RunStore for FakeStore {
        async fn read_unread(&self, run: &mut machine::Run) -> Result<(), composer_store::Error> {
            // Nothing is offloaded here.
            run.unread = false;
            Ok(())
        }

        async fn load_nodes(
            &self,
            wf: &Workflow,
            _run_id: Uuid,
            nodes: &[&str],
            held: &[Uuid],
        ) -> Result<Vec<machine::Task>, composer_store::Error> {
            self.node_reads.lock().unwrap().push(nodes.iter().map(|n| n.to_string()).collect());
            let tasks = self.node_tasks.lock().unwrap();
            let of = |t: &&machine::Task| nodes.contains(&wf.nodes[t.node].id.as_str()) && !held.contains(&t.id);
            Ok(tasks.iter().filter(of).cloned().collect())
        }

        async fn load_items(
            &self,
            _wf: &Workflow,
            _run_id: Uuid,
            map: Option<Uuid>,
            which: Items,
            held: &[Uuid],
        ) -> Result<Vec<machine::Task>, composer_store::Error> {
            let items = self.items.lock().unwrap();
            let mut of_map: Vec<machine::Task> = items
                .iter()
                .filter(|t| t.item.is_some_and(|i| map.is_none_or(|m| i.map == m)) && !held.contains(&t.id))
                .cloned()
                .collect();
            of_map.sort_by_key(|t| t.item.map(|i| i.index));
            Ok(match which {
                Items::Queued { count, .. } => {
                    of_map.into_iter().filter(|t| t.state == TaskState::Queued).take(count as usize).collect()
                }
                Items::All => of_map,
                Items::Held => {
                    of_map.into_iter().filter(|t| t.state == TaskState::Waiting && t.wake_at.is_none()).collect()
                }
            })
        }

        async fn item_page(
            &self,
            _wf: &Workflow,
            _run_id: Uuid,
            map: Uuid,
            after: i32,
            limit: i64,
        ) -> Result<Vec<machine::Task>, composer_store::Error> {
            let items = self.items.lock().unwrap();
            let mut page: Vec<machine::Task> = items
                .iter()
                .filter(|t| t.item.is_some_and(|i| i.map == map && i.index as i32 > after))
                .cloned()
                .collect();
            page.sort_by_key(|t| t.item.map(|i| i.index));
            page.truncate(limit as usize);
            Ok(page)
        }

        async fn take_buffered_event(
            &self,
            name: &str,
            key: &str,
            _task_id: Uuid,
        ) -> Result<Option<Value>, composer_store::Error> {
            let mut buffered = self.buffered.lock().unwrap();
            let waiting = buffered.get_mut(&(name.to_string(), key.to_string()));
            Ok(waiting.and_then(|events| (!events.is_empty()).then(|| events.remove(0))))
        }

        async fn tree_items_used(&self, _root: Uuid) -> Result<i64, composer_store::Error> {
            Ok(0)
        }

        async fn lock_concurrency_key(&self, workflow: &str, key: &str) -> Result<(), composer_store::Error> {
            self.locked_keys.lock().unwrap().push((workflow.into(), key.into()));
            Ok(())
        }

        async fn concurrency_usage(&self, workflow: &str, key: &str) -> Result<(i64, bool), composer_store::Error> {
            Ok(self.usage.lock().unwrap().get(&(workflow.into(), key.into())).copied().unwrap_or((0, false)))
        }

        async fn insert_runs(&self, runs: &[NewRun<'_>]) -> Result<Vec<RunRow>, composer_store::Error> {
            let mut rows = Vec::with_capacity(runs.len());
            for run in runs {
                rows.push(self.insert_run(run).await?);
            }
            Ok(rows)
        }

        async fn insert_run(&self, run: &NewRun<'_>) -> Result<RunRow, composer_store::Error> {
            let now = crate::clock::now();
            let row = RunRow {
                id: run.id,
                workflow_definition_id: run.workflow_definition_id,
                workflow_name: run.workflow_name.to_string(),
                workflow_version: run.workflow_version,
                status: run.status,
                input: run.input.clone(),
                output: None,
                error: None,
                idempotency_key: run.idempotency_key.map(str::to_string),
                created_at: now,
                updated_at: now,
                finished_at: None,
                deadline: run.deadline,
                parent: run.parent,
                depth: run.depth,
                concurrency_key: run.concurrency_key.map(str::to_string),
                trigger: run.trigger.cloned(),
                root_run_id: run.root_run_id,
                handles_run_id: run.handles_run_id,
                tags: run.tags.cloned(),
                traceparent: run.traceparent.map(str::to_string),
                priority: run.priority,
                fairness_key: run.fairness_key.map(str::to_string),
            };
            if run.status == RunStatus::Running || run.status == RunStatus::Queued {
                let key = (run.workflow_name.to_string(), run.concurrency_key.unwrap_or_default().to_string());
                let mut usage = self.usage.lock().unwrap();
                let entry = usage.entry(key).or_insert((0, false));
                match run.status {
                    RunStatus::Running => entry.0 += 1,
                    _ => entry.1 = true,
                }
            }
            self.inserted.lock().unwrap().push(row.clone());
            Ok(row)
        }

        async fn definition(
            &self,
            name: &str,
            version: Option<i32>,
        ) -> Result<Option<DefinitionRow>, composer_store::Error> {
            Ok(self
                .definitions
                .iter()
                .filter(|d| d.name == name && version.is_none_or(|v| d.version == v))
                .max_by_key(|d| d.version)
                .cloned())
        }

        async fn load_sources(
            &self,
            _run_id: Uuid,
            _map: Uuid,
            _from: u32,
            _count: u32,
        ) -> Result<Vec<Value>, composer_store::Error> {
            Err(composer_store::Error::Corrupt("the fake store keeps no MAP lists".into()))
        }
    }
}

#[cfg(test)]
mod tests {
    use composer_core::machine::{Event, Run, RunStatus, TaskState};
    use serde_json::json;

    use super::fake::FakeStore;
    use super::*;

    fn workflow(spec: serde_json::Value) -> Arc<Workflow> {
        Arc::new(Workflow::parse(&spec).unwrap())
    }

    #[tokio::test]
    async fn an_event_that_came_before_its_waiter_completes_it_in_the_same_transaction() {
        let wf = workflow(json!({"name": "w", "nodes": [
            {"id": "wait", "type": "WAIT_FOR_EVENT", "config": {"event": "paid", "key": "${ .input.order }"}},
            {"id": "done", "type": "TRANSFORM", "config": {"output": "${ .nodes.wait.output.amount }"}}],
            "edges": [{"from": "wait", "to": "done"}]}));
        let store = FakeStore::default();
        store.buffered.lock().unwrap().insert(("paid".into(), "o-7".into()), vec![json!({"amount": 12})]);
        let mut run = Run::new(Uuid::now_v7(), json!({"order": "o-7"}));
        let tr = apply(&store, &wf, &mut run, Event::RunStarted).await.unwrap();
        assert_eq!(run.status, RunStatus::Succeeded, "{tr:?}");
        assert_eq!(run.output, Some(json!({"done": 12})));
        assert!(store.buffered.lock().unwrap()[&("paid".into(), "o-7".into())].is_empty(), "the event was taken");
    }

    #[tokio::test]
    async fn without_a_buffered_event_the_task_waits() {
        let wf = workflow(json!({"name": "w", "nodes": [
            {"id": "wait", "type": "WAIT_FOR_EVENT", "config": {"event": "paid", "key": "k"}}]}));
        let store = FakeStore::default();
        let mut run = Run::new(Uuid::now_v7(), json!({}));
        let tr = apply(&store, &wf, &mut run, Event::RunStarted).await.unwrap();
        assert_eq!(run.tasks[0].state, TaskState::Waiting);
        assert!(tr.effects.is_empty(), "every effect was run");
    }

    /// A run loaded in part that runs on through a chain of 40 TRANSFORMs
    /// after its step reads the missing nodes twice, not 40 times: first
    /// what the machine named, then every node still missing.
    #[tokio::test]
    async fn a_cascade_in_a_run_loaded_in_part_reads_the_missing_nodes_at_most_twice() {
        let mut nodes = vec![json!({"id": "step", "type": "HTTP", "config": {"url": "http://h/step"}})];
        let mut edges = Vec::new();
        for i in 0..40 {
            nodes.push(json!({"id": format!("t{i}"), "type": "TRANSFORM", "config": {"output": i}}));
            let from = if i == 0 { "step".to_string() } else { format!("t{}", i - 1) };
            edges.push(json!({"from": from, "to": format!("t{i}")}));
        }
        let wf = workflow(json!({"name": "cascade", "nodes": nodes, "edges": edges}));
        let store = FakeStore::default();
        let mut run = Run::new(Uuid::now_v7(), json!({}));
        apply(&store, &wf, &mut run, Event::RunStarted).await.unwrap();
        let step = run.tasks[0].clone();
        // Read in part: the step is open; nothing else exists yet.
        run.known = Some(vec![false; wf.nodes.len()]);
        run.known.as_mut().unwrap()[step.node] = true;
        let done = Event::TaskCompleted { task_id: step.id, attempt: 1, output: json!({}) };
        apply(&store, &wf, &mut run, done).await.unwrap();
        assert_eq!(run.status, RunStatus::Succeeded);
        assert_eq!(run.output, Some(json!({"t39": 39})));
        let reads = store.node_reads.lock().unwrap();
        assert_eq!(reads.len(), 2, "{reads:?}");
        assert_eq!(reads[0], vec!["t0".to_string()]);
        assert_eq!(reads[1].len(), 39, "every node still missing at once");
    }

    /// A MAP whose items the run does not hold (as after a reload) asks for
    /// the next queued ones and then for all of them; the runner loads each.
    #[tokio::test]
    async fn a_map_gets_the_items_it_asks_for_and_gathers_its_output() {
        let wf = workflow(json!({"name": "m", "nodes": [{"id": "each", "type": "MAP", "config": {
            "items": [1, 2, 3], "max_concurrency": 1,
            "node": {"type": "HTTP", "config": {"url": "http://h/${ .item }"}}}}]}));
        let store = FakeStore::default();
        let mut run = Run::new(Uuid::now_v7(), json!({}));
        apply(&store, &wf, &mut run, Event::RunStarted).await.unwrap();
        // Storage keeps the items; memory keeps the MAP's own task only.
        let map = run.tasks.iter().find(|t| t.progress.is_some()).unwrap().id;
        let mut items: Vec<_> = run.tasks.iter().filter(|t| t.item.is_some()).cloned().collect();
        run.tasks.retain(|t| t.item.is_none());
        for round in 0..3 {
            let running = items.iter().position(|t| t.state == TaskState::Pending).expect("one item runs");
            let item = items.remove(running);
            *store.items.lock().unwrap() = items.clone();
            run.tasks.push(item.clone());
            let done = Event::TaskCompleted { task_id: item.id, attempt: 1, output: json!(round) };
            apply(&store, &wf, &mut run, done).await.unwrap();
            // Keep what changed in storage, and memory to the MAP again.
            items = run.tasks.iter().filter(|t| t.item.is_some()).cloned().chain(items.clone()).collect();
            items.sort_by_key(|t| t.item.map(|i| i.index));
            items.dedup_by_key(|t| t.id);
            run.tasks.retain(|t| t.item.is_none());
        }
        assert_eq!(run.status, RunStatus::Succeeded);
        assert_eq!(run.output, Some(json!({"each": [0, 1, 2]})));
        assert!(run.tasks.iter().any(|t| t.id == map));
    }

    #[tokio::test]
    async fn items_a_map_counts_but_storage_lacks_are_an_error_not_a_loop() {
        let wf = workflow(json!({"name": "m", "nodes": [{"id": "each", "type": "MAP", "config": {
            "items": [1, 2], "max_concurrency": 1,
            "node": {"type": "HTTP", "config": {"url": "http://h/${ .item }"}}}}]}));
        let store = FakeStore::default();
        let mut run = Run::new(Uuid::now_v7(), json!({}));
        apply(&store, &wf, &mut run, Event::RunStarted).await.unwrap();
        let first = run.tasks.iter().find(|t| t.state == TaskState::Pending).unwrap().clone();
        run.tasks.retain(|t| t.item.is_none());
        run.tasks.push(first.clone());
        let done = Event::TaskCompleted { task_id: first.id, attempt: 1, output: json!(0) };
        let e = apply(&store, &wf, &mut run, done).await.unwrap_err();
        assert!(e.to_string().contains("counts items that are not stored"), "{e}");
    }
}
