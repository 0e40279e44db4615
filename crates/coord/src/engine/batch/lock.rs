//! Phase 1: lock every run the requests name, in id order (so two batches
//! cannot deadlock), and load it into the state machine's form — a large
//! run in part when its events allow, with the leases of reported tasks.

use std::collections::{HashMap, HashSet};

use composer_core::definition::Workflow;
use composer_core::machine::{self, Event};
use composer_store::runs;
use uuid::Uuid;

use super::super::effects;
use super::super::error::Result;
use super::super::loaded::Loaded;
use super::super::request::{By, EventRequest};
use super::super::store::Tx;
use super::super::Engine;
use super::{Batch, Leases};
use crate::trace;

impl<'e> Batch<'e> {
    /// Locks and loads the runs `requests` name.
    pub(super) async fn lock(
        engine: &'e Engine,
        began: std::time::Instant,
        tx: &composer_store::Transaction<'_>,
        requests: &[EventRequest],
    ) -> Result<Batch<'e>> {
        let mut batch = Batch {
            engine,
            began,
            requests: requests.len(),
            runs: HashMap::new(),
            leases: Leases::new(),
            answers: Vec::with_capacity(requests.len()),
            offers: Vec::new(),
            given: Vec::new(),
            spare: Vec::new(),
            created: Vec::new(),
            to_idle: Vec::new(),
        };
        if requests.is_empty() {
            return Ok(batch);
        }
        let mut run_ids: Vec<Uuid> = requests.iter().map(|a| a.run_id).collect();
        run_ids.sort();
        run_ids.dedup();
        // Of MAP items, only those the events name are loaded.
        let items: Vec<(Uuid, Uuid)> =
            requests.iter().flat_map(|a| a.event.task_ids().into_iter().map(|t| (a.run_id, t))).collect();
        let reported: Vec<Uuid> =
            requests.iter().filter(|a| matches!(a.by, By::Worker(..))).filter_map(|a| a.event.task_id()).collect();
        let in_part = engine.read_in_part(requests, &run_ids);
        // The tasks the events name, a MAP that carries on (`ItemsLoaded`) too.
        let carries_on = requests.iter().filter_map(|a| match a.event {
            Event::ItemsLoaded { task_id } => Some(task_id),
            _ => None,
        });
        let named: Vec<Uuid> = items.iter().map(|i| i.1).chain(carries_on).collect();
        let part = runs::InPart { runs: &in_part, named: &named };
        for (mut row, mut tasks, in_part) in runs::lock_many(tx, &run_ids, &items, part).await? {
            let wf = engine.workflow(row.workflow_definition_id).await?;
            let mut read = crate::payloads::ReadFrom::default();
            // Always: rows written while offloading was on hold references.
            let objects = Tx(tx, &engine.payloads);
            let unread = keep_unread(&wf, requests, &mut row, &mut tasks);
            objects.resolve_run(&mut row, &mut read).await?;
            for t in &mut tasks {
                objects.resolve_task(t, &mut read).await?;
            }
            for t in tasks.iter().filter(|t| reported.contains(&t.id)) {
                let running = t.state == machine::TaskState::Running;
                batch.leases.insert(t.id, (t.lease_owner.clone(), t.attempt, running));
            }
            let seen = engine.seen(&tasks);
            let pending_at_read: Vec<Uuid> =
                tasks.iter().filter(|t| t.state == machine::TaskState::Pending).map(|t| t.id).collect();
            if !in_part && wf.nodes.len() > usize::try_from(engine.bounds.whole_run_nodes).unwrap_or(0) {
                engine.remember_large(row.id, !row.status.is_terminal());
            }
            let mut run = runs::into_machine(&wf, &mut row, tasks)?;
            run.unread = unread.put_back(&mut run);
            if in_part {
                let mut known = vec![false; wf.nodes.len()];
                for t in run.tasks.iter().filter(|t| t.item.is_none()) {
                    known[t.node] = true;
                }
                run.known = Some(known);
            }
            let store = Tx(tx, &engine.payloads);
            engine.hold_to_limits(&store, &wf, &mut run, &row).await?;
            let events = requests.iter().filter(|a| a.run_id == row.id).map(|a| &a.event);
            load_items_for(&store, &wf, &mut run, events).await?;
            let mut loaded = Loaded::new(wf, run, machine::Transition::default(), &row);
            loaded.seen = seen;
            loaded.pending_at_read = pending_at_read;
            loaded.read = read;
            batch.runs.insert(row.id, loaded);
        }
        Ok(batch)
    }
}

impl Engine {
    /// The large runs seen before, of `run_ids`, that are read in part:
    /// those none of whose events may touch any step.
    fn read_in_part(&self, requests: &[EventRequest], run_ids: &[Uuid]) -> Vec<Uuid> {
        let large = self.large_runs.lock().unwrap_or_else(|p| p.into_inner());
        let whole: HashSet<Uuid> = requests.iter().filter(|a| !a.event.reads_in_part()).map(|a| a.run_id).collect();
        run_ids.iter().copied().filter(|r| large.contains(r) && !whole.contains(r)).collect()
    }

    /// What a run's spans are made of, as its tasks were locked (nothing
    /// unless traces are on).
    fn seen(&self, tasks: &[runs::TaskRow]) -> trace::Seen {
        let mut seen = trace::Seen::default();
        if self.traces.is_some() {
            for t in tasks {
                let since = match t.state {
                    machine::TaskState::Running => t.started_at.unwrap_or(t.updated_at),
                    _ => t.updated_at,
                };
                seen.task(t.id, t.attempt, t.state, since);
            }
        }
        seen
    }
}

/// Loads the MAP items a run's events need besides those they name: a
/// retry may run a MAP's items again (it needs them all), a resume starts
/// items whose retry the pause held.
async fn load_items_for<'a>(
    store: &Tx<'_, '_>,
    wf: &Workflow,
    run: &mut machine::Run,
    mut events: impl Iterator<Item = &'a Event> + Clone,
) -> Result<()> {
    if events.clone().any(|e| matches!(e, Event::RetryRun)) {
        let maps: Vec<Uuid> = run.tasks.iter().filter(|t| t.progress.is_some()).map(|t| t.id).collect();
        for map in maps {
            effects::load_items(store, wf, run, Some(map), runs::Items::All).await?;
        }
    }
    if events.any(|e| matches!(e, Event::ResumeRun)) {
        effects::load_items(store, wf, run, None, runs::Items::Held).await?;
    }
    Ok(())
}

/// Whether a run may leave values unread ([`machine::Run::unread`]) for
/// `events`: when each is a step's own news ([`Event::reads_in_part`]),
/// which reads the values its expressions name (the state machine says
/// when it needs one left unread), and the run has no hook (`on_failure`,
/// `on_success`, `on_end`), whose input is built from every value after the machine.
fn leaves_unread<'a>(wf: &Workflow, mut events: impl Iterator<Item = &'a Event>) -> bool {
    wf.hooks.is_empty() && events.all(Event::reads_in_part)
}

/// The values a run leaves unread: taken out of its rows before the rest
/// are read back, put back into the state machine's form after.
#[derive(Default)]
struct Unread {
    input: Option<serde_json::Value>,
    /// By task id: its input and output.
    tasks: HashMap<Uuid, (Option<serde_json::Value>, Option<serde_json::Value>)>,
}

/// Takes out of `row` and `tasks`, where the run's events among
/// `requests` may leave values unread ([`leaves_unread`]), the references
/// no step's own news reads unless its expressions name them: the run's
/// input, and the input and output of each ended node task (not a MAP
/// item: a MAP gathers those). What is taken is left as a `null` until
/// [`Unread::put_back`].
fn keep_unread(
    wf: &Workflow,
    requests: &[EventRequest],
    row: &mut runs::RunRow,
    tasks: &mut [runs::TaskRow],
) -> Unread {
    let reference = |v: &serde_json::Value| composer_core::storable::is_reference(v);
    let mut unread = Unread::default();
    let id = row.id;
    if !leaves_unread(wf, requests.iter().filter(|a| a.run_id == id).map(|a| &a.event)) {
        return unread;
    }
    if reference(&row.input) {
        unread.input = Some(std::mem::take(&mut row.input));
    }
    for t in tasks.iter_mut().filter(|t| t.item_index.is_none() && t.state.is_terminal()) {
        let input = reference(&t.input).then(|| std::mem::take(&mut t.input));
        let output = match &t.output {
            Some(v) if reference(v) => t.output.take(),
            _ => None,
        };
        if input.is_some() || output.is_some() {
            unread.tasks.insert(t.id, (input, output));
        }
    }
    unread
}

impl Unread {
    /// Puts the references back into `run`; whether there were any.
    fn put_back(mut self, run: &mut machine::Run) -> bool {
        let any = self.input.is_some() || !self.tasks.is_empty();
        if let Some(input) = self.input {
            run.input = input;
        }
        for t in run.tasks.iter_mut() {
            if let Some((input, output)) = self.tasks.remove(&t.id) {
                if let Some(input) = input {
                    t.input = input;
                }
                if output.is_some() {
                    t.output = output;
                }
            }
        }
        any
    }
}
